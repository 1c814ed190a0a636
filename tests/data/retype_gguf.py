#!/usr/bin/env python3
"""Gives a GGUF file's matrices a block type that gemma4c reads but cannot write (the codebook, ternary and FP4
types: IQ2_XXS ... NVFP4), with deterministic random blocks (tests/test_gguf_cli.sh): every tensor of 2 or more
dimensions whose rows are whole blocks of the type becomes blocks of random bytes whose scales are chosen so that
weights stay below about 0.1 (the file is a random model of the same shapes; its logits are then compared with the
numpy reference run on the same file decoded by `gemma4c quantize OUT F32.gguf --type f32`). The metadata is kept.
    retype_gguf.py IN.gguf OUT.gguf TYPE [SEED]"""
import struct
import sys

import numpy as np

from gguf_layout import read_gguf  # beside this file

# type: ggml id, elements a block, bytes a block, f16 scale fields (offset), the scale that keeps |w| <= ~0.1
TYPES = {"iq2_xxs": (16, 256, 66, [0], 0.1 / 167), "iq2_xs": (17, 256, 74, [0], 0.1 / 167),
         "iq2_s": (22, 256, 82, [0], 0.1 / 167), "iq3_xxs": (18, 256, 98, [0], 0.1 / 481),
         "iq3_s": (21, 256, 110, [0], 0.1 / 465), "iq1_s": (19, 256, 50, [0], 0.1 / 17),
         "iq1_m": (29, 256, 56, [], 0.1 / 17), "tq1_0": (34, 256, 54, [52], 0.1),
         "tq2_0": (35, 256, 66, [64], 0.05), "mxfp4": (39, 32, 17, [], 0), "nvfp4": (40, 64, 36, [], 0)}
ELEM_BYTES = {0: 4, 1: 2, 30: 2}  # F32, F16, BF16


def random_blocks(rng, n, name):
    gid, qk, nbytes, f16_at, scale = TYPES[name]
    b = rng.integers(0, 256, size=(n, nbytes), dtype=np.uint8)
    d = np.float16(scale).view(np.uint16)
    for off in f16_at:
        b[:, off], b[:, off + 1] = d & 255, d >> 8
    if name == "iq1_m":  # d as the top nibbles of the four 16-bit scale words
        for k in range(4):
            b[:, 49 + 2 * k] = (b[:, 49 + 2 * k] & 15) | (((int(d) >> (4 * k)) & 15) << 4)
    if name == "mxfp4":  # E8M0 scale 2^(e - 128) with e in 118..121: |w| <= 12 / 2^7
        b[:, 0] = rng.integers(118, 122, size=n)
    if name == "nvfp4":  # UE4M3 scales of exponent 1 (value / 2 in 2^-7 .. 1.9 * 2^-7): |w| <= 0.18
        b[:, :4] = 8 | (b[:, :4] & 7)
    return b


def main():
    src, dst, name = sys.argv[1], sys.argv[2], sys.argv[3]
    rng = np.random.default_rng(int(sys.argv[4]) if len(sys.argv) > 4 else 1)
    gid, qk, nbytes = TYPES[name][:3]
    buf = open(src, "rb").read()
    version, kvs, alignment, infos, data0 = read_gguf(buf)
    n_tensors, n_kv = len(infos), len(kvs)
    kvs = b"".join(kvs)
    out_infos, blobs, off, changed = b"", [], 0, 0
    for tname, dims, t, toff in infos:
        n = int(np.prod(dims))
        if t in ELEM_BYTES:
            data = buf[data0 + toff:data0 + toff + n * ELEM_BYTES[t]]
            if len(dims) >= 2 and dims[0] % qk == 0:
                data, t = random_blocks(rng, n // qk, name).tobytes(), gid
                changed += 1
        else:
            raise SystemExit(f"{src}: tensor {tname.decode()} is of type {t}: give a file of F32 / F16 / BF16 tensors")
        out_infos += struct.pack("<Q", len(tname)) + tname + struct.pack("<I", len(dims))
        out_infos += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", t, off)
        blobs.append(data)
        off += (len(data) + alignment - 1) // alignment * alignment
    if not changed:
        raise SystemExit(f"{src}: no matrix has rows of whole {name} blocks")
    head = b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + kvs + out_infos
    with open(dst, "wb") as f:
        f.write(head + b"\0" * (-len(head) % alignment))
        for data in blobs:
            f.write(data + b"\0" * (-len(data) % alignment))
    print(f"{changed} tensors as {name}")


if __name__ == "__main__":
    main()
