#!/usr/bin/python3
"""Reference logits for a KV cache held in bf16 or f16: the numpy reference of ../shared/reference/numpy
(text_numpy.py, checked against transformers on every fixture) with one change, K (after k_norm and RoPE) and
V (after v_norm) rounded to the cache type before attention, as the engine stores them.

usage: kv16_reference.py FIXTURE_DIR OUT_PREFIX   -> OUT_PREFIX.bf16.f32, OUT_PREFIX.f16.f32: full-forward
logits [T, V] float32 of the fixture's input_ids."""
import os
import sys

import numpy as np

shared = os.environ.get("G4_SHARED_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared"))
sys.path.insert(0, os.path.join(shared, "reference", "numpy"))
import text_numpy as tn  # noqa: E402

F32 = np.float32


def round_bf16(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16  # round to nearest even
    return u.astype(np.uint32).view(np.float32)


def round_f16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


class RoundedKV(tn.Gemma4Text):
    """Full forward only (no cache): text_numpy's attention with K and V rounded."""

    rounding = staticmethod(round_bf16)

    def attention(self, l, x, pos, cache, shared_kv):
        c = self.c
        S = x.shape[0]
        D, KV, NH = c["D"][l], c["KV"][l], c["NH"]
        t = c["types"][l]
        q = tn.linear(x, self.lw(l, "self_attn.q_proj.weight"), self.lw(l, "self_attn.q_proj.bias")).reshape(S, NH, D)
        q = tn.rmsnorm(q, self.lw(l, "self_attn.q_norm.weight"), c["eps"])
        q = tn.apply_rope(q, pos, self.inv[t])
        if c["src"][l] is not None:
            K, V, kpos = shared_kv[t]
        else:
            kr = tn.linear(x, self.lw(l, "self_attn.k_proj.weight"), self.lw(l, "self_attn.k_proj.bias")).reshape(S, KV, D)
            wv = self.lw(l, "self_attn.v_proj.weight")
            vr = kr if wv is None else tn.linear(x, wv, self.lw(l, "self_attn.v_proj.bias")).reshape(S, KV, D)
            K = self.rounding(tn.apply_rope(tn.rmsnorm(kr, self.lw(l, "self_attn.k_norm.weight"), c["eps"]), pos, self.inv[t]))
            V = self.rounding(tn.rmsnorm(vr, None, c["eps"]))
            kpos = pos
            shared_kv[t] = (K, V, kpos)
        G = NH // K.shape[1]
        Kh = np.repeat(K, G, axis=1)
        Vh = np.repeat(V, G, axis=1)
        score = np.einsum("ihd,jhd->hij", q, Kh)
        allowed = kpos[None, :] <= pos[:, None]
        if t == "sliding_attention":
            allowed &= kpos[None, :] > pos[:, None] - c["W"]
        score = np.where(allowed[None], score, -np.inf).astype(F32)
        prob = tn.softmax(score, -1)
        out = np.einsum("hij,jhd->ihd", prob, Vh).reshape(S, NH * D)
        return tn.linear(out, self.lw(l, "self_attn.o_proj.weight"), self.lw(l, "self_attn.o_proj.bias"))


def main():
    folder, prefix = sys.argv[1], sys.argv[2]
    ids = tn.load_safetensors(os.path.join(folder, "reference.safetensors"))["input_ids"]
    m = RoundedKV(folder)
    for name, fn in (("bf16", round_bf16), ("f16", round_f16)):
        m.rounding = fn
        m.forward(ids)["logits"].astype(np.float32).tofile(f"{prefix}.{name}.f32")


if __name__ == "__main__":
    main()
