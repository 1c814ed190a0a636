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

typedef struct g4_tokenizer g4_tokenizer;

/* path = a tokenizer.json; also reads tokenizer_config.json beside it if present
 * (add_bos_token, add_eos_token, bos_token, eos_token).
 *
 * Cache: a binary form of the parsed file is kept in `<path>.g4c` when that folder is
 * writable, else in $XDG_CACHE_HOME/gemma4c (or ~/.cache/gemma4c) under a name derived from
 * the real path. $G4_TOKENIZER_CACHE_DIR, when set, is the only folder used.
 * $G4_NO_TOKENIZER_CACHE=1 disables reading and writing it. A cache records the size, the
 * modification time and a hash of the first and last MiB of the tokenizer.json, a format
 * version and a checksum of its whole content, and its tables are checked for consistency
 * (ids and ranks in range, sizes agreeing); one that fails any check is rebuilt from the JSON.
 * It is written to a temporary file and renamed into place. */
int g4_tokenizer_load(const char *tokenizer_json_path, g4_tokenizer **out, g4_error *err);
/* DIR/tokenizer.json; for a .gguf file, the tokenizer in its metadata (g4_tokenizer_load_gguf). */
int g4_tokenizer_load_dir(const char *model_dir, g4_tokenizer **out, g4_error *err);
/* The tokenizer of a GGUF file's tokenizer.ggml.* metadata (docs/formats.md 3.3), as the
 * tokenizer.json it was converted from (tok_gguf.c). */
int g4_tokenizer_load_gguf(const char *path, g4_tokenizer **out, g4_error *err);
/* A tokenizer from a parsed tokenizer.json object (consumed), with these bos / eos ids
 * (-1: none) and BOS added by g4_tokenize(add_bos) when add_bos. No cache. */
struct json_t;
int g4_tokenizer_from_json(struct json_t *root, int32_t bos_id, int32_t eos_id, int add_bos, g4_tokenizer **out,
                           g4_error *err);
void g4_tokenizer_free(g4_tokenizer *tok);

int g4_tokenizer_vocab_size(const g4_tokenizer *tok); /* max id + 1 */
int32_t g4_tokenizer_bos_id(const g4_tokenizer *tok); /* -1 if none */
int32_t g4_tokenizer_eos_id(const g4_tokenizer *tok); /* -1 if none */
/* Id of an exact piece: an added token's content first, then the model vocabulary. -1 if none. */
int32_t g4_tokenizer_token_id(const g4_tokenizer *tok, const char *piece);
int32_t g4_tokenizer_token_id_n(const g4_tokenizer *tok, const char *piece, size_t len);
/* Raw vocabulary string of an id (added token content or model piece), NUL-terminated;
 * NULL if out of range or unused. */
const char *g4_tokenizer_piece(const g4_tokenizer *tok, int32_t id);
int g4_tokenizer_is_special(const g4_tokenizer *tok, int32_t id);

/* Where the binary cache is (NULL if none was read or written) and whether this load read it. */
const char *g4_tokenizer_cache_path(const g4_tokenizer *tok);
int g4_tokenizer_loaded_from_cache(const g4_tokenizer *tok);

typedef struct g4_tokens {
    int32_t *ids;
    size_t n, cap;
} g4_tokens; /* caller frees ids */

/* Encodes UTF-8 text (added and special tokens in the text are matched, as HF does by
 * default) and appends the ids to out. add_bos != 0 adds the special tokens exactly as
 * HF `encode(text)` with add_special_tokens=True would: when tokenizer_config.json sets
 * add_bos_token / add_eos_token those decide (as transformers does), otherwise the
 * post_processor template. Invalid UTF-8 is an error. */
int g4_tokenize(const g4_tokenizer *tok, const char *text, size_t len, int add_bos, g4_tokens *out,
                g4_error *err);

/* HF decode: skip_special drops special tokens; then the decoder chain (for Gemma:
 * Replace "▁"->" ", ByteFallback, Fuse). A run of byte tokens that is not valid UTF-8
 * becomes one U+FFFD per byte, as HF does. Out-of-range ids are an error. *out is a
 * malloc'ed NUL-terminated string (the caller frees it), *len its length. */
int g4_detokenize(const g4_tokenizer *tok, const int32_t *ids, size_t n, int skip_special,
                  char **out, size_t *len, g4_error *err);

/* Streaming decode for generation: push one id at a time and get the newly printable text.
 * A run of byte-fallback tokens is held back until it ends (a non-byte token, or flush),
 * because HF turns the whole run into U+FFFD when any part of it is invalid: the output is
 * never a broken UTF-8 sequence and the concatenation of all outputs equals g4_detokenize
 * of the whole sequence. */
typedef struct g4_detok_stream g4_detok_stream;
g4_detok_stream *g4_detok_stream_new(const g4_tokenizer *tok, int skip_special); /* NULL: no memory */
/* text stays valid until the next call on s. */
int g4_detok_stream_push(g4_detok_stream *s, int32_t id, const char **text, size_t *len,
                         g4_error *err);
int g4_detok_stream_flush(g4_detok_stream *s, const char **text, size_t *len);
void g4_detok_stream_free(g4_detok_stream *s);

/* Appends one id to a token list (grows it). 0 or -1 (out of memory). */
int g4_tokens_push(g4_tokens *t, int32_t id);

#endif
