#!/bin/bash
# The audio commands: encode-audio, logits --audio and generate --audio on ../shared/fixtures/audio against the
# transformers references; run --audio and chat's /audio on the example model with the
# fixture's audio tower grafted on (tests/graft_audio_tower.py); bad audio gives a one-line
# error and a non-zero exit.
set -u
bin=${G4_BIN:?}; shared=${G4_SHARED_DIR:?}; src=${G4_SOURCE_DIR:?}; tmp=${G4_TMP:-/tmp}/audio-cli
here=$(cd "$(dirname "$0")" && pwd)
. "$(cd "$(dirname "$0")" && pwd)/cli_check.sh" # check, expect_error
rm -rf "$tmp"; mkdir -p "$tmp"
fx=$shared/fixtures/audio
wav=$fx/audio0.wav

out=$("$bin" encode-audio -m "$fx" --audio "$wav" -o "$tmp/emb.f32")
check $? "encode-audio: $out"
err=$(python3 "$here/cli_compare.py" rel "$fx/reference.safetensors" audio_embeddings "$tmp/emb.f32" 1e-3)
check $? "encode-audio: audio_embeddings within 1e-3 relative (error $err)"
# -o -: the soft tokens alone on stdout, as in the file (the summary line went to stdout after the floats)
"$bin" encode-audio -m "$fx" --audio "$wav" -o - >"$tmp/stdout.f32" 2>"$tmp/stdout_err.txt"
cmp -s "$tmp/stdout.f32" "$tmp/emb.f32"
check $? "encode-audio -o -: stdout holds the same bytes as the file ($(stat -c %s "$tmp/stdout.f32") bytes; $(cat "$tmp/stdout_err.txt"))"

ids=$(python3 "$here/cli_compare.py" ids "$fx/reference.safetensors" input_ids)
"$bin" logits -m "$fx" --ids "$ids" --audio "$wav" -o "$tmp/logits.f32"
err=$(python3 "$here/cli_compare.py" logits "$fx/reference.safetensors" "$tmp/logits.f32" 2e-3)
check $? "logits --audio: within 2e-3 (max error $err)"
prompt=$(python3 "$here/cli_compare.py" prompt "$fx"); want=$(python3 "$here/cli_compare.py" greedy "$fx")
got=$("$bin" generate -m "$fx" --ids "$prompt" --audio "$wav" -n 24 --temp 0 --ignore-eos)
[ "$got" = "$want" ]; check $? "generate --audio: the 24 greedy ids of the reference ($got)"

printf 'RIFF\x24\x00\x00\x00WAVEfmt \x10\x00\x00\x00garbage' >"$tmp/corrupt.wav"
: >"$tmp/empty.wav"
expect_error "corrupt file" "$bin" encode-audio -m "$fx" --audio "$tmp/corrupt.wav" -o "$tmp/x.f32"
expect_error "not audio" "$bin" encode-audio -m "$fx" --audio "$fx/config.json" -o "$tmp/x.f32"
expect_error "empty file" "$bin" encode-audio -m "$fx" --audio "$tmp/empty.wav" -o "$tmp/x.f32"
expect_error "missing file" "$bin" encode-audio -m "$fx" --audio "$tmp/nope.wav" -o "$tmp/x.f32"
# encode-audio reads one file: a second --audio is refused (it replaced the first without a word)
expect_error "encode-audio: --audio twice" "$bin" encode-audio -m "$fx" --audio "$wav" --audio "$wav" -o "$tmp/x.f32"
expect_error "placeholders and soft tokens disagree" "$bin" logits -m "$fx" --ids 2,497,497 --audio "$wav" -o "$tmp/x.f32"
[ ! -e "$tmp/x.f32" ]; check $? "no output file left behind after an error"

# the example model with an audio tower: a chat turn with audio, and chat's /audio
tar -xJf "$src/models/tolstoy-tiny.tar.xz" -C "$tmp" || { echo "cannot unpack the example model"; exit 1; }
expect_error "a model without audio" "$bin" encode-audio -m "$tmp/tolstoy-tiny" --audio "$wav" -o "$tmp/x.f32"
python3 "$here/graft_audio_tower.py" "$tmp/tolstoy-tiny" "$fx" "$tmp/tolstoy-audio"
m=$tmp/tolstoy-audio
out=$("$bin" run -m "$m" --audio "$wav" -p "What does the recording say?" -n 8 --temp 0)
[ $? = 0 ] && [ -n "$out" ]; check $? "run --audio answers: $(echo $out | head -c 80)"
expect_error "run --audio with a missing file" "$bin" run -m "$m" --audio "$tmp/nope.wav" -p "Hi" -n 4
printf '/audio %s\nWhat is said?\n/audio %s\nAnd now?\n/exit\n' "$wav" "$tmp/corrupt.wav" |
    "$bin" chat -m "$m" -n 4 --temp 0 >"$tmp/chat.out" 2>"$tmp/chat.err"
rc=$?
[ $rc = 0 ] && grep -q "82 soft tokens" "$tmp/chat.err" && grep -q "corrupt.wav" "$tmp/chat.err" &&
    [ "$(grep -c . "$tmp/chat.out")" -ge 2 ]
check $? "chat: /audio, a turn, a bad /audio reported, another turn (exit $rc)"
exit $fail
