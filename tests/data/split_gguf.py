#!/usr/bin/env python3
"""Splits a GGUF file into N shards as llama.cpp's llama-gguf-split writes them (tests/test_gguf_cli.sh):
PREFIX-0000k-of-0000N.gguf, the first with every key of the file, each with split.no (u16), split.count (u16) and
split.tensors.count (i32), its share of the tensors (in file order) and their data.
    split_gguf.py IN.gguf PREFIX N"""
import struct
import sys

SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def main():
    src, prefix, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    buf = open(src, 'rb').read()
    pos = 0

    def take(k):
        nonlocal pos
        pos += k
        return buf[pos - k:pos]

    def u32():
        return struct.unpack('<I', take(4))[0]

    def u64():
        return struct.unpack('<Q', take(8))[0]

    def string():
        return take(u64())

    def skip_value(t):
        if t in SCALAR:
            take(SCALAR[t])
        elif t == 8:
            string()
        elif t == 9:
            et, cnt = u32(), u64()
            for _ in range(cnt):
                skip_value(et)
        else:
            raise SystemExit(f'unknown GGUF value type {t}')

    assert take(4) == b'GGUF'
    version, n_tensors, n_kv = u32(), u64(), u64()
    kvs, alignment = [], 32
    for _ in range(n_kv):
        start = pos
        key = string()
        t = u32()
        vstart = pos
        skip_value(t)
        if key == b'general.alignment':
            alignment = struct.unpack('<I', buf[vstart:vstart + 4])[0]
        kvs.append(buf[start:pos])
    infos = []
    for _ in range(n_tensors):
        name = string()
        nd = u32()
        dims = [u64() for _ in range(nd)]
        t, off = u32(), u64()
        infos.append((name, dims, t, off))
    data0 = (pos + alignment - 1) // alignment * alignment
    # the tensors' sizes: the distance to the next offset (the data is packed, llama.cpp's layout)
    offs = sorted(set(i[3] for i in infos)) + [len(buf) - data0]
    size = {o: offs[k + 1] - o for k, o in enumerate(offs[:-1])}

    def kv(key, t, payload):
        k = key.encode()
        return struct.pack('<Q', len(k)) + k + struct.pack('<I', t) + payload

    per = (len(infos) + n - 1) // n
    for s in range(n):
        part = infos[s * per:(s + 1) * per]
        keys = (kvs if s == 0 else [a for a in kvs if a[8:8 + 17] == b'general.alignment']) + [
            kv('split.no', 2, struct.pack('<H', s)), kv('split.count', 2, struct.pack('<H', n)),
            kv('split.tensors.count', 5, struct.pack('<i', len(infos)))]
        head = b'GGUF' + struct.pack('<IQQ', version, len(part), len(keys)) + b''.join(keys)
        body, tinfo = b'', b''
        for name, dims, t, off in part:
            tinfo += struct.pack('<Q', len(name)) + name + struct.pack('<I', len(dims))
            tinfo += b''.join(struct.pack('<Q', d) for d in dims) + struct.pack('<IQ', t, len(body))
            body += buf[data0 + off:data0 + off + size[off]]  # (its padding included)
        head += tinfo
        head += b'\0' * ((-len(head)) % alignment)
        with open(f'{prefix}-{s + 1:05d}-of-{n:05d}.gguf', 'wb') as f:
            f.write(head + body)


main()
