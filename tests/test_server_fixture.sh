#!/bin/bash
# gemma4c serve on a reference fixture without tokenizer (tests/server/client_fixture.mjs): greedy ids,
# log-probabilities and embeddings against transformers' references through the official openai client,
# with an API key.
set -u
. "$G4_SOURCE_DIR/tests/server/common.sh"
tmp=${G4_TMP:-/tmp}/server-fixture
rm -rf "$tmp"; mkdir -p "$tmp"
node_setup
f=$shared/fixtures/dense-ple
[ -f "$f/reference.safetensors" ] || { echo "no $f: skipped"; exit 77; }
key=test-key-$$
start_server "$tmp/server.log" -m "$f" --api-key "$key" --ctx 256 -t 2
node "$here/client_fixture.mjs" "$SERVER_URL" "$f" "$key"
check $? "the openai client on fixtures/dense-ple"
stop_server
rm -rf "$tmp"
exit $fail
