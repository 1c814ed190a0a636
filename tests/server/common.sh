# What the server tests (tests/test_server*.sh) share; sourced, not run.
#   node_setup              installs the pinned openai client into tests/server/node_modules (npm ci, once);
#                           exits 77 (skipped) where node or npm is absent
#   start_server LOG ARGS   starts `gemma4c serve --port 0 ARGS` on loopback; sets SERVER_PID and SERVER_URL
#   stop_server             SIGTERM, then checks that it drained and exited 0
#   check STATUS TEXT       an "ok"/"FAIL" line
bin=${G4_BIN:?}; src=${G4_SOURCE_DIR:?}; shared=${G4_SHARED_DIR:?}
here=$src/tests/server
fail=0
check() { if [ "$1" = 0 ]; then echo "ok   $2"; else echo "FAIL $2"; fail=1; fi; }
py=/usr/bin/python3
[ -x "$py" ] || py=python3

node_setup() {
    # skipped (77) only where Node.js or npm is absent (scripts/install-deps installs both)
    for c in node npm; do
        command -v $c >/dev/null || { echo "skipped: $c is not installed (the server tests drive it with the openai npm client)"; exit 77; }
    done
    (
        flock 9
        want=$(sed -n 's/.*"openai": "\(.*\)".*/\1/p' "$here/package.json")
        have=$(sed -n 's/^  "version": "\(.*\)",$/\1/p' "$here/node_modules/openai/package.json" 2>/dev/null)
        if [ "$have" != "$want" ]; then
            (cd "$here" && npm ci --no-audit --no-fund --loglevel=error) >"$here/.npm-ci.log" 2>&1 ||
                { cat "$here/.npm-ci.log"; exit 1; }
        fi
    ) 9>"$here/.npm.lock" || { echo "FAIL npm ci (the pinned openai client) did not install"; exit 1; }
}

start_server() {
    local log=$1
    shift
    "$bin" serve --host 127.0.0.1 --port 0 "$@" 2>"$log" &
    SERVER_PID=$!
    local port="" i
    for i in $(seq 1 1200); do
        port=$(sed -n 's|.* on http://127.0.0.1:\([0-9]*\) .*|\1|p' "$log" | head -n 1)
        [ -n "$port" ] && break
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.1
    done
    if [ -z "$port" ]; then
        echo "FAIL the server did not start: $(tail -n 3 "$log")"
        kill "$SERVER_PID" 2>/dev/null
        exit 1
    fi
    SERVER_URL=http://127.0.0.1:$port
    # the bar: GET /health answers 200
    "$py" - "$SERVER_URL/health" <<'PY' || { echo "FAIL GET /health"; exit 1; }
import sys, time, urllib.request
for _ in range(600):
    try:
        if urllib.request.urlopen(sys.argv[1], timeout=5).status == 200: sys.exit(0)
    except Exception:
        time.sleep(0.1)
sys.exit(1)
PY
}

stop_server() {
    kill -TERM "$SERVER_PID"
    wait "$SERVER_PID"
    check $? "the server exits 0 on SIGTERM"
}
