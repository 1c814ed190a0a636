#!/usr/bin/python3
"""Writes a model folder with the audio tower of a real config (random bf16 weights) for
bench/audio_tower_speed.sh: the audio_config and the text width of CONFIG (e.g.
../shared/configs/gemma-4-e4b.json), with a one-layer text decoder of that width and a
512-token vocabulary so that the folder loads quickly. Needs numpy.

usage: make_audio_tower_model.py CONFIG OUT_DIR"""
import json
import os
import struct
import sys

import numpy as np


def bf16(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)).tobytes()


def main():
    cfg_path, out = sys.argv[1:3]
    cfg = json.load(open(cfg_path))
    a = cfg["audio_config"]
    H = cfg["text_config"]["hidden_size"]
    cfg["vision_config"] = None
    cfg["text_config"] = {"hidden_size": H, "num_hidden_layers": 1, "layer_types": ["full_attention"],
                          "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 64, "global_head_dim": 64,
                          "intermediate_size": 64, "vocab_size": 512, "hidden_size_per_layer_input": 0,
                          "num_kv_shared_layers": 0, "rope_parameters": {"full_attention": {"rope_type": "default",
                          "rope_theta": 10000.0}, "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
                          "model_type": "gemma4_text"}
    for k in ("boi_token_id", "eoi_token_id", "image_token_id", "audio_token_id", "boa_token_id", "eoa_token_id",
              "eoa_token_index", "video_token_id"):
        cfg.pop(k, None)
    rng = np.random.default_rng(0)
    t = {}

    def mat(name, *shape):
        t[name] = rng.standard_normal(shape, dtype=np.float32) * (1.0 / np.sqrt(shape[-1]))

    def norm(name, n):
        t[name] = 1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)

    L = "model.language_model."
    mat(L + "embed_tokens.weight", 512, H)
    norm(L + "norm.weight", H)
    for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"):
        norm(L + "layers.0.%s.weight" % n, H)
    t[L + "layers.0.layer_scalar"] = np.ones(1, np.float32)
    for n in ("q", "k", "v"):
        mat(L + "layers.0.self_attn.%s_proj.weight" % n, 64, H)
    norm(L + "layers.0.self_attn.q_norm.weight", 64)
    norm(L + "layers.0.self_attn.k_norm.weight", 64)
    mat(L + "layers.0.self_attn.o_proj.weight", H, 64)
    mat(L + "layers.0.mlp.gate_proj.weight", 64, H)
    mat(L + "layers.0.mlp.up_proj.weight", 64, H)
    mat(L + "layers.0.mlp.down_proj.weight", H, 64)

    D, C1, C2, K, P = a["hidden_size"], a["subsampling_conv_channels"][0], a["subsampling_conv_channels"][1], \
        a["conv_kernel_size"], a["output_proj_dims"]
    dh = D // a["num_attention_heads"]
    S = "model.audio_tower.subsample_conv_projection."
    mat(S + "layer0.conv.weight", C1, 1, 3, 3)
    norm(S + "layer0.norm.weight", C1)
    mat(S + "layer1.conv.weight", C2, C1, 3, 3)
    norm(S + "layer1.norm.weight", C2)
    mat(S + "input_proj_linear.weight", D, 32 * C2)

    def clin(p, o, i):
        mat(p + ".linear.weight", o, i)
        for k, v in (("input_min", -8.0), ("input_max", 8.0), ("output_min", -16.0), ("output_max", 16.0)):
            t[p + "." + k] = np.array(v, np.float32)

    for l in range(a["num_hidden_layers"]):
        p = "model.audio_tower.layers.%d." % l
        for f in ("feed_forward1", "feed_forward2"):
            norm(p + f + ".pre_layer_norm.weight", D)
            norm(p + f + ".post_layer_norm.weight", D)
            clin(p + f + ".ffw_layer_1", 4 * D, D)
            clin(p + f + ".ffw_layer_2", D, 4 * D)
        for n in ("norm_pre_attn", "norm_post_attn", "norm_out"):
            norm(p + n + ".weight", D)
        for n in ("q_proj", "k_proj", "v_proj", "post"):
            clin(p + "self_attn." + n, D, D)
        mat(p + "self_attn.relative_k_proj.weight", D, D)
        t[p + "self_attn.per_dim_scale"] = 0.1 * rng.standard_normal(dh, dtype=np.float32)
        norm(p + "lconv1d.pre_layer_norm.weight", D)
        norm(p + "lconv1d.conv_norm.weight", D)
        mat(p + "lconv1d.depthwise_conv1d.weight", D, 1, K)
        clin(p + "lconv1d.linear_start", 2 * D, D)
        clin(p + "lconv1d.linear_end", D, D)
    mat("model.audio_tower.output_proj.weight", P, D)
    t["model.audio_tower.output_proj.bias"] = 0.1 * rng.standard_normal(P, dtype=np.float32)
    mat("model.embed_audio.embedding_projection.weight", H, P)

    os.makedirs(out, exist_ok=True)
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)
    hdr, blobs, at = {}, [], 0
    for k in sorted(t):
        b = bf16(t[k])
        hdr[k] = {"dtype": "BF16", "shape": list(t[k].shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    text = json.dumps(hdr).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for b in blobs:
            f.write(b)


if __name__ == "__main__":
    main()
