#!/usr/bin/env python3
"""Makes a model folder for the audio CLI tests (standard library only): the example model
tolstoy-tiny (full vocabulary, tokenizer, chat template; text width 128) with the audio tower
and embed_audio of ../shared/fixtures/audio (also projecting to 128) grafted on:
config.json gains the fixture's audio_config, the tower's tensors go to a second shard (the text weights are the
first, under a shard's name: beside a model.safetensors transformers, and gemma4c, read that file alone).

usage: graft_audio_tower.py TOLSTOY_DIR AUDIO_FIXTURE_DIR OUT_DIR"""
import json
import os
import struct
import sys


def header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)), 8 + n


def main():
    src, fixture, out = sys.argv[1:4]
    os.makedirs(out, exist_ok=True)
    shard1, shard2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    for name, as_name in (("tokenizer.json",) * 2, ("tokenizer_config.json",) * 2, ("chat_template.jinja",) * 2,
                          ("generation_config.json",) * 2, ("model.safetensors", shard1)):
        link = os.path.join(out, as_name)
        if not os.path.lexists(link):
            os.symlink(os.path.abspath(os.path.join(src, name)), link)
    config = json.load(open(os.path.join(src, "config.json")))
    config["audio_config"] = json.load(open(os.path.join(fixture, "config.json")))["audio_config"]
    json.dump(config, open(os.path.join(out, "config.json"), "w"), indent=1)
    # the tower's tensors, copied into the second shard
    hdr, base = header(os.path.join(fixture, "model.safetensors"))
    keep = sorted(k for k in hdr if k.startswith(("model.audio_tower.", "model.embed_audio.")))
    data = open(os.path.join(fixture, "model.safetensors"), "rb").read()
    new, blobs, at = {}, [], 0
    for k in keep:
        a, b = hdr[k]["data_offsets"]
        new[k] = {"dtype": hdr[k]["dtype"], "shape": hdr[k]["shape"], "data_offsets": [at, at + b - a]}
        blobs.append(data[base + a: base + b])
        at += b - a
    text = json.dumps(new).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(out, shard2), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    weight_map = {k: shard1 for k in header(os.path.join(src, "model.safetensors"))[0] if k != "__metadata__"}
    weight_map.update({k: shard2 for k in keep})
    json.dump({"metadata": {}, "weight_map": weight_map}, open(os.path.join(out, "model.safetensors.index.json"), "w"))


if __name__ == "__main__":
    main()
