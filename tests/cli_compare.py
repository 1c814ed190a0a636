#!/usr/bin/env python3
"""Helpers for the CLI tests (standard library only): read a fixture's
reference.safetensors and compare the engine's outputs with it."""
import json
import struct
import sys


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = data[base + begin: base + end]
        fmt = {"F32": "f", "I64": "q"}.get(info["dtype"])
        if fmt is None:
            continue
        count = len(raw) // struct.calcsize(fmt)
        out[name] = (info["shape"], struct.unpack("<%d%s" % (count, fmt), raw))
    return out


def main():
    cmd = sys.argv[1]
    if cmd == "ids":  # print a reference int tensor as a comma list
        ref = read_safetensors(sys.argv[2])
        print(",".join(str(x) for x in ref[sys.argv[3]][1]))
    elif cmd in ("logits", "rel"):
        # logits REF FILE TOL: max |ours - reference logits|
        # rel REF FILE NAME TOL: max |ours - reference NAME| / max |reference NAME|
        ref = read_safetensors(sys.argv[2])
        name, tol = ("logits", sys.argv[4]) if cmd == "logits" else (sys.argv[4], sys.argv[5])
        shape, want = ref[name]
        with open(sys.argv[3], "rb") as f:
            raw = f.read()
        if len(raw) != 4 * len(want):
            print("size mismatch: %d bytes, expected %d" % (len(raw), 4 * len(want)))
            sys.exit(1)
        got = struct.unpack("<%df" % len(want), raw)
        err = max(abs(a - b) for a, b in zip(got, want))
        if cmd == "rel":
            err /= max(abs(b) for b in want)
        print("%.3e" % err)
        sys.exit(0 if err <= float(tol) else 1)
    else:
        sys.exit("unknown command " + cmd)


if __name__ == "__main__":
    main()
