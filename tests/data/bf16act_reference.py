#!/usr/bin/python3
"""Reference logits for bf16 activations (g4_load_params.bf16_activations): the numpy reference of
../shared/reference/numpy (text_numpy.py, checked against transformers on every fixture) with one change, the
input of every product with a weight matrix (all of them BF16 in the fixtures: projections, MLP, PLE, router,
experts, the tied head) rounded to bf16 (nearest even) first, as the engine does in that mode. Products and
everything else stay float32.

usage: bf16act_reference.py FIXTURE_DIR OUT   -> OUT: full-forward logits [T, V] float32 of the fixture's
input_ids."""
import os
import sys

import numpy as np

from kv16_reference import round_bf16, tn  # beside this file: text_numpy and bf16 rounding (nearest even)

F32 = np.float32


plain_linear = tn.linear
tn.linear = lambda x, w, b=None: plain_linear(round_bf16(x), w, b)  # text_numpy calls linear by its global name


class Bf16Act(tn.Gemma4Text):
    def moe(self, l, r):  # text_numpy's moe (3.7) with the experts' inputs rounded
        c = self.c
        Im, TK = c["Im"], c["TK"]
        z = tn.rmsnorm(r, None, c["eps"])
        z = z * self.lw(l, "router.scale") * F32(c["H"] ** -0.5)
        lg = tn.linear(z, self.lw(l, "router.proj.weight"))
        pr = tn.softmax(lg.astype(F32), -1)
        order = np.argsort(-pr, axis=-1, kind="stable")[:, :TK]
        w = np.take_along_axis(pr, order, -1)
        w = w / np.sum(w, -1, keepdims=True)
        w = w * self.lw(l, "router.per_expert_scale")[order]
        x2 = tn.rmsnorm(r, self.lw(l, "pre_feedforward_layernorm_2.weight"), c["eps"])
        gu_w = self.lw(l, "experts.gate_up_proj")
        dn_w = self.lw(l, "experts.down_proj")
        acc = np.zeros_like(r)
        for i in range(r.shape[0]):
            for kk in np.sort(order[i]):
                wk = w[i][list(order[i]).index(kk)]
                gu = gu_w[kk] @ round_bf16(x2[i])
                y = dn_w[kk] @ round_bf16(tn.gelu(gu[:Im]) * gu[Im:])
                acc[i] += y * wk
        return tn.rmsnorm(acc, self.lw(l, "post_feedforward_layernorm_2.weight"), c["eps"])


def main():
    folder, out = sys.argv[1], sys.argv[2]
    ids = tn.load_safetensors(os.path.join(folder, "reference.safetensors"))["input_ids"]
    Bf16Act(folder).forward(ids)["logits"].astype(np.float32).tofile(out)


if __name__ == "__main__":
    main()
