#!/usr/bin/env python3
"""Gives the example model (models/tolstoy-tiny) a small random vision tower, for the image commands'
end-to-end tests (standard library only).

usage: make_vision_model.py TOLSTOY_DIR OUT_DIR
OUT_DIR gets the example's tokenizer, template and generation config, its weights as shard 1 (a symlink),
the tower's random bf16 weights as shard 2, an index, and a config with a vision_config (clipped linears,
standardize) and use_bidirectional_attention "vision"."""
import json
import os
import random
import shutil
import struct
import sys

src, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
    shutil.copy(os.path.join(src, f), os.path.join(out, f))
cfg = json.load(open(os.path.join(src, "config.json")))
D, I, L, H, DH, P = 32, 64, 2, 2, 16, 16
cfg["vision_config"] = {
    "model_type": "gemma4_vision", "hidden_size": D, "intermediate_size": I, "num_hidden_layers": L,
    "num_attention_heads": H, "num_key_value_heads": H, "head_dim": DH, "patch_size": P, "pooling_kernel_size": 3,
    "position_embedding_size": 256, "rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "default", "rope_theta": 100.0},
    "hidden_activation": "gelu_pytorch_tanh", "use_clipped_linears": True, "standardize": True,
}
cfg["text_config"]["use_bidirectional_attention"] = "vision"
json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)
with open(os.path.join(out, "preprocessor_config.json"), "w") as f:
    json.dump({"image_processor_type": "Gemma4ImageProcessor", "max_soft_tokens": 70, "patch_size": P,
               "pooling_kernel_size": 3, "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255,
               "do_normalize": False, "resample": 3}, f)
T = cfg["text_config"]["hidden_size"]

rng = random.Random(7)
tensors = {}


def bf16(values):
    return b"".join(struct.pack("<f", v)[2:] for v in values)


def add(name, shape, scale, center=0.0):
    n = 1
    for s in shape:
        n *= s
    tensors[name] = (shape, bf16([center + rng.uniform(-scale, scale) for _ in range(n)]))


V = "model.vision_tower."
add(V + "patch_embedder.input_proj.weight", [D, 3 * P * P], 0.05)
add(V + "patch_embedder.position_embedding_table", [2, 256, D], 0.5)
for l in range(L):
    p = V + "encoder.layers.%d." % l
    for name, shape in (("self_attn.q_proj", [H * DH, D]), ("self_attn.k_proj", [H * DH, D]),
                        ("self_attn.v_proj", [H * DH, D]), ("self_attn.o_proj", [D, H * DH]),
                        ("mlp.gate_proj", [I, D]), ("mlp.up_proj", [I, D]), ("mlp.down_proj", [D, I])):
        add(p + name + ".linear.weight", shape, 0.3)
        add(p + name + ".input_min", [], 0.5, -4.0)
        add(p + name + ".input_max", [], 0.5, 4.0)
        add(p + name + ".output_min", [], 0.5, -6.0)
        add(p + name + ".output_max", [], 0.5, 6.0)
    for name, n in (("self_attn.q_norm", DH), ("self_attn.k_norm", DH), ("input_layernorm", D),
                    ("post_attention_layernorm", D), ("pre_feedforward_layernorm", D), ("post_feedforward_layernorm", D)):
        add(p + name + ".weight", [n], 0.3, 1.0)
add(V + "std_bias", [D], 0.5)
add(V + "std_scale", [D], 0.3, 1.0)
add("model.embed_vision.embedding_projection.weight", [T, D], 0.3)

header, offset, blobs = {}, 0, []
for name in sorted(tensors):
    shape, data = tensors[name]
    header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + len(data)]}
    offset += len(data)
    blobs.append(data)
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
with open(os.path.join(out, "model-00002-of-00002.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
shard1 = os.path.join(out, "model-00001-of-00002.safetensors")
if os.path.lexists(shard1):
    os.remove(shard1)
os.symlink(os.path.abspath(os.path.join(src, "model.safetensors")), shard1)


def names(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return [k for k in json.loads(f.read(n)) if k != "__metadata__"]


weight_map = {k: "model-00001-of-00002.safetensors" for k in names(shard1)}
weight_map.update({k: "model-00002-of-00002.safetensors" for k in tensors})
json.dump({"metadata": {}, "weight_map": weight_map}, open(os.path.join(out, "model.safetensors.index.json"), "w"))
