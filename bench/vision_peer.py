#!/usr/bin/env python3
"""The peer of g4-vision-bench: the same tower on the same image, in PyTorch (Debian's python3-torch) when it
can be imported, else in numpy (the shared reference, ../shared/reference/numpy/vision_numpy.py). Times the
tower + embed_vision on float32 weights (the bf16 checkpoint widened), as g4-vision-bench does.

usage: vision_peer.py SHARED_DIR MODEL_DIR WIDTH HEIGHT BUDGET REPS THREADS [OURS.f32]
Prints "peer NAME patches N tokens T mean_ms M best_ms B" and, given OURS.f32 (g4-vision-bench's soft tokens),
"rel_diff D": max |ours - peer| / max |peer|."""
import json
import os
import sys
import time

import numpy as np

shared, model, W, H, budget, reps, threads = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:8])
sys.path.insert(0, os.path.join(shared, "reference", "numpy"))
import imgproc  # noqa: E402
import vision_numpy  # noqa: E402


def load(path):
    with open(path, "rb") as f:
        n = int(np.frombuffer(f.read(8), np.uint64)[0])
        header = json.loads(f.read(n))
    raw = np.memmap(path, np.uint8, "r", offset=8 + n)
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or not name.startswith(("model.vision_tower.", "model.embed_vision.")):
            continue
        a, b = info["data_offsets"]
        assert info["dtype"] == "BF16"
        u16 = np.frombuffer(raw[a:b], np.uint16)
        out[name] = (u16.astype(np.uint32) << 16).view(np.float32).reshape(info["shape"])
    return out


cfg = json.load(open(os.path.join(model, "config.json")))
vcfg = cfg["vision_config"]
Wt = load(os.path.join(model, "model.safetensors"))
y, x = np.mgrid[0:H, 0:W]
img = np.stack([(128 + 100 * np.sin(x / (7.0 + c) + y / 11.0)).astype(np.uint8) for c in range(3)])
th, tw = imgproc.target_size(H, W, budget)
p = imgproc.RESCALE_LUT[imgproc.resize_uint8(img, th, tw)]
pv, pos, ntok = imgproc.patchify(p, budget)
keep = ~np.all(pos == -1, -1)
pv, pos = pv[keep], pos[keep]    # real patches only, as the engine runs them

try:
    import torch
    torch.set_num_threads(threads)
    name = "torch-" + torch.__version__

    def run():
        with torch.no_grad():
            return tower_torch()

    T = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in Wt.items()}

    def rms(h, w, eps):
        y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return y * w if w is not None else y

    def clin(pfx, h):
        if pfx + ".input_min" in T:
            h = torch.clamp(h, T[pfx + ".input_min"].item(), T[pfx + ".input_max"].item())
        h = h @ T[pfx + ".linear.weight"].T
        if pfx + ".output_min" in T:
            h = torch.clamp(h, T[pfx + ".output_min"].item(), T[pfx + ".output_max"].item())
        return h

    def rope(h, px, py, theta):
        dh = h.shape[-1]; half = dh // 2; m = half // 2
        inv = 1.0 / theta ** (torch.arange(0, half, 2, dtype=torch.float32) / half)
        parts = []
        for pos_ in (px, py):
            ang = pos_[:, None].float() * inv[None, :]
            parts.append((torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]))
        out = torch.empty_like(h)
        for (cos, sin), s in zip(parts, (0, half)):
            a, b = h[..., s:s + m], h[..., s + m:s + half]
            out[..., s:s + m] = a * cos - b * sin
            out[..., s + m:s + half] = b * cos + a * sin
        return out

    tpv, tpos = torch.from_numpy(pv), torch.from_numpy(pos)

    def tower_torch():
        P = "model.vision_tower."
        D, Hh, KV, dh, eps = vcfg["hidden_size"], vcfg["num_attention_heads"], vcfg["num_key_value_heads"], vcfg["head_dim"], vcfg["rms_norm_eps"]
        theta = vcfg["rope_parameters"]["rope_theta"]
        n = tpv.shape[0]
        h = (2.0 * (tpv - 0.5)) @ T[P + "patch_embedder.input_proj.weight"].T
        tab = T[P + "patch_embedder.position_embedding_table"]
        h = h + (tab[0][tpos[:, 0]] + tab[1][tpos[:, 1]])
        for l in range(vcfg["num_hidden_layers"]):
            Lp = P + "encoder.layers.%d." % l
            a = rms(h, T[Lp + "input_layernorm.weight"], eps)
            q = rms(clin(Lp + "self_attn.q_proj", a).view(n, Hh, dh), T[Lp + "self_attn.q_norm.weight"], eps)
            k = rms(clin(Lp + "self_attn.k_proj", a).view(n, KV, dh), T[Lp + "self_attn.k_norm.weight"], eps)
            v = rms(clin(Lp + "self_attn.v_proj", a).view(n, KV, dh), None, eps)
            q, k = rope(q, tpos[:, 0], tpos[:, 1], theta), rope(k, tpos[:, 0], tpos[:, 1], theta)
            k = k.repeat_interleave(Hh // KV, 1); v = v.repeat_interleave(Hh // KV, 1)
            s = torch.softmax(torch.einsum("thd,shd->hts", q, k), -1)
            o = torch.einsum("hts,shd->thd", s, v).reshape(n, Hh * dh)
            h = h + rms(clin(Lp + "self_attn.o_proj", o), T[Lp + "post_attention_layernorm.weight"], eps)
            b = rms(h, T[Lp + "pre_feedforward_layernorm.weight"], eps)
            f = clin(Lp + "mlp.down_proj", torch.nn.functional.gelu(clin(Lp + "mlp.gate_proj", b), approximate="tanh") * clin(Lp + "mlp.up_proj", b))
            h = h + rms(f, T[Lp + "post_feedforward_layernorm.weight"], eps)
        k = vcfg["pooling_kernel_size"]
        Wp = int(tpos[:, 0].max()) + 1
        tok = (tpos[:, 1] // k) * (Wp // k) + tpos[:, 0] // k
        out = torch.zeros(n // (k * k), D).index_add_(0, tok, h * (1.0 / (k * k))) * D ** 0.5
        if vcfg.get("standardize"):
            out = (out - T[P + "std_bias"]) * T[P + "std_scale"]
        return rms(out, None, eps) @ T["model.embed_vision.embedding_projection.weight"].T
except ImportError:
    name = "numpy-" + np.__version__

    def run():
        o = vision_numpy.tower(Wt, vcfg, pv, pos)
        return vision_numpy.rms(o, None, vcfg["rms_norm_eps"]) @ Wt["model.embed_vision.embedding_projection.weight"].T

times = []
for r in range(reps + 1):
    t0 = time.perf_counter()
    out = np.asarray(run())
    if r:
        times.append(time.perf_counter() - t0)
print("peer %s patches %d tokens %d mean_ms %.1f best_ms %.1f" % (name, len(pv), len(out), 1e3 * np.mean(times), 1e3 * min(times)))
if len(sys.argv) > 8:
    ours = np.fromfile(sys.argv[8], np.float32).reshape(out.shape)
    print("rel_diff %.3g" % (np.abs(ours - out).max() / np.abs(out).max()))
