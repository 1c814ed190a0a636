#!/usr/bin/env bash
# Serving throughput of the scheduler: output tokens/s at several numbers of concurrent requests, each as a ratio
# to one request alone measured in the same run, and the prefill time of a prompt whose prefix is in the prefix
# cache against the same length cold (g4-batch-bench does the measuring; see bench/batch_bench.c).
#
#   bench/batch_speed.sh [--device cpu|cuda] [-c 1,4,16,64] [-p PROMPT] [-n NEW] [--prefix N] [-t THREADS]
#                        [--kv f32|bf16|f16] MODEL_DIR...
#
# Defaults: -c 1,4,16,64 on the CPU, 1,64,100 on cuda; -p 64 -n 32 (cuda: 128 and 128); --prefix 512.
# Random prompt ids, greedy, eos ignored. On cuda, a model whose shape is one of ../shared/configs' gets SGLang's
# H200 figure for 100 concurrent requests beside ours (docs/anchors.md section 2: E2B 9,876, E4B 7,003, 26B-A4B
# 3,676 output tok/s). On this shared CPU machine the wall clock drifts with other work: compare the ratios of
# one run, and the tok/cpu-s column (tokens per CPU second of the process), which drifts less.
# G4_BATCH_BENCH names another g4-batch-bench binary (default build/g4-batch-bench).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
shared=${G4_SHARED_DIR:-$root/../shared}
bin=${G4_BATCH_BENCH:-$root/build/g4-batch-bench}
device=cpu list= prompt= new= prefix=512 threads=0 kv=f32
models=()
while [ $# -gt 0 ]; do
    case $1 in
        --device) device=$2; shift 2 ;;
        -c) list=$2; shift 2 ;;
        -p) prompt=$2; shift 2 ;;
        -n) new=$2; shift 2 ;;
        --prefix) prefix=$2; shift 2 ;;
        -t) threads=$2; shift 2 ;;
        --kv) kv=$2; shift 2 ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        -*) echo "unknown option: $1" >&2; exit 2 ;;
        *) models+=("$1"); shift ;;
    esac
done
[ ${#models[@]} -gt 0 ] || { sed -n '2,16p' "$0" >&2; exit 2; }
[ -x "$bin" ] || { echo "batch_speed: $bin is not built (cmake --build build --target g4-batch-bench)" >&2; exit 1; }
if [ "$device" = cuda ]; then
    list=${list:-1,64,100} prompt=${prompt:-128} new=${new:-128}
else
    list=${list:-1,4,16,64} prompt=${prompt:-64} new=${new:-32}
fi

# SGLang's H200 output tok/s at 100 concurrent requests for a model of the same shape as one of ../shared/configs
sglang() {
    python3 - "$1" "$shared/configs" <<'PY'
import json, os, sys
def shape(path):
    c = json.load(open(path))
    t = c.get("text_config", c)
    return (t.get("hidden_size"), t.get("num_hidden_layers"), t.get("num_experts"))
figures = {"gemma-4-e2b.json": 9876, "gemma-4-e4b.json": 7003, "gemma-4-26b-a4b.json": 3676}
try:
    mine = shape(os.path.join(sys.argv[1], "config.json"))
    for name, tps in figures.items():
        if shape(os.path.join(sys.argv[2], name)) == mine:
            print("%s %d" % (name[:-5], tps))
except Exception:
    pass
PY
}

for m in "${models[@]}"; do
    echo "== $m ($device)"
    out=$("$bin" -m "$m" --device "$device" -t "$threads" -c "$list" -p "$prompt" -n "$new" --prefix "$prefix" \
          --kv "$kv") || { echo "$out"; echo "batch_speed: the bench failed on $m" >&2; exit 1; }
    echo "$out"
    ref=$(sglang "$m")
    echo "$out" | python3 -c '
import re, sys
ref = sys.argv[1].split()
rows = []
for line in sys.stdin:
    m = re.match(r"concurrency +(\d+) .*output +([\d.]+) tok/s .*output +([\d.]+) tok/cpu-s", line)
    if m:
        rows.append((int(m.group(1)), float(m.group(2)), float(m.group(3))))
    p = re.match(r"prefix +(\d+) \+ 16 +cold +([\d.]+) s .*hit +([\d.]+) s \(reused (\d+)\)", line)
    if p:
        print("prefix-cache hit: prefill of %s+16 tokens %.3f s vs %.3f s cold: %.2fx faster (%s tokens reused)"
              % (p.group(1), float(p.group(3)), float(p.group(2)), float(p.group(2)) / float(p.group(3)), p.group(4)))
if rows:
    c1, w1, k1 = rows[0]
    print("%12s %14s %10s %14s %10s" % ("concurrent", "output tok/s", "vs " + str(c1), "tok/cpu-s", "vs " + str(c1)))
    for c, w, k in rows:
        print("%12d %14.3f %9.2fx %14.3f %9.2fx" % (c, w, w / w1, k, k / k1))
        if c == 100 and ref:
            print("%12s %14s  SGLang, H200, %s, 100 concurrent (anchors.md): ours/SGLang %.3f"
                  % ("", ref[1], ref[0], w / float(ref[1])))
' "$ref"
done
