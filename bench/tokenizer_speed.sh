#!/usr/bin/env bash
# Encode speed of one call over a whole text: ours (g4-tokenizer-bench) and, in the same run,
# Hugging Face `tokenizers` when it can be loaded (Python `import tokenizers`, else the Node
# binding `require('tokenizers')`, e.g. with NODE_PATH set). Prints MB/s of each, the ratio
# ours/HF and whether the ids are identical; also our load times from JSON and from the cache.
#
#   bench/tokenizer_speed.sh [--tokenizer FILE] [--text FILE] [--repeat N] [--keep-crlf]
#
# By default the text's CRLF line ends become LF, as Python's text mode reads it (that is
# how the reference figure for War and Peace was measured: 3.29 MB, 778,346 tokens). Set
# G4_TOKENIZER_BENCH to use another g4-tokenizer-bench binary.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
shared=${G4_SHARED_DIR:-$root/../shared}
tok=$shared/tokenizer/tokenizer.json
text=$shared/corpus/war-and-peace.txt
repeat=3
keep_crlf=0
while [ $# -gt 0 ]; do
    case $1 in
        --tokenizer) tok=$2; shift 2 ;;
        --text) text=$2; shift 2 ;;
        --repeat) repeat=$2; shift 2 ;;
        --keep-crlf) keep_crlf=1; shift ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 1 ;;
    esac
done

bin=${G4_TOKENIZER_BENCH:-$root/build/g4-tokenizer-bench}
if [ ! -x "$bin" ]; then
    cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$root/build" --target g4-tokenizer-bench -j"$(nproc)" >/dev/null
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
input=$work/text.txt
if [ $keep_crlf = 1 ]; then
    cp "$text" "$input"
elif command -v python3 >/dev/null; then
    python3 -c 'import sys; open(sys.argv[2], "w", encoding="utf-8", newline="").write(open(sys.argv[1], encoding="utf-8").read())' "$text" "$input"
else
    sed 's/\r$//' "$text" > "$input"
fi
bytes=$(wc -c < "$input")
echo "text: $text ($bytes bytes$([ $keep_crlf = 1 ] || echo ', CRLF read as LF'))"
echo "tokenizer: $tok"

field() { sed -n "s/^$1: \([^ ]*\).*/\1/p" "$2"; }

# ours: load from JSON (no cache), then from the cache, then the encode timing
G4_NO_TOKENIZER_CACHE=1 "$bin" --tokenizer "$tok" --text "$input" --repeat 1 > "$work/cold.txt"
"$bin" --tokenizer "$tok" --text "$input" --repeat 1 > /dev/null   # make sure the cache exists
"$bin" --tokenizer "$tok" --text "$input" --repeat "$repeat" --ids-out "$work/ours.json" > "$work/ours.txt"
ours=$(field encode_MBps "$work/ours.txt")
echo "ours: load $(field load_s "$work/cold.txt") s from JSON, $(field load_s "$work/ours.txt") s from the cache;" \
     "$(field tokens "$work/ours.txt") tokens; encode $ours MB/s (best of $repeat)"

hf=""
if command -v python3 >/dev/null && python3 -c 'import tokenizers' 2>/dev/null; then
    hf=$(python3 - "$tok" "$input" "$repeat" "$work/hf.json" <<'EOF'
import json, sys, time
import tokenizers
from tokenizers import Tokenizer
tok_path, text_path, repeat, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
t0 = time.perf_counter()
tok = Tokenizer.from_file(tok_path)
load = time.perf_counter() - t0
text = open(text_path, encoding="utf-8", newline="").read()
n = len(text.encode("utf-8"))
best = float("inf")
for _ in range(repeat):
    t0 = time.perf_counter()
    enc = tok.encode(text, add_special_tokens=False)
    best = min(best, time.perf_counter() - t0)
open(out, "w").write(json.dumps(enc.ids, separators=(",", ":")) + "\n")
print(f"{n / best / 1e6:.2f} python tokenizers {tokenizers.__version__}, load {load:.3f} s, {len(enc.ids)} tokens")
EOF
)
elif command -v node >/dev/null && node -e "require('tokenizers')" 2>/dev/null; then
    hf=$(node - "$tok" "$input" "$repeat" "$work/hf.json" <<'EOF'
const fs = require('fs');
const { Tokenizer } = require('tokenizers');
const [tokPath, textPath, repeat, out] = process.argv.slice(2);
(async () => {
  let t0 = process.hrtime.bigint();
  const tok = Tokenizer.fromFile(tokPath);
  const load = Number(process.hrtime.bigint() - t0) / 1e9;
  const text = fs.readFileSync(textPath, 'utf8');
  const n = Buffer.byteLength(text, 'utf8');
  let best = Infinity, enc;
  for (let r = 0; r < Number(repeat); r++) {
    t0 = process.hrtime.bigint();
    enc = await tok.encode(text, null, { addSpecialTokens: false });
    best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
  }
  const ids = Array.from(enc.getIds());
  fs.writeFileSync(out, '[' + ids.join(',') + ']\n');
  const v = require('tokenizers/package.json').version;
  console.log(`${(n / best / 1e6).toFixed(2)} node tokenizers ${v}, load ${load.toFixed(3)} s, ${ids.length} tokens`);
})();
EOF
)
fi

if [ -z "$hf" ]; then
    echo "HF: tokenizers not available here (python3 'import tokenizers' or node 'require(\"tokenizers\")')"
    exit 0
fi
hf_mbps=${hf%% *}
echo "HF (${hf#* }): encode $hf_mbps MB/s (best of $repeat)"
ratio=$(awk -v a="$ours" -v b="$hf_mbps" 'BEGIN { printf "%.2f", a / b }')
if cmp -s "$work/ours.json" "$work/hf.json"; then same="identical"; else same="DIFFERENT"; fi
echo "ratio ours/HF: $ratio; ids: $same"
[ "$same" = identical ]
