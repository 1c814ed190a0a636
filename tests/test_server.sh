#!/bin/bash
# gemma4c serve driven by the official openai npm client (tests/server/): on the example model, chat,
# streaming, completions, logprobs and embeddings against transformers' references, errors, cancellation
# (client_tolstoy.mjs); on a scripted checkpoint built from it, thinking and tool calls, plain and streamed
# (client_scripted.mjs). Each server starts as a user would: `gemma4c serve -m DIR --host 127.0.0.1 --port P`,
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
