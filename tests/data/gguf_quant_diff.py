#!/usr/bin/env python3
"""Cross-check of gemma4c's GGUF block decoders (src/core/quant.c) against llama.cpp's own numpy decoders
(gguf-py/gguf/quants.py, `dequantize`).  OFFLINE ONLY: it needs a gguf-py checkout, which CI does not have;
the by-hand decodes in tests/test_quant.c are what CI runs.

For every GGUF block type gemma4c reads it draws random blocks (random bytes; each f16 field -- d, dmin, m --
a random finite f16, subnormals included), writes them as one tensor per type into a GGUF file, decodes that
file with the engine (build/tests/gguf-dequant, a dev-only program: tests/tools/gguf_dequant.c, which reads
the file with the engine's GGUF reader and decodes each row with g4_dequant_row) and with gguf-py, and prints
per type the largest |difference| and the number of values that differ.  Both are exact float32 decoders of
the same layout, so every difference must be 0 (exit status 1 otherwise).

With --c-hashes it prints instead the table of tests/test_quant.c's test_decode_hashes: FNV-1a hashes of what
gguf-py decodes from 16384 elements' worth of deterministic blocks of each type (CI checks the engine against it).

Usage (from the repository root; numpy, e.g. /usr/bin/python3):
    cmake --build build --target gguf-dequant
    git --git-dir=LLAMA_CPP.git archive HEAD gguf-py | tar -x -C /tmp/llama    # any llama.cpp checkout
    python3 tests/data/gguf_quant_diff.py /tmp/llama/gguf-py [-n BLOCKS] [--seed S] [--bin build/tests/gguf-dequant]

gguf-py's package __init__ imports modules that need sentencepiece and yaml; only gguf/constants.py,
gguf/lazy.py and gguf/quants.py are loaded here (under a bare `gguf` package), so numpy is all it needs.
"""
import argparse
import importlib
import os
import struct
import subprocess
import sys
import tempfile
import types

import numpy as np

# name, ggml type id, elements per block, bytes per block, byte offsets of the f16 fields in a block
# (docs/formats.md 3.2 and src/core/quant.h)
TYPES = [
    ("Q4_0", 2, 32, 18, [0]),
    ("Q4_1", 3, 32, 20, [0, 2]),
    ("Q5_0", 6, 32, 22, [0]),
    ("Q5_1", 7, 32, 24, [0, 2]),
    ("Q8_0", 8, 32, 34, [0]),
    ("Q2_K", 10, 256, 84, [80, 82]),
    ("Q3_K", 11, 256, 110, [108]),
    ("Q4_K", 12, 256, 144, [0, 2]),
    ("Q5_K", 13, 256, 176, [0, 2]),
    ("Q6_K", 14, 256, 210, [208]),
    ("IQ4_NL", 20, 32, 18, [0]),
    ("IQ4_XS", 23, 256, 136, [0]),
    ("IQ2_XXS", 16, 256, 66, [0]),
    ("IQ2_XS", 17, 256, 74, [0]),
    ("IQ2_S", 22, 256, 82, [0]),
    ("IQ3_XXS", 18, 256, 98, [0]),
    ("IQ3_S", 21, 256, 110, [0]),
    ("IQ1_S", 19, 256, 50, [0]),
    ("IQ1_M", 29, 256, 56, []),  # its d: the top nibbles of the four 16-bit scale words (fixed below)
    ("TQ1_0", 34, 256, 54, [52]),
    ("TQ2_0", 35, 256, 66, [64]),
    ("MXFP4", 39, 32, 17, []),
    ("NVFP4", 40, 64, 36, []),
]
ROW_ELEMS = 1024  # 4 blocks of 256 or 32 of 32 per row


def load_gguf_py(root):
    """gguf.quants and gguf.constants from a gguf-py folder, without running its __init__."""
    pkg_dir = os.path.join(root, "gguf")
    if not os.path.isfile(os.path.join(pkg_dir, "quants.py")):
        sys.exit(f"{root}: not a gguf-py folder (no gguf/quants.py)")
    pkg = types.ModuleType("gguf")
    pkg.__path__ = [pkg_dir]
    sys.modules["gguf"] = pkg
    return importlib.import_module("gguf.quants"), importlib.import_module("gguf.constants")


def random_blocks(rng, n, nbytes, f16_at):
    b = rng.integers(0, 256, size=(n, nbytes), dtype=np.uint8)
    for off in f16_at:
        h = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
        h = np.where((h & 0x7C00) == 0x7C00, h ^ 0x4000, h)  # inf / nan -> a finite value
        b[:, off:off + 2] = h.astype("<u2").view(np.uint8).reshape(n, 2)
    return b


def xorshift_blocks(name, n, nbytes, f16_at):
    """tests/test_quant.c's deterministic blocks (test_decode_hashes): bytes from xorshift64 seeded by the type's
    name, each f16 field 0x3266 (0.2), IQ1_M's d likewise in its scale words' top nibbles."""
    m64 = (1 << 64) - 1
    x = 0x9E3779B97F4A7C15
    for ch in name.encode():
        x = ((x ^ ch) * 0x100000001B3) & m64
    out = np.zeros((n, nbytes), dtype=np.uint8)
    for i in range(n):
        for j in range(nbytes):
            x ^= (x << 13) & m64
            x ^= x >> 7
            x ^= (x << 17) & m64
            out[i, j] = (x >> 32) & 255
        for off in f16_at:
            out[i, off], out[i, off + 1] = 0x66, 0x32
        if name == "IQ1_M":
            for k in range(4):
                out[i, 49 + 2 * k] = (out[i, 49 + 2 * k] & 0x0F) | (((0x3266 >> (4 * k)) & 15) << 4)
    return out


def fnv_f32(values):
    """FNV-1a 64 over the little-endian bytes of float32 values"""
    h = 0xCBF29CE484222325
    for byte in np.asarray(values, dtype="<f4").tobytes():
        h = ((h ^ byte) * 0x100000001B3) & ((1 << 64) - 1)
    return h


def print_c_hashes(quants, constants):
    """The hashes tests/test_quant.c's test_decode_hashes expects, from gguf-py's decoders."""
    for name, gid, qk, nbytes, f16_at in TYPES:
        n = 64 * 256 // qk
        b = xorshift_blocks(name, n, nbytes, f16_at)
        ref = np.asarray(quants.dequantize(b, constants.GGMLQuantizationType(gid)), dtype=np.float32).reshape(-1)
        print(f"    {{G4_{name}, 0x{fnv_f32(ref):016x}ull}},")


def write_gguf(path, tensors):
    """A GGUF v3 file without metadata: tensors = [(name, ggml type, row elements, rows, bytes)]."""
    align = 32
    info, offs, off = b"", [], 0
    for name, gtype, ne0, ne1, data in tensors:
        nm = name.encode()
        info += struct.pack("<Q", len(nm)) + nm + struct.pack("<IQQIQ", 2, ne0, ne1, gtype, off)
        offs.append(off)
        off += (len(data) + align - 1) // align * align
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 0) + info
    head += b"\0" * (-len(head) % align)
    with open(path, "wb") as f:
        f.write(head)
        for (_, _, _, _, data), o in zip(tensors, offs):
            f.write(data)
            f.write(b"\0" * (-len(data) % align))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gguf_py", help="a gguf-py folder (llama.cpp's gguf-py: it holds gguf/quants.py)")
    ap.add_argument("-n", type=int, default=8192, help="blocks of 256 elements' worth per type (default 8192)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bin", default=os.path.join("build", "tests", "gguf-dequant"))
    ap.add_argument("--c-hashes", action="store_true", help="print the table of tests/test_quant.c's decode hashes")
    a = ap.parse_args()
    quants, constants = load_gguf_py(a.gguf_py)
    if a.c_hashes:
        with np.errstate(over="ignore"):
            print_c_hashes(quants, constants)
        return 0
    rng = np.random.default_rng(a.seed)
    tensors, raw = [], {}
    for name, gid, qk, nbytes, f16_at in TYPES:
        qt = constants.GGMLQuantizationType(gid)
        assert qt.name == name, (qt.name, name)
        assert tuple(constants.GGML_QUANT_SIZES[qt]) == (qk, nbytes), (name, constants.GGML_QUANT_SIZES[qt])
        n_blocks = a.n * 256 // qk
        rows = n_blocks * qk // ROW_ELEMS
        b = random_blocks(rng, rows * ROW_ELEMS // qk, nbytes, f16_at)
        if name == "IQ1_M":  # a finite f16 d, nibble i in the top of scale word i
            d = random_blocks(rng, b.shape[0], 2, [0]).view("<u2").reshape(-1).astype(np.uint16)
            for i in range(4):
                w = b[:, 48 + 2 * i:50 + 2 * i].copy().view("<u2").reshape(-1)
                w = (w & 0x0FFF) | (((d >> (4 * i)) & 15) << 12)
                b[:, 48 + 2 * i:50 + 2 * i] = w.astype("<u2").view(np.uint8).reshape(-1, 2)
        raw[name] = (qt, b.reshape(rows, -1))
        tensors.append((name, gid, ROW_ELEMS, rows, b.tobytes()))
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "blocks.gguf")
        write_gguf(path, tensors)
        r = subprocess.run([a.bin, path, tmp], capture_output=True, text=True)
        if r.returncode:
            sys.exit(f"{a.bin} failed: {r.stderr.strip()}")
        print(f"{'type':8} {'values':>10} {'max |diff|':>12} {'differ':>8}")
        for name, (qt, b) in raw.items():
            ours = np.fromfile(os.path.join(tmp, name + ".f32"), dtype="<f4").reshape(b.shape[0], ROW_ELEMS)
            ref = np.asarray(quants.dequantize(b, qt), dtype=np.float32).reshape(ours.shape)
            bad = ~((ours == ref) | (np.isnan(ours) & np.isnan(ref)))
            diff = float(np.max(np.abs(ours[bad].astype(np.float64) - ref[bad].astype(np.float64)))) if bad.any() else 0.0
            print(f"{name:8} {ours.size:>10} {diff:>12.3g} {int(bad.sum()):>8}")
            failed |= bool(bad.any())
    print("FAIL" if failed else "all identical")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
