#!/bin/bash
# gemma4c serve under bad input (tests/server/robust.mjs): malformed and mistyped requests, oversized
# bodies, slow, idle and departing clients, a seeded fuzz run of mutated requests, then SIGTERM while a
# stream runs (it ends whole and the server exits 0).
set -u
. "$G4_SOURCE_DIR/tests/server/common.sh"
tmp=${G4_TMP:-/tmp}/server-robust
rm -rf "$tmp"; mkdir -p "$tmp"
node_setup
tar -xJf "$src/models/tolstoy-tiny.tar.xz" -C "$tmp" || { echo "cannot unpack the example model"; exit 1; }
n=${G4_SERVER_FUZZ:-600}
[ -n "${G4_SANITIZE:-}" ] && n=${G4_SERVER_FUZZ:-300}
start_server "$tmp/server.log" -m "$tmp/tolstoy-tiny" --ctx 256 --parallel 2 --max-tokens 32 --max-body 65536 --timeout 3 --request-timeout 5 --quiet -t 2
node "$here/robust.mjs" "$SERVER_URL" "$SERVER_PID" "$n"
check $? "bad input, slow clients, fuzz, drain"
wait "$SERVER_PID"
check $? "the server drained and exited 0 after SIGTERM"
grep -q "SIGTERM: draining" "$tmp/server.log"; check $? "it said it was draining"
if grep -qiE "sanitizer|runtime error|leak" "$tmp/server.log"; then check 1 "sanitizer report: $(grep -m3 -iE 'sanitizer|runtime error|leak' "$tmp/server.log")"; fi
rm -rf "$tmp"
exit $fail
