#!/bin/bash
# gemma4c against llama.cpp on the same GGUF files, same machine, same threads.
#
#   bench/llamacpp.sh setup            llama.cpp from npm node-llama-cpp@3.22.1 (its source
#                                      bundle), built with GGML_NATIVE=ON at nice 19, -j2 (a shared
#                                      machine): libllama, bench/llama_logits.c against it,
#                                      llama-bench and llama-quantize
#   bench/llamacpp.sh models           random-weight GGUF files at real shapes (E2B Q4_0,
#                                      Q8_0, BF16; 26B-A4B Q4_0), by tests/data/random_gemma4.py
#   bench/llamacpp.sh check            the independent check of our GGUF writer and reader:
#                                      fixtures written as GGUF (F32, Q8_0), run by llama.cpp and
#                                      by gemma4c: greedy ids and logits compared
#   bench/llamacpp.sh compare [ROUNDS] both engines on each model (llama-bench, or libllama through
#                                      llama_logits.c --bench when llama-bench is not built; gemma4c
#                                      bench), A/B then B/A in alternate rounds so that both see the
#                                      same load; per round the ratio gemma4c/llama.cpp, the median of
#                                      the ratios, and the load average while measuring
#   bench/llamacpp.sh summarize FILE   the table again from a compare run's raw values
#
# Everything lands in $G4_BENCH_DIR (default /tmp/gemma4c-bench: tens of GB); llama.cpp is
# never part of our build or tests. THREADS (default 2), TG (decode tokens, default 32)
# and MODELS (names below) select.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
dir=${G4_BENCH_DIR:-/tmp/gemma4c-bench}
threads=${THREADS:-2}
tg=${TG:-32} # decode tokens per measurement
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
    nice -n 19 cmake --build "$dir/llama.cpp/build" -j2 --target llama >/dev/null
    cc -O2 -o "$llama/llama-logits" "$here/bench/llama_logits.c" -I"$dir/llama.cpp/include" \
        -I"$dir/llama.cpp/ggml/include" -L"$llama" -lllama -Wl,-rpath,"$llama"
    echo "llama.cpp ready in $llama"
    # llama-bench and llama-quantize (minutes more: they pull in llama.cpp's common library)
    nice -n 19 cmake --build "$dir/llama.cpp/build" -j2 --target llama-bench llama-quantize >/dev/null
}

make_models() {
    for spec in $models; do
        IFS=: read -r name cfg type <<<"$spec"
        f=$dir/models/$name.gguf
        [ -s "$f" ] || /usr/bin/python3 "$here/tests/data/random_gemma4.py" model "$shared/configs/$cfg.json" "$f" --type "$type"
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

# one engine's numbers for one model: lines "ENGINE TEST TOK/S" (TEST: pp64 pp512 tg$TG; gemma4c also GB/s)
run_llama() {
    if [ -x "$llama/llama-bench" ]; then
        "$llama/llama-bench" -m "$1" -t "$threads" -p 64,512 -n "$tg" -r 1 -o jsonl 2>/dev/null | python3 -c '
import json, sys
for l in sys.stdin:
    j = json.loads(l); print("llama.cpp", ("pp%d" % j["n_prompt"]) if j["n_prompt"] else ("tg%d" % j["n_gen"]), j["avg_ts"])'
    else # libllama through bench/llama_logits.c --bench: what llama-bench times
        "$llama/llama-logits" --bench "$1" 512 "$tg" "$threads" 1 | sed 's/^/llama.cpp /'
        "$llama/llama-logits" --bench "$1" 64 0 "$threads" 1 | grep pp64 | sed 's/^/llama.cpp /'
    fi
}
run_gemma4c() {
    "$bin" bench -m "$1" -t "$threads" -p 64 -n 0 -r 1 | awk '/^prefill/ {print "gemma4c pp64", $4}'
    "$bin" bench -m "$1" -t "$threads" -p 512 -n "$tg" -r 1 | awk -v tg="tg$tg" '/^prefill/ {print "gemma4c pp512", $4}
        /^decode/ {print "gemma4c", tg, $4} /^weights/ {print "gemma4c GB/s", $8}'
}

# Both engines on each model, A/B then B/A in alternate rounds (the machine is shared: both see the same load),
# each line with the 1-minute load average when it was measured; per round the ratio gemma4c/llama.cpp, and the
# median of those ratios over the rounds.
compare() {
    rounds=${1:-3}
    out=$dir/compare-$(date +%Y%m%d-%H%M%S).txt
    echo "# $(uname -n) $(nproc) cores, threads $threads; $(date -u)" | tee "$out"
    for r in $(seq 1 "$rounds"); do
        for spec in $models; do
            IFS=: read -r name cfg type <<<"$spec"
            f=$dir/models/$name.gguf
            order="run_llama run_gemma4c"
            [ $((r % 2)) = 0 ] && order="run_gemma4c run_llama"
            for engine in $order; do
                $engine "$f" | while read -r e t v; do
                    echo "$r $name $e $t $v $(cut -d' ' -f1 /proc/loadavg)"
                done | tee -a "$out"
            done
        done
    done
    summarize "$out"
}

summarize() {
    python3 - "$1" "$threads" <<'PY'
import sys, statistics as st, collections
val, load = collections.defaultdict(dict), []
for line in open(sys.argv[1]):
    p = line.split()
    if len(p) == 6 and p[0].isdigit():
        val[(p[1], p[3])][(p[2], int(p[0]))] = float(p[4])
        load.append(float(p[5]))
print("\n| model | type | threads | test | gemma4c tok/s | llama.cpp tok/s | ratio (median of rounds) | ratios per round | gemma4c GB/s |")
print("|---|---|---|---|---|---|---|---|---|")
names = sorted({k[0] for k in val}, key=lambda n: (n[:3], n))
for n in names:
    for t in ["pp64", "pp512"] + sorted({k[1] for k in val if k[0] == n and k[1].startswith("tg")}):
        v = val.get((n, t), {})
        rounds = sorted({r for (_, r) in v if ("gemma4c", r) in v and ("llama.cpp", r) in v})
        if not rounds: continue
        ratios = [v[("gemma4c", r)] / v[("llama.cpp", r)] for r in rounds]
        g = st.median(v[("gemma4c", r)] for r in rounds)
        l = st.median(v[("llama.cpp", r)] for r in rounds)
        gb = val.get((n, "GB/s"), {})
        gbs = "%.1f" % st.median(x for (e, r), x in gb.items()) if t.startswith("tg") and gb else ""
        print(f"| {n.split('-', 1)[0]} | {n.split('-', 1)[1]} | {sys.argv[2]} | {t} | {g:.1f} | {l:.1f} | "
              f"{st.median(ratios):.2f} | {' '.join('%.2f' % x for x in ratios)} | {gbs} |")
print(f"\n{len({r for k in val.values() for (_, r) in k})} rounds, interleaved A/B then B/A; 1-minute load average "
      f"while measuring: min {min(load):.1f}, median {st.median(load):.1f}, max {max(load):.1f} "
      f"(raw values in {sys.argv[1]})")
PY
}

case "${1:-}" in
setup) setup ;;
models) make_models ;;
check) check ;;
compare) compare "${2:-3}" ;;
summarize) summarize "$2" ;;
*) sed -n 2,20p "$0"; exit 2 ;;
esac
