#!/usr/bin/python3
"""A random-weight Gemma 4 main model and a gemma4_assistant drafter of real shapes, for speed measurements.

Usage: make_random_assistant_pair.py CONFIG.json OUT_DIR [--drafter-hidden 256] [--drafter-heads 4]
                                     [--drafter-intermediate 2048] [--dense-head]

CONFIG.json is one of ../shared/configs (its text_config is used; towers are left out). Writes
OUT_DIR/main (gemma4_text, bf16 safetensors) and OUT_DIR/drafter (gemma4_assistant: four layers, three sliding and
one full, as third-party notes describe the published drafters; the centroid masked embedder with 2048 centroids
and top 32 unless --dense-head). The drafter's width, heads and MLP size are not public: the defaults are guesses.
Weights are random normals (the per-layer embedding table repeats one random block): the timings are real, the
text and the acceptance rate are not. Needs numpy; the files are large (E2B: about 9 GB).
"""
import argparse
import json
import os
import struct

import numpy as np

CHUNK = 1 << 24


def bf16_bytes(x):
    """float32 array -> bf16 bytes (round to nearest even)."""
    u = x.astype(np.float32).view(np.uint32)
    u = u + 0x7FFF + ((u >> 16) & 1)
    return (u >> 16).astype(np.uint16).tobytes()


def write_safetensors(path, tensors, rng):
    """tensors: list of (name, shape, kind) with kind 'normal:STD', 'ones', 'tiled:STD' or an int64 array."""
    header, off = {}, 0
    for name, shape, kind in tensors:
        n = int(np.prod(shape))
        size = n * (8 if isinstance(kind, np.ndarray) else 2)
        header[name] = {"dtype": "I64" if isinstance(kind, np.ndarray) else "BF16", "shape": list(shape),
                        "data_offsets": [off, off + size]}
        off += size
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for name, shape, kind in tensors:
            n = int(np.prod(shape))
            if isinstance(kind, np.ndarray):
                f.write(kind.astype(np.int64).tobytes())
                continue
            if kind == "ones":
                f.write(bf16_bytes(1.0 + 0.05 * rng.standard_normal(n, dtype=np.float32)))
                continue
            how, std = kind.split(":")
            block = None
            for i in range(0, n, CHUNK):
                m = min(CHUNK, n - i)
                if how == "tiled" and block is not None and m == len(block) // 2:
                    f.write(block)
                    continue
                data = bf16_bytes(float(std) * rng.standard_normal(m, dtype=np.float32))
                if how == "tiled" and m == CHUNK:
                    block = data
                f.write(data)


def layer_dims(tc):
    L = tc["num_hidden_layers"]
    types = tc["layer_types"]
    D = [tc["global_head_dim"] if t == "full_attention" else tc["head_dim"] for t in types]
    kvg = tc.get("num_global_key_value_heads") if tc.get("attention_k_eq_v") else None
    KV = [(kvg or tc["num_key_value_heads"]) if t == "full_attention" else tc["num_key_value_heads"] for t in types]
    first_shared = L - (tc.get("num_kv_shared_layers") or 0)
    return L, types, D, KV, first_shared


def main_tensors(tc):
    H, V, NH, P = tc["hidden_size"], tc["vocab_size"], tc["num_attention_heads"], tc["hidden_size_per_layer_input"]
    L, types, D, KV, first = layer_dims(tc)
    s = 0.02
    t = [("model.embed_tokens.weight", (V, H), f"normal:{s}"), ("model.norm.weight", (H,), "ones")]
    if P:
        t += [("model.embed_tokens_per_layer.weight", (tc["vocab_size_per_layer_input"], L * P), f"tiled:{s}"),
              ("model.per_layer_model_projection.weight", (L * P, H), f"normal:{s}"),
              ("model.per_layer_projection_norm.weight", (P,), "ones")]
    for l in range(L):
        p = f"model.layers.{l}."
        I = tc["intermediate_size"] * (2 if tc.get("use_double_wide_mlp") and first < L and l >= first else 1)
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            t.append((p + n + ".weight", (H,), "ones"))
        t += [(p + "layer_scalar", (1,), "ones"), (p + "self_attn.q_proj.weight", (NH * D[l], H), f"normal:{s}"),
              (p + "self_attn.q_norm.weight", (D[l],), "ones"), (p + "self_attn.o_proj.weight", (H, NH * D[l]), f"normal:{s}")]
        if l < first:
            t += [(p + "self_attn.k_proj.weight", (KV[l] * D[l], H), f"normal:{s}"),
                  (p + "self_attn.k_norm.weight", (D[l],), "ones")]
            if not (tc.get("attention_k_eq_v") and types[l] == "full_attention"):
                t.append((p + "self_attn.v_proj.weight", (KV[l] * D[l], H), f"normal:{s}"))
        t += [(p + "mlp.gate_proj.weight", (I, H), f"normal:{s}"), (p + "mlp.up_proj.weight", (I, H), f"normal:{s}"),
              (p + "mlp.down_proj.weight", (H, I), f"normal:{s}")]
        if P:
            t += [(p + "per_layer_input_gate.weight", (P, H), f"normal:{s}"),
                  (p + "per_layer_projection.weight", (H, P), f"normal:{s}"),
                  (p + "post_per_layer_input_norm.weight", (H,), "ones")]
    return t


def drafter(tc, a, rng):
    """The drafter's config and tensors; its layer types read the main model's head sizes and kv heads."""
    _, types, D, KV, first = layer_dims(tc)
    src = {t: max(l for l in range(first) if types[l] == t) for t in set(types[:first])}
    dtypes = ["sliding_attention"] * 3 + ["full_attention"]
    Ha, NH, Ia, V, Hb = a.drafter_hidden, a.drafter_heads, a.drafter_intermediate, tc["vocab_size"], tc["hidden_size"]
    text = {k: tc[k] for k in ("vocab_size", "rms_norm_eps", "sliding_window", "rope_parameters",
                               "hidden_activation", "final_logit_softcapping", "max_position_embeddings")}
    text.update(model_type="gemma4_text", hidden_size=Ha, num_hidden_layers=4, num_attention_heads=NH,
                intermediate_size=Ia, layer_types=dtypes, head_dim=D[src["sliding_attention"]],
                global_head_dim=D[src["full_attention"]], num_key_value_heads=KV[src["sliding_attention"]],
                num_kv_shared_layers=4, hidden_size_per_layer_input=0, vocab_size_per_layer_input=0,
                enable_moe_block=False, use_double_wide_mlp=False, attention_k_eq_v=False)
    if KV[src["full_attention"]] != KV[src["sliding_attention"]]:
        text["per_layer_config"] = {"3": {"head_dim": D[src["full_attention"]],
                                          "num_key_value_heads": KV[src["full_attention"]]},
                                    **{str(l): {"head_dim": D[src["sliding_attention"]]} for l in range(3)}}
    cfg = {"architectures": ["Gemma4AssistantForCausalLM"], "model_type": "gemma4_assistant",
           "backbone_hidden_size": Hb, "use_ordered_embeddings": not a.dense_head, "num_centroids": 2048,
           "centroid_intermediate_top_k": 32, "tie_word_embeddings": True, "text_config": text}
    s = 0.02
    t = [("model.embed_tokens.weight", (V, Ha), f"normal:{s}"), ("model.norm.weight", (Ha,), "ones"),
         ("pre_projection.weight", (Ha, 2 * Hb), f"normal:{s}"), ("post_projection.weight", (Hb, Ha), f"normal:{s}")]
    if not a.dense_head:
        t += [("masked_embedding.centroids.weight", (2048, Ha), f"normal:{s}"),
              ("masked_embedding.token_ordering", (V,), rng.permutation(V))]
    for l, ty in enumerate(dtypes):
        p = f"model.layers.{l}."
        d = D[src[ty]]
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            t.append((p + n + ".weight", (Ha,), "ones"))
        t += [(p + "layer_scalar", (1,), "ones"), (p + "self_attn.q_proj.weight", (NH * d, Ha), f"normal:{s}"),
              (p + "self_attn.q_norm.weight", (d,), "ones"), (p + "self_attn.o_proj.weight", (Ha, NH * d), f"normal:{s}"),
              (p + "mlp.gate_proj.weight", (Ia, Ha), f"normal:{s}"), (p + "mlp.up_proj.weight", (Ia, Ha), f"normal:{s}"),
              (p + "mlp.down_proj.weight", (Ha, Ia), f"normal:{s}")]
    return cfg, t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("out")
    ap.add_argument("--drafter-hidden", type=int, default=256)
    ap.add_argument("--drafter-heads", type=int, default=4)
    ap.add_argument("--drafter-intermediate", type=int, default=2048)
    ap.add_argument("--dense-head", action="store_true")
    a = ap.parse_args()
    full = json.load(open(a.config))
    tc = dict(full.get("text_config", full))
    tc["model_type"] = "gemma4_text"
    tc.setdefault("eos_token_id", full.get("eos_token_id", 1))
    rng = np.random.default_rng(0)
    for sub in ("main", "drafter"):
        os.makedirs(os.path.join(a.out, sub), exist_ok=True)
    json.dump(tc, open(os.path.join(a.out, "main", "config.json"), "w"), indent=1)
    write_safetensors(os.path.join(a.out, "main", "model.safetensors"), main_tensors(tc), rng)
    cfg, t = drafter(tc, a, rng)
    json.dump(cfg, open(os.path.join(a.out, "drafter", "config.json"), "w"), indent=1)
    json.dump({"num_assistant_tokens": 20}, open(os.path.join(a.out, "drafter", "generation_config.json"), "w"))
    write_safetensors(os.path.join(a.out, "drafter", "model.safetensors"), t, rng)


if __name__ == "__main__":
    main()
