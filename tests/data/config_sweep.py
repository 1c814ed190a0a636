#!/usr/bin/python3
"""Random Gemma 4 text configurations against the numpy reference: the decoder on shapes no fixture has.

    config_sweep.py --bin GEMMA4C --reference DIR --tmp DIR [--cases N] [--seed S] [--device cpu|cuda]
                    [--kv f32] [--only CASE] [--keep] [--control]

Each case draws a text configuration the way transformers 5.17 reads one (configuration_gemma4.py,
Gemma4TextConfig.__post_init__; modular_gemma4.py for which tensors each layer holds): 2-7 layers of random
sliding/full types, widths, heads and kv heads, head_dim and global_head_dim (or an explicit per_layer_config),
attention_k_eq_v with num_global_key_value_heads, per-layer inputs or none, KV sharing with the double-wide MLP,
the MoE block, attention biases, logit softcapping, untied lm_head, RoPE types and factors, small sliding windows,
model_type gemma4_text or gemma4 (text_config only), weights in F32, BF16 or F16. The weights are written here from
transformers' module list, not from gemma4c's binder, so a tensor the engine forgets or invents shows. Then:

1. prefill: `gemma4c logits` over a prompt longer than the sliding window against the reference's full forward;
   and `gemma4c embed` (the mean of the final hidden states) of two prompts at once;
2. decode: `gemma4c generate --ids` greedy against the reference's greedy through its own sliding-window cache,
   the ids compared up to the first step whose two best logits lie within the tolerance of each other;
3. GGUF (a third of the cases): the same weights written by `gemma4c quantize` in llama.cpp's layout give the
   same logits, bit for bit on the CPU (on CUDA within the tolerance: the experts' layouts take other kernels);
4. MLX (a quarter of the cases): the weights written by `gemma4c quantize --type mlxN --group G` as an MLX folder,
   against the reference on the same weights dequantized by this script (docs/formats.md 2);
5. speculative decoding (about a fifth of the cases) with a random drafter (random_gemma4.py): its drafts are
   rejected, the KV cache rolls back every round; the ids must be the plain greedy ones;
6. batching: four prompts (one of them twice) of different lengths through `gemma4c generate -f` (the scheduler) on
   1, 2 or 4 slots, each against its own greedy run alone.

A few configurations are invalid by transformers' rules (a KV-shared layer whose type no earlier layer has):
gemma4c must refuse them with one line on stderr. The reference is ../shared/reference/numpy/text_numpy.py.
Prints ok/FAIL lines; exits 1 on any failure.
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np

F32 = np.float32


CLIP_BOUNDS = {"input_min": -np.inf, "input_max": np.inf, "output_min": -np.inf, "output_max": np.inf}


def drop_clip_bounds(weights, rng):
    """Leaves clip bounds out of a tower's checkpoint now and then, as a converted or hand-made one may: transformers
    then keeps the value the buffers were made with (-inf / +inf, Gemma4PreTrainedModel._init_weights), with a
    missing-keys warning. In a quarter of the draws each bound goes with probability 1/3. Returns the weights to
    write and {name: the value transformers uses} for the reference."""
    names = [k for k in weights if k.rsplit(".", 1)[-1] in CLIP_BOUNDS]
    if not names or rng.random() >= 0.25:
        return weights, {}
    gone = {k: np.array(CLIP_BOUNDS[k.rsplit(".", 1)[-1]], dtype=np.float32) for k in names if rng.random() < 1 / 3}
    return {k: v for k, v in weights.items() if k not in gone}, gone


def write_safetensors(path, tensors, dtype):
    """tensors: dict name -> float32 array, stored as dtype (F32, BF16 or F16)."""
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a, dtype=np.float32)
        if dtype == "BF16":
            u = a.view(np.uint32).astype(np.uint64)
            raw = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")).tobytes()
        elif dtype == "F16":
            raw = a.astype("<f2").tobytes()
        else:
            raw = a.astype("<f4").tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors_raw(path):
    """name -> (dtype, shape, bytes) of every tensor of a safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    hdr = json.loads(data[8:8 + n])
    return {k: (v["dtype"], v["shape"], data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in hdr.items() if k != "__metadata__"}


def as_f32(dtype, shape, raw):
    if dtype == "BF16":
        return (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
    return np.frombuffer(raw, {"F32": "<f4", "F16": "<f2"}[dtype]).astype(np.float32).reshape(shape)


def mlx_dequant(packed, scales, biases, bits, group):
    """docs/formats.md 2.2-2.3: each row's U32 words as one LSB-first bit stream; w = scale * q + bias per group."""
    words = np.frombuffer(packed[2], "<u4").reshape(packed[1])
    rows = words.reshape(-1, words.shape[-1])
    bitsarr = np.unpackbits(rows.view(np.uint8), axis=1, bitorder="little")
    n_in = rows.shape[1] * 32 // bits
    q = bitsarr[:, :n_in * bits].reshape(len(rows), n_in, bits).astype(np.uint32)
    q = (q << np.arange(bits, dtype=np.uint32)).sum(axis=2).astype(np.float32)
    s = as_f32(*scales).reshape(len(rows), -1)
    b = as_f32(*biases).reshape(len(rows), -1)
    w = np.repeat(s, group, axis=1) * q + np.repeat(b, group, axis=1)
    return w.reshape(list(packed[1][:-1]) + [n_in]).astype(np.float32)


def mlx_to_hf(folder, prefix):
    """The weights of an MLX folder as transformers names them, dequantized to float32 (mlx-lm's names:
    language_model.model.*, experts.switch_glu.{gate,up,down}_proj; docs/formats.md 2)."""
    cfg = json.load(open(os.path.join(folder, "config.json")))
    quant = cfg.get("quantization", {})
    raw = read_safetensors_raw(os.path.join(folder, "model.safetensors"))
    out = {}
    for name, t in raw.items():
        if name.endswith(".scales") or name.endswith(".biases"):
            continue
        mod = name[:-len(".weight")] if name.endswith(".weight") else None
        if mod and mod + ".scales" in raw:
            ov = quant.get(mod, {}) if isinstance(quant.get(mod), dict) else {}
            w = mlx_dequant(t, raw[mod + ".scales"], raw[mod + ".biases"], ov.get("bits", quant["bits"]),
                            ov.get("group_size", quant["group_size"]))
        else:
            w = as_f32(*t)
        core = name[len("language_model."):] if name.startswith("language_model.") else name
        out[core if core.startswith("lm_head.") else prefix + core[len("model."):]] = w
    for k in [k for k in out if ".experts.switch_glu.gate_proj.weight" in k]:
        base = k[:-len("switch_glu.gate_proj.weight")]
        out[base + "gate_up_proj"] = np.concatenate([out.pop(k), out.pop(base + "switch_glu.up_proj.weight")], 1)
        out[base + "down_proj"] = out.pop(base + "switch_glu.down_proj.weight")
    return out


def draw_config(rng, case):
    """A random text config (the keys transformers reads) and a short description."""
    L = int(rng.integers(2, 8))
    full_p = rng.choice([0.25, 0.5])
    types = ["full_attention" if rng.random() < full_p else "sliding_attention" for _ in range(L)]
    types[-1] = "full_attention"
    NH = int(rng.choice([1, 2, 3, 4, 6, 8]))
    kv = int(rng.choice([d for d in range(1, NH + 1) if NH % d == 0]))
    hd = int(rng.choice([8, 16, 24, 32, 64]))
    ghd = int(rng.choice([16, 32, 48, 64, 128]))
    H = int(rng.choice([16, 32, 48, 64, 96]))
    V = int(rng.choice([300, 517, 1024]))
    tc = {
        "vocab_size": V, "hidden_size": H, "intermediate_size": int(rng.choice([16, 40, 64, 128])),
        "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": kv, "head_dim": hd,
        "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": float(rng.choice([1e-6, 1e-5])),
        "sliding_window": int(rng.choice([2, 3, 4, 5, 8])), "layer_types": types,
        "final_logit_softcapping": [None, None, 30.0, 30.0, 4.0][int(rng.integers(0, 5))],
        "hidden_size_per_layer_input": int(rng.choice([0, 0, 8, 16])), "vocab_size_per_layer_input": V,
        "attention_k_eq_v": bool(rng.random() < 0.3), "attention_bias": bool(rng.random() < 0.25),
        "tie_word_embeddings": bool(rng.random() < 0.7), "max_position_embeddings": 4096,
        "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
    }
    if rng.random() < 0.2:  # the default layer pattern (5 sliding : 1 full), last forced full
        del tc["layer_types"]
        types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(L)]
        types[-1] = "full_attention"
    if rng.random() < 0.25:  # an explicit per-layer view: one head_dim per layer type (the RoPE is per type)
        d_full = ghd if rng.random() < 0.7 else hd
        kv_full = int(rng.choice([d for d in range(1, NH + 1) if NH % d == 0]))
        tc["per_layer_config"] = {str(l): {"head_dim": d_full, "num_key_value_heads": kv_full}
                                  for l in range(L) if types[l] == "full_attention"}
    else:
        tc["global_head_dim"] = ghd
        if tc["attention_k_eq_v"] and rng.random() < 0.6:
            tc["num_global_key_value_heads"] = int(rng.choice([d for d in range(1, NH + 1) if NH % d == 0]))
    if rng.random() < 0.4:
        def valid(n):  # every shared layer's type has an earlier non-shared layer to read from
            return all(t in types[:L - n] for t in types[L - n:])
        ns = [n for n in range(1, L) if valid(n)]
        # mostly a valid count; now and then one transformers cannot run (the engine must refuse it)
        tc["num_kv_shared_layers"] = int(rng.choice(ns)) if ns and rng.random() < 0.85 else int(rng.integers(1, L))
        tc["use_double_wide_mlp"] = bool(rng.random() < 0.5)
    if rng.random() < 0.3:
        E = int(rng.choice([2, 3, 4, 8]))
        tc.update({"enable_moe_block": True, "num_experts": E, "top_k_experts": int(rng.integers(1, E + 1)),
                   "moe_intermediate_size": int(rng.choice([8, 16, 24]))})
    if rng.random() < 0.6:
        full = {"rope_type": "proportional", "rope_theta": float(rng.choice([1e6, 1e4])),
                "partial_rotary_factor": float(rng.choice([0.25, 0.5, 1.0]))}
        if rng.random() < 0.3:
            full["factor"] = float(rng.choice([2.0, 8.0]))
        if rng.random() < 0.25:
            full = {"rope_type": "default", "rope_theta": float(rng.choice([1e6, 5e5]))}
        sliding = {"rope_type": "default", "rope_theta": float(rng.choice([1e4, 500.0]))}
        tc["rope_parameters"] = {"full_attention": full}
        if "sliding_attention" in types:
            tc["rope_parameters"]["sliding_attention"] = sliding
    # head_dim / global_head_dim with proportional RoPE: n = int(prf * D // 2) frequencies; every D here is even
    return tc, types


def geometry(tc, types):
    """Per layer: head_dim, kv heads, KV-shared flag, the source layer of a shared one (or -1: invalid)."""
    L = tc["num_hidden_layers"]
    if "per_layer_config" in tc:
        plc = {int(k): v for k, v in tc["per_layer_config"].items()}
    else:
        ovr = {"head_dim": tc.get("global_head_dim", 512)}
        if tc.get("attention_k_eq_v") and tc.get("num_global_key_value_heads") is not None:
            ovr["num_key_value_heads"] = tc["num_global_key_value_heads"]
        plc = {l: ovr for l in range(L) if types[l] == "full_attention"}
    D = [plc.get(l, {}).get("head_dim", tc["head_dim"]) for l in range(L)]
    KV = [plc.get(l, {}).get("num_key_value_heads", tc["num_key_value_heads"]) for l in range(L)]
    first = L - tc.get("num_kv_shared_layers", 0)
    shared = [tc.get("num_kv_shared_layers", 0) > 0 and l >= first for l in range(L)]
    src = []
    for l in range(L):
        if not shared[l]:
            src.append(l)
        else:
            cands = [j for j in range(first) if types[j] == types[l]]
            src.append(cands[-1] if cands else -1)
    return D, KV, shared, src, first


def draw_weights(rng, tc, types, prefix):
    """transformers' parameters for this config (modular_gemma4.py: Gemma4TextModel, Gemma4TextDecoderLayer,
    Gemma4TextAttention, Gemma4TextMLP, Gemma4TextRouter, Gemma4TextExperts), random."""
    L, H, NH, V = tc["num_hidden_layers"], tc["hidden_size"], tc["num_attention_heads"], tc["vocab_size"]
    P, I = tc["hidden_size_per_layer_input"], tc["intermediate_size"]
    D, KV, shared, src, first = geometry(tc, types)
    bias = tc["attention_bias"]
    w = {}

    def lin(name, out, inp, b=False):
        w[name + ".weight"] = rng.standard_normal((out, inp)).astype(F32) / F32(np.sqrt(inp))
        if b:
            w[name + ".bias"] = (0.2 * rng.standard_normal(out)).astype(F32)

    def norm(name, n):
        w[name + ".weight"] = (1.0 + 0.2 * rng.standard_normal(n)).astype(F32)

    w[prefix + "embed_tokens.weight"] = rng.standard_normal((V, H)).astype(F32) * F32(0.5)
    norm(prefix + "norm", H)
    if P:
        w[prefix + "embed_tokens_per_layer.weight"] = rng.standard_normal((V, L * P)).astype(F32) * F32(0.5)
        lin(prefix + "per_layer_model_projection", L * P, H)
        norm(prefix + "per_layer_projection_norm", P)
    for l in range(L):
        p = f"{prefix}layers.{l}."
        k_eq_v = tc["attention_k_eq_v"] and types[l] == "full_attention"
        lin(p + "self_attn.q_proj", NH * D[l], H, bias)
        norm(p + "self_attn.q_norm", D[l])
        if not shared[l]:
            lin(p + "self_attn.k_proj", KV[l] * D[l], H, bias)
            norm(p + "self_attn.k_norm", D[l])
            if not k_eq_v:
                lin(p + "self_attn.v_proj", KV[l] * D[l], H, bias)
        lin(p + "self_attn.o_proj", H, NH * D[l], bias)
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            norm(p + n, H)
        Il = I * (2 if tc.get("use_double_wide_mlp") and shared[l] and first > 0 else 1)
        lin(p + "mlp.gate_proj", Il, H)
        lin(p + "mlp.up_proj", Il, H)
        lin(p + "mlp.down_proj", H, Il)
        if P:
            lin(p + "per_layer_input_gate", P, H)
            lin(p + "per_layer_projection", H, P)
            norm(p + "post_per_layer_input_norm", H)
        if tc.get("enable_moe_block"):
            E, Im = tc["num_experts"], tc["moe_intermediate_size"]
            lin(p + "router.proj", E, H)
            w[p + "router.scale"] = (1.0 + 0.2 * rng.standard_normal(H)).astype(F32)
            w[p + "router.per_expert_scale"] = (1.0 + 0.3 * rng.standard_normal(E)).astype(F32)
            w[p + "experts.gate_up_proj"] = rng.standard_normal((E, 2 * Im, H)).astype(F32) / F32(np.sqrt(H))
            w[p + "experts.down_proj"] = rng.standard_normal((E, H, Im)).astype(F32) / F32(np.sqrt(Im))
            for n in ("post_feedforward_layernorm_1", "post_feedforward_layernorm_2", "pre_feedforward_layernorm_2"):
                norm(p + n, H)
        w[p + "layer_scalar"] = rng.uniform(0.4, 1.2, size=(1,)).astype(F32)
    if not tc["tie_word_embeddings"]:
        w["lm_head.weight"] = rng.standard_normal((V, H)).astype(F32) * F32(0.5)
    return w


def describe(tc, types, dtype, model_type):
    D, KV, shared, src, first = geometry(tc, types)
    parts = [model_type, dtype, f"L{tc['num_hidden_layers']}",
             "".join("F" if t == "full_attention" else "s" for t in types),
             f"H{tc['hidden_size']}", f"NH{tc['num_attention_heads']}", f"D{sorted(set(D))}", f"KV{sorted(set(KV))}",
             f"W{tc['sliding_window']}", f"V{tc['vocab_size']}"]
    if tc["hidden_size_per_layer_input"]:
        parts.append(f"ple{tc['hidden_size_per_layer_input']}")
    if tc["attention_k_eq_v"]:
        parts.append("k=v")
    if tc.get("num_kv_shared_layers"):
        parts.append(f"shared{tc['num_kv_shared_layers']}" + ("x2mlp" if tc.get("use_double_wide_mlp") else ""))
    if tc.get("enable_moe_block"):
        parts.append(f"moe{tc['num_experts']}/{tc['top_k_experts']}")
    if tc["attention_bias"]:
        parts.append("bias")
    if tc["final_logit_softcapping"]:
        parts.append(f"cap{tc['final_logit_softcapping']:g}")
    if not tc["tie_word_embeddings"]:
        parts.append("lm_head")
    if "per_layer_config" in tc:
        parts.append("per_layer_config")
    if "rope_parameters" in tc:
        f = tc["rope_parameters"]["full_attention"]
        rope = "rope:" + f["rope_type"]
        if f["rope_type"] == "proportional":
            rope += f"/{f.get('partial_rotary_factor', 1):g}"
        if "factor" in f:
            rope += f"/x{f['factor']:g}"
        parts.append(rope)
    return " ".join(parts)


class Runner:
    def __init__(self, args):
        self.args = args
        self.failed = 0
        self.controlled = False

    def check(self, ok, what):
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        if not ok:
            self.failed = 1

    def gemma4c(self, *argv, stdin=None, env=None):
        cmd = [self.args.bin, *argv]
        if argv[0] != "quantize":
            cmd += ["--device", self.args.device]
            if self.args.kv:
                cmd += ["--kv", self.args.kv]
        return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=600,
                              env=dict(os.environ, **env) if env else None)


def sensitivity(model, ids, seed):
    """How far the reference's logits and mean final hidden state move when every weight changes by a relative
    1e-7 (about float32's own rounding, 6e-8): a random decoder of many thin layers can be chaotic enough that
    float32 noise alone moves its logits by more than the tolerance; such a case is judged against 3x this move."""
    rng = np.random.default_rng(seed)
    saved = model.w, model.Wemb, model.lm_head
    base = model.forward(ids)
    model.w = {k: (v * (1 + 1e-7 * rng.standard_normal(v.shape))).astype(F32) for k, v in saved[0].items()}
    model.Wemb = (saved[1] * (1 + 1e-7 * rng.standard_normal(saved[1].shape))).astype(F32)
    model.lm_head = model.Wemb if saved[2] is saved[1] else \
        (saved[2] * (1 + 1e-7 * rng.standard_normal(saved[2].shape))).astype(F32)
    moved = model.forward(ids)
    model.w, model.Wemb, model.lm_head = saved
    return (float(np.max(np.abs(moved["logits"].astype(np.float64) - base["logits"]))),
            float(np.max(np.abs(moved["final_norm"].mean(0).astype(np.float64) - base["final_norm"].mean(0)))))


def greedy(model, ids, n):
    """The reference's greedy continuation through its sliding-window cache: ids and each step's margin between
    its two best logits."""
    cache = model.new_cache()
    logits = model.forward(list(ids), cache)["logits"][-1]
    out, margins = [], []
    for _ in range(n):
        top = np.argsort(-logits.astype(np.float64), kind="stable")[:2]
        out.append(int(top[0]))
        margins.append(float(logits[top[0]] - logits[top[1]]))
        logits = model.forward([int(top[0])], cache)["logits"][-1]
    return out, margins


def same_greedy(got, want, margins, tol):
    """Equal up to the first step where the reference's two best logits are within tol (a tie either way)."""
    for i, w in enumerate(want):
        if i >= len(got):
            return False, f"{len(got)} ids, {len(want)} expected"
        if got[i] != w:
            return (True, f"equal up to a near-tie at step {i}") if margins[i] <= tol else \
                (False, f"step {i}: {got[i]} instead of {w} (margin {margins[i]:.3g})")
        if margins[i] <= tol:
            return True, f"equal up to a near-tie at step {i}"
    return True, f"{len(want)} ids equal"


def run_case(r, case, seed, text_numpy):
    rng = np.random.default_rng([seed, case])
    tc, types = draw_config(rng, case)
    dtype = str(rng.choice(["F32", "F32", "BF16", "F16"]))
    model_type = "gemma4" if rng.random() < 0.3 else "gemma4_text"
    name = f"case {case}: " + describe(tc, types, dtype, model_type)
    folder = os.path.join(r.args.tmp, f"case{case}")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    if model_type == "gemma4":
        cfg = {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"],
               "text_config": dict(tc, model_type="gemma4_text"), "vision_config": None, "audio_config": None,
               "tie_word_embeddings": tc["tie_word_embeddings"]}
        prefix = "model.language_model."
    else:
        cfg = dict(tc, model_type="gemma4_text", architectures=["Gemma4ForCausalLM"])
        prefix = "model."
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    weights = draw_weights(rng, tc, types, prefix)
    write_safetensors(os.path.join(folder, "model.safetensors"), weights, dtype)
    D, KV, shared, src, first = geometry(tc, types)

    V, W = tc["vocab_size"], tc["sliding_window"]
    S = int(min(40, 3 * W + int(rng.integers(2, 9))))
    ids = [2] + [int(x) for x in rng.integers(3, V, size=S - 1)]
    ids_s = ",".join(map(str, ids))
    out = os.path.join(folder, "logits.f32")
    res = r.gemma4c("logits", "-m", folder, "--ids", ids_s, "-o", out)
    if -1 in src:  # transformers cannot run it: its shared layer finds no stored K/V of its type
        err = res.stderr.strip().splitlines()
        r.check(res.returncode != 0 and len(err) == 1 and not res.stdout,
                f"{name}: invalid (a KV-shared layer of a type no earlier layer has) is refused in one line: "
                f"exit {res.returncode}, {res.stderr.strip()[:160]}")
        return
    if res.returncode != 0:
        r.check(False, f"{name}: logits failed: {res.stderr.strip()[:300]}")
        return
    model = text_numpy.Gemma4Text(folder)
    # the reference keeps F16 tensors as float16 (numpy then computes the embedding's scaling in float16); the
    # engine, like transformers loaded in float32, computes in float32 whatever the file holds
    model.w = {k: v.astype(F32) if v.dtype == np.float16 else v for k, v in model.w.items()}
    model.Wemb, model.lm_head = model.Wemb.astype(F32), model.lm_head.astype(F32)
    full = model.forward(ids)
    want = full["logits"]
    got = np.fromfile(out, dtype="<f4")
    if got.size != want.size:
        r.check(False, f"{name}: logits hold {got.size} values, {want.size} expected")
        return
    got = got.reshape(want.shape)
    scale = max(1.0, float(np.max(np.abs(want))))
    err = float(np.max(np.abs(got.astype(np.float64) - want)))
    # the CPU and F32/F16 weights: float32 products; BF16 weights on a GPU: tensor-core products of the
    # activations split into two bf16 parts (about 16 bits), which random weights amplify through the layers
    tol = (1e-3 if r.args.device == "cuda" and dtype == "BF16" else 2e-4) * scale
    moves, moves_e = sensitivity(model, ids, [r.args.seed, case, 1])
    noisy = 3 * moves > tol
    tol = max(tol, 3 * moves)
    how = f" (tolerance {tol:.3g}" + (f": 3x the reference's move under 1e-7 weight noise)" if noisy else ")")
    r.check(err <= tol and np.all(np.isfinite(got)), f"{name}: prefill logits of {S} tokens, max |diff| {err:.3g}{how}")
    if r.args.control and not r.controlled:  # the comparison must see a 1% change of the first layer's scalar
        r.controlled = True
        scalar0 = f"{prefix}layers.0.layer_scalar"
        bent = dict(weights)
        bent[scalar0] = weights[scalar0] * F32(1.01)
        write_safetensors(os.path.join(folder, "model.safetensors"), bent, dtype)
        res = r.gemma4c("logits", "-m", folder, "--ids", ids_s, "-o", out + ".bent")
        bent_logits = np.fromfile(out + ".bent", dtype="<f4").reshape(want.shape).astype(np.float64)
        bad = float(np.max(np.abs(bent_logits - want)))
        r.check(res.returncode == 0 and bad > tol, f"{name}: negative control, the first layer's scalar x1.01: "
                f"max |diff| {bad:.3g} exceeds the tolerance {tol:.3g}")
        write_safetensors(os.path.join(folder, "model.safetensors"), weights, dtype)

    # embeddings: the mean of the final hidden states (transformers' last_hidden_state), two lines at once
    half = ids[:S // 2]
    res = r.gemma4c("embed", "-m", folder, "-f", "-", "--parallel", "2",
                    stdin="".join(json.dumps({"ids": p}) + "\n" for p in (ids, half)))
    rows = [json.loads(x) for x in res.stdout.splitlines() if x.strip()] if res.returncode == 0 else []
    if len(rows) != 2 or any("embedding" not in row for row in rows):
        r.check(False, f"{name}: embed failed: {(res.stderr.strip() or res.stdout.strip())[:300]}")
    else:
        refs_e = [full["final_norm"].mean(0), model.forward(half)["final_norm"].mean(0)]
        err_e = max(float(np.max(np.abs(np.asarray(row["embedding"], np.float64) - ref))) for row, ref in
                    zip(rows, refs_e))
        tol_e = max(tol / scale * max(1.0, float(np.max(np.abs(refs_e[0])))), 3 * moves_e)
        r.check(err_e <= tol_e, f"{name}: embeddings of {S} and {len(half)} tokens, max |diff| {err_e:.3g} "
                f"(tolerance {tol_e:.3g})")

    # the same weights as a GGUF file in llama.cpp's layout (gemma4c quantize): the same logits, bit for bit
    if rng.random() < 0.35 and not tc["attention_bias"]:  # llama.cpp's Gemma 4 tensors have no biases
        gguf = os.path.join(folder, "model.gguf")
        q = r.gemma4c("quantize", folder, gguf, "--type", {"F32": "f32", "F16": "f16", "BF16": "bf16"}[dtype])
        res = r.gemma4c("logits", "-m", gguf, "--ids", ids_s, "-o", out + ".gguf") if q.returncode == 0 else q
        if r.args.device == "cpu":  # the same kernels on the same values
            same, how = res.returncode == 0 and open(out, "rb").read() == open(out + ".gguf", "rb").read(), \
                "the same logits bit for bit"
        else:  # CUDA multiplies the experts' gate and up apart (GGUF) or as one matrix (transformers' layout)
            d = float(np.max(np.abs(np.fromfile(out, "<f4") - np.fromfile(out + ".gguf", "<f4")))) \
                if res.returncode == 0 else float("inf")
            same, how = d <= tol, f"the same logits within {d:.3g} (tolerance {tol:.3g})"
        r.check(same, f"{name}: as a GGUF file, {how}" + ("" if res.returncode == 0 else
                                                         f": {res.stderr.strip()[:300]}"))
        if os.path.exists(gguf):
            os.remove(gguf)

    # MLX affine weights written by `gemma4c quantize` (a quarter of the cases): the engine on the MLX folder
    # against the reference on the same weights dequantized here
    if rng.random() < 0.25 and not tc["attention_bias"]:
        # (the CUDA backend reads the 4- and 8-bit MLX types; G4_NO_INT8_ACT: the products of the stored weights
        # with float activations, as the CPU computes MLX products anyway, not the GPU's int8 activations)
        bits = int(rng.choice([4, 8] if r.args.device == "cuda" else [2, 3, 4, 5, 6, 8]))
        group = int(rng.choice([32, 64]))
        mlx = os.path.join(folder, "mlx")
        q = r.gemma4c("quantize", folder, mlx, "--type", f"mlx{bits}", "--group", str(group))
        res = r.gemma4c("logits", "-m", mlx, "--ids", ids_s, "-o", out + ".mlx", env={"G4_NO_INT8_ACT": "1"}) \
            if q.returncode == 0 else q
        what = f"{name}: as an MLX {bits}-bit folder (group {group})"
        if res.returncode != 0:
            r.check(False, f"{what}: {res.stderr.strip()[:300]}")
        else:
            dq = os.path.join(folder, "mlx-dequantized")
            os.makedirs(dq, exist_ok=True)
            shutil.copy(os.path.join(folder, "config.json"), dq)
            write_safetensors(os.path.join(dq, "model.safetensors"), mlx_to_hf(mlx, prefix), "F32")
            model_q = text_numpy.Gemma4Text(dq)
            want_q = model_q.forward(ids)["logits"]
            got_q = np.fromfile(out + ".mlx", dtype="<f4").reshape(want_q.shape)
            scale_q = max(1.0, float(np.max(np.abs(want_q))))
            err_q = float(np.max(np.abs(got_q.astype(np.float64) - want_q)))
            tol_q = max((1e-3 if r.args.device == "cuda" else 2e-4) * scale_q,  # CUDA: bf16 tiles, hi + lo inputs
                        3 * sensitivity(model_q, ids, [r.args.seed, case, 2])[0])
            r.check(err_q <= tol_q, f"{what}: logits against its weights dequantized, max |diff| {err_q:.3g} "
                    f"(tolerance {tol_q:.3g})")
        shutil.rmtree(mlx, ignore_errors=True)

    # decode: greedy through the engine's KV cache against the reference's
    n = 12
    prompts = [ids[:int(rng.integers(2, 2 * W + 3))], ids[:S // 2], ids]
    refs = [greedy(model, p, n) for p in prompts]
    p0 = prompts[0]
    res = r.gemma4c("generate", "-m", folder, "--ids", ",".join(map(str, p0)), "-n", str(n), "--temp", "0",
                    "--ignore-eos", "--ctx", "256")
    if res.returncode != 0:
        r.check(False, f"{name}: generate failed: {res.stderr.strip()[:300]}")
        return
    got_ids = [int(x) for x in res.stdout.replace(",", " ").split()]
    ok, how = same_greedy(got_ids, refs[0][0], refs[0][1], 2 * tol)
    r.check(ok, f"{name}: greedy decode of {n} after {len(p0)} prompt tokens: {how}")

    # speculative decoding with a random drafter (random_gemma4.py drafter; it reads the last non-shared layer of each
    # type, so both types must have one): nearly every draft is rejected, so the KV cache rolls back after every
    # round, across the small sliding windows; the ids must stay the reference's
    kinds = set(types)
    if rng.random() < 0.3 and all(any(types[j] == t and not shared[j] for j in range(len(types))) for t in kinds) \
            and kinds == {"sliding_attention", "full_attention"}:
        drafter = os.path.join(folder, "drafter")
        mk = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                              "random_gemma4.py"), "drafter", folder, drafter,
                             "--hidden", "32", "--heads", str(tc["num_attention_heads"]), "--intermediate", "64"] +
                            # the centroid head needs its V // 64 centroids to divide V
                            (["--dense-head"] if rng.random() < 0.5 or V % max(1, V // 64) else []),
                            capture_output=True, text=True,
                            env=dict(os.environ, G4_BIN=r.args.bin))
        k = int(rng.choice([1, 3, 8]))
        res = r.gemma4c("generate", "-m", folder, "--ids", ",".join(map(str, p0)), "-n", str(n), "--temp", "0",
                        "--ignore-eos", "--ctx", "256", "--draft", drafter, "--draft-n", str(k)) if mk.returncode == 0 \
            else mk
        if res.returncode != 0:
            r.check(False, f"{name}: speculative decoding failed: {res.stderr.strip()[:300]}")
        else:
            spec = [int(x) for x in res.stdout.replace(",", " ").split()]
            ok, how = same_greedy(spec, refs[0][0], refs[0][1], 2 * tol)
            r.check(ok and (spec == got_ids or r.args.device != "cpu"),
                    f"{name}: speculative greedy, {k} drafts a round: {how}" +
                    ("" if spec == got_ids else f"; differs from plain decoding: {spec} / {got_ids}"))

    # batching: the prompts through the scheduler, the first one twice (its KV blocks shared), with fewer slots than
    # requests now and then (a request joins while others decode), and different lengths to generate
    batch = prompts + [prompts[0]]
    refs_b = refs + [refs[0]]
    lens = [n, n - 3, n, n - 6]
    slots = int(rng.choice([1, 2, 4]))
    lines = "".join(json.dumps({"ids": p, "max_tokens": k, "temperature": 0}) + "\n" for p, k in zip(batch, lens))
    res = r.gemma4c("generate", "-m", folder, "-f", "-", "--parallel", str(slots), "--ignore-eos", "--ctx", "256",
                    stdin=lines)
    rows = [json.loads(x) for x in res.stdout.splitlines() if x.strip()] if res.returncode == 0 else []
    if len(rows) != len(batch):
        r.check(False, f"{name}: generate -f failed: {res.stderr.strip()[:300]}")
        return
    verdicts = [same_greedy(row.get("ids", []), ref[0][:k], ref[1][:k], 2 * tol)
                for row, ref, k in zip(rows, refs_b, lens)]
    r.check(all(v[0] for v in verdicts), f"{name}: {len(batch)} prompts of {[len(p) for p in batch]} tokens on "
            f"{slots} slots: " + "; ".join(v[1] for v in verdicts))
    if not r.args.keep:
        shutil.rmtree(folder, ignore_errors=True)


def sweep_arguments(cases):
    """The options every sweep takes (config_sweep, audio_sweep, vision_sweep); a sweep may add its own."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--reference", required=True, help="../shared/reference/numpy")
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--cases", type=int, default=cases)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--only", type=int, default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--control", action="store_true", help="also check that a perturbed file fails the comparison")
    return ap


def main():
    ap = sweep_arguments(24)
    ap.add_argument("--kv", default=None)
    args = ap.parse_args()
    sys.path.insert(0, args.reference)
    import text_numpy  # noqa: E402  (the reference, from ../shared)
    os.makedirs(args.tmp, exist_ok=True)
    r = Runner(args)
    for case in ([args.only] if args.only is not None else range(args.cases)):
        run_case(r, case, args.seed, text_numpy)
    return r.failed


if __name__ == "__main__":
    sys.exit(main())
