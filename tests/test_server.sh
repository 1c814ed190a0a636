#!/bin/bash
# gemma4c serve driven by the official openai npm client (tests/server/): on the example model, chat,
# streaming, completions, logprobs and embeddings against transformers' references, errors, cancellation
# (client_tolstoy.mjs); on a scripted checkpoint built from it, thinking and tool calls, plain and streamed
# (client_scripted.mjs); with a drafter (--draft), greedy chats at once answer the same. Each server starts as a user would: `gemma4c serve -m DIR --host 127.0.0.1 --port P`,
# then GET /health, then requests; SIGTERM ends it.
set -u
. "$G4_SOURCE_DIR/tests/server/common.sh"
tmp=${G4_TMP:-/tmp}/server
rm -rf "$tmp"; mkdir -p "$tmp"
node_setup
tar -xJf "$src/models/tolstoy-tiny.tar.xz" -C "$tmp" || { echo "cannot unpack the example model"; exit 1; }
m=$tmp/tolstoy-tiny

start_server "$tmp/tolstoy.log" -m "$m" --ctx 512 --parallel 2 -t 2
node "$here/client_tolstoy.mjs" "$SERVER_URL" "$m"
check $? "the openai client on tolstoy-tiny"
stop_server

# speculative decoding in the server (--draft): three greedy chats at once, verified in shared steps, answer as
# transformers did without a drafter; a request with logprobs beside them decodes without drafts; the drafter is
# random (drafts badly: what it drafts is counted, the output may not change)
"${G4_PYTHON:-/usr/bin/python3}" "$src/tests/data/random_gemma4.py" drafter "$m" "$tmp/drafter" --hidden 32 --heads 2 \
    --intermediate 64
start_server "$tmp/draft.log" -m "$m" --ctx 512 --parallel 3 -t 2 --draft "$tmp/drafter" --draft-n 3
"$py" - "$SERVER_URL" "$m/reference.json" <<'PY'
import json, sys, threading, urllib.request
base, ref = sys.argv[1], json.load(open(sys.argv[2], encoding="utf-8"))
def post(path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=300))
out = [None] * 4
def chat(i):
    body = {"model": "tolstoy-tiny", "messages": [{"role": "user", "content": ref["chat_user"]}], "temperature": 0,
            "max_tokens": 48}
    if i == 3: body["logprobs"] = True
    out[i] = post("/v1/chat/completions", body)["choices"][0]["message"]["content"]
ts = [threading.Thread(target=chat, args=(i,)) for i in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
bad = [i for i in range(4) if out[i] != ref["chat_greedy_text"]]
metrics = urllib.request.urlopen(base + "/metrics").read().decode()
drafts = [int(l.split()[1]) for l in metrics.splitlines() if l.startswith("gemma4c_draft_tokens_total ")]
steps = [int(l.split()[1]) for l in metrics.splitlines() if l.startswith("gemma4c_draft_steps_total ")]
print("drafts verified:", drafts, "drafter steps:", steps, "; answers differing from transformers':", bad)
sys.exit(1 if bad or not drafts or drafts[0] <= 0 or not steps or steps[0] <= 0 else 0)
PY
check $? "serve --draft: four chats at once (one with logprobs) answer as transformers, drafts verified"
stop_server

s=$tmp/scripted
"$py" "$here/make_scripted_model.py" "$m" "$s" "$shared/chat_templates/gemma-4-31b-it.jinja"
check $? "the scripted checkpoint is written"
"$bin" run -m "$s" -p "What is the weather?" --temp 0 --think >"$tmp/answer.txt" 2>"$tmp/thinking.txt"
check $? "gemma4c run on the scripted checkpoint"
start_server "$tmp/scripted.log" -m "$s" --ctx 512 --parallel 1 -t 2
node "$here/client_scripted.mjs" "$SERVER_URL" "$s" "$tmp"
check $? "the openai client: thinking and tool calls"
stop_server
rm -rf "$tmp"
exit $fail
