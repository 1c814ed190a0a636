#!/bin/bash
# The logits and generate commands on the fixtures, compared with the transformers
# references; bad input gives a one-line error and a non-zero exit.
set -u
bin=${G4_BIN:?}; shared=${G4_SHARED_DIR:?}; tmp=${G4_TMP:-/tmp}
here=$(cd "$(dirname "$0")" && pwd)
fail=0
check() { if [ "$1" = 0 ]; then echo "ok   $2"; else echo "FAIL $2"; fail=1; fi; }

for fx in dense-ple dense-keqv moe; do
    dir=$shared/fixtures/$fx
    ids=$(python3 "$here/cli_compare.py" ids "$dir/reference.safetensors" input_ids)
    want=$(python3 "$here/cli_compare.py" ids "$dir/reference.safetensors" greedy_ids)
    "$bin" logits -m "$dir" --ids "$ids" -o "$tmp/$fx.f32"
    err=$(python3 "$here/cli_compare.py" logits "$dir/reference.safetensors" "$tmp/$fx.f32" 2e-3)
    check $? "$fx: logits within 2e-3 (max error $err)"
    got=$("$bin" generate -m "$dir" --ids "$ids" -n 24 --temp 0)
    [ "$got" = "$want" ]
    check $? "$fx: 24 greedy ids identical"
done

# bad input: non-zero exit, one line on stderr, nothing on stdout
expect_error() {
    local what=$1; shift
    out=$("$@" 2>"$tmp/err.txt"); rc=$?
    lines=$(wc -l <"$tmp/err.txt")
    [ $rc -ne 0 ] && [ "$lines" = 1 ] && [ -z "$out" ]
    check $? "$what: exit $rc, $(head -c 160 "$tmp/err.txt")"
}
dir=$shared/fixtures/dense-ple
expect_error "missing model folder" "$bin" logits -m "$tmp/nope" --ids 2,3 -o "$tmp/x.f32"
expect_error "malformed ids" "$bin" generate -m "$dir" --ids 2,,3
expect_error "id outside the vocabulary" "$bin" generate -m "$dir" --ids 2,512
expect_error "no ids" "$bin" logits -m "$dir" -o "$tmp/x.f32"
expect_error "unknown option" "$bin" generate -m "$dir" --ids 2 --bogus
expect_error "unknown command" "$bin" frobnicate
mkdir -p "$tmp/llama"; echo '{"model_type": "llama"}' >"$tmp/llama/config.json"
expect_error "unknown model type" "$bin" generate -m "$tmp/llama" --ids 2
[ ! -e "$tmp/x.f32" ]; check $? "no output file left behind after an error"
exit $fail
