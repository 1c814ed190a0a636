#!/usr/bin/python3
"""Random Gemma 4 vision configurations against the numpy reference: the vision tower on shapes no fixture has.

    vision_sweep.py --bin GEMMA4C --reference DIR --tmp DIR [--cases N] [--seed S] [--device cpu|cuda]
                    [--only CASE] [--keep] [--control]

Each case draws a vision configuration the way transformers 5.17 reads one (configuration_gemma4.py,
Gemma4VisionConfig; modeling_gemma4.py for the modules): hidden size (not always heads x head_dim), layers, heads
and kv heads (GQA), head_dim (a multiple of 4: the 2-D RoPE splits each head in four), intermediate size,
patch_size, pooling_kernel_size, position_embedding_size, use_clipped_linears, standardize, rope theta, eps, keys
left out for transformers' class defaults; weights in F32, BF16 or F16; a tiny one-layer text decoder so the folder
is a loadable `gemma4` checkpoint (Gemma4ForConditionalGeneration) whose text width `embed_vision` projects to,
and a preprocessor_config.json with the same patch size and kernel. The weights are written here from
transformers' module list (Gemma4VisionPatchEmbedder, Gemma4VisionEncoderLayer, Gemma4VisionAttention,
Gemma4ClippableLinear with its four scalar buffers, Gemma4VisionMLP, Gemma4VisionModel's std_bias/std_scale,
Gemma4MultimodalEmbedder), not from gemma4c's binder, so a tensor the engine forgets or invents shows.

Then 1-3 random images (PIL: 1x1 up to a few hundred pixels, thin strips; RGB, RGBA, L, LA, P with and without
tRNS, 1, 16-bit gray; PNG (also 4-bit palettes), JPEG (baseline/progressive, 4:4:4/4:2:2/4:2:0, gray, CMYK), GIF,
WebP lossy/lossless; EXIF orientations) go through one `gemma4c encode-image [--budget N] [-t N]` call (budgets
70-1120 or the preprocessor's default; G4_CPU_ISA scalar/avx2 now and then), and the soft tokens (after
embed_vision) are compared with ../shared/reference/numpy: imgproc.py for the pixels (after transformers'
load_image: exif_transpose, convert("RGB")), vision_numpy.py for the tower, on the real patches only. An image whose
patch grid is wider or taller than the position table (transformers' embedding lookup fails) must be refused in one
line; a table exactly as wide as the grid must work. Where the tower is what llama.cpp's mmproj file can carry, the
same weights as a text GGUF (gemma4c quantize) + mmproj (make_mmproj.py, F32 or F16) give the same soft tokens.

Every kind of invalid configuration once (head_dim not a multiple of 4: apply_multidimensional_rope cannot split
it; heads not a multiple of kv heads; a rope_type other than axial/default; an activation gemma4c lacks; a
preprocessor whose patch size is not the tower's, or whose max_soft_tokens is not offered): gemma4c must refuse
them with one line on stderr. The first case also runs a negative control (--control). Prints ok/FAIL lines;
exits 1 on any failure.
"""
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from config_sweep import write_safetensors, draw_weights, drop_clip_bounds, sweep_arguments  # noqa: E402  (same folder)

F32 = np.float32
V = "model.vision_tower."

# the soft tokens' relative error (max |diff| / max |reference|): float32 on both sides, mostly below 1e-5 on the
# CPU (the fixtures README allows 1e-3 for embeddings; the negative control, 1% on one norm, gives ~1e-2). Some
# random towers are ill-conditioned (standardize's bias cancelling a token, then embed_vision's RMSNorm scaling the
# rest up; clamps): there the float32 reference itself is ~5e-5 off. So: within TOL of the float32 reference, or
# else within max(TOL, 3 x the float32 reference's own error) of the same reference computed in float64.
TOL = 1e-4


def draw_vision(rng):
    """A random vision config (the keys Gemma4VisionConfig reads) and the resolved values the reference uses."""
    NH = int(rng.choice([1, 2, 3, 4, 6]))
    kv = int(rng.choice([d for d in range(1, NH + 1) if NH % d == 0]))
    dh = int(rng.choice([4, 8, 12, 16, 24, 32, 40]))
    D = int(rng.choice([8, 16, 24, 40, 64, 96])) if rng.random() < 0.35 else NH * dh
    vc = {
        "model_type": "gemma4_vision", "hidden_size": D, "intermediate_size": int(rng.choice([8, 24, 64, 100])),
        "num_hidden_layers": int(rng.integers(1, 4)), "num_attention_heads": NH, "num_key_value_heads": kv,
        "head_dim": dh, "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": float(rng.choice([1e-6, 1e-5, 1e-3])),
        "max_position_embeddings": 131072, "attention_bias": False, "attention_dropout": 0.0,
        "rope_parameters": {"rope_type": str(rng.choice(["default", "axial"])),
                            "rope_theta": float(rng.choice([100.0, 10.0, 1000.0, 1e4]))},
        "pooling_kernel_size": int(rng.choice([1, 2, 3, 3, 4, 5])),
        "patch_size": int(rng.choice([2, 4, 7, 8, 14, 16])),
        # mostly a table wider than any grid here; a small one now and then (thin images then exceed it)
        "position_embedding_size": int(rng.choice([24, 100, 512, 1024, 1024, 2048])),
        "use_clipped_linears": bool(rng.random() < 0.5), "standardize": bool(rng.random() < 0.5),
        "initializer_range": 0.02,
    }
    # now and then a key left out: transformers' class default (configuration_gemma4.py:273-290, default_theta 100)
    defaults = {"rms_norm_eps": 1e-6, "use_clipped_linears": False, "standardize": False, "pooling_kernel_size": 3,
                "rope_parameters": {"rope_type": "axial", "rope_theta": 100.0}, "position_embedding_size": 10240}
    for key in defaults:
        if rng.random() < 0.08:
            del vc[key]
    if rng.random() < 0.35:  # as released towers are: what llama.cpp's mmproj file can carry (see mmproj below)
        vc.update({"hidden_size": NH * dh, "num_key_value_heads": NH, "pooling_kernel_size": 3, "rms_norm_eps": 1e-6,
                   "rope_parameters": {"rope_type": "default", "rope_theta": 100.0}})
    res = dict(defaults, **vc)
    return vc, res


def mmproj_carries(res):
    """llama.cpp's converter writes no head_dim, kv heads, pooling kernel, rope theta, and eps 1e-6 whatever the
    config says (make_mmproj.py; clip.cpp assumes n_embd / n_head, n_head, 3, 100): only such towers round-trip.
    Returns "yes"; "shapes" when only the head geometry is not carried (the tensors' shapes then contradict what
    the file implies: a one-line refusal, not wrong tokens); else "no" (nothing in the file can tell)."""
    rest = (res["pooling_kernel_size"] == 3 and res["rms_norm_eps"] == 1e-6 and
            res["rope_parameters"]["rope_theta"] == 100.0)
    heads = (res["hidden_size"] == res["num_attention_heads"] * res["head_dim"] and
             res["num_key_value_heads"] == res["num_attention_heads"])
    return "no" if not rest else "yes" if heads else "shapes"


N_INVALID = 6


def invalid_vision(rng, vc, kind):
    """A config transformers cannot run (or gemma4c does not); returns (vc, preprocessor overrides, why)."""
    vc = dict(vc)
    if kind == 0:  # apply_multidimensional_rope: split sizes 2*(dh//4) per axis must sum to dh
        vc["head_dim"] = int(rng.choice([2, 6, 10, 18]))
        return vc, {}, f"head_dim {vc['head_dim']} not a multiple of 4"
    if kind == 1:  # num_key_value_groups = heads // kv: repeat_kv cannot match the query heads
        vc["num_attention_heads"], vc["num_key_value_heads"] = 3, 2
        return vc, {}, "3 heads over 2 kv heads"
    if kind == 2:  # Gemma4VisionRotaryEmbedding.__init__: "supports only axial rope" (gemma4c also takes the
        # released configs' "default")
        vc["rope_parameters"] = {"rope_type": str(rng.choice(["linear", "yarn", "proportional"])), "rope_theta": 100.0}
        return vc, {}, f"rope_type {vc['rope_parameters']['rope_type']}"
    if kind == 3:  # transformers would run ACT2FN[...]; gemma4c has gelu_pytorch_tanh only: a refusal, not a guess
        vc["hidden_activation"] = str(rng.choice(["gelu", "silu", "relu"]))
        return vc, {}, f"hidden_activation {vc['hidden_activation']} (not supported)"
    if kind == 4:  # the processor's patches are not the tower's: input_proj cannot take them
        return vc, {"patch_size": vc.get("patch_size", 16) * 2}, "the preprocessor's patch_size differs from the tower's"
    # Gemma4ImageProcessor.__init__: max_soft_tokens must be one of 70, 140, 280, 560, 1120
    return vc, {"max_soft_tokens": int(rng.choice([0, 100, 281, 2240]))}, "preprocessor max_soft_tokens not offered"


def vision_weights(rng, res, T):
    """transformers' parameters and persistent buffers of Gemma4VisionModel + embed_vision, random."""
    D, I, NH, KV, dh = (res["hidden_size"], res["intermediate_size"], res["num_attention_heads"],
                        res["num_key_value_heads"], res["head_dim"])
    P, S = res["patch_size"], res["position_embedding_size"]
    w = {}

    def lin(name, out, inp):  # Gemma4ClippableLinear: .linear.weight, and the four scalar bounds when clipped
        w[name + ".linear.weight"] = rng.standard_normal((out, inp)).astype(F32) / F32(np.sqrt(inp))
        if res["use_clipped_linears"]:
            # bounds that bite now and then (inputs are RMS-normed, about N(0, 1)), or the +-inf of a fresh module
            if rng.random() < 0.15:
                lo, hi, olo, ohi = -np.inf, np.inf, -np.inf, np.inf
            else:
                lo, hi = -rng.uniform(0.8, 3.0), rng.uniform(0.8, 3.0)
                olo, ohi = -rng.uniform(0.5, 2.5), rng.uniform(0.5, 2.5)
            for k, v in (("input_min", lo), ("input_max", hi), ("output_min", olo), ("output_max", ohi)):
                w[f"{name}.{k}"] = np.array(v, dtype=F32)

    def norm(name, n):
        w[name + ".weight"] = (1.0 + 0.2 * rng.standard_normal(n)).astype(F32)

    w[V + "patch_embedder.input_proj.weight"] = rng.standard_normal((D, 3 * P * P)).astype(F32) / F32(P)
    w[V + "patch_embedder.position_embedding_table"] = (0.5 * rng.standard_normal((2, S, D))).astype(F32)
    for l in range(res["num_hidden_layers"]):
        p = f"{V}encoder.layers.{l}."
        lin(p + "self_attn.q_proj", NH * dh, D)
        lin(p + "self_attn.k_proj", KV * dh, D)
        lin(p + "self_attn.v_proj", KV * dh, D)
        lin(p + "self_attn.o_proj", D, NH * dh)
        norm(p + "self_attn.q_norm", dh)
        norm(p + "self_attn.k_norm", dh)
        lin(p + "mlp.gate_proj", I, D)
        lin(p + "mlp.up_proj", I, D)
        lin(p + "mlp.down_proj", D, I)
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            norm(p + n, D)
    if res["standardize"]:
        w[V + "std_bias"] = (3.0 * rng.standard_normal(D)).astype(F32)
        w[V + "std_scale"] = rng.uniform(0.2, 2.0, size=D).astype(F32)
    w["model.embed_vision.embedding_projection.weight"] = rng.standard_normal((T, D)).astype(F32) / F32(np.sqrt(D))
    return w


def text_config(T):
    """A one-layer decoder: only there so the folder is a loadable gemma4 checkpoint of text width T."""
    return {"vocab_size": 300, "hidden_size": T, "intermediate_size": 16, "num_hidden_layers": 1,
            "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 8, "global_head_dim": 8,
            "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "sliding_window": 4,
            "layer_types": ["full_attention"], "final_logit_softcapping": None, "hidden_size_per_layer_input": 0,
            "vocab_size_per_layer_input": 300, "attention_k_eq_v": False, "attention_bias": False,
            "tie_word_embeddings": True, "max_position_embeddings": 4096, "bos_token_id": 2, "eos_token_id": 1,
            "pad_token_id": 0, "model_type": "gemma4_text"}


def make_image(rng, path_base):
    """A random image file; returns (path, description)."""
    from PIL import Image, ImageFile
    # a progressive JPEG's scans are written whole into PIL's buffer: one of a noisy quality-100 image can outgrow
    # the default (libjpeg: "Suspension not allowed here"); a larger buffer writes the same file
    ImageFile.MAXBLOCK = max(ImageFile.MAXBLOCK, 1 << 26)
    shapes = [(1, 1), (1, 2), (2, 1), (3, 500), (500, 3), (1, 300), (7, 5), (17, 33), (48, 48), (64, 200)]
    if rng.random() < 0.35:
        h, w = shapes[int(rng.integers(0, len(shapes)))]
    elif rng.random() < 0.12:  # large: downscaled by several times (the resampler's wide support)
        h, w = int(rng.integers(300, 1600)), int(rng.integers(300, 1600))
    else:
        h, w = int(rng.integers(1, 400)), int(rng.integers(1, 400))
    # smooth gradients plus noise (pure noise is not what JPEG is for, but both occur)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    base = np.stack([127 + 120 * np.sin(xx / rng.uniform(3, 60) + rng.uniform(0, 6) + c) *
                     np.cos(yy / rng.uniform(3, 60) + c) for c in range(4)], -1)
    a = np.clip(base + rng.normal(0, rng.choice([0, 8, 60]), base.shape), 0, 255).astype(np.uint8)
    mode = str(rng.choice(["RGB", "RGB", "RGBA", "L", "LA", "P", "1", "I;16"]))
    fmt = str(rng.choice(["PNG", "PNG", "PNG", "PNG", "JPEG", "JPEG", "JPEG", "GIF", "WEBP"]))
    rgb = Image.fromarray(a[..., :3], "RGB")
    kw = {}
    if mode == "RGBA":
        im = Image.fromarray(a, "RGBA")
    elif mode == "LA":
        im = Image.fromarray(np.ascontiguousarray(a[..., [0, 3]]), "LA")
    elif mode == "L":
        im = rgb.convert("L")
    elif mode == "1":
        im = rgb.convert("1")
    elif mode == "P":
        im = rgb.quantize(colors=int(rng.choice([2, 16, 256])))
        if rng.random() < 0.5:
            kw["transparency"] = 0  # a tRNS chunk: convert("RGB") drops it, as it drops alpha
    elif mode == "I;16":  # 16-bit gray PNG: PIL opens it as "I" and convert("RGB") clips at 255 (not >> 8)
        im = Image.fromarray((a[..., 0].astype(np.uint16) * int(rng.choice([1, 2, 257]))).astype("<u2"), "I;16")
    else:
        im = rgb
    if fmt == "JPEG":
        if mode not in ("RGB", "L"):
            mode = str(rng.choice(["RGB", "L", "CMYK"]))  # CMYK: PIL's Adobe-inverted reading and its conversion
            im = rgb.convert(mode)
        kw = {"quality": int(rng.choice([50, 90, 100])), "subsampling": int(rng.choice([0, 1, 2])),
              "progressive": bool(rng.random() < 0.3)}
    elif fmt == "GIF":
        mode = "P"
        im = rgb.quantize(colors=int(rng.choice([2, 16, 256])))
    elif fmt == "WEBP":
        mode = str(rng.choice(["RGB", "RGBA"]))
        im = Image.fromarray(a, "RGBA").convert(mode)
        kw = {"lossless": True} if rng.random() < 0.5 else {"quality": int(rng.choice([30, 80]))}
    elif mode != "I;16" and rng.random() < 0.2:
        kw["bits"] = 4 if mode == "P" else None  # PIL writes a P image of <= 16 colours with 4 bits per pixel
        if kw["bits"] is None:
            del kw["bits"]
    orient = 1
    if rng.random() < 0.2:  # an EXIF orientation: transformers' load_image applies exif_transpose
        orient = int(rng.integers(2, 9))
        ex = Image.Exif()
        ex[0x0112] = orient
        kw["exif"] = ex.tobytes()
    path = f"{path_base}.{fmt.lower()}"
    if fmt in ("GIF",) and "exif" in kw:
        del kw["exif"]
        orient = 1
    im.save(path, fmt, **kw)
    return path, f"{w}x{h} {mode} {fmt}" + (" progressive" if kw.get("progressive") else "") + \
        (" lossless" if kw.get("lossless") else "") + (f" orientation {orient}" if orient != 1 else "")


def load_image(path):
    """transformers' load_image on a path: PIL open, EXIF transpose, convert("RGB"); uint8 [3, H, W]."""
    from PIL import Image, ImageOps
    im = ImageOps.exif_transpose(Image.open(path))
    if im.mode != "RGB":
        im = im.convert("RGB")
    return np.asarray(im, dtype=np.uint8).transpose(2, 0, 1).copy()


class Runner:
    def __init__(self, args):
        self.args = args
        self.failed = 0
        self.controlled = False
        self.worst = 0.0
        self.isa = ""
        self.mmproj_done = False

    def check(self, ok, what):
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        if not ok:
            self.failed = 1

    def gemma4c(self, *argv):
        cmd = [self.args.bin, *argv]
        if self.args.device != "cpu" and argv[0] != "quantize":
            cmd += ["--device", self.args.device]
        env = dict(os.environ)
        if self.isa:  # a lower instruction set's kernels (ignored where the CPU has no such set)
            env["G4_CPU_ISA"] = self.isa
        return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)

    def refused(self, res, out):
        # one error line; the model's load warnings ("gemma4c: warning: ...") may come before it
        err = [ln for ln in res.stderr.strip().splitlines() if not ln.startswith("gemma4c: warning:")]
        return res.returncode != 0 and len(err) == 1 and not res.stdout and not os.path.exists(out), \
            f"exit {res.returncode}, {chr(10).join(err)[:160]}"


def describe(vc, res, dtype, T):
    parts = [dtype, f"L{res['num_hidden_layers']}", f"D{res['hidden_size']}", f"I{res['intermediate_size']}",
             f"NH{res['num_attention_heads']}/{res['num_key_value_heads']}", f"dh{res['head_dim']}",
             f"p{res['patch_size']}", f"k{res['pooling_kernel_size']}", f"pos{res['position_embedding_size']}",
             f"theta{res['rope_parameters']['rope_theta']:g}", f"eps{res['rms_norm_eps']:g}", f"T{T}"]
    if res["use_clipped_linears"]:
        parts.append("clipped")
    if res["standardize"]:
        parts.append("std")
    left = [k for k in ("rms_norm_eps", "use_clipped_linears", "standardize", "pooling_kernel_size",
                        "rope_parameters", "position_embedding_size") if k not in vc]
    if left:
        parts.append("defaults:" + ",".join(left))
    return " ".join(parts)


def rms64(x, w=None, eps=1e-6):
    """vision_numpy.rms in float64 (it casts to float32)."""
    x = x.astype(np.float64)
    y = x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps)
    return y * w if w is not None else y


def reference_tokens64(vn, ip, W, res, path, budget):
    """The same in float64 (weights, activations and norms; the RoPE angles stay float32 as transformers has them,
    the pooler's sums float32 as vision_numpy has them)."""
    rms = vn.rms
    vn.rms = rms64
    try:
        return reference_tokens(vn, ip, {k: v.astype(np.float64) for k, v in W.items()}, res, path, budget, np.float64)
    finally:
        vn.rms = rms


def reference_tokens(vn, ip, W, res, path, budget, dtype=F32):
    """The reference's soft tokens of one image: pixels (imgproc), tower (vision_numpy), embed_vision."""
    P, k = res["patch_size"], res["pooling_kernel_size"]
    img = load_image(path)  # imgproc.preprocess, with load_image's EXIF transpose (imgproc.load_rgb has none)
    th, tw = ip.target_size(img.shape[1], img.shape[2], budget, P, k)
    if (th, tw) != img.shape[1:]:
        img = ip.resize_uint8(img, th, tw)
    p = ip.RESCALE_LUT[img]
    pv, pos, _ = ip.patchify(p, budget, P, k)
    n = p.shape[1] // P * (p.shape[2] // P)
    # padding patches never reach a real one (masked keys, zeroed in the pooler): the reference runs without them
    # (its attention is [heads, N, N]; 2520 padded patches at budget 280 would cost more than the rest)
    o = vn.tower(W, res, pv[:n], pos[:n])
    emb = vn.rms(o, None, res["rms_norm_eps"]) @ W["model.embed_vision.embedding_projection.weight"].T
    return emb.astype(dtype), (p.shape[2] // P, p.shape[1] // P)


def run_case(r, case, seed, vn, ip, invalid_kind=None):
    """A random case; with invalid_kind, that kind of invalid configuration (refused in one line)."""
    rng = np.random.default_rng([seed, case] if invalid_kind is None else [seed, 1000 + invalid_kind])
    vc, res = draw_vision(rng)
    T = int(rng.choice([16, 24, 48, 64]))
    dtype = str(rng.choice(["F32", "F32", "BF16", "F16"]))
    invalid, proc_over = None, {}
    if invalid_kind is not None:
        case = f"invalid {invalid_kind}"
        vc, proc_over, invalid = invalid_vision(rng, vc, invalid_kind)
        res = dict(res, **vc)
    r.isa = str(rng.choice(["", "", "scalar", "avx2"])) if r.args.device == "cpu" else ""
    name = f"case {case}: " + describe(vc, res, dtype, T) + (f" isa={r.isa}" if r.isa else "")
    folder = os.path.join(r.args.tmp, f"case{case}".replace(" ", "-"))
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    tc = text_config(T)
    cfg = {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"], "text_config": tc,
           "vision_config": vc, "audio_config": None, "tie_word_embeddings": True, "image_token_id": 299,
           "boi_token_id": 298, "eoi_token_id": 297, "audio_token_id": 296, "boa_token_id": 295,
           "eoa_token_index": 294, "video_token_id": 293}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    default_budget = int(rng.choice([70, 140, 280]))
    with open(os.path.join(folder, "preprocessor_config.json"), "w") as f:
        json.dump({"image_processor_type": "Gemma4ImageProcessor", "do_convert_rgb": True, "do_resize": True,
                   "resample": 3, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": False,
                   "image_mean": [0.0, 0.0, 0.0], "image_std": [1.0, 1.0, 1.0], "max_soft_tokens": default_budget,
                   "patch_size": res["patch_size"], "pooling_kernel_size": res["pooling_kernel_size"],
                   **proc_over}, f)
    if invalid:
        weights = draw_weights(rng, tc, ["full_attention"], "model.language_model.")
        weights.update(vision_weights(rng, res, T))
        write_safetensors(os.path.join(folder, "model.safetensors"), weights, "F32")
        img, _ = make_image(rng, os.path.join(folder, "img"))
        out = os.path.join(folder, "x.f32")
        ok, how = r.refused(r.gemma4c("encode-image", "-m", folder, "--image", img, "-o", out), out)
        r.check(ok, f"{name}: invalid ({invalid}) is refused in one line: {how}")
        shutil.rmtree(folder, ignore_errors=True)
        return
    budget = int(rng.choice([0, 70, 70, 140, 280, 280, 560, 1120]))  # 0: the preprocessor_config's max_soft_tokens
    eff = budget or default_budget
    # the reference's attention is [heads, N, N] in float32: at most about 2600 patches (budget x kernel^2)
    while eff > 70 and eff * res["pooling_kernel_size"] ** 2 * max(1, res["num_attention_heads"] // 2) > 2600:
        budget = eff = eff // 2
    P, k = res["patch_size"], res["pooling_kernel_size"]
    paths, grids = [], []
    for i in range(int(rng.integers(1, 4))):
        paths.append(make_image(rng, os.path.join(folder, f"img{i}")))
        img = load_image(paths[-1][0])
        th, tw = ip.target_size(img.shape[1], img.shape[2], eff, P, k)
        grids.append((tw // P, th // P))
    if rng.random() < 0.2:  # a position table exactly as wide as the widest grid: its last row is used
        vc["position_embedding_size"] = res["position_embedding_size"] = max(max(g) for g in grids)
        name = f"case {case}: " + describe(vc, res, dtype, T) + (f" isa={r.isa}" if r.isa else "") + \
            " (table fits exactly)"
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(cfg, f, indent=1)
    weights = draw_weights(rng, tc, ["full_attention"], "model.language_model.")
    weights.update(vision_weights(rng, res, T))
    weights, gone = drop_clip_bounds(weights, np.random.default_rng([seed, case, 17]))  # own stream: the draws stay
    if gone:
        name += f" ({len(gone)} clip bounds left out)"
    write_safetensors(os.path.join(folder, "model.safetensors"), weights, dtype)
    # what the reference reads: the file's values; F16 ones as float32, as the engine and transformers loaded in
    # float32 compute (the reference's safetensors reader keeps F16 arrays float16, and numpy would then compute
    # the input projection and the clamps in float16)
    from st import load
    W = {k: v.astype(F32) for k, v in load(os.path.join(folder, "model.safetensors")).items()}
    W.update(gone)

    images, wants, descs, refuse = [], [], [], []
    for path, desc in paths:
        try:
            want, grid = reference_tokens(vn, ip, W, res, path, eff)
        except IndexError:  # the grid is past the position table: transformers' F.embedding fails too
            refuse.append((path, desc))
            continue
        images.append(path)
        wants.append(want)
        descs.append(f"{desc} -> {grid[0]}x{grid[1]} patches, {len(want)} tokens")
    bargs = ["--budget", str(budget)] if budget else []
    if rng.random() < 0.5:  # thread counts that split the rows unevenly
        bargs += ["-t", str(int(rng.choice([1, 3, 4, 7])))]
        name += f" -t{bargs[-1]}"
    for path, desc in refuse:
        out = os.path.join(folder, "refused.f32")
        ok, how = r.refused(r.gemma4c("encode-image", "-m", folder, "--image", path, *bargs, "-o", out), out)
        r.check(ok, f"{name}: {desc} at budget {eff}, a patch grid past the position table of "
                f"{res['position_embedding_size']}, is refused in one line: {how}")
    if not images:
        shutil.rmtree(folder, ignore_errors=True)
        return
    out = os.path.join(folder, "emb.f32")
    argv = ["encode-image", "-m", folder]
    for p in images:
        argv += ["--image", p]
    argv += bargs + ["-o", out]
    res_run = r.gemma4c(*argv)
    what = f"{name}: budget {eff}: " + "; ".join(descs)
    if res_run.returncode != 0:
        r.check(False, f"{what}: encode-image failed: {res_run.stderr.strip()[:300]}")
        return
    want = np.concatenate(wants)
    got = np.fromfile(out, dtype="<f4")
    counts = [int(line.rsplit(":", 1)[1].split()[0]) for line in res_run.stderr.splitlines() if "soft tokens" in line]
    if got.size != want.size or counts != [len(x) for x in wants]:
        r.check(False, f"{what}: {got.size} values, {counts} tokens; {want.size} values, "
                f"{[len(x) for x in wants]} tokens expected")
        return
    got = got.reshape(want.shape)
    scale = max(float(np.max(np.abs(want))), 1e-30)
    errs = [float(np.max(np.abs(g.astype(np.float64) - w)) / max(float(np.max(np.abs(w))), 1e-30)) if len(w) else 0.0
            for g, w in zip(np.split(got, np.cumsum([len(x) for x in wants])[:-1]), wants)]
    err = float(np.max(np.abs(got.astype(np.float64) - want))) / scale
    how = f"tolerance {TOL:g}"
    if err > TOL:  # ill-conditioned? the float64 reference decides
        want64 = np.concatenate([reference_tokens64(vn, ip, W, res, p, eff)[0] for p in images])
        s64 = float(np.max(np.abs(want64)))
        own = float(np.max(np.abs(want - want64))) / s64
        err = float(np.max(np.abs(got - want64))) / s64
        how = f"against float64, where the float32 reference is {own:.3g} off: tolerance {max(TOL, 3 * own):.3g}"
        ok = err <= max(TOL, 3 * own)
    else:
        ok = True
        r.worst = max(r.worst, err)
    r.check(ok and bool(np.all(np.isfinite(got))),
            f"{what}: soft tokens rel error {err:.3g} (per image {', '.join(f'{e:.2g}' for e in errs)}; {how})")
    if r.args.control and not r.controlled:  # the comparison must see a 1% change of the last layer's FF norm
        r.controlled = True
        key = f"{V}encoder.layers.{res['num_hidden_layers'] - 1}.post_feedforward_layernorm.weight"
        bent = dict(weights)
        bent[key] = weights[key] * F32(1.01)
        write_safetensors(os.path.join(folder, "model.safetensors"), bent, "F32")
        res_b = r.gemma4c(*argv[:-1], out + ".bent")
        bad = float("nan")
        if res_b.returncode == 0:
            bad = float(np.max(np.abs(np.fromfile(out + ".bent", dtype="<f4").astype(np.float64) - want.ravel()))) / scale
        r.check(res_b.returncode == 0 and bad > TOL, f"{name}: negative control, the last layer's "
                f"post_feedforward_layernorm x1.01: rel error {bad:.3g} exceeds the tolerance {TOL:g}")
        write_safetensors(os.path.join(folder, "model.safetensors"), weights, dtype)  # the case's file again
    # the same tower as llama.cpp distributes it: a text GGUF (gemma4c quantize + a vocabulary) and an mmproj file
    # as its converter writes one (tests/data/make_mmproj.py). F32: the same soft tokens, bit for bit from F32
    # weights; F16: the converter rounds every 2-D weight but the position table to F16, the reference too
    carried = mmproj_carries(res)
    pick = rng.random() < 0.4
    if carried != "no" and (pick or (carried == "yes" and not r.mmproj_done)):  # at least one per run
        r.mmproj_done = r.mmproj_done or carried == "yes"
        outtype = str(rng.choice(["f32", "f16"]))
        mk = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "make_mmproj.py")]
        nov, gg, mm = (os.path.join(folder, n) for n in ("novocab.gguf", "text.gguf", f"mmproj-{outtype}.gguf"))
        q = r.gemma4c("quantize", folder, nov, "--type", "f32")
        steps = [q] if q.returncode else [q, subprocess.run(mk + ["vocab", nov, gg, folder], capture_output=True, text=True),
                                          subprocess.run(mk + ["mmproj", folder, mm, "--outtype", outtype],
                                                         capture_output=True, text=True)]
        bad = [x for x in steps if x.returncode]
        if bad:
            r.check(False, f"{name}: writing the GGUF files failed: {bad[0].stderr.strip()[:300]}")
        else:
            argv_mm = ["encode-image", "-m", gg, "--mmproj", mm]
            for p in images:
                argv_mm += ["--image", p]
            res_mm = r.gemma4c(*argv_mm, "--budget", str(eff), "-o", out + ".mm")
            if carried == "shapes":
                ok, how = r.refused(res_mm, out + ".mm")
                r.check(ok, f"{name}: as a llama.cpp mmproj ({outtype}), which cannot say head_dim "
                        f"{res['head_dim']} / {res['num_key_value_heads']} kv heads, is refused in one line: {how}")
            elif res_mm.returncode:
                r.check(False, f"{name}: encode-image --mmproj ({outtype}) failed: {res_mm.stderr.strip()[:300]}")
            else:
                ref = want
                if outtype == "f16":
                    W16 = {n: (x.astype(np.float16).astype(F32) if x.ndim >= 2 and V + "patch_embedder.position_"
                               "embedding_table" != n else x) for n, x in W.items()}
                    ref = np.concatenate([reference_tokens(vn, ip, W16, res, p, eff)[0] for p in images])
                got_mm = np.fromfile(out + ".mm", dtype="<f4")
                same = got_mm.size == got.size and bool(np.array_equal(got_mm, got.ravel()))
                err_mm = float(np.max(np.abs(got_mm.astype(np.float64) - ref.ravel()))) / scale \
                    if got_mm.size == ref.size else float("inf")
                # as ill-conditioned as the safetensors run: its error (or TOL) bounds this one
                r.check(err_mm <= max(TOL, 2 * err) and (same or dtype != "F32" or outtype == "f16"),
                        f"{name}: as a text GGUF + llama.cpp mmproj ({outtype}): rel error {err_mm:.3g}" +
                        (", bit for bit as the safetensors" if same else ""))
    if not r.args.keep:
        shutil.rmtree(folder, ignore_errors=True)


def main():
    args = sweep_arguments(24).parse_args()
    sys.path.insert(0, args.reference)
    import imgproc  # noqa: E402  (the reference, from ../shared)
    import vision_numpy  # noqa: E402
    os.makedirs(args.tmp, exist_ok=True)
    r = Runner(args)
    t0 = time.time()
    slowest = (0.0, None)
    for case in ([args.only] if args.only is not None else range(args.cases)):
        t = time.time()
        run_case(r, case, args.seed, vision_numpy, imgproc)
        slowest = max(slowest, (time.time() - t, case))
    if args.only is None:  # every kind of invalid configuration once (one gemma4c call each)
        for kind in range(N_INVALID):
            run_case(r, None, args.seed, vision_numpy, imgproc, invalid_kind=kind)
    print(f"worst soft-token rel error {r.worst:.3g} (tolerance {TOL:g}); {time.time() - t0:.1f} s, the slowest "
          f"case {slowest[1]} {slowest[0]:.1f} s")
    return r.failed


if __name__ == "__main__":
    sys.exit(main())
