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


def read_like(path, want):
    """The float32 file at path as a tuple, or None (after a message) when its size is not that of want."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) != 4 * len(want):
        print("size mismatch: %d bytes, expected %d" % (len(raw), 4 * len(want)))
        return None
    return struct.unpack("<%df" % len(want), raw)


def main():
    cmd = sys.argv[1]
    if cmd == "ids":  # print a reference int tensor as a comma list
        ref = read_safetensors(sys.argv[2])
        print(",".join(str(x) for x in ref[sys.argv[3]][1]))
    elif cmd == "logits":  # max |ours - reference| of a float32 logits file
        ref = read_safetensors(sys.argv[2])
        shape, want = ref["logits"]
        got = read_like(sys.argv[3], want)
        if got is None:
            sys.exit(1)
        err = max(abs(a - b) for a, b in zip(got, want))
        print("%.3e" % err)
        sys.exit(0 if err <= float(sys.argv[4]) else 1)
    elif cmd == "files":  # max |a - b| of two float32 files of one size
        with open(sys.argv[3], "rb") as f:
            raw = f.read()
        want = struct.unpack("<%df" % (len(raw) // 4), raw[:len(raw) // 4 * 4])
        got = read_like(sys.argv[2], want)
        if got is None:
            sys.exit(1)
        err = max(abs(a - b) for a, b in zip(got, want))
        print("%.3e" % err)
        sys.exit(0 if err <= float(sys.argv[4]) else 1)
    elif cmd == "rel":  # max |ours - reference| / max |reference| of a float32 file against a named tensor
        ref = read_safetensors(sys.argv[2])
        shape, want = ref[sys.argv[3]]
        got = read_like(sys.argv[4], want)
        if got is None:
            sys.exit(1)
        err = max(abs(a - b) for a, b in zip(got, want)) / max(abs(b) for b in want)
        print("%.3e" % err)
        sys.exit(0 if err <= float(sys.argv[5]) else 1)
    elif cmd == "argmax":  # id of the largest logit of the last row of a float32 logits file [rows, vocab]
        vocab = int(sys.argv[3])
        with open(sys.argv[2], "rb") as f:
            raw = f.read()
        row = struct.unpack("<%df" % vocab, raw[-4 * vocab:])
        print(max(range(vocab), key=lambda i: (row[i], -i)))
    elif cmd == "prompt":  # a fixture's input_ids as a chat template writes them: one placeholder per input
        ids = read_safetensors(sys.argv[2] + "/reference.safetensors")["input_ids"][1]
        with open(sys.argv[2] + "/config.json") as f:
            c = json.load(f)
        placeholders, begins = {c["image_token_id"], c["audio_token_id"]}, {c["boi_token_id"], c["boa_token_id"]}
        out, i = [], 0
        while i < len(ids):  # <|x> N x <|x|> <x|> -> <|x|>
            if ids[i] in begins and i + 1 < len(ids) and ids[i + 1] in placeholders:
                j = i + 1
                while j < len(ids) and ids[j] == ids[i + 1]:
                    j += 1
                out.append(ids[i + 1])
                i = j + 1
            else:
                out.append(ids[i])
                i += 1
        print(",".join(str(x) for x in out))
    elif cmd == "greedy":  # a fixture's reference greedy ids as a comma list
        with open(sys.argv[2] + "/reference.json") as f:
            print(",".join(str(x) for x in json.load(f)["greedy_ids"]))
    else:
        sys.exit("unknown command " + cmd)


if __name__ == "__main__":
    main()
