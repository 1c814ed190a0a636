#!/bin/bash
# gemma4c serve on the text reference fixtures, which have no tokenizer (tests/server/client_fixture.mjs):
# greedy ids, log-probabilities and embeddings against transformers' references through the official
# openai client, with an API key. dense-ple (PLE, KV sharing), dense-keqv (keys as values), moe (experts).
set -u
. "$G4_SOURCE_DIR/tests/server/common.sh"
tmp=${G4_TMP:-/tmp}/server-fixture
rm -rf "$tmp"; mkdir -p "$tmp"
node_setup
ran=0
for name in dense-ple dense-keqv moe; do
    f=$shared/fixtures/$name
    [ -f "$f/reference.safetensors" ] || { echo "no $f: skipped"; continue; }
    ran=1
    key=test-key-$$-$name
    start_server "$tmp/$name.log" -m "$f" --api-key "$key" --ctx 256 -t 2
    node "$here/client_fixture.mjs" "$SERVER_URL" "$f" "$key"
    check $? "the openai client on fixtures/$name"
    stop_server
done
rm -rf "$tmp"
[ $ran = 1 ] || exit 77
exit $fail
