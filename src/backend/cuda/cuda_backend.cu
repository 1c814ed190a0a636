/* The CUDA backend (src/backend/backend.h; docs/architecture.md, "The backend owns its memory"): device memory,
 * weight placement, recorded steps (CUDA graphs) and the op table. The ops live in cuda_gemv.cu (products),
 * cuda_blas.cu (prefill products), cuda_attention.cu, cuda_moe.cu and cuda_misc.cu; quantized weights
 * (GGUF Q8_0/Q4_0/Q4_K/Q6_K, MLX affine 4/8-bit) are repacked at upload by cuda_quant.cu and stay packed.
 *
 * Everything runs on one stream. Host-to-device copies of step inputs go through a pinned staging buffer
 * (reset at each sync), so they are asynchronous; device-to-host copies wait for the stream (the contract:
 * results are visible after to_host). Errors of a step (a failed launch, cuBLAS, a workspace that cannot grow)
 * are kept until check() reports the first one.
 *
 * Recordings: a step shape (owner, key) runs eagerly the first time (workspaces reach their size), is captured
 * into a CUDA graph the second time, and replayed from the third on. Workspaces that move afterwards bump a
 * generation, and recordings of an older generation are captured again. Environment: G4_CUDA_GRAPHS=0 turns
 * recordings off, G4_CUDA_PDL=0 programmatic dependent launch, G4_CUDA_PROFILE=1 prints the time of each
 * kernel when the backend is freed (steps then run eagerly), G4_CUDA_STEP_TIME=1 how long replayed steps take before,
 * in and after their recording, G4_CUDA_GEMM=bf16 (or bf16_act, from
 * g4_load_params.bf16_activations) turns off the precise prefill products (cuda_blas.cu: activations rounded to
 * bf16 once, half the tensor-core work), G4_CUDA_QGEMM=precise turns them on for quantized weights too (as
 * G4_NO_INT8_ACT does). A build with -DCMAKE_CUDA_FLAGS=-DG4_CUDA_TRACE and G4_CUDA_TRACE=1 prints
 * the timeline of the last replayed recording when the backend is freed (cuda_common.cuh: every kernel's wait and
 * its marks, from the GPU's global timer; the recording runs as in production). */
#include "backend/cuda/cuda_common.cuh"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STAGING_BYTES ((size_t)64 << 20)
#define N_COUNTERS 65536

void g4c_note(g4c *c, cudaError_t e, const char *what) {
    if (e == cudaSuccess || c->error != cudaSuccess) return;
    c->error = e;
    snprintf(c->error_what, sizeof c->error_what, "%s: %s", what, cudaGetErrorString(e));
}

void *g4c_ws(g4c *c, g4c_buf *b, size_t bytes) {
    if (b->cap >= bytes) return b->p;
    size_t cap = bytes > 2 * b->cap ? bytes : 2 * b->cap;
    cap = (cap + 4095) & ~(size_t)4095;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, cap);
    if (e != cudaSuccess) {
        cudaGetLastError();
        g4c_note(c, e, "growing a workspace");
        return NULL;
    }
    /* a buffer a recording may still use is kept until the backend goes: recordings of older generations are
     * captured again before they run */
    if (b->p) {
        if (c->capturing) {
            void **r = (void **)realloc(c->retired, (size_t)(c->n_retired + 1) * sizeof *r);
            if (r) {
                c->retired = r;
                c->retired[c->n_retired++] = b->p;
            }
        } else {
            cudaFree(b->p);
        }
    }
    b->p = p;
    b->cap = cap;
    c->generation++;
    return p;
}

/* ---------------------------------------------------------------- profile */
#define PROF_EVENTS 16384
#define PROF_KERNELS 128

typedef struct g4c_profile {
    cudaEvent_t ev[PROF_EVENTS];
    const void *pending[PROF_EVENTS / 2];
    const char *pending_name[PROF_EVENTS / 2];
    int n_pending;
    const void *kernel[PROF_KERNELS];
    const char *name[PROF_KERNELS]; /* NULL: the kernel's own name */
    double ms[PROF_KERNELS];
    long calls[PROF_KERNELS];
    int n_kernels;
} g4c_profile;

static void profile_collect(g4c *c) {
    g4c_profile *p = c->profile;
    if (!p || !p->n_pending) return;
    cudaEventSynchronize(p->ev[2 * p->n_pending - 1]);
    for (int i = 0; i < p->n_pending; i++) {
        float ms = 0;
        cudaEventElapsedTime(&ms, p->ev[2 * i], p->ev[2 * i + 1]);
        int k = 0;
        while (k < p->n_kernels && p->kernel[k] != p->pending[i]) k++;
        if (k == p->n_kernels) {
            if (k == PROF_KERNELS) continue;
            p->kernel[p->n_kernels++] = p->pending[i];
            p->name[k] = p->pending_name[i];
            p->ms[k] = 0, p->calls[k] = 0;
        }
        p->ms[k] += ms;
        p->calls[k]++;
    }
    p->n_pending = 0;
}

void g4c_profile_begin(g4c *c) {
    g4c_profile *p = c->profile;
    if (p->n_pending == PROF_EVENTS / 2) profile_collect(c);
    cudaEventRecord(p->ev[2 * p->n_pending], c->stream);
}

void g4c_profile_end_named(g4c *c, const void *key, const char *name) {
    g4c_profile *p = c->profile;
    cudaEventRecord(p->ev[2 * p->n_pending + 1], c->stream);
    p->pending_name[p->n_pending] = name;
    p->pending[p->n_pending++] = key;
}

void g4c_profile_end(g4c *c, const void *kernel) { g4c_profile_end_named(c, kernel, NULL); }

static void profile_print(g4c *c) {
    g4c_profile *p = c->profile;
    profile_collect(c);
    double total = 0;
    for (int k = 0; k < p->n_kernels; k++) total += p->ms[k];
    fprintf(stderr, "cuda profile: %.3f ms in kernels\n", total);
    for (int pass = 0; pass < p->n_kernels; pass++) { /* largest first */
        int best = -1;
        for (int k = 0; k < p->n_kernels; k++)
            if (p->calls[k] >= 0 && (best < 0 || p->ms[k] > p->ms[best])) best = k;
        const char *name = p->name[best] ? p->name[best] : "?";
#ifndef G4_CUDA_EMU
        if (!p->name[best]) cudaFuncGetName(&name, p->kernel[best]);
#endif
        fprintf(stderr, "cuda profile: %10.3f ms %5.1f%% %8ld calls %9.2f us/call  %s\n", p->ms[best],
                100.0 * p->ms[best] / (total > 0 ? total : 1), p->calls[best], 1e3 * p->ms[best] / (double)p->calls[best],
                name);
        p->calls[best] = -1;
    }
}

/* ---------------------------------------------------------------- memory */
static void *cu_alloc(g4_backend *be, size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 16) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cu_release(g4_backend *be, void *p) {
    if (p) cudaFree(p);
}

unsigned char *g4c_staging_take(g4c *c, size_t bytes) {
    if (!c->staging || bytes > c->staging_cap - c->staging_used) return NULL;
    unsigned char *s = c->staging + c->staging_used;
    c->staging_used += (bytes + 255) & ~(size_t)255;
    if (c->staging_used > c->staging_cap) c->staging_used = c->staging_cap;
    return s;
}

void g4c_copy_to_device(g4c *c, void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    unsigned char *s = g4c_staging_take(c, bytes);
    if (s) {
        memcpy(s, src, bytes);
        g4c_note(c, cudaMemcpyAsync(dst, s, bytes, cudaMemcpyHostToDevice, c->stream), "copy to the GPU");
    } else { /* from pageable memory: returns once the source is read */
        g4c_note(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream), "copy to the GPU");
    }
}

static void cu_to_device(g4_backend *be, void *dst, const void *src, size_t bytes) {
    g4c_copy_to_device(g4c_of(be), dst, src, bytes);
}

/* G4_CUDA_STEP_TIME=1: events at the end of each sync (0), before and after each replayed recording (1, 2) and
 * before the sync that ends its step (3): the GPU's time from the last sync to the recording's start (the host's
 * work on the step and its input copies), in the recording, and from its end to the sync (the results' copy),
 * summed over replayed steps and printed when the backend is freed. */
typedef struct g4c_step_time {
    cudaEvent_t ev[4];
    int armed, replayed;
    long steps;
    double ms[3];
} g4c_step_time;

static void cu_sync(g4_backend *be) {
    g4c *c = g4c_of(be);
    g4c_step_time *t = c->step_time;
    if (t && t->replayed) cudaEventRecord(t->ev[3], c->stream);
    g4c_note(c, cudaStreamSynchronize(c->stream), "running the step");
    c->staging_used = 0;
    if (c->profile) profile_collect(c);
    if (t) {
        if (t->replayed) {
            for (int i = 0; i < 3; i++) {
                float ms = 0.0f;
                cudaEventElapsedTime(&ms, t->ev[i], t->ev[i + 1]);
                t->ms[i] += ms;
            }
            t->steps++;
            t->replayed = 0;
        }
        t->armed = cudaEventRecord(t->ev[0], c->stream) == cudaSuccess;
    }
}

static void cu_to_host(g4_backend *be, void *dst, const void *src, size_t bytes) {
    g4c *c = g4c_of(be);
    if (!bytes) return;
    g4c_note(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream), "copy from the GPU");
    cu_sync(be);
}

static void cu_copy(g4_backend *be, void *dst, const void *src, size_t bytes) {
    g4c *c = g4c_of(be);
    if (bytes) g4c_note(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream), "copy on the GPU");
}

static int cu_check(g4_backend *be, g4_error *err) {
    g4c *c = g4c_of(be);
    g4c_note(c, cudaGetLastError(), "kernel");
    if (c->error == cudaSuccess) return 0;
    c->error = cudaSuccess;
    return g4_fail(err, "CUDA error in %s", c->error_what);
}

/* ---------------------------------------------------------------- weights */
/* src's header as it is held in device memory: its dtype g4c_held_dtype (another one for a type this backend has no
 * kernels for: re-encoded at upload; skip: how many exact layouts refused its rows); an MLX group and scale type only
 * where it stays MLX, or (a GGUF type held as MLX) 32 and F32. */
static g4_tensor held_header(const g4_tensor *src, int skip) {
    g4_tensor h = *src;
    const int64_t in = src->ndim ? src->shape[src->ndim - 1] : 1;
    h.dtype = g4c_held_dtype(src->dtype, skip);
    while (h.dtype != src->dtype && g4_dtype_block(h.dtype) > 0 && in % g4_dtype_block(h.dtype) &&
           g4c_held_dtype(src->dtype, skip + 1) != h.dtype) /* (a layout whose blocks do not divide the rows: the next) */
        h.dtype = g4c_held_dtype(src->dtype, ++skip);
    if (h.dtype != src->dtype && !g4_dtype_is_mlx(h.dtype)) h.group = 0, h.scale_dtype = G4_DTYPE_UNKNOWN;
    if (g4_dtype_is_mlx(h.dtype) && !g4_dtype_is_mlx(src->dtype)) h.group = 32, h.scale_dtype = G4_F32;
    return h;
}

/* The bytes src takes in device memory (rows padded to 16 bytes, quantized ones repacked: g4c_wrow_bytes, of the
 * held dtype), or -1 with a message where this backend does not read it. */
static int64_t weight_bytes(const g4_tensor *src, int skip, g4_error *err) {
    const g4_tensor h = held_header(src, skip);
    if (h.dtype == G4_DTYPE_UNKNOWN)
        return g4_fail(err, "tensor '%s': the CUDA backend reads BF16, F16, F32, GGUF and MLX weights, not %s", src->name,
                       g4_dtype_name(src->dtype));
    if (h.dtype != src->dtype && h.dtype != G4_CB4 && h.dtype != G4_CB4_16 && h.dtype != G4_MXF4 && !src->data) {
        /* (random weights are made on the GPU, in its own types: a codebook or FP4 type's as CB4 / CB4_16 / MXF4) */
        char flag[16] = {0}; /* the held type as --type spells it */
        for (size_t i = 0; i + 1 < sizeof flag && g4_dtype_name(h.dtype)[i]; i++)
            flag[i] = (char)tolower((unsigned char)g4_dtype_name(h.dtype)[i]);
        return g4_fail(err, "tensor '%s': random %s weights: the CUDA backend has no %s kernels (it holds a file's %s "
                            "tensors as %s: --type %s runs those)", src->name, g4_dtype_name(src->dtype),
                       g4_dtype_name(src->dtype), g4_dtype_name(src->dtype), g4_dtype_name(h.dtype), flag);
    }
    const int64_t in = src->ndim ? src->shape[src->ndim - 1] : 1;
    const int64_t rows = in > 0 ? g4_tensor_numel(src) / in : 0;
    if (g4_dtype_is_quantized(src->dtype) &&
        (g4_dtype_is_mlx(src->dtype) ? (src->group != 32 && src->group != 64 && src->group != 128) || in % src->group ||
                                           (src->data && (!src->scales || !src->biases))
                                     : in % g4_dtype_block(src->dtype)))
        return g4_fail(err, "tensor '%s': rows of %lld elements are not whole %s blocks (or MLX groups of 32/64/128)",
                       src->name, (long long)in, g4_dtype_name(src->dtype));
    if (h.dtype != src->dtype && in % g4_dtype_block(h.dtype))
        return g4_fail(err, "tensor '%s': rows of %lld elements are not whole %s blocks (the CUDA backend holds %s "
                            "tensors as %s)", src->name, (long long)in, g4_dtype_name(h.dtype),
                       g4_dtype_name(src->dtype), g4_dtype_name(h.dtype));
    return rows * (int64_t)g4c_wrow_bytes(&h);
}

static void *weight_alloc(g4c *c, size_t bytes, const char *name, g4_error *err) {
    void *d = NULL;
    if (cudaMalloc(&d, bytes ? bytes : 16) == cudaSuccess) return d;
    cudaGetLastError();
    size_t free_b = 0, total = 0;
    cudaMemGetInfo(&free_b, &total);
    g4_fail(err, "the model does not fit in GPU memory: %s needs %.1f MB, %.2f GB of %.2f GB are free on %s", name,
            (double)bytes / 1e6, (double)free_b / 1e9, (double)total / 1e9, c->prop.name);
    return NULL;
}

/* src's values (or random ones where it has no data) into d, weight_bytes(src, skip) bytes of device memory; *dst is
 * src as held there (its dtype g4c_held_dtype). -2 where a row could not be re-encoded as the held type (CB4: a block
 * it cannot hold; then as the next, skip + 1), -1 on other errors. */
static int weight_fill(g4c *c, const g4_tensor *src, int skip, void *d, g4_tensor *dst, g4_error *err) {
    const g4_tensor h = held_header(src, skip);
    const int quant = g4_dtype_is_quantized(src->dtype);
    const int64_t in = src->ndim ? src->shape[src->ndim - 1] : 1;
    const int64_t rows = in > 0 ? g4_tensor_numel(src) / in : 0;
    const size_t esz = quant ? 0 : (size_t)g4_dtype_bits(src->dtype) / 8, row_bytes = g4c_wrow_bytes(&h);
    const size_t bytes = (size_t)rows * row_bytes;
    cudaError_t e = cudaSuccess;
    if (src->data && quant) {
        const int rc = g4c_upload_quant(c, src, h.dtype, d, rows, row_bytes, err);
        if (rc) return rc;
    } else if (src->data) {
        if (row_bytes == (size_t)in * esz) {
            e = cudaMemcpyAsync(d, src->data, bytes, cudaMemcpyHostToDevice, c->stream);
        } else { /* padded rows: zeros, then the rows */
            e = cudaMemsetAsync(d, 0, bytes, c->stream);
            if (e == cudaSuccess)
                e = cudaMemcpy2DAsync(d, row_bytes, src->data, (size_t)in * esz, (size_t)in * esz, (size_t)rows,
                                      cudaMemcpyHostToDevice, c->stream);
        }
        if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    } else if (rows > 0) {
        if (quant)
            g4c_fill_random_quant(c, d, &h, rows, row_bytes, g4_name_seed(src->name));
        else
            g4c_fill_random(c, d, src->dtype, rows, in, row_bytes, g4_name_seed(src->name));
        e = cudaGetLastError();
    }
    if (e != cudaSuccess) return g4_fail(err, "tensor '%s': copy to the GPU failed: %s", src->name, cudaGetErrorString(e));
    *dst = h;
    dst->data = d;
    dst->nbytes = bytes;
    dst->scales = dst->biases = NULL; /* in the rows */
    return 0;
}

/* After weight_fill refused a row of src as held with `skip` (rc -2): the skip that holds it in the next layout,
 * -1 where none is left (or rc was another error) */
static int next_skip(const g4_tensor *src, int skip, int rc) {
    const g4_dtype refused = held_header(src, skip).dtype;
    for (int s = skip + 1; rc == -2 && s <= skip + 8; s++)
        if (held_header(src, s).dtype != refused) return s;
    return -1;
}

static int cu_upload_weight(g4_backend *be, const g4_tensor *src, g4_tensor *dst, g4_error *err) {
    g4c *c = g4c_of(be);
    for (int skip = 0;;) {
        const int64_t bytes = weight_bytes(src, skip, err);
        if (bytes < 0) return -1;
        char what[300];
        snprintf(what, sizeof what, "tensor '%s'", src->name);
        void *d = weight_alloc(c, (size_t)bytes, what, err);
        if (!d) return -1;
        const int rc = weight_fill(c, src, skip, d, dst, err);
        if (!rc) return 0;
        cudaFree(d);
        if ((skip = next_skip(src, skip, rc)) < 0) return -1;
    }
}

/* A set's weights in one block, each right after the one before (when its size is a multiple of 256 bytes, as the
 * model's are; otherwise the next starts at the next multiple): g4c_gemm_set_stacked multiplies weights that
 * follow each other as one product (one cuBLAS call for q/k/v instead of three). */
static int cu_upload_weights(g4_backend *be, const g4_tensor *const *src, g4_tensor *const *dst, int count,
                             g4_error *err) {
    g4c *c = g4c_of(be);
    size_t at[G4_MATMUL_SET_MAX + 1] = {0};
    int skip[G4_MATMUL_SET_MAX] = {0};
    if (count < 1 || count > G4_MATMUL_SET_MAX) return g4_fail(err, "a set of %d weights", count);
    struct g4c_wset *sets = (struct g4c_wset *)realloc(c->wsets, (size_t)(c->n_wsets + 1) * sizeof *sets);
    if (!sets) return g4_fail(err, "out of memory");
    c->wsets = sets;
    for (;;) { /* (again with a weight's next layout where one refused it) */
        for (int i = 0; i < count; i++) {
            const int64_t bytes = weight_bytes(src[i], skip[i], err);
            if (bytes < 0) return -1;
            at[i + 1] = at[i] + ((size_t)bytes + 255) / 256 * 256;
        }
        char what[300];
        snprintf(what, sizeof what, "the set of '%s' (%d tensors)", src[0]->name, count);
        unsigned char *d = (unsigned char *)weight_alloc(c, at[count], what, err);
        if (!d) return -1;
        int i = 0, rc = 0;
        while (i < count && !(rc = weight_fill(c, src[i], skip[i], d + at[i], dst[i], err))) i++;
        if (i == count) {
            c->wsets[c->n_wsets++] = (struct g4c_wset){d, at[count], count};
            return 0;
        }
        for (int j = 0; j < i; j++) dst[j]->data = NULL;
        cudaFree(d);
        if ((skip[i] = next_skip(src[i], skip[i], rc)) < 0) return -1;
    }
}

static void cu_release_weight(g4_backend *be, g4_tensor *w) {
    g4c *c = g4c_of(be);
    unsigned char *p = (unsigned char *)w->data;
    w->data = NULL;
    if (!p) return;
    for (int i = 0; i < c->n_wsets; i++) {
        struct g4c_wset *s = &c->wsets[i];
        if (p < s->base || p >= s->base + s->bytes) continue;
        if (--s->live == 0) { /* the block goes with the set's last weight */
            cudaFree(s->base);
            *s = c->wsets[--c->n_wsets];
        }
        return;
    }
    cudaFree(p);
}

/* ---------------------------------------------------------------- recordings */
static int cu_graph_begin(g4_backend *be, const void *owner, uint64_t key) {
    g4c *c = g4c_of(be);
    if (!c->graphs_on || c->error != cudaSuccess) return 0;
    g4c_graph *g = NULL;
    for (int i = 0; i < c->n_graphs; i++)
        if (c->graphs[i].owner == owner && c->graphs[i].key == key) g = &c->graphs[i];
    if (!g) {
        if (c->n_graphs == G4C_MAX_GRAPHS) { /* all taken: the least recently run one makes room */
            g = &c->graphs[0];
            for (int i = 1; i < c->n_graphs; i++)
                if (c->graphs[i].used < g->used) g = &c->graphs[i];
            if (g->exec) cudaGraphExecDestroy(g->exec);
        } else {
            g = &c->graphs[c->n_graphs++];
        }
        memset(g, 0, sizeof *g);
        g->owner = owner;
        g->key = key;
    }
    g->seen++;
    g->used = ++c->graph_clock;
    if (g->exec && g->generation == c->generation) {
        g4c_step_time *t = c->step_time && c->step_time->armed && !c->step_time->replayed ? c->step_time : NULL;
        if (t) cudaEventRecord(t->ev[1], c->stream);
        g4c_note(c, cudaGraphLaunch(g->exec, c->stream), "replaying a step");
        if (t) t->replayed = cudaEventRecord(t->ev[2], c->stream) == cudaSuccess;
        return 1;
    }
    if (g->exec) {
        cudaGraphExecDestroy(g->exec);
        g->exec = NULL;
    }
    c->in_graph_step = 1; /* ops size their work for any step of this shape */
    if (g->seen >= 2) {
        cudaError_t e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeRelaxed);
        if (e != cudaSuccess) { /* no recordings here (the emulator): run eagerly from now on */
            cudaGetLastError();
            c->graphs_on = 0;
            return 0;
        }
        c->capturing = 1;
        c->recording = g;
#ifdef G4_CUDA_TRACE
        c->trace_nk = 0;
#endif
    }
    return 0;
}

static void cu_graph_end(g4_backend *be) {
    g4c *c = g4c_of(be);
    c->in_graph_step = 0;
    if (!c->capturing) return;
    c->capturing = 0;
    g4c_graph *g = c->recording;
    c->recording = NULL;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &graph);
    if (e == cudaSuccess && c->error == cudaSuccess) e = cudaGraphInstantiate(&g->exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (e == cudaSuccess && c->error == cudaSuccess) {
        g->generation = c->generation;
        e = cudaGraphLaunch(g->exec, c->stream);
    }
    if (e != cudaSuccess || c->error != cudaSuccess) { /* the step did not run: report it, and stop recording */
        cudaGetLastError();
        g4c_note(c, e, "recording a step");
        if (g->exec) cudaGraphExecDestroy(g->exec);
        g->exec = NULL;
        c->graphs_on = 0;
    }
}

static void cu_graph_forget(g4_backend *be, const void *owner) {
    g4c *c = g4c_of(be);
    int k = 0;
    for (int i = 0; i < c->n_graphs; i++) {
        if (c->graphs[i].owner == owner) {
            if (c->graphs[i].exec) cudaGraphExecDestroy(c->graphs[i].exec);
            continue;
        }
        c->graphs[k++] = c->graphs[i];
    }
    c->n_graphs = k;
}

#ifdef G4_CUDA_TRACE
/* The last replayed recording's kernels (G4_CUDA_TRACE=1 in a -DG4_CUDA_TRACE build): the records of every
 * translation unit merged by the end of their grid waits; a kernel's span runs from the end of its wait to the end of
 * the next one's (the next kernel's wait ends when this one has finished). */
typedef void (*trace_take)(unsigned long long (*)[8], unsigned *);
void g4c_trace_take_attention(unsigned long long (*)[8], unsigned *);
void g4c_trace_take_blas(unsigned long long (*)[8], unsigned *);
void g4c_trace_take_gemv(unsigned long long (*)[8], unsigned *);
void g4c_trace_take_misc(unsigned long long (*)[8], unsigned *);
void g4c_trace_take_moe(unsigned long long (*)[8], unsigned *);
void g4c_trace_take_quant(unsigned long long (*)[8], unsigned *);
void g4c_trace_take_towers(unsigned long long (*)[8], unsigned *);
static int trace_cmp(const void *a, const void *b) {
    const unsigned long long x = ((const unsigned long long *)a)[1], y = ((const unsigned long long *)b)[1];
    return x < y ? -1 : x > y;
}
static void trace_print(g4c *c) {
    const trace_take take[] = {g4c_trace_take_attention, g4c_trace_take_blas, g4c_trace_take_gemv,
                               g4c_trace_take_misc,      g4c_trace_take_moe,  g4c_trace_take_quant,
                               g4c_trace_take_towers};
    const size_t per = (size_t)G4_TRACE_N * 8;
    unsigned long long *all = (unsigned long long *)calloc(per * 7, sizeof *all), *buf = all;
    size_t n = 0;
    for (int i = 0; i < 7; i++) {
        unsigned cnt = 0;
        take[i]((unsigned long long (*)[8])buf, &cnt);
        const size_t k = cnt < G4_TRACE_N ? cnt : G4_TRACE_N;
        memmove(all + n * 8, buf, k * 8 * sizeof *all);
        n += k, buf = all + n * 8;
    }
    qsort(all, n, 8 * sizeof *all, trace_cmp);
    const int nk = c->trace_nk;
    if ((int)n < nk || nk < 2) {
        fprintf(stderr, "trace: %zu records, %d kernels recorded\n", n, nk);
        free(all);
        return;
    }
    const unsigned long long *r = all + (n - (size_t)nk) * 8;
    fprintf(stderr, "trace: the last recording, %d kernels, %.1f us from the first wait's end to the last's\n", nk,
            (double)(r[(nk - 1) * 8 + 1] - r[1]) / 1e3);
    fprintf(stderr, "trace: i span_us wait_us marks2..7_us kernel (marks from the end of the wait)\n");
    for (int i = 0; i < nk; i++) {
        const unsigned long long *q = r + i * 8;
        const char *name = "?";
        cudaFuncGetName(&name, c->trace_k[i]);
        const double span = i + 1 < nk ? (double)(q[9] - q[1]) / 1e3 : 0.0;
        fprintf(stderr, "trace: %d %.2f %.2f", i, span, (double)(q[1] - q[0]) / 1e3);
        for (int m = 2; m < 8; m++) fprintf(stderr, " %.2f", q[m] ? (double)(q[m] - q[1]) / 1e3 : 0.0);
        fprintf(stderr, " %s\n", name);
    }
    free(all);
}
#endif

/* ---------------------------------------------------------------- backend */
static void cu_free(g4_backend *be) {
    g4c *c = g4c_of(be);
    cudaStreamSynchronize(c->stream);
#ifdef G4_CUDA_TRACE
    if (getenv("G4_CUDA_TRACE")) trace_print(c);
#endif
    if (c->step_time) {
        g4c_step_time *t = c->step_time;
        const double n = t->steps > 0 ? (double)t->steps : 1.0;
        fprintf(stderr, "cuda step time: %ld replayed steps; us a step: %.1f from the last sync to the recording "
                "(host work, input copies), %.1f in it, %.1f after it (the results' copy)\n", t->steps,
                1e3 * t->ms[0] / n, 1e3 * t->ms[1] / n, 1e3 * t->ms[2] / n);
        for (int i = 0; i < 4; i++) cudaEventDestroy(t->ev[i]);
        free(t);
    }
    if (c->profile) {
        profile_print(c);
        for (int i = 0; i < PROF_EVENTS; i++) cudaEventDestroy(c->profile->ev[i]);
        free(c->profile);
    }
    for (int i = 0; i < c->n_graphs; i++)
        if (c->graphs[i].exec) cudaGraphExecDestroy(c->graphs[i].exec);
    g4c_blas_free(c);
    g4c_buf *bufs[] = {&c->ws_x16, &c->ws_gemm, &c->ws_fold, &c->ws_attn, &c->ws_moe, &c->ws_deq, &c->ws_grp, &c->ws_map, &c->ws_pad,
                       &c->ws_tiles, &c->ws_rows};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]->p) cudaFree(bufs[i]->p);
    for (int i = 0; i < c->n_retired; i++) cudaFree(c->retired[i]);
    free(c->retired);
    for (int i = 0; i < c->n_wsets; i++) cudaFree(c->wsets[i].base); /* (weights the model did not release) */
    free(c->wsets);
    free(c->host_rows);
    if (c->counters) cudaFree(c->counters);
    if (c->staging) cudaFreeHost(c->staging);
    if (c->fork_ok) cudaStreamDestroy(c->side), cudaEventDestroy(c->ev_fork), cudaEventDestroy(c->ev_join);
    cudaStreamDestroy(c->stream);
    free(c);
    free(be);
}

static int cu_memory(g4_backend *be, size_t *free_bytes, size_t *total_bytes) {
    (void)be;
    if (cudaMemGetInfo(free_bytes, total_bytes) == cudaSuccess) return 0;
    cudaGetLastError();
    return -1;
}

/* The op table (filled in once: C++ before C++20 has no designated initializers). */
static g4_backend_ops cuda_ops;

static void init_ops(void) {
    g4_backend_ops *o = &cuda_ops;
    o->name = "cuda";
    o->host_memory = 0;
    o->free = cu_free;
    o->alloc = cu_alloc;
    o->release = cu_release;
    o->to_device = cu_to_device;
    o->rows_to_device = g4c_rows_to_device;
    o->to_host = cu_to_host;
    o->copy = cu_copy;
    o->sync = cu_sync;
    o->memory = cu_memory;
    o->check = cu_check;
    o->upload_weight = cu_upload_weight;
    o->upload_weights = cu_upload_weights;
    o->release_weight = cu_release_weight;
    o->graph_begin = cu_graph_begin;
    o->graph_end = cu_graph_end;
    o->graph_forget = cu_graph_forget;
    o->embed = g4c_embed;
    o->matmul = g4c_matmul;
    o->matmul_set = g4c_matmul_set;
    o->rmsnorm = g4c_rmsnorm;
    o->post_norm_add = g4c_post_norm_add;
    o->rope_table = g4c_rope_table;
    o->rope = g4c_rope;
    o->head_norm_rope = g4c_head_norm_rope;
    o->gelu_mul = g4c_gelu_mul;
    o->add = g4c_add;
    o->scale = g4c_scale;
    o->mul = g4c_mul;
    o->add_scale = g4c_add_scale;
    o->softcap = g4c_softcap;
    o->get_rows = g4c_get_rows;
    o->transpose = g4c_transpose;
    o->argmax = g4c_argmax;
    o->top_k = g4c_top_k;
    o->masked_logits = g4c_masked_logits;
    o->kv_store = g4c_kv_store;
    o->attn_prep = g4c_attn_prep;
    o->attention = g4c_attention;
    o->moe = g4c_moe;
    o->attention_dense = g4c_attention_dense;
    o->clamp = g4c_clamp;
    o->shift_scale_cols = g4c_shift_scale_cols;
    o->gather_sum = g4c_gather_sum;
    o->sigmoid_mul = g4c_sigmoid_mul;
    o->layernorm = g4c_layernorm;
    o->im2col = g4c_im2col;
    o->conv1d_causal_dw = g4c_conv1d_causal_dw;
    o->local_attention = g4c_local_attention;
}

static int env_is(const char *name, const char *value) {
    const char *v = getenv(name);
    return v && !strcmp(v, value);
}

extern "C" int g4_cuda_available(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n > 0;
}

extern "C" g4_backend *g4_backend_cuda_new(int bf16_act, g4_error *err) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= 0) {
        cudaGetLastError();
        g4_fail(err, "device 'cuda': no CUDA GPU is available (%s)",
                e != cudaSuccess ? cudaGetErrorString(e) : "no devices");
        return NULL;
    }
    g4_backend *be = (g4_backend *)calloc(1, sizeof *be);
    g4c *c = (g4c *)calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        g4_fail(err, "out of memory");
        return NULL;
    }
    if (!cuda_ops.name) init_ops();
    be->ops = &cuda_ops;
    be->impl = c;
    cudaSetDevice(0);
    cudaGetDeviceProperties(&c->prop, 0);
    c->n_sm = c->prop.multiProcessorCount > 0 ? c->prop.multiProcessorCount : 1;
#ifndef G4_CUDA_EMU
    if (c->prop.major != 9) {
        g4_fail(err, "device 'cuda': %s has compute capability %d.%d; this build's kernels are for 9.0 (Hopper)",
                c->prop.name, c->prop.major, c->prop.minor);
        free(c);
        free(be);
        return NULL;
    }
#endif
    c->pdl = !env_is("G4_CUDA_PDL", "0");
    c->graphs_on = !env_is("G4_CUDA_GRAPHS", "0");
    c->gemm_split = !bf16_act && !env_is("G4_CUDA_GEMM", "bf16");
    c->float_act = getenv("G4_NO_INT8_ACT") != NULL;
    const char *ft = getenv("G4_CUDA_FOLD_TOKENS");
    c->fold_tokens = ft ? atoi(ft) : 2048;
    c->qgemm_split = c->gemm_split && (c->float_act || env_is("G4_CUDA_QGEMM", "precise"));
    const char *gs = getenv("G4_CUDA_GEMV_SMEM_KB");
    /* 96 KB: a token's whole input row in one tile up to 24576 floats (31B's down product, 21504, included; H200,
     * decode ms against 40 KB: 31B bf16 17.47 -> 16.39, E2B Q4_K 4.71 -> 4.43, E2B bf16 2.19 -> 2.15, 12B bf16 6.97 ->
     * 6.88, the others within 1%) */
    c->gemv_smem = (size_t)(gs && atoi(gs) >= 8 && atoi(gs) <= 96 ? atoi(gs) : 96) * 1024;
    c->moe_fork = !env_is("G4_CUDA_MOE_FORK", "0");
    const char *mt = getenv("G4_CUDA_MOE_TC");
    c->moe_tc_tokens = mt ? atoi(mt) : 192;
    c->att_early = !env_is("G4_CUDA_ATT_EARLY", "0");
    c->att_tc = !env_is("G4_CUDA_ATT_TC", "0");
    c->gemv_balance = !env_is("G4_CUDA_GEMV_BALANCE", "0");
    const char *gt = getenv("G4_CUDA_GEMV_TC");
    c->gemv_tc_min = gt ? atoi(gt) : 3;
    const char *gm = getenv("G4_CUDA_GEMV_MMQ");
    c->gemv_mmq_min = gm ? atoi(gm) : 5;
    const char *md = getenv("G4_CUDA_MMQ_DENSE");
    c->mmq_dense_max = md ? atoi(md) : 24;
    const char *ak = getenv("G4_CUDA_ATT_MIN_KEYS");
    c->att_min_keys = ak && atoi(ak) >= 1 && atoi(ak) <= 512 ? atoi(ak) : 8;
    const char *gc = getenv("G4_CUDA_GEMV_CAP");
    c->gemv_cap = gc && *gc >= '1' && *gc <= '8' && !gc[1] ? *gc - '0' : 4;
    const char *gl = getenv("G4_CUDA_GEMV_LANES");
    c->gemv_lanes = gl && (atoi(gl) == 16 || atoi(gl) == 32) ? atoi(gl) : 8;
    const char *ga = getenv("G4_CUDA_GEMV_LANE_ACC");
    c->gemv_lane_acc = ga && atoi(ga) >= 1 && atoi(ga) <= 64 ? atoi(ga) : 0;
    const char *gb = getenv("G4_CUDA_GEMV_BLOCKS");
    c->gemv_blocks_per_sm = gb && *gb >= '1' && *gb <= '8' && !gb[1] ? *gb - '0' : 0; /* 0: by weight type */
    if (env_is("G4_CUDA_PROFILE", "1") && (c->profile = (g4c_profile *)calloc(1, sizeof *c->profile))) {
        c->graphs_on = 0;
        c->pdl = 0; /* (with programmatic launch a kernel's events also cover the tail of the one before: H200, an E2B
                     * prefill's epilogue after cuBLAS showed 240 us in this table, 18.7 us under ncu) */
        for (int i = 0; i < PROF_EVENTS; i++) cudaEventCreate(&c->profile->ev[i]);
    }
    if (env_is("G4_CUDA_STEP_TIME", "1") && (c->step_time = (g4c_step_time *)calloc(1, sizeof *c->step_time)))
        for (int i = 0; i < 4; i++) cudaEventCreate(&c->step_time->ev[i]);
    if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaMalloc((void **)&c->counters, N_COUNTERS * sizeof(int))) != cudaSuccess ||
        (e = cudaMemsetAsync(c->counters, 0, N_COUNTERS * sizeof(int), c->stream)) != cudaSuccess) {
        g4_fail(err, "device 'cuda': cannot start: %s", cudaGetErrorString(e));
        if (c->counters) cudaFree(c->counters);
        free(c);
        free(be);
        return NULL;
    }
    c->n_counters = N_COUNTERS;
    c->fork_ok = cudaStreamCreateWithFlags(&c->side, cudaStreamNonBlocking) == cudaSuccess;
    if (c->fork_ok && (cudaEventCreateWithFlags(&c->ev_fork, cudaEventDisableTiming) != cudaSuccess ||
                       cudaEventCreateWithFlags(&c->ev_join, cudaEventDisableTiming) != cudaSuccess)) {
        cudaStreamDestroy(c->side); /* (no side branch: the MoE block's dense MLP runs before its experts) */
        c->fork_ok = 0;
    }
    cudaGetLastError();
    if (cudaMallocHost((void **)&c->staging, STAGING_BYTES) == cudaSuccess)
        c->staging_cap = STAGING_BYTES;
    else
        c->staging = NULL, cudaGetLastError();
    g4c_attention_init(c);
    g4c_moe_init(c);
    g4c_gemv_init(c);
    g4c_towers_init(c);
    if (c->error != cudaSuccess) {
        g4_fail(err, "device 'cuda': cannot start: %s", c->error_what);
        cu_free(be);
        return NULL;
    }
    if (g4c_blas_init(c, err)) {
        cu_free(be);
        return NULL;
    }
    cudaStreamSynchronize(c->stream);
    return be;
}
