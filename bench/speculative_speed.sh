#!/bin/bash
# Speculative decoding speed: gemma4c bench --draft prints the time of a draft step and of verification steps of
# k tokens as multiples of a one-token step, and greedy generation with the drafter against plain greedy
# generation of the same tokens in the same run (x ratio, acceptance rate).
#   bench/speculative_speed.sh [BUILD_DIR] [PAIR_DIR]
# 1. the fixture pair of ../shared/fixtures/assistant (tiny: overheads; drafts are really accepted there);
# 2. a random-weight pair of real shapes (E2B main model, an E2B-like drafter) made once by
#    tests/data/random_gemma4.py into PAIR_DIR (default /tmp/gemma4c-e2b-pair, about 9 GB): real costs,
#    but random weights accept no drafts, so its tokens/s with the drafter is the worst case.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
pair=${2:-/tmp/gemma4c-e2b-pair}
shared=${G4_SHARED_DIR:-$here/../../shared}
bin=$build/gemma4c
fx=$shared/fixtures/assistant
for d in assistant-lmhead assistant-ordered; do
    "$bin" bench -m "$fx" --draft "$fx/$d" -p 37 -n 64 -r 5 -t 1
done
if [ ! -f "$pair/drafter/model.safetensors" ]; then
    /usr/bin/python3 "$here/../tests/data/random_gemma4.py" pair "$shared/configs/gemma-4-e2b.json" "$pair"
fi
for n in 4 20; do
    "$bin" bench -m "$pair/main" --draft "$pair/drafter" --draft-n $n -p 8 -n 8 -r 2
done
