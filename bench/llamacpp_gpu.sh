#!/bin/bash
# llama.cpp with CUDA beside gemma4c on the GPU machine, on the same weights: a random-weight checkpoint of a
# real shape (tests/data/random_gemma4.py, safetensors), which gemma4c reads as it is and llama.cpp reads after
# its own converter (convert_hf_to_gguf.py, bf16) and llama-quantize (Q4_0). Never part of the build or tests.
#
# TARBALL: the source of llama/gitRelease.bundle (git clone it) without .git, docs/, media/ and the top models/
# (vocabularies): src/models/ is source and must stay (an --exclude=models pattern drops both).
#
#   bench/llamacpp_gpu.sh tarball BUNDLE OUT          that tarball (xz) from the bundle, on this machine
#
#   bench/llamacpp_gpu.sh prepare TARBALL DIR CONFIG   llama.cpp from a slim tarball of the source in npm
#                                                     node-llama-cpp@3.22.1 (llama/gitRelease.bundle) built with
#                                                     -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 (llama-bench,
#                                                     llama-quantize), and the model of CONFIG (one of
#                                                     ../shared/configs) as DIR/model + DIR/model-bf16.gguf +
#                                                     DIR/model-q4_0.gguf; tokenizer files from $G4_TOKENIZER_DIR
#   bench/llamacpp_gpu.sh files TARBALL DIR GEMMA4C MODEL:TYPE...
#                                                     both engines on GGUF files our writer makes from random
#                                                     weights (`gemma4c quantize --random CONFIG FILE --type
#                                                     TYPE`, every matrix in the type; MODEL names a config of
#                                                     ../shared/configs without gemma-4-), made while llama.cpp
#                                                     builds; per file llama-bench as below and gemma4c bench
#                                                     -p 512 -c 512 -n 64 -r 3, then the ratios
#   bench/llamacpp_gpu.sh make-files TARBALL DIR GEMMA4C MODEL:TYPE...
#   bench/llamacpp_gpu.sh bench-files DIR GEMMA4C MODEL:TYPE...
#                                                     the two halves of `files`: the build and the files (no GPU
#                                                     work: run it in the background of other measurements), then
#                                                     the benches and ratios
#   bench/llamacpp_gpu.sh compare DIR GEMMA4C          llama-bench (prefill 512, 64 decode steps after 512
#                                                     tokens, every layer on the GPU, flash attention) and
#                                                     gemma4c bench on the same checkpoint; ms/token and ratios
set -u
what=$1
# the tarball's source unpacked into $1/src, or a clear stop before a build that would fail minutes later
unpack() {
    mkdir -p "$1/src" && tar xJf "$2" -C "$1/src" || exit 1
    [ -d "$1/src/src/models" ] || { echo "llama.cpp tarball $2 has no src/models (make it with: $0 tarball)" >&2; exit 1; }
}

case $what in
tarball)
    bundle=$2 out=$3
    tmp=$(mktemp -d) || exit 1
    git clone -q "$bundle" "$tmp/llama.cpp" 2>/dev/null || { echo "cannot clone $bundle" >&2; rm -rf "$tmp"; exit 1; }
    rm -rf "$tmp/llama.cpp/.git" "$tmp/llama.cpp/docs" "$tmp/llama.cpp/media" "$tmp/llama.cpp/models"
    tar -C "$tmp/llama.cpp" -cJf "$out" . && echo "$out: $(du -h "$out" | cut -f1), $(tar tJf "$out" | grep -c /src/models/) files in src/models"
    rm -rf "$tmp"
    ;;
prepare)
    tarball=$2 dir=$3 config=$4
    here=$(cd "$(dirname "$0")/.." && pwd)
    unpack "$dir" "$tarball"
    cmake -S "$dir/src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null || exit 1
    t0=$(date +%s)
    (nice -n 19 cmake --build "$dir/build" -j"${JOBS:-12}" --target llama-bench llama-quantize >"$dir/build.log" 2>&1;
     echo "llama.cpp build rc=$? in $(($(date +%s) - t0)) s") &
    build=$!
    # the checkpoint meanwhile (CPU): gemma4c's generator, then llama.cpp's converter
    nice -n 19 python3 "$here/tests/data/random_gemma4.py" pair "$config" "$dir/pair" || exit 1
    python3 - "$dir/pair/main/config.json" <<'PY' || exit 1
import json, sys
c = json.load(open(sys.argv[1])); c["architectures"] = ["Gemma4ForCausalLM"]; json.dump(c, open(sys.argv[1], "w"), indent=1)
PY
    cp "${G4_TOKENIZER_DIR:?}"/tokenizer.json "${G4_TOKENIZER_DIR}"/tokenizer_config.json "$dir/pair/main/"
    nice -n 19 python3 "$dir/src/convert_hf_to_gguf.py" "$dir/pair/main" --outtype bf16 --outfile "$dir/model-bf16.gguf" \
        >"$dir/convert.log" 2>&1
    echo "convert rc=$? $(tail -1 "$dir/convert.log")"
    wait $build
    "$dir/build/bin/llama-quantize" "$dir/model-bf16.gguf" "$dir/model-q4_0.gguf" Q4_0 >"$dir/quantize.log" 2>&1
    echo "quantize rc=$? $(ls -la "$dir"/*.gguf | awk '{print $5, $9}' | tr '\n' ' ')"
    ;;
compare)
    dir=$2 bin=$3
    for t in bf16 q4_0; do
        f=$dir/model-$t.gguf
        [ -s "$f" ] || { echo "llama.cpp $t: no $f"; continue; }
        "$dir/build/bin/llama-bench" -m "$f" -ngl 99 -fa 1 -p 512 -n 64 -d 512 -r 3 -o jsonl >"$dir/llama-$t.jsonl" \
            2>"$dir/llama-$t.err"
        python3 - "$dir/llama-$t.jsonl" "$t" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    j = json.loads(l)
    if j["n_gen"]:
        print("llama.cpp %s decode after %d: %.3f ms/token" % (sys.argv[2], j["n_depth"], 1e3 / j["avg_ts"]))
    else:
        print("llama.cpp %s prefill %d after %d: %.1f tok/s" % (sys.argv[2], j["n_prompt"], j["n_depth"], j["avg_ts"]))
PY
    done | tee "$dir/llama.txt"
    "$bin" bench -m "$dir/pair/main" -p 512 -c 512 -n 64 -r 3 --device cuda | tee "$dir/gemma4c.txt"
    ours=$(awk '/^decode at context/ {print $5; exit}' "$dir/gemma4c.txt")
    theirs=$(awk '/llama.cpp bf16 decode/ {print $6; exit}' "$dir/llama.txt")
    theirs4=$(awk '/llama.cpp q4_0 decode/ {print $6; exit}' "$dir/llama.txt")
    awk -v a="$ours" -v b="$theirs" -v c="$theirs4" 'BEGIN { if (a > 0 && b > 0)
        printf "decode at 512, bf16: gemma4c %.3f ms/token, llama.cpp %.3f ms/token: %.2fx llama.cpp (llama.cpp Q4_0 %s ms)\n", a, b, b / a, c }'
    ;;
files)
    bash "$0" make-files "${@:2}" && bash "$0" bench-files "${@:3}"
    ;;
make-files)
    tarball=$2 dir=$3 bin=$4
    shift 4
    shared=${G4_SHARED_DIR:-$(cd "$(dirname "$0")/../.." && pwd)/shared}
    mkdir -p "$dir/models"
    unpack "$dir" "$tarball"
    cmake -S "$dir/src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null || exit 1
    t0=$(date +%s)
    (cmake --build "$dir/build" -j"${JOBS:-14}" --target llama-bench >"$dir/build.log" 2>&1
     echo "llama.cpp build rc=$? in $(($(date +%s) - t0)) s") &
    for spec in "$@"; do # the files meanwhile, one process each (the writer is single-threaded)
        m=${spec%%:*} t=${spec##*:}
        ("$bin" quantize --random "$shared/configs/gemma-4-$m.json" "$dir/models/$m-$t.gguf" --type "$t" \
            >"$dir/models/$m-$t.log" 2>&1; echo "$m-$t.gguf rc=$? in $(($(date +%s) - t0)) s") &
    done
    wait
    [ -x "$dir/build/bin/llama-bench" ] || { echo "llama.cpp build failed: $dir/build.log" >&2; exit 1; }
    ;;
bench-files)
    dir=$2 bin=$3
    shift 3
    for spec in "$@"; do
        f=${spec%%:*}-${spec##*:}
        "$dir/build/bin/llama-bench" -m "$dir/models/$f.gguf" -ngl 99 -fa 1 -p 512 -n 64 -d 512 -r 3 -o jsonl \
            >"$dir/llama-$f.jsonl" 2>"$dir/llama-$f.err"
        "$bin" bench -m "$dir/models/$f.gguf" -p 512 -c 512 -n 64 -r 3 --device cuda >"$dir/gemma4c-$f.txt" 2>&1
        python3 - "$dir/llama-$f.jsonl" "$dir/gemma4c-$f.txt" "$f" <<'PY'
import json, re, sys
ll = {}
for l in open(sys.argv[1]):
    j = json.loads(l)
    ll["decode" if j["n_gen"] else "prefill"] = 1e3 / j["avg_ts"] if j["n_gen"] else j["avg_ts"]
g = open(sys.argv[2]).read()
pf = re.search(r"^prefill +512 tokens: +([\d.]+) tok/s", g, re.M)
dc = re.search(r"^decode at context +512: +([\d.]+) ms/token", g, re.M)
if not (pf and dc and "decode" in ll and "prefill" in ll):
    print("%s: missing values" % sys.argv[3]); sys.exit(0)
p, d = float(pf.group(1)), float(dc.group(1))
print("%-14s prefill 512 tok/s gemma4c %8.1f llama.cpp %8.1f (%.2fx)   decode ms/token at 512 gemma4c %.3f llama.cpp %.3f (%.2fx)"
      % (sys.argv[3], p, ll["prefill"], p / ll["prefill"], d, ll["decode"], ll["decode"] / d))
PY
    done
    ;;
*) echo "usage: $0 tarball BUNDLE OUT | prepare TARBALL DIR CONFIG | compare DIR GEMMA4C | files TARBALL DIR GEMMA4C MODEL:TYPE... | make-files TARBALL DIR GEMMA4C MODEL:TYPE... | bench-files DIR GEMMA4C MODEL:TYPE..." >&2
   exit 2 ;;
esac
