#!/usr/bin/env bash
# Vision-tower speed per image on the CPU: g4-vision-bench (ours) and, in the same run, the same tower in
# PyTorch (Debian's python3-torch, when installed; with libopenblas0-pthread it runs on OpenBLAS, else on
# the reference BLAS) or else numpy (bench/vision_peer.py), on random-weight
# checkpoints shaped like the released towers (../shared/configs; made once by
# bench/make_vision_checkpoint.py: about 340 MB for E4B, 1.2 GB for 31B). Prints ms per image, the ratio
# peer/ours and how far our soft tokens are from the peer's.
#
#   bench/vision_tower.sh [--configs "e4b 31b"] [--budget 280] [--size 1024x768] [--threads 2] [--reps 2]
#                         [--data DIR]   (checkpoints; default ${TMPDIR:-/tmp}/g4-vision-bench)
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
shared=${G4_SHARED_DIR:-$root/../shared}
configs="e4b 31b"; budget=280; size=1024x768; threads=2; reps=2; data=${TMPDIR:-/tmp}/g4-vision-bench
while [ $# -gt 0 ]; do
    case $1 in
        --configs) configs=$2; shift 2 ;;
        --budget) budget=$2; shift 2 ;;
        --size) size=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --data) data=$2; shift 2 ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 1 ;;
    esac
done
py=/usr/bin/python3; [ -x $py ] || py=python3
# the peer's BLAS: OpenBLAS (Debian's libopenblas0-pthread) when installed, whatever libblas.so.3 points to
openblas=/usr/lib/x86_64-linux-gnu/openblas-pthread
peer_env=""; [ -e "$openblas/libblas.so.3" ] && peer_env="LD_LIBRARY_PATH=$openblas"
bin=${G4_VISION_BENCH:-$root/build/g4-vision-bench}
if [ ! -x "$bin" ]; then
    cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$root/build" --target g4-vision-bench -j"$(nproc)" >/dev/null
fi
w=${size%x*}; h=${size#*x}
for c in $configs; do
    dir=$data/$c
    [ -f "$dir/model.safetensors" ] || $py "$root/bench/make_vision_checkpoint.py" "$shared/configs/gemma-4-$c.json" "$dir"
    ours=$("$bin" "$dir" "$w" "$h" "$budget" "$reps" "$threads" "$dir/ours.f32")
    peer=$(env $peer_env $py "$root/bench/vision_peer.py" "$shared" "$dir" "$w" "$h" "$budget" "$reps" "$threads" "$dir/ours.f32")
    echo "$c ($size at budget $budget, $threads threads): ours $ours"
    echo "$c: $peer ${peer_env:+(OpenBLAS)}" | head -1
    o=$(echo "$ours" | sed -n 's/.*mean_ms \([0-9.]*\).*/\1/p'); p=$(echo "$peer" | sed -n 's/.*mean_ms \([0-9.]*\).*/\1/p' | head -1)
    echo "$c: peer/ours = $(awk -v a="$p" -v b="$o" 'BEGIN { printf "%.2f", a / b }'), soft tokens $(echo "$peer" | tail -1)"
done
