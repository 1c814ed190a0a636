#!/usr/bin/python3
"""The peer of bench/audio_tower_speed.sh: the numpy reference of ../shared/reference/numpy
(audio_numpy.py: features, tower, embed_audio in float32 numpy) on the same model folder and
the same synthetic signal as g4-audio-bench. Prints one line like g4-audio-bench.

usage: audio_tower_numpy.py SHARED_DIR MODEL_DIR [SECONDS] [REPEAT]"""
import json
import os
import sys
import time

import numpy as np

shared, model = sys.argv[1], sys.argv[2]
seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 30.0
repeat = int(sys.argv[4]) if len(sys.argv) > 4 else 2
sys.path.insert(0, os.path.join(shared, "reference", "numpy"))
import audio_numpy  # noqa: E402
import st  # noqa: E402

cfg = json.load(open(os.path.join(model, "config.json")))["audio_config"]
W = st.load(os.path.join(model, "model.safetensors"))
n = min(int(seconds * 16000), 480000)
t = np.arange(n) / 16000.0
s, noise = 1, np.empty(n)
for i in range(n):  # the generator of g4-audio-bench
    s = (s * 1103515245 + 12345) & 0xFFFFFFFF
    noise[i] = (s >> 8) / 16777216.0 - 0.5
x = (0.3 * np.sin(2 * np.pi * 220 * t) + 0.1 * np.sin(2 * np.pi * 1700 * t) + 0.01 * noise).astype(np.float32)
best_f = best_t = 1e30
for _ in range(repeat):
    t0 = time.perf_counter()
    feats, valid = audio_numpy.features(x)
    t1 = time.perf_counter()
    out, m2 = audio_numpy.tower(W, cfg, feats[valid], np.ones(int(valid.sum()), np.float32))
    emb = audio_numpy.embed(W, "model.embed_audio.", out)
    t2 = time.perf_counter()
    best_f, best_t = min(best_f, (t1 - t0) * 1e3), min(best_t, (t2 - t1) * 1e3)
print("%.1f s audio, %d soft tokens, features %.1f ms, tower %.1f ms" % (n / 16000.0, len(emb), best_f, best_t))
