/* GGUF v3 files (docs/formats.md 3.1): a validated reader that maps the file, turns
 * the metadata into a JSON object and the tensor infos into tensor views, and a
 * writer that lays tensors out exactly as llama.cpp requires (offsets = running
 * padded sum in tensor-info order). Gemma 4 naming and hyper-parameters: gguf_gemma4.h. */
#ifndef G4_FORMATS_GGUF_H
#define G4_FORMATS_GGUF_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

#include "formats/tensor_set.h"

/* GGUF value types */
enum {
    G4_GGUF_U8 = 0, G4_GGUF_I8, G4_GGUF_U16, G4_GGUF_I16, G4_GGUF_U32, G4_GGUF_I32, G4_GGUF_F32, G4_GGUF_BOOL,
    G4_GGUF_STR, G4_GGUF_ARR, G4_GGUF_U64, G4_GGUF_I64, G4_GGUF_F64
};

typedef struct g4_gguf {
    json_t *meta;         /* key -> value (integers, reals, booleans, strings, arrays of them) */
    g4_tensor_set set;    /* tensors under their GGUF names, shape in row-major order (ne reversed) */
    int version;
    size_t alignment, data_start;
} g4_gguf;

/* Maps and validates a GGUF file. Tensors of ggml types this engine does not read get
 * dtype G4_DTYPE_UNKNOWN (an error only where they are used).
 * The vocabulary's arrays (tokenizer.ggml.tokens, .merges, .scores, .token_type: 1.3 million values for Gemma's
 * 262144 tokens and 514906 merges, 0.35 s and 100 MB as JSON values) are checked but stay in the file: the metadata
 * holds {"gguf_array": [type, count, address, bytes]} for each, valid while g->set maps the file; g4_gguf_array_of
 * reads one. */
int g4_gguf_open(const char *path, g4_gguf *g, g4_error *err);

typedef struct g4_gguf_array {
    int type;                  /* element type: G4_GGUF_STR, G4_GGUF_I32, G4_GGUF_F32, ... */
    uint64_t n;                /* elements */
    const unsigned char *data; /* the first one's bytes (strings as the file holds them: u64 length, bytes) */
    size_t size;               /* bytes of all of them */
} g4_gguf_array;
/* 1 and *out when meta[key] is an array left in the file, else 0. */
int g4_gguf_array_of(const json_t *meta, const char *key, g4_gguf_array *out);
/* The string at byte *at (0: the first) of a string array, its length in *len (not NUL-terminated; *at moves to the
 * next); NULL past the end. */
const char *g4_gguf_array_str(const g4_gguf_array *a, size_t *at, size_t *len);
/* Element i of a number array (0 past the end). */
double g4_gguf_array_num(const g4_gguf_array *a, uint64_t i);
void g4_gguf_free(g4_gguf *g);
/* 1 if the file starts with the GGUF magic. */
int g4_gguf_is_file(const char *path);

/* ggml type id of a dtype and back (-1 / G4_DTYPE_UNKNOWN when not a GGUF type) */
int g4_gguf_type_of(g4_dtype t);
g4_dtype g4_gguf_dtype(int ggml_type);

/* Writer: add metadata and tensor infos, then write the header and each tensor's data in
 * the order added. */
typedef struct g4_gguf_writer {
    unsigned char *kv;
    size_t kv_len, kv_cap;
    int64_t n_kv;
    unsigned char *ti;
    size_t ti_len, ti_cap;
    int64_t n_tensors;
    size_t data_size;  /* running padded size */
    int failed;        /* out of memory */
} g4_gguf_writer;

#define G4_GGUF_ALIGN 32

void g4_gguf_writer_free(g4_gguf_writer *w);
void g4_gguf_add_u32(g4_gguf_writer *w, const char *key, uint32_t v);
void g4_gguf_add_i32(g4_gguf_writer *w, const char *key, int32_t v);
void g4_gguf_add_f32(g4_gguf_writer *w, const char *key, float v);
void g4_gguf_add_bool(g4_gguf_writer *w, const char *key, int v);
void g4_gguf_add_str(g4_gguf_writer *w, const char *key, const char *v);
/* arrays: elem_type one of U32, I32, F32, BOOL (values given as int32/float/...: see gguf.c), STR */
void g4_gguf_add_arr(g4_gguf_writer *w, const char *key, int elem_type, const void *values, size_t n);
void g4_gguf_add_str_arr(g4_gguf_writer *w, const char *key, const char *const *values, size_t n);
/* an array as another file holds it (g4_gguf_array_of) */
void g4_gguf_add_array(g4_gguf_writer *w, const char *key, const g4_gguf_array *a);
/* A tensor of row-major shape (written as reversed ne) and dtype; returns its byte size. */
size_t g4_gguf_add_tensor(g4_gguf_writer *w, const char *name, g4_dtype t, int ndim, const int64_t *shape);
/* Header, metadata and tensor infos, padded to the data start. */
int g4_gguf_write_header(g4_gguf_writer *w, FILE *f, g4_error *err);
/* A tensor's bytes, in one or more pieces, then the padding after a tensor of `size` bytes. */
int g4_gguf_write_data(FILE *f, const void *data, size_t n, g4_error *err);
int g4_gguf_write_pad(FILE *f, size_t size, g4_error *err);

#endif
