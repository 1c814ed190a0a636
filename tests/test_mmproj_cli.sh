#!/bin/bash
# A multimodal Gemma 4 as llama.cpp distributes it: a text GGUF and a projector file (mmproj-*.gguf, projectors
# gemma4v and gemma4a; the 12B's gemma4uv and gemma4ua), and as Ollama does (one GGUF with the towers inside). The vision, audio and unified fixtures are written in both (tests/data/make_mmproj.py: the towers as
# llama.cpp's converter writes them, F16 and F32; the text weights by `gemma4c quantize`, with a vocabulary holding
# the fixture's placeholder ids) and must give the transformers references through --mmproj, and through the one
# mmproj*.gguf beside the model without it. Broken projector files give one-line errors.
set -u
bin=${G4_BIN:?}; src=${G4_SOURCE_DIR:?}; shared=${G4_SHARED_DIR:?}; tmp=${G4_TMP:-/tmp}/mmproj_cli
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cli_check.sh" # check, expect_error
rm -rf "$tmp"; mkdir -p "$tmp"
fx=$shared/fixtures/vision
img0=$fx/image0.png; img1=$fx/image1.png
py=${G4_PYTHON:-/usr/bin/python3} # with numpy
mk() { "$py" "$src/tests/data/make_mmproj.py" "$@"; }
# a projector written broken: one line naming the problem. FIXTURE TEXT_GGUF --image|--audio FILE DESCRIPTION GREP
# MAKE_MMPROJ_OPTIONS...
bad_projector() {
    local fxd=$1 text=$2 opt=$3 media=$4 what=$5 pat=$6 cmd=encode-image; shift 6
    [ "$opt" = --audio ] && cmd=encode-audio
    mk mmproj "$fxd" "$tmp/bad.gguf" "$@" || { check 1 "$what: make_mmproj.py $*"; return; }
    expect_error "$what" "$bin" $cmd -m "$text" --mmproj "$tmp/bad.gguf" "$opt" "$media" -o "$tmp/x.f32"
    grep -q -- "$pat" "$tmp/err.txt"; check $? "$what: the message says '$pat'"
}
ref=$fx/reference.safetensors

# apart: a model file with projectors beside it would load one of them by itself (tested below)
mkdir -p "$tmp/text" "$tmp/proj"
"$bin" quantize "$fx" "$tmp/novocab.gguf" --type f32 >/dev/null 2>&1 &&
    mk vocab "$tmp/novocab.gguf" "$tmp/text/text.gguf" "$fx" &&
    mk mmproj "$fx" "$tmp/proj/mmproj-f16.gguf" && mk mmproj "$fx" "$tmp/proj/mmproj-f32.gguf" --outtype f32
check $? "the vision fixture as a text GGUF and llama.cpp projector files (F16, F32)"

# that text GGUF (an empty merges list) quantized again by gemma4c reads back (its merges key was dropped)
"$bin" quantize "$tmp/text/text.gguf" "$tmp/requant.gguf" --type q8_0 >/dev/null 2>&1 &&
    "$bin" tokenize -m "$tmp/requant.gguf" -p "a" >/dev/null 2>"$tmp/requant.txt"
check $? "a GGUF with an empty merges list quantized again reads back ($(head -c 200 "$tmp/requant.txt"))"

# the text GGUF alone has no vision tower: what follows cannot pass without the projector
expect_error "the text GGUF alone takes no image" "$bin" encode-image -m "$tmp/text/text.gguf" --image "$img0" --budget 70 \
    -o "$tmp/x.f32"

for t in f16 f32; do
    "$bin" encode-image -m "$tmp/text/text.gguf" --mmproj "$tmp/proj/mmproj-$t.gguf" --image "$img0" --image "$img1" --budget 70 \
        -o "$tmp/emb-$t.f32" 2>"$tmp/enc.txt"
    err=$(python3 "$here/cli_compare.py" rel "$ref" image_embeddings "$tmp/emb-$t.f32" 1e-3)
    check $? "encode-image --mmproj ($t): image_embeddings within 1e-3 relative (error $err)"
done
grep -q "image0.png: 60 soft tokens" "$tmp/enc.txt" && grep -q "image1.png: 66 soft tokens" "$tmp/enc.txt"
check $? "encode-image --mmproj: 60 and 66 soft tokens"

ids=$(python3 "$here/cli_compare.py" ids "$ref" input_ids)
"$bin" logits -m "$tmp/text/text.gguf" --mmproj "$tmp/proj/mmproj-f16.gguf" --ids "$ids" --image "$img0" --image "$img1" \
    --budget 70 -o "$tmp/logits.f32"
err=$(python3 "$here/cli_compare.py" logits "$ref" "$tmp/logits.f32" 2e-3)
check $? "logits --mmproj --image: the full prompt within 2e-3, image tokens bidirectional (max error $err)"
prompt=$(python3 "$here/cli_compare.py" prompt "$fx"); want=$(python3 "$here/cli_compare.py" greedy "$fx")
got=$("$bin" generate -m "$tmp/text/text.gguf" --mmproj "$tmp/proj/mmproj-f16.gguf" --ids "$prompt" --image "$img0" \
    --image "$img1" --budget 70 -n 24 --temp 0 --ignore-eos)
[ "$got" = "$want" ]; check $? "generate --mmproj --image: the 24 greedy ids of the reference ($got)"

# the converter's --outtype q8_0 (its matrices Q8_0 as gguf-py rounds them; the patch embedding F32): soft tokens
# within Q8_0's rounding of the reference (a misread block would be off by its whole size)
mk mmproj "$fx" "$tmp/proj-q8.gguf" --outtype q8_0 &&
    "$bin" encode-image -m "$tmp/text/text.gguf" --mmproj "$tmp/proj-q8.gguf" --image "$img0" --image "$img1" --budget 70 \
        -o "$tmp/emb-q8.f32" 2>/dev/null
err=$(python3 "$here/cli_compare.py" rel "$ref" image_embeddings "$tmp/emb-q8.f32" 5e-2)
check $? "encode-image --mmproj (q8_0): image_embeddings within 5e-2 relative (error $err)"

# the comparison sees the converter's permutation: the patch embedding left in HF order gives other soft tokens
mk mmproj "$fx" "$tmp/noperm.gguf" --skip-permute &&
    "$bin" encode-image -m "$tmp/text/text.gguf" --mmproj "$tmp/noperm.gguf" --image "$img0" --image "$img1" --budget 70 \
        -o "$tmp/emb-noperm.f32" 2>/dev/null
[ $? = 0 ] && ! python3 "$here/cli_compare.py" rel "$ref" image_embeddings "$tmp/emb-noperm.f32" 1e-3 >/dev/null
check $? "a projector whose patch embedding is not permuted misses the reference"

# the one mmproj*.gguf beside the model loads without --mmproj, and says so
mkdir -p "$tmp/auto" && cp "$tmp/text/text.gguf" "$tmp/auto/model-f32.gguf" && cp "$tmp/proj/mmproj-f16.gguf" "$tmp/auto/mmproj-model-f16.gguf"
"$bin" encode-image -m "$tmp/auto/model-f32.gguf" --image "$img0" --image "$img1" --budget 70 -o "$tmp/emb-auto.f32" \
    2>"$tmp/auto.txt" && cmp -s "$tmp/emb-auto.f32" "$tmp/emb-f16.f32" &&
    grep -q "warning: loaded the projector $tmp/auto/mmproj-model-f16.gguf" "$tmp/auto.txt"
check $? "the mmproj file beside the model: the same soft tokens, a line names it ($(head -1 "$tmp/auto.txt"))"
cp "$tmp/proj/mmproj-f32.gguf" "$tmp/auto/mmproj-model-f32.gguf"
"$bin" encode-image -m "$tmp/auto/model-f32.gguf" --image "$img0" --budget 70 -o "$tmp/x.f32" 2>"$tmp/two.txt"
[ $? != 0 ] && grep -q "several mmproj\*.gguf files beside" "$tmp/two.txt"
check $? "two mmproj files beside the model: neither is guessed ($(head -1 "$tmp/two.txt"))"
"$bin" encode-image -m "$tmp/auto/model-f32.gguf" --mmproj "$tmp/proj/mmproj-f16.gguf" --image "$img0" --budget 70 \
    -o "$tmp/named.f32" 2>/dev/null
check $? "two mmproj files beside the model: --mmproj names one"
# another model's projector beside the model (not asked for): the text model loads without it, a line says why
mkdir -p "$tmp/other" && cp "$tmp/text/text.gguf" "$tmp/other/model.gguf" &&
    mk mmproj "$fx" "$tmp/other/mmproj-wider.gguf" --projection-dim 256
"$bin" logits -m "$tmp/other/model.gguf" --ids 2,17,99 -o "$tmp/other.f32" 2>"$tmp/other.txt" &&
    grep -q "warning: the mmproj file beside the model is not loaded: $tmp/other/mmproj-wider.gguf: the projector maps to 256-wide" "$tmp/other.txt"
check $? "another model's projector beside the model: text only, with a warning ($(head -1 "$tmp/other.txt"))"
expect_error "... and named with --mmproj: an error" "$bin" logits -m "$tmp/other/model.gguf" \
    --mmproj "$tmp/other/mmproj-wider.gguf" --ids 2,17,99 -o "$tmp/x.f32"

# the audio fixture: its conformer as the converter writes it (no vision tower: the converter would refuse the
# fixture, so make_mmproj.py writes the audio half alone)
afx=$shared/fixtures/audio wav=$shared/fixtures/audio/audio0.wav aref=$shared/fixtures/audio/reference.safetensors
mkdir -p "$tmp/atext" "$tmp/aproj"
"$bin" quantize "$afx" "$tmp/anovocab.gguf" --type f32 >/dev/null 2>&1 &&
    mk vocab "$tmp/anovocab.gguf" "$tmp/atext/text.gguf" "$afx" && mk mmproj "$afx" "$tmp/aproj/mmproj-f16.gguf"
check $? "the audio fixture as a text GGUF and a llama.cpp projector file"
expect_error "the text GGUF alone takes no audio" "$bin" encode-audio -m "$tmp/atext/text.gguf" --audio "$wav" -o "$tmp/x.f32"
"$bin" encode-audio -m "$tmp/atext/text.gguf" --mmproj "$tmp/aproj/mmproj-f16.gguf" --audio "$wav" -o "$tmp/aemb.f32" >/dev/null
err=$(python3 "$here/cli_compare.py" rel "$aref" audio_embeddings "$tmp/aemb.f32" 1e-3)
check $? "encode-audio --mmproj: audio_embeddings within 1e-3 relative (error $err)"
ids=$(python3 "$here/cli_compare.py" ids "$aref" input_ids)
"$bin" logits -m "$tmp/atext/text.gguf" --mmproj "$tmp/aproj/mmproj-f16.gguf" --ids "$ids" --audio "$wav" -o "$tmp/alogits.f32"
err=$(python3 "$here/cli_compare.py" logits "$aref" "$tmp/alogits.f32" 2e-3)
check $? "logits --mmproj --audio: within 2e-3 (max error $err)"
prompt=$(python3 "$here/cli_compare.py" prompt "$afx"); want=$(python3 "$here/cli_compare.py" greedy "$afx")
got=$("$bin" generate -m "$tmp/atext/text.gguf" --mmproj "$tmp/aproj/mmproj-f16.gguf" --ids "$prompt" --audio "$wav" -n 24 \
    --temp 0 --ignore-eos)
[ "$got" = "$want" ]; check $? "generate --mmproj --audio: the 24 greedy ids of the reference ($got)"
mk mmproj "$afx" "$tmp/aproj-q8.gguf" --outtype q8_0 &&
    "$bin" encode-audio -m "$tmp/atext/text.gguf" --mmproj "$tmp/aproj-q8.gguf" --audio "$wav" -o "$tmp/aemb-q8.f32" >/dev/null
err=$(python3 "$here/cli_compare.py" rel "$aref" audio_embeddings "$tmp/aemb-q8.f32" 5e-2)
check $? "encode-audio --mmproj (q8_0): audio_embeddings within 5e-2 relative (error $err)"
# the comparison sees the converter's softplus of per_dim_scale
mk mmproj "$afx" "$tmp/nosoftplus.gguf" --skip-softplus &&
    "$bin" encode-audio -m "$tmp/atext/text.gguf" --mmproj "$tmp/nosoftplus.gguf" --audio "$wav" -o "$tmp/aemb-x.f32" >/dev/null
[ $? = 0 ] && ! python3 "$here/cli_compare.py" rel "$aref" audio_embeddings "$tmp/aemb-x.f32" 1e-3 >/dev/null
check $? "a projector whose per_dim_scale is not softplus'd misses the reference"
abad() { bad_projector "$afx" "$tmp/atext/text.gguf" --audio "$wav" "$@"; }
abad "another audio projector type" 'audio projector type "ultravox" is not Gemma 4' --audio-projector ultravox
abad "no mel bins" "has no clip.audio.num_mel_bins" --omit-key clip.audio.num_mel_bins
abad "no subsampling convolution" "has no a.conv1d.1.weight" --omit-tensor a.conv1d.1.weight
abad "another model's audio projector" "audio projector maps to 256-wide embeddings" --projection-dim 256
abad "a relative key projection of the wrong shape" "self_attn.relative_k_proj.weight' has shape \[63, 64\]" \
    --shrink a.blk.1.attn_k_rel.weight
# one file with both towers (as E2B/E4B's): the vision fixture's and the audio fixture's (whose embed_audio also
# projects to 128): each gives its own reference soft tokens through the vision fixture's text model
mk mmproj "$fx" "$tmp/both.gguf" --audio-from "$afx" &&
    "$bin" encode-image -m "$tmp/text/text.gguf" --mmproj "$tmp/both.gguf" --image "$img0" --image "$img1" --budget 70 \
        -o "$tmp/both-img.f32" 2>/dev/null &&
    "$bin" encode-audio -m "$tmp/text/text.gguf" --mmproj "$tmp/both.gguf" --audio "$wav" -o "$tmp/both-aud.f32" >/dev/null &&
    python3 "$here/cli_compare.py" rel "$ref" image_embeddings "$tmp/both-img.f32" 1e-3 >/dev/null &&
    python3 "$here/cli_compare.py" rel "$aref" audio_embeddings "$tmp/both-aud.f32" 1e-3 >/dev/null
check $? "a projector with both towers: image and audio soft tokens of the references"
rm -f "$tmp/x.f32"

# Ollama's single file (convert/convert_gemma4.go): the towers inside the model file, keys gemma4.vision.* and
# gemma4.audio.*, the audio tensors partly under Ollama's own names; no projector file
mkdir -p "$tmp/ollama" && mk ollama "$fx" "$tmp/text/text.gguf" "$tmp/ollama/vision.gguf" &&
    mk ollama "$afx" "$tmp/atext/text.gguf" "$tmp/ollama/audio.gguf"
check $? "the vision and audio fixtures as Ollama writes a Gemma 4 model (one GGUF with the towers)"
"$bin" encode-image -m "$tmp/ollama/vision.gguf" --image "$img0" --image "$img1" --budget 70 -o "$tmp/ol-img.f32" 2>/dev/null
err=$(python3 "$here/cli_compare.py" rel "$ref" image_embeddings "$tmp/ol-img.f32" 1e-3)
check $? "Ollama's file: image_embeddings within 1e-3 relative (error $err)"
ids=$(python3 "$here/cli_compare.py" ids "$ref" input_ids)
"$bin" logits -m "$tmp/ollama/vision.gguf" --ids "$ids" --image "$img0" --image "$img1" --budget 70 -o "$tmp/ol-logits.f32"
err=$(python3 "$here/cli_compare.py" logits "$ref" "$tmp/ol-logits.f32" 2e-3)
check $? "Ollama's file: logits of the full prompt with two images within 2e-3 (max error $err)"
"$bin" encode-audio -m "$tmp/ollama/audio.gguf" --audio "$wav" -o "$tmp/ol-aud.f32" >/dev/null
err=$(python3 "$here/cli_compare.py" rel "$aref" audio_embeddings "$tmp/ol-aud.f32" 1e-3)
check $? "Ollama's file: audio_embeddings within 1e-3 relative (error $err)"
prompt=$(python3 "$here/cli_compare.py" prompt "$afx"); want=$(python3 "$here/cli_compare.py" greedy "$afx")
got=$("$bin" generate -m "$tmp/ollama/audio.gguf" --ids "$prompt" --audio "$wav" -n 24 --temp 0 --ignore-eos)
[ "$got" = "$want" ]; check $? "Ollama's file: generate --audio gives the 24 greedy ids of the reference ($got)"
"$py" - "$tmp/ollama/audio.gguf" "$tmp/ollama/broken.gguf" <<'PY'
import sys
b = open(sys.argv[1], 'rb').read()
k = b'gemma4.audio.attention.layer_norm_epsilon'
assert b.count(k) == 1
open(sys.argv[2], 'wb').write(b.replace(k, b'gemma4.audio.attention.layer_norm_epsilox'))
PY
expect_error "Ollama's file without its audio eps" "$bin" encode-audio -m "$tmp/ollama/broken.gguf" --audio "$wav" -o "$tmp/x.f32"
grep -q "has no gemma4.audio.attention.layer_norm_epsilon" "$tmp/err.txt"; check $? "... and says which key"

# the 12B (gemma4_unified) as llama.cpp converts it: a text GGUF and a projector of the encoder-free embedders
# (gemma4uv + gemma4ua: the converter's pixel order in patch_dense and patch_ln1, the position table's axes swapped)
ufx=$shared/fixtures/unified uref=$shared/fixtures/unified/reference.safetensors
uimg0=$ufx/image0.png uimg1=$ufx/image1.png uwav=$ufx/audio0.wav
mkdir -p "$tmp/utext" "$tmp/uproj"
"$bin" quantize "$ufx" "$tmp/unovocab.gguf" --type f32 >/dev/null 2>&1 &&
    mk vocab "$tmp/unovocab.gguf" "$tmp/utext/text.gguf" "$ufx" && mk mmproj "$ufx" "$tmp/uproj/mmproj-f16.gguf" &&
    mk mmproj "$ufx" "$tmp/uproj/mmproj-f32.gguf" --outtype f32
check $? "the unified fixture as a text GGUF and llama.cpp projector files (gemma4uv + gemma4ua, F16 and F32)"
expect_error "the unified text GGUF alone takes no image" "$bin" encode-image -m "$tmp/utext/text.gguf" --image "$uimg0" \
    -o "$tmp/x.f32"
for t in f16 f32; do
    "$bin" encode-image -m "$tmp/utext/text.gguf" --mmproj "$tmp/uproj/mmproj-$t.gguf" --image "$uimg0" --image "$uimg1" \
        --budget 70 -o "$tmp/uemb-$t.f32" 2>"$tmp/uenc.txt"
    err=$(python3 "$here/cli_compare.py" rel "$uref" image_embeddings "$tmp/uemb-$t.f32" 1e-3)
    check $? "unified encode-image --mmproj ($t): image_embeddings within 1e-3 relative (error $err)"
done
grep -q "image0.png: 60 soft tokens" "$tmp/uenc.txt" && grep -q "image1.png: 66 soft tokens" "$tmp/uenc.txt"
check $? "unified encode-image --mmproj: 60 and 66 soft tokens (48-px blocks)"
"$bin" encode-audio -m "$tmp/utext/text.gguf" --mmproj "$tmp/uproj/mmproj-f16.gguf" --audio "$uwav" -o "$tmp/uaud.f32" >/dev/null
err=$(python3 "$here/cli_compare.py" rel "$uref" audio_embeddings "$tmp/uaud.f32" 1e-3)
check $? "unified encode-audio --mmproj: audio_embeddings within 1e-3 relative (error $err)"
ids=$(python3 "$here/cli_compare.py" ids "$uref" input_ids)
"$bin" logits -m "$tmp/utext/text.gguf" --mmproj "$tmp/uproj/mmproj-f16.gguf" --ids "$ids" --image "$uimg0" --image "$uimg1" \
    --audio "$uwav" --budget 70 -o "$tmp/ulogits.f32"
err=$(python3 "$here/cli_compare.py" logits "$uref" "$tmp/ulogits.f32" 2e-3)
check $? "unified logits --mmproj --image --image --audio: the full prompt within 2e-3, images bidirectional (max error $err)"
prompt=$(python3 "$here/cli_compare.py" prompt "$ufx"); want=$(python3 "$here/cli_compare.py" greedy "$ufx")
got=$("$bin" generate -m "$tmp/utext/text.gguf" --mmproj "$tmp/uproj/mmproj-f16.gguf" --ids "$prompt" --image "$uimg0" \
    --image "$uimg1" --audio "$uwav" --budget 70 -n 24 --temp 0 --ignore-eos)
[ "$got" = "$want" ]; check $? "unified generate --mmproj: the 24 greedy ids of the reference ($got)"
mk mmproj "$ufx" "$tmp/uproj-q8.gguf" --outtype q8_0 &&
    "$bin" encode-image -m "$tmp/utext/text.gguf" --mmproj "$tmp/uproj-q8.gguf" --image "$uimg0" --image "$uimg1" \
        --budget 70 -o "$tmp/uemb-q8.f32" 2>/dev/null &&
    "$bin" encode-audio -m "$tmp/utext/text.gguf" --mmproj "$tmp/uproj-q8.gguf" --audio "$uwav" -o "$tmp/uaud-q8.f32" >/dev/null
ei=$(python3 "$here/cli_compare.py" rel "$uref" image_embeddings "$tmp/uemb-q8.f32" 5e-2) &&
    ea=$(python3 "$here/cli_compare.py" rel "$uref" audio_embeddings "$tmp/uaud-q8.f32" 5e-2)
check $? "unified --mmproj (q8_0): image and audio soft tokens within 5e-2 relative (errors ${ei:-?}, ${ea:-?})"
mk mmproj "$ufx" "$tmp/unoperm.gguf" --skip-permute &&
    "$bin" encode-image -m "$tmp/utext/text.gguf" --mmproj "$tmp/unoperm.gguf" --image "$uimg0" --image "$uimg1" --budget 70 \
        -o "$tmp/uemb-noperm.f32" 2>/dev/null
[ $? = 0 ] && ! python3 "$here/cli_compare.py" rel "$uref" image_embeddings "$tmp/uemb-noperm.f32" 1e-3 >/dev/null
check $? "a unified projector whose patch_dense and patch_ln1 keep the HF pixel order misses the reference"
mkdir -p "$tmp/uauto" && cp "$tmp/utext/text.gguf" "$tmp/uauto/model.gguf" && cp "$tmp/uproj/mmproj-f16.gguf" "$tmp/uauto/mmproj-model-f16.gguf"
"$bin" encode-audio -m "$tmp/uauto/model.gguf" --audio "$uwav" -o "$tmp/uaud-auto.f32" >/dev/null 2>&1 &&
    cmp -s "$tmp/uaud-auto.f32" "$tmp/uaud.f32"
check $? "the unified projector beside the model loads by itself"
ubad() { bad_projector "$ufx" "$tmp/utext/text.gguf" --image "$uimg0" "$@"; }
ubad "a unified vision half with gemma4a audio" 'holds the image and the audio embedder' --audio-projector gemma4a
ubad "a unified projector without its position table" "has no v.position_embd.weight" --omit-tensor v.position_embd.weight
ubad "a unified projector without the audio projection" "missing: model.embed_audio.embedding_projection.weight" \
    --omit-tensor mm.a.input_projection.weight
ubad "a unified projector of another model" "maps to 256-wide embeddings, the text model's hidden size is 128" \
    --projection-dim 256
ubad "a unified patch embedding of the wrong shape" "v.patch_embd.weight has shape \[127, 6912\], expected \[128, 6912\]" \
    --shrink v.patch_embd.weight
ubad "a unified patch_ln1 of the wrong length" "v.patch_norm.1.weight has shape \[6911\], expected \[6912\]" \
    --shrink v.patch_norm.1.weight
ubad "no vision patch size" "has no clip.vision.patch_size" --omit-key clip.vision.patch_size

# broken projector files and wrong pairings: one line each
bad() { bad_projector "$fx" "$tmp/text/text.gguf" --image "$img0" "$@"; }
bad "another projector type" 'projector type "gemma3" is not Gemma 4' --projector gemma3
bad "a unified projector type on a gemma4v tower" 'holds the image and the audio embedder' --projector gemma4uv
bad "no embedding_length" "has no clip.vision.embedding_length" --omit-key clip.vision.embedding_length
bad "no layer_norm_epsilon" "has no clip.vision.attention.layer_norm_epsilon" --omit-key clip.vision.attention.layer_norm_epsilon
bad "no projector type" "has no clip.vision.projector_type" --omit-key clip.vision.projector_type
bad "another model's projector" "maps to 256-wide embeddings, the text model's hidden size is 128" --projection-dim 256
bad "no position table" "has no v.position_embd.weight" --omit-tensor v.position_embd.weight
bad "a missing layer tensor" "missing: model.vision_tower.encoder.layers.1.self_attn.k_proj.linear.weight" \
    --omit-tensor v.blk.1.attn_k.weight
bad "a query projection of the wrong shape" "has shape \[63, 64\], the config implies \[64, 64\]" --shrink v.blk.0.attn_q.weight
bad "a patch embedding of the wrong shape" "v.patch_embd.weight has shape \[63, 3, 16, 16\]" --shrink v.patch_embd.weight
expect_error "a text GGUF as the projector" "$bin" encode-image -m "$tmp/text/text.gguf" --mmproj "$tmp/text/text.gguf" \
    --image "$img0" -o "$tmp/x.f32"
grep -q 'not an mmproj file (general.architecture is "gemma4"' "$tmp/err.txt"; check $? "a text GGUF as the projector: says so"
expect_error "a projector file that does not exist" "$bin" encode-image -m "$tmp/text/text.gguf" --mmproj "$tmp/nope.gguf" \
    --image "$img0" -o "$tmp/x.f32"
printf 'not a gguf\n' >"$tmp/mmproj-text.txt"
expect_error "a projector file that is not GGUF" "$bin" encode-image -m "$tmp/text/text.gguf" --mmproj "$tmp/mmproj-text.txt" \
    --image "$img0" -o "$tmp/x.f32"
expect_error "a projector with a safetensors folder" "$bin" encode-image -m "$fx" --mmproj "$tmp/proj/mmproj-f16.gguf" \
    --image "$img0" -o "$tmp/x.f32"
grep -q "goes with a GGUF model" "$tmp/err.txt"; check $? "a projector with a folder: says it goes with a GGUF model"
expect_error "--mmproj without a file" "$bin" encode-image -m "$tmp/text/text.gguf" --image "$img0" -o "$tmp/x.f32" --mmproj
[ ! -e "$tmp/x.f32" ]; check $? "no output file left behind after an error"
# serve takes --mmproj too: a broken one stops it before it listens
expect_error "serve --mmproj with a text GGUF" timeout 30 "$bin" serve -m "$tmp/text/text.gguf" --mmproj "$tmp/text/text.gguf" --port 0
grep -q "not an mmproj file" "$tmp/err.txt"; check $? "serve: the projector's error"
exit $fail
