#!/bin/bash
# The batch commands, every line through the scheduler at once: gemma4c generate -f and gemma4c embed -f.
# - generate -f on tolstoy-tiny: transformers' prompt gives transformers' 32 greedy ids and text; every other line
#   (prompts, ids, token limits, stop strings, a seeded sampled line) gives what generate -p / --ids gives for it
#   alone; malformed lines get {"error"} lines in place and the exit status 1; --parallel 1 and 5 print the same,
#   and so does --draft (a drafter) for the greedy lines;
# - embed -f: the fixture's prompt ids give the mean of transformers' final_norm rows (1e-3 relative), and a text
#   line gives exactly what the ids of its tokenization give.
set -u
bin=${G4_BIN:?}; src=${G4_SOURCE_DIR:?}; shared=${G4_SHARED_DIR:?}; tmp=${G4_TMP:-/tmp}/batch-cli
here=$(cd "$(dirname "$0")" && pwd)
. "$(cd "$(dirname "$0")" && pwd)/cli_check.sh" # check, expect_error

rm -rf "$tmp"; mkdir -p "$tmp"
tar -xJf "$src/models/tolstoy-tiny.tar.xz" -C "$tmp" || { echo "cannot unpack the example model"; exit 1; }
m=$tmp/tolstoy-tiny
ref() { python3 -c "import json,sys; v=json.load(open('$m/reference.json'))[sys.argv[1]]; print(','.join(map(str,v)) if isinstance(v,list) else v, end='')" "$1"; }
prompt=$(ref prompt)

python3 - "$prompt" >"$tmp/in.jsonl" <<'PY'
import json, sys
p = sys.argv[1]
lines = [
    {"prompt": p, "max_tokens": 32},
    {"ids": [2, 651, 1234], "max_tokens": 7},
    {"prompt": "Pierre", "max_tokens": 40, "stop": "the"},
    "not json",
    {"prompt": "Natasha said that", "max_tokens": 9, "temperature": 0.8, "seed": 11},
    {"max_tokens": 3},
    {"prompt": "The old prince " * 30, "max_tokens": 6},
    {"ids": [2, 9999999]},
    {"prompt": "War", "max_tokens": 0},
    {"prompt": "Moscow", "max_tokens": 12, "stop": ["Napoleon", ", "]},
    {"prompt": "War", "max_tokens": 99999999999},
]
for l in lines:
    print(l if isinstance(l, str) else json.dumps(l))
PY
"$bin" generate -m "$m" -f "$tmp/in.jsonl" --temp 0 --ignore-eos --parallel 5 >"$tmp/out5.jsonl" 2>"$tmp/err5.txt"
rc=$?
[ $rc = 1 ] && grep -q "5 lines failed" "$tmp/err5.txt"; check $? "bad lines: exit status 1 and a count on stderr ($rc: $(cat "$tmp/err5.txt"))"
[ "$(wc -l <"$tmp/out5.jsonl")" = 11 ]; check $? "one output line per input line"
"$bin" generate -m "$m" -f "$tmp/in.jsonl" --temp 0 --ignore-eos --parallel 1 >"$tmp/out1.jsonl" 2>/dev/null
cmp -s "$tmp/out1.jsonl" "$tmp/out5.jsonl"; check $? "--parallel 1 and --parallel 5 print the same"

# with a drafter (speculative decoding under the scheduler; a random drafter of the model's shapes drafts badly):
# every greedy line as without it (the sampled line 5 draws its tokens otherwise: speculative sampling)
"${G4_PYTHON:-/usr/bin/python3}" "$here/data/random_gemma4.py" drafter "$m" "$tmp/drafter" --hidden 32 --heads 2 \
    --intermediate 64
"$bin" generate -m "$m" -f "$tmp/in.jsonl" --temp 0 --ignore-eos --parallel 5 --draft "$tmp/drafter" --draft-n 3 \
    --draft-stats >"$tmp/outd.jsonl" 2>/dev/null
python3 - "$tmp/out5.jsonl" "$tmp/outd.jsonl" <<'PY'
import json, sys
plain = [json.loads(l) for l in open(sys.argv[1])]
spec = [json.loads(l) for l in open(sys.argv[2])]
drafted = sum(sum(s.get("drafts_per_round", [])) for s in spec)
# the same lines and errors, rounds on every generated line; the sampled line (5) draws otherwise
same = len(plain) == len(spec) and all(i == 4 or {k: v for k, v in s.items() if "per_round" not in k} == p
                                      for i, (p, s) in enumerate(zip(plain, spec)))
rounds = all("drafts_per_round" in s for s in spec if "ids" in s)
print("lines", len(spec), "drafts", drafted)
sys.exit(0 if same and rounds and drafted > 0 else 1)
PY
check $? "--draft: every greedy line as without a drafter, drafts verified"

line() { sed -n "$1p" "$tmp/out5.jsonl"; }
field() { line "$1" | python3 -c "import json,sys; v=json.load(sys.stdin).get('$2'); print(','.join(map(str,v)) if isinstance(v,list) else v, end='')"; }
[ "$(field 1 ids)" = "$(ref greedy_ids)" ]; check $? "line 1: transformers' 32 greedy ids"
[ "$(field 1 text)" = "$(ref greedy_text)" ]; check $? "line 1: transformers' greedy text"
[ "$(field 2 ids)" = "$("$bin" generate -m "$m" --ids 2,651,1234 -n 7 --temp 0 --ignore-eos)" ]
check $? "line 2 (ids): as generate --ids alone"
alone() { "$bin" generate -m "$m" -p "$1" "${@:2}" --ignore-eos; }
[ "$(field 3 text)" = "$(alone Pierre -n 40 --temp 0 --stop the)" ]; check $? "line 3 (stop string): as generate -p alone"
field 4 error | grep -q "invalid JSON"; check $? "line 4: invalid JSON is an error line"
[ "$(field 5 text)" = "$(alone "Natasha said that" -n 9 --temp 0.8 --seed 11)" ]; check $? "line 5 (sampled, seed): as alone"
field 6 error | grep -q "one of \"prompt\" and \"ids\""; check $? "line 6: neither prompt nor ids"
[ "$(field 7 text)" = "$(alone "$(python3 -c 'print("The old prince " * 30, end="")')" -n 6 --temp 0)" ]
check $? "line 7 (longer prompt): as alone"
field 8 error | grep -q "outside the vocabulary"; check $? "line 8: an id outside the vocabulary"
field 9 error | grep -q "max_tokens"; check $? "line 9: max_tokens 0"
[ "$(field 10 text)" = "$(alone Moscow -n 12 --temp 0 --stop Napoleon --stop ', ')" ]; check $? "line 10 (two stops): as alone"
field 11 error | grep -q "max_tokens\" must be an integer in 1..16777216"; check $? "line 11: max_tokens too large names the range ($(field 11 error))"

# embed: the fixture's prompt against transformers' final hidden states
fx=$shared/fixtures/dense-ple
ids=$(python3 "$here/cli_compare.py" ids "$fx/reference.safetensors" input_ids)
printf '{"ids": [%s]}\n{"ids": [%s]}\n' "$ids" "${ids%,*}" | "$bin" embed -m "$fx" -f - --parallel 2 >"$tmp/emb.jsonl"
check $? "embed runs"
python3 - "$here" "$fx/reference.safetensors" "$tmp/emb.jsonl" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1])
from cli_compare import read_safetensors
(T, H), fin = read_safetensors(sys.argv[2])["final_norm"]
ok = True
for k, line in enumerate(open(sys.argv[3])):
    got = json.loads(line)["embedding"]
    n = T - k  # the second line drops the last id: the first T-1 rows
    want = [sum(fin[t * H + h] for t in range(n)) / n for h in range(H)]
    scale = max(abs(x) for x in want)
    err = max(abs(a - b) for a, b in zip(got, want))
    print("embedding of %d ids: max error %.2e of %.2e" % (n, err, scale))
    ok = ok and len(got) == H and err <= 1e-3 * scale
sys.exit(0 if ok else 1)
PY
check $? "embed: the mean of transformers' final_norm rows"
tids=$("$bin" tokenize -m "$m" -p "Prince Andrew")
printf '{"text": "Prince Andrew"}\n{"ids": [%s]}\n{"text": 5}\n' "$tids" | "$bin" embed -m "$m" -f - >"$tmp/emb2.jsonl" 2>/dev/null
[ $? = 1 ] && [ "$(sed -n 1p "$tmp/emb2.jsonl")" = "$(sed -n 2p "$tmp/emb2.jsonl")" ] && sed -n 3p "$tmp/emb2.jsonl" | grep -q error
check $? "embed: a text line equals its ids; a bad line is an error line"
# input that is not lines: 100 MB of zero bytes (one line longer than the 64 MiB limit, as /dev/zero's endless one) ends
# the input with one error after the lines before it are answered (without the limit it was read whole, and an
# endless one until memory ran out); a folder is refused
(printf '{"prompt": "Pierre", "max_tokens": 2}\n'; head -c 100000000 /dev/zero) | timeout 60 "$bin" generate -m "$m" -f - >"$tmp/zero.jsonl" 2>"$tmp/zero.err"
rc=$?
[ $rc = 1 ] && [ "$(wc -l <"$tmp/zero.jsonl")" = 1 ] && grep -q '"ids"' "$tmp/zero.jsonl" && [ "$(wc -l <"$tmp/zero.err")" = 1 ] &&
    grep -q "longer than" "$tmp/zero.err"
check $? "generate -f: a first line, then zero bytes: its answer, then one error line ($rc: $(head -c 200 "$tmp/zero.err"))"
# a text line longer than the limit is an error line in its place; the lines after it still run
(printf '{"prompt": "Pierre", "max_tokens": 2}\n'; head -c 100000000 /dev/zero | tr '\0' x; printf '\n{"prompt": "Pierre", "max_tokens": 2}\n') |
    timeout 120 "$bin" generate -m "$m" -f - >"$tmp/long.jsonl" 2>"$tmp/long.err"
rc=$?
[ $rc = 1 ] && [ "$(wc -l <"$tmp/long.jsonl")" = 3 ] && sed -n 2p "$tmp/long.jsonl" | grep -q '"error":"a line longer than' &&
    sed -n 3p "$tmp/long.jsonl" | grep -q '"ids"'
check $? "generate -f: a 100 MB line between two: an error line in its place, the next line answered ($rc: $(head -c 200 "$tmp/long.err"))"
expect_error "embed -f zero bytes through a pipe's path" timeout 60 "$bin" embed -m "$m" -f <(head -c 100000000 /dev/zero)
expect_error "generate -f a folder" "$bin" generate -m "$m" -f "$tmp"
grep -q "is a directory" "$tmp/err.txt"; check $? "generate -f a folder: the error says so"
exit $fail
