#!/bin/bash
# The image commands end to end: encode-image, logits --image and generate --image on the vision fixture against the
# transformers references; run --image and chat's /image on the example model given a small random
# vision tower (tests/data/make_vision_model.py), checked against the logits path over the same
# expanded prompt; budgets; bad input gives a one-line error and a non-zero exit.
set -u
bin=${G4_BIN:?}; src=${G4_SOURCE_DIR:?}; shared=${G4_SHARED_DIR:?}; tmp=${G4_TMP:-/tmp}/image_cli
here=$(cd "$(dirname "$0")" && pwd)
. "$(cd "$(dirname "$0")" && pwd)/cli_check.sh" # check, expect_error
rm -rf "$tmp"; mkdir -p "$tmp"
fx=$shared/fixtures/vision
img0=$fx/image0.png; img1=$fx/image1.png

# the fixture: soft tokens and full-prompt logits
"$bin" encode-image -m "$fx" --image "$img0" --image "$img1" -o "$tmp/emb.f32" 2>"$tmp/enc.txt"
err=$(python3 "$here/cli_compare.py" rel "$fx/reference.safetensors" image_embeddings "$tmp/emb.f32" 1e-3)
check $? "encode-image: image_embeddings within 1e-3 relative (error $err)"
grep -q "image0.png: 60 soft tokens" "$tmp/enc.txt" && grep -q "image1.png: 66 soft tokens" "$tmp/enc.txt"
check $? "encode-image: 60 and 66 soft tokens"
ids=$(python3 "$here/cli_compare.py" ids "$fx/reference.safetensors" input_ids)
"$bin" logits -m "$fx" --ids "$ids" --image "$img0" --image "$img1" -o "$tmp/logits.f32"
err=$(python3 "$here/cli_compare.py" logits "$fx/reference.safetensors" "$tmp/logits.f32" 2e-3)
check $? "logits --image: the full prompt within 2e-3 (max error $err)"
prompt=$(python3 "$here/cli_compare.py" prompt "$fx"); want=$(python3 "$here/cli_compare.py" greedy "$fx")
got=$("$bin" generate -m "$fx" --ids "$prompt" --image "$img0" --image "$img1" -n 24 --temp 0 --ignore-eos)
[ "$got" = "$want" ]; check $? "generate --image: the 24 greedy ids of the reference ($got)"

# another budget: the soft-token count the processor's formula gives (2.2)
"$bin" encode-image -m "$fx" --image "$img0" --budget 280 -o "$tmp/emb280.f32" 2>"$tmp/enc280.txt"
n=$(sed -n 's/.*: \([0-9]*\) soft tokens/\1/p' "$tmp/enc280.txt")
want=$(python3 -c "
import math
h, w, b = 300, 451, 280
f = math.sqrt(b * 9 * 256 / (h * w)); print((math.floor(f * h / 48)) * (math.floor(f * w / 48)))")
size=$(stat -c %s "$tmp/emb280.f32")
[ "$n" = "$want" ] && [ "$size" = $((want * 128 * 4)) ]
check $? "encode-image --budget 280: $n soft tokens (the formula gives $want), $size bytes"

# bad input: non-zero exit, one line on stderr, nothing on stdout
printf 'not an image at all\n' >"$tmp/text.png"
head -c 3000 "$img0" >"$tmp/cut.png"
: >"$tmp/empty.jpg"
expect_error "a text file" "$bin" encode-image -m "$fx" --image "$tmp/text.png" -o "$tmp/x.f32"
expect_error "a truncated PNG" "$bin" encode-image -m "$fx" --image "$tmp/cut.png" -o "$tmp/x.f32"
expect_error "an empty file" "$bin" encode-image -m "$fx" --image "$tmp/empty.jpg" -o "$tmp/x.f32"
expect_error "a missing file" "$bin" encode-image -m "$fx" --image "$tmp/nope.png" -o "$tmp/x.f32"
expect_error "a budget that is not offered" "$bin" encode-image -m "$fx" --image "$img0" --budget 100 -o "$tmp/x.f32"
expect_error "no --image" "$bin" encode-image -m "$fx" -o "$tmp/x.f32"
expect_error "placeholders and images disagree" "$bin" logits -m "$fx" --ids "$ids" --image "$img0" -o "$tmp/x.f32"
[ ! -e "$tmp/x.f32" ]; check $? "no output file left behind after an error"

# run and chat with an image, on the example model with a random vision tower
tar -xJf "$src/models/tolstoy-tiny.tar.xz" -C "$tmp" && python3 "$here/data/make_vision_model.py" "$tmp/tolstoy-tiny" "$tmp/tv"
check $? "a vision tower for the example model"
m=$tmp/tv
expect_error "a model without a vision tower" "$bin" run -m "$tmp/tolstoy-tiny" --image "$img0" -p "Hi" -n 2
expect_error "run: an unreadable image" "$bin" run -m "$m" --image "$tmp/text.png" -p "Hi" -n 2
# text that is not UTF-8: an error (the image was sent without it, or "out of memory" without an image)
expect_error "run: an image and a message that is not UTF-8" "$bin" run -m "$m" --image "$img0" -p $'Hi \xff' -n 2
expect_error "run: a message that is not UTF-8" "$bin" run -m "$m" -p $'Hi \xff' -n 2
grep -q "not valid UTF-8" "$tmp/err.txt"; check $? "run: the error says the message is not UTF-8"
# a FIFO named as an image: refused at once, not a wait for a writer (timeout: a regression fails, not hangs)
mkfifo "$tmp/fifo.png"
expect_error "run: a FIFO as the image" timeout 20 "$bin" run -m "$m" --image "$tmp/fifo.png" -p "Hi" -n 2
grep -q "not a regular file" "$tmp/err.txt"; check $? "run: the error says the FIFO is not a regular file"
q="What is in the picture?"
"$bin" run -m "$m" --image "$img0" -p "$q" --temp 0 -n 1 >"$tmp/run1.txt"
check $? "run --image"
# the same turn through template, tokenize, the placeholder expansion and logits --image
printf '{"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "%s"}]}], "add_generation_prompt": true}\n' "$q" >"$tmp/msg.jsonl"
"$bin" template -m "$m" -f "$tmp/msg.jsonl" |
    python3 -c "import json,sys; print(json.dumps({'text': json.loads(sys.stdin.readline()), 'add_special_tokens': False}))" |
    "$bin" tokenize -m "$m" -f - >"$tmp/pids.json"
exp=$(python3 -c "
import json, sys
ids = json.load(open(sys.argv[1]))
assert ids.count(258880) == 1
out = []
for i in ids:
    out += [255999] + [258880] * 60 + [258882] if i == 258880 else [i]
print(','.join(map(str, out)))" "$tmp/pids.json")
"$bin" logits -m "$m" --ids "$exp" --image "$img0" -o "$tmp/tv.f32"
top=$(python3 "$here/cli_compare.py" argmax "$tmp/tv.f32" 262144)
word=$("$bin" detokenize -m "$m" --ids "$top")
[ "$(tr -d ' \n' <"$tmp/run1.txt")" = "$(printf '%s' "$word" | tr -d ' \n')" ]
check $? "run --image answers with the logits path's top token ('$word')"
"$bin" run -m "$m" --image "$img0" -p "$q" --temp 0 -n 12 >"$tmp/run.txt"
printf '/image %s\n%s\n' "$img0" "$q" | "$bin" chat -m "$m" --temp 0 -n 12 >"$tmp/chat.txt" 2>"$tmp/chat_err.txt"
cmp -s "$tmp/run.txt" "$tmp/chat.txt"
check $? "chat with /image answers as run --image does"
grep -q "60 soft tokens" "$tmp/chat_err.txt"; check $? "chat reports the image's soft tokens"
printf '/image %s\nfirst\n/image %s\nsecond\n' "$img0" "$tmp/text.png" | "$bin" chat -m "$m" --temp 0 -n 4 >/dev/null 2>"$tmp/chat_err2.txt"
grep -q "not an image" "$tmp/chat_err2.txt"; check $? "chat: a bad /image is reported and the chat goes on"
"$bin" run -m "$m" --image "$img0" --image "$img1" -p "Compare them." --budget 140 --temp 0 -n 4 >/dev/null
check $? "run with two images at budget 140"
exit $fail
