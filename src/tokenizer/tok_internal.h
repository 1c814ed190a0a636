/* Internals of the tokenizer shared by its source files (not part of the API). */
#ifndef G4_TOKENIZER_TOK_INTERNAL_H
#define G4_TOKENIZER_TOK_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

/* ------------------------------------------------------------------ hashing */

/* 64-bit hash of a byte string (not cryptographic; used for tables and checksums). */
uint64_t tok_hash_bytes(const void *data, size_t len, uint64_t seed);

/* A table of NUL-terminated strings: string i is blob + off[i], of length
 * off[i+1] - off[i] - 1; off[i+1] == off[i] means "no string i". */
typedef struct tok_strtab {
    const uint32_t *off;
    const char *blob;
} tok_strtab;

/* Open-addressing map from byte strings to their index in a tok_strtab. A slot holds
 * (hash32 << 32) | (index + 1); 0 is empty. */
typedef struct tok_strmap {
    uint64_t *slots;
    uint64_t mask;
} tok_strmap;

/* The tables hash strings and pairs that a tokenizer.json (or its cache) chooses, so they are
 * built and accepted only when every run of occupied slots is at most this long: a lookup
 * then probes at most that many slots, whatever the file (a real vocabulary's longest run is
 * under 50). */
#define TOK_MAX_RUN 1024

/* Longest run of slots != empty in table[0..cap), wrapping around (cap when all are full). */
uint64_t tok_longest_run(const uint64_t *table, uint64_t cap, size_t stride, uint64_t empty);

/* --------------------------------------------------------------- merges map */

typedef struct tok_merge_slot {
    uint64_t key; /* (left << 32) | right; UINT64_MAX = empty */
    uint64_t rank;
} tok_merge_slot;

/* ----------------------------------------------------------- pipeline steps */

/* Bounds on what a tokenizer.json may ask of the pipeline: the steps of the normalizer, of the
 * pre-tokenizer and of the decoder (each step costs a pass over the text), and how much longer
 * than its input the normalizer or the decoder may make a text (TOK_MAX_GROWTH times, plus
 * the contents its steps insert, plus 4 KiB). */
#define TOK_MAX_STEPS 64
#define TOK_MAX_GROWTH 16

/* The added tokens are found in a text by walking a trie from each position, which costs up to
 * the longest token per position: they may be at most this long (the real ones are under 100). */
#define TOK_MAX_ADDED_LEN 1024

enum { TOK_NORM_REPLACE, TOK_NORM_PREPEND };
typedef struct tok_norm_op {
    int type;
    char *pattern; /* Replace: what is replaced */
    size_t pattern_len;
    char *content; /* Replace: the replacement; Prepend: what is prepended */
    size_t content_len;
} tok_norm_op;

enum {
    TOK_SPLIT_REMOVED,
    TOK_SPLIT_ISOLATED,
    TOK_SPLIT_MERGED_WITH_PREVIOUS,
    TOK_SPLIT_MERGED_WITH_NEXT,
    TOK_SPLIT_CONTIGUOUS
};
typedef struct tok_pretok_op {
    char *pattern;
    size_t pattern_len;
    int behavior;
} tok_pretok_op;

enum { TOK_DEC_REPLACE, TOK_DEC_BYTE_FALLBACK, TOK_DEC_FUSE, TOK_DEC_STRIP };
typedef struct tok_dec_op {
    int type;
    char *pattern; /* Replace */
    size_t pattern_len;
    char *content; /* Replace: replacement; Strip: the character stripped */
    size_t content_len;
    size_t start, stop; /* Strip: how many leading / trailing content chars */
} tok_dec_op;

/* How the streaming decoder can work with this decoder chain. */
enum {
    TOK_STREAM_GROUPS, /* per token, byte-fallback runs held until they end (exact) */
    TOK_STREAM_SPACES, /* no decoder: tokens joined with " " */
    TOK_STREAM_ALL     /* chain not decomposable: everything is emitted at flush */
};

/* ------------------------------------------------------------- added tokens */

typedef struct tok_added {
    int32_t id;
    char *content;
    size_t len;
    char *norm; /* content after the normalizer (normalized tokens only) */
    size_t norm_len;
    uint8_t single_word, lstrip, rstrip, normalized, special;
} tok_added;

/* Byte trie for leftmost-longest matching. Node 0 is the root; the children of a node are
 * the contiguous edges [first, first + count), sorted by byte. */
typedef struct tok_trie_node {
    uint32_t first_edge;
    uint16_t n_edges;
    int32_t match; /* index into tok->added, or -1 */
} tok_trie_node;
typedef struct tok_trie_edge {
    uint8_t byte;
    uint32_t node;
} tok_trie_edge;
typedef struct tok_trie {
    tok_trie_node *nodes;
    tok_trie_edge *edges;
    size_t n_nodes, n_edges;
    uint32_t root[256]; /* child of the root per byte, 0 = none */
    int empty;          /* no pattern at all */
} tok_trie;

/* The binary cache (tok_cache.c): sections and parameters whose meaning tok_load.c defines. */
#define TOK_CACHE_SECTIONS 16
#define TOK_CACHE_PARAMS 16
typedef struct tok_cache_sec {
    const void *data;
    uint64_t size;
} tok_cache_sec;
typedef struct tok_cache_data {
    tok_cache_sec sec[TOK_CACHE_SECTIONS];
    uint64_t param[TOK_CACHE_PARAMS];
    void *map; /* set by tok_cache_open: the mapped file */
    size_t map_size;
} tok_cache_data;

/* An added token as tokenizer.json lists it (before duplicates are dropped and ids given). */
typedef struct tok_added_raw {
    uint32_t off, len; /* content in a NUL-separated blob */
    uint8_t special, single_word, lstrip, rstrip, normalized, pad[3];
} tok_added_raw;

/* ---------------------------------------------------------------- tokenizer */

struct g4_tokenizer {
    int32_t n_ids;     /* max id + 1 over the model vocabulary and the added tokens */
    const char **id_str; /* [n_ids] NUL-terminated piece or NULL */
    uint32_t *id_len;  /* [n_ids] */
    uint8_t *id_flags; /* [n_ids] TOK_ID_* */

    /* model vocabulary: slots [0, n_slots), slot i = piece of id i, blob-backed */
    uint32_t n_slots;
    tok_strtab vocab_tab; /* string i = piece of id i; off has n_slots + 1 entries */
    uint32_t n_vocab;     /* entries present (HF get_vocab_size) */
    size_t blob_size;
    tok_strmap vocab_map;
    int32_t *bmp_id; /* [65536] id of the one-character piece, -1 none */
    int32_t byte_id[256];

    /* merges: open addressing from the pair (left, right) to its rank (= index into
     * merge_triples). Packed 8-byte slots (left << (id_bits + rank_bits) | right << rank_bits
     * | rank) when that fits in 63 bits, else 16-byte slots. Empty slots are all ones. */
    const uint32_t *merge_triples; /* [n_merges][3] left, right, new id */
    size_t n_merges;
    uint64_t *merge_filter; /* one bit per hash value of a pair that has a merge */
    int merge_filter_shift;
    uint64_t *merge_packed;
    tok_merge_slot *merge_wide;
    uint64_t *merge_hot; /* packed slots of the lowest ranks only (small, stays in cache) */
    uint64_t merge_hot_mask;
    int merge_hot_shift;
    int merge_id_bits, merge_rank_bits;
    uint64_t merge_mask;
    int merge_shift;

    /* Chunking (an exact speed-up): BPE never merges across a boundary X|S when the
     * character X is a token and no vocabulary token holds X immediately followed by S
     * (a merge result always contains the two characters around the boundary). Words are
     * cut before such an S and the pieces' results are cached within one encode call. */
    int chunk_ok;
    char chunk_sep[4]; /* S in UTF-8 */
    size_t chunk_sep_len;
    uint32_t chunk_sep_cp;
    uint32_t *chunk_forbidden; /* sorted code points X with "XS" inside some token */
    size_t n_chunk_forbidden;

    /* BPE options */
    int byte_fallback, fuse_unk, ignore_merges;
    int has_unk;    /* unk_token given */
    int32_t unk_id; /* -1 when the unk_token is not in the vocabulary */
    char *unk_token;
    char *cont_prefix, *eow_suffix; /* NULL when none */

    /* added tokens */
    tok_added *added;
    size_t n_added;
    tok_strtab added_tab; /* string i = added[i].content */
    uint32_t *added_off;
    char *added_blob;
    tok_strmap added_map;
    tok_trie trie_raw, trie_norm;

    tok_norm_op *norm;
    size_t n_norm;
    size_t norm_inserted; /* total content length of the normalizer's Prepend steps */
    tok_pretok_op *pretok;
    size_t n_pretok;
    tok_dec_op *dec;
    size_t n_dec;
    int has_decoder;
    int stream_mode;
    size_t dec_bf_index; /* index of the first ByteFallback in dec, n_dec if none */

    int32_t *prefix_ids, *suffix_ids; /* special tokens around the text (add_bos) */
    size_t n_prefix, n_suffix;
    int32_t bos_id, eos_id;

    char *cache_path;
    int from_cache;

    /* storage: from the cache, the vocabulary, merges and derived tables point into the
     * mapped file (tables_borrowed); else they are owned */
    tok_cache_data cache;
    int tables_borrowed;
    uint32_t *own_off;
    char *own_blob;
    uint32_t *own_triples;
    tok_added_raw *own_added_raw;
    char *own_added_blob;
    size_t n_added_raw, added_blob_size;
};

enum { TOK_ID_SPECIAL = 1, TOK_ID_ADDED = 2, TOK_ID_MODEL = 4 };

/* utilities (tok_util.c) */
int tok_strmap_init(tok_strmap *m, size_t n_entries);
void tok_strmap_free(tok_strmap *m);
/* Adds string `index` of tab; when an equal string is already there the first is kept.
 * -1 when the slot would be more than TOK_MAX_RUN probes away (a degenerate table). */
int tok_strmap_put(tok_strmap *m, const tok_strtab *tab, uint32_t index);
int32_t tok_strmap_get(const tok_strmap *m, const tok_strtab *tab, const char *s, size_t len);

/* Model-vocabulary lookup (pieces from the vocab slots). */
int32_t tok_vocab_get(const g4_tokenizer *tok, const char *s, size_t len);

/* UTF-8: length of the valid sequence at s (1..4), 0 if invalid; *cp the code point. */
size_t tok_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);
/* Offset of the first invalid byte, or len if the whole text is valid. */
size_t tok_utf8_validate(const char *s, size_t len);
int tok_is_white_space(uint32_t cp);
/* The regex class \w (tok_word_chars.c, generated). */
int tok_is_word_char(uint32_t cp);

int tok_trie_build(tok_trie *t, const tok_added *added, size_t n, int use_norm);
void tok_trie_free(tok_trie *t);
/* Longest pattern starting at s[0]: index into added (or -1), *match_len its length. */
int32_t tok_trie_longest(const tok_trie *t, const unsigned char *s, size_t n, size_t *match_len);

/* What the sections and parameters of a tokenizer cache hold (tok_load.c). */
enum {
    TOK_SEC_VOCAB_OFF,   /* u32[n_slots + 1] */
    TOK_SEC_VOCAB_BLOB,  /* pieces, NUL-terminated */
    TOK_SEC_MERGES,      /* u32[n_merges][3] */
    TOK_SEC_JSON,        /* tokenizer.json without model.vocab, model.merges, added_tokens; NUL-terminated */
    TOK_SEC_ADDED,       /* tok_added_raw[n] */
    TOK_SEC_ADDED_BLOB,  /* their contents, NUL-terminated, in order */
    TOK_SEC_VOCAB_MAP,   /* u64[vocab_mask + 1] */
    TOK_SEC_BMP,         /* i32[65536] */
    TOK_SEC_MERGE_MAIN,  /* u64[merge_mask + 1] packed, or tok_merge_slot[merge_mask + 1] */
    TOK_SEC_MERGE_FILTER,
    TOK_SEC_MERGE_HOT,   /* u64[hot_mask + 1] or empty */
    TOK_SEC_CHUNK_FORBIDDEN, /* u32[], sorted */
    TOK_SEC_COUNT
};
enum { TOK_P_N_SLOTS, TOK_P_N_MERGES, TOK_P_BLOB_SIZE, TOK_P_VOCAB_MASK, TOK_P_MERGE_PACKED, TOK_P_MERGE_MASK, TOK_P_MERGE_SHIFT, TOK_P_ID_BITS,
       TOK_P_RANK_BITS, TOK_P_FILTER_SHIFT, TOK_P_HOT_MASK, TOK_P_HOT_SHIFT, TOK_P_CHUNK_SEP, TOK_P_N_ADDED, TOK_P_COUNT };

_Static_assert(TOK_SEC_COUNT <= TOK_CACHE_SECTIONS && TOK_P_COUNT <= TOK_CACHE_PARAMS, "cache layout");

/* What a cache belongs to: a 128-bit hash of its source's content, in a domain (the kind of source). */
typedef struct tok_source_key {
    uint64_t h[2];
} tok_source_key;
#define TOK_KEY_JSON 0x6a736f6eULL /* the bytes of a tokenizer.json */
#define TOK_KEY_GGUF 0x67677566ULL /* the tokenizer keys of a GGUF file (tok_gguf.c) */
void tok_key_init(tok_source_key *k, uint64_t domain);
/* Adds len bytes as one part (parts are length-delimited). */
void tok_key_add(tok_source_key *k, const void *data, size_t len);
/* The key of a whole file's bytes: 0, or -1 when it cannot be read. */
int tok_key_file(const char *path, uint64_t domain, tok_source_key *k);

/* Maps a cache and checks it belongs to key and is intact: 0 (its time renewed), or -1 (absent, other, corrupt). */
int tok_cache_open(const char *cache_path, const tok_source_key *key, tok_cache_data *d);
void tok_cache_close(tok_cache_data *d);
/* Makes the bytes of a cache file claim to belong to key (the header's key, size and checksum are
 * recomputed): how tests and the fuzz harness reach the checks behind the checksum.  -1 when the file
 * is shorter than a header. */
int tok_cache_reseal(unsigned char *file, size_t size, const tok_source_key *key);
/* Writes d's sections and parameters atomically (temporary file + rename), then prunes the folder to the
 * caches used last (TOK_CACHE_KEEP). */
int tok_cache_write(const char *cache_path, const tok_source_key *key, const tok_cache_data *d);

/* The longest text the normalizer or decoder may make of n bytes (TOK_MAX_GROWTH). */
size_t tok_growth_limit(size_t n, size_t inserted);

/* Applies the normalizer to s (for normalized added tokens); malloc'ed, NULL: no memory or the
 * text grows past tok_growth_limit. */
char *tok_normalize_alloc(const g4_tokenizer *tok, const char *s, size_t len, size_t *out_len);

/* Where the cache of a source lives: $G4_TOKENIZER_CACHE_DIR, else $XDG_CACHE_HOME/gemma4c, else
 * ~/.cache/gemma4c, under a name derived from its key. malloc'ed; NULL when there is no such folder
 * (or no memory). */
char *tok_cache_path(const tok_source_key *key);
/* Creates the folder a cache path lives in if missing. */
int tok_cache_prepare_dir(const char *cache_path);

/* The tokenizer of the file `path` through its cache: from the cache of `key` (the source's content; NULL: no
 * cache) when one is valid, else from source(path, user) (a parsed tokenizer.json object, consumed; NULL with a
 * message on failure), then cached. Special ids are left as the tokenizer.json sets them (see tok_set_special). */
typedef struct json_t *(*tok_source_fn)(const char *path, void *user, g4_error *err);
int tok_load_cached(const char *path, const tok_source_key *key, tok_source_fn source, void *user, g4_tokenizer **out,
                    g4_error *err);
/* bos / eos ids (-1: none; out of range: none) and whether g4_tokenize(add_bos) prepends BOS. */
int tok_set_special(g4_tokenizer *tok, int32_t bos_id, int32_t eos_id, int add_bos, g4_error *err);

#endif
