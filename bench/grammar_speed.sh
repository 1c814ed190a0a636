#!/bin/bash
# What constrained decoding costs a token: gemma4c's grammar engine (g4-grammar-bench) against llama.cpp's grammar
# sampler (bench/llama_grammar.c against libllama), on the same GBNF grammars (bench/grammars/*.gbnf), the same
# token ids of a document each grammar accepts (bench/grammars/*.json), and Gemma 4's vocabulary of 262144 tokens
# (the example model's, written as GGUF for llama.cpp). Each round is a new request's walk: a mask over the whole
# vocabulary and the token, at every step of the document. Prints each engine's median ms a document and a token,
# and llama.cpp / gemma4c. (llama.cpp's common sampler first checks the drawn token alone and passes the whole
# vocabulary through the grammar only when that token is refused; this measures the whole pass, which is what a
# mask costs, and what each refused draw costs llama.cpp.)
#
#   bench/grammar_speed.sh [ROUNDS]      (default 5; llama.cpp's libllama from `bench/llamacpp.sh setup`)
set -eu -o pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dir=${G4_BENCH_DIR:-/tmp/gemma4c-bench}
llama=$dir/llama.cpp/build/bin
bin=${G4_BIN:-$here/build/gemma4c}
gbench=$(dirname "$bin")/g4-grammar-bench
rounds=${1:-5}
[ -f "$llama/libllama.so" ] || { echo "no llama.cpp in $llama: run bench/llamacpp.sh setup first" >&2; exit 1; }
cc -O2 -o "$dir/llama-grammar" "$here/bench/llama_grammar.c" -I"$dir/llama.cpp/include" \
    -I"$dir/llama.cpp/ggml/include" -L"$llama" -lllama -Wl,-rpath,"$llama"
m=$dir/tolstoy-tiny
[ -f "$m/config.json" ] || tar -xJf "$here/models/tolstoy-tiny.tar.xz" -C "$dir"
[ -f "$dir/tolstoy-tiny.gguf" ] || "$bin" quantize "$m" "$dir/tolstoy-tiny.gguf" --type q8_0 >/dev/null
printf '%-8s %6s %14s %14s %14s %14s %8s\n' grammar tokens "gemma4c ms" "ms/token" "llama.cpp ms" "ms/token" ratio
for g in "$here"/bench/grammars/*.gbnf; do
    name=$(basename "$g" .gbnf)
    doc=$(tr -d '\n' <"${g%.gbnf}.json")
    "$bin" tokenize -m "$m" --no-bos -p "$doc" >"$dir/$name.ids"
    read -r n ours ours_tok < <("$gbench" "$m/tokenizer.json" "$g" "$dir/$name.ids" "$rounds")
    read -r n2 peer peer_tok < <("$dir/llama-grammar" "$dir/tolstoy-tiny.gguf" "$g" "$dir/$name.ids" "$rounds")
    [ "$n" = "$n2" ] || { echo "$name: the engines read $n and $n2 tokens" >&2; exit 1; }
    printf '%-8s %6d %14.2f %14.3f %14.2f %14.3f %8.2f\n' "$name" "$n" "$ours" "$ours_tok" "$peer" "$peer_tok" \
        "$(echo "$peer / $ours" | bc -l)"
done
