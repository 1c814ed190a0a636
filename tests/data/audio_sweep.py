#!/usr/bin/python3
"""Random Gemma 4 audio-tower configurations against a numpy port of transformers: the audio path on shapes no
fixture has.

    audio_sweep.py --bin GEMMA4C --reference DIR --tmp DIR [--cases N] [--seed S] [--device cpu|cuda]
                   [--only CASE] [--keep] [--control]

Each case draws an audio_config the way transformers 5.17 reads one (configuration_gemma4.py, Gemma4AudioConfig;
modeling_gemma4.py for the modules): widths, heads (head_dim = hidden/heads), layers (0 included), subsampling
channels, the depthwise kernel, attention chunk / left context, the logit cap, the invalid-logit value, residual
weight, gradient clipping, rms_norm_eps, output_proj_dims, clipped linears or none, weights in F32, BF16 or F16,
with a one-layer text decoder so the folder is a loadable gemma4 checkpoint. The weights are written here from
transformers' module list (Gemma4AudioModel and Gemma4MultimodalEmbedder), not from gemma4c's binder, so a tensor
the engine forgets or invents shows; clip bounds are random and active. Then per case a few WAV files written
here (from a handful of samples to ~10 s; int16, 24-bit and float32 PCM; mono and stereo, averaged as librosa's
to_mono; silence, full-scale noise, a clipped sine, a chirp, 1.5 x full scale) go through `gemma4c encode-audio`, compared with:

    features:  ../shared/reference/numpy/audio_numpy.py (features(), the reference's own extractor);
    tower:     tower_hf() below, a literal port of transformers' Gemma4AudioModel.forward: the blocked attention
               (_convert_to_block, _extract_block_context, _rel_shift, _convert_4d_mask_to_blocked_5d) and
               gradient_clipping. audio_numpy.tower() reduces the attention to a window with relative row d for
               distance d, which holds only when (chunk + context_left - 1 + context_right) // 2 equals
               context_left - 1 (the released 12/13/0); transformers decides for every other configuration.

The tolerance is ../shared/fixtures/README.md's for audio embeddings, 1e-3 relative to the largest value, or three
times what 1e-6 relative noise on the features moves the reference by, if more (small gradient_clipping values
make the tower ill-conditioned: each clamp + RMSNorm pair amplifies noise).
Clips too short for a feature frame give no soft token in transformers: gemma4c may refuse them in one line.
Other sample rates (the engine resamples with libsoxr, the reference cannot): the run succeeds, the values are
finite and the count is the one transformers' processor gives for librosa's resampled length ceil(n * 16000 / sr).
Configurations transformers cannot run (hidden not a multiple of heads, odd hidden, a first subsampling width
whose //4 is not the 32 mel bins left) must be refused in one line on stderr; so must the few it runs that the
engine declares unsupported (attention_context_right > 0, another hidden_act, a left context of 1, an invalid-logit
value that lets masked keys into the softmax). Prints ok/FAIL lines; exits 1 on any failure.
"""
import json
import math
import os
import shutil
import struct
import subprocess
import sys

import numpy as np

F32 = np.float32
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from config_sweep import draw_weights, drop_clip_bounds, write_safetensors, sweep_arguments  # noqa: E402  (the text sweep's writers)

PREPROCESSOR = {
    "dither": 0.0, "feature_extractor_type": "Gemma4AudioFeatureExtractor", "feature_size": 128, "fft_length": 512,
    "fft_overdrive": False, "frame_length": 320, "hop_length": 160, "input_scale_factor": 1.0,
    "max_frequency": 8000.0, "mel_floor": 0.001, "min_frequency": 0.0, "padding_side": "right",
    "padding_value": 0.0, "per_bin_mean": None, "per_bin_stddev": None, "preemphasis": 0.0,
    "preemphasis_htk_flavor": True, "return_attention_mask": True, "sampling_rate": 16000,
}
TEXT = {  # a tiny decoder: the audio path only needs a loadable checkpoint and the text width
    "vocab_size": 512, "hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "global_head_dim": 16,
    "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "sliding_window": 16,
    "layer_types": ["full_attention"], "final_logit_softcapping": None, "hidden_size_per_layer_input": 0,
    "vocab_size_per_layer_input": 512, "attention_k_eq_v": False, "attention_bias": False,
    "tie_word_embeddings": True, "max_position_embeddings": 4096, "bos_token_id": 2, "eos_token_id": 1,
    "pad_token_id": 0, "model_type": "gemma4_text",
}


# ------------------------------------------------------------------ configuration
def draw_config(rng):
    """An audio_config (every key Gemma4AudioConfig has) and what the engine must do with it: "run", "refuse"
    (transformers cannot run it) or "unsupported" (transformers runs it, the engine declares it unsupported)."""
    NH = int(rng.choice([1, 2, 3, 4]))
    hd = int(rng.choice([4, 6, 8, 16]))
    ac = {
        "model_type": "gemma4_audio", "hidden_size": NH * hd, "num_hidden_layers": int(rng.choice([0, 1, 1, 2, 2, 3])),
        "num_attention_heads": NH, "hidden_act": "silu",
        "subsampling_conv_channels": [int(rng.choice([128, 128, 128, 130])), int(rng.choice([2, 4, 8, 16]))],
        "conv_kernel_size": int(rng.choice([1, 2, 3, 5, 8])),
        "residual_weight": float(rng.choice([0.5, 0.5, 1.0, 0.25, -0.3])),
        "attention_chunk_size": int(rng.integers(1, 17)), "attention_context_left": int(rng.integers(2, 18)),
        "attention_context_right": 0,
        "attention_logit_cap": float(rng.choice([50.0, 50.0, 10.0, 1.5, 200.0])),
        "attention_invalid_logits_value": float(rng.choice([-1e9, -1e9, -1e4, -1e30])),
        "use_clipped_linears": bool(rng.random() < 0.75), "rms_norm_eps": float(rng.choice([1e-6, 1e-6, 1e-5, 1e-3])),
        "gradient_clipping": float(rng.choice([1e10, 1e10, 1e10, 1e39, 3.0, 0.3])),
        "output_proj_dims": int(rng.choice([8, 24, 48, 96])), "initializer_range": 0.02,
    }
    if rng.random() < 0.3:  # the released window: chunk 12, left 13
        ac["attention_chunk_size"], ac["attention_context_left"] = 12, 13
    verdict, why = "run", ""
    u = rng.random()
    if u < 0.04:
        ac["hidden_size"] = NH * hd + 1 if NH > 1 else 2 * hd + 1
        verdict, why = "refuse", "hidden_size not a multiple of the heads (or odd: sin/cos width hidden-1)"
        if NH == 1:
            why = "odd hidden_size: the sin/cos table is hidden-1 wide, relative_k_proj takes hidden"
    elif u < 0.08:
        ac["subsampling_conv_channels"][0] = int(rng.choice([64, 256]))
        verdict, why = "refuse", "subsampling_conv_channels[0]//4 is not the 32 mel bins the convolutions leave"
    elif u < 0.11:
        ac["attention_context_right"] = int(rng.integers(1, 5))
        verdict, why = "unsupported", "attention_context_right > 0"
    elif u < 0.13:
        ac["hidden_act"] = "gelu"
        verdict, why = "unsupported", "hidden_act gelu"
    elif u < 0.15:
        ac["attention_context_left"] = 1
        verdict, why = "unsupported", "attention_context_left 1 (every key masked)"
    elif u < 0.18:
        ac["attention_invalid_logits_value"] = float(rng.choice([1e-9, -5.0]))
        verdict, why = "unsupported", "attention_invalid_logits_value lets masked keys into the softmax"
    return ac, verdict, why


def describe(ac, dtype):
    parts = [dtype, f"D{ac['hidden_size']}", f"NH{ac['num_attention_heads']}", f"L{ac['num_hidden_layers']}",
             f"C{ac['subsampling_conv_channels']}", f"K{ac['conv_kernel_size']}",
             f"chunk{ac['attention_chunk_size']}/left{ac['attention_context_left']}/right{ac['attention_context_right']}",
             f"cap{ac['attention_logit_cap']:g}", f"inval{ac['attention_invalid_logits_value']:g}",
             f"res{ac['residual_weight']:g}", f"eps{ac['rms_norm_eps']:g}", f"gc{ac['gradient_clipping']:g}",
             f"out{ac['output_proj_dims']}", "clipped" if ac["use_clipped_linears"] else "unclipped"]
    if ac["hidden_act"] != "silu":
        parts.append(ac["hidden_act"])
    return " ".join(parts)


def draw_audio_weights(rng, ac, text_hidden):
    """transformers' parameters and persistent buffers for this audio_config (modeling_gemma4.py:
    Gemma4AudioModel, Gemma4AudioSubSampleConvProjection(Layer), Gemma4AudioLayer, Gemma4AudioFeedForward,
    Gemma4AudioAttention, Gemma4AudioLightConv1d, Gemma4ClippableLinear; Gemma4MultimodalEmbedder), random."""
    D, NH = ac["hidden_size"], ac["num_attention_heads"]
    dh = D // NH
    C0, C1 = ac["subsampling_conv_channels"]
    K, O = ac["conv_kernel_size"], ac["output_proj_dims"]
    w = {}

    def t(name, shape, scale):
        w[name] = (rng.standard_normal(shape) * scale).astype(F32)

    def norm(name, n):
        w[name] = (1.0 + 0.2 * rng.standard_normal(n)).astype(F32)

    def clin(p, out, inp):
        t(p + ".linear.weight", (out, inp), 1.0 / np.sqrt(inp))
        if ac["use_clipped_linears"]:  # random, active bounds (typical |x| is about 1 after the norms)
            lo, hi = -rng.uniform(0.8, 3.0), rng.uniform(0.8, 3.0)
            w[p + ".input_min"], w[p + ".input_max"] = np.array(lo, F32), np.array(hi, F32)
            lo, hi = -rng.uniform(0.5, 2.5), rng.uniform(0.5, 2.5)
            w[p + ".output_min"], w[p + ".output_max"] = np.array(lo, F32), np.array(hi, F32)

    P = "model.audio_tower."
    S = P + "subsample_conv_projection."
    t(S + "layer0.conv.weight", (C0, 1, 3, 3), 1.0 / 3)
    norm(S + "layer0.norm.weight", C0)
    t(S + "layer1.conv.weight", (C1, C0, 3, 3), 1.0 / np.sqrt(9 * C0))
    norm(S + "layer1.norm.weight", C1)
    proj_in = (C0 // 4) * C1  # transformers' proj_input_dim
    t(S + "input_proj_linear.weight", (D, proj_in), 1.0 / np.sqrt(proj_in))
    for l in range(ac["num_hidden_layers"]):
        L = f"{P}layers.{l}."
        for ff in ("feed_forward1", "feed_forward2"):
            clin(L + ff + ".ffw_layer_1", 4 * D, D)
            clin(L + ff + ".ffw_layer_2", D, 4 * D)
            norm(L + ff + ".pre_layer_norm.weight", D)
            norm(L + ff + ".post_layer_norm.weight", D)
        for n in ("q_proj", "k_proj", "v_proj"):
            clin(L + "self_attn." + n, NH * dh, D)
        clin(L + "self_attn.post", D, D)
        t(L + "self_attn.relative_k_proj.weight", (NH * dh, D), 1.0 / np.sqrt(D))
        t(L + "self_attn.per_dim_scale", (dh,), 0.5)
        clin(L + "lconv1d.linear_start", 2 * D, D)
        clin(L + "lconv1d.linear_end", D, D)
        t(L + "lconv1d.depthwise_conv1d.weight", (D, 1, K), 1.0 / np.sqrt(K))
        norm(L + "lconv1d.pre_layer_norm.weight", D)
        norm(L + "lconv1d.conv_norm.weight", D)
        for n in ("norm_pre_attn", "norm_post_attn", "norm_out"):
            norm(L + n + ".weight", D)
    t(P + "output_proj.weight", (O, D), 1.0 / np.sqrt(D))
    t(P + "output_proj.bias", (O,), 0.2)
    t("model.embed_audio.embedding_projection.weight", (text_hidden, O), 1.0 / np.sqrt(O))
    return w


def stored(a, dtype):
    """The float32 values a file of this dtype holds (write_safetensors rounds to nearest even)."""
    a = np.ascontiguousarray(a, dtype=F32)
    if dtype == "F16":
        return a.astype(np.float16).astype(F32)
    if dtype == "BF16":
        u = a.view(np.uint32).astype(np.uint64)
        return ((((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32)).view(F32).reshape(a.shape)
    return a


# ------------------------------------------------------------------ transformers' tower, literally
def tower_hf(an, W, ac, feats, mask):
    """Gemma4AudioModel.forward (transformers 5.17) for one clip in numpy float32; feats [T, 128], mask [T]
    bool. Returns output_proj's rows and the output mask. `an` is the reference module (audio_numpy)."""
    P = "model.audio_tower."
    S = P + "subsample_conv_projection."
    D, NH = ac["hidden_size"], ac["num_attention_heads"]
    dh = D // NH
    eps = ac["rms_norm_eps"]
    gc = F32(min(ac["gradient_clipping"], float(np.finfo(F32).max)))

    def clip(x):
        return np.clip(x, -gc, gc).astype(F32)

    def ln_channels(x, w):  # nn.LayerNorm(C, eps, bias=False) over the channels (eps from the config)
        mu = x.mean(0, keepdims=True)
        var = ((x - mu) ** 2).mean(0, keepdims=True)
        return ((x - mu) / np.sqrt(var + F32(eps)) * w[:, None, None]).astype(F32)

    # subsampling; each layer zeroes the frames its mask drops, then mask = mask[::2]
    m = mask.astype(F32)
    x = feats.astype(F32)[None]
    x = x * m[None, :, None]
    x = np.maximum(ln_channels(an.conv2d_s2(x, W[S + "layer0.conv.weight"]), W[S + "layer0.norm.weight"]), 0)
    m = m[::2]
    x = x * m[None, :, None]
    x = np.maximum(ln_channels(an.conv2d_s2(x, W[S + "layer1.conv.weight"]), W[S + "layer1.norm.weight"]), 0)
    m = m[::2]
    C2, T, F2 = x.shape
    x = x.transpose(1, 2, 0).reshape(T, F2 * C2) @ W[S + "input_proj_linear.weight"].T
    valid = m.astype(bool)
    # Gemma4AudioRelPositionalEncoding
    chunk, past, fut = ac["attention_chunk_size"], ac["attention_context_left"] - 1, ac["attention_context_right"]
    ctx = chunk + past + fut
    n_ts = D // 2
    inv = np.exp(np.arange(n_ts) * -(math.log(10000.0) / max(n_ts - 1, 1))).astype(F32)
    pos_ids = np.arange(ctx // 2, -1, -1)
    st = pos_ids[:, None].astype(F32) * inv[None, :]
    pos = np.concatenate([np.sin(st), np.cos(st)], -1).astype(F32)  # [ctx//2 + 1, D]
    # the mask: create_bidirectional_mask(output_mask) & sliding_window_mask_function((past, fut)), blocked
    nb = (T + chunk - 1) // chunk
    qi = np.arange(T)[:, None]
    ki = np.arange(T)[None, :]
    dist = qi - ki
    m4 = (((dist >= 0) & (dist < past)) | ((dist < 0) & (-dist < fut))) & valid[None, :]
    m4 = np.pad(m4, ((0, nb * chunk - T), (0, nb * chunk - T)))
    m5 = np.pad(m4.reshape(nb, chunk, nb * chunk), ((0, 0), (0, 0), (past, fut)))
    kv_idx = (np.arange(nb) * chunk)[:, None] + np.arange(ctx)[None, :]  # [nb, ctx]
    m5 = np.take_along_axis(m5, np.broadcast_to(kv_idx[:, None, :], (nb, chunk, ctx)), axis=2)  # [nb, chunk, ctx]

    def to_block(h):  # [T, NH, dh] -> [nb, chunk, NH, dh]
        return np.pad(h, ((0, nb * chunk - T), (0, 0), (0, 0))).reshape(nb, chunk, NH, dh)

    def block_context(h):  # -> [nb, ctx, NH, dh]
        hp = np.pad(h, ((past, fut + chunk - 1), (0, 0), (0, 0)))
        idx = (np.arange(nb) * chunk)[:, None] + np.arange(ctx)[None, :]
        return hp[idx]

    def rel_shift(x):  # [NH, nb, chunk, npos] -> [NH, nb, chunk, ctx]
        h_, b_, c_, npos = x.shape
        x = np.pad(x, ((0, 0), (0, 0), (0, 0), (0, ctx + 1 - npos)))
        x = x.reshape(h_, b_, c_ * (ctx + 1))[..., :c_ * ctx]
        return x.reshape(h_, b_, c_, ctx)

    cap = F32(ac["attention_logit_cap"])
    inval = F32(ac["attention_invalid_logits_value"])
    for l in range(ac["num_hidden_layers"]):
        L = f"{P}layers.{l}."

        def ff(x, name):
            y = an.rms(clip(x), W[L + name + ".pre_layer_norm.weight"], eps)
            y = an.silu(an.clin(W, L + name + ".ffw_layer_1", y))
            y = an.clin(W, L + name + ".ffw_layer_2", y)
            y = an.rms(clip(y), W[L + name + ".post_layer_norm.weight"], eps)
            return (x + F32(ac["residual_weight"]) * y).astype(F32)

        x = ff(x, "feed_forward1")
        r = x
        y = an.rms(clip(x), W[L + "norm_pre_attn.weight"], eps)
        A = L + "self_attn."
        q = an.clin(W, A + "q_proj", y).reshape(T, NH, dh)
        k = an.clin(W, A + "k_proj", y).reshape(T, NH, dh)
        v = an.clin(W, A + "v_proj", y).reshape(T, NH, dh)
        q = (q * F32((dh ** -0.5) / math.log(2)) * an.softplus(W[A + "per_dim_scale"])).astype(F32)
        k = (k * F32(math.log(1 + math.e) / math.log(2))).astype(F32)
        qb, kb, vb = to_block(q), block_context(k), block_context(v)
        R = (pos @ W[A + "relative_k_proj.weight"].T).reshape(-1, NH, dh)  # [npos, NH, dh]
        ac_ = np.einsum("bqhd,bkhd->hbqk", qb, kb)
        bd = rel_shift(np.einsum("bqhd,phd->hbqp", qb, R))
        a = cap * np.tanh((ac_ + bd) / cap)
        a = np.where(m5[None], a, inval)
        a = a - a.max(-1, keepdims=True)
        p = np.exp(a)
        p = p / p.sum(-1, keepdims=True)
        o = np.einsum("hbqk,bkhd->bqhd", p, vb).reshape(nb * chunk, D)[:T].astype(F32)
        o = an.clin(W, A + "post", o)
        x = (r + an.rms(clip(o), W[L + "norm_post_attn.weight"], eps)).astype(F32)
        C = L + "lconv1d."
        r = x
        y = an.rms(x, W[C + "pre_layer_norm.weight"], eps)
        y = an.clin(W, C + "linear_start", y)
        y = y[:, :D] * (1.0 / (1.0 + np.exp(-y[:, D:])))
        wk = W[C + "depthwise_conv1d.weight"][:, 0, :]
        K = wk.shape[1]
        yp = np.concatenate([np.zeros((K - 1, D), F32), y])
        y = sum(wk[:, j] * yp[j:j + T] for j in range(K))
        y = an.rms(clip(y), W[C + "conv_norm.weight"], eps)
        y = an.clin(W, C + "linear_end", an.silu(y))
        x = (r + y).astype(F32)
        x = ff(x, "feed_forward2")
        x = an.rms(clip(x), W[L + "norm_out.weight"], eps).astype(F32)
    out = x @ W[P + "output_proj.weight"].T + W[P + "output_proj.bias"]
    return out.astype(F32), valid


def reference_embeddings(an, W, ac, pcm, nudge=None):
    """transformers' soft tokens for one clip of 16 kHz float32 PCM: [n, text_hidden] (n may be 0). nudge: a
    random generator to multiply every feature by 1 + 1e-6 N(0, 1) first (float32 noise of the FFT and the log)
    and every weight by 1 + 1e-7 N(0, 1) (float32 noise inside the tower, which constant features such as
    silence's do not stand for)."""
    feats, valid = an.features(pcm)
    if nudge is not None:
        feats = (feats * (1 + F32(1e-6) * nudge.standard_normal(feats.shape).astype(F32))).astype(F32)
        W = {k: (v * (1 + 1e-7 * nudge.standard_normal(v.shape))).astype(F32)
             if isinstance(v, np.ndarray) and v.dtype == F32 and np.all(np.isfinite(v)) else v for k, v in W.items()}
    out, m2 = tower_hf(an, W, ac, feats, valid)
    out = out[m2]
    y = an.rms(out, None, ac["rms_norm_eps"]) @ W["model.embed_audio.embedding_projection.weight"].T
    return y.astype(F32)


def n_tokens(n):
    """Soft tokens transformers' processor gives for n samples at 16 kHz (docs/gemma4-towers.md §3.2)."""
    n = min(n, 480000)
    nv = (n - 161) // 160 + 1 if n >= 161 else 0
    return (nv + 3) // 4


# ------------------------------------------------------------------ audio files
def write_wav(path, x, rate, fmt):
    """x [n, channels] float in [-1, 1] (float32 may exceed it); fmt int16, int24 or float32. Returns the mono
    float32 samples transformers' load_audio (librosa: soundfile, then to_mono's mean) reads."""
    x = np.asarray(x, np.float64)
    if x.ndim == 1:
        x = x[:, None]
    n, ch = x.shape
    if fmt == "int16":
        q = np.clip(np.round(x * 32768.0), -32768, 32767).astype("<i2")
        data, bits, tag = q.tobytes(), 16, 1
        dec = q.astype(F32) / F32(32768.0)
    elif fmt == "int24":
        q = np.clip(np.round(x * 8388608.0), -8388608, 8388607).astype(np.int32)
        b = q.astype("<i4").view(np.uint8).reshape(n, ch, 4)[:, :, :3]
        data, bits, tag = b.tobytes(), 24, 1
        dec = q.astype(F32) / F32(8388608.0)
    else:
        q = x.astype("<f4")
        data, bits, tag = q.tobytes(), 32, 3
        dec = q.astype(F32)
    block = ch * bits // 8
    fmt_chunk = struct.pack("<HHIIHH", tag, ch, rate, rate * block, block, bits)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt_chunk)) + fmt_chunk
    if tag == 3:
        body += b"fact" + struct.pack("<II", 4, n)
    body += b"data" + struct.pack("<I", len(data)) + data + (b"\0" if len(data) % 2 else b"")
    with open(path, "wb") as f:
        f.write(b"RIFF" + struct.pack("<I", len(body)) + body)
    mono = dec[:, 0] if ch == 1 else (dec.sum(1, dtype=F32) / F32(ch)).astype(F32)
    return mono.astype(F32)


def draw_signal(rng, n, ch):
    kind = str(rng.choice(["noise", "noise", "silence", "sine", "chirp", "speechy", "hot"]))
    t = np.arange(n) / 16000.0
    if kind == "silence":
        x = np.zeros((n, ch))
    elif kind == "noise":  # full scale
        x = rng.uniform(-1.0, 1.0, size=(n, ch))
    elif kind == "sine":  # clipped: 1.6 x full scale
        f = rng.uniform(80, 6000)
        x = np.clip(1.6 * np.sin(2 * np.pi * f * t + rng.uniform(0, 6)), -1, 1)[:, None].repeat(ch, 1)
    elif kind == "chirp":
        x = (0.8 * np.sin(2 * np.pi * (50 * t + 3000 * t * t / max(t[-1] if n else 1, 1e-3))))[:, None].repeat(ch, 1)
    elif kind == "hot":  # 1.5 x full scale: clipped in an integer file, kept in a float32 one (no clamp anywhere)
        x = 1.5 * rng.uniform(-1.0, 1.0, size=(n, ch))
    else:  # quiet noise under a slow envelope
        env = 0.5 * (1 + np.sin(2 * np.pi * 3 * t))
        x = (0.05 * env[:, None] * rng.standard_normal((n, ch)))
    if ch == 2 and kind != "silence":
        x[:, 1] *= rng.uniform(-1, 1)
    return x, kind


# ------------------------------------------------------------------ the sweep
class Runner:
    def __init__(self, args):
        self.args = args
        self.failed = 0
        self.controlled = False
        self.worst = 0.0

    def check(self, ok, what):
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        if not ok:
            self.failed = 1

    def encode(self, folder, wav, out):
        cmd = [self.args.bin, "encode-audio", "-m", folder, "--audio", wav, "-o", out, "--device", self.args.device]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def one_line_refusal(res):
    """exit != 0 and one error line (the model's load warnings, "gemma4c: warning: ...", may come before it)"""
    err = [ln for ln in res.stderr.strip().splitlines() if not ln.startswith("gemma4c: warning:")]
    return res.returncode != 0 and len(err) == 1, "\n".join(err)[:200]


def write_model(folder, ac, weights, dtype):
    cfg = {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"], "text_config": TEXT,
           "vision_config": None, "audio_config": ac, "audio_token_id": 497, "boa_token_id": 496,
           "eoa_token_index": 495, "image_token_id": 500, "boi_token_id": 499, "eoi_token_id": 498,
           "tie_word_embeddings": True}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    with open(os.path.join(folder, "preprocessor_config.json"), "w") as f:
        json.dump(PREPROCESSOR, f, indent=1)
    write_safetensors(os.path.join(folder, "model.safetensors"), weights, dtype)


def run_case(r, case, seed, an):
    rng = np.random.default_rng([seed, case])
    ac, verdict, why = draw_config(rng)
    dtype = str(rng.choice(["F32", "F32", "BF16", "F16"]))
    name = f"case {case}: " + describe(ac, dtype)
    folder = os.path.join(r.args.tmp, f"case{case}")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    text_types = TEXT["layer_types"]
    weights = draw_weights(rng, dict(TEXT), text_types, "model.language_model.")
    weights.update(draw_audio_weights(rng, ac, TEXT["hidden_size"]))
    W = {k: stored(v, dtype) for k, v in weights.items()}
    weights, gone = drop_clip_bounds(weights, np.random.default_rng([seed, case, 17]))  # own stream: the draws stay
    if gone:
        name += f" ({len(gone)} clip bounds left out)"
    W.update(gone)
    write_model(folder, ac, weights, dtype)

    # the clips: lengths from a handful of samples to ~10 s, mixed formats and channel counts
    n_clips = 3
    lengths = [int(rng.choice([int(rng.integers(1, 161)), int(rng.integers(161, 2000)), int(rng.integers(2000, 40000)),
                               int(rng.integers(40000, 160000))], p=[0.1, 0.3, 0.45, 0.15])) for _ in range(n_clips)]
    if verdict != "run":
        x, _ = draw_signal(rng, 4000, 1)
        wav = os.path.join(folder, "a.wav")
        write_wav(wav, x, 16000, "int16")
        res = r.encode(folder, wav, os.path.join(folder, "a.f32"))
        ok, msg = one_line_refusal(res)
        r.check(ok, f"{name}: {'invalid' if verdict == 'refuse' else 'unsupported'} ({why}) is refused in one "
                f"line: exit {res.returncode}, {msg}")
        if not r.args.keep:
            shutil.rmtree(folder, ignore_errors=True)
        return
    for i, n in enumerate(lengths):
        ch = int(rng.choice([1, 1, 2]))
        fmt = str(rng.choice(["int16", "int16", "int24", "float32"]))
        x, kind = draw_signal(rng, n, ch)
        wav = os.path.join(folder, f"clip{i}.wav")
        pcm = write_wav(wav, x, 16000, fmt)
        out = os.path.join(folder, f"clip{i}.f32")
        res = r.encode(folder, wav, out)
        what = f"{name}: {n} samples ({n / 16000:.3g} s) {kind} {fmt} {'stereo' if ch == 2 else 'mono'}"
        want_n = n_tokens(n)
        if want_n == 0:  # transformers: no soft token; the engine may refuse in one line or give none
            ok = (res.returncode == 0 and os.path.getsize(out) == 0) or one_line_refusal(res)[0]
            r.check(ok, f"{what}: no soft token (too short for a frame): exit {res.returncode}, "
                    f"{res.stderr.strip()[:160]}")
            continue
        if res.returncode != 0:
            r.check(False, f"{what}: encode-audio failed: {res.stderr.strip()[:300]}")
            continue
        got = np.fromfile(out, dtype="<f4")
        want = reference_embeddings(an, W, ac, pcm)
        if got.size != want.size:
            r.check(False, f"{what}: {got.size // TEXT['hidden_size']} soft tokens, {len(want)} expected")
            continue
        got = got.reshape(want.shape)
        scale = max(float(np.max(np.abs(want))), 1e-30)
        err = float(np.max(np.abs(got.astype(np.float64) - want))) / scale
        # the fixtures' 1e-3 of the largest value, or 3x what float32 noise on the features (1e-6 relative) moves
        # the reference by, if more: a small gradient_clipping makes every clamp + RMSNorm pair amplify noise
        # (about 1/gradient_clipping each; 0.3 over three layers: 1e-6 noise moves the output by ~1e-2)
        nudged = reference_embeddings(an, W, ac, pcm, np.random.default_rng([seed, case, i]))
        noise = float(np.max(np.abs(nudged.astype(np.float64) - want))) / scale
        tol = max(1e-3, 3 * noise)
        r.worst = max(r.worst, err)
        r.check(err <= tol and bool(np.all(np.isfinite(got))),
                f"{what}: {len(want)} soft tokens, max |diff| {err:.3g} of the largest value (tolerance {tol:.3g}; "
                f"the reference moves {noise:.3g} under 1e-6 feature and 1e-7 weight noise)")
        if r.args.control and not r.controlled and ac["num_hidden_layers"] > 0:
            # the comparison must see a 2% change of the first layer's first FF up-projection (a uniform scale of
            # a weight that a norm follows would vanish: the norm takes it out)
            r.controlled = True
            key = "model.audio_tower.layers.0.feed_forward1.ffw_layer_1.linear.weight"
            bent = dict(weights)
            bent[key] = weights[key] * F32(1.02)
            write_safetensors(os.path.join(folder, "model.safetensors"), bent, dtype)
            res = r.encode(folder, wav, out + ".bent")
            bad = float(np.max(np.abs(np.fromfile(out + ".bent", dtype="<f4").reshape(want.shape).astype(np.float64)
                                      - want))) / scale if res.returncode == 0 else 0.0
            r.check(res.returncode == 0 and bad > tol, f"{name}: negative control, layer 0's feed_forward1.ffw_layer_1 "
                    f"x1.02: max |diff| {bad:.3g} exceeds the tolerance {tol:.3g}")
            write_safetensors(os.path.join(folder, "model.safetensors"), weights, dtype)

    # another sample rate: resampled by the engine (libsoxr); finite values, the count of librosa's length
    if rng.random() < 0.35:
        rate = int(rng.choice([8000, 22050, 44100, 48000]))
        n = int(rng.integers(rate // 10, 3 * rate))
        x, kind = draw_signal(rng, n, 1)
        wav = os.path.join(folder, "rate.wav")
        write_wav(wav, x, rate, "int16")
        out = os.path.join(folder, "rate.f32")
        res = r.encode(folder, wav, out)
        n16 = int(math.ceil(n * 16000 / rate))
        want_n = n_tokens(n16)
        got = np.fromfile(out, dtype="<f4") if res.returncode == 0 else np.zeros(0, F32)
        r.check(res.returncode == 0 and got.size == want_n * TEXT["hidden_size"] and bool(np.all(np.isfinite(got))),
                f"{name}: {n} samples at {rate} Hz ({kind}): {got.size // TEXT['hidden_size']} finite soft tokens, "
                f"{want_n} expected for {n16} samples at 16 kHz" + ("" if res.returncode == 0 else
                                                                       f": {res.stderr.strip()[:200]}"))
    if not r.args.keep:
        shutil.rmtree(folder, ignore_errors=True)


def main():
    args = sweep_arguments(16).parse_args()
    sys.path.insert(0, args.reference)
    import audio_numpy  # noqa: E402  (the reference, from ../shared)
    os.makedirs(args.tmp, exist_ok=True)
    r = Runner(args)
    for case in ([args.only] if args.only is not None else range(args.cases)):
        run_case(r, case, args.seed, audio_numpy)
    print(f"largest error {r.worst:.3g} of the largest value", flush=True)
    if args.control and not r.controlled and args.only is None:
        r.check(False, "negative control: no case had a layer to bend")
    return r.failed


if __name__ == "__main__":
    sys.exit(main())
