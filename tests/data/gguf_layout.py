"""The layout of a GGUF file (docs/formats.md 3.1), for the test scripts that rewrite one (split_gguf.py,
retype_gguf.py): read_gguf(buf) -> version, the key/value records as they are (a list of raw bytes, one a key),
the alignment, the tensor infos [(name bytes, dims, ggml type, offset)] and where the data starts."""
import struct

SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def read_gguf(buf):
    pos = 0

    def take(k):
        nonlocal pos
        pos += k
        return buf[pos - k:pos]

    def u32():
        return struct.unpack("<I", take(4))[0]

    def u64():
        return struct.unpack("<Q", take(8))[0]

    def skip_value(t):
        if t in SCALAR:
            take(SCALAR[t])
        elif t == 8:
            take(u64())
        elif t == 9:
            et, cnt = u32(), u64()
            for _ in range(cnt):
                skip_value(et)
        else:
            raise SystemExit(f"unknown GGUF value type {t}")

    if take(4) != b"GGUF":
        raise SystemExit("not a GGUF file")
    version, n_tensors, n_kv = u32(), u64(), u64()
    kvs, alignment = [], 32
    for _ in range(n_kv):
        start = pos
        key = take(u64())
        t = u32()
        vstart = pos
        skip_value(t)
        if key == b"general.alignment":
            alignment = struct.unpack("<I", buf[vstart:vstart + 4])[0]
        kvs.append(buf[start:pos])
    infos = []
    for _ in range(n_tensors):
        name = take(u64())
        dims = [u64() for _ in range(u32())]
        infos.append((name, dims, u32(), u64()))
    return version, kvs, alignment, infos, (pos + alignment - 1) // alignment * alignment
