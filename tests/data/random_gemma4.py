#!/usr/bin/python3
"""Random-weight Gemma 4 checkpoints of given shapes, for tests and speed measurements at real sizes: the one
generator of random checkpoints in this project.

    random_gemma4.py model CONFIG.json OUT [--type bf16] [--seed 1]
    random_gemma4.py drafter MAIN_DIR OUT_DIR [--hidden 256] [--heads 4] [--intermediate 2048] [--dense-head]
    random_gemma4.py pair CONFIG.json OUT_DIR [the same drafter options]
    random_gemma4.py unified CONFIG.json OUT_DIR [--layers N] [--files-from MODEL_DIR]

model: the text decoder of CONFIG.json (any config.json, e.g. ../shared/configs/gemma-4-26b-a4b.json; towers are
left out), written by `gemma4c quantize --random` (the binder's tensor list, so every architecture it loads, the
MoE included) straight in the type asked: bf16 (default; OUT a safetensors folder, or a GGUF file when OUT ends in
.gguf), q8_0 q4_0 q4_k q5_k q6_k (OUT a .gguf file in llama.cpp's layout), mlx4 mlx8 (OUT an MLX folder). Writing
the quantized form directly avoids the bf16 file (51 GB for the 26B-A4B). Matrices are uniform in +-sqrt(3/in),
norms 1 +- 0.1 (src/model/quantize.c). gemma4c is $G4_BIN or build/gemma4c of this checkout.
drafter: a drafter that can draft for the model in MAIN_DIR (its config.json is read): four layers, three sliding
and one full, as third-party notes describe the published drafters, with the main model's head sizes, kv heads
and RoPE; the centroid masked embedder (2048 centroids, top 32; fewer for a small vocabulary) unless --dense-head.
The drafter's width, heads and MLP size are not public: the defaults are guesses. Its weights are random normals.
pair: OUT_DIR/main (as `model`, bf16) and OUT_DIR/drafter. The timings are real, the text and the acceptance rate
are not. E2B's pair is about 9 GB.
unified: CONFIG.json is a gemma4_unified config (../shared/configs/gemma-4-12b.json): OUT_DIR holds that model
(decoder under model.language_model., the image and audio embedders under the checkpoint file's names,
docs/gemma4-unified.md 9) with bf16 weights whose large matrices repeat one random block (writing is disk-bound:
the 12B is about 24 GB); --layers N keeps the first N layers (the last one made full attention) for a smaller
file of the same widths (2 layers: about 3 GB); --files-from takes the tokenizer, chat template and generation
config of another Gemma 4 folder, and its vocabulary size and multimodal token ids; processor_config.json beside
CONFIG.json is copied.
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

CHUNK = 1 << 24


def bf16_bytes(x):
    """float32 array -> bf16 bytes (round to nearest even)."""
    u = x.astype(np.float32).view(np.uint32)
    u = u + 0x7FFF + ((u >> 16) & 1)
    return (u >> 16).astype(np.uint16).tobytes()


def write_safetensors(path, tensors, rng):
    """tensors: list of (name, shape, kind) with kind 'normal:STD', 'ones', 'tiled:STD' (one random block of
    CHUNK values repeated within the tensor), 'repeat:STD' (slices of one random block shared by every such
    tensor of the file: no random numbers to draw per tensor) or an int64 array."""
    shared = {}
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
            if how == "repeat":
                if std not in shared:
                    shared[std] = bf16_bytes(float(std) * rng.standard_normal(CHUNK, dtype=np.float32))
                for i in range(0, n, CHUNK):
                    f.write(shared[std][:2 * min(CHUNK, n - i)])
                continue
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
    """Per layer: type, head_dim, kv heads (docs/gemma4-text.md 1.3, both spellings); the first KV-shared layer."""
    L = tc["num_hidden_layers"]
    types = tc.get("layer_types") or ["full_attention" if (l + 1) % 6 == 0 else "sliding_attention" for l in range(L)]
    types = types[:L - 1] + ["full_attention"]
    hd, kv = tc.get("head_dim", 256), tc.get("num_key_value_heads", 4)
    D, KV = [hd] * L, [kv] * L
    plc = tc.get("per_layer_config")
    if plc:
        for k, v in plc.items():
            D[int(k)], KV[int(k)] = v.get("head_dim", hd), v.get("num_key_value_heads", kv)
    else:
        gkv = tc.get("num_global_key_value_heads") if tc.get("attention_k_eq_v") else None
        for l in range(L):
            if types[l] == "full_attention":
                D[l], KV[l] = tc.get("global_head_dim", 512), gkv or kv
    return L, types, D, KV, L - (tc.get("num_kv_shared_layers") or 0)


def write_model(config, out, dtype="bf16", seed=1):
    """The text decoder of `config` (a config.json) with random weights, by gemma4c quantize --random."""
    here = os.path.dirname(os.path.abspath(__file__))
    gemma4c = os.environ.get("G4_BIN") or os.path.join(here, "..", "..", "build", "gemma4c")
    os.makedirs(out if dtype.startswith("mlx") or not out.endswith(".gguf") else os.path.dirname(out) or ".",
                exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(text_config(config), f, indent=1)
        f.flush()
        if subprocess.run([gemma4c, "quantize", "--random", f.name, out, "--type", dtype, "--seed", str(seed)]).returncode:
            sys.exit(1)


def main_tensors(tc, prefix="model.", matrix="normal"):
    """The decoder's tensors under prefix; large matrices of kind matrix ("normal" or "tiled")."""
    H, V, NH, P = tc["hidden_size"], tc["vocab_size"], tc["num_attention_heads"], tc.get("hidden_size_per_layer_input", 0)
    L, types, D, KV, first = layer_dims(tc)
    s = 0.02
    t = [(prefix + "embed_tokens.weight", (V, H), f"{matrix}:{s}"), (prefix + "norm.weight", (H,), "ones")]
    if P:
        t += [(prefix + "embed_tokens_per_layer.weight", (tc["vocab_size_per_layer_input"], L * P), f"tiled:{s}"),
              (prefix + "per_layer_model_projection.weight", (L * P, H), f"{matrix}:{s}"),
              (prefix + "per_layer_projection_norm.weight", (P,), "ones")]
    for l in range(L):
        p = f"{prefix}layers.{l}."
        I = tc["intermediate_size"] * (2 if tc.get("use_double_wide_mlp") and first < L and l >= first else 1)
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            t.append((p + n + ".weight", (H,), "ones"))
        t += [(p + "layer_scalar", (1,), "ones"), (p + "self_attn.q_proj.weight", (NH * D[l], H), f"{matrix}:{s}"),
              (p + "self_attn.q_norm.weight", (D[l],), "ones"), (p + "self_attn.o_proj.weight", (H, NH * D[l]), f"{matrix}:{s}")]
        if l < first:
            t += [(p + "self_attn.k_proj.weight", (KV[l] * D[l], H), f"{matrix}:{s}"),
                  (p + "self_attn.k_norm.weight", (D[l],), "ones")]
            if not (tc.get("attention_k_eq_v") and types[l] == "full_attention"):
                t.append((p + "self_attn.v_proj.weight", (KV[l] * D[l], H), f"{matrix}:{s}"))
        t += [(p + "mlp.gate_proj.weight", (I, H), f"{matrix}:{s}"), (p + "mlp.up_proj.weight", (I, H), f"{matrix}:{s}"),
              (p + "mlp.down_proj.weight", (H, I), f"{matrix}:{s}")]
        if P:
            t += [(p + "per_layer_input_gate.weight", (P, H), f"{matrix}:{s}"),
                  (p + "per_layer_projection.weight", (H, P), f"{matrix}:{s}"),
                  (p + "post_per_layer_input_norm.weight", (H,), "ones")]
    return t


def drafter(tc, a, rng):
    """The drafter's config and tensors; its layer types read the main model's head sizes and kv heads."""
    _, types, D, KV, first = layer_dims(tc)
    src = {t: max(l for l in range(first) if types[l] == t) for t in set(types[:first])}
    dtypes = ["sliding_attention"] * 3 + ["full_attention"]
    Ha, NH, Ia, V, Hb = a.hidden, a.heads, a.intermediate, tc["vocab_size"], tc["hidden_size"]
    n_cent = min(2048, V // 64)
    text = {k: tc[k] for k in ("vocab_size", "rms_norm_eps", "sliding_window", "rope_parameters",
                               "final_logit_softcapping", "max_position_embeddings") if k in tc}
    text.update(model_type="gemma4_text", hidden_size=Ha, num_hidden_layers=4, num_attention_heads=NH,
                intermediate_size=Ia, layer_types=dtypes, num_kv_shared_layers=4, hidden_size_per_layer_input=0,
                vocab_size_per_layer_input=0, enable_moe_block=False, use_double_wide_mlp=False,
                attention_k_eq_v=False, hidden_activation="gelu_pytorch_tanh",
                per_layer_config={str(l): {"head_dim": D[src[t]], "num_key_value_heads": KV[src[t]]}
                                  for l, t in enumerate(dtypes)})
    cfg = {"architectures": ["Gemma4AssistantForCausalLM"], "model_type": "gemma4_assistant",
           "backbone_hidden_size": Hb, "use_ordered_embeddings": not a.dense_head, "num_centroids": n_cent,
           "centroid_intermediate_top_k": min(32, n_cent), "tie_word_embeddings": True, "text_config": text}
    s = 0.02
    t = [("model.embed_tokens.weight", (V, Ha), f"normal:{s}"), ("model.norm.weight", (Ha,), "ones"),
         ("pre_projection.weight", (Ha, 2 * Hb), f"normal:{s}"), ("post_projection.weight", (Hb, Ha), f"normal:{s}")]
    if not a.dense_head:
        t += [("masked_embedding.centroids.weight", (n_cent, Ha), f"normal:{s}"),
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


TOKEN_IDS = {"image_token_id": 258880, "audio_token_id": 258881, "video_token_id": 258884, "boi_token_id": 255999,
             "eoi_token_id": 258882, "boa_token_id": 256000, "eoa_token_index": 258883}


def write_unified(path, out, layers, files_from):
    """A gemma4_unified model of the config at path (docs/gemma4-unified.md 9), the first `layers` layers."""
    cfg = json.load(open(path))
    if cfg.get("model_type") != "gemma4_unified":
        raise SystemExit(f"{path}: not a gemma4_unified config")
    tc = cfg["text_config"]
    os.makedirs(out, exist_ok=True)
    if os.path.exists(os.path.join(os.path.dirname(path), "processor_config.json")):
        shutil.copy(os.path.join(os.path.dirname(path), "processor_config.json"), out)
    if files_from:
        other = json.load(open(os.path.join(files_from, "config.json")))
        tc["vocab_size"] = (other.get("text_config") or other)["vocab_size"]
        for k, v in TOKEN_IDS.items():
            cfg[k] = other.get(k, v)
        for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
            if os.path.exists(os.path.join(files_from, f)):
                shutil.copy(os.path.join(files_from, f), out)
    if layers:
        L = min(layers, tc["num_hidden_layers"])
        _, types, _, _, _ = layer_dims(tc)
        tc["num_hidden_layers"] = L
        tc["layer_types"] = types[:L - 1] + ["full_attention"]
        tc["num_kv_shared_layers"] = 0
    vc, ac = cfg.get("vision_config", {}), cfg.get("audio_config", {})
    H, E, A = tc["hidden_size"], vc.get("mm_embed_dim", 3840), ac.get("audio_embed_dim", 640)
    B = vc.get("patch_size", 16) * vc.get("pooling_kernel_size", 3)
    v, s = "model.vision_embedder.", 0.02
    t = main_tensors(dict(tc, hidden_size_per_layer_input=0), "model.language_model.", "repeat")
    t += [(v + "patch_ln1.weight", (3 * B * B,), "ones"), (v + "patch_ln1.bias", (3 * B * B,), f"normal:{s}"),
          (v + "patch_dense.weight", (E, 3 * B * B), f"repeat:{s}"), (v + "patch_dense.bias", (E,), f"normal:{s}"),
          (v + "patch_ln2.weight", (E,), "ones"), (v + "patch_ln2.bias", (E,), f"normal:{s}"),
          (v + "pos_embedding", (vc.get("mm_posemb_size", 1120), 2, E), f"repeat:{s}"),
          (v + "pos_norm.weight", (E,), "ones"), (v + "pos_norm.bias", (E,), f"normal:{s}"),
          ("model.embed_vision.embedding_projection.weight", (H, vc.get("output_proj_dims", E)), f"repeat:{s}"),
          ("model.embed_audio.embedding_projection.weight", (H, A), f"repeat:{s}")]
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)
    write_safetensors(os.path.join(out, "model.safetensors"), t, np.random.default_rng(0))


def text_config(path):
    full = json.load(open(path))
    tc = dict(full.get("text_config") or full)
    tc["model_type"] = "gemma4_text"
    tc.setdefault("eos_token_id", full.get("eos_token_id", 1))
    return tc


def write_drafter(tc, out, a, rng):
    os.makedirs(out, exist_ok=True)
    cfg, t = drafter(tc, a, rng)
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)
    json.dump({"num_assistant_tokens": 20}, open(os.path.join(out, "generation_config.json"), "w"))
    write_safetensors(os.path.join(out, "model.safetensors"), t, rng)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["model", "drafter", "pair", "unified"])
    ap.add_argument("source", help="model, pair, unified: a config.json; drafter: the main model's folder")
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=2048)
    ap.add_argument("--dense-head", action="store_true")
    ap.add_argument("--type", default="bf16")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--layers", type=int, default=0, help="unified: keep the first N layers (0: all)")
    ap.add_argument("--files-from", help="unified: tokenizer, template and vocabulary of this model folder")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    if a.what == "model":
        write_model(a.source, a.out, a.type, a.seed)
        return
    if a.what == "unified":
        write_unified(a.source, a.out, a.layers, a.files_from)
        return
    if a.what == "drafter":
        write_drafter(text_config(os.path.join(a.source, "config.json")), a.out, a, rng)
        return
    write_model(a.source, os.path.join(a.out, "main"), "bf16", a.seed)
    write_drafter(text_config(a.source), os.path.join(a.out, "drafter"), a, rng)


if __name__ == "__main__":
    main()
