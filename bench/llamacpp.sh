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
#                                      same load, each after a first touch of the file (warm_up); the
#                                      table: model, type, threads, prefill tok/s at 64 and 512,
#                                      decode tok/s and GB/s, ratio gemma4c/llama.cpp (median of the
#                                      per-round ratios), and the load average while measuring
#   bench/llamacpp.sh summarize FILE   the table again from a compare run's raw values
#
# Everything lands in $G4_BENCH_DIR (default /tmp/gemma4c-bench: tens of GB); llama.cpp is
# never part of our build or tests. THREADS (default 2), TG (decode tokens, default 32)
# and MODELS (names below) select. ISA=avx2 compares both engines as an AVX2 machine runs them (no AVX-512):
# llama.cpp built in its own tree (build-avx2: GGML_NATIVE=OFF, AVX2/FMA/F16C on, AVX-512 off; `setup` with
# ISA=avx2 builds it) and gemma4c with G4_CPU_ISA=avx2.
# BF16 files: llama.cpp multiplies them with activations rounded to bf16, so gemma4c runs them with the same
# numerics, --bf16-act (g4_load_params.bf16_activations), as engine "gemma4c"; BF16_EXACT=1 (default) also runs
# gemma4c's exact default (f32 activations) on them as engine "gemma4c-f32act", in the same rounds (A/B). The
# table says which numerics each row ran.
set -eu -o pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dir=${G4_BENCH_DIR:-/tmp/gemma4c-bench}
threads=${THREADS:-2}
tg=${TG:-32} # decode tokens per measurement
bin=${G4_BIN:-$here/build/gemma4c}
shared=${G4_SHARED_DIR:-$here/../shared}
isa=${ISA:-}
build=$dir/llama.cpp/build${isa:+-$isa}
llama=$build/bin
case $isa in
'') llama_flags="-DGGML_NATIVE=ON" ;;
avx2) llama_flags="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
      -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF"
      export G4_CPU_ISA=avx2 ;;
*) echo "ISA: avx2 or unset" >&2; exit 1 ;;
esac
mkdir -p "$dir/models"

# name  config                 type
all_models="e2b-q4_0:gemma-4-e2b:q4_0 e2b-q8_0:gemma-4-e2b:q8_0 e2b-bf16:gemma-4-e2b:bf16 26b-q4_0:gemma-4-26b-a4b:q4_0 e2b-q4_k_m:gemma-4-e2b:q4_k_m"
models=${MODELS:-$all_models}

setup() {
    if [ ! -d "$dir/npm/node_modules/node-llama-cpp" ]; then
        npm install --no-save --ignore-scripts --prefix "$dir/npm" node-llama-cpp@3.22.1
    fi
    if [ ! -d "$dir/llama.cpp" ]; then
        git clone -q "$dir/npm/node_modules/node-llama-cpp/llama/gitRelease.bundle" "$dir/llama.cpp"
    fi
    # shellcheck disable=SC2086 # llama_flags: several words
    cmake -S "$dir/llama.cpp" -B "$build" -DCMAKE_BUILD_TYPE=Release $llama_flags \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DBUILD_SHARED_LIBS=ON >/dev/null
    nice -n 19 cmake --build "$build" -j2 --target llama >/dev/null
    cc -O2 -o "$llama/llama-logits" "$here/bench/llama_logits.c" -I"$dir/llama.cpp/include" \
        -I"$dir/llama.cpp/ggml/include" -L"$llama" -lllama -Wl,-rpath,"$llama"
    echo "llama.cpp ready in $llama"
    # llama-bench and llama-quantize (minutes more: they pull in llama.cpp's common library)
    nice -n 19 cmake --build "$build" -j2 --target llama-bench llama-quantize >/dev/null
}

make_models() {
    for spec in $models; do
        IFS=: read -r name cfg type <<<"$spec"
        f=$dir/models/$name.gguf
        case $type in
        q3_k_m | q4_k_m | q5_k_m) # llama.cpp's mixes (Q3_K / Q4_K / Q5_K with larger types for the head and
            # some v and down rows), as the files people download: llama-quantize from the bf16 file of the same config
            src=$dir/models/${name%-*}-bf16.gguf
            [ -s "$src" ] || /usr/bin/python3 "$here/tests/data/random_gemma4.py" model "$shared/configs/$cfg.json" "$src" --type bf16
            [ -s "$f" ] || "$llama/llama-quantize" "$src" "$f" "$(echo "$type" | tr a-z A-Z)" >/dev/null 2>&1 ;;
        *) [ -s "$f" ] || /usr/bin/python3 "$here/tests/data/random_gemma4.py" model "$shared/configs/$cfg.json" "$f" --type "$type" ;;
        esac
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

# One engine's numbers for one model, lines "ENGINE TEST VALUE": TEST pp64, pp512 (prefill tok/s), tg$TG (decode
# tok/s: $TG one-token steps from an (almost) empty cache, as llama-bench's tg test), and for gemma4c GB/token (the
# bytes a decode step reads: weights and KV rows, g4_model_decode_bytes). Each engine warms up inside its process
# before it is timed (llama-bench and llama-logits: one untimed run; gemma4c bench: one untimed prefill).
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
# the values are taken by their labels: the field before "tok/s", "GB/token"; ENGINE names the rows, the rest are
# gemma4c's options
gemma4c_bench() {
    local engine=$1 f=$2
    shift 2
    G4_BENCH_NO_COPY=1 "$bin" bench -m "$f" -t "$threads" -p 64,512 -c 1 -n "$tg" -r 1 "$@" | awk -v tg="tg$tg" -v e="$engine" '
        function before(label,   i) { for (i = 2; i <= NF; i++) if ($i == label) return $(i - 1); return "" }
        /^model/ { print "#", e ":", $0 }
        /^prefill/ { print e, "pp" $2, before("tok/s") }
        /^decode/ { print e, tg, before("tok/s"); print e, "GB/token", before("GB/token") }'
}
is_bf16() { case "$(basename "$1")" in *bf16*) return 0 ;; *) return 1 ;; esac; }
run_gemma4c() {
    if is_bf16 "$1"; then
        gemma4c_bench gemma4c "$1" --bf16-act
        [ "${BF16_EXACT:-1}" = 0 ] || gemma4c_bench gemma4c-f32act "$1"
    else
        gemma4c_bench gemma4c "$1"
    fi
}

# First touch of a model file before an engine is measured on it (the files together are larger than the page
# cache: a run right after another model's would read from disk): read the whole file when it fits in the
# available memory, else one short untimed run of the engine. Says what it did and how long the read took
# (seconds per GB tell page cache from disk).
warm_up() {
    local f=$1 engine=$2 size avail t0 t1
    size=$(stat -c %s "$f")
    avail=$(($(awk '/^MemAvailable:/ {print $2}' /proc/meminfo) * 1024))
    if [ "$size" -lt $((avail * 9 / 10)) ]; then
        t0=$(date +%s.%N); cat "$f" >/dev/null; t1=$(date +%s.%N)
        echo "# warm-up before $engine: read $(basename "$f") ($(python3 -c "print('%.1f GB in %.1f s' % ($size / 1e9, $t1 - $t0))"))"
    elif [ "$engine" = run_gemma4c ]; then
        G4_BENCH_NO_COPY=1 "$bin" bench -m "$f" -t "$threads" -p 8 -n 1 -r 1 >/dev/null
        echo "# warm-up before $engine: one short untimed run ($(basename "$f") larger than the available memory)"
    else
        "$llama/llama-logits" --bench "$f" 8 1 "$threads" 1 >/dev/null
        echo "# warm-up before $engine: one short untimed run ($(basename "$f") larger than the available memory)"
    fi
}

# Both engines on each model, A/B then B/A in alternate rounds (the machine is shared: both see the same load),
# each line with the 1-minute load average when it was measured; per round the ratio gemma4c/llama.cpp, and the
# median of those ratios over the rounds.
compare() {
    rounds=${1:-3}
    out=$dir/compare-$(date +%Y%m%d-%H%M%S).txt
    local engines="llama-bench"
    [ -x "$llama/llama-bench" ] || engines="libllama through llama-logits --bench (llama-bench not built)"
    echo "# $(uname -n) $(nproc) cores, threads $threads, decode $tg tokens; instruction set ${isa:-native}; llama.cpp: $engines; $(date -u)" | tee "$out"
    for r in $(seq 1 "$rounds"); do
        for spec in $models; do
            IFS=: read -r name cfg type <<<"$spec"
            f=$dir/models/$name.gguf
            order="run_llama run_gemma4c"
            [ $((r % 2)) = 0 ] && order="run_gemma4c run_llama"
            for engine in $order; do
                warm_up "$f" "$engine" | tee -a "$out"
                $engine "$f" | while read -r e t v; do
                    if [ "$e" = "#" ]; then echo "# $t $v"; continue; fi
                    echo "$r $name $e $t $v $(cut -d' ' -f1 /proc/loadavg)"
                done | tee -a "$out"
            done
        done
    done
    summarize "$out"
}

# The table: per model a row per engine (prefill 64 and 512, decode tok/s and GB/s: medians over the rounds;
# llama.cpp's GB/s is its decode rate times the bytes per token gemma4c reports for the same file) and the ratio
# gemma4c / llama.cpp (median of the per-round ratios, which are listed below the table).
summarize() {
    python3 - "$1" "$threads" <<'PY'
import sys, statistics as st, collections
val, load = collections.defaultdict(dict), []
head = ""
for line in open(sys.argv[1]):
    p = line.split()
    if line.startswith("# ") and not head: head = line[2:].strip()
    if len(p) == 6 and p[0].isdigit():
        val[(p[1], p[3])][(p[2], int(p[0]))] = float(p[4])
        load.append(float(p[5]))
names = sorted({k[0] for k in val}, key=lambda n: (n[:3], n))
tgs = sorted({k[1] for k in val if k[1].startswith("tg")})
tg = tgs[0] if tgs else "tg"
tests = ["pp64", "pp512", tg]
def med(n, t, e):
    xs = [x for (ee, r), x in val.get((n, t), {}).items() if ee == e]
    return st.median(xs) if xs else None
def ratios(n, t):
    v = val.get((n, t), {})
    return [v[("gemma4c", r)] / v[("llama.cpp", r)] for r in sorted({r for (_, r) in v})
            if ("gemma4c", r) in v and ("llama.cpp", r) in v and v[("llama.cpp", r)] > 0]
f = lambda x, d=1: ("%%.%df" % d) % x if x is not None else "–"
print(f"\n{head}\n")
print(f"| model | type | threads | engine | prefill 64 tok/s | prefill 512 tok/s | decode tok/s ({tg}) | decode GB/s |")
print("|---|---|---|---|---|---|---|---|")
per_round = []
for n in names:
    model, typ = n.split("-", 1)
    gbt = med(n, "GB/token", "gemma4c")
    engines = ["gemma4c", "gemma4c-f32act", "llama.cpp"]
    for e in [e for e in engines if any(ee == e for k in (val.get((n, t), {}) for t in tests) for (ee, _) in k)]:
        d = med(n, tg, e)
        gbs = d * gbt if d is not None and gbt is not None else None
        print(f"| {model} | {typ} | {sys.argv[2]} | {e} | {f(med(n, 'pp64', e))} | {f(med(n, 'pp512', e))} | {f(d)} | {f(gbs)} |")
    rs = [ratios(n, t) for t in tests]
    print(f"| {model} | {typ} | {sys.argv[2]} | **ratio** gemma4c / llama.cpp | "
          + " | ".join(f(st.median(x), 2) if x else "–" for x in rs) + " | |")
    per_round.append(f"{n}: " + "; ".join(f"{t} {' '.join('%.2f' % x for x in r)}" for t, r in zip(tests, rs) if r))
print("\nratios per round: " + " | ".join(per_round))
if any(ee == "gemma4c-f32act" for v in val.values() for (ee, _) in v):
    print("BF16 files: engine gemma4c ran with --bf16-act (activations rounded to bf16, as llama.cpp; the ratio row), "
          "gemma4c-f32act with the exact default (f32 activations)")
if load:
    print(f"{len({r for k in val.values() for (_, r) in k})} rounds, interleaved A/B then B/A; 1-minute load average "
          f"while measuring: min {min(load):.1f}, median {st.median(load):.1f}, max {max(load):.1f} "
          f"(raw values and warm-ups in {sys.argv[1]})")
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
