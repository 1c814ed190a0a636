#!/bin/bash
# A bounded loopback load test of gemma4c serve (tests/server/load.mjs): 64 concurrent clients, a fixed
# number of requests each, some streams cancelled mid-way: no error but those, memory back to its baseline; again
# with a drafter (serve --draft).
# It prints latency and tokens/s; bench/server_load.sh runs it bigger and compares --parallel settings.
set -u
. "$G4_SOURCE_DIR/tests/server/common.sh"
tmp=${G4_TMP:-/tmp}/server-load
rm -rf "$tmp"; mkdir -p "$tmp"
node_setup
tar -xJf "$src/models/tolstoy-tiny.tar.xz" -C "$tmp" || { echo "cannot unpack the example model"; exit 1; }
slack=16
if [ -n "${G4_SANITIZE:-}" ]; then
    # ASan holds freed memory in a quarantine (256 MB by default) and fills it under load: a small one keeps
    # the resident size meaningful; LeakSanitizer checks at exit that nothing leaked (stop_server: exit 0)
    export ASAN_OPTIONS="${ASAN_OPTIONS:-}:quarantine_size_mb=8:thread_local_quarantine_size_kb=64"
    slack=64
fi
start_server "$tmp/server.log" -m "$tmp/tolstoy-tiny" --ctx 256 --parallel 4 --quiet -t 2
node "$here/load.mjs" "$SERVER_URL" "$SERVER_PID" 64 1 6 "$slack"
check $? "64 concurrent clients"
stop_server
# the same with a drafter (speculative decoding: sampled requests verify their drafts in the shared steps, streams
# cancelled between rounds): no error, memory back to its baseline
"${G4_PYTHON:-/usr/bin/python3}" "$src/tests/data/random_gemma4.py" drafter "$tmp/tolstoy-tiny" "$tmp/drafter" \
    --hidden 32 --heads 2 --intermediate 64
start_server "$tmp/server-draft.log" -m "$tmp/tolstoy-tiny" --ctx 256 --parallel 4 --quiet -t 2 --draft "$tmp/drafter" \
    --draft-n 4
node "$here/load.mjs" "$SERVER_URL" "$SERVER_PID" 64 1 6 "$slack"
check $? "64 concurrent clients, with a drafter"
stop_server
rm -rf "$tmp"
exit $fail
