#!/bin/bash
# A/B of the one-token GEMV's knobs on a GPU (not yet run on one: the device machine was withdrawn before):
# G4_CUDA_GEMV_UNROLL=8 (8 weight accesses in flight per lane instead of 4) and G4_CUDA_GEMV_BLOCKS=N (warps per
# row grow until the rows fill N blocks a multiprocessor; default 2). Op tests and fixtures with each setting,
# then decode at context 512 of three real shapes with random weights (the default measured first and last).
#
# usage: bench/cuda_gemv_ab.sh SHARED BIN   (BIN: gemma4c, test_backend_ops, test_decoder of a CUDA build)
S=$1 B=$2
for v in "G4_CUDA_GEMV_UNROLL=8" "G4_CUDA_GEMV_BLOCKS=4" "G4_CUDA_GEMV_UNROLL=8 G4_CUDA_GEMV_BLOCKS=4"; do
    echo "== tests with $v: ops $(env $v $B/test_backend_ops 2>&1 | tail -1); decoder $(env $v $B/test_decoder 2>&1 | tail -1)"
done
for m in e2b e4b 26b-a4b; do
    for v in "X=0" "G4_CUDA_GEMV_UNROLL=8" "G4_CUDA_GEMV_BLOCKS=4" "G4_CUDA_GEMV_UNROLL=8 G4_CUDA_GEMV_BLOCKS=4" "G4_CUDA_GEMV_BLOCKS=1" "X=0"; do
        echo "$m $v: $(env $v $B/gemma4c bench --random $S/configs/gemma-4-$m.json -p 1 -c 512 -n 64 -r 3 --device cuda 2>&1 | grep '^decode')"
    done
done
