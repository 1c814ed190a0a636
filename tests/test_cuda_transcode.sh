#!/bin/bash
# GGUF types the CUDA backend has no kernels for, end to end (--device cuda; without a GPU through the emulator
# build, G4_CUDA_EMULATE): such tensors are held in a layout that holds their values exactly where one does (MXFP4
# as MXF4, the codebook types as CB4 / CB4_16 on rows of whole 256-blocks, Q4_1 / Q5_1 as MLX4 / MLX8 with groups of
# 32 and f32 scales, Q3_K as Q6_K: cuda_common.cuh g4c_held_dtype; no warning), else as Q8_0, re-encoded at upload
# (cuda_quant.cu g4c_upload_quant, core/quant.h g4_transcode_row), with one warning line per type.
#  - dense-ple with every matrix NVFP4 (random blocks, tests/data/retype_gguf.py; rows of 128, no whole CB4_16 block):
#    one warning line (test_backend_ops checks that the products of a re-encoded type are bit for bit those of its
#    values re-encoded by g4_transcode_row and uploaded as Q8_0).
#  - The moe fixture as Q4_1 (its 3-D expert tensors too), dense-ple with every matrix MXFP4 (MXF4) and with its rows
#    of 256 IQ2_XS (CB4_16; before: Q8_0 with a warning): no warning (test_backend_ops checks the products of every
#    such type against the file's values).
#  - The trained example model as Q5_0, Q5_K, IQ4_XS and Q2_K (which CUDA holds as they are), as MLX3 and MLX6 (held exactly
#    as MLX4 and MLX8: no warning; 0.1 as for Q5_K, an affine type), as Q4_1 (held exactly as MLX4) and as Q3_K (held
#    exactly as Q6_K):
#    CUDA's 12 greedy tokens are the CPU's, and with float activations (G4_NO_INT8_ACT) the prompt's logits (|logit|
#    up to 18) are within the type's tolerance of the CPU's, which reads the file's own values: 0.05 where CUDA holds
#    them exactly (measured in the emulator: Q5_0 0.030, IQ4_XS 0.022; the same model as a Q8_0 file 0.025: the sums'
#    order), 0.1 for Q5_K and Q4_1 (0.057: CUDA sums an affine type's segment as a * sum(v x) + b * sum(x), whose two
#    terms partly cancel; Q4_K 0.047). (With the default
#    int8 activations the Q8_0 file itself differs by 0.21, CPU against CUDA; and the random fixtures are too
#    chaotic for a comparison across backends: their greedy tokens part at equal weights, Q8_0 files included.)
#  - bench --random --type q4_1 on CUDA (weights made on the GPU, in its own types): one line.
# Skipped (77) when the build has no CUDA backend or no GPU is there.
set -u
bin=${G4_BIN:?}; shared=${G4_SHARED_DIR:?}; src=${G4_SOURCE_DIR:?}; tmp=${G4_TMP:-/tmp}/cuda-transcode
. "$(cd "$(dirname "$0")" && pwd)/cli_check.sh" # check, expect_error

"$bin" --version | grep -q cuda || { echo "skipped: no CUDA backend in this build"; exit 77; }
rm -rf "$tmp"; mkdir -p "$tmp"
"$bin" quantize "$shared/fixtures/moe" "$tmp/moe-q4_1.gguf" --type q4_1 >/dev/null &&
    "$bin" quantize "$shared/fixtures/dense-ple" "$tmp/ple-f32.gguf" --type f32 >/dev/null &&
    "${G4_PYTHON:-/usr/bin/python3}" "$src/tests/data/retype_gguf.py" "$tmp/ple-f32.gguf" "$tmp/ple-nvfp4.gguf" nvfp4 >/dev/null &&
    "${G4_PYTHON:-/usr/bin/python3}" "$src/tests/data/retype_gguf.py" "$tmp/ple-f32.gguf" "$tmp/ple-mxfp4.gguf" mxfp4 >/dev/null &&
    "${G4_PYTHON:-/usr/bin/python3}" "$src/tests/data/retype_gguf.py" "$tmp/ple-f32.gguf" "$tmp/ple-iq2_xs.gguf" iq2_xs >/dev/null
check $? "quantize the fixtures to q4_1 / nvfp4 / mxfp4 / iq2_xs"
ids=2,17,99,45,300,12,7,88,150,33,21,400,8,9,10,11
if ! "$bin" logits -m "$tmp/moe-q4_1.gguf" --device cuda --ids $ids -o "$tmp/a.f32" 2>"$tmp/warn.txt"; then
    grep -q "no CUDA GPU" "$tmp/warn.txt" && { echo "skipped: $(cat "$tmp/warn.txt")"; exit 77; }
    check 1 "moe Q4_1 on cuda: $(cat "$tmp/warn.txt")"
fi
[ ! -s "$tmp/warn.txt" ]; check $? "moe Q4_1 on cuda: held exactly, no warning ($(head -c 300 "$tmp/warn.txt"))"
"$bin" logits -m "$tmp/ple-nvfp4.gguf" --device cuda --ids $ids -o "$tmp/a.f32" 2>"$tmp/warn.txt" &&
    [ "$(cat "$tmp/warn.txt")" = "gemma4c: warning: the cuda backend holds the NVFP4 tensors as Q8_0 (re-encoded: 8.5 bits a weight)" ]
check $? "dense-ple NVFP4 on cuda: one warning line ($(head -c 300 "$tmp/warn.txt"))"
"$bin" logits -m "$tmp/ple-mxfp4.gguf" --device cuda --ids $ids -o "$tmp/a.f32" 2>"$tmp/warn.txt" && [ ! -s "$tmp/warn.txt" ]
check $? "dense-ple MXFP4 on cuda: held exactly, no warning ($(head -c 300 "$tmp/warn.txt"))"
"$bin" logits -m "$tmp/ple-iq2_xs.gguf" --device cuda --ids $ids -o "$tmp/a.f32" 2>"$tmp/warn.txt" && [ ! -s "$tmp/warn.txt" ]
check $? "dense-ple IQ2_XS on cuda: held exactly (CB4_16), no warning ($(head -c 300 "$tmp/warn.txt"))"
logit_diff() { # file a, file b, tolerance: prints the largest difference, fails above the tolerance
    python3 - "$1" "$2" "$3" <<'PY'
import array, sys
a, b = array.array("f"), array.array("f")
a.frombytes(open(sys.argv[1], "rb").read()); b.frombytes(open(sys.argv[2], "rb").read())
d = max(abs(x - y) for x, y in zip(a, b)) if len(a) == len(b) and a else float("inf")
print("%.2e" % d)
sys.exit(0 if d <= float(sys.argv[3]) else 1)
PY
}

tar -xJf "$src/models/tolstoy-tiny.tar.xz" -C "$tmp" || { echo "cannot unpack the example model"; exit 1; }
m=$tmp/tolstoy-tiny
pids=$("$bin" tokenize -m "$m" -p "The old prince")
# one type and its tolerance (TYPE:TOL), files in $tmp/each-TYPE:TOL/ (the emulator runs on one thread: `each` runs
# the types side by side)
example_type() {
    local tol=${1#*:} t=${1%:*} d=$tmp/each-$1 a b e noint8=
    local f=$d/tt-$t.gguf
    # MLX: greedy tokens with float activations (MLX3's part at token 11 between the backends' int8 activations, the
    # prompt's on CUDA's bf16 tiles; with float ones both give the same 12, so the held values are the file's)
    case $t in mlx*) f=$d/tt-$t noint8=G4_NO_INT8_ACT=1 ;; esac
    "$bin" quantize "$m" "$f" --type $t >/dev/null &&
        a=$(env $noint8 "$bin" generate -m "$f" --device cpu --ids "$pids" -n 12 --temp 0 --ignore-eos) &&
        b=$(env $noint8 "$bin" generate -m "$f" --device cuda --ids "$pids" -n 12 --temp 0 --ignore-eos 2>"$d/warn.txt") &&
        [ -n "$a" ] && [ "$a" = "$b" ]
    check $? "example model $t: cuda's greedy tokens are the cpu's${noint8:+ (float activations)} ($b)"
    case $t in mlx* | q4_1 | q3_k | q2_k) # held exactly (MLX3 as MLX4, MLX6 as MLX8, Q4_1 as MLX4, Q3_K as Q6_K): no
        # warning (the greedy run's; the layout a type is held in does not depend on the activations)
        [ ! -s "$d/warn.txt" ]
        check $? "example model $t on cuda: no warning ($(head -c 200 "$d/warn.txt"))" ;;
    esac
    G4_NO_INT8_ACT=1 "$bin" logits -m "$f" --device cpu --ids "$pids" -o "$d/c.f32" &&
        G4_NO_INT8_ACT=1 "$bin" logits -m "$f" --device cuda --ids "$pids" -o "$d/g.f32" 2>/dev/null &&
        e=$(logit_diff "$d/c.f32" "$d/g.f32" "$tol")
    check $? "example model $t: cuda's prompt logits within $tol of the cpu's, float activations (${e:-})"
    rm -rf "$f"
}
each example_type q5_0:0.05 q5_k:0.1 iq4_xs:0.05 q2_k:0.05 q4_1:0.1 q3_k:0.05 mlx3:0.1 mlx6:0.1

expect_error "bench --random --type q4_1 on cuda" "$bin" bench --device cuda --random "$m/config.json" --type q4_1 \
    -p 8 -c 16 -n 2 -r 1
grep -q "runs those" "$tmp/err.txt"; check $? "it names the type that runs"
exit $fail
