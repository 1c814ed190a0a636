/* The CPU backend: every op of backend.h on the host, threaded with g4_pool. */
#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cpu/cpu.h"
#include "core/error.h"
#include "core/quant.h"

static g4_cpu *cpu_of(g4_backend *be) { return be->impl; }

float *g4_cpu_scratch_get(g4_cpu *cpu, int t, size_t n) {
    g4_cpu_scratch *s = &cpu->scratch[t];
    if (s->cap < n) {
        float *nb = realloc(s->buf, n * sizeof(float));
        if (!nb) {
            cpu->failed = 1;
            return NULL;
        }
        s->buf = nb;
        s->cap = n;
    }
    return s->buf;
}

static void cpu_free(g4_backend *be) {
    g4_cpu *cpu = cpu_of(be);
    g4_pool_free(cpu->pool);
    for (int i = 0; i < G4_CPU_MAX_THREADS; i++) free(cpu->scratch[i].buf);
    free(cpu->moe_buf);
    free(cpu->act_buf);
    free(cpu->set_buf);
    for (int i = 0; i < cpu->n_owned; i++) free(cpu->owned[i]);
    free(cpu->owned);
    free(cpu->sel_buf);
    free(cpu);
    free(be);
}

static void *cpu_alloc(g4_backend *be, size_t bytes) {
    (void)be;
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64)) return NULL;
    return p;
}
static void cpu_release(g4_backend *be, void *p) { free(p); }
/* A large copy between separate buffers runs on the backend's threads, as the products read memory (gemma4c bench
 * measures the copy bandwidth it compares them with this way: one thread's copy is a fraction of a machine's). */
#define CPU_COPY_CHUNK ((size_t)1 << 20)
typedef struct copy_job {
    char *dst;
    const char *src;
    size_t bytes;
} copy_job;
static void copy_chunks(void *ctx, int64_t c0, int64_t c1, int thread) {
    (void)thread;
    const copy_job *j = ctx;
    const size_t lo = (size_t)c0 * CPU_COPY_CHUNK, hi = (size_t)c1 * CPU_COPY_CHUNK;
    memcpy(j->dst + lo, j->src + lo, (hi < j->bytes ? hi : j->bytes) - lo);
}
static void cpu_copy(g4_backend *be, void *dst, const void *src, size_t bytes) {
    const char *d = dst, *s = src;
    if (bytes < 8 * CPU_COPY_CHUNK || (d < s + bytes && s < d + bytes)) { /* small (or, against the op's contract,
                                                                             * overlapping: memmove keeps them right) */
        if (bytes) memmove(dst, src, bytes);
        return;
    }
    copy_job j = {dst, src, bytes};
    g4_pool_for(cpu_of(be)->pool, (int64_t)((bytes + CPU_COPY_CHUNK - 1) / CPU_COPY_CHUNK), 4, copy_chunks, &j);
}
static void cpu_sync(g4_backend *be) {}
/* MemAvailable and MemTotal of /proc/meminfo (Linux), else the free and all physical pages */
static int cpu_memory(g4_backend *be, size_t *free_bytes, size_t *total_bytes) {
    (void)be;
    unsigned long long avail = 0, total = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, f)) {
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) avail = kb * 1024;
            else if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) total = kb * 1024;
        }
        fclose(f);
    }
    if (!avail || !total) {
        const long page = sysconf(_SC_PAGESIZE), av = sysconf(_SC_AVPHYS_PAGES), all = sysconf(_SC_PHYS_PAGES);
        if (page <= 0 || av < 0 || all <= 0) return -1;
        avail = (unsigned long long)av * (unsigned long long)page;
        total = (unsigned long long)all * (unsigned long long)page;
    }
    *free_bytes = (size_t)avail;
    *total_bytes = (size_t)total;
    return 0;
}

/* room for n more owned buffers: 0, or -1 when out of memory */
static int cpu_reserve_owned(g4_cpu *cpu, int n) {
    if (cpu->n_owned + n <= cpu->cap_owned) return 0;
    const int cap = cpu->cap_owned ? 2 * cpu->cap_owned : 64;
    void **o = realloc(cpu->owned, (size_t)cap * sizeof *o);
    if (!o) return -1;
    cpu->owned = o;
    cpu->cap_owned = cap;
    return 0;
}

/* Weights are read where they are (the memory-mapped file): nothing is copied. A source without data gets
 * random values in memory of its own. */
static int cpu_place_weight(g4_backend *be, const g4_tensor *src, g4_tensor *dst, g4_error *err) {
    *dst = *src;
    if (src->data) return 0;
    g4_cpu *cpu = cpu_of(be);
    const size_t esz = (size_t)g4_dtype_bits(src->dtype) / 8, n = (size_t)g4_tensor_numel(src);
    float probe[256] = {0};
    unsigned char probe_out[1024];
    const int quant = g4_dtype_is_quantized(src->dtype) && src->dtype != G4_Q4_1 && src->dtype != G4_Q5_0 &&
                      src->dtype != G4_Q5_1 &&
                      (g4_dtype_is_mlx(src->dtype) || g4_quant(src->dtype, probe, probe_out, 256)); /* (an encoder) */
    if (esz != 2 && esz != 4 && !quant)
        return g4_fail(err, "random values of dtype %s are not supported on the CPU", g4_dtype_name(src->dtype));
    if (cpu_reserve_owned(cpu, 3)) return g4_fail(err, "out of memory");
    const int64_t in = src->shape[src->ndim - 1], rows = in ? (int64_t)n / in : 0;
    const size_t bytes = quant ? (size_t)rows * g4_tensor_row_bytes(src) : n * esz;
    void *data = NULL;
    if (posix_memalign(&data, 64, bytes > 0 ? bytes : 64))
        return g4_fail(err, "out of memory for %zu bytes of random weights ('%s')", bytes, src->name);
    cpu->owned[cpu->n_owned++] = data;
    *dst = *src;
    dst->data = data;
    dst->nbytes = bytes;
    if (!quant) {
        g4_fill_random(src->dtype, data, n, in, g4_name_seed(src->name));
        return 0;
    }
    /* quantized: random values encoded row by row (the reference encoders) */
    float *row = malloc((size_t)in * sizeof(float));
    if (!row) return g4_fail(err, "out of memory");
    const int mlx = g4_dtype_is_mlx(src->dtype);
    const size_t ng = mlx ? (size_t)(in / src->group) : 0, ss = src->scale_dtype == G4_F32 ? 4 : 2;
    void *sc = NULL, *bi = NULL;
    if (mlx && (posix_memalign(&sc, 64, (size_t)rows * ng * ss + 64) || posix_memalign(&bi, 64, (size_t)rows * ng * ss + 64))) {
        free(row), free(sc);
        return g4_fail(err, "out of memory for random weights ('%s')", src->name);
    }
    if (mlx) cpu->owned[cpu->n_owned++] = sc, cpu->owned[cpu->n_owned++] = bi, dst->scales = sc, dst->biases = bi;
    const float amp = sqrtf(3.0f / (float)(in > 0 ? in : 1));
    const uint64_t seed = g4_name_seed(src->name);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t k = 0; k < in; k++) row[k] = g4_random_value(seed, (uint64_t)(r * in + k), amp);
        unsigned char *o = (unsigned char *)data + (size_t)r * g4_tensor_row_bytes(src);
        if (mlx)
            g4_mlx_quant_row(g4_mlx_bits(src->dtype), src->group, row, in, o, (char *)sc + (size_t)r * ng * ss,
                             (char *)bi + (size_t)r * ng * ss, src->scale_dtype);
        else
            g4_quant(src->dtype, row, o, in);
    }
    free(row);
    return 0;
}
/* frees p if this backend owns it (random weights, weights held in another layout): 1 if it did */
static int cpu_free_owned(g4_cpu *cpu, const void *p) {
    for (int i = 0; p && i < cpu->n_owned; i++)
        if (cpu->owned[i] == p) {
            free(cpu->owned[i]);
            cpu->owned[i] = cpu->owned[--cpu->n_owned];
            return 1;
        }
    return 0;
}

typedef struct {
    const g4_tensor *src;
    g4_dtype to;
    unsigned char *dst;
    size_t row_bytes;
    atomic_int failed; /* a row g4_transcode_row refused */
} af_job;
static void af_rows(void *ctx, int64_t r0, int64_t r1, int thread) {
    (void)thread;
    af_job *j = ctx;
    const int64_t in = j->src->shape[j->src->ndim - 1];
    float *tmp = g4_transcode_exact(j->src->dtype, j->to) ? NULL : malloc((size_t)in * sizeof(float));
    if (!g4_transcode_exact(j->src->dtype, j->to) && !tmp) atomic_store(&j->failed, 1);
    for (int64_t r = r0; r < r1 && !atomic_load_explicit(&j->failed, memory_order_relaxed); r++)
        if (!g4_transcode_row(j->src, r, j->to, j->dst + (size_t)r * j->row_bytes, tmp)) atomic_store(&j->failed, 1);
    free(tmp);
}

/* Bytes of memory the system can still give (MemAvailable), or SIZE_MAX where it does not say. */
static size_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb = 0;
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f)) found = sscanf(line, "MemAvailable: %llu kB", &kb) == 1;
    if (f) fclose(f);
    return found ? (size_t)kb * 1024 : SIZE_MAX;
}

/* The layouts the CPU may hold a weight of type t in, best first (cpu_upload_weight takes the first whose rows all
 * transcode): MLX as AF4 / AF8 (exact; also without the int8 products, which the float products read too); where the
 * int8 products run (the kernel set has them and G4_NO_INT8_ACT is not set), a GGUF type without int8 kernels of its
 * own in the layouts that hold its values exactly (g4_transcode_exact), MXF4 (4.5 bits a weight), CB4 (4.75), CB4_16
 * (5.1), Q6_K (6.6), AF4 (6) and AF8 (10), then Q8_0 (re-encoded, 8.5 bits: the model warns). So MXFP4 as MXF4,
 * IQ2_XXS / IQ3_XXS / IQ3_S / IQ1_S / TQ1_0 / TQ2_0 as CB4, IQ2_XS / IQ2_S / IQ1_M / NVFP4 as CB4_16 (a block either
 * refuses: the next one), Q4_1 as AF4, Q5_1 as AF8 -- decoded to floats for every product these ran 20-150x slower than Q4_0
 * on 2 cores (E2B-wide layers). None (0) where t stays as it is (Q2_K among them: the kernels read it). */
static int cpu_held_types(const g4_tensor *t, g4_dtype held[7]) {
    const int64_t in = t->ndim ? t->shape[t->ndim - 1] : 0;
    if (g4_dtype_is_mlx(t->dtype)) {
        held[0] = g4_af_type(t->dtype);
        return t->group > 0 && t->group % 32 == 0 && in % t->group == 0;
    }
    if (getenv("G4_NO_INT8_ACT") || !g4_cpu_kernels_get()->q8_k_quants || in % 32 || !g4_dtype_is_quantized(t->dtype) ||
        g4_cpu_q8_supported(t))
        return 0;
    static const g4_dtype exact[] = {G4_MXF4, G4_CB4, G4_CB4_16, G4_Q6_K, G4_AF4, G4_AF8};
    int n = 0;
    for (int i = 0; i < 6; i++)
        if (in % g4_dtype_block(exact[i]) == 0 && g4_transcode_exact(t->dtype, exact[i])) held[n++] = exact[i];
    held[n++] = G4_Q8_0;
    return n;
}

/* MLX affine weights are held as AF4 / AF8 (core/tensor.h: blocks of 32 with the group's f32 scale and bias, the
 * codes as they are; g4_transcode_row, exact), which the int8 products read (matmul_q8.c), and so are the GGUF
 * types without int8 kernels of their own (cpu_held_types); the others where they are. (AF4 takes 6 bits a weight
 * where MLX4 with a bf16 scale and bias a group of 64 takes 4.5.) A weight whose rows do not all transcode into a
 * layout (a codebook block whose d Q6_K cannot hold, a scale that is not finite) takes the next one; a GGUF weight
 * stays as it is (the float products read every type) where none is left, or where the held copy would leave the
 * system less than 1 GiB (it is larger than the file's: an IQ2_XXS matrix takes 2.3x its bytes as CB4). */
static int cpu_upload_weight(g4_backend *be, const g4_tensor *src, g4_tensor *dst, g4_error *err) {
    if (cpu_place_weight(be, src, dst, err)) return -1;
    g4_dtype held[7];
    const int n_held = dst->data ? cpu_held_types(dst, held) : 0;
    const int64_t in = dst->ndim ? dst->shape[dst->ndim - 1] : 0, rows = g4_tensor_nrows(dst);
    g4_cpu *cpu = cpu_of(be);
    for (int k = 0; k < n_held; k++) {
        const g4_dtype af = held[k];
        const size_t rb = g4_dtype_row_bytes(af, in), bytes = (size_t)rows * rb;
        const size_t avail = g4_dtype_is_mlx(dst->dtype) ? SIZE_MAX : mem_available();
        if (bytes > avail || avail - bytes < (size_t)1 << 30) return 0;
        if (cpu_reserve_owned(cpu, 1)) return g4_fail(err, "out of memory");
        void *data = NULL;
        if (posix_memalign(&data, 64, bytes > 0 ? bytes : 64)) {
            cpu_free_owned(cpu, dst->data), cpu_free_owned(cpu, dst->scales), cpu_free_owned(cpu, dst->biases);
            return g4_fail(err, "out of memory for %zu bytes of '%s' as %s", bytes, src->name, g4_dtype_name(af));
        }
        af_job j = {dst, af, data, rb, 0};
        g4_pool_for(cpu->pool, rows, 64, af_rows, &j);
        if (atomic_load(&j.failed) && !g4_dtype_is_mlx(dst->dtype)) { /* (MLX rows always transcode) */
            free(data);
            continue;
        }
        cpu_free_owned(cpu, dst->data), cpu_free_owned(cpu, dst->scales), cpu_free_owned(cpu, dst->biases);
        cpu->owned[cpu->n_owned++] = data;
        dst->dtype = af;
        dst->data = data;
        dst->nbytes = bytes;
        dst->scales = dst->biases = NULL;
        dst->group = 0;
        return 0;
    }
    return 0;
}

static void cpu_rows_to_device(g4_backend *be, float *dst, const g4_tensor *table, const int32_t *ids, int n,
                               float scale) {
    (void)be;
    g4_tensor_rows_f32(table, ids, n, scale, dst);
}
static void cpu_release_weight(g4_backend *be, g4_tensor *w) {
    g4_cpu *cpu = cpu_of(be);
    cpu_free_owned(cpu, w->scales), cpu_free_owned(cpu, w->biases);
    if (cpu_free_owned(cpu, w->data)) w->data = NULL;
}

static int cpu_check(g4_backend *be, g4_error *err) {
    g4_cpu *cpu = cpu_of(be);
    if (!cpu->failed) return 0;
    cpu->failed = 0;
    return g4_fail(err, "out of memory in the CPU backend");
}

/* ------------------------------------------------------------------ embed */
static void cpu_embed(g4_backend *be, const g4_tensor *table, const int32_t *ids, int n, float scale, float *out) {
    g4_tensor_rows_f32(table, ids, n, scale, out);
}

static void cpu_matmul(g4_backend *be, const float *x, int n, const g4_tensor *w, const float *bias, float *y) {
    g4_cpu_matmul(cpu_of(be), x, n, w, bias, y);
}

static void cpu_rmsnorm(g4_backend *be, const float *x, const float *w, int rows, int dim, float eps, float *y);
static void cpu_gelu_mul(g4_backend *be, const float *g, const float *u, size_t n, float *y);
static void cpu_softcap(g4_backend *be, float *y, size_t n, float c);

static void cpu_post_norm_add(g4_backend *be, float *h, const float *o, const float *w, int rows, int dim, float eps,
                              float s);

static void cpu_matmul_set(g4_backend *be, const float *x, int n, const g4_matmul_set *set) {
    g4_cpu *cpu = cpu_of(be);
    if (set->res_out) { /* the sublayer's residual update, then its result is the input */
        const int in = (int)set->w[0]->shape[set->w[0]->ndim - 1];
        if (set->res_out != set->res_h) memcpy(set->res_out, set->res_h, (size_t)n * (size_t)in * sizeof(float));
        cpu_post_norm_add(be, set->res_out, set->res_o, set->res_w, n, in, set->eps, set->res_scale);
        x = set->res_out;
    }
    if (set->norm) { /* normalize the rows once into a buffer of the backend */
        const int in = (int)set->w[0]->shape[set->w[0]->ndim - 1];
        size_t need = (size_t)n * (size_t)in;
        if (cpu->set_cap < need) {
            float *nb = realloc(cpu->set_buf, need * sizeof(float));
            if (!nb) {
                cpu->failed = 1;
                return;
            }
            cpu->set_buf = nb;
            cpu->set_cap = need;
        }
        cpu_rmsnorm(be, x, set->norm, n, in, set->eps, cpu->set_buf);
        x = cpu->set_buf;
    }
    int one_job = 1; /* int8 products of one type: one quantization of x and one pool job for the set */
    for (int i = 0; i < set->count; i++)
        one_job &= g4_cpu_q8_supported(set->w[i]) && set->w[i]->dtype == set->w[0]->dtype &&
                    set->w[i]->shape[set->w[i]->ndim - 1] == set->w[0]->shape[set->w[0]->ndim - 1];
    if (one_job)
        g4_cpu_matmul_q8_set(cpu, x, n, set->count, set->w, set->bias, set->y);
    else
        for (int i = 0; i < set->count; i++) g4_cpu_matmul(cpu, x, n, set->w[i], set->bias[i], set->y[i]);
    const size_t n0 = (size_t)n * (size_t)set->w[0]->shape[0];
    if (set->geglu) cpu_gelu_mul(be, set->y[0], set->count == 2 ? set->y[1] : set->mul, n0, set->y[0]);
    if (set->softcap > 0)
        for (int i = 0; i < set->count; i++)
            cpu_softcap(be, set->y[i], (size_t)n * (size_t)set->w[i]->shape[0], set->softcap);
}

/* ---------------------------------------------------------------- rmsnorm */
/* 1 / sqrt(mean(x^2) + eps) of one row */
static inline float rms_inv(const g4_cpu_kernels *k, const float *x, int dim, float eps) {
    float ms = k->dot_f32(x, x, (size_t)dim) / (float)dim;
    return 1.0f / sqrtf(ms + eps);
}

/* y = x * inv * (w ? w : 1) */
static inline void rms_apply(const float *x, float inv, const float *w, int dim, float *y) {
    if (w)
        for (int i = 0; i < dim; i++) y[i] = x[i] * inv * w[i];
    else
        for (int i = 0; i < dim; i++) y[i] = x[i] * inv;
}

typedef struct {
    const float *x, *w;
    float *y;
    int dim;
    float eps, s;
} rms_job;

static void rms_rows(void *ctx, int64_t r0, int64_t r1, int thread) {
    rms_job *j = ctx;
    const g4_cpu_kernels *k = g4_cpu_kernels_get();
    for (int64_t r = r0; r < r1; r++) {
        const float *x = j->x + (size_t)r * (size_t)j->dim;
        rms_apply(x, rms_inv(k, x, j->dim, j->eps), j->w, j->dim, j->y + (size_t)r * (size_t)j->dim);
    }
}

static void cpu_rmsnorm(g4_backend *be, const float *x, const float *w, int rows, int dim, float eps, float *y) {
    rms_job j = {x, w, y, dim, eps, 1.0f};
    g4_pool_for(cpu_of(be)->pool, rows, 1 + 4096 / (dim + 1), rms_rows, &j);
}

/* h = (h + rmsnorm(o) * w) * s; x is o, y is h */
static void post_norm_rows(void *ctx, int64_t r0, int64_t r1, int thread) {
    rms_job *j = ctx;
    const g4_cpu_kernels *k = g4_cpu_kernels_get();
    for (int64_t r = r0; r < r1; r++) {
        const float *o = j->x + (size_t)r * (size_t)j->dim;
        float *h = j->y + (size_t)r * (size_t)j->dim;
        float inv = rms_inv(k, o, j->dim, j->eps);
        for (int i = 0; i < j->dim; i++) {
            float v = o[i] * inv * j->w[i];
            h[i] = (h[i] + v) * j->s;
        }
    }
}

static void cpu_post_norm_add(g4_backend *be, float *h, const float *o, const float *w, int rows, int dim, float eps,
                              float s) {
    rms_job j = {o, w, h, dim, eps, s};
    g4_pool_for(cpu_of(be)->pool, rows, 1 + 4096 / (dim + 1), post_norm_rows, &j);
}

/* ------------------------------------------------------------------- rope */
static void cpu_rope_table(g4_backend *be, const int32_t *pos, int n, const float *inv_freq, int half,
                           float *table) {
    for (int t = 0; t < n; t++) {
        float p = (float)pos[t], *cs = table + (size_t)t * 2 * (size_t)half, *sn = cs + half;
        for (int k = 0; k < half; k++) {
            float a = inv_freq[k] * p; /* fp32 angle, as the reference computes it */
            cs[k] = cosf(a);
            sn[k] = sinf(a);
        }
    }
}

/* rotate-half RoPE of one head vector v[dim] with the cos/sin row cs (sin at cs + dim/2) */
static inline void rope_head(float *v, int dim, const float *cs) {
    const int half = dim / 2;
    const float *sn = cs + half;
    for (int k = 0; k < half; k++) {
        float a = v[k], b = v[k + half];
        v[k] = a * cs[k] - b * sn[k];
        v[k + half] = b * cs[k] + a * sn[k];
    }
}

static void cpu_rope(g4_backend *be, float *x, int n, int heads, int dim, const float *table) {
    for (int t = 0; t < n; t++)
        for (int h = 0; h < heads; h++)
            rope_head(x + ((size_t)t * (size_t)heads + (size_t)h) * (size_t)dim, dim, table + (size_t)t * (size_t)dim);
}

typedef struct {
    float *x;
    const float *w, *table;
    int heads, dim;
    float eps;
} head_job;

static void head_rows(void *ctx, int64_t r0, int64_t r1, int thread) {
    head_job *j = ctx;
    const g4_cpu_kernels *k = g4_cpu_kernels_get();
    for (int64_t r = r0; r < r1; r++) { /* r = token * heads + head */
        float *v = j->x + (size_t)r * (size_t)j->dim;
        rms_apply(v, rms_inv(k, v, j->dim, j->eps), j->w, j->dim, v);
        if (j->table) rope_head(v, j->dim, j->table + (size_t)(r / j->heads) * (size_t)j->dim);
    }
}

static void cpu_head_norm_rope(g4_backend *be, float *x, int n, int heads, int dim, const float *w, float eps,
                               const float *table) {
    head_job j = {x, w, table, heads, dim, eps};
    g4_pool_for(cpu_of(be)->pool, (int64_t)n * heads, 1 + 4096 / (dim + 1), head_rows, &j);
}

/* ----------------------------------------------------------- elementwise */
typedef struct {
    const float *g, *u;
    float *y;
} gelu_job;

static void gelu_range(void *ctx, int64_t b, int64_t e, int thread) {
    gelu_job *j = ctx;
    g4_cpu_kernels_get()->gelu_mul(j->g + b, j->u ? j->u + b : NULL, j->y + b, (size_t)(e - b));
}

static void cpu_gelu_mul(g4_backend *be, const float *g, const float *u, size_t n, float *y) {
    gelu_job j = {g, u, y};
    g4_pool_for(cpu_of(be)->pool, (int64_t)n, 8192, gelu_range, &j);
}

static void cpu_add(g4_backend *be, float *y, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}
static void cpu_scale(g4_backend *be, float *y, size_t n, float s) {
    for (size_t i = 0; i < n; i++) y[i] *= s;
}
static void cpu_mul(g4_backend *be, float *y, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] *= x[i];
}
static void cpu_add_scale(g4_backend *be, float *y, const float *x, size_t n, float s) {
    for (size_t i = 0; i < n; i++) y[i] = (y[i] + x[i]) * s;
}
typedef struct {
    float *y;
    float c;
} softcap_job;

static void softcap_range(void *ctx, int64_t b, int64_t e, int thread) {
    softcap_job *j = ctx;
    g4_cpu_kernels_get()->softcap(j->y + b, (size_t)(e - b), j->c);
}

static void cpu_softcap(g4_backend *be, float *y, size_t n, float c) {
    softcap_job j = {y, c};
    g4_pool_for(cpu_of(be)->pool, (int64_t)n, 16384, softcap_range, &j);
}

static void cpu_get_rows(g4_backend *be, const float *src, const int32_t *idx, int n, int row, float *dst) {
    for (int i = 0; i < n; i++)
        memcpy(dst + (size_t)i * (size_t)row, src + (size_t)idx[i] * (size_t)row, (size_t)row * sizeof(float));
}

static void cpu_transpose(g4_backend *be, const float *src, int na, int nb, int c, float *dst) {
    for (int a = 0; a < na; a++)
        for (int b = 0; b < nb; b++)
            memcpy(dst + ((size_t)b * (size_t)na + (size_t)a) * (size_t)c,
                   src + ((size_t)a * (size_t)nb + (size_t)b) * (size_t)c, (size_t)c * sizeof(float));
}

typedef struct {
    const float *x;
    int n;
    int32_t *out;
} argmax_job;

static void argmax_rows(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const argmax_job *j = ctx;
    const g4_cpu_kernels *k = g4_cpu_kernels_get();
    for (int64_t r = b; r < e; r++) j->out[r] = k->argmax(j->x + (size_t)r * (size_t)j->n, j->n);
}

static void cpu_argmax(g4_backend *be, const float *x, int rows, int n, int32_t *out) {
    argmax_job j = {x, n, out};
    g4_pool_for(cpu_of(be)->pool, rows, 1 + 65536 / (n + 1), argmax_rows, &j);
}

/* ---------------------------------------------------------- top-k candidates */
/* The order of floats as unsigned keys; NaN and -inf (never candidates) are 0, below every other key. */
static uint32_t top_key(float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    if (v != v || v == -INFINITY) return 0;
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}

typedef struct {
    const float *x;
    int n, k, cap;
    int32_t *ids, *count;
    float *vals;
} top_k_job;

/* Per row: the k-th largest key by radix selection (a byte a pass, most significant first), then the
 * qualifying indices in order. */
static void top_k_rows(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    const top_k_job *j = ctx;
    for (int64_t r = b; r < e; r++) {
        const float *x = j->x + (size_t)r * (size_t)j->n;
        uint32_t prefix = 0, mask = 0;
        int left = j->k, nan = 0;
        for (int i = 0; i < j->n; i++) nan |= x[i] != x[i];
        if (nan) { /* the caller finds the NaN in the row (backend.h) */
            j->count[r] = -1;
            continue;
        }
        for (int shift = 24; shift >= 0; shift -= 8) {
            uint32_t hist[256] = {0};
            for (int i = 0; i < j->n; i++) {
                uint32_t key = top_key(x[i]);
                if (key && (key & mask) == prefix) hist[key >> shift & 255]++;
            }
            int bin = 255;
            uint32_t cum = 0;
            while (bin >= 0 && cum + hist[bin] < (uint32_t)left) cum += hist[bin--];
            if (bin < 0) { /* fewer than k finite values (the first pass only): all of them */
                prefix = 1;
                break;
            }
            left -= (int)cum;
            prefix |= (uint32_t)bin << shift;
            mask |= 255u << shift;
        }
        int m = 0;
        int32_t *ids = j->ids + (size_t)r * (size_t)j->cap;
        float *vals = j->vals + (size_t)r * (size_t)j->cap;
        for (int i = 0; i < j->n && m <= j->cap; i++) /* (prefix >= 1: NaN and -inf never pass) */
            if (top_key(x[i]) >= prefix) {
                if (m < j->cap) ids[m] = i, vals[m] = x[i];
                m++;
            }
        j->count[r] = m > j->cap ? -1 : m;
    }
}

static void cpu_top_k(g4_backend *be, const float *x, int rows, int n, int k, int cap, int32_t *ids, float *vals,
                      int32_t *count) {
    top_k_job j = {x, n, k, cap, ids, count, vals};
    g4_pool_for(cpu_of(be)->pool, rows, 1, top_k_rows, &j);
}

/* ---------------------------------------------------------- masked logits */
typedef struct {
    const float *x;
    const g4_tensor *table;
    const int32_t *ids; /* the selected ids, n of them */
    float *vals;        /* their products */
    g4_cpu *cpu;
} masked_job;

static void masked_rows(void *ctx, int64_t b, int64_t e, int thread) {
    masked_job *j = ctx;
    const g4_cpu_kernels *k = g4_cpu_kernels_get();
    const size_t dim = (size_t)j->table->shape[1];
    float *row = j->table->dtype == G4_BF16 ? NULL : g4_cpu_scratch_get(j->cpu, thread, dim);
    if (j->table->dtype != G4_BF16 && !row) return;
    for (int64_t i = b; i < e; i++) {
        int32_t id = j->ids[i];
        if (!row) {
            j->vals[i] = k->dot_bf16((const uint16_t *)j->table->data + (size_t)id * dim, j->x, dim);
        } else {
            g4_tensor_rows_f32(j->table, &id, 1, 1.0f, row);
            j->vals[i] = k->dot_f32(row, j->x, dim);
        }
    }
}

static void masked_logits_row(g4_backend *be, const float *x, const float *scores, int n_groups, int top_k,
                              const int32_t *ordering, const g4_tensor *table, float *out) {
    g4_cpu *cpu = cpu_of(be);
    const int V = (int)table->shape[0], per = V / n_groups, n = top_k * per;
    /* the chosen groups' ids [n], a flag per group, the products [n] */
    size_t need = ((size_t)n + (size_t)n_groups) * sizeof(int32_t) + (size_t)n * sizeof(float);
    if (cpu->sel_cap < need) {
        void *nb = realloc(cpu->sel_buf, need);
        if (!nb) {
            cpu->failed = 1;
            return;
        }
        cpu->sel_buf = nb;
        cpu->sel_cap = need;
    }
    int32_t *ids = cpu->sel_buf;
    int32_t *taken = ids + n;
    float *vals = (float *)(taken + n_groups);
    memset(taken, 0, (size_t)n_groups * sizeof *taken);
    for (int kk = 0; kk < top_k; kk++) {
        int best = -1;
        for (int g = 0; g < n_groups; g++)
            if (!taken[g] && (best < 0 || scores[g] > scores[best])) best = g;
        taken[best] = 1;
        memcpy(ids + (size_t)kk * per, ordering + (size_t)best * per, (size_t)per * sizeof *ids);
    }
    masked_job j = {x, table, ids, vals, cpu};
    g4_pool_for(cpu->pool, n, 64, masked_rows, &j);
    float mn = vals[0];
    for (int i = 1; i < n; i++) mn = vals[i] < mn ? vals[i] : mn;
    /* the whole row gets the fill value in one pass (not through the ordering), then the products their places */
    const float fill = mn - 1.0f;
    for (int v = 0; v < V; v++) out[v] = fill;
    for (int i = 0; i < n; i++) out[ids[i]] = vals[i];
}

static void cpu_masked_logits(g4_backend *be, const float *x, const float *scores, int rows, int n_groups, int top_k,
                              const int32_t *ordering, const g4_tensor *table, float *out) {
    const size_t dim = (size_t)table->shape[1], V = (size_t)table->shape[0];
    for (int r = 0; r < rows; r++)
        masked_logits_row(be, x + r * dim, scores + (size_t)r * (size_t)n_groups, n_groups, top_k, ordering, table,
                          out + r * V);
}

/* --------------------------------------------------------------- KV cache */
static void store_row(g4_kv_type t, void *cache, size_t slot, const float *src, int row) {
    if (t == G4_KV_F32) {
        memcpy((float *)cache + slot * (size_t)row, src, (size_t)row * sizeof(float));
        return;
    }
    uint16_t *d = (uint16_t *)cache + slot * (size_t)row;
    if (t == G4_KV_BF16)
        for (int i = 0; i < row; i++) d[i] = g4_f32_to_bf16(src[i]);
    else
        for (int i = 0; i < row; i++) d[i] = g4_f32_to_f16(src[i]);
}

static void cpu_kv_store(g4_backend *be, const float *k, const float *v, int n, int row, const int32_t *slot,
                         void *k_cache, void *v_cache, g4_kv_type kv_type) {
    for (int i = 0; i < n; i++) {
        store_row(kv_type, k_cache, (size_t)slot[i], k + (size_t)i * (size_t)row, row);
        store_row(kv_type, v_cache, (size_t)slot[i], v + (size_t)i * (size_t)row, row);
    }
}

static void cpu_attn_prep(g4_backend *be, const g4_attn_prep_args *a) {
    const int D = a->head_dim;
    if (!a->kv_shared) {
        const size_t nkv = (size_t)a->n * (size_t)a->n_kv_heads * (size_t)D;
        if (a->v_from_k) memcpy(a->v, a->k, nkv * sizeof(float));
        cpu_head_norm_rope(be, a->k, a->n, a->n_kv_heads, D, a->k_norm, a->eps, a->rope);
        cpu_head_norm_rope(be, a->v, a->n, a->n_kv_heads, D, NULL, a->eps, NULL);
        cpu_kv_store(be, a->k, a->v, a->n, a->n_kv_heads * D, a->slot, a->k_cache, a->v_cache, a->kv_type);
    }
    cpu_head_norm_rope(be, a->q, a->n, a->n_heads, D, a->q_norm, a->eps, a->rope);
}

/* -------------------------------------------------------------- attention */
typedef struct {
    g4_cpu *cpu;
    const g4_attention_args *a;
} attn_job;

/* Head vector of `dim` elements at element offset `off` of a cache of type t, as f32: in place for f32, else
 * converted into tmp. */
static inline const float *cache_vec(g4_kv_type t, const void *cache, size_t off, int dim, float *tmp) {
    if (t == G4_KV_F32) return (const float *)cache + off;
    g4_to_f32(t == G4_KV_BF16 ? G4_BF16 : G4_F16, (const uint16_t *)cache + off, tmp, (size_t)dim);
    return tmp;
}

/* Query heads per work item: the heads of one KV head (GQA) share every key and value row read, in groups of up
 * to this many (the kernels' tile height). */
#define ATTN_HEADS 4

/* One item = (token, KV head, group of up to ATTN_HEADS of its query heads): scores of the group against each key
 * (4 keys per f32_tile within a cache block), a softmax per head, then p * V with each value row read once for the
 * group (kernel pv; f32 caches read in place, bf16/f16 rows converted one at a time). Every number of a token is
 * computed the same way whatever else is in the batch: the tiles depend only on the token's key range. */
static void attn_items(void *ctx, int64_t b, int64_t e, int thread) {
    attn_job *j = ctx;
    const g4_attention_args *a = j->a;
    const g4_cpu_kernels *k = g4_cpu_kernels_get();
    const int D = a->head_dim, G = a->n_heads / a->n_kv_heads, B = a->block_size;
    const int per_kv = (G + ATTN_HEADS - 1) / ATTN_HEADS, per_tok = a->n_kv_heads * per_kv;
    const size_t row = (size_t)a->n_kv_heads * (size_t)D;
    for (int64_t it = b; it < e; it++) {
        const int t = (int)(it / per_tok), g = (int)(it % per_tok) / per_kv;
        const int h0 = g * G + (int)(it % per_kv) * ATTN_HEADS, nh = g * G + G - h0 < ATTN_HEADS ? g * G + G - h0 : ATTN_HEADS;
        const int p = a->pos[t];
        const int lo = a->kv_start ? a->kv_start[t] : a->window ? (p - a->window + 1 > 0 ? p - a->window + 1 : 0) : 0;
        const int hi = a->kv_end ? a->kv_end[t] : p + 1;
        const int nk = hi - lo;
        float *sc = g4_cpu_scratch_get(j->cpu, thread, (size_t)nh * (size_t)nk + 4 * (size_t)D);
        if (!sc) return;
        float *tmp = sc + (size_t)nh * (size_t)nk; /* up to 4 converted rows */
        const float *q = a->q + ((size_t)t * (size_t)a->n_heads + (size_t)h0) * (size_t)D;
        float *out = a->out + ((size_t)t * (size_t)a->n_heads + (size_t)h0) * (size_t)D;
        const int32_t *table = a->block_table + (size_t)a->seq[t] * (size_t)a->max_blocks;
        const size_t head_off = (size_t)g * (size_t)D;
        for (int i = 0; i < nk;) { /* scores: runs of up to 4 keys inside one block */
            const int kp = lo + i, off = kp % B;
            int run = B - off < 4 ? B - off : 4;
            if (run > nk - i) run = nk - i;
            const size_t r = (size_t)table[kp / B] * (size_t)B + (size_t)off;
            const float *kr = (const float *)a->k + r * row + head_off;
            size_t ldk = row;
            if (a->kv_type != G4_KV_F32) {
                for (int x = 0; x < run; x++)
                    cache_vec(a->kv_type, a->k, (r + (size_t)x) * row + head_off, D, tmp + (size_t)x * (size_t)D);
                kr = tmp, ldk = (size_t)D;
            }
            float s4[16];
            k->f32_tile(q, (size_t)D, nh, kr, ldk, run, (size_t)D, s4, 4);
            for (int x = 0; x < run; x++)
                for (int h = 0; h < nh; h++) sc[(size_t)h * (size_t)nk + (size_t)(i + x)] = s4[x * 4 + h] * a->scale;
            i += run;
        }
        for (int h = 0; h < nh; h++) { /* softmax: the weights, normalized */
            float *sh = sc + (size_t)h * (size_t)nk, mx = -FLT_MAX;
            for (int i = 0; i < nk; i++) mx = sh[i] > mx ? sh[i] : mx;
            const float inv = 1.0f / k->exp_sum(sh, (size_t)nk, mx);
            for (int i = 0; i < nk; i++) sh[i] *= inv;
        }
        memset(out, 0, (size_t)nh * (size_t)D * sizeof(float));
        for (int i = 0; i < nk;) { /* p * V: runs of keys inside one block */
            const int kp = lo + i, off = kp % B;
            int run = B - off < nk - i ? B - off : nk - i;
            const size_t r = (size_t)table[kp / B] * (size_t)B + (size_t)off;
            if (a->kv_type == G4_KV_F32) {
                k->pv(out, (size_t)D, nh, sc + i, (size_t)nk, (const float *)a->v + r * row + head_off, row, run, (size_t)D);
            } else {
                for (int x = 0; x < run; x++)
                    k->pv(out, (size_t)D, nh, sc + i + x, (size_t)nk,
                          cache_vec(a->kv_type, a->v, (r + (size_t)x) * row + head_off, D, tmp), (size_t)D, 1, (size_t)D);
            }
            i += run;
        }
    }
}

static void cpu_attention(g4_backend *be, const g4_attention_args *a) {
    if (a->prep) cpu_attn_prep(be, a->prep);
    attn_job j = {cpu_of(be), a};
    const int G = a->n_heads / a->n_kv_heads;
    g4_pool_for(cpu_of(be)->pool, (int64_t)a->n_tokens * a->n_kv_heads * ((G + ATTN_HEADS - 1) / ATTN_HEADS), 1,
                attn_items, &j);
}

/* -------------------------------------------------------------------- MoE */
/* Routed rows of one wave of experts: the (token, expert) pairs of experts e0 .. e1-1 in ascending expert id,
 * each expert's tokens ascending; start[e - e0] is expert e's first pair. */
typedef struct {
    int e0, e1, m; /* experts [e0, e1), pairs */
    int32_t *rows; /* [m] token of each pair */
    float *rw;     /* [m] its routing weight */
    int start[G4_Q8_MAX_PRODUCTS + 1];
} moe_wave;

/* The experts of a wave on int8 activations (every expert matrix Q8_0/Q4_0 of one type): the pairs' inputs
 * quantized once, every expert's gate/up in one pool job, then their down projections in one more; each (row,
 * token) the same bits as a product of its own. dn[i] = expert output of pair i. */
static void moe_wave_q8(g4_cpu *cpu, const g4_moe_args *a, const moe_wave *wv, const float *xs, float *gu,
                        float *act, float *dn) {
    const int H = a->hidden, Im = a->expert_dim, m = wv->m;
    const g4_cpu_kernels *k = g4_cpu_kernels_get();
    g4_tensor wt[G4_Q8_MAX_PRODUCTS];
    g4_q8_product p[G4_Q8_MAX_PRODUCTS];
    g4_q8_rows q;
    /* gate and up: one [2Im, H] matrix per expert, rows [m, 2Im]; or two [Im, H] ones into [m, Im] each */
    const size_t gs = a->up ? (size_t)Im : 2 * (size_t)Im, uo = a->up ? (size_t)m * Im : (size_t)Im;
    if (g4_cpu_q8_prepare(cpu, xs, m, (size_t)H, a->gate_up->dtype, &q)) return;
    int np = 0;
    for (int e = wv->e0; e < wv->e1; e++) {
        const int s0 = wv->start[e - wv->e0], me = wv->start[e - wv->e0 + 1] - s0;
        if (!me) continue;
        wt[np] = g4_tensor_index(a->gate_up, e);
        p[np] = (g4_q8_product){&wt[np], NULL, gu + (size_t)s0 * gs, &q, s0, me};
        np++;
        if (a->up) {
            wt[np] = g4_tensor_index(a->up, e);
            p[np] = (g4_q8_product){&wt[np], NULL, gu + uo + (size_t)s0 * gs, &q, s0, me};
            np++;
        }
    }
    g4_cpu_q8_products(cpu, p, np);
    for (int i = 0; i < m; i++)
        k->gelu_mul(gu + (size_t)i * gs, gu + (size_t)i * gs + uo, act + (size_t)i * Im, (size_t)Im);
    if (g4_cpu_q8_prepare(cpu, act, m, (size_t)Im, a->down->dtype, &q)) return;
    np = 0;
    for (int e = wv->e0; e < wv->e1; e++) {
        const int s0 = wv->start[e - wv->e0], me = wv->start[e - wv->e0 + 1] - s0;
        if (!me) continue;
        wt[np] = g4_tensor_index(a->down, e);
        p[np] = (g4_q8_product){&wt[np], NULL, dn + (size_t)s0 * H, &q, s0, me};
        np++;
    }
    g4_cpu_q8_products(cpu, p, np);
}

/* The experts of a wave one at a time (other weight types). */
static void moe_wave_each(g4_cpu *cpu, const g4_moe_args *a, const moe_wave *wv, const float *xs, float *gu,
                          float *act, float *dn) {
    const int H = a->hidden, Im = a->expert_dim;
    const g4_cpu_kernels *k = g4_cpu_kernels_get();
    for (int e = wv->e0; e < wv->e1; e++) {
        const int s0 = wv->start[e - wv->e0], me = wv->start[e - wv->e0 + 1] - s0;
        if (!me) continue;
        g4_tensor gu_w = g4_tensor_index(a->gate_up, e), dn_w = g4_tensor_index(a->down, e);
        const size_t gs = a->up ? (size_t)Im : 2 * (size_t)Im, uo = a->up ? (size_t)me * Im : (size_t)Im;
        g4_cpu_matmul(cpu, xs + (size_t)s0 * H, me, &gu_w, NULL, gu);
        if (a->up) {
            g4_tensor up_w = g4_tensor_index(a->up, e);
            g4_cpu_matmul(cpu, xs + (size_t)s0 * H, me, &up_w, NULL, gu + uo);
        }
        for (int i = 0; i < me; i++)
            k->gelu_mul(gu + (size_t)i * gs, gu + (size_t)i * gs + uo, act + (size_t)i * Im, (size_t)Im);
        g4_cpu_matmul(cpu, act, me, &dn_w, NULL, dn + (size_t)s0 * H);
    }
}

static int moe_q8(const g4_moe_args *a) {
    if (!g4_cpu_q8_supported(a->gate_up) || !g4_cpu_q8_supported(a->down)) return 0;
    if (a->up && (!g4_cpu_q8_supported(a->up) || a->up->dtype != a->gate_up->dtype)) return 0;
    return 1;
}

static void cpu_moe(g4_backend *be, const g4_moe_args *a) {
    g4_cpu *cpu = cpu_of(be);
    const int n = a->n, H = a->hidden, E = a->n_experts, TK = a->top_k, Im = a->expert_dim;
    /* pairs per wave of experts: every pair of a step of up to 4 tokens, else 4 tokens' worth (an expert takes a
     * token at most once, so one expert always fits) */
    const int cap = n * TK < 4 * (n > 4 ? n : 4) ? n * TK : 4 * (n > 4 ? n : 4);
    size_t need = (size_t)n * (size_t)TK * 2 + (size_t)n * ((size_t)E + (size_t)H) /* weights, ids, logits, z */
                  + (size_t)cap * (size_t)H                             /* gathered x2 rows */
                  + (size_t)n * (size_t)H * 2                           /* x2, expert sum */
                  + (size_t)cap * 2 * (size_t)Im                        /* gate_up out */
                  + (size_t)cap * (size_t)Im + (size_t)cap * (size_t)H  /* act, down out */
                  + (size_t)cap * 2;                                    /* routed rows and their weights */
    if (cpu->moe_cap < need) {
        float *nb = realloc(cpu->moe_buf, need * sizeof(float));
        if (!nb) {
            cpu->failed = 1;
            return;
        }
        cpu->moe_buf = nb;
        cpu->moe_cap = need;
    }
    float *w = cpu->moe_buf;                           /* [n, TK] routing weights */
    int32_t *ids = (int32_t *)(w + (size_t)n * TK);    /* [n, TK] expert ids (int32 in float slots) */
    float *lgs = (float *)(ids + (size_t)n * TK);      /* [n, E] router logits */
    float *zs = lgs + (size_t)n * E;                   /* [n, H] router inputs */
    float *xs = zs + (size_t)n * H;                    /* [cap, H] the wave's gathered inputs */
    float *gu = xs + (size_t)cap * H;                  /* [cap, 2Im] */
    float *act = gu + (size_t)cap * 2 * Im;            /* [cap, Im] */
    float *dn = act + (size_t)cap * Im;                /* [cap, H] */
    int32_t *rows = (int32_t *)(dn + (size_t)cap * H); /* [cap] token of each of the wave's pairs */
    float *rw = (float *)(rows + cap);                 /* [cap] their routing weights */
    float *x2 = rw + cap;                              /* [n, H] rmsnorm(residual) * pre_norm2 */
    float *esum = x2 + (size_t)n * H;                  /* [n, H] the experts' weighted sum */
    if (a->mlp.count) { /* the dense MLP first (with the residual prologue, if any, which makes the residual) */
        cpu_matmul_set(be, a->residual, n, &a->mlp);
        g4_cpu_matmul(cpu, a->mlp.y[0], n, a->mlp_down, NULL, a->dense);
    }
    cpu_rmsnorm(be, a->residual, a->pre_norm2, n, H, a->eps, x2);
    const float inv_sqrt_h = 1.0f / sqrtf((float)H);
    const g4_cpu_kernels *k = g4_cpu_kernels_get();
    for (int t = 0; t < n; t++) {
        const float *r = a->residual + (size_t)t * H;
        float ms = k->dot_f32(r, r, (size_t)H) / (float)H;
        float inv = 1.0f / sqrtf(ms + a->eps), *z = zs + (size_t)t * H;
        for (int i = 0; i < H; i++) z[i] = r[i] * inv * a->router_scale[i] * inv_sqrt_h;
    }
    /* every token's router logits in one product, on f32 activations (an 8-bit MLX router too) */
    g4_cpu_matmul_f32(cpu, zs, n, a->router_proj, NULL, lgs);
    for (int t = 0; t < n; t++) {
        float *lg = lgs + (size_t)t * E;
        float mx = -FLT_MAX, sum = 0;
        for (int e = 0; e < E; e++) mx = lg[e] > mx ? lg[e] : mx;
        for (int e = 0; e < E; e++) {
            lg[e] = expf(lg[e] - mx);
            sum += lg[e];
        }
        for (int e = 0; e < E; e++) lg[e] /= sum;
        /* top-k, descending; ties -> lower expert id */
        float wsum = 0;
        for (int kk = 0; kk < TK; kk++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int q = 0; q < kk; q++) taken |= ids[(size_t)t * TK + q] == e;
                if (!taken && (best < 0 || lg[e] > lg[best])) best = e;
            }
            ids[(size_t)t * TK + kk] = best;
            w[(size_t)t * TK + kk] = lg[best];
            wsum += lg[best];
        }
        for (int kk = 0; kk < TK; kk++) {
            float *wk = &w[(size_t)t * TK + kk];
            *wk = *wk / wsum * a->per_expert_scale[ids[(size_t)t * TK + kk]];
        }
    }
    memset(esum, 0, (size_t)n * H * sizeof(float));
    const int q8 = moe_q8(a), per_expert = a->up ? 2 : 1;
    /* experts in ascending id order, in waves of at most cap pairs (and G4_Q8_MAX_PRODUCTS products) */
    moe_wave wv = {.rows = rows, .rw = rw};
    for (int e0 = 0; e0 < E;) {
        wv.e0 = e0, wv.m = 0;
        int e = e0;
        for (; e < E && (e - e0 + 1) * per_expert <= G4_Q8_MAX_PRODUCTS; e++) {
            int me = 0;
            for (int t = 0; t < n; t++)
                for (int kk = 0; kk < TK; kk++) me += ids[(size_t)t * TK + kk] == e;
            if (wv.m + me > cap) break;
            wv.start[e - e0] = wv.m;
            for (int t = 0; t < n; t++)
                for (int kk = 0; kk < TK; kk++)
                    if (ids[(size_t)t * TK + kk] == e) {
                        rows[wv.m] = t;
                        rw[wv.m] = w[(size_t)t * TK + kk];
                        wv.m++;
                    }
        }
        wv.e1 = e, wv.start[e - e0] = wv.m;
        e0 = e;
        if (!wv.m) continue;
        for (int i = 0; i < wv.m; i++) memcpy(xs + (size_t)i * H, x2 + (size_t)rows[i] * H, (size_t)H * sizeof(float));
        if (q8)
            moe_wave_q8(cpu, a, &wv, xs, gu, act, dn);
        else
            moe_wave_each(cpu, a, &wv, xs, gu, act, dn);
        for (int i = 0; i < wv.m; i++) k->axpy(esum + (size_t)rows[i] * H, dn + (size_t)i * H, rw[i], (size_t)H);
    }
    /* out = rmsnorm(dense) * post_norm1 + rmsnorm(sum) * post_norm2 */
    cpu_rmsnorm(be, esum, a->post_norm2, n, H, a->eps, esum);
    cpu_rmsnorm(be, a->dense, a->post_norm1, n, H, a->eps, a->out);
    for (size_t i = 0; i < (size_t)n * H; i++) a->out[i] += esum[i];
}

static const g4_backend_ops cpu_ops = {
    .name = "cpu",
    .host_memory = 1,
    .free = cpu_free,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .to_device = cpu_copy,
    .rows_to_device = cpu_rows_to_device,
    .to_host = cpu_copy,
    .copy = cpu_copy,
    .sync = cpu_sync,
    .memory = cpu_memory,
    .check = cpu_check,
    .upload_weight = cpu_upload_weight,
    .release_weight = cpu_release_weight,
    .embed = cpu_embed,
    .matmul = cpu_matmul,
    .matmul_set = cpu_matmul_set,
    .rmsnorm = cpu_rmsnorm,
    .post_norm_add = cpu_post_norm_add,
    .rope_table = cpu_rope_table,
    .rope = cpu_rope,
    .head_norm_rope = cpu_head_norm_rope,
    .gelu_mul = cpu_gelu_mul,
    .add = cpu_add,
    .scale = cpu_scale,
    .mul = cpu_mul,
    .add_scale = cpu_add_scale,
    .softcap = cpu_softcap,
    .get_rows = cpu_get_rows,
    .transpose = cpu_transpose,
    .argmax = cpu_argmax,
    .top_k = cpu_top_k,
    .masked_logits = cpu_masked_logits,
    .kv_store = cpu_kv_store,
    .attn_prep = cpu_attn_prep,
    .attention = cpu_attention,
    .moe = cpu_moe,
    .attention_dense = g4_cpu_attention_dense,
    .clamp = g4_cpu_clamp,
    .shift_scale_cols = g4_cpu_shift_scale_cols,
    .gather_sum = g4_cpu_gather_sum,
    .sigmoid_mul = g4_cpu_sigmoid_mul,
    .layernorm = g4_cpu_layernorm,
    .im2col = g4_cpu_im2col,
    .conv1d_causal_dw = g4_cpu_conv1d_causal_dw,
    .local_attention = g4_cpu_local_attention,
};

g4_backend *g4_backend_cpu_new(int n_threads, int bf16_act, g4_error *err) {
    g4_backend *be = calloc(1, sizeof *be);
    g4_cpu *cpu = calloc(1, sizeof *cpu);
    if (!be || !cpu) {
        free(be);
        free(cpu);
        g4_fail(err, "out of memory");
        return NULL;
    }
    if (n_threads <= 0) n_threads = g4_cpu_count();
    if (n_threads > G4_CPU_MAX_THREADS) n_threads = G4_CPU_MAX_THREADS;
    cpu->pool = g4_pool_new(n_threads);
    if (!cpu->pool) {
        free(be);
        free(cpu);
        g4_fail(err, "cannot start %d threads", n_threads);
        return NULL;
    }
    cpu->n_threads = g4_pool_threads(cpu->pool);
    cpu->bf16_act = bf16_act != 0;
    (void)g4_cpu_kernels_get();
    be->ops = &cpu_ops;
    be->impl = cpu;
    return be;
}

