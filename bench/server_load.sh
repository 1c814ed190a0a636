#!/usr/bin/env bash
# Loopback load on gemma4c serve with the example model: 64 concurrent clients (the official openai client,
# tests/server/load.mjs) send a fixed number of requests each (chat, streamed chat, completions; every 8th
# stream cancelled after its first token). Run once per --parallel setting in the same run, so the lines
# compare settings measured under the same machine load; each prints p50/p99 latency, time to first token
# and generated tokens/s, and checks no error but the cancellations and memory back to its baseline.
#
#   bench/server_load.sh [--clients 64] [--requests 4] [--max-tokens 16] [--parallel "1 4 8"]
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
clients=64; requests=4; max_tokens=16; parallel="1 4 8"
while [ $# -gt 0 ]; do
    case $1 in
        --clients) clients=$2; shift 2 ;;
        --requests) requests=$2; shift 2 ;;
        --max-tokens) max_tokens=$2; shift 2 ;;
        --parallel) parallel=$2; shift 2 ;;
        -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 1 ;;
    esac
done
export G4_BIN=${G4_BIN:-$root/build/gemma4c} G4_SOURCE_DIR=$root G4_SHARED_DIR=${G4_SHARED_DIR:-$root/../shared}
. "$root/tests/server/common.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
node_setup
tar -xJf "$root/models/tolstoy-tiny.tar.xz" -C "$tmp"
for p in $parallel; do
    echo "--parallel $p"
    start_server "$tmp/server.log" -m "$tmp/tolstoy-tiny" --ctx 512 --parallel "$p" --quiet
    node "$here/load.mjs" "$SERVER_URL" "$SERVER_PID" "$clients" "$requests" "$max_tokens" 32 || fail=1
    stop_server
done
exit $fail
