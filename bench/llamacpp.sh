#!/bin/bash
# gemma4c against llama.cpp on the same GGUF files, same machine, same threads.
#
#   bench/llamacpp.sh setup            llama.cpp from npm node-llama-cpp@3.22.1 (its source
#                                      bundle), built with GGML_NATIVE=ON: libllama and
#                                      bench/llama_logits.c against it (also llama-bench and
#                                      llama-quantize with G4_BENCH_LLAMA_BENCH=1)
#   bench/llamacpp.sh models           random-weight GGUF files at real shapes (E2B Q4_0,
#                                      Q8_0, BF16; 26B-A4B Q4_0), written by gemma4c quantize
#   bench/llamacpp.sh check            the independent check of our GGUF writer and reader:
#                                      fixtures written as GGUF (F32, Q8_0), run by llama.cpp and
#                                      by gemma4c: greedy ids and logits compared
#   bench/llamacpp.sh compare [ROUNDS] both engines, interleaved round by round so that both
#                                      see the same load; medians and ratios (gemma4c/llama.cpp)
#
# Everything lands in $G4_BENCH_DIR (default /tmp/gemma4c-bench: tens of GB); llama.cpp is
# never part of our build or tests. THREADS (default 2) and MODELS (names below) select.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
dir=${G4_BENCH_DIR:-/tmp/gemma4c-bench}
threads=${THREADS:-2}
bin=${G4_BIN:-$here/build/gemma4c}
shared=${G4_SHARED_DIR:-$here/../shared}
llama=$dir/llama.cpp/build/bin
mkdir -p "$dir/models"

# name  config                 type
all_models="e2b-q4_0:gemma-4-e2b:q4_0 e2b-q8_0:gemma-4-e2b:q8_0 e2b-bf16:gemma-4-e2b:bf16 26b-q4_0:gemma-4-26b-a4b:q4_0"
models=${MODELS:-$all_models}

setup() {
    if [ ! -d "$dir/npm/node_modules/node-llama-cpp" ]; then
        npm install --no-save --ignore-scripts --prefix "$dir/npm" node-llama-cpp@3.22.1
    fi
    if [ ! -d "$dir/llama.cpp" ]; then
        git clone -q "$dir/npm/node_modules/node-llama-cpp/llama/gitRelease.bundle" "$dir/llama.cpp"
    fi
    cmake -S "$dir/llama.cpp" -B "$dir/llama.cpp/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DBUILD_SHARED_LIBS=ON >/dev/null
    cmake --build "$dir/llama.cpp/build" -j"$(nproc)" --target llama >/dev/null
    cc -O2 -o "$llama/llama-logits" "$here/bench/llama_logits.c" -I"$dir/llama.cpp/include" \
        -I"$dir/llama.cpp/ggml/include" -L"$llama" -lllama -Wl,-rpath,"$llama"
    echo "llama.cpp ready in $llama"
    # llama-bench and llama-quantize (minutes more: they pull in llama.cpp's common library)
    [ "${G4_BENCH_LLAMA_BENCH:-0}" = 1 ] &&
        cmake --build "$dir/llama.cpp/build" -j"$(nproc)" --target llama-bench llama-quantize >/dev/null
    return 0
}

make_models() {
    for spec in $models; do
        IFS=: read -r name cfg type <<<"$spec"
        f=$dir/models/$name.gguf
        [ -s "$f" ] || "$here/scripts/random-checkpoint" "$shared/configs/$cfg.json" "$f" "$type"
        ls -la "$f"
    done
}

# max |a - b| of two float32 files and the number of differing argmaxes over rows of V
compare_logits() {
    python3 - "$1" "$2" "$3" <<'PY'
import array, sys
a, b = array.array('f'), array.array('f')
a.frombytes(open(sys.argv[1], 'rb').read()); b.frombytes(open(sys.argv[2], 'rb').read())
V = int(sys.argv[3]); rows = len(a) // V
d = max(abs(x - y) for x, y in zip(a, b))
am = sum(1 for r in range(rows) if max(range(V), key=lambda i: a[r*V+i]) != max(range(V), key=lambda i: b[r*V+i]))
print(f"max|diff| {d:.2e}  argmax differs in {am}/{rows} rows")
PY
}

check() {
    for fx in dense-keqv moe; do
        f=$shared/fixtures/$fx
        ids=$(python3 -c "
import json,struct,array
b=open('$f/reference.safetensors','rb').read(); n=struct.unpack('<Q',b[:8])[0]; h=json.loads(b[8:8+n]); e=h['input_ids']
a=array.array('q'); a.frombytes(b[8+n+e['data_offsets'][0]:8+n+e['data_offsets'][1]]); print(','.join(map(str,a)))")
        V=$(python3 -c "import json; c=json.load(open('$f/config.json')); print(c.get('text_config',c)['vocab_size'])")
        for t in f32 q8_0; do
            g=$dir/check-$fx-$t.gguf
            "$bin" quantize "$f" "$g" --type $t
            "$llama/llama-logits" "$g" "$ids" 24 "$dir/check-$fx-$t.llama" 2>/dev/null
            "$bin" logits -m "$g" --ids "$ids" -o "$dir/check-$fx-$t.g4.f32"
            ours=$("$bin" generate -m "$g" --ids "$ids" -n 24 --temp 0 --ignore-eos)
            theirs=$(cat "$dir/check-$fx-$t.llama.greedy.txt")
            same=$([ "$ours" = "$theirs" ] && echo "identical" || echo "DIFFER: ours $ours, llama.cpp $theirs")
            echo "$fx $t: greedy ids $same; logits $(compare_logits "$dir/check-$fx-$t.g4.f32" "$dir/check-$fx-$t.llama.logits.f32" "$V")"
        done
    done
}

compare() {
    rounds=${1:-3}
    out=$dir/compare-$(date +%Y%m%d-%H%M%S).txt
    echo "uptime: $(uptime)" | tee "$out"
    for r in $(seq 1 "$rounds"); do
        for spec in $models; do
            IFS=: read -r name cfg type <<<"$spec"
            f=$dir/models/$name.gguf
            # llama.cpp timed by bench/llama_logits.c --bench: what llama-bench times (pp: a
            # prefill into an empty cache; tg: one-token decodes from an empty cache), after a warm-up
            "$llama/llama-logits" --bench "$f" 512 32 "$threads" 1 | sed "s/^/$r $name llama.cpp /" | tee -a "$out"
            "$llama/llama-logits" --bench "$f" 64 0 "$threads" 1 | grep pp64 | sed "s/^/$r $name llama.cpp /" |
                tee -a "$out"
            "$bin" bench -m "$f" -t "$threads" -p 512 -n 32 -r 1 | awk -v r=$r -v n=$name '
                /^prefill/ {print r, n, "gemma4c pp512", $4} /^decode/ {print r, n, "gemma4c tg32", $4}
                /^weights/ {print r, n, "gemma4c GB/token", $6; print r, n, "gemma4c GB/s", $8}' | tee -a "$out"
            "$bin" bench -m "$f" -t "$threads" -p 64 -n 1 -r 1 | awk -v r=$r -v n=$name '
                /^prefill/ {print r, n, "gemma4c pp64", $4}' | tee -a "$out"
        done
    done
    echo "uptime: $(uptime)" | tee -a "$out"
    python3 - "$out" <<'PY'
import sys, statistics as st, collections
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    p = line.split()
    if len(p) == 5 and p[0].isdigit(): v[(p[1], p[2], p[3])].append(float(p[4]))
med = {k: st.median(x) for k, x in v.items()}
names = sorted({k[0] for k in med}, key=lambda n: (n[:3], n))
print("\n| model | type | threads | test | gemma4c tok/s | llama.cpp tok/s | ratio | gemma4c GB/s |")
print("|---|---|---|---|---|---|---|---|")
for n in names:
    for t in ("pp64", "pp512", "tg32"):
        g, l = med.get((n, "gemma4c", t)), med.get((n, "llama.cpp", t))
        if g is None or l is None: continue
        gbs = med.get((n, "gemma4c", "GB/s"), 0) if t == "tg32" else None
        print(f"| {n.split('-')[0]} | {n.split('-')[1]} | {__import__('os').environ.get('THREADS','2')} | {t} | {g:.1f} | {l:.1f} | {g/l:.2f} | {'%.1f' % gbs if gbs else ''} |")
print(f"\n(medians of {len(next(iter(v.values())))} interleaved rounds; raw values in {sys.argv[1]})")
PY
}

case "${1:-}" in
setup) setup ;;
models) make_models ;;
check) check ;;
compare) compare "${2:-3}" ;;
*) sed -n 2,20p "$0"; exit 2 ;;
esac
