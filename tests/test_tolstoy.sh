#!/bin/bash
# End to end on the shipped example model, against what transformers produced for it
# (models/tolstoy-tiny/reference.json and reference.safetensors): the prompt's ids, the
# logits, 32 greedy tokens as ids and as text, and a greedy chat turn through run and chat (also with a drafter).
set -u
bin=${G4_BIN:?}; src=${G4_SOURCE_DIR:?}; tmp=${G4_TMP:-/tmp}/tolstoy
here=$(cd "$(dirname "$0")" && pwd)
. "$(cd "$(dirname "$0")" && pwd)/cli_check.sh" # check, expect_error

rm -rf "$tmp"; mkdir -p "$tmp"
tar -xJf "$src/models/tolstoy-tiny.tar.xz" -C "$tmp" || { echo "cannot unpack the example model"; exit 1; }
m=$tmp/tolstoy-tiny
ref() { python3 -c "import json,sys; v=json.load(open('$m/reference.json'))[sys.argv[1]]; print(','.join(map(str,v)) if isinstance(v,list) else v, end='')" "$1"; }
prompt=$(ref prompt)

ids=$("$bin" tokenize -m "$m" -p "$prompt")
[ "$ids" = "$(ref input_ids)" ]; check $? "the prompt encodes to transformers' input_ids ($ids)"

"$bin" logits -m "$m" --ids "$ids" -o "$tmp/logits.f32"
err=$(python3 "$here/cli_compare.py" logits "$m/reference.safetensors" "$tmp/logits.f32" 2e-3)
check $? "logits within 2e-3 (max error $err)"

got=$("$bin" generate -m "$m" --ids "$ids" -n 32 --temp 0 --ignore-eos)
[ "$got" = "$(ref greedy_ids)" ]; check $? "32 greedy ids identical"

# a context too small for -n: the ids up to it, a note on stderr saying why they stop short, exit 0
n_ids=$(echo "$ids" | tr ',' '\n' | wc -l)
ctx=$((n_ids + 8 > 16 ? n_ids + 8 : 16)); k=$((ctx - n_ids))
got=$("$bin" generate -m "$m" --ids "$ids" -n 32 --temp 0 --ignore-eos --ctx $ctx 2>"$tmp/full.err")
check $? "a generation the context cuts short exits 0"
[ "$got" = "$(ref greedy_ids | cut -d, -f1-$k)" ] && grep -q "the context of $ctx tokens is full after $k of the 32" "$tmp/full.err"
check $? "... with the first $k greedy ids and a note ($(cat "$tmp/full.err"))"
"$bin" generate -m "$m" --ids "$ids" -n 4 --temp 0 --ignore-eos 2>"$tmp/short.err" >/dev/null && [ ! -s "$tmp/short.err" ]
check $? "no note when -n ends it"

"$bin" generate -m "$m" -p "$prompt" -n 32 --temp 0 --ignore-eos >"$tmp/greedy.txt"
python3 - "$m/reference.json" "$tmp/greedy.txt" <<'PY'
import json, sys
want = json.load(open(sys.argv[1]))["greedy_text"]
got = open(sys.argv[2], encoding="utf-8").read()
sys.exit(0 if got == want + "\n" else 1)
PY
check $? "generate -p: the 32 greedy tokens decode to transformers' text"

printf '{"messages": [{"role": "user", "content": "%s"}], "add_generation_prompt": true}\n' "$(ref chat_user)" >"$tmp/chat.jsonl"
"$bin" template -m "$m" -f "$tmp/chat.jsonl" >"$tmp/rendered.jsonl"
python3 - "$m/reference.json" "$tmp/rendered.jsonl" <<'PY'
import json, sys
want = json.load(open(sys.argv[1]))["chat_prompt_text"]
got = json.loads(open(sys.argv[2], encoding="utf-8").readline())
sys.exit(0 if got == want else 1)
PY
check $? "the chat prompt renders as transformers renders it"

# greedy chat turn: until an eos id (1, 106, 50) or 48 tokens, as reference.json's chat_rule says
"$bin" run -m "$m" -p "$(ref chat_user)" --temp 0 -n 48 >"$tmp/run.txt"
python3 - "$m/reference.json" "$tmp/run.txt" <<'PY'
import json, sys
want = json.load(open(sys.argv[1]))["chat_greedy_text"].strip()
got = open(sys.argv[2], encoding="utf-8").read().strip()
if got != want:
    print("got:  " + repr(got)); print("want: " + repr(want))
sys.exit(0 if got == want else 1)
PY
check $? "run answers the chat turn with transformers' greedy answer"

# chat: the same turn twice around /reset, then a second turn that reuses the cached prefix;
# the second turn must equal a fresh greedy run over the whole rendered conversation
q2="And Natasha?"
printf '%s\n/reset\n%s\n%s\n' "$(ref chat_user)" "$(ref chat_user)" "$q2" |
    "$bin" chat -m "$m" --temp 0 -n 48 >"$tmp/chat.txt" 2>"$tmp/chat.err"
check $? "chat exits cleanly at the end of its input"
python3 - "$m/reference.json" "$tmp/chat.txt" "$q2" "$tmp/conv.jsonl" <<'PY'
import json, sys
want = json.load(open(sys.argv[1]))["chat_greedy_text"].strip()
out = open(sys.argv[2], encoding="utf-8").read()
head = want + "\n" + want + "\n"
ok = out.startswith(head)
if not ok:
    print(repr(out[:400]))
user = json.load(open(sys.argv[1]))["chat_user"]
msgs = [{"role": "user", "content": user}, {"role": "assistant", "content": want}, {"role": "user", "content": sys.argv[3]}]
open(sys.argv[4], "w").write(json.dumps({"messages": msgs, "add_generation_prompt": True}) + "\n")
open(sys.argv[4] + ".second", "w", encoding="utf-8").write(out[len(head):].strip())
sys.exit(0 if ok else 1)
PY
check $? "chat answers the first turn like run, and again after /reset"
# lines of spaces are no turn, and a command typed with a space after it is still the command: the same output
printf '%s\n  \t \n/reset \t\n\n%s\n%s\n/exit \nnot read\n' "$(ref chat_user)" "$(ref chat_user)" "$q2" |
    "$bin" chat -m "$m" --temp 0 -n 48 >"$tmp/chat-spaces.txt" 2>/dev/null
cmp -s "$tmp/chat.txt" "$tmp/chat-spaces.txt"; check $? "chat: blank lines are skipped, '/reset ' and '/exit ' are commands"
"$bin" template -m "$m" -f "$tmp/conv.jsonl" | python3 -c 'import json,sys; print(json.dumps({"text": json.loads(sys.stdin.readline()), "add_special_tokens": False}))' >"$tmp/conv-text.jsonl"
conv_ids=$("$bin" tokenize -m "$m" -f "$tmp/conv-text.jsonl" | python3 -c 'import json,sys; print(",".join(map(str, json.loads(sys.stdin.readline()))))')
fresh_ids=$("$bin" generate -m "$m" --ids "$conv_ids" --temp 0 -n 48)
"$bin" detokenize -m "$m" --ids "$fresh_ids" --skip-special >"$tmp/fresh.txt"
python3 -c 'import sys; a=open(sys.argv[1],encoding="utf-8").read().strip(); b=open(sys.argv[2],encoding="utf-8").read().strip(); print(repr(a[:80]), repr(b[:80])) if a!=b else None; sys.exit(a!=b)' "$tmp/conv.jsonl.second" "$tmp/fresh.txt"
check $? "chat's second turn (cached prefix) equals a fresh run of the whole conversation"

# speculative decoding with a random drafter of the example model's shapes: it drafts badly, and the output must
# not change (run, and chat's three turns with a cached prefix)
"${G4_PYTHON:-/usr/bin/python3}" "$here/data/random_gemma4.py" drafter "$m" "$tmp/drafter" --hidden 32 --heads 2 --intermediate 64
"$bin" run -m "$m" -p "$(ref chat_user)" --temp 0 -n 48 --draft "$tmp/drafter" --draft-n 3 >"$tmp/run-draft.txt"
cmp -s "$tmp/run.txt" "$tmp/run-draft.txt"; check $? "run --draft answers as run does"
printf '%s\n/reset\n%s\n%s\n' "$(ref chat_user)" "$(ref chat_user)" "$q2" |
    "$bin" chat -m "$m" --temp 0 -n 48 --draft "$tmp/drafter" --draft-n 2 >"$tmp/chat-draft.txt" 2>/dev/null
cmp -s "$tmp/chat.txt" "$tmp/chat-draft.txt"; check $? "chat --draft: the same three turns as chat"

# a stop string ends the text right before it: the greedy text is " with his\nrapid, ..."
got=$("$bin" generate -m "$m" -p "$prompt" -n 32 --temp 0 --ignore-eos --stop "rapid" | od -An -c | tr -s ' ')
[ "$got" = " w i t h h i s \n \n" ]; check $? "--stop cuts the text before the stop string ($got)"

# a logit bias of -inf bans the greedy first token (607 " with")
first=$("$bin" generate -m "$m" --ids "$ids" -n 1 --temp 0 --logit-bias 607=-inf)
[ -n "$first" ] && [ "$first" != 607 ]; check $? "--logit-bias 607=-inf changes the first greedy token (to $first)"

# constrained output: a GBNF grammar, a JSON Schema inline and from a file, sampled; bad specs are one-line errors
got=$("$bin" generate -m "$m" -p "$prompt" -n 16 --seed 2 --temp 1 --grammar 'root ::= ("war" | "peace") (" and " ("war" | "peace"))?')
[[ "$got" =~ ^(war|peace)(\ and\ (war|peace))?$ ]]; check $? "--grammar: the output is a sentence of the grammar ($got)"
got=$("$bin" run -m "$m" -p "When?" --seed 3 --json-schema '{"enum": [1805, 1812, "never"]}')
[[ "$got" =~ ^(1805|1812|\"never\")$ ]]; check $? "--json-schema (inline): one of the enum's values ($got)"
printf 'root ::= [0-9]{4} "-" [0-9]{2}\n' >"$tmp/date.gbnf"
got=$("$bin" generate -m "$m" -p "$prompt" --seed 4 --temp 1 --grammar-file "$tmp/date.gbnf")
[[ "$got" =~ ^[0-9]{4}-[0-9]{2}$ ]]; check $? "--grammar-file: the output is a sentence of the grammar ($got)"
# generate -f: each line its own constraint (in place of the command's), sampled; a bad one is that line's error
printf '%s\n' '{"prompt": "Pierre", "max_tokens": 40, "json_schema": {"type": "object", "properties": {"age": {"type": "integer", "minimum": 1, "maximum": 99}}, "required": ["age"], "additionalProperties": false}}' \
    '{"prompt": "Natasha", "max_tokens": 12, "regex": "[a-c]{3,5}"}' '{"prompt": "Andrei", "grammar": "root ::= \"war\" | \"peace\""}' \
    '{"prompt": "x", "regex": "a", "grammar": "root ::= \"a\""}' '{"prompt": "x", "json_schema": {"type": "strin"}}' \
    '{"prompt": "Marya", "max_tokens": 6}' | "$bin" generate -m "$m" -f - --temp 1 --seed 5 --grammar 'root ::= "never"' \
    >"$tmp/lines.jsonl" 2>/dev/null
python3 - "$tmp/lines.jsonl" <<'PY'
import json, re, sys
o = [json.loads(l) for l in open(sys.argv[1])]
assert len(o) == 6, o
a = o[0]["text"].strip()
assert a == "" or a.startswith("{"), a  # a prefix of the schema's object, whole where it closed
if a.endswith("}"):
    v = json.loads(a)
    assert list(v) == ["age"] and 1 <= v["age"] <= 99, v
assert re.fullmatch("[a-c]{3,5}", o[1]["text"]), o[1]
assert o[2]["text"] in ("war", "peace"), o[2]
assert "give one" in o[3]["error"] and "strin" in o[4]["error"], (o[3], o[4])
assert o[5]["text"] == "never", o[5]  # a line without its own: the command's
print(a, o[1]["text"], o[2]["text"])
PY
check $? "generate -f: a line's json_schema / regex / grammar in place of the command's; bad ones are line errors"
expect_error "an undefined rule in --grammar" "$bin" generate -m "$m" -p x --grammar 'root ::= nothing'
expect_error "an unsupported JSON Schema keyword" "$bin" run -m "$m" -p x --json-schema '{"type": "string", "format": "uri"}'
expect_error "--grammar with --json-schema" "$bin" generate -m "$m" -p x --grammar 'root ::= "a"' --json-schema '{}'

# sampling with a seed is reproducible
a=$("$bin" generate -m "$m" -p "$prompt" -n 16 --seed 7 --temp 1)
b=$("$bin" generate -m "$m" -p "$prompt" -n 16 --seed 7 --temp 1)
[ -n "$a" ] && [ "$a" = "$b" ]; check $? "same seed, same sampled text"
# a chat template that cannot be used (a Jinja error): the model still loads for what needs no chat, as
# transformers loads a tokenizer whose template fails only in apply_chat_template; run gives the reason in one line
bt=$tmp/broken-template; mkdir -p "$bt"
for f in "$m"/*; do [ "$(basename "$f")" = chat_template.jinja ] || ln -sf "$f" "$bt/"; done
printf '{%% if %%}' > "$bt/chat_template.jinja"
got=$("$bin" generate -m "$bt" --ids "$ids" -n 2 --temp 0 --ignore-eos 2>"$tmp/bt.err")
[ $? = 0 ] && [ -n "$got" ] && [ ! -s "$tmp/bt.err" ]; check $? "generate --ids beside a broken chat template ($got)"
expect_error "run with a broken chat template" "$bin" run -m "$bt" -p hi -n 2
grep -q "chat template: template line 1" "$tmp/err.txt"; check $? "run names the template's error"
exit $fail
