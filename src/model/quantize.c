/* gemma4c quantize and random checkpoints (model/quantize.h). The tensors written are
 * exactly those the architecture binds (g4_model_tensor_list), so unused or
 * KV-shared-ignored tensors of the source are left out. Every output tensor has a
 * precomputed place in the file; rows are produced in blocks (read from the source in
 * any dtype, or drawn at random) and encoded straight into their place with pwrite. */
#include "model/quantize.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "core/error.h"
#include "core/json.h"
#include "core/mapped_file.h"
#include "core/quant.h"
#include "formats/gguf_gemma4.h"
#include "formats/safetensors.h"
#include "model/model.h"

enum { OUT_GGUF, OUT_MLX, OUT_HF };

/* One output tensor: rows q of the output come from source rows
 * (q / blk) * stride + off + q % blk (blk = all rows, stride = off = 0 for a plain copy;
 * MLX expert gate/up halves otherwise). */
typedef struct {
    char name[256];
    g4_dtype type;
    int ndim;
    int64_t shape[4];
    int src;
    int64_t blk, stride, off;
    int bits, group;              /* MLX */
    size_t offset, bytes;         /* weight data in the file */
    size_t s_offset, b_offset;    /* MLX scales and biases (BF16) */
    int generated;                /* rope_freqs */
} out_tensor;

typedef struct {
    const g4_quantize_params *p;
    g4_model_config cfg;
    g4_model *model;           /* source model, or NULL for random weights */
    g4_tensor *list;           /* the architecture's tensors */
    int n_list;
    out_tensor *out;
    int n_out;
    int kind;
    g4_dtype target;
    int bits, group;
} job;

static const struct {
    const char *name;
    int kind;
    g4_dtype t;
} types[] = {
    {"f32", -1, G4_F32},    {"f16", -1, G4_F16},    {"bf16", -1, G4_BF16},  {"q8_0", OUT_GGUF, G4_Q8_0},
    {"q4_0", OUT_GGUF, G4_Q4_0}, {"q4_1", OUT_GGUF, G4_Q4_1}, {"q5_0", OUT_GGUF, G4_Q5_0},
    {"q5_1", OUT_GGUF, G4_Q5_1}, {"q4_k", OUT_GGUF, G4_Q4_K}, {"q5_k", OUT_GGUF, G4_Q5_K},
    {"q6_k", OUT_GGUF, G4_Q6_K}, {"q2_k", OUT_GGUF, G4_Q2_K}, {"q3_k", OUT_GGUF, G4_Q3_K},
    {"iq4_nl", OUT_GGUF, G4_IQ4_NL}, {"iq4_xs", OUT_GGUF, G4_IQ4_XS}, {"mlx2", OUT_MLX, G4_MLX2},
    {"mlx3", OUT_MLX, G4_MLX3},
    {"mlx4", OUT_MLX, G4_MLX4}, {"mlx5", OUT_MLX, G4_MLX5}, {"mlx6", OUT_MLX, G4_MLX6}, {"mlx8", OUT_MLX, G4_MLX8},
};

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* name without the weight prefix */
static const char *short_name(const job *j, const char *full) {
    size_t pl = strlen(j->cfg.weight_prefix);
    return strncmp(full, j->cfg.weight_prefix, pl) ? full : full + pl;
}

static int is_router(const char *n) { return ends_with(n, "router.proj.weight"); }

static out_tensor *add_out(job *j, g4_error *err) {
    out_tensor *o = realloc(j->out, (size_t)(j->n_out + 1) * sizeof *o);
    if (!o) {
        g4_fail(err, "out of memory");
        return NULL;
    }
    j->out = o;
    o = &j->out[j->n_out++];
    memset(o, 0, sizeof *o);
    return o;
}

static void set_shape(out_tensor *o, const g4_tensor *t) {
    o->ndim = t->ndim;
    for (int d = 0; d < t->ndim; d++) o->shape[d] = t->shape[d];
    o->blk = g4_tensor_nrows(t);
}

/* ------------------------------------------------------------------ plans */
static int plan_gguf(job *j, g4_error *err) {
    for (int i = 0; i < j->n_list; i++) {
        const g4_tensor *t = &j->list[i];
        out_tensor *o = add_out(j, err);
        if (!o) return -1;
        if (g4_gemma4_gguf_name(short_name(j, t->name), o->name, sizeof o->name))
            return g4_fail(err, "tensor '%s' has no GGUF name", t->name);
        set_shape(o, t);
        o->src = i;
        int64_t in = t->shape[t->ndim - 1];
        if (t->ndim == 1 || is_router(t->name))
            o->type = G4_F32;
        else
            o->type = g4_quant_row_type(j->target, in);
    }
    const g4_text_config *c = &j->cfg.text;
    int hd = c->type_head_dim[G4_LAYER_FULL];
    if (hd && c->rope[G4_LAYER_FULL].type == G4_ROPE_PROPORTIONAL) {
        out_tensor *o = add_out(j, err);
        if (!o) return -1;
        snprintf(o->name, sizeof o->name, "rope_freqs.weight");
        o->type = G4_F32;
        o->ndim = 1;
        o->shape[0] = hd / 2;
        o->blk = 1;
        o->src = -1;
        o->generated = 1;
    }
    return 0;
}

static void mlx_name(const char *full, char *out, size_t cap) {
    /* multimodal wrapper: mlx-vlm's language_model.model.X; a text-only model keeps model.X */
    if (!strncmp(full, "model.language_model.", 21))
        snprintf(out, cap, "language_model.model.%s", full + 21);
    else
        snprintf(out, cap, "%s", full);
}

static int plan_mlx_one(job *j, int i, const char *name, int64_t rows_per_e, int64_t stride, int64_t off,
                        g4_error *err) {
    const g4_tensor *t = &j->list[i];
    out_tensor *o = add_out(j, err);
    if (!o) return -1;
    snprintf(o->name, sizeof o->name, "%s", name);
    set_shape(o, t);
    o->src = i;
    if (rows_per_e) {
        o->shape[1] = rows_per_e;
        o->blk = rows_per_e;
        o->stride = stride;
        o->off = off;
    }
    int64_t in = t->shape[t->ndim - 1];
    int bits = is_router(t->name) ? 8 : j->bits, group = is_router(t->name) ? 64 : j->group;
    if (t->ndim >= 2 && in % group == 0) {
        o->type = g4_mlx_dtype(bits);
        o->bits = bits;
        o->group = group;
    } else {
        o->type = G4_BF16;
    }
    return 0;
}

static int plan_mlx(job *j, g4_error *err) {
    char n[300];
    for (int i = 0; i < j->n_list; i++) {
        const g4_tensor *t = &j->list[i];
        mlx_name(t->name, n, sizeof n);
        int rc;
        char *p = strstr(n, "experts.gate_up_proj");
        if (p) {
            const int64_t Im = t->shape[1] / 2;
            snprintf(p, sizeof n - (size_t)(p - n), "experts.switch_glu.gate_proj.weight");
            rc = plan_mlx_one(j, i, n, Im, 2 * Im, 0, err);
            snprintf(p, sizeof n - (size_t)(p - n), "experts.switch_glu.up_proj.weight");
            if (!rc) rc = plan_mlx_one(j, i, n, Im, 2 * Im, Im, err);
        } else if ((p = strstr(n, "experts.")) && (ends_with(n, "_proj"))) { /* down, or gate / up apart */
            char which[16];
            snprintf(which, sizeof which, "%s", p + 8);
            snprintf(p, sizeof n - (size_t)(p - n), "experts.switch_glu.%s.weight", which);
            rc = plan_mlx_one(j, i, n, 0, 0, 0, err);
        } else {
            rc = plan_mlx_one(j, i, n, 0, 0, 0, err);
        }
        if (rc) return -1;
    }
    return 0;
}

static int plan_hf(job *j, g4_error *err) {
    for (int i = 0; i < j->n_list; i++) {
        out_tensor *o = add_out(j, err);
        if (!o) return -1;
        snprintf(o->name, sizeof o->name, "%s", j->list[i].name);
        set_shape(o, &j->list[i]);
        o->src = i;
        o->type = j->target;
    }
    return 0;
}

/* ---------------------------------------------------------------- sources */
static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Random rows: matrices uniform in +-sqrt(3/in) (unit variance outputs for unit inputs),
 * vectors (norms, scales) 1 +- 0.1. */
static void random_rows(const job *j, int src, int64_t r0, int64_t n, float *dst) {
    const g4_tensor *t = &j->list[src];
    const int64_t in = t->shape[t->ndim - 1];
    const float amp = t->ndim == 1 ? 0.1f : sqrtf(3.0f / (float)in), base = t->ndim == 1 ? 1.0f : 0.0f;
    for (int64_t r = 0; r < n; r++) {
        uint64_t s = j->p->seed ^ ((uint64_t)src << 40) ^ (uint64_t)(r0 + r) * 0x2545f4914f6cdd1dull;
        uint64_t x = splitmix(&s) | 1;
        float *y = dst + r * in;
        for (int64_t c = 0; c < in; c++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            y[c] = base + amp * ((float)(x >> 40) * (2.0f / 16777216.0f) - 1.0f);
        }
    }
}

static void source_rows(const job *j, const out_tensor *o, int64_t q0, int64_t n, float *dst) {
    const g4_tensor *t = &j->list[o->src];
    const int64_t in = t->shape[t->ndim - 1];
    for (int64_t q = q0; q < q0 + n; q++) {
        int64_t r = (q / o->blk) * o->stride + o->off + q % o->blk;
        float *y = dst + (q - q0) * in;
        if (!j->model) {
            random_rows(j, o->src, r, 1, y);
        } else {
            const g4_tensor *s = g4_tensor_set_find(&j->model->weights, t->name);
            if (s) g4_dequant_row(s, r, y); /* present: the model loaded and bound it */
        }
    }
}

/* ---------------------------------------------------------------- writing */
static int pwrite_all(int fd, const void *buf, size_t n, size_t off, g4_error *err) {
    const char *p = buf;
    while (n) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w <= 0) return g4_fail(err, "write failed: %s", strerror(errno));
        p += w;
        n -= (size_t)w;
        off += (size_t)w;
    }
    return 0;
}

static int write_tensor(const job *j, int fd, const out_tensor *o, g4_error *err) {
    const int64_t in = o->shape[o->ndim - 1];
    int64_t rows = 1;
    for (int d = 0; d + 1 < o->ndim; d++) rows *= o->shape[d];
    if (o->generated) { /* rope_freqs (llama.cpp divides each pair's frequency by it): the proportional RoPE's
                         * factor for the rotated pairs, 1e30 for the rest */
        const g4_rope_config *rc = &j->cfg.text.rope[G4_LAYER_FULL];
        int hd = j->cfg.text.type_head_dim[G4_LAYER_FULL], n_rot = (int)floor(rc->partial_rotary_factor * hd / 2.0);
        float *v = malloc((size_t)in * sizeof(float));
        if (!v) return g4_fail(err, "out of memory");
        for (int64_t i = 0; i < in; i++) v[i] = i < n_rot ? (float)rc->factor : 1e30f;
        int rc2 = pwrite_all(fd, v, (size_t)in * 4, o->offset, err);
        free(v);
        return rc2;
    }
    const size_t row_bytes = g4_dtype_row_bytes(o->type, in);
    const int64_t chunk = in >= 65536 ? 4 : 1 + (1 << 20) / in;
    float *x = malloc((size_t)(chunk * in) * sizeof(float));
    unsigned char *buf = malloc((size_t)chunk * row_bytes + 16);
    uint16_t *sb = malloc((size_t)chunk * (size_t)(in / 32 + 1) * 2), *bb = malloc((size_t)chunk * (size_t)(in / 32 + 1) * 2);
    int rc = 0;
    if (!x || !buf || !sb || !bb) rc = g4_fail(err, "out of memory");
    /* a plain copy of a source whose values the type holds (g4_transcode_exact: the same type, Q5_0 as Q8_0) is
     * moved, not decoded and encoded again */
    const g4_tensor *s = j->model && o->src >= 0 && !o->stride && !o->off
                             ? g4_tensor_set_find(&j->model->weights, j->list[o->src].name)
                             : NULL;
    const int exact = s && !o->bits && !g4_dtype_is_mlx(s->dtype) && s->shape[s->ndim - 1] == in &&
                      g4_transcode_exact(s->dtype, o->type);
    for (int64_t q = 0; !rc && q < rows; q += chunk) {
        int64_t n = rows - q < chunk ? rows - q : chunk;
        if (exact) {
            for (int64_t r = 0; r < n; r++) g4_transcode_row(s, q + r, o->type, buf + (size_t)r * row_bytes, NULL);
            rc = pwrite_all(fd, buf, (size_t)n * row_bytes, o->offset + (size_t)q * row_bytes, err);
            continue;
        }
        source_rows(j, o, q, n, x);
        if (o->bits) {
            int64_t ng = in / o->group;
            for (int64_t r = 0; r < n; r++)
                g4_mlx_quant_row(o->bits, o->group, x + r * in, in, buf + (size_t)r * row_bytes, sb + r * ng, bb + r * ng,
                                 G4_BF16);
            rc = pwrite_all(fd, buf, (size_t)n * row_bytes, o->offset + (size_t)q * row_bytes, err) ||
                 pwrite_all(fd, sb, (size_t)(n * ng) * 2, o->s_offset + (size_t)(q * ng) * 2, err) ||
                 pwrite_all(fd, bb, (size_t)(n * ng) * 2, o->b_offset + (size_t)(q * ng) * 2, err);
        } else {
            for (int64_t r = 0; r < n; r++) g4_quant(o->type, x + r * in, buf + (size_t)r * row_bytes, in);
            rc = pwrite_all(fd, buf, (size_t)n * row_bytes, o->offset + (size_t)q * row_bytes, err);
        }
    }
    free(x);
    free(buf);
    free(sb);
    free(bb);
    return rc;
}

static int write_all_tensors(const job *j, int fd, g4_error *err) {
    for (int i = 0; i < j->n_out; i++) {
        if (j->p->verbose) fprintf(stderr, "%-60s %-5s\n", j->out[i].name, g4_dtype_name(j->out[i].type));
        if (write_tensor(j, fd, &j->out[i], err)) return g4_fail_prefix(err, "%s", j->out[i].name);
    }
    return 0;
}

static size_t tensor_bytes(const out_tensor *o) {
    int64_t rows = 1;
    for (int d = 0; d + 1 < o->ndim; d++) rows *= o->shape[d];
    return g4_dtype_row_bytes(o->type, o->shape[o->ndim - 1]) * (size_t)rows;
}

/* tokenizer.ggml.* of a model folder's tokenizer.json (docs/formats.md 3.3), in the shape a
 * GGUF's metadata reads back as (g4_gguf.meta); NULL when there is none. */
static json_t *tokenizer_meta(const job *j, g4_error *err) {
    if (!j->p->in) return NULL;
    if (g4_gguf_is_file(j->p->in)) return json_incref(j->model->gguf_meta); /* (its arrays in the model's mapping) */
    char path[4096];
    if (g4_path_join(path, sizeof path, j->p->in, "tokenizer.json", err) || !g4_file_exists(path)) return NULL;
    json_t *tj;
    if (g4_json_load_file(path, &tj, err)) return NULL;
    const json_t *model = json_object_get(tj, "model"), *vocab = json_object_get(model, "vocab"),
                 *merges = json_object_get(model, "merges"), *added = json_object_get(tj, "added_tokens");
    json_t *meta = json_object();
    if (!json_is_object(vocab) || !json_is_array(merges)) {
        json_decref(tj);
        json_decref(meta);
        g4_fail(err, "%s: not a BPE tokenizer.json", path);
        return NULL;
    }
    /* tokens in id order: model vocabulary, then added tokens */
    json_int_t n = 0;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)vocab, k, v) if (json_integer_value(v) + 1 > n) n = json_integer_value(v) + 1;
    size_t ai;
    json_array_foreach(added, ai, v) if (json_integer_value(json_object_get(v, "id")) + 1 > n) n = json_integer_value(json_object_get(v, "id")) + 1;
    json_t *toks = json_array(), *ttypes = json_array(), *scores = json_array(), *mj = json_array();
    for (json_int_t i = 0; i < n; i++) {
        json_array_append_new(toks, json_string(""));
        json_array_append_new(ttypes, json_integer(5)); /* unused until named */
        json_array_append_new(scores, json_real(-1000.0));
    }
    json_object_foreach((json_t *)vocab, k, v) {
        json_int_t id = json_integer_value(v);
        if (id < 0) continue;
        json_array_set_new(toks, (size_t)id, json_string(k));
        int byte = strlen(k) == 6 && !strncmp(k, "<0x", 3) && k[5] == '>';
        json_array_set_new(ttypes, (size_t)id, json_integer(byte ? 6 : 1));
    }
    static const char *render[] = {"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>",
                                   "<|tool_response>", "<tool_response|>", "<|\"|>"};
    json_array_foreach(added, ai, v) {
        json_int_t id = json_integer_value(json_object_get(v, "id"));
        const char *c = json_string_value(json_object_get(v, "content"));
        if (id < 0 || !c) continue;
        int ty = json_is_true(json_object_get(v, "special")) ? 3 : 4;
        for (size_t r = 0; r < sizeof render / sizeof render[0]; r++)
            if (!strcmp(c, render[r])) ty = 4;
        json_array_set_new(toks, (size_t)id, json_string(c));
        json_array_set_new(ttypes, (size_t)id, json_integer(ty));
    }
    json_array_foreach(merges, ai, v) {
        if (json_is_string(v)) {
            json_array_append(mj, v);
            continue;
        }
        /* pair form: joined by one space, a space inside a part written as U+0120 */
        char buf[1024];
        size_t o = 0;
        for (int part = 0; part < 2; part++) {
            const char *sp = json_string_value(json_array_get(v, (size_t)part));
            if (part && o < sizeof buf) buf[o++] = ' ';
            for (; sp && *sp && o + 2 < sizeof buf; sp++) {
                if (*sp == ' ') {
                    buf[o++] = (char)0xC4;
                    buf[o++] = (char)0xA0;
                } else {
                    buf[o++] = *sp;
                }
            }
        }
        json_array_append_new(mj, json_stringn(buf, o < sizeof buf ? o : sizeof buf - 1));
    }
    json_object_set_new(meta, "tokenizer.ggml.model", json_string("gemma4"));
    json_object_set_new(meta, "tokenizer.ggml.tokens", toks);
    json_object_set_new(meta, "tokenizer.ggml.scores", scores);
    json_object_set_new(meta, "tokenizer.ggml.token_type", ttypes);
    json_object_set_new(meta, "tokenizer.ggml.merges", mj);
    /* -1: the config has none (null or negative) */
    if (j->cfg.text.bos_token_id >= 0)
        json_object_set_new(meta, "tokenizer.ggml.bos_token_id", json_integer(j->cfg.text.bos_token_id));
    json_object_set_new(meta, "tokenizer.ggml.eos_token_id", json_integer(j->cfg.text.eos_token_id));
    if (j->cfg.text.pad_token_id >= 0)
        json_object_set_new(meta, "tokenizer.ggml.padding_token_id", json_integer(j->cfg.text.pad_token_id));
    const json_t *unk = json_object_get(vocab, "<unk>");
    if (unk) json_object_set_new(meta, "tokenizer.ggml.unknown_token_id", json_integer(json_integer_value(unk)));
    json_object_set_new(meta, "tokenizer.ggml.add_bos_token", json_true());
    json_object_set_new(meta, "tokenizer.ggml.add_space_prefix", json_false());
    char *tpl = NULL;
    size_t tl;
    g4_error e2;
    if (!g4_path_join(path, sizeof path, j->p->in, "chat_template.jinja", &e2) && g4_file_exists(path) &&
        !g4_read_file(path, &tpl, &tl, &e2)) {
        json_object_set_new(meta, "tokenizer.chat_template", json_stringn(tpl, tl));
        free(tpl);
    } else if (!g4_path_join(path, sizeof path, j->p->in, "tokenizer_config.json", &e2) && g4_file_exists(path)) {
        json_t *tc;
        if (!g4_json_load_file(path, &tc, &e2)) {
            const json_t *ct = json_object_get(tc, "chat_template");
            if (json_is_string(ct)) json_object_set(meta, "tokenizer.chat_template", (json_t *)ct);
            json_decref(tc);
        }
    }
    json_decref(tj);
    return meta;
}

/* The array of a tokenizer key: a JSON array (a tokenizer.json's, tokenizer_meta) or one left in a GGUF file. */
typedef struct meta_array {
    const json_t *json;
    g4_gguf_array file;
    int in_file;
} meta_array;

static meta_array meta_array_of(const json_t *meta, const char *key) {
    meta_array a = {json_object_get(meta, key), {0}, 0};
    a.in_file = g4_gguf_array_of(meta, key, &a.file);
    if (a.in_file || !json_is_array(a.json)) a.json = NULL;
    return a;
}

static double meta_array_num(const meta_array *a, size_t i) {
    return a->in_file ? g4_gguf_array_num(&a->file, i) : json_number_value(json_array_get(a->json, i));
}

/* Writes the tokenizer keys of a metadata object with the types llama.cpp's writer uses. */
static void write_tokenizer(g4_gguf_writer *w, const json_t *meta, int vocab_size, const char *arch) {
    const meta_array toks = meta_array_of(meta, "tokenizer.ggml.tokens");
    const char *model = json_string_value(json_object_get(meta, "tokenizer.ggml.model"));
    if ((!toks.json && !(toks.in_file && toks.file.type == G4_GGUF_STR)) || !model) {
        g4_gguf_add_str(w, "tokenizer.ggml.model", "none");
        char k[64];
        snprintf(k, sizeof k, "%s.vocab_size", arch);
        g4_gguf_add_u32(w, k, (uint32_t)vocab_size);
        return;
    }
    g4_gguf_add_str(w, "tokenizer.ggml.model", model);
    const char *pre = json_string_value(json_object_get(meta, "tokenizer.ggml.pre"));
    if (pre) g4_gguf_add_str(w, "tokenizer.ggml.pre", pre);
    static const char *arrays[] = {"tokenizer.ggml.tokens", "tokenizer.ggml.merges"};
    for (int a = 0; a < 2; a++) {
        const meta_array arr = meta_array_of(meta, arrays[a]);
        if (arr.in_file) { /* (as the file holds them: the reader refuses other than strings) */
            g4_gguf_add_array(w, arrays[a], &arr.file);
            continue;
        }
        size_t n = json_array_size(arr.json);
        const char **sv = malloc((n + 1) * sizeof *sv);
        if (!sv) {
            w->failed = 1;
            return;
        }
        for (size_t i = 0; i < n; i++) sv[i] = json_string_value(json_array_get(arr.json, i)) ? json_string_value(json_array_get(arr.json, i)) : "";
        if (arr.json) g4_gguf_add_str_arr(w, arrays[a], sv, n); /* an empty merges list too: the reader
                                                                 * (tok_gguf.c) needs the key */
        free(sv);
    }
    const meta_array sc = meta_array_of(meta, "tokenizer.ggml.scores"), ty = meta_array_of(meta, "tokenizer.ggml.token_type");
    size_t n = toks.in_file ? (size_t)toks.file.n : json_array_size(toks.json);
    float *f = malloc((n + 1) * sizeof *f);
    int32_t *t = malloc((n + 1) * sizeof *t);
    if (!f || !t) {
        free(f);
        free(t);
        w->failed = 1;
        return;
    }
    const int has_sc = sc.json || sc.in_file, has_ty = ty.json || ty.in_file;
    for (size_t i = 0; i < n; i++) {
        f[i] = has_sc ? (float)meta_array_num(&sc, i) : -1000.0f;
        t[i] = has_ty ? (int32_t)meta_array_num(&ty, i) : 1;
    }
    g4_gguf_add_arr(w, "tokenizer.ggml.scores", G4_GGUF_F32, f, n);
    g4_gguf_add_arr(w, "tokenizer.ggml.token_type", G4_GGUF_I32, t, n);
    free(f);
    free(t);
    static const char *ids[] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                "tokenizer.ggml.padding_token_id", "tokenizer.ggml.unknown_token_id"};
    for (size_t i = 0; i < 4; i++) {
        const json_t *v = json_object_get(meta, ids[i]);
        if (json_is_integer(v)) g4_gguf_add_u32(w, ids[i], (uint32_t)json_integer_value(v));
    }
    static const char *flags[] = {"tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_space_prefix"};
    for (size_t i = 0; i < 2; i++) {
        const json_t *v = json_object_get(meta, flags[i]);
        if (json_is_boolean(v)) g4_gguf_add_bool(w, flags[i], json_is_true(v));
    }
    const char *tpl = json_string_value(json_object_get(meta, "tokenizer.chat_template"));
    if (tpl) g4_gguf_add_str(w, "tokenizer.chat_template", tpl);
}

/* a weights file this run began and could not finish is not left to be loaded (a regular file only) */
/* The output is sized first and then written: one larger than the free space of its disk (a --random config of
 * huge sizes: hundreds of GB) is refused before anything is written, rather than fill the disk. */
static int check_space(const char *path, double bytes, g4_error *err) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir) dir[1] = 0;
    else if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    struct statvfs v;
    if (statvfs(dir, &v)) return 0; /* unknown: the writes say */
    const double avail = (double)v.f_bavail * (double)v.f_frsize;
    if (bytes > avail)
        return g4_fail(err, "%s: the output needs %.1f GB, its disk has %.1f GB free", path, bytes / 1e9, avail / 1e9);
    return 0;
}

/* The output's weight bytes in double (its size_t offsets can wrap for a config of absurd sizes): each tensor's
 * elements at its type's bytes per weight (MLX codes without their scales; a floor, as check_space needs). */
static double out_bytes(const job *j) {
    double total = 0;
    for (int i = 0; i < j->n_out; i++) {
        const out_tensor *o = &j->out[i];
        double n = 1, per = g4_dtype_bits(o->type) / 8.0;
        for (int d = 0; d < o->ndim; d++) n *= (double)o->shape[d];
        if (o->bits) per = o->bits / 8.0;
        else if (g4_dtype_is_quantized(o->type) && g4_dtype_block(o->type) > 0)
            per = (double)g4_dtype_block_bytes(o->type) / g4_dtype_block(o->type);
        total += n * per;
    }
    return total;
}

static void remove_partial(const char *path) {
    struct stat st;
    if (!stat(path, &st) && S_ISREG(st.st_mode)) remove(path);
}

/* llama.cpp's general.file_type (enum llama_ftype) of a file whose weights are mostly of type t; the K-quant
 * files written here are its "_S" mixes (every tensor that can be of the type is) */
static uint32_t llama_ftype(g4_dtype t) {
    switch (t) {
    case G4_F16: return 1;
    case G4_Q4_0: return 2;
    case G4_Q4_1: return 3;
    case G4_Q8_0: return 7;
    case G4_Q5_0: return 8;
    case G4_Q5_1: return 9;
    case G4_Q4_K: return 14;
    case G4_Q5_K: return 16;
    case G4_Q6_K: return 18;
    case G4_Q2_K: return 21; /* Q2_K_S */
    case G4_Q3_K: return 11; /* Q3_K_S */
    case G4_IQ4_NL: return 25;
    case G4_IQ4_XS: return 30;
    case G4_BF16: return 32;
    default: return 0; /* F32 */
    }
}

static int write_gguf(job *j, g4_error *err) {
    g4_gguf_writer w = {0};
    g4_gemma4_gguf_write_meta(&w, &j->cfg.text, j->cfg.assistant ? &j->cfg.asst : NULL);
    g4_gguf_add_u32(&w, "general.file_type", llama_ftype(j->target));
    err->msg[0] = 0;
    json_t *tmeta = tokenizer_meta(j, err);
    if (!tmeta && err->msg[0]) {
        g4_gguf_writer_free(&w);
        return -1;
    }
    write_tokenizer(&w, tmeta, j->cfg.text.vocab_size, j->cfg.assistant ? "gemma4-assistant" : "gemma4");
    json_decref(tmeta);
    /* generation_config.json's suppress_tokens where llama.cpp's converter writes them (gemma.py Gemma4UnifiedModel) */
    if (j->model && j->model->gen_config.n_suppress)
        g4_gguf_add_arr(&w, "tokenizer.ggml.suppress_tokens", G4_GGUF_I32, j->model->gen_config.suppress_ids,
                        (size_t)j->model->gen_config.n_suppress);
    for (int i = 0; i < j->n_out; i++) {
        out_tensor *o = &j->out[i];
        o->offset = w.data_size;
        o->bytes = g4_gguf_add_tensor(&w, o->name, o->type, o->ndim, o->shape);
    }
    const double need = out_bytes(j);
    if (check_space(j->p->out, need > (double)w.data_size ? need : (double)w.data_size, err)) {
        g4_gguf_writer_free(&w);
        return -1;
    }
    FILE *f = fopen(j->p->out, "wb");
    if (!f) {
        g4_gguf_writer_free(&w);
        return g4_fail(err, "%s: %s", j->p->out, strerror(errno));
    }
    int rc = g4_gguf_write_header(&w, f, err);
    size_t start = (size_t)ftell(f);
    g4_gguf_writer_free(&w);
    if (fflush(f) || ftruncate(fileno(f), (off_t)(start + (j->n_out ? j->out[j->n_out - 1].offset + ((j->out[j->n_out - 1].bytes + 31) & ~(size_t)31) : 0))))
        rc = rc ? rc : g4_fail(err, "%s: cannot size the file (%s)", j->p->out, strerror(errno));
    for (int i = 0; i < j->n_out; i++) j->out[i].offset += start;
    if (!rc) rc = write_all_tensors(j, fileno(f), err);
    if (fclose(f) && !rc) rc = g4_fail(err, "%s: write failed", j->p->out);
    if (rc) remove_partial(j->p->out);
    return rc;
}

/* safetensors output (MLX or HF folder): one model.safetensors */
static int write_safetensors_folder(job *j, g4_error *err) {
    if (mkdir(j->p->out, 0777) && errno != EEXIST) return g4_fail(err, "%s: %s", j->p->out, strerror(errno));
    int n = 0;
    g4_tensor *st = calloc((size_t)j->n_out * 3 + 1, sizeof *st);
    char (*names)[300] = calloc((size_t)j->n_out * 3 + 1, sizeof *names);
    if (!st || !names) {
        free(st);
        free(names);
        return g4_fail(err, "out of memory");
    }
    for (int i = 0; i < j->n_out; i++) {
        out_tensor *o = &j->out[i];
        g4_tensor *t = &st[n];
        snprintf(names[n], sizeof names[0], "%s", o->name);
        t->name = names[n];
        t->ndim = o->ndim;
        memcpy(t->shape, o->shape, sizeof o->shape);
        if (o->bits) {
            t->dtype = G4_U32;
            t->shape[o->ndim - 1] = o->shape[o->ndim - 1] * o->bits / 32;
        } else {
            t->dtype = o->type;
        }
        t->nbytes = tensor_bytes(o);
        n++;
        if (o->bits) {
            size_t base = strlen(o->name) - (ends_with(o->name, ".weight") ? 7 : 0);
            for (int k = 0; k < 2; k++) {
                g4_tensor *s = &st[n];
                snprintf(names[n], sizeof names[0], "%.*s.%s", (int)base, o->name, k ? "biases" : "scales");
                s->name = names[n];
                s->dtype = G4_BF16;
                s->ndim = o->ndim;
                memcpy(s->shape, o->shape, sizeof o->shape);
                s->shape[o->ndim - 1] = o->shape[o->ndim - 1] / o->group;
                s->nbytes = (size_t)g4_tensor_numel(s) * 2;
                n++;
            }
        }
    }
    size_t hl;
    char *hdr = g4_safetensors_header(st, n, &hl, err);
    char path[4096];
    int rc = hdr ? g4_path_join(path, sizeof path, j->p->out, "model.safetensors", err) : -1;
    size_t off = hl;
    for (int i = 0, k = 0; !rc && i < j->n_out; i++) {
        out_tensor *o = &j->out[i];
        o->offset = off;
        off += st[k++].nbytes;
        if (o->bits) {
            o->s_offset = off;
            off += st[k++].nbytes;
            o->b_offset = off;
            off += st[k++].nbytes;
        }
    }
    const double need = out_bytes(j);
    if (!rc) rc = check_space(path, need > (double)off ? need : (double)off, err);
    int fd = rc ? -1 : open(path, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    if (!rc && fd < 0) rc = g4_fail(err, "%s: %s", path, strerror(errno));
    if (!rc) {
        rc = pwrite_all(fd, hdr, hl, 0, err);
        if (!rc && ftruncate(fd, (off_t)off)) rc = g4_fail(err, "%s: cannot size the file (%s)", path, strerror(errno));
        if (!rc) rc = write_all_tensors(j, fd, err);
        if (close(fd) && !rc) rc = g4_fail(err, "%s: write failed", path);
        if (rc) remove_partial(path);
    }
    free(hdr);
    free(st);
    free(names);
    return rc;
}

/* config.json of the output folder: the source's (or the random config), plus the MLX
 * quantization block */
static int write_config(job *j, g4_error *err) {
    json_t *root = NULL;
    char path[4096];
    if (j->p->random_config) {
        if (g4_json_load_file(j->p->random_config, &root, err)) return -1;
    } else if (g4_gguf_is_file(j->p->in)) {
        return g4_fail(err, "writing a folder from a GGUF source is not supported (its config.json is not kept)");
    } else {
        if (g4_path_join(path, sizeof path, j->p->in, "config.json", err) || g4_json_load_file(path, &root, err))
            return -1;
    }
    json_object_del(root, "quantization");
    json_object_del(root, "quantization_config");
    if (j->kind == OUT_MLX) {
        json_t *q = json_pack("{s:i,s:i,s:s}", "group_size", j->group, "bits", j->bits, "mode", "affine");
        for (int i = 0; i < j->n_out; i++)
            if (j->out[i].bits && (j->out[i].bits != j->bits || j->out[i].group != j->group)) {
                char mod[300];
                snprintf(mod, sizeof mod, "%.*s", (int)(strlen(j->out[i].name) - 7), j->out[i].name);
                json_object_set_new(q, mod, json_pack("{s:i,s:i}", "group_size", j->out[i].group, "bits", j->out[i].bits));
            }
        json_object_set(root, "quantization", q);
        json_object_set_new(root, "quantization_config", q);
    }
    int rc = g4_path_join(path, sizeof path, j->p->out, "config.json", err);
    if (!rc && json_dump_file(root, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER))
        rc = g4_fail(err, "%s: cannot write", path);
    json_decref(root);
    if (rc || !j->p->in) return rc;
    /* the files a model folder carries beside its weights */
    static const char *extra[] = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                                  "generation_config.json"};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
        char src[4096], dst[4096], *data;
        size_t len;
        if (g4_path_join(src, sizeof src, j->p->in, extra[i], err) || !g4_file_exists(src)) continue;
        if (g4_path_join(dst, sizeof dst, j->p->out, extra[i], err) || g4_read_file(src, &data, &len, err)) return -1;
        FILE *f = fopen(dst, "wb");
        int ok = f && fwrite(data, 1, len, f) == len;
        if (f && fclose(f)) ok = 0;
        free(data);
        if (!ok) return g4_fail(err, "%s: cannot write", dst);
    }
    return 0;
}

/* whether a and b name the same file or folder (b need not exist) */
static int same_path(const char *a, const char *b) {
    struct stat sa, sb;
    return !stat(a, &sa) && !stat(b, &sb) && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int g4_quantize(const g4_quantize_params *p, g4_error *err) {
    G4_ARG(p, err);
    job j = {.p = p, .group = p->group ? p->group : 64};
    int ti = -1;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (p->type && !strcmp(p->type, types[i].name)) ti = (int)i;
    if (ti < 0) { /* the names of the table, so that the message cannot fall behind it */
        char names[256] = "";
        for (size_t i = 0, len = 0; i < sizeof types / sizeof types[0] && len < sizeof names; i++)
            len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", i ? ", " : "", types[i].name);
        return g4_fail(err, "unknown type '%s' (%s)", p->type ? p->type : "", names);
    }
    j.target = types[ti].t;
    j.kind = types[ti].kind >= 0 ? types[ti].kind : ends_with(p->out, ".gguf") ? OUT_GGUF : OUT_HF;
    j.bits = g4_mlx_bits(j.target);
    if (j.kind == OUT_GGUF && !ends_with(p->out, ".gguf")) return g4_fail(err, "%s: a GGUF output must end in .gguf", p->out);
    if (j.group != 32 && j.group != 64 && j.group != 128) return g4_fail(err, "--group must be 32, 64 or 128");
    if (p->in && same_path(p->in, p->out))
        return g4_fail(err, "%s: the output is the input (it would be overwritten while it is read)", p->out);
    if (p->in && j.kind != OUT_GGUF && g4_gguf_is_file(p->in)) /* before any file is written */
        return g4_fail(err, "writing a folder from a GGUF source is not supported (its config.json is not kept)");
    if (p->in) {
        g4_load_params lp = {.n_threads = 1, .device = "cpu"}; /* reads the weights where they lie: on the host */
        if (g4_model_load_either(p->in, &lp, &j.model, err)) return -1;
        j.cfg = j.model->cfg;
        if (j.cfg.assistant && j.kind != OUT_GGUF) { /* its config.json is not written */
            g4_model_free(j.model);
            return g4_fail(err, "%s is a drafter (gemma4_assistant): it is written as GGUF only (llama.cpp's "
                                "gemma4-assistant layout)", p->in);
        }
    } else {
        json_t *root;
        if (!p->random_config) return g4_fail(err, "no input model");
        if (g4_json_load_file(p->random_config, &root, err)) return -1;
        int rc = g4_config_parse(root, p->random_config, &j.cfg, err);
        json_decref(root);
        if (rc) return -1;
    }
    int rc = g4_model_tensor_list(&j.cfg, j.model ? &j.model->weights : NULL, &j.list, &j.n_list, err);
    if (!rc) rc = j.kind == OUT_GGUF ? plan_gguf(&j, err) : j.kind == OUT_MLX ? plan_mlx(&j, err) : plan_hf(&j, err);
    if (!rc) rc = j.kind == OUT_GGUF ? write_gguf(&j, err) : write_safetensors_folder(&j, err);
    if (!rc && j.kind != OUT_GGUF) rc = write_config(&j, err);
    for (int i = 0; i < j.n_list; i++) free((char *)j.list[i].name);
    free(j.list);
    free(j.out);
    g4_model_free(j.model);
    return rc;
}
