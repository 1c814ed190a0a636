/* Loading a Gemma 4 model: config, weights (safetensors folders, MLX quantized folders, GGUF files), binding
 * by architecture.
 *
 * Binding walks the architecture (docs/gemma4-text.md section 2) and looks up every
 * tensor it needs, checking dtype and shape. Tensors that are truly missing are
 * reported together, by name; tensors that nothing uses are reported as warnings, except
 * weights this architecture binds under another config (layers past num_hidden_layers,
 * per-layer-input weights with hidden_size_per_layer_input 0, v_proj of a keys-as-values
 * layer, experts without enable_moe_block, biases without attention_bias): there the config
 * does not describe the weights, and loading fails (left_out_by_config).
 * Tensors absent or ignored by design are neither: k/v projections and k_norm of
 * KV-shared layers, v_proj of k_eq_v layers, v_norm, lm_head when tied, rotary
 * buffers, and tower tensors of a checkpoint whose config has no such tower. The towers
 * a config names bind their weights through the same binder (g4_binder, model.h).
 *
 * Placement (src/backend/backend.h): the backend is created first; every bound matrix is uploaded to it as it
 * is bound (the CPU keeps the memory-mapped view), except the per-layer embedding table on a backend with its
 * own memory, which stays on the host (it is read one row per token). Small vectors (norm weights, router
 * scales, RoPE frequencies) are converted to f32 on the host and then copied into one backend buffer.
 * Start-up never reads the whole file: on the CPU the weights are paged in by the first steps that use them. */
#include "model/model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "core/json.h"
#include "core/mapped_file.h"
#include "core/quant.h"
#include "formats/gguf_gemma4.h"
#include "formats/gguf_mmproj.h"
#include "formats/mlx.h"
#include "formats/safetensors.h"
#include "towers/audio.h"
#include "towers/unified.h"
#include "towers/vision.h"

struct g4_binder {
    g4_model *m;
    const char *prefix; /* of every name looked up: the decoder's weight prefix, "" for the towers */
    size_t bytes_total, bytes_placed; /* for progress while uploading */
    void (*progress)(float fraction, const char *what, void *user);
    void *progress_user;
    unsigned char *used; /* per tensor of m->weights */
    char missing[1024];
    int n_missing;
    g4_error *err;
    int failed; /* a hard error (wrong shape / dtype / memory) is in err */
    /* collect mode (g4_model_tensor_list): record every tensor the architecture binds instead */
    int collect;
    g4_tensor *list;
    int n_list;
    unsigned char held_told[G4_DTYPE_COUNT]; /* a type the backend holds as another was told (place_done) */
};
typedef struct g4_binder binder;

static float collect_dummy[1];

static void add_missing(binder *b, const char *name) {
    size_t len = strlen(b->missing);
    if (b->n_missing < 6)
        snprintf(b->missing + len, sizeof b->missing - len, "%s%s", b->n_missing ? ", " : "", name);
    b->n_missing++;
}

static int dtype_ok_for_matrix(g4_dtype t) {
    return t == G4_BF16 || t == G4_F16 || t == G4_F32 || g4_dtype_is_quantized(t);
}

/* Random mode: a tensor of the shape the architecture asks for, without data (the backend fills it). */
static const g4_tensor *make_tensor(binder *b, const char *full, int ndim, const int64_t *shape) {
    g4_model *m = b->m;
    g4_tensor **list = realloc(m->made, (size_t)(m->n_made + 2) * sizeof *list);
    g4_tensor *t = calloc(1, sizeof *t);
    char *name = strdup(full);
    if (list) m->made = list;
    if (!list || !t || !name) {
        free(t);
        free(name);
        g4_fail(b->err, "out of memory");
        b->failed = 1;
        return NULL;
    }
    t->name = name;
    t->dtype = G4_BF16;
    t->ndim = ndim;
    memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    /* matrices in the asked type (g4_load_params.random_type), as `gemma4c quantize` would write them: routers
     * and the host-kept per-layer table stay BF16, rows that are not whole blocks Q8_0 (or BF16) */
    const g4_dtype rt = m->random_type;
    const int64_t in = ndim ? shape[ndim - 1] : 1;
    const size_t fl = strlen(full), rl = strlen("router.proj.weight");
    const int router = fl >= rl && !strcmp(full + fl - rl, "router.proj.weight");
    const int ple_host = m->ple_on_host && strstr(full, "embed_tokens_per_layer.weight");
    if (ndim >= 2 && rt != G4_BF16 && !router && !ple_host) {
        if (g4_dtype_is_mlx(rt)) {
            t->dtype = in % 64 == 0 ? rt : G4_BF16;
            t->group = 64;
            t->scale_dtype = G4_BF16;
        } else {
            t->dtype = g4_quant_row_type(rt, in);
        }
    }
    t->nbytes = (size_t)g4_tensor_nrows(t) * g4_tensor_row_bytes(t);
    m->made[m->n_made++] = t;
    return t;
}

/* Looks up a tensor by its full name, checks the shape (ndim 0: a scalar, [] or [1]); NULL (and records why)
 * when absent or wrong. */
static const g4_tensor *bind_full(binder *b, const char *full, int ndim, const int64_t *shape) {
    if (b->failed) return NULL;
    if (b->collect) {
        g4_tensor *nl = realloc(b->list, (size_t)(b->n_list + 1) * sizeof *nl);
        char *nm = strdup(full);
        if (!nl || !nm) {
            if (nl) b->list = nl;
            free(nm);
            g4_fail(b->err, "out of memory");
            b->failed = 1;
            return NULL;
        }
        b->list = nl;
        g4_tensor *t = &b->list[b->n_list++];
        *t = (g4_tensor){.name = nm, .dtype = G4_BF16, .ndim = ndim, .data = collect_dummy};
        memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
        return t;
    }
    if (b->m->random) return make_tensor(b, full, ndim, shape);
    const g4_tensor *t = g4_tensor_set_find(&b->m->weights, full);
    if (!t) {
        add_missing(b, full);
        return NULL;
    }
    b->used[t - b->m->weights.tensors] = 1;
    int same = t->ndim == ndim || (ndim == 0 && t->ndim == 1 && t->shape[0] == 1);
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char s1[128], s2[128];
        g4_fail(b->err, "tensor '%s' has shape %s, the config implies %s", full, g4_shape_str(t->shape, t->ndim, s1, sizeof s1),
                g4_shape_str(shape, ndim, s2, sizeof s2));
        b->failed = 1;
        return NULL;
    }
    if (!dtype_ok_for_matrix(t->dtype)) {
        g4_fail(b->err,
                "tensor '%s' has dtype %s (supported: BF16, F16, F32, GGUF Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q2_K/Q3_K/Q4_K/Q5_K/"
                "Q6_K/IQ4_NL/IQ4_XS, MLX affine)",
                full, t->dtype ? g4_dtype_name(t->dtype) : "of a kind this engine does not read");
        b->failed = 1;
        return NULL;
    }
    return t;
}

/* The same for b->prefix + name. */
static const g4_tensor *bind_shape(binder *b, const char *name, int ndim, const int64_t *shape) {
    char full[512];
    snprintf(full, sizeof full, "%s%s", b->prefix, name);
    return bind_full(b, full, ndim, shape);
}

/* Where t's backend copy goes: a random model's made tensor becomes its own copy (uploaded from a copy of its
 * header, *src), a file's tensor gets m->placed[i]. */
static g4_tensor *place_target(g4_model *m, const g4_tensor *t, g4_tensor *tmp, const g4_tensor **src) {
    if (m->random) {
        *tmp = *t;
        *src = tmp;
        return (g4_tensor *)t;
    }
    *src = t;
    return &m->placed[t - m->weights.tensors];
}

/* After an upload of t[0 .. count) (as src[]) into dst[]: the bookkeeping (failed: the binder fails, a random
 * model's tensors lose their data); 0 when it succeeded. A backend that holds a type as another whose values
 * differ (backend.h, upload_weight; not g4_transcode_exact) is told once per type, as a warning of the model; an
 * exact layout of the backend's own (the CPU's AF4 for MLX4, CUDA's MLX4 for MLX3) is not. */
static int place_done(binder *b, int failed, const g4_tensor **t, const g4_tensor *const *src, g4_tensor **dst,
                      int count) {
    g4_model *m = b->m;
    if (failed) {
        for (int i = 0; i < count; i++)
            if (m->random) dst[i]->data = NULL;
        b->failed = 1;
        return -1;
    }
    for (int i = 0; i < count; i++) {
        if (!m->random) m->uploaded[t[i] - m->weights.tensors] = 1;
        b->bytes_placed += t[i]->nbytes;
        const g4_dtype from = src[i]->dtype, to = dst[i]->dtype;
        if (from != to && from > 0 && from < G4_DTYPE_COUNT && !b->held_told[from] && !g4_transcode_exact(from, to)) {
            b->held_told[from] = 1;
            g4_warn(&m->warnings, "the %s backend holds the %s tensors as %s (re-encoded: %g bits a weight)",
                    m->be->ops->name, g4_dtype_name(from), g4_dtype_name(to),
                    8.0 * g4_dtype_block_bytes(to) / g4_dtype_block(to));
        }
    }
    if (b->progress && !m->be->ops->host_memory)
        b->progress((float)((double)b->bytes_placed / (double)b->bytes_total), "loading weights", b->progress_user);
    return 0;
}

/* The backend's copy of a bound matrix (uploaded once, however often it is bound). */
static const g4_tensor *place(binder *b, const g4_tensor *t) {
    if (!t || b->failed) return NULL;
    if (b->collect) return t;
    g4_model *m = b->m;
    if (!m->random && m->placed[t - m->weights.tensors].data) return &m->placed[t - m->weights.tensors];
    g4_tensor tmp;
    const g4_tensor *src;
    g4_tensor *dst = place_target(m, t, &tmp, &src);
    return place_done(b, m->be->ops->upload_weight(m->be, src, dst, b->err) != 0, &t, &src, &dst, 1) ? NULL : dst;
}

/* place() for the weights of a set (q/k/v, gate/up: t[0 .. count), bound and not yet placed), in one block of
 * backend memory where the backend can (upload_weights: their products may then be one); t[i] becomes its placed
 * copy. */
static void place_set(binder *b, const g4_tensor **t, int count) {
    g4_model *m = b->m;
    int together = !b->failed && !b->collect && m->be->ops->upload_weights && count > 1;
    for (int i = 0; together && i < count; i++)
        together = t[i] && (m->random || !m->placed[t[i] - m->weights.tensors].data);
    if (!together) {
        for (int i = 0; i < count; i++) t[i] = place(b, t[i]);
        return;
    }
    g4_tensor tmp[G4_MATMUL_SET_MAX], *dst[G4_MATMUL_SET_MAX];
    const g4_tensor *src[G4_MATMUL_SET_MAX];
    for (int i = 0; i < count; i++) dst[i] = place_target(m, t[i], &tmp[i], &src[i]);
    const int failed = place_done(b, m->be->ops->upload_weights(m->be, src, dst, count, b->err) != 0, t, src, dst, count);
    for (int i = 0; i < count; i++) t[i] = failed ? NULL : dst[i];
}

static const g4_tensor *bind2(binder *b, const char *name, int64_t d0, int64_t d1) {
    int64_t s[2] = {d0, d1};
    return place(b, bind_shape(b, name, 2, s));
}

static const g4_tensor *bind3(binder *b, const char *name, int64_t d0, int64_t d1, int64_t d2) {
    int64_t s[3] = {d0, d1, d2};
    return place(b, bind_shape(b, name, 3, s));
}

/* Adds a host block of n floats to the model's vectors: `*field` is pointed at its backend copy by
 * place_vectors() once binding is done (until then at the host block). */
static float *vec_slot(binder *b, size_t n, const float **field) {
    if (b->failed) return NULL;
    g4_model *m = b->m;
    float *v = malloc((n ? n : 1) * sizeof(float));
    g4_vec_slot *slots = realloc(m->vecs, (size_t)(m->n_vecs + 1) * sizeof *slots);
    if (!v || !slots) {
        free(v);
        if (slots) m->vecs = slots;
        g4_fail(b->err, "out of memory");
        b->failed = 1;
        return NULL;
    }
    m->vecs = slots;
    slots[m->n_vecs++] = (g4_vec_slot){v, n, field};
    if (field) *field = v;
    return v;
}

/* A small tensor (norm weights, scales, biases) converted to f32 into a vector slot. Returns the host copy. */
static const float *bind_f32(binder *b, const char *name, int ndim, const int64_t *shape, const float **field) {
    const g4_tensor *t = bind_shape(b, name, ndim, shape);
    if (!t || b->collect) return t ? collect_dummy : NULL;
    if (g4_dtype_is_quantized(t->dtype)) {
        g4_fail(b->err, "tensor '%s%s' is quantized (%s); vectors must be BF16, F16 or F32", b->prefix, name,
                g4_dtype_name(t->dtype));
        b->failed = 1;
        return NULL;
    }
    const size_t n = (size_t)g4_tensor_numel(t);
    float *v = vec_slot(b, n, field);
    if (v && b->m->random) /* random mode: 1 +- 0.1 */
        for (size_t i = 0; i < n; i++) v[i] = 1.0f + g4_random_value(g4_name_seed(t->name), (uint64_t)i, 0.1f);
    else if (v)
        g4_to_f32(t->dtype, t->data, v, n);
    return v;
}

static const float *bind_vec(binder *b, const char *name, int64_t n, const float **field) {
    return bind_f32(b, name, 1, &n, field);
}

const g4_tensor *g4_bind_matrix(g4_binder *b, const char *name, int ndim, const int64_t *shape) {
    return place(b, bind_shape(b, name, ndim, shape));
}

const g4_tensor *g4_bind_matrix_flat(g4_binder *b, const char *name, int ndim, const int64_t *shape) {
    g4_tensor *t = (g4_tensor *)bind_shape(b, name, ndim, shape);
    if (t && ndim > 2) { /* before placing: a backend lays out (and may pad) whole rows of the last dimension */
        int64_t in = 1;
        for (int d = 1; d < ndim; d++) in *= shape[d];
        t->ndim = 2;
        t->shape[1] = in;
    }
    return place(b, t);
}

const float *g4_bind_vector(g4_binder *b, const char *name, int ndim, const int64_t *shape, const float **field) {
    return bind_f32(b, name, ndim, shape, field);
}

float g4_bind_scalar(g4_binder *b, const char *name) {
    const g4_tensor *t = bind_shape(b, name, 0, NULL);
    float f = 0;
    if (t) f = b->m->random ? 1.0f : (g4_to_f32(t->dtype, t->data, &f, 1), f);
    return f;
}

void g4_warn_clip_bounds_absent(g4_model *m, const char *tower, int n_absent) {
    if (n_absent)
        g4_warn(&m->warnings, "%d clip bound%s of the %s tower's linears %s not in the weights: unbounded there (-inf / "
                "+inf, the value transformers makes the buffers with)", n_absent, n_absent > 1 ? "s" : "", tower,
                n_absent > 1 ? "are" : "is");
}

float g4_bind_scalar_or(g4_binder *b, const char *name, float absent_value, int *n_absent) {
    if (!b->failed && !b->m->random) {
        char full[512];
        snprintf(full, sizeof full, "%s%s", b->prefix, name);
        if (!g4_tensor_set_find(&b->m->weights, full)) {
            (*n_absent)++;
            return absent_value;
        }
    }
    return g4_bind_scalar(b, name);
}

float *g4_bind_computed(g4_binder *b, size_t n, const float **field) { return vec_slot(b, n, field); }

int g4_bind_failed(const g4_binder *b) { return b->failed; }

/* Copies every bound vector into one backend buffer and points the fields there (the CPU backend reads host
 * memory: the host blocks are used as they are). */
static int place_vectors(g4_model *m, g4_error *err) {
    g4_backend *be = m->be;
    if (be->ops->host_memory) return 0;
    size_t total = 0;
    for (int i = 0; i < m->n_vecs; i++) /* 64-byte aligned starts; a vector without a field is read on the host */
        if (m->vecs[i].field) total += (m->vecs[i].n + 15) & ~(size_t)15;
    if (!total) return 0;
    m->vec_arena = be->ops->alloc(be, total * sizeof(float));
    if (!m->vec_arena) return g4_fail(err, "out of %s memory for %zu bytes of norm weights", be->ops->name, total * 4);
    size_t off = 0;
    for (int i = 0; i < m->n_vecs; i++) {
        g4_vec_slot *v = &m->vecs[i];
        if (!v->field) continue;
        be->ops->to_device(be, m->vec_arena + off, v->host, v->n * sizeof(float));
        *v->field = m->vec_arena + off;
        off += (v->n + 15) & ~(size_t)15;
    }
    be->ops->sync(be);
    return 0;
}

static void fmt_name(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fmt_name(char *buf, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
}

/* Whether any tensor's name starts with `prefix` (names are sorted: one binary search). */
static int holds_prefix(const g4_tensor_set *set, const char *prefix) {
    const size_t n = strlen(prefix);
    int lo = 0, hi = set->n_tensors;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (strcmp(set->tensors[mid].name, prefix) < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo < set->n_tensors && !strncmp(set->tensors[lo].name, prefix, n);
}

static int is_tower_tensor(const char *name) {
    /* HF names, and the towers Ollama's GGUF files carry beside the decoder (v.*, a.*, mm.*: docs/formats.md 3) */
    static const char *towers[] = {"model.vision_tower.", "model.audio_tower.", "model.embed_vision.",
                                   "model.embed_audio.", "model.multi_modal_projector.", "v.", "a.", "mm."};
    for (size_t i = 0; i < sizeof towers / sizeof towers[0]; i++)
        if (!strncmp(name, towers[i], strlen(towers[i]))) return 1;
    return 0;
}

/* Tensors a checkpoint may carry that the architecture ignores by design. */
static int ignored_by_design(const g4_model *m, const char *name) {
    const g4_text_config *c = &m->cfg.text;
    const char *pre = m->cfg.weight_prefix;
    size_t pl = strlen(pre);
    if (!strcmp(name, "lm_head.weight") && c->tie_word_embeddings) return 1;
    if (!strcmp(name, "rope_freqs.weight")) return 1; /* GGUF: the config's RoPE, read when loading */
    if (strncmp(name, pre, pl)) return 0;
    const char *rest = name + pl;
    if (strstr(rest, "rotary_emb.") || strstr(rest, "v_norm.weight")) return 1;
    int l;
    char tail[256];
    if (sscanf(rest, "layers.%d.self_attn.%255s", &l, tail) == 2 && l >= 0 && l < c->n_layers &&
        c->layer_kv_shared[l] &&
        (!strncmp(tail, "k_proj.", 7) || !strncmp(tail, "v_proj.", 7) || !strncmp(tail, "k_norm.", 7)))
        return 1;
    return 0;
}

/* A tensor of the weights that this architecture binds under another config: the config leaves out weights the
 * checkpoint has (a different model would run), an error; `why` names the config field. 0 for any other name
 * (an unknown tensor is a warning only). Checked after ignored_by_design(). */
static int left_out_by_config(const g4_model *m, const char *name, char *why, size_t cap) {
    const g4_text_config *c = &m->cfg.text;
    const char *pre = m->cfg.weight_prefix;
    const size_t pl = strlen(pre);
    int l, k = 0;
    if (m->cfg.has_vision && !m->cfg.unified &&
        sscanf(name, "model.vision_tower.encoder.layers.%d.%n", &l, &k) == 1 && k > 0 && l >= m->cfg.vision.n_layers) {
        snprintf(why, cap, "vision_config.num_hidden_layers is %d", m->cfg.vision.n_layers);
        return 1;
    }
    if (strncmp(name, pre, pl)) return 0;
    const char *rest = name + pl;
    static const char *const ple[] = {"embed_tokens_per_layer.weight", "per_layer_model_projection.weight",
                                      "per_layer_projection_norm.weight"};
    for (size_t i = 0; i < sizeof ple / sizeof ple[0]; i++)
        if (!strcmp(rest, ple[i]) && c->hidden_size_per_layer_input == 0) {
            snprintf(why, cap, "hidden_size_per_layer_input is 0");
            return 1;
        }
    k = 0;
    if (sscanf(rest, "layers.%d.%n", &l, &k) != 1 || k == 0 || l < 0) return 0;
    const char *tail = rest + k;
    if (l >= c->n_layers) {
        snprintf(why, cap, "num_hidden_layers is %d", c->n_layers);
        return 1;
    }
    if (c->hidden_size_per_layer_input == 0 &&
        (!strncmp(tail, "per_layer_input_gate.", 21) || !strncmp(tail, "per_layer_projection.", 21) ||
         !strncmp(tail, "post_per_layer_input_norm.", 26))) {
        snprintf(why, cap, "hidden_size_per_layer_input is 0");
        return 1;
    }
    if (!c->enable_moe_block &&
        (!strncmp(tail, "router.", 7) || !strncmp(tail, "experts.", 8) ||
         !strncmp(tail, "pre_feedforward_layernorm_2.", 28) || !strncmp(tail, "post_feedforward_layernorm_1.", 29) ||
         !strncmp(tail, "post_feedforward_layernorm_2.", 29))) {
        snprintf(why, cap, "enable_moe_block is false");
        return 1;
    }
    if (!c->layer_kv_shared[l] && c->layer_k_eq_v[l] && !strncmp(tail, "self_attn.v_proj.", 17)) {
        snprintf(why, cap, "attention_k_eq_v: layer %d takes its values from k_proj", l);
        return 1;
    }
    if (!c->attention_bias && !strncmp(tail, "self_attn.", 10) && strlen(tail) > 15 &&
        !strcmp(tail + strlen(tail) - 10, "_proj.bias")) {
        snprintf(why, cap, "attention_bias is false");
        return 1;
    }
    return 0;
}

/* Bytes of the BF16 weights a config binds (for the progress of a random model, and its memory check); in double:
 * a config's sizes (each up to 1e9) can multiply past size_t. */
static double random_bytes(const g4_text_config *c) {
    const double H = c->hidden_size, NH = c->n_heads, P = c->hidden_size_per_layer_input;
    double n = (double)c->vocab_size * H + (double)c->n_layers * P * H;
    for (int l = 0; l < c->n_layers; l++) {
        const double D = c->layer_head_dim[l], KV = c->layer_kv_heads[l];
        n += 2 * NH * D * H + 3 * (double)c->layer_intermediate[l] * H + 2 * P * H;
        if (!c->layer_kv_shared[l]) n += (c->layer_k_eq_v[l] ? 1 : 2) * KV * D * H;
        if (c->enable_moe_block) n += (double)c->num_experts * (H + 3 * (double)c->moe_intermediate_size * H);
    }
    return 2 * n;
}

/* Random weights are made in memory: a config whose weights cannot fit this machine's memory is refused before
 * any is made (a huge config otherwise allocated and filled until the allocator or the OOM killer stopped it).
 * The matrices' bytes scale with the asked type; the estimate is kept low (per weight, the type's bytes). */
static int check_random_memory(const g4_model *m, const g4_text_config *c, g4_error *err) {
    const g4_dtype t = m->random_type;
    double per = g4_dtype_bits(t) / 8.0; /* F32/F16/BF16 */
    if (g4_dtype_is_mlx(t)) per = g4_mlx_bits(t) / 8.0;
    else if (g4_dtype_is_quantized(t) && g4_dtype_block(t) > 0) per = (double)g4_dtype_block_bytes(t) / g4_dtype_block(t);
    const double need = random_bytes(c) / 2 * per;
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    const double have = pages > 0 && page > 0 ? (double)pages * (double)page : 0;
    if (have > 0 && need > have)
        return g4_fail(err, "%s: random weights of this config need %.1f GB, more than this machine's %.1f GB of memory",
                       m->dir, need / 1e9, have / 1e9);
    return 0;
}

/* masked_embedding.token_ordering: [V] integer ids, a permutation of the vocabulary, into backend memory. */
static void bind_token_ordering(binder *b) {
    g4_model *m = b->m;
    const int V = m->cfg.text.vocab_size;
    const char *name = "masked_embedding.token_ordering";
    const g4_tensor *t = b->failed ? NULL : g4_tensor_set_find(&m->weights, name);
    if (!t) {
        if (!b->failed) add_missing(b, name);
        return;
    }
    b->used[t - m->weights.tensors] = 1;
    if (t->ndim != 1 || t->shape[0] != V || (t->dtype != G4_I64 && t->dtype != G4_I32)) {
        g4_fail(b->err, "tensor '%s' must be [%d] of I64 or I32", name, V);
        b->failed = 1;
        return;
    }
    int32_t *ids = malloc((size_t)V * sizeof *ids);
    unsigned char *seen = calloc((size_t)V, 1);
    m->token_ordering = ids && seen ? m->be->ops->alloc(m->be, (size_t)V * sizeof *ids) : NULL;
    if (!m->token_ordering) {
        g4_fail(b->err, "out of memory");
        b->failed = 1;
    }
    for (int i = 0; i < V && !b->failed; i++) {
        int64_t v;
        if (t->dtype == G4_I64) {
            memcpy(&v, (const char *)t->data + 8 * (size_t)i, 8);
        } else {
            int32_t v32;
            memcpy(&v32, (const char *)t->data + 4 * (size_t)i, 4);
            v = v32;
        }
        if (v < 0 || v >= V || seen[v]) {
            g4_fail(b->err, "tensor '%s' is not a permutation of the vocabulary (entry %d is %lld)", name, i,
                    (long long)v);
            b->failed = 1;
            break;
        }
        seen[v] = 1;
        ids[i] = (int32_t)v;
    }
    if (!b->failed) {
        m->be->ops->to_device(m->be, m->token_ordering, ids, (size_t)V * sizeof *ids);
        m->be->ops->sync(m->be);
    }
    free(ids);
    free(seen);
}

/* A drafter's own tensors outside its decoder (docs/gemma4-assistant.md 2). */
static void bind_assistant(binder *b) {
    g4_model *m = b->m;
    const g4_assistant_config *a = &m->cfg.asst;
    const int64_t Ha = m->cfg.text.hidden_size, Hb = a->backbone_hidden_size;
    const int64_t pre[2] = {Ha, 2 * Hb}, post[2] = {Hb, Ha}, cent[2] = {a->num_centroids, Ha};
    m->pre_projection = place(b, bind_full(b, "pre_projection.weight", 2, pre));
    m->post_projection = place(b, bind_full(b, "post_projection.weight", 2, post));
    /* a tensor list (quantize) holds the projections: the masked embedding is written as llama.cpp's converter
     * writes it, not at all (README: such a file's drafts rank the whole vocabulary) */
    if (!a->use_ordered_embeddings || b->collect) return;
    m->centroids = place(b, bind_full(b, "masked_embedding.centroids.weight", 2, cent));
    bind_token_ordering(b);
}

static int bind_weights(g4_model *m, const g4_load_params *params, g4_error *err, binder *collect) {
    const g4_text_config *c = &m->cfg.text;
    const int H = c->hidden_size, L = c->n_layers, NH = c->n_heads, P = c->hidden_size_per_layer_input;
    binder b = {.m = m, .prefix = m->cfg.weight_prefix, .err = err, .progress = params->progress,
                .progress_user = params->progress_user};
    if (collect) b.collect = 1;
    for (int i = 0; i < m->weights.n_tensors; i++) b.bytes_total += m->weights.tensors[i].nbytes;
    if (m->random) {
        if ((!m->be || m->be->ops->host_memory) && check_random_memory(m, c, err)) return -1;
        const double rb = random_bytes(c);
        b.bytes_total = rb < 1e18 ? (size_t)rb : (size_t)1e18;
    }
    if (!b.bytes_total) b.bytes_total = 1;
    b.used = calloc((size_t)m->weights.n_tensors + 1, 1);
    m->layers = calloc((size_t)L, sizeof *m->layers);
    m->placed = calloc((size_t)m->weights.n_tensors + 1, sizeof *m->placed);
    m->uploaded = calloc((size_t)m->weights.n_tensors + 1, 1);
    if (!b.used || !m->layers || !m->placed || !m->uploaded) {
        free(b.used);
        return g4_fail(err, "out of memory");
    }
    char n[256];
    m->embed = bind2(&b, "embed_tokens.weight", c->vocab_size, H);
    bind_vec(&b, "norm.weight", H, &m->final_norm);
    if (c->tie_word_embeddings) {
        m->lm_head = m->embed;
    } else if (b.collect) {
        int64_t hs[2] = {c->vocab_size, H};
        const g4_tensor *t = bind_shape(&b, "", 2, hs);
        if (t) {
            free((char *)t->name);
            ((g4_tensor *)t)->name = strdup("lm_head.weight");
            if (!t->name) b.failed = 1;
        }
    } else {
        const g4_tensor *t = g4_tensor_set_find(&m->weights, "lm_head.weight");
        if (!t) {
            add_missing(&b, "lm_head.weight");
        } else if (t->ndim != 2 || t->shape[0] != c->vocab_size || t->shape[1] != H || !dtype_ok_for_matrix(t->dtype)) {
            b.failed = 1;
            g4_fail(err, "tensor 'lm_head.weight' must be [%d, %d] of BF16/F16/F32", c->vocab_size, H);
        } else {
            b.used[t - m->weights.tensors] = 1;
            m->lm_head = place(&b, t);
        }
    }
    if (P > 0) {
        /* on a backend with its own memory the table stays on the host: rows are gathered per step */
        int64_t ple_shape[2] = {c->vocab_size_per_layer_input, (int64_t)L * P};
        m->ple_on_host = m->be && !m->be->ops->host_memory;
        m->ple_embed = bind_shape(&b, "embed_tokens_per_layer.weight", 2, ple_shape);
        /* A row read for the first time costs page faults (4 KB pages; a gVisor host makes them dear: H200 machine,
         * E2B decode of 100 sequences, random ids, 627-659 us a step with the GPU idle before its recording, 266-282
         * us with the zeros' pages mapped at load): the random table's pages are mapped at load, a file's are asked
         * ahead into the page cache. */
        if (m->ple_on_host && m->random && m->ple_embed) { /* zeros on the host: read one row per token */
            size_t bytes = m->ple_embed->nbytes;
            m->host_table =
                mmap(NULL, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_POPULATE, -1, 0);
            if (m->host_table == MAP_FAILED) {
                m->host_table = NULL;
                free(b.used);
                return g4_fail(err, "out of memory for the per-layer embedding table (%zu bytes)", bytes);
            }
            ((g4_tensor *)m->ple_embed)->data = m->host_table;
        } else if (m->ple_on_host && m->ple_embed && m->ple_embed->data) {
            const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)m->ple_embed->data & ~(page - 1);
            madvise((void *)a, (uintptr_t)m->ple_embed->data + m->ple_embed->nbytes - a, MADV_WILLNEED);
        }
        if (!m->ple_on_host) m->ple_embed = place(&b, m->ple_embed);
        m->ple_model_proj = bind2(&b, "per_layer_model_projection.weight", (int64_t)L * P, H);
        bind_vec(&b, "per_layer_projection_norm.weight", P, &m->ple_proj_norm);
    }
    for (int l = 0; l < L && !b.failed; l++) {
        g4_layer *y = &m->layers[l];
        const int D = c->layer_head_dim[l], KV = c->layer_kv_heads[l], I = c->layer_intermediate[l];
#define NAME(...) (fmt_name(n, sizeof n, __VA_ARGS__), n)
        bind_vec(&b, NAME("layers.%d.input_layernorm.weight", l), H, &y->input_norm);
        bind_vec(&b, NAME("layers.%d.post_attention_layernorm.weight", l), H, &y->post_attn_norm);
        bind_vec(&b, NAME("layers.%d.pre_feedforward_layernorm.weight", l), H, &y->pre_ff_norm);
        bind_vec(&b, NAME("layers.%d.post_feedforward_layernorm.weight", l), H, &y->post_ff_norm);
        const float *ls = bind_vec(&b, NAME("layers.%d.layer_scalar", l), 1, NULL);
        y->layer_scalar = ls ? ls[0] : 1.0f;
        /* q/k/v and gate/up are sets (one block of backend memory each: place_set) */
        const int64_t s_q[2] = {(int64_t)NH * D, H}, s_kv[2] = {(int64_t)KV * D, H}, s_mlp[2] = {I, H};
        const g4_tensor *qkv[3] = {bind_shape(&b, NAME("layers.%d.self_attn.q_proj.weight", l), 2, s_q), NULL, NULL};
        int n_qkv = 1;
        bind_vec(&b, NAME("layers.%d.self_attn.q_norm.weight", l), D, &y->q_norm);
        if (c->attention_bias) bind_vec(&b, NAME("layers.%d.self_attn.q_proj.bias", l), (int64_t)NH * D, &y->q_bias);
        if (!c->layer_kv_shared[l]) {
            qkv[n_qkv++] = bind_shape(&b, NAME("layers.%d.self_attn.k_proj.weight", l), 2, s_kv);
            bind_vec(&b, NAME("layers.%d.self_attn.k_norm.weight", l), D, &y->k_norm);
            if (c->attention_bias) bind_vec(&b, NAME("layers.%d.self_attn.k_proj.bias", l), (int64_t)KV * D, &y->k_bias);
            if (!c->layer_k_eq_v[l]) {
                qkv[n_qkv++] = bind_shape(&b, NAME("layers.%d.self_attn.v_proj.weight", l), 2, s_kv);
                if (c->attention_bias)
                    bind_vec(&b, NAME("layers.%d.self_attn.v_proj.bias", l), (int64_t)KV * D, &y->v_bias);
            }
        }
        place_set(&b, qkv, n_qkv);
        y->q_proj = qkv[0];
        if (n_qkv > 1) y->k_proj = qkv[1];
        if (n_qkv > 2) y->v_proj = qkv[2];
        y->o_proj = bind2(&b, NAME("layers.%d.self_attn.o_proj.weight", l), H, (int64_t)NH * D);
        if (c->attention_bias) bind_vec(&b, NAME("layers.%d.self_attn.o_proj.bias", l), H, &y->o_bias);
        const g4_tensor *mlp[2] = {bind_shape(&b, NAME("layers.%d.mlp.gate_proj.weight", l), 2, s_mlp), NULL};
        mlp[1] = bind_shape(&b, NAME("layers.%d.mlp.up_proj.weight", l), 2, s_mlp);
        place_set(&b, mlp, 2);
        y->gate_proj = mlp[0];
        y->up_proj = mlp[1];
        y->down_proj = bind2(&b, NAME("layers.%d.mlp.down_proj.weight", l), H, I);
        if (P > 0) {
            y->ple_gate = bind2(&b, NAME("layers.%d.per_layer_input_gate.weight", l), P, H);
            y->ple_proj = bind2(&b, NAME("layers.%d.per_layer_projection.weight", l), H, P);
            bind_vec(&b, NAME("layers.%d.post_per_layer_input_norm.weight", l), H, &y->ple_post_norm);
        }
        if (c->enable_moe_block) {
            const int E = c->num_experts, Im = c->moe_intermediate_size;
            y->router_proj = bind2(&b, NAME("layers.%d.router.proj.weight", l), E, H);
            bind_vec(&b, NAME("layers.%d.router.scale", l), H, &y->router_scale);
            bind_vec(&b, NAME("layers.%d.router.per_expert_scale", l), E, &y->per_expert_scale);
            char fused[512], gate[512];
            snprintf(fused, sizeof fused, "%slayers.%d.experts.gate_up_proj", m->cfg.weight_prefix, l);
            snprintf(gate, sizeof gate, "%slayers.%d.experts.gate_proj", m->cfg.weight_prefix, l);
            if (m->random || g4_tensor_set_find(&m->weights, fused) ||
                (b.collect && !g4_tensor_set_find(&m->weights, gate))) {
                y->experts_gate_up = bind3(&b, NAME("layers.%d.experts.gate_up_proj", l), E, 2 * (int64_t)Im, H);
            } else { /* MLX and some GGUF files keep gate and up apart */
                y->experts_gate_up = bind3(&b, NAME("layers.%d.experts.gate_proj", l), E, Im, H);
                y->experts_up = bind3(&b, NAME("layers.%d.experts.up_proj", l), E, Im, H);
            }
            y->experts_down = bind3(&b, NAME("layers.%d.experts.down_proj", l), E, H, Im);
            bind_vec(&b, NAME("layers.%d.pre_feedforward_layernorm_2.weight", l), H, &y->pre_ff_norm2);
            bind_vec(&b, NAME("layers.%d.post_feedforward_layernorm_1.weight", l), H, &y->post_ff_norm1);
            bind_vec(&b, NAME("layers.%d.post_feedforward_layernorm_2.weight", l), H, &y->post_ff_norm2);
        }
#undef NAME
    }
    if (m->cfg.assistant) bind_assistant(&b);
    if (collect) {
        free(b.used);
        collect->list = b.list;
        collect->n_list = b.n_list;
        return b.failed ? -1 : 0;
    }
    /* the towers (the embedders of gemma4_unified), with full names; a tower the config names but the weights
     * leave out altogether (a text-only conversion: mlx-lm, `gemma4c quantize`) is absent by design */
    b.prefix = "";
    if (m->cfg.has_vision && !m->cfg.unified && !m->random && !holds_prefix(&m->weights, "model.vision_tower.") &&
        !holds_prefix(&m->weights, "model.embed_vision.")) {
        m->cfg.has_vision = 0;
        g4_warn(&m->warnings,
                "config.json has a vision_config but the weights hold no vision tower: images are not supported");
    }
    if (m->cfg.has_audio && !m->cfg.unified && !m->random && !holds_prefix(&m->weights, "model.audio_tower.") &&
        !holds_prefix(&m->weights, "model.embed_audio.")) {
        m->cfg.has_audio = 0;
        g4_warn(&m->warnings,
                "config.json has an audio_config but the weights hold no audio tower: audio is not supported");
    }
    const int embedders = m->cfg.unified && !m->random &&
                          (holds_prefix(&m->weights, "model.vision_embedder.") ||
                           holds_prefix(&m->weights, "model.embed_vision.") || holds_prefix(&m->weights, "model.embed_audio."));
    if (m->cfg.unified && !m->random && !embedders)
        g4_warn(&m->warnings, "config.json is a gemma4_unified one but the weights hold no image or audio embedders: "
                              "images and audio are not supported");
    if (embedders && !b.failed && g4_unified_bind(&b, m, err)) b.failed = 1;
    if (m->cfg.has_vision && !m->random && !b.failed && g4_vision_bind(&b, m, &m->vision, err)) b.failed = 1;
    if (m->cfg.has_audio && !m->random && !b.failed && g4_audio_tower_bind(&b, m, &m->audio, err)) b.failed = 1;
    if (b.failed) {
        free(b.used);
        return -1;
    }
    if (m->random) {
        free(b.used);
        return 0;
    }
    if (b.n_missing) {
        free(b.used);
        /* the weights of the other kind of config: the multimodal wrapper's decoder is model.language_model.*, a
         * text-only (gemma4_text) one's model.* */
        const int wrapped = m->cfg.multimodal_wrapper;
        const char *hint = !wrapped && holds_prefix(&m->weights, "model.language_model.")
                               ? " (the weights name them model.language_model.*, as a multimodal gemma4 checkpoint does, "
                                 "but config.json is a text-only one)"
                           : wrapped && !m->gguf_meta /* a GGUF + mmproj pair names them model.* */ &&
                                   !holds_prefix(&m->weights, "model.language_model.") &&
                                   holds_prefix(&m->weights, "model.layers.")
                               ? " (the weights name them model.*, as a text-only gemma4_text checkpoint does, but "
                                 "config.json is a multimodal gemma4 one)"
                               : "";
        return g4_fail(err, "%s: %d tensor%s missing: %s%s%s", m->dir, b.n_missing, b.n_missing > 1 ? "s are" : " is",
                       b.missing, b.n_missing > 6 ? ", ..." : "", hint);
    }
    int n_unexpected = 0;
    for (int i = 0; i < m->weights.n_tensors; i++) {
        const char *name = m->weights.tensors[i].name;
        if (b.used[i] || ignored_by_design(m, name)) continue;
        char why[96];
        if (left_out_by_config(m, name, why, sizeof why)) {
            free(b.used);
            return g4_fail(err, "%s: tensor '%s' is in the weights but the config leaves it out (%s): config.json does "
                           "not describe these weights", m->dir, name, why);
        }
        if (is_tower_tensor(name)) continue; /* vision/audio towers: not part of the text decoder */
        if (n_unexpected < 8) g4_warn(&m->warnings, "unexpected tensor '%s' is not used", name);
        n_unexpected++;
    }
    if (n_unexpected > 8) g4_warn(&m->warnings, "... and %d more unexpected tensors", n_unexpected - 8);
    free(b.used);
    return 0;
}

int g4_model_tensor_list(const g4_model_config *cfg, const g4_tensor_set *have, g4_tensor **list, int *n,
                         g4_error *err) {
    g4_model m = {.cfg = *cfg};
    if (have) m.weights = *have; /* only looked up: which spelling of the experts it holds */
    binder out = {0};
    g4_load_params none = {0};
    *list = NULL;
    *n = 0;
    int rc = bind_weights(&m, &none, err, &out);
    memset(&m.weights, 0, sizeof m.weights);
    free(m.layers);
    free(m.placed);
    free(m.uploaded);
    if (rc) {
        for (int i = 0; i < out.n_list; i++) free((char *)out.list[i].name);
        free(out.list);
        return -1;
    }
    *list = out.list;
    *n = out.n_list;
    return 0;
}

void g4_rope_inv_freq(const g4_rope_config *rc, int head_dim, float *out) {
    int half = head_dim / 2;
    int n_rot = half;
    if (rc->type == G4_ROPE_PROPORTIONAL) n_rot = (int)floor(rc->partial_rotary_factor * head_dim / 2.0);
    for (int k = 0; k < half; k++) {
        if (k >= n_rot) {
            out[k] = 0.0f;
            continue;
        }
        float e = (float)(2 * k) / (float)head_dim;
        float f = 1.0f / powf((float)rc->theta, e);
        if (rc->type == G4_ROPE_PROPORTIONAL) f = (float)(f / rc->factor);
        out[k] = f;
    }
}

/* bytes of a matrix of any dtype (quantized: whole blocks) */
static double tbytes(const g4_tensor *t) {
    if (!t) return 0;
    double row = (double)g4_tensor_row_bytes(t);
    if (g4_dtype_is_mlx(t->dtype) && t->group > 0) /* and the row's scales and biases */
        row += 2.0 * (double)(t->shape[t->ndim - 1] / t->group) * (t->scale_dtype == G4_F32 ? 4 : 2);
    return row * (double)g4_tensor_nrows(t);
}

G4_API double g4_model_decode_bytes(const g4_model *m, int pos, g4_kv_type kv_type) {
    if (!m) return 0;
    const g4_text_config *c = &m->cfg.text;
    double b = tbytes(m->lm_head); /* the head reads every row (tied: the embedding table, one row of it again) */
    if (m->lm_head != m->embed) b += tbytes(m->embed) / (double)c->vocab_size;
    b += tbytes(m->ple_model_proj);
    for (int l = 0; l < c->n_layers; l++) {
        const g4_layer *y = &m->layers[l];
        const g4_tensor *dense[] = {y->q_proj, y->k_proj, y->v_proj, y->o_proj, y->gate_proj, y->up_proj,
                                    y->down_proj, y->ple_gate, y->ple_proj, y->router_proj};
        for (size_t i = 0; i < sizeof dense / sizeof dense[0]; i++) b += tbytes(dense[i]);
        if (c->enable_moe_block)
            b += (tbytes(y->experts_gate_up) + tbytes(y->experts_up) + tbytes(y->experts_down)) * c->top_k_experts /
                 c->num_experts;
        int keys = pos + 1;
        if (c->layer_type[l] == G4_LAYER_SLIDING && keys > c->sliding_window) keys = c->sliding_window;
        b += 2.0 * keys * c->layer_kv_heads[l] * c->layer_head_dim[l] * (double)g4_kv_type_size(kv_type);
    }
    return b;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

G4_API double g4_model_copy_bandwidth(g4_model *m) {
    if (!m) return 0;
    g4_backend *be = m->be;
    const size_t bytes = (size_t)1 << 30;
    void *a = be->ops->alloc(be, bytes), *b = be->ops->alloc(be, bytes);
    double best = 0;
    if (a && b) {
        be->ops->copy(be, a, b, bytes); /* first touch of both (host memory never written reads as the zero page, */
        be->ops->copy(be, b, a, bytes); /* from the cache: a copy from it would time the writes alone) */
        be->ops->sync(be);
        for (int i = 0; i < 5; i++) {
            double t0 = now_s();
            be->ops->copy(be, b, a, bytes);
            be->ops->sync(be);
            double bw = 2.0 * (double)bytes / (now_s() - t0);
            if (bw > best) best = bw;
        }
    }
    if (a) be->ops->release(be, a);
    if (b) be->ops->release(be, b);
    return best;
}

const char *g4_model_warnings(const g4_model *model) { return model ? model->warnings : NULL; }

int g4_model_vocab_size(const g4_model *m) { return m ? m->cfg.text.vocab_size : 0; }
int g4_model_n_layers(const g4_model *m) { return m ? m->cfg.text.n_layers : 0; }
int g4_model_hidden_size(const g4_model *m) { return m ? m->cfg.text.hidden_size : 0; }
int g4_model_n_ctx_train(const g4_model *m) { return m ? m->cfg.text.max_position_embeddings : 0; }

void g4_model_free(g4_model *m) {
    if (!m) return;
    g4_backend *be = m->be;
    g4_vision_free(m->vision);
    g4_audio_tower_free(m->audio);
    if (be) {
        for (int i = 0; i < m->weights.n_tensors && m->placed; i++)
            if (m->uploaded[i]) be->ops->release_weight(be, &m->placed[i]);
        for (int i = 0; i < m->n_made; i++)
            if (m->made[i]->data && m->made[i]->data != m->host_table) be->ops->release_weight(be, m->made[i]);
        if (m->vec_arena) be->ops->release(be, m->vec_arena);
        if (m->token_ordering) be->ops->release(be, m->token_ordering);
        for (int t = 0; t < G4_LAYER_TYPES; t++)
            if (m->inv_freq[t]) be->ops->release(be, m->inv_freq[t]);
    }
    if (!m->borrowed_be) g4_backend_free(be);
    for (int i = 0; i < m->n_made; i++) {
        if (m->made[i]->data == m->host_table && m->host_table) munmap(m->host_table, m->made[i]->nbytes);
        free((char *)m->made[i]->name);
        free(m->made[i]);
    }
    free(m->made);
    for (int i = 0; i < m->n_vecs; i++) free(m->vecs[i].host);
    free(m->vecs);
    free(m->placed);
    free(m->uploaded);
    free(m->layers);
    free(m->warnings);
    json_decref(m->gguf_meta);
    json_decref(m->mmproj_audio);
    if (m->constrain) m->constrain_free(m->constrain);
    g4_model_free_files(m);
    g4_tensor_set_free(&m->weights);
    pthread_mutex_destroy(&m->backend_lock);
    free(m);
}

/* Touches every page of the weights once, in file order, so that a large model is
 * read from disk up front with a progress report instead of during the first tokens. */
static void page_in(g4_model *m, const g4_load_params *p) {
    size_t total = 0, done = 0;
    for (int i = 0; i < m->weights.n_files; i++) total += m->weights.files[i].size;
    if (!total) return;
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) page = 4096;
    int last = -1;
    volatile unsigned char sink = 0;
    for (int i = 0; i < m->weights.n_files; i++) {
        const g4_mapped_file *f = &m->weights.files[i];
        madvise((void *)f->data, f->size, MADV_WILLNEED);
        for (size_t o = 0; o < f->size; o += (size_t)page) {
            sink ^= f->data[o];
            done += (size_t)page;
            int pct = (int)(100.0 * (double)(done < total ? done : total) / (double)total);
            if (pct != last && p->progress) {
                last = pct;
                p->progress((float)pct / 100.0f, "loading weights", p->progress_user);
            }
        }
    }
    (void)sink;
}

/* The id of a token of a GGUF file's vocabulary (tokenizer.ggml.tokens), -1 when absent. */
static int gguf_token(const json_t *meta, const char *piece) {
    g4_gguf_array toks;
    if (!g4_gguf_array_of(meta, "tokenizer.ggml.tokens", &toks)) return -1;
    const size_t n = strlen(piece);
    size_t at = 0, len;
    const char *s;
    for (int i = 0; i < INT32_MAX && (s = g4_gguf_array_str(&toks, &at, &len)) != NULL; i++)
        if (len == n && !memcmp(s, piece, n)) return i;
    return -1;
}

/* A GGUF text model with llama.cpp's projector file (gguf_mmproj.h): the towers' tensors join the weights
 * and *cj (the text config rebuilt from the GGUF) becomes a multimodal gemma4 config around it (gemma4_unified for
 * the 12B's projector). The placeholder ids are the vocabulary's <|image|>, <|image>, <image|> (as llama.cpp's
 * mtmd.cpp finds "<|image>"/"<image|>" by their text; a vocabulary without them is an error, a file without one
 * takes Gemma 4's ids), and images attend to each other as transformers' use_bidirectional_attention "vision" does
 * exactly where llama.cpp decodes them non-causally (mtmd.cpp mtmd_decode_use_non_causal: gemma4uv, and gemma4v
 * except text widths 1536 and 2560, E2B and E4B, whose configs leave it unset). */
static int attach_mmproj(g4_model *m, const char *path, int embedded, json_t **cj, g4_error *err) {
    const int hidden = (int)json_integer_value(json_object_get(*cj, "hidden_size"));
    json_t *vc, *ac;
    int unified = 0;
    if (embedded ? g4_mmproj_attach_embedded(path, m->gguf_meta, hidden, &m->weights, &vc, &ac, err)
                 : g4_mmproj_attach(path, hidden, &m->weights, &vc, &ac, &unified, err))
        return -1;
    if (!vc && !ac) return 0; /* a model file without towers */
    if (g4_tensor_set_finish(&m->weights, err)) {
        json_decref(vc);
        json_decref(ac);
        return -1;
    }
    if (ac && !unified) { /* the audio tower reads its config from the model (no config.json beside a GGUF) */
        m->mmproj_audio = json_incref(ac);
        snprintf(m->mmproj_path, sizeof m->mmproj_path, "%s", path);
    }
    static const char *const pieces[] = {"<|image|>", "<|image>", "<image|>", "<|video|>", "<|audio|>", "<|audio>",
                                         "<audio|>"};
    static const char *const keys[] = {"image_token_id", "boi_token_id", "eoi_token_id", "video_token_id",
                                       "audio_token_id", "boa_token_id", "eoa_token_id"};
    json_t *w = json_object();
    if (!w || json_object_set_new(w, "model_type", json_string(unified ? "gemma4_unified" : "gemma4")) ||
        json_object_set(w, "tie_word_embeddings", json_object_get(*cj, "tie_word_embeddings")) ||
        (vc && json_object_set_new(w, "vision_config", vc)) || (ac && json_object_set_new(w, "audio_config", ac))) {
        json_decref(w);
        return g4_fail(err, "out of memory");
    }
    for (int i = 0; i < 7; i++) {
        int id = gguf_token(m->gguf_meta, pieces[i]);
        /* a file without a vocabulary keeps transformers' defaults (Gemma 4's ids, as a config.json without them) */
        const int needed = (vc && i < 3) || (ac && i >= 4);
        if (id < 0 && needed && json_object_get(m->gguf_meta, "tokenizer.ggml.tokens")) {
            json_decref(w);
            return g4_fail(err, "%s: the model's vocabulary has no %s token: it cannot take %s", m->dir, pieces[i],
                           i < 3 ? "images" : "audio");
        }
        if (id >= 0) json_object_set_new(w, keys[i], json_integer(id));
    }
    if (vc && (unified || (hidden != 1536 && hidden != 2560)))
        json_object_set_new(*cj, "use_bidirectional_attention", json_string("vision"));
    json_object_set_new(w, "text_config", *cj);
    *cj = w;
    return 0;
}

/* Loads a model folder onto `be` (NULL: a backend of its own, as params say); an assistant checkpoint only when
 * `assistant` is 1, either kind when it is -1. */
static int load(const char *dir, const g4_load_params *params, g4_backend *be, int assistant, g4_model **out,
                g4_error *err) {
    *out = NULL;
    g4_load_params defaults = {0};
    if (!params) params = &defaults;
    g4_model *m = calloc(1, sizeof *m);
    if (!m) return g4_fail(err, "out of memory");
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&m->backend_lock, &attr);
    pthread_mutexattr_destroy(&attr);
    snprintf(m->dir, sizeof m->dir, "%s", dir);
    m->random = params->random_weights != 0;
    m->random_type = G4_BF16;
    if (m->random && params->random_type && strcasecmp(params->random_type, "bf16")) {
        m->random_type = G4_DTYPE_UNKNOWN;
        for (int t = G4_F32; t < G4_DTYPE_COUNT; t++)
            if ((t <= G4_BF16 || (g4_dtype_is_quantized((g4_dtype)t) && t < G4_AF4)) && !strcasecmp(params->random_type, g4_dtype_name((g4_dtype)t)))
                m->random_type = (g4_dtype)t;
        if (m->random_type == G4_DTYPE_UNKNOWN) {
            g4_fail(err,
                    "random weights of type '%s': expected bf16, f16, f32, q8_0, q4_0, q2_k, q3_k, q4_k, q5_k, q6_k, "
                    "iq4_nl, iq4_xs, mlx4, mlx8, ...",
                    params->random_type);
            goto fail;
        }
    }
    if (m->random && g4_file_exists(dir)) { /* a config.json file: no tokenizer, template or generation config */
        json_t *root;
        if (g4_json_load_file(dir, &root, err)) goto fail;
        int rc = g4_config_parse(root, dir, &m->cfg, err);
        json_decref(root);
        if (rc) goto fail;
    } else if (!m->random && g4_gguf_is_file(dir)) { /* -m FILE.gguf: the config from its metadata */
        g4_gguf g;
        json_t *cj;
        if (g4_gemma4_gguf_open(dir, &g, &cj, err)) goto fail;
        m->weights = g.set;
        m->gguf_meta = g.meta;
        /* the vision and audio towers: --mmproj FILE, else the one mmproj*.gguf beside the model */
        char beside[8192];
        const char *mmproj = params->mmproj;
        const int found = mmproj ? 0 : g4_mmproj_beside(dir, beside, sizeof beside);
        if (found == 1) mmproj = beside;
        if (found < 0)
            g4_warn(&m->warnings, "several mmproj*.gguf files beside %s (%s): none is loaded, name one with --mmproj",
                    dir, beside);
        if (mmproj && attach_mmproj(m, mmproj, 0, &cj, err)) {
            if (found != 1) {
                json_decref(cj);
                goto fail;
            }
            /* a projector found beside the model, not asked for (another model's, a broken one): the text model
             * loads without it */
            g4_warn(&m->warnings, "the mmproj file beside the model is not loaded: %s", err->msg);
            mmproj = NULL;
        } else if (found == 1) {
            g4_warn(&m->warnings, "loaded the projector %s, the mmproj file beside the model", beside);
        }
        /* without a projector file, the towers Ollama's file carries beside the decoder */
        const int embedded = !mmproj && (json_object_get(m->gguf_meta, "gemma4.vision.block_count") ||
                                         json_object_get(m->gguf_meta, "gemma4.audio.block_count"));
        if (embedded && attach_mmproj(m, dir, 1, &cj, err)) {
            json_decref(cj);
            goto fail;
        }
        int rc = g4_config_parse(cj, dir, &m->cfg, err);
        json_decref(cj);
        /* the text tensors keep the names g4_gemma4_gguf_open gave them (model.*, a text-only checkpoint's layout)
         * under the multimodal config */
        if (mmproj || embedded) snprintf(m->cfg.weight_prefix, sizeof m->cfg.weight_prefix, "model.");
        if (rc || g4_model_load_files(m, dir, err)) goto fail;
    } else {
        if (params->mmproj) {
            g4_fail(err, "--mmproj %s: a projector file goes with a GGUF model (-m FILE.gguf); %s is not one",
                    params->mmproj, dir);
            goto fail;
        }
        if (g4_config_load(dir, &m->cfg, err) || g4_model_load_files(m, dir, err)) goto fail;
        if (!m->random && g4_safetensors_open_dir(dir, &m->weights, err)) goto fail;
        if (!m->random && g4_mlx_detect(&m->weights)) {
            char path[4096];
            json_t *root = NULL;
            if (g4_path_join(path, sizeof path, dir, "config.json", err) || g4_json_load_file(path, &root, err))
                goto fail;
            const json_t *q = json_object_get(root, "quantization");
            if (!q) q = json_object_get(root, "quantization_config");
            int rc = g4_mlx_adopt(&m->weights, json_is_object(q) ? q : NULL, err);
            json_decref(root);
            if (rc) goto fail;
        }
    }
    const g4_text_config *c = &m->cfg.text;
    if (assistant >= 0 && m->cfg.assistant != assistant) {
        g4_fail(err, assistant ? "%s is not a gemma4_assistant checkpoint (model_type \"%s\")"
                               : "%s is a gemma4_assistant checkpoint (a drafter): it runs beside its main model "
                                 "(-m MAIN --draft DIR), not on its own",
                dir, m->cfg.model_type);
        goto fail;
    }
    m->borrowed_be = be != NULL;
    m->be = be ? be : g4_backend_new(params->device, params->n_threads, params->bf16_activations, err);
    if (!m->be) goto fail;
    if (m->be->ops->host_memory && params->progress && !m->random) page_in(m, params);
    if (bind_weights(m, params, err, NULL) || place_vectors(m, err)) goto fail;
    for (int t = 0; t < G4_LAYER_TYPES; t++) {
        int hd = c->type_head_dim[t];
        if (!hd) continue;
        float *host = malloc((size_t)(hd / 2) * sizeof(float));
        m->inv_freq[t] = m->be->ops->alloc(m->be, (size_t)(hd / 2) * sizeof(float));
        if (!host || !m->inv_freq[t]) {
            free(host);
            g4_fail(err, "out of memory for RoPE frequencies");
            goto fail;
        }
        g4_rope_inv_freq(&c->rope[t], hd, host);
        m->be->ops->to_device(m->be, m->inv_freq[t], host, (size_t)(hd / 2) * sizeof(float));
        m->be->ops->sync(m->be);
        free(host);
    }
    m->embed_scale = sqrtf((float)c->hidden_size);
    *out = m;
    return 0;
fail:
    g4_model_free(m);
    return -1;
}

int g4_model_load(const char *dir, const g4_load_params *params, g4_model **out, g4_error *err) {
    G4_ARG(out, err);
    *out = NULL;
    G4_ARG(dir, err);
    return load(dir, params, NULL, 0, out, err);
}

int g4_model_load_assistant(const char *dir, g4_backend *be, g4_model **out, g4_error *err) {
    return load(dir, NULL, be, 1, out, err);
}

int g4_model_load_either(const char *dir, const g4_load_params *params, g4_model **out, g4_error *err) {
    return load(dir, params, NULL, -1, out, err);
}

const char *g4_model_device(const g4_model *m) { return m ? m->be->ops->name : NULL; }

int g4_model_memory(const g4_model *m, size_t *free_bytes, size_t *total_bytes, g4_error *err) {
    G4_ARG(m, err);
    G4_ARG(free_bytes, err);
    G4_ARG(total_bytes, err);
    *free_bytes = *total_bytes = 0;
    pthread_mutex_lock(&((g4_model *)m)->backend_lock);
    const int rc = m->be->ops->memory ? m->be->ops->memory(m->be, free_bytes, total_bytes) : -1;
    pthread_mutex_unlock(&((g4_model *)m)->backend_lock);
    return rc ? g4_fail(err, "the %s backend does not say how much memory it has", m->be->ops->name) : 0;
}

g4_kv_type g4_model_kv_type_preferred(const g4_model *m) {
    return !m ? G4_KV_F32 : strcmp(m->be->ops->name, "cpu") ? G4_KV_BF16 : G4_KV_F32;
}
const char *g4_backends(void) { return g4_backends_built(); }
