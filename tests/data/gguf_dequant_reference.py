#!/usr/bin/python3
"""Reference logits of a quantized GGUF's own weights: the numpy reference of ../shared/reference/numpy
(text_numpy.py, checked against transformers on every fixture) run on a fixture whose weights are replaced by
those of an F32 GGUF -- the quantized file decoded by `gemma4c quantize Q.gguf F32.gguf --type f32` (the
decoders of src/core/quant.c, which tests/data/gguf_quant_diff.py checks against llama.cpp's gguf-py).

GGUF names are mapped back to the fixture's by the table of docs/formats.md 3.3 (written out here again, so a
wrong name in the engine's table shows up); every tensor of the GGUF but the generated rope_freqs must land on a
fixture tensor of the same shape.

usage: gguf_dequant_reference.py FIXTURE_DIR F32.gguf OUT   -> OUT: full-forward logits [T, V] float32 of the
fixture's input_ids."""
import os
import re
import struct
import sys

import numpy as np

from kv16_reference import tn  # beside this file: text_numpy from G4_SHARED_DIR

GLOBAL = {"token_embd.weight": "embed_tokens.weight", "output_norm.weight": "norm.weight",
          "per_layer_token_embd.weight": "embed_tokens_per_layer.weight",
          "per_layer_model_proj.weight": "per_layer_model_projection.weight",
          "per_layer_proj_norm.weight": "per_layer_projection_norm.weight"}
LAYER = {"attn_norm.weight": "input_layernorm.weight", "attn_q.weight": "self_attn.q_proj.weight",
         "attn_k.weight": "self_attn.k_proj.weight", "attn_v.weight": "self_attn.v_proj.weight",
         "attn_output.weight": "self_attn.o_proj.weight", "attn_q_norm.weight": "self_attn.q_norm.weight",
         "attn_k_norm.weight": "self_attn.k_norm.weight", "post_attention_norm.weight": "post_attention_layernorm.weight",
         "ffn_norm.weight": "pre_feedforward_layernorm.weight", "ffn_gate.weight": "mlp.gate_proj.weight",
         "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight",
         "post_ffw_norm.weight": "post_feedforward_layernorm.weight", "ffn_gate_inp.weight": "router.proj.weight",
         "ffn_gate_inp.scale": "router.scale", "ffn_gate_up_exps.weight": "experts.gate_up_proj",
         "ffn_gate_exps.weight": "experts.gate_proj", "ffn_up_exps.weight": "experts.up_proj",
         "ffn_down_exps.weight": "experts.down_proj", "ffn_down_exps.scale": "router.per_expert_scale",
         "pre_ffw_norm_2.weight": "pre_feedforward_layernorm_2.weight",
         "post_ffw_norm_1.weight": "post_feedforward_layernorm_1.weight",
         "post_ffw_norm_2.weight": "post_feedforward_layernorm_2.weight",
         "inp_gate.weight": "per_layer_input_gate.weight", "proj.weight": "per_layer_projection.weight",
         "post_norm.weight": "post_per_layer_input_norm.weight", "layer_output_scale.weight": "layer_scalar"}


def hf_name(g):
    if g in GLOBAL:
        return GLOBAL[g]
    m = re.fullmatch(r"blk\.(\d+)\.(.+)", g)
    if m and m.group(2) in LAYER:
        return f"layers.{m.group(1)}.{LAYER[m.group(2)]}"
    return None


def read_f32_gguf(path):
    """{name: float32 array} of a GGUF v3 file whose tensors are all F32 (docs/formats.md 3.1)."""
    d = open(path, "rb").read()
    assert d[:4] == b"GGUF" and struct.unpack_from("<I", d, 4)[0] == 3, "not a GGUF v3 file"
    n_t, n_kv = struct.unpack_from("<QQ", d, 8)
    p = 24
    size = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    align = 32

    def skip_value(p, t):
        if t == 8:
            return p + 8 + struct.unpack_from("<Q", d, p)[0]
        if t == 9:
            et, n = struct.unpack_from("<IQ", d, p)
            p += 12
            for _ in range(n):
                p = skip_value(p, et)
            return p
        return p + size[t]

    for _ in range(n_kv):
        n = struct.unpack_from("<Q", d, p)[0]
        key = d[p + 8:p + 8 + n].decode()
        t = struct.unpack_from("<I", d, p + 8 + n)[0]
        if key == "general.alignment":
            align = struct.unpack_from("<I", d, p + 12 + n)[0]
        p = skip_value(p + 12 + n, t)
    infos = []
    for _ in range(n_t):
        n = struct.unpack_from("<Q", d, p)[0]
        name = d[p + 8:p + 8 + n].decode()
        p += 8 + n
        nd = struct.unpack_from("<I", d, p)[0]
        ne = struct.unpack_from("<%dQ" % nd, d, p + 4)
        gtype, off = struct.unpack_from("<IQ", d, p + 4 + 8 * nd)
        p += 4 + 8 * nd + 12
        assert gtype == 0, f"{name}: not F32 (type {gtype})"
        infos.append((name, tuple(reversed(ne)), off))
    base = (p + align - 1) // align * align
    return {nm: np.frombuffer(d, np.float32, int(np.prod(sh)), base + off).reshape(sh) for nm, sh, off in infos}


class Decoded(tn.Gemma4Text):
    def __init__(self, folder, gguf):
        super().__init__(folder)
        head = None
        for g, v in read_f32_gguf(gguf).items():
            if g == "rope_freqs.weight":
                continue
            if g == "output.weight":
                head = v
                continue
            h = hf_name(g)
            assert h is not None and h in self.w, f"{g}: no fixture tensor ({h})"
            want = self.w[h].shape
            assert v.size == self.w[h].size and (v.shape == want or v.squeeze().shape == np.squeeze(self.w[h]).shape), \
                f"{g}: shape {v.shape}, fixture {want}"
            self.w[h] = v.reshape(want)
        self.Wemb = self.w["embed_tokens.weight"]
        self.lm_head = head if head is not None else self.Wemb


def main():
    folder, gguf, out = sys.argv[1:4]
    ids = tn.load_safetensors(os.path.join(folder, "reference.safetensors"))["input_ids"]
    Decoded(folder, gguf).forward(ids)["logits"].astype(np.float32).tofile(out)


if __name__ == "__main__":
    main()
