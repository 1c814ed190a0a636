/* The Hugging Face `tokenizer.json` tokenizer (BPE model, as used by Gemma 4).
 *
 * Encoding follows the `tokenizers` library: added tokens with normalized=false are matched
 * on the raw text (leftmost-longest), the rest is normalized, added tokens with
 * normalized=true are matched in the normalized pieces, the pre-tokenizer splits what is
 * left into words and each word goes through BPE (byte fallback, fuse_unk, ignore_merges).
 * Decoding runs the decoder chain (Replace, ByteFallback, Fuse, Strip).
 *
 * Supported pieces of tokenizer.json: model BPE; normalizer null | Replace (string pattern) |
 * Prepend | Sequence; pre_tokenizer null | Split (string pattern, invert false) | Sequence;
 * post_processor null | TemplateProcessing; decoder null | Replace | ByteFallback | Fuse |
 * Strip | Sequence. Anything else is a load error naming what is not supported.
 *
 * Loading parses the JSON once and keeps a binary cache (see g4_tokenizer_load) holding the
 * vocabulary, the merges, the added tokens and the lookup tables ready to use; later loads
 * map it, check it and use it in place.
 *
 * Speed: BPE runs with a (rank, position) heap over linked symbols, O(n log n) per word.
 * Words are also cut where no merge can cross (before a U+2581/space that follows a
 * character no vocabulary token joins to it; checked against the loaded vocabulary, so
 * the ids are the same) and the pieces are cached within one g4_tokenize call.
 * G4_TOKENIZER_NO_CHUNKS=1 (read at load) turns the cutting off, for comparisons.
 *
 * A loaded tokenizer is never modified: g4_tokenize / g4_detokenize may run concurrently on
 * it from several threads (a g4_detok_stream belongs to one thread).
 */
#ifndef G4_TOKENIZER_TOKENIZER_H
#define G4_TOKENIZER_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "gemma4c.h"

/* The public part (loading, ids, g4_tokenize, g4_detokenize, g4_detok_stream) is declared in
 * gemma4c.h; the loading details:
 *
 * Cache: a binary form of the parsed file is kept in $XDG_CACHE_HOME/gemma4c (or
 * ~/.cache/gemma4c), never beside the user's files, under a name derived from a 128-bit hash of
 * the tokenizer's content (the tokenizer.json's bytes; a GGUF file's tokenizer keys), so copies of
 * one tokenizer share a cache and a changed file is another. $G4_TOKENIZER_CACHE_DIR, when set, is
 * the folder used instead. $G4_NO_TOKENIZER_CACHE=1 disables reading and writing it. A cache
 * records that hash, a format version and a checksum of its whole content, and its tables are
 * checked for consistency (ids and ranks in range, sizes agreeing); one that fails any check is
 * rebuilt from the source. It is written to a temporary file and renamed into place; the folder
 * keeps the 16 caches used last.
 *
 * Decoding: skip_special drops special tokens, then the decoder chain (for Gemma: Replace
 * "▁"->" ", ByteFallback, Fuse). A run of byte tokens that is not valid UTF-8 becomes one
 * U+FFFD per byte, as HF does. The streaming decoder holds a run of byte-fallback tokens back
 * until it ends (a non-byte token, or flush), because HF turns the whole run into U+FFFD when
 * any part of it is invalid. */

/* The tokenizer of a GGUF file's tokenizer.ggml.* metadata (docs/formats.md 3.3), as the tokenizer.json it
 * was converted from (tok_gguf.c), cached like a tokenizer.json (keyed by the GGUF file). meta: the file's
 * metadata when the caller has it open, else NULL (the file is opened). */
struct json_t;
int g4_tokenizer_load_gguf(const char *path, const struct json_t *meta, g4_tokenizer **out, g4_error *err);

int32_t g4_tokenizer_token_id_n(const g4_tokenizer *tok, const char *piece, size_t len);

/* The bytes token `id` adds to decoded text wherever it stands: its piece through the decoder chain (Replace
 * steps, a byte-fallback piece as its one byte, kept even when it is not UTF-8 alone; Strip only where it
 * applies to single tokens). Returns the length (at most cap), or -1 for an id out of range or a piece over
 * 1 KiB. Constrained decoding (engine/grammar.c) reads tokens this way. */
int g4_tokenizer_token_bytes(const g4_tokenizer *tok, int32_t id, char *buf, size_t cap);

/* Where the binary cache is (NULL if none was read or written) and whether this load read it. */
const char *g4_tokenizer_cache_path(const g4_tokenizer *tok);
int g4_tokenizer_loaded_from_cache(const g4_tokenizer *tok);

/* Appends one id to a token list (grows it). 0 or -1 (out of memory). */
int g4_tokens_push(g4_tokens *t, int32_t id);

#endif
