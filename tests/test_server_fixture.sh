#!/bin/bash
# gemma4c serve on the text reference fixtures, which have no tokenizer (tests/server/client_fixture.mjs):
# greedy ids, log-probabilities and embeddings against transformers' references through the official
# openai client, with an API key. dense-ple (PLE, KV sharing), dense-keqv (keys as values), moe (experts); the
# assistant fixture with its drafter (--draft).
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
# speculative decoding (--draft) on the assistant fixture: a greedy completion of the reference prompt verifies the
# drafts transformers' assisted generation verified (its rounds in reference.json), counted by /metrics
f=$shared/fixtures/assistant
if [ -f "$f/reference.json" ]; then
    start_server "$tmp/assistant.log" -m "$f" --draft "$f/assistant-lmhead" --ctx 256 -t 2
    "$py" - "$SERVER_URL" "$f/reference.json" <<'PY'
import json, sys, time, urllib.request
base, ref = sys.argv[1], json.load(open(sys.argv[2]))
body = {"model": "assistant", "prompt": ref["input_ids"], "max_tokens": len(ref["greedy_ids"]), "temperature": 0,
        "ignore_eos": True}
req = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
usage = json.load(urllib.request.urlopen(req, timeout=300))["usage"]
# (the engine publishes its counters after each batch step: the reply can come before the step that ended it has
# returned; running 0 is published with that step's counters)
for _ in range(100):
    m = dict(l.split() for l in urllib.request.urlopen(base + "/metrics").read().decode().splitlines()
             if l.startswith("gemma4c_draft_tokens") or l.startswith("gemma4c_requests_running"))
    if m.get("gemma4c_requests_running") == "0":
        break
    time.sleep(0.05)
lm = ref["assistant"]["lmhead"]
want = [sum(lm["drafts_per_round"]), sum(lm["accepted_per_round"])]
got = [int(m.get("gemma4c_draft_tokens_total", -1)), int(m.get("gemma4c_draft_tokens_accepted_total", -1))]
print("drafts and kept: server", got, "transformers", want, "; completion tokens", usage["completion_tokens"])
sys.exit(0 if got == want and usage["completion_tokens"] == len(ref["greedy_ids"]) else 1)
PY
    check $? "serve --draft: the reference prompt's drafts and kept drafts are transformers'"
    stop_server
fi
rm -rf "$tmp"
[ $ran = 1 ] || exit 77
exit $fail
