#!/usr/bin/env bash
# gemma4c tokenize / detokenize on the HF fixtures (tokenizer/fixtures/public), compared with
# python3's json module; malformed lines, stdin, -p/--ids and a missing tokenizer.
set -u
: "${G4_BIN:?}" "${G4_SHARED_DIR:?}" "${G4_TMP:?}"
TOK="$G4_SHARED_DIR/tokenizer/tokenizer.json"
FX="$G4_SHARED_DIR/tokenizer/fixtures/public"
[ -f "$TOK" ] || { echo "no $TOK: skipped"; exit 77; }
command -v python3 >/dev/null || { echo "no python3: skipped"; exit 77; }
W="$G4_TMP/tokenize-cli"
rm -rf "$W" && mkdir -p "$W"
export G4_TOKENIZER_CACHE_DIR="$W/cache"
fail=0
check() { # name, condition result
    if [ "$2" = 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi
}

# ---- tokenize -f: every fixture text with and without special tokens
python3 - "$FX/encode.jsonl" "$W/enc_in.jsonl" "$W/enc_want.jsonl" <<'EOF'
import json, sys
src, inp, want = sys.argv[1:4]
with open(src, encoding="utf-8") as f, open(inp, "w", encoding="utf-8") as i, open(want, "w", encoding="utf-8") as w:
    for line in f:
        c = json.loads(line)
        i.write(json.dumps({"text": c["text"]}, ensure_ascii=False) + "\n")
        w.write(json.dumps(c["ids_with_bos"]) + "\n")
        i.write(json.dumps({"text": c["text"], "add_special_tokens": False}) + "\n")
        w.write(json.dumps(c["ids"]) + "\n")
EOF
"$G4_BIN" tokenize --tokenizer "$TOK" -f "$W/enc_in.jsonl" > "$W/enc_out.jsonl"
check "tokenize -f exits 0" $?
python3 - "$W/enc_out.jsonl" "$W/enc_want.jsonl" <<'EOF'
import json, sys
got = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
want = [json.loads(l) for l in open(sys.argv[2], encoding="utf-8")]
bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
if len(got) != len(want) or bad:
    print(f"  {len(got)} lines for {len(want)}; different: {bad[:10]}")
    sys.exit(1)
print(f"  {len(want)} encodings identical to HF")
EOF
check "tokenize -f matches HF" $?

# ---- detokenize -f: the decode fixtures as they are (extra keys are ignored), via stdin
"$G4_BIN" detokenize -m "$G4_SHARED_DIR/tokenizer" -f - < "$FX/decode.jsonl" > "$W/dec_out.jsonl"
check "detokenize -f - exits 0" $?
python3 - "$W/dec_out.jsonl" "$FX/decode.jsonl" <<'EOF'
import json, sys
got = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
want = [json.loads(l)["text"] for l in open(sys.argv[2], encoding="utf-8")]
bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
if len(got) != len(want) or bad:
    print(f"  {len(got)} lines for {len(want)}; different: {bad[:10]}")
    sys.exit(1)
print(f"  {len(want)} decodings identical to HF")
EOF
check "detokenize -f matches HF" $?

# ---- malformed lines: an error object on that line, the rest goes on, exit 1
printf '%s\n' '{"text": "Hello world"}' 'not json' '{"text": 5}' '{"text": "x", "add_special_tokens": "yes"}' \
    '[1, 2]' '{"text": "Hello world", "add_special_tokens": false}' > "$W/bad_in.jsonl"
"$G4_BIN" tokenize --tokenizer "$TOK" -f "$W/bad_in.jsonl" > "$W/bad_out.jsonl"
rc=$?
check "tokenize with malformed lines exits 1" $([ $rc = 1 ] && echo 0 || echo 1)
python3 - "$W/bad_out.jsonl" "$FX/encode.jsonl" <<'EOF'
import json, sys
out = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
hello = next(json.loads(l) for l in open(sys.argv[2], encoding="utf-8") if json.loads(l)["text"] == "Hello world")
ok = len(out) == 6 and out[0] == hello["ids_with_bos"] and out[5] == hello["ids"]
ok = ok and all(isinstance(o, dict) and isinstance(o.get("error"), str) and o["error"] for o in out[1:5])
sys.exit(0 if ok else 1)
EOF
check "tokenize error lines in place" $?

printf '%s\n' '{"ids": [2, 9259]}' '{"ids": [99999999]}' '{"ids": [1.5]}' '{"ids": "2"}' '{"ids": [9259], "skip_special_tokens": 1}' \
    '{"ids": [2, 9259], "skip_special_tokens": true}' > "$W/bad_dec.jsonl"
"$G4_BIN" detokenize --tokenizer "$TOK" -f "$W/bad_dec.jsonl" > "$W/bad_dec_out.jsonl"
rc=$?
check "detokenize with bad ids exits 1" $([ $rc = 1 ] && echo 0 || echo 1)
python3 - "$W/bad_dec_out.jsonl" <<'EOF'
import json, sys
out = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
ok = len(out) == 6 and out[0] == "<bos>Hello" and out[5] == "Hello"
ok = ok and all(isinstance(o, dict) and o.get("error") for o in out[1:5])
sys.exit(0 if ok else 1)
EOF
check "detokenize error lines in place" $?

# ---- -p and --ids
want=$(python3 -c 'import json,sys
for l in open(sys.argv[1], encoding="utf-8"):
    c = json.loads(l)
    if c["text"] == "Hello world": print(",".join(map(str, c["ids_with_bos"]))); print(",".join(map(str, c["ids"])))' "$FX/encode.jsonl")
got=$("$G4_BIN" tokenize --tokenizer "$TOK" -p "Hello world"; "$G4_BIN" tokenize -m "$G4_SHARED_DIR/tokenizer" -p "Hello world" --no-bos)
check "tokenize -p" $([ "$got" = "$want" ] && echo 0 || echo 1)
got=$("$G4_BIN" detokenize --tokenizer "$TOK" --ids "$(echo "$want" | head -1)" --skip-special)
check "detokenize --ids" $([ "$got" = "Hello world" ] && echo 0 || echo 1)

# ---- a missing or corrupt tokenizer: one line on stderr, exit 1
"$G4_BIN" tokenize -m "$W/no-such-model" -p hi > /dev/null 2> "$W/err1.txt"
rc=$?
check "missing tokenizer exits 1 with one line" $([ $rc = 1 ] && [ "$(wc -l < "$W/err1.txt")" = 1 ] && echo 0 || echo 1)
head -c 5000 "$TOK" > "$W/tokenizer.json"
"$G4_BIN" detokenize --tokenizer "$W/tokenizer.json" --ids 1 > /dev/null 2> "$W/err2.txt"
rc=$?
check "corrupt tokenizer exits 1 with one line" $([ $rc = 1 ] && [ "$(wc -l < "$W/err2.txt")" = 1 ] && grep -q "invalid JSON" "$W/err2.txt" && echo 0 || echo 1)
"$G4_BIN" tokenize --help > "$W/help.txt"
check "--help" $([ $? = 0 ] && grep -q "usage: gemma4c tokenize" "$W/help.txt" && echo 0 || echo 1)
"$G4_BIN" tokenize --tokenizer "$TOK" > /dev/null 2>&1
check "no input is a usage error" $([ $? = 1 ] && echo 0 || echo 1)

# ---- input that is not lines: a line before 100 MB of zero bytes (a line longer than the 64 MiB limit, as /dev/zero's
# endless one) is answered, then one error line on stderr and exit 1 (without the limit the zeros were read whole, and
# /dev/zero until memory ran out); the same through a pipe's path (-f <(...)); a folder is refused
(printf '{"text": "Hello world"}\n'; head -c 100000000 /dev/zero) |
    timeout 60 "$G4_BIN" tokenize --tokenizer "$TOK" -f - > "$W/zero.jsonl" 2> "$W/zero.err"
rc=$?
check "tokenize -f: a line, then zero bytes ($rc: $(head -c 200 "$W/zero.err"))" $([ $rc = 1 ] && [ "$(wc -l < "$W/zero.jsonl")" = 1 ] &&
    [ "$(wc -l < "$W/zero.err")" = 1 ] && grep -q "longer than" "$W/zero.err" && echo 0 || echo 1)
# a text line longer than the limit (100 MB; and 64 MiB + 1 bytes, whose newline is the byte read at the limit) is an
# error line in its place, and the lines after it are still answered
for size in 100000000 $(((64 << 20) + 1)); do
    (printf '{"text": "Hello world"}\n'; head -c "$size" /dev/zero | tr '\0' x; printf '\n{"text": "Hello"}\n') |
        timeout 60 "$G4_BIN" tokenize --tokenizer "$TOK" -f - > "$W/long.jsonl" 2> "$W/long.err"
    rc=$?
    check "tokenize -f: a line of $size bytes between two ($rc: $(head -c 200 "$W/long.err"))" $([ $rc = 1 ] &&
        [ "$(wc -l < "$W/long.jsonl")" = 3 ] && sed -n 2p "$W/long.jsonl" | grep -q '"error":"a line longer than' &&
        [ "$(sed -n 3p "$W/long.jsonl")" = "$("$G4_BIN" tokenize --tokenizer "$TOK" -p Hello | tr -d ' ' | sed 's/.*/[&]/')" ] &&
        echo 0 || echo 1)
done
timeout 60 "$G4_BIN" detokenize --tokenizer "$TOK" -f <(head -c 100000000 /dev/zero) > "$W/zero2.jsonl" 2> "$W/zero2.err"
rc=$?
check "detokenize -f <(zero bytes) ($rc)" $([ $rc = 1 ] && [ ! -s "$W/zero2.jsonl" ] && [ "$(wc -l < "$W/zero2.err")" = 1 ] && echo 0 || echo 1)
"$G4_BIN" tokenize --tokenizer "$TOK" -f "$W" > /dev/null 2> "$W/dir.err"
rc=$?
check "tokenize -f a folder ($rc: $(cat "$W/dir.err"))" $([ $rc = 1 ] && [ "$(wc -l < "$W/dir.err")" = 1 ] && grep -q "is a directory" "$W/dir.err" && echo 0 || echo 1)

if [ $fail = 0 ]; then echo "all tokenize/detokenize CLI checks passed"; fi
exit $fail
