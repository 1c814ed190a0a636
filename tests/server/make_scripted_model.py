#!/usr/bin/env python3
"""Writes a "scripted" Gemma 4 checkpoint: greedy decoding after a chat prompt always writes the same reply,
thinking first, then an answer, then a tool call, then <turn|> - the output the server's tests need to see
reasoning_content, content and tool_calls come out right (also while streaming), which a model trained on
War and Peace never writes.

    make_scripted_model.py SOURCE_DIR OUT_DIR [CHAT_TEMPLATE]

SOURCE_DIR is tolstoy-tiny (its config, tokenizer and generation config are kept; CHAT_TEMPLATE replaces its
template). The weights make the next token a function of the current one (a bigram table): attention and
per-layer inputs are zero, layer 0's MLP maps the one-hot embedding of each script token to the next one's,
and the tied head turns that into the largest logit. Token ids come from tokenizer.json by their pieces.
OUT_DIR/script.json records the reply's pieces and what they mean (thinking, answer, tool call).
"""
import json
import os
import shutil
import struct
import sys

import numpy as np

# The reply, one vocabulary piece per token; every piece is distinct (the table maps a token to one next).
THINKING = ["Weather", " needed", "."]
ANSWER = ["Checking", " now"]
CALL = ["call", ":", "get", "_", "weather", "{", "days", ":[", "3", "]", "}"]
SCRIPT = (["<|channel>", "thought", "\n\n"] + THINKING + ["<channel|>"] + ANSWER + ["<|tool_call>"] + CALL +
          ["<tool_call|>", "<turn|>"])
START = "\n"  # the last token of a chat prompt ("<|turn>model\n")


def vocab_ids(tokenizer_json):
    t = json.load(open(tokenizer_json, encoding="utf-8"))
    vocab = t["model"]["vocab"]
    if isinstance(vocab, list):
        vocab = {p[0]: i for i, p in enumerate(vocab)}
    ids = {a["content"]: a["id"] for a in t["added_tokens"]}
    out = []
    for piece in [START] + SCRIPT:
        i = ids.get(piece, vocab.get(piece.replace(" ", "\u2581")))
        if i is None:
            sys.exit("make_scripted_model: no token for %r" % piece)
        out.append(i)
    if len(set(out)) != len(out):
        sys.exit("make_scripted_model: the script's tokens are not distinct")
    return out


def bf16(a):
    """float32 -> bfloat16 bits (truncated: the values here are 0, 1 and 0.1)."""
    return (np.ascontiguousarray(a, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


def main():
    src, out = sys.argv[1], sys.argv[2]
    template = sys.argv[3] if len(sys.argv) > 3 else os.path.join(src, "chat_template.jinja")
    os.makedirs(out, exist_ok=True)
    for f in ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"]:
        shutil.copyfile(os.path.join(src, f), os.path.join(out, f))
    shutil.copyfile(template, os.path.join(out, "chat_template.jinja"))
    ids = vocab_ids(os.path.join(src, "tokenizer.json"))

    with open(os.path.join(src, "model.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    H = header["model.language_model.embed_tokens.weight"]["shape"][1]
    if len(ids) > H:
        sys.exit("make_scripted_model: the script needs %d dimensions, the model has %d" % (len(ids), H))
    a = 0.1  # embedding rows: one-hot, small, so the MLP's normalized output dominates the residual
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if name.endswith("embed_tokens.weight"):  # only the script's rows are not zero: written sparsely below
            tensors[name] = info["shape"]
            continue
        t = np.zeros(info["shape"], dtype=np.float32)
        if (name.endswith("norm.weight") and "self_attn" not in name) or name.endswith("layer_scalar"):
            t[:] = 1.0
        elif ".layers.0.mlp." in name:
            # gate and up pass dimension d through (gelu(x) ~ x for large x); down sends dimension d to d + 1
            # (dimension 0 is START, whose next token is the script's first)
            for d in range(len(ids) - ("down_proj" in name)):
                t[(d + 1, d) if "down_proj" in name else (d, d)] = 1.0
        tensors[name] = t

    meta, off = {}, 0
    for name in sorted(tensors):
        shape = tensors[name] if isinstance(tensors[name], list) else list(tensors[name].shape)
        size = 2 * int(np.prod(shape))
        meta[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + size]}
        off += size
    head = json.dumps(meta, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        base = f.tell()
        for name in sorted(tensors):
            if isinstance(tensors[name], list):  # the embedding: a row of `a` in dimension d for script token d
                f.truncate(base + meta[name]["data_offsets"][1])
                row = bf16(np.array([a], dtype=np.float32)).tobytes()
                for dim, tok in enumerate(ids):
                    f.seek(base + meta[name]["data_offsets"][0] + 2 * (tok * tensors[name][1] + dim))
                    f.write(row)
            else:
                f.seek(base + meta[name]["data_offsets"][0])
                f.write(bf16(tensors[name]).tobytes())
    json.dump({"pieces": SCRIPT, "ids": ids[1:], "thinking": "".join(THINKING), "answer": "".join(ANSWER),
               "tool_call": "".join(CALL)}, open(os.path.join(out, "script.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
