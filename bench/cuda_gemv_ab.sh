#!/bin/bash
# A/B of the one-token GEMV's knobs on a GPU: G4_CUDA_GEMV_CAP=N (one-tile products: at most N blocks a
# multiprocessor, each looping over row groups and staging its inputs once; default 8), G4_CUDA_GEMV_SMEM_KB=K
# (inputs staged per block; default 40: E2B's 12288-wide down products then take two tiles) and
# G4_CUDA_GEMV_BLOCKS=N (warps per row grow until the rows fill N blocks a multiprocessor; default 2).
# Op tests and fixtures with each setting, then decode at context 512 of three real shapes with random weights
# (the default measured first and last).
#
# usage: bench/cuda_gemv_ab.sh SHARED BIN [SETTING...]   (BIN: gemma4c, test_backend_ops, test_decoder of a CUDA build)
S=$1 B=$2
shift 2
settings=("$@")
[ ${#settings[@]} = 0 ] && settings=("G4_CUDA_GEMV_CAP=2" "G4_CUDA_GEMV_CAP=4" "G4_CUDA_GEMV_SMEM_KB=64"
    "G4_CUDA_GEMV_SMEM_KB=64 G4_CUDA_GEMV_CAP=2" "G4_CUDA_GEMV_SMEM_KB=64 G4_CUDA_GEMV_CAP=4")
for v in "${settings[@]}"; do
    echo "== tests with $v: ops $(env $v $B/test_backend_ops 2>&1 | tail -1); decoder $(env $v $B/test_decoder 2>&1 | tail -1)"
done
for m in e2b e4b 26b-a4b; do
    for v in "X=0" "${settings[@]}" "X=0"; do
        echo "$m $v: $(env $v $B/gemma4c bench --random $S/configs/gemma-4-$m.json -p 1 -c 512 -n 64 -r 3 --device cuda 2>&1 | grep '^decode')"
    done
done
