#!/usr/bin/env python3
"""Splits a GGUF file into N shards as llama.cpp's llama-gguf-split writes them (tests/test_gguf_cli.sh):
PREFIX-0000k-of-0000N.gguf, the first with every key of the file, each with split.no (u16), split.count (u16) and
split.tensors.count (i32), its share of the tensors (in file order) and their data.
    split_gguf.py IN.gguf PREFIX N"""
import struct
import sys

from gguf_layout import read_gguf  # beside this file


def main():
    src, prefix, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    buf = open(src, 'rb').read()
    version, kvs, alignment, infos, data0 = read_gguf(buf)
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
        body, at, tinfo = [], 0, b''  # (the data as a list of parts: appending to bytes copies them each time)
        for name, dims, t, off in part:
            tinfo += struct.pack('<Q', len(name)) + name + struct.pack('<I', len(dims))
            tinfo += b''.join(struct.pack('<Q', d) for d in dims) + struct.pack('<IQ', t, at)
            body.append(buf[data0 + off:data0 + off + size[off]])  # (its padding included)
            at += size[off]
        head += tinfo
        head += b'\0' * ((-len(head)) % alignment)
        with open(f'{prefix}-{s + 1:05d}-of-{n:05d}.gguf', 'wb') as f:
            f.write(head)
            for b in body:
                f.write(b)


main()
