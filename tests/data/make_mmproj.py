#!/usr/bin/env python3
"""A Gemma 4 checkpoint's vision tower written as llama.cpp's converter writes it: the projector file
("mmproj-*.gguf") that `convert_hf_to_gguf.py --mmproj` makes of a Gemma4ForConditionalGeneration folder
(tests/test_mmproj_cli.sh). python3 + numpy only; no torch, no gguf-py.

    make_mmproj.py mmproj MODEL_DIR OUT.gguf [--outtype f16|f32|q8_0]
        the vision and audio towers of MODEL_DIR (config.json, preprocessor_config.json, model.safetensors,
        BF16/F16/F32); a model with audio but no vision (the audio fixture, which the converter refuses) gets the
        audio half alone
        broken variants for the error tests (not the converter's output): --projector TYPE, --audio-projector TYPE,
        --omit-key KEY, --omit-tensor NAME, --projection-dim N, --shrink NAME (one row less),
        --skip-permute (the patch embedding's bytes left in HF order), --skip-softplus (per_dim_scale as HF has it);
        --audio-from DIR: the audio tower of another fixture beside this one's vision tower (one file with both,
        as E2B/E4B projectors are)
    make_mmproj.py ollama MODEL_DIR TEXT.gguf OUT.gguf
        TEXT.gguf (the model's text GGUF with a vocabulary, as `vocab` writes it) with MODEL_DIR's towers inside, as
        Ollama's converter (convert/convert_gemma4.go) writes a Gemma 4 model: one file, no projector
    make_mmproj.py vocab IN.gguf OUT.gguf MODEL_DIR
        IN.gguf (a text GGUF without a vocabulary, as `gemma4c quantize` writes a folder without tokenizer.json)
        with a vocabulary of config.json's vocab_size whose placeholder pieces sit at the config's ids
        (<|image|> at image_token_id, ...), the rest "<unusedN>": what a llama.cpp text GGUF carries

Followed line by line (llama.cpp as node-llama-cpp 3.22.1 bundles it, llama/gitRelease.bundle, release tag
v0.5.0): conversion/gemma.py Gemma4VisionAudioModel (__init__ :960-971, set_gguf_parameters :973-986,
tensor_force_quant :991-997, modify_tensors :999-1032); conversion/base.py MmprojModel (__init__ :2537-2606,
filter_tensors :2608-2616, set_type :2626, set_gguf_parameters :2640-2661, tensor_force_quant :2695-2698) and
ModelBase.prepare_tensors (:1026-1110: the dtype of each tensor; tensor_force_quant gets the HF name); gguf-py/gguf/tensor_mapping.py (the "# gemma4"
names), constants.py (keys), gguf_writer.py (layout: header, key-values, tensor infos, data aligned to 32)."""
import json
import os
import struct
import sys

import numpy as np

ALIGN = 32
GGML_F32, GGML_F16, GGML_Q8_0 = 0, 1, 8
# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)


# ------------------------------------------------------------------ reading
def read_safetensors(path):
    buf = open(path, 'rb').read()
    n = struct.unpack('<Q', buf[:8])[0]
    head = json.loads(buf[8:8 + n])
    out = {}
    for name, info in head.items():
        if name == '__metadata__':
            continue
        a, b = info['data_offsets']
        raw = buf[8 + n + a:8 + n + b]
        dt = info['dtype']
        if dt == 'BF16':  # ModelBase.prepare_tensors :1029-1030: unsupported dtypes (bf16) go to float32
            x = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif dt == 'F16':
            x = np.frombuffer(raw, np.float16)
        elif dt == 'F32':
            x = np.frombuffer(raw, np.float32)
        else:
            raise SystemExit(f'{name}: dtype {dt} not handled')
        out[name] = x.reshape(info['shape'])
    return out


# ------------------------------------------------------------------ writing (gguf_writer.py layout)
def s_bytes(s):
    b = s.encode()
    return struct.pack('<Q', len(b)) + b


def kv_bytes(key, vtype, value):
    out = s_bytes(key) + struct.pack('<I', vtype)
    if vtype == ARR:
        et, vals = value
        out += struct.pack('<IQ', et, len(vals))
        for v in vals:
            out += scalar_bytes(et, v)
    else:
        out += scalar_bytes(vtype, value)
    return out


def scalar_bytes(t, v):
    if t == STR:
        return s_bytes(v)
    return struct.pack({U8: '<B', I8: '<b', U16: '<H', I16: '<h', U32: '<I', I32: '<i', F32: '<f', BOOL: '<?',
                        U64: '<Q', I64: '<q', F64: '<d'}[t], v)


def pad(n):
    return (ALIGN - n % ALIGN) % ALIGN


class Q8_0:
    """gguf-py quants.py Q8_0.quantize_blocks ("bit-exact same results as reference implementation in ggml-quants.c"):
    per 32 values d = max|x| / 127 (stored f16), q = np_roundf(x / d) (halves away from zero), in float32."""

    def __init__(self, x):
        x = np.asarray(x, np.float32)
        self.shape, self.ndim = x.shape, x.ndim
        blocks = x.reshape(-1, 32)
        d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
        with np.errstate(divide='ignore'):
            inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
        a = np.abs(blocks * inv)
        fl = np.floor(a)
        q = np.sign(blocks * inv) * (fl + np.floor(2 * (a - fl)))
        self.raw = np.concatenate([d.astype(np.float16).view(np.uint8), q.astype(np.int8).view(np.uint8)], axis=1)

    def tobytes(self):
        return self.raw.tobytes()


def write_gguf(path, kvs, tensors):
    """kvs: list of (key, type, value); tensors: list of (name, np array f32/f16 or Q8_0, C order). ne = reversed
    shape."""
    head = b'GGUF' + struct.pack('<IQQ', 3, len(tensors), len(kvs))
    head += b''.join(kv_bytes(*kv) for kv in kvs)
    off, blobs = 0, []
    for name, a in tensors:
        if isinstance(a, Q8_0):
            t = GGML_Q8_0
        else:
            a = np.ascontiguousarray(a)
            t = GGML_F32 if a.dtype == np.float32 else GGML_F16
        head += s_bytes(name) + struct.pack('<I', a.ndim) + b''.join(struct.pack('<Q', d) for d in a.shape[::-1])
        head += struct.pack('<IQ', t, off)
        raw = a.tobytes()
        blobs.append(raw + b'\0' * pad(len(raw)))
        off += len(blobs[-1])
    with open(path, 'wb') as f:
        f.write(head + b'\0' * pad(len(head)))
        for b in blobs:
            f.write(b)


# ------------------------------------------------------------------ the converter
# tensor_mapping.py, MODEL_ARCH.MMPROJ: vision_model.model.layers.{bid}.<hf> -> v.blk.{bid}.<gguf> ("# gemma4")
LAYER_MAP = {
    'input_layernorm': 'ln1', 'pre_feedforward_layernorm': 'ln2', 'post_attention_layernorm': 'attn_post_norm',
    'post_feedforward_layernorm': 'ffn_post_norm', 'self_attn.q_norm': 'attn_q_norm',
    'self_attn.k_norm': 'attn_k_norm', 'self_attn.q_proj': 'attn_q', 'self_attn.k_proj': 'attn_k',
    'self_attn.v_proj': 'attn_v', 'self_attn.o_proj': 'attn_out', 'mlp.gate_proj': 'ffn_gate',
    'mlp.up_proj': 'ffn_up', 'mlp.down_proj': 'ffn_down', 'layer_scalar': 'out_scale',
}
GLOBAL_MAP = {
    'model.vision_tower.patch_embedder.input_proj': 'v.patch_embd',
    'model.vision_tower.patch_embedder.position_embedding_table': 'v.position_embd',
    'model.vision_tower.std_bias': 'v.std_bias',
    'model.vision_tower.std_scale': 'v.std_scale',
    'model.embed_vision.embedding_projection': 'mm.input_projection',
    # the unified model's embedder ("# gemma4 unified"; patch_ln{bid} -> v.patch_norm.{bid})
    'model.vision_embedder.patch_dense': 'v.patch_embd',
    'model.vision_embedder.pos_embedding': 'v.position_embd',
    **{f'model.vision_embedder.patch_ln{b}': f'v.patch_norm.{b}' for b in range(128)},
}
N_BLOCK_KEYS = ['n_layers', 'num_hidden_layers', 'n_layer', 'num_layers', 'depth', 'layers', 'encoder_layers',
                'vt_num_hidden_layers']  # MmprojModel.n_block_keys


def find_param(obj, keys):  # MmprojModel._find_param
    for k in keys:
        if k in obj:
            return obj[k]
    raise SystemExit(f'could not find any of: {keys}')
# tensor_mapping.py, MODEL_ARCH.MMPROJ: the conformer's names after gemma.py:1008-1009 ("# gemma4" entries)
AUDIO_LAYER_MAP = {
    'feed_forward1.ffw_layer_1': 'ffn_up', 'feed_forward1.ffw_layer_2': 'ffn_down',
    'feed_forward1.pre_layer_norm': 'ffn_norm', 'feed_forward1.post_layer_norm': 'ffn_post_norm',
    'feed_forward2.ffw_layer_1': 'ffn_up_1', 'feed_forward2.ffw_layer_2': 'ffn_down_1',
    'feed_forward2.pre_layer_norm': 'ffn_norm_1', 'feed_forward2.post_layer_norm': 'ffn_post_norm_1',
    'self_attn.q_proj': 'attn_q', 'self_attn.k_proj': 'attn_k', 'self_attn.v_proj': 'attn_v',
    'self_attn.post': 'attn_out', 'self_attn.relative_k_proj': 'attn_k_rel', 'self_attn.per_dim_scale': 'per_dim_scale',
    'norm_pre_attn': 'attn_pre_norm', 'norm_post_attn': 'attn_post_norm', 'norm_out': 'ln2',
    'lconv1d.pre_layer_norm': 'conv_norm', 'lconv1d.conv_norm': 'norm_conv',  # swapped, as tensor_mapping.py has them
    'lconv1d.depthwise_conv1d': 'conv_dw', 'lconv1d.linear_start': 'conv_pw1', 'lconv1d.linear_end': 'conv_pw2',
}
AUDIO_GLOBAL_MAP = {
    'conformer.subsample_conv_projection.layer0.conv': 'a.conv1d.0',
    'conformer.subsample_conv_projection.layer0.norm': 'a.conv1d.0.norm',
    'conformer.subsample_conv_projection.layer1.conv': 'a.conv1d.1',
    'conformer.subsample_conv_projection.layer1.norm': 'a.conv1d.1.norm',
    'conformer.subsample_conv_projection.input_proj_linear': 'a.input_projection',
    'conformer.output_proj': 'a.pre_encode.out',
    'model.embed_audio.embedding_projection': 'mm.a.input_projection',
}
SUFFIXES = ('.weight', '.bias', '.input_max', '.input_min', '.output_max', '.output_min')  # gemma.py:1031


def map_tensor_name(name):
    """TensorNameMap.get_name with try_suffixes: the name, else the name less a suffix, mapped, suffix put back."""
    for suf in ('',) + SUFFIXES:
        if suf and not name.endswith(suf):
            continue
        base = name[:len(name) - len(suf)] if suf else name
        if base in GLOBAL_MAP:
            return GLOBAL_MAP[base] + suf
        if base in AUDIO_GLOBAL_MAP:
            return AUDIO_GLOBAL_MAP[base] + suf
        if base.startswith('conformer.layers.'):
            bid, rest = base[len('conformer.layers.'):].split('.', 1)
            if rest in AUDIO_LAYER_MAP:
                return f'a.blk.{int(bid)}.{AUDIO_LAYER_MAP[rest]}{suf}'
        pre = 'vision_model.model.layers.'
        if base.startswith(pre):
            bid, rest = base[len(pre):].split('.', 1)
            # the gemma4 entries name the clippable linears with their ".linear" module (q_proj.linear), the
            # llama4 ones without: both map to the same tensor
            rest = rest[:-len('.linear')] if rest.endswith('.linear') else rest
            if rest in LAYER_MAP:
                return f'v.blk.{int(bid)}.{LAYER_MAP[rest]}{suf}'
    raise SystemExit(f'Can not map tensor {name!r}')  # map_tensor_name raises too


def softplus(x):  # torch.nn.functional.softplus (beta 1, threshold 20) in float32
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20)))).astype(np.float32)


def convert(model_dir, out, outtype, broken):
    cfg = json.load(open(f'{model_dir}/config.json'))
    # MmprojModel.__init__ (base.py:2578-2604): preprocessor_config.json, then processor_config.json with its
    # image_processor moved to the top level, merged
    pre = {}
    for fname in ('preprocessor_config.json', 'processor_config.json'):
        if os.path.exists(f'{model_dir}/{fname}'):
            c = json.load(open(f'{model_dir}/{fname}'))
            pre.update({**c, **c.get('image_processor', {})} if fname == 'processor_config.json' else c)
    # Gemma4UnifiedVisionAudioModel (gemma.py:1035-1083), registered for Gemma4UnifiedForConditionalGeneration
    unified = 'Gemma4UnifiedForConditionalGeneration' in cfg.get('architectures', [])
    # MmprojModel.__init__: hparams_vision / hparams_audio = global_config["vision_config"] / ["audio_config"].
    # Gemma4VisionAudioModel asserts a vision tower (gemma.py:962); the audio fixture has none, so for it this
    # writes the audio half alone, exactly as it is written beside a vision tower.
    hv = dict(cfg['vision_config']) if cfg.get('vision_config') else None
    ha = dict(cfg['audio_config']) if cfg.get('audio_config') else None
    weights = read_safetensors(f'{model_dir}/model.safetensors')
    if '--audio-from' in broken:  # a test construction: another fixture's audio tower beside this vision tower
        other = broken['--audio-from']
        ha = dict(json.load(open(f'{other}/config.json'))['audio_config'])
        weights.update({k: v for k, v in read_safetensors(f'{other}/model.safetensors').items()
                        if 'audio_tower' in k or 'embed_audio' in k})
    if hv:
        hv['image_size'] = 224  # gemma.py:963 "unused, but set to avoid error"
    if ha:  # gemma.py:966-969
        ha['feat_in'] = ha.get('input_feat_size', 128)
        if 'hidden_size' in ha:
            ha['intermediate_size'] = ha['hidden_size'] * 4
    if unified:  # gemma.py:1040-1050: a transformer-less tower
        hv['hidden_size'] = hv['mm_embed_dim']
        ha['hidden_size'] = ha['audio_embed_dim']
        for h in (hv, ha):
            h['intermediate_size'] = h['num_layers'] = h['num_attention_heads'] = 0
    text = {**cfg, **cfg.get('text_config', {})}
    n_embd_text = text.get('hidden_size', text.get('n_embd', 0))  # base.py:2549-2550
    f16 = outtype == 'f16'
    kvs = [
        ('general.architecture', STR, 'clip'),   # MODEL_ARCH.MMPROJ -> "clip" (constants.py)
        ('general.type', STR, 'mmproj'),         # MmprojModel.set_type
        ('general.name', STR, 'Gemma4 fixture'),
        ('general.file_type', U32, {'f32': 0, 'f16': 1, 'q8_0': 7}[outtype]),  # LlamaFileType ALL_F32, MOSTLY_F16, MOSTLY_Q8_0
    ]
    if hv:  # MmprojModel.set_gguf_parameters (base.py:2643-2661)
        kvs += [
            ('clip.has_vision_encoder', BOOL, True),
            ('clip.vision.projection_dim', U32, int(broken.get('--projection-dim', n_embd_text))),
            ('clip.vision.image_size', U32, hv['image_size']),
            ('clip.vision.patch_size', U32, hv['patch_size']),
            ('clip.vision.embedding_length', U32, hv['hidden_size']),
            ('clip.vision.feed_forward_length', U32, hv['intermediate_size']),
            ('clip.vision.block_count', U32, find_param(hv, N_BLOCK_KEYS)),
            ('clip.vision.attention.head_count', U32, hv['num_attention_heads']),
            ('clip.vision.image_mean', ARR, (F32, pre['image_mean'])),
            ('clip.vision.image_std', ARR, (F32, pre['image_std'])),
        ]
    if ha:  # base.py:2663-2671
        kvs += [
            ('clip.has_audio_encoder', BOOL, True),
            ('clip.audio.projection_dim', U32, int(broken.get('--projection-dim', n_embd_text))),
            ('clip.audio.embedding_length', U32, ha['hidden_size']),
            ('clip.audio.feed_forward_length', U32, ha['intermediate_size']),
            ('clip.audio.block_count', U32, find_param(ha, N_BLOCK_KEYS)),
            ('clip.audio.attention.head_count', U32, ha['num_attention_heads']),
        ]
    if hv:
        # Gemma4VisionAudioModel.set_gguf_parameters (gemma.py:978-979): the eps is read from "layer_norm_eps",
        # which Gemma 4's vision_config does not have: always 1e-6 (its rms_norm_eps in released configs)
        # gemma.py:1053-1055: the unified model's types overwrite these in place (gguf_writer.add_key_value)
        kvs += [('clip.vision.projector_type', STR, broken.get('--projector', 'gemma4uv' if unified else 'gemma4v')),
                ('clip.vision.attention.layer_norm_epsilon', F32, hv.get('layer_norm_eps', 1e-6))]
    if ha:  # gemma.py:982-986
        kvs += [('clip.audio.projector_type', STR, broken.get('--audio-projector', 'gemma4ua' if unified else 'gemma4a')),
                ('clip.audio.num_mel_bins', U32, ha['feat_in']),
                ('clip.audio.attention.layer_norm_epsilon', F32, ha.get('layer_norm_eps', 1e-6))]
    tensors = []
    for name, x in weights.items():
        if 'language_model.' in name:  # MmprojModel.filter_tensors :2613
            continue
        hf = name
        audio = 'audio_tower' in name or 'embed_audio' in name  # is_audio_tensor, gemma.py:988-989
        if (audio and not ha) or (not audio and not hv):
            continue
        x = np.asarray(x, np.float32)
        if unified:  # gemma.py:1057-1083, before Gemma4VisionAudioModel.modify_tensors
            if name.endswith('pos_embedding'):
                name += '.weight'
                x = x.transpose(1, 0, 2)
            elif '.pos_norm.' in name:
                name = name.replace('.pos_norm.', '.patch_ln3.')
            elif 'patch_dense.weight' in name or 'patch_ln1.weight' in name or 'patch_ln1.bias' in name:
                # the columns in ggml's im2col order (channel, row, column): perm[i] = the HWC index of CHW i
                p = hv.get('model_patch_size', hv['patch_size'] * hv['pooling_kernel_size'])
                i = np.arange(p * p * 3)
                ch, row, col = i // (p * p), (i % (p * p)) // p, i % p
                perm = row * p * 3 + col * 3 + ch
                if '--skip-permute' not in broken:
                    x = x[:, perm] if 'patch_dense' in name else x[perm]
        if x.ndim == 0:  # gemma.py:1002-1004: scalars (input/output min/max) become 1-D
            x = x.reshape(1)
        if audio:  # gemma.py:1006-1017 (the audio branch)
            name = name.replace('model.audio_tower.', 'conformer.')
            name = name.replace('.linear.', '.')
            if name.endswith('per_dim_key_scale') or name.endswith('per_dim_scale'):
                name = name + '.weight'
                if '--skip-softplus' not in broken:
                    x = softplus(x)
            if 'lconv1d.depthwise_conv1d' in name and name.endswith('.weight'):
                assert x.shape[1] == 1
                x = x.reshape(x.shape[0], x.shape[2])
        else:  # gemma.py:1020-1028 (the vision branch)
            name = name.replace('model.vision_tower.encoder.', 'vision_model.model.')
            name = name.replace('.linear.weight', '.weight')
            if name.endswith('layer_scalar') or name.endswith('position_embedding_table'):
                name = name + '.weight'
        if name.endswith('patch_embedder.input_proj.weight'):
            n_embd, ksize_sq_c = x.shape
            p = int((ksize_sq_c // 3) ** 0.5)
            x = x.reshape(n_embd, p, p, 3).transpose(0, 3, 1, 2)
            if '--skip-permute' in broken:  # the HF bytes under the converted shape
                x = x.transpose(0, 2, 3, 1).reshape(n_embd, 3, p, p)
        new = map_tensor_name(name)
        # the tensor's type: prepare_tensors :1045-1110
        force = None
        if audio and ('.conv' in hf or '_conv' in hf and '.weight' in hf):  # tensor_force_quant :992-994 (HF name)
            force = GGML_F32
        elif 'position_embedding_table' in hf:  # Gemma4 tensor_force_quant :995-996
            force = GGML_F32
        elif '.patch_embd.weight' in new:  # MmprojModel.tensor_force_quant :2696-2697
            force = GGML_F16 if f16 else GGML_F32
        if x.ndim <= 1 or new.endswith('_norm.weight'):  # :1048-1049
            force = GGML_F32
        # :1053-1083: the position tables (V_ENC_EMBD_POS: the unified model's v.position_embd, which its
        # tensor_force_quant leaves alone) and names not ending in .weight stay F32
        if force is None and (new == 'v.position_embd.weight' or not new.endswith(('.weight', '.lora_a', '.lora_b'))):
            force = GGML_F32
        if force is None:  # :1103-1131: no override, the file type's; Q8_0 where the rows are whole blocks, else F16
            force = {'f16': GGML_F16, 'f32': GGML_F32, 'q8_0': GGML_Q8_0}[outtype]
            if force == GGML_Q8_0 and x.shape[-1] % 32:
                force = GGML_F16
        if new == broken.get('--omit-tensor'):
            continue
        if new == broken.get('--shrink'):
            x = x[:-1]
        tensors.append((new, Q8_0(x) if force == GGML_Q8_0 else x.astype(np.float16 if force == GGML_F16 else np.float32)))
    kvs = [kv for kv in kvs if kv[0] != broken.get('--omit-key')]
    write_gguf(out, kvs, tensors)


# ------------------------------------------------------------------ a vocabulary for a text GGUF
def read_gguf(path):
    buf = open(path, 'rb').read()
    pos = [0]

    def take(k):
        pos[0] += k
        return buf[pos[0] - k:pos[0]]

    def u32():
        return struct.unpack('<I', take(4))[0]

    def u64():
        return struct.unpack('<Q', take(8))[0]

    sizes = {U8: 1, I8: 1, U16: 2, I16: 2, U32: 4, I32: 4, F32: 4, BOOL: 1, U64: 8, I64: 8, F64: 8}

    def skip(t):
        if t in sizes:
            take(sizes[t])
        elif t == STR:
            take(u64())
        else:
            et, n = u32(), u64()
            for _ in range(n):
                skip(et)

    assert take(4) == b'GGUF'
    _, nt, nkv = u32(), u64(), u64()
    kvs = []
    for _ in range(nkv):
        a = pos[0]
        take(u64())
        skip(u32())
        kvs.append(buf[a:pos[0]])
    infos = []
    for _ in range(nt):
        a = pos[0]
        take(u64())
        take(8 * u32())
        take(12)
        infos.append(buf[a:pos[0]])
    data = buf[(pos[0] + ALIGN - 1) // ALIGN * ALIGN:]
    return kvs, infos, data


def add_vocab(src, out, model_dir):
    cfg = json.load(open(f'{model_dir}/config.json'))
    tc = cfg.get('text_config', cfg)
    n = tc['vocab_size']
    toks = [f'<unused{i}>' for i in range(n)]
    special = {0: '<pad>', 1: '<eos>', 2: '<bos>', 3: '<unk>'}
    for key, piece in (('image_token_id', '<|image|>'), ('boi_token_id', '<|image>'), ('eoi_token_id', '<image|>'),
                       ('video_token_id', '<|video|>'), ('audio_token_id', '<|audio|>'), ('boa_token_id', '<|audio>'),
                       ('eoa_token_index', '<audio|>')):
        if key in cfg:
            special[cfg[key]] = piece
    for i, p in special.items():
        toks[i] = p
    kvs, infos, data = read_gguf(src)
    # `gemma4c quantize` of a folder without tokenizer.json writes tokenizer.ggml.model "none" (as llama.cpp's
    # vocab-less files): replaced
    kvs = [kv for kv in kvs if not kv[8:8 + struct.unpack('<Q', kv[:8])[0]].startswith(b'tokenizer.')]
    extra = [kv_bytes('tokenizer.ggml.model', STR, 'gemma4'),
             kv_bytes('tokenizer.ggml.tokens', ARR, (STR, toks)),
             kv_bytes('tokenizer.ggml.scores', ARR, (F32, [-1000.0] * n)),
             kv_bytes('tokenizer.ggml.token_type', ARR, (I32, [3 if i in special else 1 for i in range(n)])),
             kv_bytes('tokenizer.ggml.merges', ARR, (STR, [])),
             kv_bytes('tokenizer.ggml.bos_token_id', U32, 2), kv_bytes('tokenizer.ggml.eos_token_id', U32, 1),
             kv_bytes('tokenizer.ggml.unknown_token_id', U32, 3), kv_bytes('tokenizer.ggml.padding_token_id', U32, 0)]
    head = b'GGUF' + struct.pack('<IQQ', 3, len(infos), len(kvs) + len(extra)) + b''.join(kvs + extra)
    head += b''.join(infos)
    with open(out, 'wb') as f:
        f.write(head + b'\0' * pad(len(head)) + data)


# ------------------------------------------------------------------ Ollama's single file
# convert/convert_gemma4.go (ollama/ollama): the towers go into the model file beside the decoder, named by
# Replacements() through Go's strings.NewReplacer (left to right; at each position the first pair, in argument
# order, whose old string matches), then renamed again in Tensors(); keys gemma4.vision.* / gemma4.audio.* (KV()).
OLLAMA_REPLACEMENTS = [
    '.linear.weight', '.weight', '.linear.bias', '.bias',
    'model.audio_tower.subsample_conv_projection.layer0.conv', 'a.conv1d.0',
    'model.audio_tower.subsample_conv_projection.layer0.norm', 'a.conv1d.0.norm',
    'model.audio_tower.subsample_conv_projection.layer1.conv', 'a.conv1d.1',
    'model.audio_tower.subsample_conv_projection.layer1.norm', 'a.conv1d.1.norm',
    'model.audio_tower.subsample_conv_projection.input_proj_linear', 'a.pre_encode.out',
    'model.audio_tower.layers', 'a.blk',
    'self_attn.relative_k_proj', 'linear_pos', 'self_attn.per_dim_scale', 'per_dim_scale',
    'self_attn.q_proj', 'attn_q', 'self_attn.k_proj', 'attn_k', 'self_attn.v_proj', 'attn_v',
    'norm_post_attn', 'ln2', 'norm_pre_attn', 'ln1', 'self_attn.post', 'attn_out',
    'feed_forward1.pre_layer_norm', 'ffn_norm', 'feed_forward1.post_layer_norm', 'ffn_post_norm',
    'feed_forward1.ffw_layer_1', 'ffn_up', 'feed_forward1.ffw_layer_2', 'ffn_down',
    'feed_forward2.pre_layer_norm', 'ffn_norm_1', 'feed_forward2.post_layer_norm', 'ffn_post_norm_1',
    'feed_forward2.ffw_layer_1', 'ffn_up_1', 'feed_forward2.ffw_layer_2', 'ffn_down_1',
    'lconv1d.depthwise_conv1d', 'conv_dw', 'lconv1d.pre_layer_norm', 'conv_norm', 'lconv1d.conv_norm', 'norm_conv',
    'lconv1d.linear_start', 'conv_pw1', 'lconv1d.linear_end', 'conv_pw2',
    'norm_out', 'layer_pre_norm',
    'model.embed_audio.embedding_projection', 'mm.a.input_projection', 'model.audio_tower.output_proj', 'mm.a.fc',
    'model.vision_tower.encoder.layers', 'v.blk', 'model.vision_tower.patch_embedder.input_proj', 'v.patch_embd',
    'model.vision_tower.patch_embedder.position_embedding_table', 'v.position_embd.weight',
    'model.vision_tower.std_bias', 'v.std_bias', 'model.vision_tower.std_scale', 'v.std_scale',
    'model.embed_vision.embedding_projection', 'mm.input_projection',
    'input_layernorm', 'attn_norm', 'self_attn.q_proj', 'attn_q', 'self_attn.q_norm', 'attn_q_norm',
    'self_attn.k_proj', 'attn_k', 'self_attn.k_norm', 'attn_k_norm', 'self_attn.v_proj', 'attn_v',
    'self_attn.o_proj', 'attn_output', 'mlp.gate_proj', 'ffn_gate', 'mlp.down_proj', 'ffn_down', 'mlp.up_proj', 'ffn_up',
    'post_attention_layernorm', 'post_attention_norm', 'pre_feedforward_layernorm', 'ffn_norm',
    'post_feedforward_layernorm', 'post_ffw_norm', 'layer_scalar', 'layer_output_scale.weight',
]  # (the text model's and MoE pairs, which no tower name holds, are left out)


def go_replace(name, pairs=OLLAMA_REPLACEMENTS):
    out, i = '', 0
    while i < len(name):
        for k in range(0, len(pairs), 2):
            if name.startswith(pairs[k], i):
                out += pairs[k + 1]
                i += len(pairs[k])
                break
        else:
            out += name[i]
            i += 1
    return out


def ollama(model_dir, text_gguf, out):
    cfg = json.load(open(f'{model_dir}/config.json'))
    weights = read_safetensors(f'{model_dir}/model.safetensors')
    kvs, infos, data = read_gguf(text_gguf)
    # Ollama's tokenizer keys (KV(): model "llama", pre "gemma4")
    name_of = lambda kv: kv[8:8 + struct.unpack('<Q', kv[:8])[0]]
    kvs = [kv for kv in kvs if name_of(kv) not in (b'tokenizer.ggml.model', b'tokenizer.ggml.pre')]
    extra = [('tokenizer.ggml.model', STR, 'llama'), ('tokenizer.ggml.pre', STR, 'gemma4')]
    vc, ac = cfg.get('vision_config') or {}, cfg.get('audio_config') or {}
    if vc.get('num_hidden_layers', 0) > 0:
        extra += [('gemma4.vision.block_count', U32, vc['num_hidden_layers']),
                  ('gemma4.vision.embedding_length', U32, vc['hidden_size']),
                  ('gemma4.vision.attention.head_count', U32, vc['num_attention_heads']),
                  ('gemma4.vision.feed_forward_length', U32, vc['intermediate_size']),
                  ('gemma4.vision.patch_size', U32, vc['patch_size']),
                  ('gemma4.vision.num_channels', U32, vc.get('num_channels') or 3),
                  ('gemma4.vision.projector.scale_factor', U32, vc.get('pooling_kernel_size') or 3),
                  ('gemma4.vision.attention.layer_norm_epsilon', F32, vc.get('layer_norm_eps') or 1e-6)]
    if ac.get('num_hidden_layers', 0) > 0:
        extra += [('gemma4.audio.block_count', U32, ac['num_hidden_layers']),
                  ('gemma4.audio.embedding_length', U32, ac['hidden_size']),
                  ('gemma4.audio.feed_forward_length', U32, ac['hidden_size'] * 4),
                  ('gemma4.audio.attention.head_count', U32, ac['num_attention_heads']),
                  ('gemma4.audio.attention.layer_norm_epsilon', F32, ac.get('rms_norm_eps') or 1e-6)]
        if ac.get('conv_kernel_size'):
            extra += [('gemma4.audio.conv_kernel_size', U32, ac['conv_kernel_size'])]
    tensors = []
    for hf, x in weights.items():
        if not any(k in hf for k in ('vision_tower', 'embed_vision', 'audio_tower', 'embed_audio')):
            continue
        x = np.asarray(x, np.float32)
        name = go_replace(hf)
        if name.startswith('v.blk.'):  # Tensors(): the published mmproj names
            for a, b in (('.attn_norm.', '.ln1.'), ('.ffn_norm.', '.ln2.'), ('.attn_output.', '.attn_out.'),
                         ('.post_attention_norm.', '.attn_post_norm.'), ('.post_ffw_norm.', '.ffn_post_norm.'),
                         ('.layer_output_scale.', '.out_scale.')):
                name = name.replace(a, b, 1)
        if name.startswith('a.blk.') and name.endswith('per_dim_scale'):  # softplusRepacker: log(1 + exp(x))
            name += '.weight'
            x = np.log1p(np.exp(x.astype(np.float64))).astype(np.float32)
        if name.startswith('a.blk.') and 'conv_dw' in name and name.endswith('.weight') and x.ndim == 3:
            x = x.reshape(x.shape[0], x.shape[2])  # squeezeMiddleDim: [C, 1, K] -> [C, K]
        if x.ndim == 0:
            x = x.reshape(1)
        if 'v.patch_embd.weight' in name and x.ndim == 2:  # reshapePatchEmbed, kept F16
            n, ksq = x.shape
            p = int(round((ksq // 3) ** 0.5))
            x = x.reshape(n, p, p, 3).transpose(0, 3, 1, 2).astype(np.float16)
        elif x.ndim >= 2 and not name.startswith('a.conv1d.'):  # matrices in a half type, audio convolutions F32
            x = x.astype(np.float16)
        tensors.append((name, x))
    head_kvs = kvs + [kv_bytes(*kv) for kv in extra]
    # the text file's tensors as they are, then the towers' after its data
    off, blobs, new_infos = len(data) + pad(len(data)), [], []
    for name, a in tensors:
        a = np.ascontiguousarray(a)
        t = GGML_F32 if a.dtype == np.float32 else GGML_F16
        new_infos.append(s_bytes(name) + struct.pack('<I', a.ndim) + b''.join(struct.pack('<Q', d) for d in a.shape[::-1])
                         + struct.pack('<IQ', t, off))
        raw = a.tobytes()
        blobs.append(raw + b'\0' * pad(len(raw)))
        off += len(blobs[-1])
    head = b'GGUF' + struct.pack('<IQQ', 3, len(infos) + len(new_infos), len(head_kvs)) + b''.join(head_kvs)
    head += b''.join(infos) + b''.join(new_infos)
    with open(out, 'wb') as f:
        f.write(head + b'\0' * pad(len(head)) + data + b'\0' * pad(len(data)) + b''.join(blobs))


def main():
    a = sys.argv[1:]
    if len(a) >= 3 and a[0] == 'mmproj':
        opts, i = {}, 3
        while i < len(a):
            if a[i] in ('--skip-permute', '--skip-softplus'):
                opts[a[i]], i = True, i + 1
            else:
                opts[a[i]], i = a[i + 1], i + 2
        convert(a[1], a[2], opts.get('--outtype', 'f16'), opts)
    elif len(a) == 4 and a[0] == 'vocab':
        add_vocab(a[1], a[2], a[3])
    elif len(a) == 4 and a[0] == 'ollama':
        ollama(a[1], a[2], a[3])
    else:
        raise SystemExit(__doc__)


if __name__ == '__main__':
    main()
