#!/bin/bash
# The audio path on random Gemma 4 audio configurations no fixture has (tests/data/audio_sweep.py): widths, heads,
# layers, subsampling channels, depthwise kernels, attention chunk / left context, logit caps, residual weights,
# gradient clipping, eps, output widths, clipped or plain linears, F32/BF16/F16 files; random WAV files (int16,
# 24-bit, float32; mono, stereo; a handful of samples to ~10 s; other sample rates) through `gemma4c encode-audio`
# against ../shared/reference/numpy/audio_numpy.py's features and a port of transformers' blocked attention; a
# negative control; invalid or unsupported configurations refused in one line.
# G4_AUDIO_SWEEP_CASES (default 16), G4_SWEEP_DEVICE (default cpu) and G4_SWEEP_SEED choose the sweep.
set -u
bin=${G4_BIN:?}; src=${G4_SOURCE_DIR:?}; shared=${G4_SHARED_DIR:?}; tmp=${G4_TMP:-/tmp}/audio-sweep
ref=$shared/reference/numpy
[ -f "$ref/audio_numpy.py" ] || { echo "skip: no $ref/audio_numpy.py"; exit 77; }
"${G4_PYTHON:-/usr/bin/python3}" -c "import numpy" 2>/dev/null || { echo "skip: ${G4_PYTHON:-/usr/bin/python3} has no numpy"; exit 77; }
rm -rf "$tmp"; mkdir -p "$tmp"
"${G4_PYTHON:-/usr/bin/python3}" "$src/tests/data/audio_sweep.py" --bin "$bin" --reference "$ref" --tmp "$tmp" --control \
    --cases "${G4_AUDIO_SWEEP_CASES:-16}" --seed "${G4_SWEEP_SEED:-2026}" --device "${G4_SWEEP_DEVICE:-cpu}"
rc=$?
[ $rc = 0 ] && rm -rf "$tmp"
exit $rc
