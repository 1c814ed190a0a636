#!/bin/bash
# The logits and generate commands on the fixtures, compared with the transformers
# references (a float32 KV cache, --kv f32: the GPU's default is bf16); --kv bf16 and f16 against the numpy
# reference with K and V rounded alike; bad input gives a one-line error and a non-zero exit. generate --draft (speculative decoding) on
# ../shared/fixtures/assistant: with each drafter, the 24 greedy ids and the --draft-stats line (accepted and
# drafted tokens per round) as transformers' reference.json records them; drafters as GGUF files (llama.cpp's
# gemma4-assistant); --draft-n, seeded sampling, misuse.
set -u
bin=${G4_BIN:?}; shared=${G4_SHARED_DIR:?}; tmp=${G4_TMP:-/tmp}
here=$(cd "$(dirname "$0")" && pwd)
. "$(cd "$(dirname "$0")" && pwd)/cli_check.sh" # check, expect_error

for fx in dense-ple dense-keqv moe; do
    dir=$shared/fixtures/$fx
    ids=$(python3 "$here/cli_compare.py" ids "$dir/reference.safetensors" input_ids)
    want=$(python3 "$here/cli_compare.py" ids "$dir/reference.safetensors" greedy_ids)
    "$bin" logits -m "$dir" --kv f32 --ids "$ids" -o "$tmp/$fx.f32"
    err=$(python3 "$here/cli_compare.py" logits "$dir/reference.safetensors" "$tmp/$fx.f32" 2e-3)
    check $? "$fx: logits within 2e-3 (max error $err)"
    "$bin" logits -m "$dir" --kv f32 --ids "$ids" -o - | cmp -s - "$tmp/$fx.f32"
    check $? "$fx: logits -o - writes the same bytes to standard output"
    got=$("$bin" generate -m "$dir" --kv f32 --ids "$ids" -n 24 --temp 0)
    [ "$got" = "$want" ]
    check $? "$fx: 24 greedy ids identical"
done

# --kv: the cache type reaches the context (tests/data/kv16_reference.py: the numpy reference with K and V rounded
# to the type; tolerance as test_decoder's KV16_TOL, these random fixtures' peaked attention amplifies a rounding)
dir=$shared/fixtures/dense-ple
ids=$(python3 "$here/cli_compare.py" ids "$dir/reference.safetensors" input_ids)
"${G4_PYTHON:-/usr/bin/python3}" "$here/data/kv16_reference.py" "$dir" "$tmp/kvref"
check $? "numpy reference of bf16/f16 KV caches"
for kv in bf16 f16; do
    "$bin" logits -m "$dir" --kv $kv --ids "$ids" -o "$tmp/kv-$kv.f32"
    err=$(python3 "$here/cli_compare.py" files "$tmp/kv-$kv.f32" "$tmp/kvref.$kv.f32" 1.5e-1)
    check $? "dense-ple: logits with --kv $kv within 1.5e-1 of the reference of that cache (max error $err)"
done
err=$(python3 "$here/cli_compare.py" files "$tmp/kv-bf16.f32" "$tmp/dense-ple.f32" 1e-4)
[ $? -ne 0 ]; check $? "--kv bf16 is not the f32 cache (differs by $err)"
expect_error "unknown KV cache type" "$bin" logits -m "$dir" --kv q4 --ids 2 -o "$tmp/x.f32"
expect_error "--kv without a value" "$bin" logits -m "$dir" --ids 2 -o "$tmp/x.f32" --kv

# bad input: non-zero exit, one line on stderr, nothing on stdout
expect_error "missing model folder" "$bin" logits -m "$tmp/nope" --ids 2,3 -o "$tmp/x.f32"
expect_error "malformed ids" "$bin" generate -m "$dir" --ids 2,,3
expect_error "id outside the vocabulary" "$bin" generate -m "$dir" --ids 2,512
expect_error "no ids" "$bin" logits -m "$dir" -o "$tmp/x.f32"
expect_error "unknown option" "$bin" generate -m "$dir" --ids 2 --bogus
expect_error "unknown command" "$bin" frobnicate
# --ctx above the model's max_position_embeddings (4096 here) is an error naming the limit, not capped silently,
# on every command that takes it (a context size the command picks itself is still capped)
echo '{"ids": [2, 3]}' >"$tmp/ctx.jsonl"
for c in "generate -m $dir --ids 2,3 -n 2 --ctx 5000" "embed -m $dir -f $tmp/ctx.jsonl --ctx 5000" \
         "serve -m $dir --port 0 --ctx 5000"; do
    expect_error "${c%% *} --ctx 5000" timeout 120 "$bin" $c
    grep -q -- "--ctx 5000 exceeds the model's max_position_embeddings 4096" "$tmp/err.txt"
    check $? "${c%% *} --ctx 5000: the error names the limit"
done
[ "$("$bin" generate -m "$dir" --ids 2,3 -n 2 --temp 0 --ctx 4096)" = "$("$bin" generate -m "$dir" --ids 2,3 -n 2 --temp 0)" ]
check $? "--ctx at max_position_embeddings runs"
[ -n "$("$bin" generate -m "$dir" --ids 2,3 -n 5000 --temp 0 --ignore-eos 2>/dev/null)" ]
check $? "generate --ids with -n past max_position_embeddings and no --ctx: the default context is capped"
mkdir -p "$tmp/llama"; echo '{"model_type": "llama"}' >"$tmp/llama/config.json"
expect_error "unknown model type" "$bin" generate -m "$tmp/llama" --ids 2
[ ! -e "$tmp/x.f32" ]; check $? "no output file left behind after an error"
if [ -c /dev/full ]; then
    # a failed write removes a partial output file, never what -o names that is not a regular file (the
    # link here stood for /dev/full itself, which was deleted that way when run as root)
    ln -sf /dev/full "$tmp/full.f32"
    expect_error "logits -o a full device" "$bin" logits -m "$dir" --ids 2,3 -o "$tmp/full.f32"
    [ -L "$tmp/full.f32" ]; check $? "logits -o a device that fails: the device is left where it is"
    rm -f "$tmp/full.f32"
    # standard output that cannot be written is an error, not exit 0 with the output lost
    for c in "generate -m $dir --ids 2,3 -n 2" "generate -m $dir -f $tmp/gen.jsonl -n 2"; do
        echo '{"ids": [2, 3]}' >"$tmp/gen.jsonl"
        expect_error "$c >/dev/full" sh -c '"$0" "$@" >/dev/full' "$bin" $c
    done
fi

# ---- speculative decoding (generate --draft)
dir=$shared/fixtures/assistant
ids=$(python3 "$here/cli_compare.py" ids "$dir/reference.safetensors" input_ids)
want=$(python3 "$here/cli_compare.py" ids "$dir/reference.safetensors" greedy_ids)
for v in lmhead ordered; do
    got=$("$bin" generate -m "$dir" --draft "$dir/assistant-$v" --ids "$ids" -n 24 --temp 0 --draft-stats \
          2>"$tmp/stats-$v.txt")
    [ "$got" = "$want" ]
    check $? "assistant-$v: 24 greedy ids identical"
    python3 - "$dir/reference.json" "$v" "$tmp/stats-$v.txt" <<'EOF'
import json, sys
ref = json.load(open(sys.argv[1]))["assistant"][sys.argv[2]]
lines = open(sys.argv[3]).read().splitlines()
got = json.loads(lines[-1])
ok = len(lines) == 1 and got == {"accepted_per_round": ref["accepted_per_round"],
                                 "drafts_per_round": ref["drafts_per_round"]}
print(lines[-1] if lines else "(no line)")
sys.exit(0 if ok else 1)
EOF
    check $? "assistant-$v: --draft-stats as reference.json"
done

# drafters as GGUF files in llama.cpp's gemma4-assistant layout (written by quantize): the lmhead drafter exactly
# (F32: the reference's drafts and acceptances), quantized or without the ordered drafter's masked embedding (which
# llama.cpp's converter leaves out: its drafts rank the whole vocabulary) the same greedy output
"$bin" quantize "$dir/assistant-lmhead" "$tmp/drafter-f32.gguf" --type f32 &&
    "$bin" quantize "$dir/assistant-lmhead" "$tmp/drafter-q8.gguf" --type q8_0 &&
    "$bin" quantize "$dir/assistant-ordered" "$tmp/drafter-ordered.gguf" --type bf16
check $? "quantize writes the drafters as GGUF"
"${G4_PYTHON:-/usr/bin/python3}" - "$here/data" "$tmp/drafter-ordered.gguf" <<'PY'
import struct, sys
sys.path.insert(0, sys.argv[1])
import make_mmproj as m
kvs, infos, _ = m.read_gguf(sys.argv[2])
name = lambda b: b[8:8 + struct.unpack('<Q', b[:8])[0]].decode()
keys, tensors = {name(k) for k in kvs}, {name(t) for t in infos}
arch = [k for k in kvs if name(k) == 'general.architecture'][0]
# conversion/gemma.py Gemma4AssistantModel, gguf-py constants.py: MODEL_ARCH.GEMMA4_ASSISTANT "gemma4-assistant",
# {arch}.embedding_length_out, {arch}.nextn_predict_layers, NEXTN_PROJ_PRE / POST "nextn.{pre,post}_projection"
ok = (arch.endswith(b'gemma4-assistant') and {'gemma4-assistant.embedding_length_out',
      'gemma4-assistant.nextn_predict_layers', 'gemma4-assistant.attention.shared_kv_layers'} <= keys
      and not any(k.startswith('gemma4.') for k in keys)
      and {'nextn.pre_projection.weight', 'nextn.post_projection.weight', 'token_embd.weight', 'blk.0.attn_q.weight'} <= tensors
      and not any('masked' in t or 'attn_k.' in t for t in tensors))
print(len(keys), 'keys,', len(tensors), 'tensors')
sys.exit(0 if ok else 1)
PY
check $? "the drafter GGUF has llama.cpp's gemma4-assistant keys and tensor names"
got=$("$bin" generate -m "$dir" --draft "$tmp/drafter-f32.gguf" --ids "$ids" -n 24 --temp 0 --draft-stats 2>"$tmp/stats-gguf.txt")
[ "$got" = "$want" ] && cmp -s "$tmp/stats-gguf.txt" "$tmp/stats-lmhead.txt"
check $? "--draft FILE.gguf (F32): the folder drafter's greedy ids, drafts and acceptances ($(cat "$tmp/stats-gguf.txt"))"
for f in q8 ordered; do
    got=$("$bin" generate -m "$dir" --draft "$tmp/drafter-$f.gguf" --ids "$ids" -n 24 --temp 0)
    [ "$got" = "$want" ]; check $? "--draft drafter-$f.gguf: 24 greedy ids identical"
done
expect_error "a drafter written as a folder" "$bin" quantize "$dir/assistant-lmhead" "$tmp/drafter-mlx" --type mlx8
grep -q "written as GGUF only" "$tmp/err.txt"; check $? "... says a drafter is written as GGUF"
expect_error "a drafter GGUF as main model" "$bin" generate -m "$tmp/drafter-f32.gguf" --ids 2,3 -n 4

# other draft lengths keep the greedy output; sampling with a seed repeats itself
got=$("$bin" generate -m "$dir" --draft "$dir/assistant-lmhead" --draft-n 3 --ids "$ids" -n 24 --temp 0)
[ "$got" = "$want" ]
check $? "--draft-n 3: greedy ids identical"
a=$("$bin" generate -m "$dir" --draft "$dir/assistant-ordered" --ids "$ids" -n 24 --temp 0.8 --seed 7)
b=$("$bin" generate -m "$dir" --draft "$dir/assistant-ordered" --ids "$ids" -n 24 --temp 0.8 --seed 7)
[ -n "$a" ] && [ "$a" = "$b" ]
check $? "sampling with a drafter and a seed is repeatable"

expect_error "a drafter for another model" "$bin" generate -m "$shared/fixtures/dense-ple" \
    --draft "$dir/assistant-lmhead" --ids 2,3 -n 4
expect_error "a main model as drafter" "$bin" generate -m "$dir" --draft "$shared/fixtures/dense-ple" --ids 2,3 -n 4
expect_error "a drafter as main model" "$bin" generate -m "$dir/assistant-lmhead" --ids 2,3 -n 4
expect_error "--draft-n without --draft" "$bin" generate -m "$dir" --draft-n 3 --ids 2,3 -n 4
expect_error "--draft-n 0" "$bin" generate -m "$dir" --draft "$dir/assistant-lmhead" --draft-n 0 --ids 2,3 -n 4
expect_error "--draft-n above 256" "$bin" generate -m "$dir" --draft "$dir/assistant-lmhead" --draft-n 300 \
    --ids 2,3 -n 4
exit $fail
