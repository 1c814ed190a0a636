#!/bin/bash
# -m FILE.gguf and gemma4c quantize end to end on the shipped example model: a BF16 GGUF
# written by quantize (weights, tokenizer from tokenizer.json, chat template) tokenizes (its tokenizer
# cached like a tokenizer.json),
# computes logits, generates and chats exactly like the folder it came from (BF16 holds the
# same values); Q8_0 / Q4_0 / Q6_K / IQ4_XS GGUF files and MLX 4-bit folders load and
# generate; a fixture quantized to Q2_K / Q3_K / IQ4_NL / IQ4_XS gives the logits of the numpy reference run on
# its own weights decoded to F32 (tests/data/gguf_dequant_reference.py), and so do fixtures of random IQ1/IQ2/IQ3,
# TQ1_0 / TQ2_0, MXFP4 and NVFP4 blocks (types read, not written); a GGUF split by llama-gguf-split
# loads from its first shard;
# bad arguments and corrupt files fail with one line.
set -u
bin=${G4_BIN:?}; src=${G4_SOURCE_DIR:?}; tmp=${G4_TMP:-/tmp}/gguf-cli
. "$(cd "$(dirname "$0")" && pwd)/cli_check.sh" # check, expect_error

rm -rf "$tmp"; mkdir -p "$tmp"
tar -xJf "$src/models/tolstoy-tiny.tar.xz" -C "$tmp" || { echo "cannot unpack the example model"; exit 1; }
m=$tmp/tolstoy-tiny g=$tmp/tt-bf16.gguf
"$bin" quantize "$m" "$g" --type bf16; check $? "quantize to a BF16 GGUF"

text=$(printf 'Pierre said: "Natasha, \302\253\303\247a va\302\273?"\n  Then   \360\237\230\200 <|turn>user')
[ "$("$bin" tokenize -m "$m" -p "$text")" = "$("$bin" tokenize -m "$g" -p "$text")" ]
check $? "the GGUF's tokenizer gives the folder's ids"
export G4_TOKENIZER_CACHE_DIR=$tmp/tok-cache
first=$("$bin" tokenize -m "$g" -p "$text") && [ -n "$(ls "$tmp/tok-cache")" ] && second=$("$bin" tokenize -m "$g" -p "$text")
[ $? = 0 ] && [ "$first" = "$second" ] && [ "$first" = "$("$bin" tokenize -m "$m" -p "$text")" ]
check $? "the GGUF's tokenizer is cached and the cached one gives the same ids"
unset G4_TOKENIZER_CACHE_DIR

ids=$("$bin" tokenize -m "$m" -p "The old prince")
"$bin" logits -m "$m" --ids "$ids" -o "$tmp/a.f32" && "$bin" logits -m "$g" --ids "$ids" -o "$tmp/b.f32"
cmp -s "$tmp/a.f32" "$tmp/b.f32"; check $? "identical logits from the folder and the BF16 GGUF"
"${G4_PYTHON:-/usr/bin/python3}" "$src/tests/data/split_gguf.py" "$g" "$tmp/tt-split" 3 &&
    "$bin" logits -m "$tmp/tt-split-00001-of-00003.gguf" --ids "$ids" -o "$tmp/c.f32" && cmp -s "$tmp/a.f32" "$tmp/c.f32"
check $? "a GGUF split in 3 as llama-gguf-split writes it: identical logits from its first shard"
expect_error "a later shard of a split GGUF" "$bin" logits -m "$tmp/tt-split-00002-of-00003.gguf" --ids "$ids" -o "$tmp/c.f32"
grep -q "give the first one" "$tmp/err.txt"; check $? "it names the first shard"
rm -f "$tmp"/tt-split-*

a=$("$bin" run -m "$m" -p "Who is Pierre?" -n 24 --temp 0); b=$("$bin" run -m "$g" -p "Who is Pierre?" -n 24 --temp 0)
[ -n "$a" ] && [ "$a" = "$b" ]; check $? "a chat turn through the GGUF's template gives the folder's answer"
conv='{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who is Pierre?"}]}'
a=$(echo "$conv" | "$bin" template -m "$m" -f -) && b=$(echo "$conv" | "$bin" template -m "$g" -f -)
[ $? = 0 ] && [ -n "$a" ] && [ "$a" = "$b" ]; check $? "the template command renders the GGUF's template as the folder's"
# a GGUF quantized again keeps the tokenizer and template of the file (read from it again: a loaded model keeps no
# vocabulary arrays)
"$bin" quantize "$g" "$tmp/tt-again.gguf" --type q8_0 &&
    [ "$("$bin" tokenize -m "$tmp/tt-again.gguf" -p "$text")" = "$("$bin" tokenize -m "$m" -p "$text")" ] &&
    a=$(echo "$conv" | "$bin" template -m "$tmp/tt-again.gguf" -f -) && [ -n "$a" ] && [ "$a" = "$b" ]
check $? "the BF16 GGUF quantized to Q8_0: the same tokenizer ids and chat template"
rm -f "$tmp/tt-again.gguf"

# generation_config.json's suppress_tokens travel as tokenizer.ggml.suppress_tokens (where llama.cpp's converter
# writes the 12B's): the GGUF never picks the suppressed ids either, and greedy decoding matches the folder's
first=$("$bin" generate -m "$m" --ids "$ids" -n 3 --temp 0 --ignore-eos) && sup=${first%%,*} &&
    rm -rf "$tmp/sup" && cp -r "$m" "$tmp/sup" &&
    "${G4_PYTHON:-/usr/bin/python3}" -c "import json, sys; p = sys.argv[1]; c = json.load(open(p)); c['suppress_tokens'] = [int(sys.argv[2]), 5]
json.dump(c, open(p, 'w'))" "$tmp/sup/generation_config.json" "$sup" && "$bin" quantize "$tmp/sup" "$tmp/sup.gguf" --type bf16 &&
    a=$("$bin" generate -m "$tmp/sup" --ids "$ids" -n 8 --temp 0 --ignore-eos) &&
    b=$("$bin" generate -m "$tmp/sup.gguf" --ids "$ids" -n 8 --temp 0 --ignore-eos) &&
    c=$("$bin" generate -m "$g" --ids "$ids" -n 8 --temp 0 --ignore-eos)
[ $? = 0 ] && [ "$a" = "$b" ] && [ "${c%%,*}" = "$sup" ] && ! echo ",$b," | grep -q ",$sup,"
check $? "suppress_tokens [$sup, 5] in the GGUF: its greedy ids are the folder's ($b), not the unsuppressed file's ($c)"

for t in q8_0 q4_0 q6_k iq4_xs mlx4; do # (q2_k, q3_k, iq4_nl: the fixture below)
    case $t in mlx*) out=$tmp/tt-$t ;; *) out=$tmp/tt-$t.gguf ;; esac
    "$bin" quantize "$m" "$out" --type $t && got=$("$bin" generate -m "$out" --ids "$ids" -n 8 --temp 0 --ignore-eos)
    check $? "$t: quantize, load, generate ($got)"
done

# Q2_K, Q3_K, IQ4_NL, IQ4_XS on a fixture (rows of 256 elements in the type; of 128, as llama.cpp demotes rows
# that are not whole 256-blocks, in IQ4_NL; of 16 in BF16): the file's logits against the numpy reference
# (../shared/reference/numpy, checked against transformers) run on the fixture with the file's weights decoded
# to F32 by `quantize --type f32`, within the 2e-3 test_cli_decoder allows the float32 engine (measured 0.7e-4 to
# 2.9e-4; against the fixture's own reference these files are 6.9 off: the reference run is what tells). With float
# activations (G4_NO_INT8_ACT: the CPU reads Q2_K / Q3_K / IQ4_NL / IQ4_XS rows with int8 ones, 1.8 off here; test_backend_ops
# checks those products against the same rounding).
fx=$G4_SHARED_DIR/fixtures/dense-ple
fxids=$(python3 "$src/tests/cli_compare.py" ids "$fx/reference.safetensors" input_ids)
for t in q2_k q3_k iq4_nl iq4_xs; do
    "$bin" quantize "$fx" "$tmp/fx-$t.gguf" --type $t &&
        "$bin" quantize "$tmp/fx-$t.gguf" "$tmp/fx-$t-f32.gguf" --type f32 &&
        G4_NO_INT8_ACT=1 "$bin" logits -m "$tmp/fx-$t.gguf" --kv f32 --ids "$fxids" -o "$tmp/fx-$t.f32" &&
        "${G4_PYTHON:-/usr/bin/python3}" "$src/tests/data/gguf_dequant_reference.py" "$fx" "$tmp/fx-$t-f32.gguf" "$tmp/fx-$t-ref.f32" &&
        err=$(python3 "$src/tests/cli_compare.py" files "$tmp/fx-$t.f32" "$tmp/fx-$t-ref.f32" 2e-3)
    check $? "$t: the fixture's logits match the numpy reference on its decoded weights within 2e-3 (${err:-})"
    rm -f "$tmp/fx-$t-f32.gguf"
done
# The types gemma4c reads but does not write (codebook IQ1/IQ2/IQ3, ternary, FP4): the fixture's F32 GGUF with every
# matrix of whole blocks replaced by random blocks of the type (tests/data/retype_gguf.py), against the numpy
# reference on the same file decoded to F32 (the decoders themselves: test_quant against llama.cpp's gguf-py), with
# float activations (G4_NO_INT8_ACT: the values as the file holds them; with int8 activations the CPU holds them as
# CB4, Q6_K or AF8, exactly (test_quant), or Q8_0, below)
"$bin" quantize "$fx" "$tmp/fx-f32.gguf" --type f32; check $? "quantize the fixture to an F32 GGUF"
for t in iq2_xxs iq2_xs iq2_s iq3_xxs iq3_s iq1_s iq1_m tq1_0 tq2_0 mxfp4 nvfp4; do
    "${G4_PYTHON:-/usr/bin/python3}" "$src/tests/data/retype_gguf.py" "$tmp/fx-f32.gguf" "$tmp/fx-$t.gguf" $t >/dev/null &&
        "$bin" quantize "$tmp/fx-$t.gguf" "$tmp/fx-$t-f32.gguf" --type f32 &&
        G4_NO_INT8_ACT=1 "$bin" logits -m "$tmp/fx-$t.gguf" --kv f32 --ids "$fxids" -o "$tmp/fx-$t.f32" &&
        "${G4_PYTHON:-/usr/bin/python3}" "$src/tests/data/gguf_dequant_reference.py" "$fx" "$tmp/fx-$t-f32.gguf" "$tmp/fx-$t-ref.f32" &&
        err=$(python3 "$src/tests/cli_compare.py" files "$tmp/fx-$t.f32" "$tmp/fx-$t-ref.f32" 2e-3)
    check $? "$t: a fixture of random $t blocks gives the numpy reference's logits on its decoded weights (${err:-})"
    if [ $t = nvfp4 ]; then # (rows of 128, no whole CB4_16 block: re-encoded as Q8_0, with a warning; the rows of 256
                            # as CB4_16. test_backend_ops: a re-encoded weight's products are its Q8_0 rows')
        "$bin" logits -m "$tmp/fx-$t.gguf" --kv f32 --ids "$fxids" -o "$tmp/a.f32" 2>"$tmp/err" &&
            [ "$(cat "$tmp/err")" = "gemma4c: warning: the cpu backend holds the NVFP4 tensors as Q8_0 (re-encoded: 8.5 bits a weight)" ]
        check $? "nvfp4 with int8 activations: one warning line for its tensors re-encoded as Q8_0 ($(head -c 200 "$tmp/err"))"
    else # held exactly with int8 activations (CB4 / CB4_16 the rows of 256, AF8 MXFP4's of 128): no warning
        "$bin" logits -m "$tmp/fx-$t.gguf" --kv f32 --ids "$fxids" -o "$tmp/a.f32" 2>"$tmp/err" && [ ! -s "$tmp/err" ]
        check $? "$t with int8 activations: held exactly, no warning ($(head -c 200 "$tmp/err"))"
    fi
    rm -f "$tmp/fx-$t.gguf" "$tmp/fx-$t-f32.gguf"
done
# (G4_BENCH_NO_COPY: no copy bandwidth measured, 2 GB copied six times, where a check does not read it)
G4_BENCH_NO_COPY=1 "$bin" bench --random "$m/config.json" --type iq4_xs -p 4 -n 1 -r 1 >"$tmp/bench-iq4.txt"
grep -q "^decode .* GB/s" "$tmp/bench-iq4.txt"; check $? "bench --random --type iq4_xs (random rows through the reference encoders)"
# a type without an encoder: no random weights on the CPU (before: rows of whatever the allocator left)
"$bin" bench --random "$m/config.json" --type iq2_xxs -p 4 -n 1 -r 1 --device cpu >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -ne 0 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q "random values of dtype IQ2_XXS are not supported" "$tmp/err"
check $? "bench --random --type iq2_xxs on the CPU: a one-line error (rc $rc: $(head -c 200 "$tmp/err"))"

# general.file_type is llama.cpp's llama_ftype of the file's main type (llama.cpp prints it and keeps it when it
# re-quantizes; 0 would say "all F32"): bf16 32, q8_0 7, q4_0 2, q6_k 18, iq4_nl 25, iq4_xs 30, and the K-quant
# "_S" mixes q4_k 14, q5_k 16, q2_k 21 (Q2_K_S), q3_k 11
"$bin" quantize "${G4_SHARED_DIR:?}/fixtures/dense-ple" "$tmp/fx-q4_k.gguf" --type q4_k &&
    "$bin" quantize "$G4_SHARED_DIR/fixtures/dense-ple" "$tmp/fx-q5_k.gguf" --type q5_k
check $? "quantize a fixture to q4_k and q5_k"
for pair in "$g:32" "$tmp/tt-q8_0.gguf:7" "$tmp/tt-q4_0.gguf:2" "$tmp/tt-q6_k.gguf:18" "$tmp/fx-q4_k.gguf:14" "$tmp/fx-q5_k.gguf:16" \
    "$tmp/fx-q2_k.gguf:21" "$tmp/fx-q3_k.gguf:11" "$tmp/fx-iq4_nl.gguf:25" "$tmp/fx-iq4_xs.gguf:30"; do
    got=$(python3 - "${pair%:*}" <<'PY'
import mmap, struct, sys
f = open(sys.argv[1], "rb")
d = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # (the key is near the start: no need to read the file)
key = b"general.file_type"
at = d.find(struct.pack("<Q", len(key)) + key)
assert at >= 0
at += 8 + len(key)
assert struct.unpack_from("<I", d, at)[0] == 4  # GGUF uint32
print(struct.unpack_from("<I", d, at + 4)[0])
PY
)
    [ "$got" = "${pair##*:}" ]; check $? "general.file_type of $(basename "${pair%:*}") is ${pair##*:} ($got)"
done

"$bin" quantize "$m" "$tmp/x.gguf" --type q3_x 2>"$tmp/err"; [ $? != 0 ] && [ "$(wc -l <"$tmp/err")" = 1 ]
check $? "an unknown type is one line: $(cat "$tmp/err")"
# the output is the input: refused before a byte is written (it was truncated while mapped: SIGBUS, the model lost)
cp "$g" "$tmp/same.gguf" && cp -r "$m" "$tmp/same"
expect_error "quantize a GGUF onto itself" "$bin" quantize "$tmp/same.gguf" "$tmp/same.gguf" --type q4_0
cmp -s "$g" "$tmp/same.gguf"; check $? "the GGUF quantized onto itself is intact"
expect_error "quantize a folder into itself" "$bin" quantize "$tmp/same" "$tmp/same/" --type mlx4
cmp -s "$m/model.safetensors" "$tmp/same/model.safetensors" && cmp -s "$m/config.json" "$tmp/same/config.json"
check $? "the folder quantized into itself is intact"
expect_error "a folder from a GGUF" "$bin" quantize "$g" "$tmp/from-gguf" --type mlx4
[ ! -e "$tmp/from-gguf" ]; check $? "a folder from a GGUF is refused before it is written"
rm -rf "$tmp/same" "$tmp/same.gguf"
# a write that fails part way (here the file size limit) leaves no partial weights file behind
(trap '' XFSZ; ulimit -f 1000; exec "$bin" quantize "$m" "$tmp/big.gguf" --type q8_0) 2>"$tmp/err"
[ $? != 0 ] && [ "$(wc -l <"$tmp/err")" = 1 ] && [ ! -e "$tmp/big.gguf" ]
check $? "a GGUF that cannot be written whole is one line and no file: $(cat "$tmp/err")"
(trap '' XFSZ; ulimit -f 1000; exec "$bin" quantize "$m" "$tmp/big-mlx" --type mlx8) 2>"$tmp/err"
[ $? != 0 ] && [ "$(wc -l <"$tmp/err")" = 1 ] && [ ! -e "$tmp/big-mlx/model.safetensors" ]
check $? "an MLX folder that cannot be written whole is one line and no weights file: $(cat "$tmp/err")"
head -c 100000 "$g" >"$tmp/cut.gguf"
"$bin" generate -m "$tmp/cut.gguf" --ids 2 -n 1 2>"$tmp/err"; [ $? != 0 ] && [ "$(wc -l <"$tmp/err")" = 1 ]
check $? "a truncated GGUF is one line: $(cat "$tmp/err")"
"$bin" quantize --random "$m/config.json" "$tmp/r.gguf" --type q4_0 && "$bin" bench -m "$tmp/r.gguf" -p 8 -n 4 -r 1 >"$tmp/bench.txt"
grep -q "copy bandwidth [1-9][0-9]* GB/s" "$tmp/bench.txt" && grep -q "^decode .* GB/s" "$tmp/bench.txt"
check $? "random weights for a config, benchmarked (with the copy bandwidth)"
G4_BENCH_NO_COPY=1 "$bin" bench -m "$tmp/r.gguf" -p 8 -n 0 -r 1 >"$tmp/bench0.txt" && grep -q "^prefill" "$tmp/bench0.txt" && ! grep -q "^decode" "$tmp/bench0.txt"
check $? "bench -n 0: prefill only"
"$bin" run -m "$tmp/r.gguf" -p "Hi" -n 1 2>"$tmp/err"
[ $? != 0 ] && [ "$(wc -l <"$tmp/err")" = 1 ] && grep -q "the file has no tokenizer (tokenizer.ggml.tokens)" "$tmp/err"
check $? "a GGUF without tokenizer metadata says so (not 'no tokenizer.json'): $(cat "$tmp/err")"
# a BOS id past the vocabulary (the metadata value patched in place: type uint32 after the key): an error, not a
# BOS silently left out
python3 - "$g" "$tmp/bos.gguf" <<'PY'
import struct, sys
d = bytearray(open(sys.argv[1], "rb").read())
key = b"tokenizer.ggml.bos_token_id"
at = d.index(struct.pack("<Q", len(key)) + key) + 8 + len(key)
assert struct.unpack_from("<I", d, at)[0] == 4  # GGUF uint32
struct.pack_into("<I", d, at + 4, 0x7fffffff)
open(sys.argv[2], "wb").write(d)
PY
"$bin" tokenize -m "$tmp/bos.gguf" -p "Hi" 2>"$tmp/err"
[ $? != 0 ] && [ "$(wc -l <"$tmp/err")" = 1 ] && grep -q "bos_token_id 2147483647 is outside the vocabulary" "$tmp/err"
check $? "a BOS id past the vocabulary is one line: $(cat "$tmp/err")"
exit $fail
