#!/usr/bin/env python3
"""Builds the seed corpus of the fuzz harnesses (tests/fuzz/README.md) from the reference folder
(../shared), the example model (models/) and the test data, into OUT/<harness>/.  Nothing here is
committed: the seeds are made small (tensors shrunk to a few elements, the real tokenizer cut to
its first ids) so that the fuzzers run fast.

    tests/fuzz/make_corpus.py OUT [--shared DIR] [--gemma4c BUILD/gemma4c]

--gemma4c is needed for the tokenizer-cache seeds (caches are written by loading a tokenizer)."""
import argparse
import glob
import hashlib
import io
import json
import os
import random
import struct
import subprocess
import sys
import tarfile
import tempfile
import wave

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
         "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}


class Corpus:
    def __init__(self, out):
        self.out = out
        self.count = {}

    def add(self, harness, data):
        if isinstance(data, str):
            data = data.encode("utf-8")
        d = os.path.join(self.out, harness)
        os.makedirs(d, exist_ok=True)
        name = hashlib.sha1(data).hexdigest()[:16]
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
        self.count[harness] = self.count.get(harness, 0) + 1


def safetensors_bytes(header, data_len, fill=0):
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + bytes([fill]) * data_len


def shrink_safetensors(path):
    """The file's tensors (names, dtypes, ranks, metadata) with each dimension cut to 2."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        head = f.read(4096)
    out, off = {}, 0
    for name, t in hdr.items():
        if name == "__metadata__":
            out[name] = t
            continue
        if t["dtype"] not in BYTES:
            continue
        shape = [min(d, 2) for d in t["shape"]]
        size = BYTES[t["dtype"]]
        for d in shape:
            size *= d
        out[name] = {"dtype": t["dtype"], "shape": shape, "data_offsets": [off, off + size]}
        off += size
    truncated = struct.pack("<Q", n) + json.dumps(hdr).encode()[:n] + head[:256]
    return safetensors_bytes(out, off, 1), truncated


def gguf_bytes(kvs, tensors, align=32):
    """A GGUF v3 file: kvs = [(key, type, payload bytes)], tensors = [(name, ggml type, [ne0, ne1], data)]."""
    def string(t):
        t = t.encode()
        return struct.pack("<Q", len(t)) + t
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    head += b"".join(string(k) + struct.pack("<I", t) + v for k, t, v in kvs)
    off, body = 0, b""
    for name, gtype, ne, data in tensors:
        head += string(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        head += struct.pack("<IQ", gtype, off)
        body += data + b"\0" * (-len(data) % align)
        off = len(body)
    return head + b"\0" * (-len(head) % align) + body


def reduced_tokenizer(path, keep=3000):
    """The real tokenizer.json with the pieces of ids < keep, the merges among them, the added
    tokens among them: its whole pipeline at a small size."""
    t = json.load(open(path, encoding="utf-8"))
    vocab = {k: v for k, v in t["model"]["vocab"].items() if v < keep}
    merges = []
    for m in t["model"]["merges"]:
        a, b = m if isinstance(m, list) else m.split(" ", 1)
        if a in vocab and b in vocab and a + b in vocab:
            merges.append([a, b])
    t["model"]["vocab"] = vocab
    t["model"]["merges"] = merges
    t["added_tokens"] = [a for a in t["added_tokens"] if a["id"] < keep]
    return json.dumps(t, ensure_ascii=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shared", default=os.environ.get("G4_SHARED_DIR", os.path.join(ROOT, "..", "shared")))
    ap.add_argument("--gemma4c", help="the gemma4c binary (for tokenizer-cache seeds)")
    args = ap.parse_args()
    shared = args.shared
    c = Corpus(args.out)
    tmp = tempfile.mkdtemp(prefix="g4corpus-")

    # the example model, unpacked if needed
    model = os.path.join(ROOT, "models", "tolstoy-tiny")
    if not os.path.isdir(model):
        tar = os.path.join(ROOT, "models", "tolstoy-tiny.tar.xz")
        if os.path.exists(tar):
            with tarfile.open(tar) as tf:
                tf.extractall(tmp)
            model = os.path.join(tmp, "tolstoy-tiny")
    # every fixture folder, nested ones too (the assistant drafters beside their main model)
    models = sorted({os.path.dirname(p) for p in glob.glob(os.path.join(shared, "fixtures", "**", "*"), recursive=True)
                     if os.path.isfile(p)}) + [model]

    # weights
    for m in models:
        for st in sorted(glob.glob(os.path.join(m, "*.safetensors"))):
            small, truncated = shrink_safetensors(st)
            c.add("safetensors", small)
            c.add("safetensors", truncated)
    c.add("safetensors", safetensors_bytes({}, 0))
    # GGUF: metadata of each value type, then a row of every block type the engine reads (random bytes, f16 scales of
    # 1/64 at each type's first two bytes)
    rnd = random.Random(7)
    kvs = [("general.architecture", 8, struct.pack("<Q", 6) + b"gemma4"), ("gemma4.block_count", 4, struct.pack("<I", 2)),
           ("gemma4.rope.freq_base", 6, struct.pack("<f", 1e6)), ("x.flag", 7, b"\1"),
           ("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 2) + struct.pack("<Q", 1) + b"a" + struct.pack("<Q", 1) + b"b")]
    blocks = {0: (1, 4), 1: (1, 2), 30: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
              10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 20: (32, 18), 23: (256, 136),
              16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 21: (256, 110), 22: (256, 82), 29: (256, 56),
              34: (256, 54), 35: (256, 66), 39: (32, 17), 40: (64, 36)}
    for gtype, (qk, nbytes) in blocks.items():
        data = bytearray(rnd.getrandbits(8) for _ in range(256 // qk * nbytes))
        if qk > 1:
            for k in range(256 // qk):
                data[k * nbytes:k * nbytes + 2] = struct.pack("<H", 0x2400)
        c.add("gguf", gguf_bytes(kvs, [("t.%d" % gtype, gtype, [256, 1], bytes(data))]))
    c.add("gguf", gguf_bytes(kvs, []))
    # a whole small gemma4 vocabulary (tokenizer/tok_gguf.c: control and user-defined tokens, merges, scores)
    def gstr(t):
        b = t.encode("utf-8")
        return struct.pack("<Q", len(b)) + b
    toks = ["<pad>", "<eos>", "<bos>", "<unk>", "<turn>", "a", "b", "ab", "\u2581", "\u2581a", "\u2581ab", "<0x41>"]
    ttypes = [3, 3, 3, 2, 4, 1, 1, 1, 1, 1, 1, 6]
    merges = ["a b", "\u2581 a", "\u2581a b"]
    vkvs = [("tokenizer.ggml.model", 8, gstr("gemma4")),
            ("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, len(toks)) + b"".join(gstr(t) for t in toks)),
            ("tokenizer.ggml.token_type", 9, struct.pack("<IQ", 5, len(ttypes)) + b"".join(struct.pack("<i", t) for t in ttypes)),
            ("tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, len(toks)) + b"".join(struct.pack("<f", -i) for i in range(len(toks)))),
            ("tokenizer.ggml.merges", 9, struct.pack("<IQ", 8, len(merges)) + b"".join(gstr(m) for m in merges)),
            ("tokenizer.ggml.bos_token_id", 4, struct.pack("<I", 2)), ("tokenizer.ggml.eos_token_id", 4, struct.pack("<I", 1)),
            ("tokenizer.ggml.unknown_token_id", 4, struct.pack("<I", 3))]
    c.add("gguf", gguf_bytes(vkvs, []))
    # a projector file of the unified model's embedders (gemma4uv + gemma4ua) for a 4-wide text model: 2-px blocks
    def u32(k, v):
        return (k, 4, struct.pack("<I", v))

    def text(k, v):
        return (k, 8, struct.pack("<Q", len(v)) + v.encode())

    def f32s(*ne):
        n = 1
        for d in ne:
            n *= d
        return struct.pack("<%df" % n, *[rnd.uniform(-1, 1) for _ in range(n)])

    pkvs = [text("general.architecture", "clip"), text("clip.vision.projector_type", "gemma4uv"),
            text("clip.audio.projector_type", "gemma4ua"), u32("clip.vision.embedding_length", 2),
            u32("clip.vision.patch_size", 2), u32("clip.vision.projector.scale_factor", 1),
            u32("clip.vision.projection_dim", 4), u32("clip.audio.embedding_length", 8),
            u32("clip.audio.projection_dim", 4), ("clip.vision.attention.layer_norm_epsilon", 6, struct.pack("<f", 1e-6))]
    ptensors = [("v.patch_norm.1.weight", 0, [12], f32s(12)), ("v.patch_norm.1.bias", 0, [12], f32s(12)),
                ("v.patch_embd.weight", 0, [12, 2], f32s(12, 2)), ("v.patch_embd.bias", 0, [2], f32s(2)),
                ("v.position_embd.weight", 0, [2, 3, 2], f32s(2, 3, 2)), ("v.patch_norm.3.weight", 0, [2], f32s(2)),
                ("mm.input_projection.weight", 0, [2, 4], f32s(2, 4)),
                ("mm.a.input_projection.weight", 0, [8, 4], f32s(8, 4))]
    c.add("gguf", gguf_bytes(pkvs, ptensors))
    # a model file carrying a one-block vision tower as Ollama writes it (keys gemma4.vision.*)
    okvs = [text("general.architecture", "gemma4"), u32("gemma4.vision.block_count", 1),
            u32("gemma4.vision.embedding_length", 2), u32("gemma4.vision.feed_forward_length", 4),
            u32("gemma4.vision.attention.head_count", 1), u32("gemma4.vision.patch_size", 2),
            u32("gemma4.vision.projector.scale_factor", 1),
            ("gemma4.vision.attention.layer_norm_epsilon", 6, struct.pack("<f", 1e-6))]
    otensors = [("v.patch_embd.weight", 0, [2, 2, 3, 2], f32s(2, 2, 3, 2)), ("v.position_embd.weight", 0, [2, 3, 2], f32s(2, 3, 2)),
                ("v.blk.0.attn_q.weight", 0, [2, 2], f32s(2, 2)), ("mm.input_projection.weight", 0, [2, 4], f32s(2, 4)),
                ("token_embd.weight", 0, [4, 8], f32s(4, 8))]
    c.add("gguf", gguf_bytes(okvs, otensors))
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    good = {"model.a": shards[0], "model.b": shards[0], "model.c": shards[1]}
    for wm in [good, {**good, "model.d": shards[1]}, {"model.a": shards[0], "model.b": shards[1], "model.c": shards[1]},
               {"model.a": shards[0], "model.b": shards[0]}, {**good, "model.c": "../" + shards[1]}, {}]:
        c.add("safetensors_index", json.dumps({"metadata": {"total_size": 22}, "weight_map": wm}))

    # media: tiny images in every format the decoder reads, short WAVs (and the fixtures' cut down)
    try:
        from PIL import Image
        im = Image.new("RGB", (7, 5))
        im.putdata([(i * 9 % 256, i * 5 % 256, i * 3 % 256) for i in range(35)])
        for fmt, kw in [("PNG", {}), ("JPEG", {"quality": 50}), ("WEBP", {}), ("GIF", {})]:
            buf = io.BytesIO()
            im.save(buf, fmt, **kw)
            c.add("image", buf.getvalue())
    except ImportError:
        pass
    for p in sorted(glob.glob(os.path.join(shared, "fixtures", "*", "*.png"))):
        c.add("image", open(p, "rb").read()[:2048])
    for rate, channels, width in [(16000, 1, 2), (8000, 2, 2), (44100, 1, 1)]:
        buf = io.BytesIO()
        with wave.open(buf, "wb") as w:
            w.setnchannels(channels)
            w.setsampwidth(width)
            w.setframerate(rate)
            w.writeframes(bytes((i * 7) % 256 for i in range(400 * channels * width)))
        c.add("audio", buf.getvalue())
    for p in sorted(glob.glob(os.path.join(shared, "fixtures", "*", "*.wav"))):
        c.add("audio", open(p, "rb").read()[:4096])

    # configs
    for p in sorted(glob.glob(os.path.join(shared, "configs", "*.json"))) + [os.path.join(m, "config.json") for m in models]:
        if os.path.exists(p):
            c.add("config", open(p, "rb").read())
    # model: a selector byte (tests/fuzz/fuzz_model.c's fixture order), then that fixture's config.json
    for k, name in enumerate(["dense-ple", "dense-keqv", "moe"]):
        p = os.path.join(shared, "fixtures", name, "config.json")
        if os.path.exists(p):
            c.add("model", bytes([k]) + open(p, "rb").read())
    # drafter: a selector byte (tests/fuzz/fuzz_drafter.c's order), then that drafter's config.json
    for k, name in enumerate(["assistant-lmhead", "assistant-ordered"]):
        p = os.path.join(shared, "fixtures", "assistant", name, "config.json")
        if os.path.exists(p):
            c.add("drafter", bytes([k]) + open(p, "rb").read())
    for m in models:
        p = os.path.join(m, "generation_config.json")
        if os.path.exists(p):
            c.add("generation_config", open(p, "rb").read())
    c.add("generation_config", '{"do_sample": true, "temperature": 0.7, "top_k": 64, "top_p": 0.95, '
                               '"suppress_tokens": [0, 3], "eos_token_id": [1, 106], "max_new_tokens": 12}')

    # tokenizers
    cases = json.load(open(os.path.join(ROOT, "tests", "data", "tokenizer_cases.json"), encoding="utf-8"))["cases"]
    tokenizers = [json.dumps(k["tokenizer"], ensure_ascii=False) for k in cases]
    real = os.path.join(shared, "tokenizer", "tokenizer.json")
    if os.path.exists(real):
        tokenizers.append(reduced_tokenizer(real))
    for t in tokenizers:
        c.add("tokenizer_json", t)
    for p in [os.path.join(shared, "tokenizer", "tokenizer_config.json"), os.path.join(model, "tokenizer_config.json")]:
        if os.path.exists(p):
            c.add("tokenizer_config", open(p, "rb").read())
    c.add("tokenizer_config", '{"add_bos_token": true, "bos_token": "<s>", "eos_token": {"content": "<eos>"}, '
                              '"chat_template": "{% for m in messages %}{{ bos_token }}{{ m.content }}{% endfor %}"}')
    c.add("tokenizer_config", '{"chat_template": [{"name": "default", "template": "{{ messages|tojson }}"}, '
                              '{"name": "tool_use", "template": "x"}]}')
    if args.gemma4c:
        env = dict(os.environ, G4_TOKENIZER_CACHE_DIR=os.path.join(tmp, "caches"))
        env.pop("G4_NO_TOKENIZER_CACHE", None)
        for i, t in enumerate(tokenizers):
            d = os.path.join(tmp, "tok%d" % i)
            os.makedirs(d)
            with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
                f.write(t)
            subprocess.run([args.gemma4c, "tokenize", "--tokenizer", os.path.join(d, "tokenizer.json"), "-p", "x"],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for p in sorted(glob.glob(os.path.join(tmp, "caches", "*.g4c"))):
            c.add("tokenizer_cache", open(p, "rb").read())

    # texts and ids to tokenize (byte 0: which tokenizer, byte 1: options)
    texts = []
    fx = os.path.join(shared, "tokenizer", "fixtures", "public")
    for line in open(os.path.join(fx, "encode.jsonl"), encoding="utf-8") if os.path.isdir(fx) else []:
        texts.append(json.loads(line)["text"].encode("utf-8"))
    for line in open(os.path.join(fx, "decode.jsonl"), encoding="utf-8") if os.path.isdir(fx) else []:
        texts.append(struct.pack("<%di" % len(json.loads(line)["ids"]), *json.loads(line)["ids"]))
    wp = os.path.join(shared, "corpus", "war-and-peace.txt")
    if os.path.exists(wp):
        book = open(wp, "rb").read()
        for start in range(0, len(book), len(book) // 8):
            texts.append(book[start:start + 2000])
    for i, t in enumerate(texts):
        c.add("tokenize", bytes([i % 17, i % 8]) + t)

    # templates, chat requests, model output
    templates = sorted(glob.glob(os.path.join(shared, "chat_templates", "*.jinja")))
    for p in templates + [os.path.join(model, "chat_template.jinja")]:
        if os.path.exists(p):
            c.add("jinja", open(p, "rb").read())
    for line in open(os.path.join(ROOT, "tests", "data", "jinja_cases.jsonl"), encoding="utf-8"):
        c.add("jinja", json.loads(line)["template"])
    names = ["gemma-4-31b-it", "gemma-4-31b-it.release", "gemma-4-e2b-it.release"]
    outputs = []
    for line in open(os.path.join(fx, "chat.jsonl"), encoding="utf-8") if os.path.isdir(fx) else []:
        case = json.loads(line)
        outputs.append(case["text"])
        which = names.index(case["template"]) if case["template"] in names else 0
        req = {k: case[k] for k in ("messages", "tools", "enable_thinking", "add_generation_prompt") if k in case}
        c.add("chat_request", bytes([which]) + json.dumps(req, ensure_ascii=False).encode("utf-8"))
        # the same conversation as a client's /v1/chat/completions body (byte 0: endpoint 0, bit 2: tool role)
        body = {"model": "m", "messages": case["messages"], "max_tokens": 8}
        if "tools" in case:
            body["tools"] = case["tools"]
        c.add("server_request", bytes([4]) + json.dumps(body, ensure_ascii=False).encode("utf-8"))
    outputs += [
        "<|channel>thought\nLet me think.<channel|>The answer is 4.<turn|>",
        "<|tool_call>call:get_weather{location:<|\"|>Paris<|\"|>,days:3,units:[<|\"|>c<|\"|>],x:{y:true,z:None}}<tool_call|>",
        "<|tool_call>call:f{\"a\": 1}<tool_call|><|tool_call>call:g{bad<tool_call|>text<eos>",
        "<|turn>model\n<|channel>unterminated thought",
        "{a:[1,-2.5e3,+7,[[[]]]],b:<|\"|>\xc3\xa9<|\"|>}",
    ]
    for o in outputs:
        c.add("chat_output", o)
    for kind, body in [
        (0, {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2, "stop": ["x", "y"], "seed": 3,
             "temperature": 0.5, "top_p": 0.9, "logit_bias": {"5": -100}, "logprobs": True, "top_logprobs": 2,
             "stream": True, "stream_options": {"include_usage": True}, "response_format": {"type": "json_object"}}),
        (0, {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
             {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]}),
        (1, {"model": "m", "prompt": "Once", "max_tokens": 4, "echo": True, "stop": "\n"}),
        (1, {"model": "m", "prompt": [[2, 17, 99], [5]], "max_tokens": 2}),
        (2, {"model": "m", "input": ["a", "b"], "encoding_format": "base64"}),
        (2, {"model": "m", "input": [[2, 3, 4]]}),
    ]:
        c.add("server_request", bytes([kind]) + json.dumps(body).encode("utf-8"))

    # grammars: a JSON Schema or tools, a NUL, then output to read (byte 0x01: the next special token)
    schemas = [
        {"type": "object", "properties": {"a": {"type": "integer", "minimum": -5, "maximum": 300},
                                          "b": {"type": "string", "pattern": "^[a-z]{2,3}(-\\d)?$"}},
         "required": ["a"]},
        {"anyOf": [{"$ref": "#/$defs/n"}, {"type": "array", "items": {"enum": ["x", 1, None]}, "maxItems": 3}],
         "$defs": {"n": {"type": "object", "additionalProperties": {"$ref": "#/$defs/n"}}}},
        {"type": "string", "format": "date-time"},
        {"type": "object", "properties": {"p": {"type": "number", "multipleOf": 0.07, "minimum": 0},
                                          "h": {"type": "string", "format": "ipv6"}}},
    ]
    docs = [b'{"a": 12, "b": "ab-1"}', b'{"k": {"j": {}}}', b'["x", null]', b'"2026-12-06T01:02:03Z"',
            b'{"p": 1812.09, "h": "fe80::1:2"}']
    for i, sch in enumerate(schemas):
        c.add("grammar", bytes([0]) + json.dumps(sch).encode("utf-8") + b"\0" + docs[i])
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "n": {"type": "integer"}}, "required": ["city"]}}}]
    c.add("grammar", bytes([3]) + json.dumps(tools).encode("utf-8") + b"\0\x01call:f{city:\x01Paris\x01,n:3}\x01")
    c.add("grammar", bytes([16]) + b'{"type":"object"}\0\x01\x01\x01\x01thought\x01{}')
    c.add("grammar", bytes([2]) + b'root ::= greeting " " [A-Z] [a-z]{1,8} ("!" | <|tool_call>)?\n'
          b'greeting ::= "Hi" | "Hello"  # comment\n\0Hello Pierre!')
    c.add("grammar", bytes([3]) + "^(?:[α-ω]+|\\d{2,4})\\s?[^a-z]*$".encode("utf-8") + b"\0" + "αβ 12".encode("utf-8"))

    for h in sorted(c.count):
        print("%-18s %4d seeds" % (h, c.count[h]))
    if not args.gemma4c:
        print("(no --gemma4c: no tokenizer_cache seeds)", file=sys.stderr)


if __name__ == "__main__":
    main()
