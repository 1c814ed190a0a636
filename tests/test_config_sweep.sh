#!/bin/bash
# The text decoder on random Gemma 4 configurations no fixture has (tests/data/config_sweep.py): layer patterns,
# widths, heads, head sizes, k=v, per-layer inputs, KV sharing, double-wide MLP, MoE, biases, softcapping, untied
# heads, RoPE variants, small sliding windows, F32/BF16/F16 files; prefill logits, greedy decode and batched
# greedy decode against ../shared/reference/numpy, and invalid configurations refused in one line.
# G4_SWEEP_CASES (default 60), G4_SWEEP_DEVICE (default cpu) and G4_SWEEP_SEED choose the sweep.
set -u
bin=${G4_BIN:?}; src=${G4_SOURCE_DIR:?}; shared=${G4_SHARED_DIR:?}; tmp=${G4_TMP:-/tmp}/config-sweep
ref=$shared/reference/numpy
[ -f "$ref/text_numpy.py" ] || { echo "skip: no $ref/text_numpy.py"; exit 77; }
"${G4_PYTHON:-/usr/bin/python3}" -c "import numpy" 2>/dev/null || { echo "skip: ${G4_PYTHON:-/usr/bin/python3} has no numpy"; exit 77; }
rm -rf "$tmp"; mkdir -p "$tmp"
"${G4_PYTHON:-/usr/bin/python3}" "$src/tests/data/config_sweep.py" --bin "$bin" --reference "$ref" --tmp "$tmp" --control \
    --cases "${G4_SWEEP_CASES:-60}" --seed "${G4_SWEEP_SEED:-2026}" --device "${G4_SWEEP_DEVICE:-cpu}"
rc=$?
[ $rc = 0 ] && rm -rf "$tmp"
exit $rc
