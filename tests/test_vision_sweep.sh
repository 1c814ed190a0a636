#!/bin/bash
# The vision tower on random Gemma 4 vision configurations no fixture has (tests/data/vision_sweep.py): widths,
# layers, heads and kv heads, head sizes, patch sizes, pooling kernels, position tables (one exactly as wide as the
# grid, one too small), clipped linears, standardize, RoPE theta, eps, class defaults, F32/BF16/F16 files, lower
# CPU instruction sets, thread counts; random PNG/JPEG/GIF/WebP images of every PIL mode from 1x1 to a few hundred
# pixels at every budget; `encode-image` soft tokens against ../shared/reference/numpy (imgproc.py, vision_numpy.py),
# llama.cpp's text GGUF + mmproj files of the same weights, a negative control, and invalid configurations refused
# in one line. G4_VSWEEP_CASES (default 16), G4_SWEEP_DEVICE (default cpu) and G4_SWEEP_SEED choose the sweep.
set -u
bin=${G4_BIN:?}; src=${G4_SOURCE_DIR:?}; shared=${G4_SHARED_DIR:?}; tmp=${G4_TMP:-/tmp}/vision-sweep
ref=$shared/reference/numpy
[ -f "$ref/vision_numpy.py" ] && [ -f "$ref/imgproc.py" ] || { echo "skip: no $ref/vision_numpy.py"; exit 77; }
"${G4_PYTHON:-/usr/bin/python3}" -c "import numpy" 2>/dev/null || { echo "skip: ${G4_PYTHON:-/usr/bin/python3} has no numpy"; exit 77; }
"${G4_PYTHON:-/usr/bin/python3}" -c "import PIL.Image" 2>/dev/null || { echo "skip: ${G4_PYTHON:-/usr/bin/python3} has no PIL (python3-pil)"; exit 77; }
rm -rf "$tmp"; mkdir -p "$tmp"
"${G4_PYTHON:-/usr/bin/python3}" "$src/tests/data/vision_sweep.py" --bin "$bin" --reference "$ref" --tmp "$tmp" --control \
    --cases "${G4_VSWEEP_CASES:-16}" --seed "${G4_SWEEP_SEED:-2026}" --device "${G4_SWEEP_DEVICE:-cpu}"
rc=$?
[ $rc = 0 ] && rm -rf "$tmp"
exit $rc
