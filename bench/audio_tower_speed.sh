#!/usr/bin/env bash
# Audio tower speed on the CPU: 30 s of audio through the feature extractor and the audio tower
# + embed_audio of a real config with random weights (bench/make_audio_tower_model.py; E4B by
# default), ours (g4-audio-bench) and, in the same run, the float32 numpy reference
# (../shared/reference/numpy/audio_numpy.py, BLAS matmuls). Prints both and the ratio numpy/ours
# (above 1: ours is faster). Needs /usr/bin/python3 with numpy.
#
#   bench/audio_tower_speed.sh [--config FILE] [--seconds S] [--threads N] [--repeat N] [--dir DIR]
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
shared=${G4_SHARED_DIR:-$root/../shared}
config=$shared/configs/gemma-4-e4b.json
seconds=30; threads=0; repeat=2; dir=""
while [ $# -gt 0 ]; do
    case $1 in
        --config) config=$2; shift 2 ;;
        --seconds) seconds=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --repeat) repeat=$2; shift 2 ;;
        --dir) dir=$2; shift 2 ;;
        -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 1 ;;
    esac
done
[ -n "$dir" ] || dir=${TMPDIR:-/tmp}/g4-audio-bench-$(basename "$config" .json)
bin=$root/build/g4-audio-bench
if [ ! -x "$bin" ]; then
    cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$root/build" --target g4-audio-bench -j"$(nproc)" >/dev/null
fi
[ -f "$dir/model.safetensors" ] || /usr/bin/python3 "$root/bench/make_audio_tower_model.py" "$config" "$dir"
ours=$("$bin" "$dir" "$seconds" "$threads" "$repeat")
peer=$(/usr/bin/python3 "$root/bench/audio_tower_numpy.py" "$shared" "$dir" "$seconds" "$repeat")
echo "gemma4c: $ours"
echo "numpy:   $peer"
tower() { sed -E 's/.*tower ([0-9.]+) ms.*/\1/' <<<"$1"; }
feat() { sed -E 's/.*features ([0-9.]+) ms.*/\1/' <<<"$1"; }
awk -v a="$(tower "$peer")" -v b="$(tower "$ours")" -v c="$(feat "$peer")" -v d="$(feat "$ours")" \
    'BEGIN { printf "ratio numpy/gemma4c: tower %.2f, features %.2f\n", a / b, c / d }'
