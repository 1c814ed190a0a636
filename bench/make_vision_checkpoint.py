#!/usr/bin/env python3
"""A random-weight checkpoint with a real vision tower, for speed measurements of the tower alone.

usage: make_vision_checkpoint.py CONFIG.json OUT_DIR
OUT_DIR gets config.json (the config's vision_config as it is, a one-layer text decoder of the config's
text width so that embed_vision has its real shape) and model.safetensors (bf16, random)."""
import json
import os
import sys

import numpy as np

cfg = json.load(open(sys.argv[1]))
out = sys.argv[2]
os.makedirs(out, exist_ok=True)
v = cfg["vision_config"]
T = cfg["text_config"]["hidden_size"]
text = {"hidden_size": T, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 64, "global_head_dim": 64, "vocab_size": 512,
        "vocab_size_per_layer_input": 512, "hidden_size_per_layer_input": 0, "layer_types": ["full_attention"],
        "sliding_window": 512, "max_position_embeddings": 4096, "tie_word_embeddings": True,
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}
small = {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"], "text_config": text,
         "vision_config": v, "audio_config": None, "tie_word_embeddings": True}
for k in ("image_token_id", "boi_token_id", "eoi_token_id", "video_token_id", "audio_token_id"):
    small[k] = 500 - ("image_token_id", "boi_token_id", "eoi_token_id", "video_token_id", "audio_token_id").index(k)
json.dump(small, open(os.path.join(out, "config.json"), "w"), indent=1)

rng = np.random.default_rng(0)
D, I, H, KV, dh = v["hidden_size"], v["intermediate_size"], v["num_attention_heads"], v["num_key_value_heads"], v["head_dim"]
P, L = v.get("patch_size", 16), v["num_hidden_layers"]
shapes = {"model.vision_tower.patch_embedder.input_proj.weight": [D, 3 * P * P],
          "model.vision_tower.patch_embedder.position_embedding_table": [2, v.get("position_embedding_size", 10240), D],
          "model.embed_vision.embedding_projection.weight": [T, D]}
for l in range(L):
    p = "model.vision_tower.encoder.layers.%d." % l
    for n, s in (("self_attn.q_proj", [H * dh, D]), ("self_attn.k_proj", [KV * dh, D]), ("self_attn.v_proj", [KV * dh, D]),
                 ("self_attn.o_proj", [D, H * dh]), ("mlp.gate_proj", [I, D]), ("mlp.up_proj", [I, D]),
                 ("mlp.down_proj", [D, I])):
        shapes[p + n + ".linear.weight"] = s
        if v.get("use_clipped_linears"):
            for b in ("input_min", "input_max", "output_min", "output_max"):
                shapes[p + n + "." + b] = []
    for n, d in (("self_attn.q_norm", dh), ("self_attn.k_norm", dh), ("input_layernorm", D),
                 ("post_attention_layernorm", D), ("pre_feedforward_layernorm", D), ("post_feedforward_layernorm", D)):
        shapes[p + n + ".weight"] = [d]
if v.get("standardize"):
    shapes["model.vision_tower.std_bias"] = [D]
    shapes["model.vision_tower.std_scale"] = [D]
tp = "model.language_model."
shapes.update({tp + "embed_tokens.weight": [512, T], tp + "norm.weight": [T],
               tp + "layers.0.input_layernorm.weight": [T], tp + "layers.0.post_attention_layernorm.weight": [T],
               tp + "layers.0.pre_feedforward_layernorm.weight": [T], tp + "layers.0.post_feedforward_layernorm.weight": [T],
               tp + "layers.0.layer_scalar": [1], tp + "layers.0.self_attn.q_proj.weight": [128, T],
               tp + "layers.0.self_attn.k_proj.weight": [64, T], tp + "layers.0.self_attn.v_proj.weight": [64, T],
               tp + "layers.0.self_attn.o_proj.weight": [T, 128], tp + "layers.0.self_attn.q_norm.weight": [64],
               tp + "layers.0.self_attn.k_norm.weight": [64], tp + "layers.0.mlp.gate_proj.weight": [64, T],
               tp + "layers.0.mlp.up_proj.weight": [64, T], tp + "layers.0.mlp.down_proj.weight": [T, 64]})


def value(name, shape):
    n = int(np.prod(shape)) if shape else 1
    if name.endswith(("norm.weight", "std_scale", "layer_scalar")):
        x = 1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)
    elif name.endswith("input_min") or name.endswith("output_min"):
        x = np.full(n, -8.0, np.float32)
    elif name.endswith("input_max") or name.endswith("output_max"):
        x = np.full(n, 8.0, np.float32)
    else:
        fan_in = shape[-1] if len(shape) >= 2 else 1
        x = rng.standard_normal(n, dtype=np.float32) / np.float32(np.sqrt(fan_in))
    return (x.view(np.uint32) >> 16).astype(np.uint16).tobytes()


header, off = {}, 0
for name in sorted(shapes):
    nbytes = 2 * (int(np.prod(shapes[name])) if shapes[name] else 1)
    header[name] = {"dtype": "BF16", "shape": shapes[name], "data_offsets": [off, off + nbytes]}
    off += nbytes
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(np.uint64(len(h)).tobytes() + h)
    for name in sorted(shapes):
        f.write(value(name, shapes[name]))
