/* The CPU ops the audio tower adds to the op table (src/backend/backend.h, "ops of the towers"):
 * sigmoid_mul, layernorm, im2col, causal depthwise conv1d, and the audio conformer's local
 * attention with relative position bias and logit cap (docs/gemma4-towers.md §3.3). clamp,
 * which the audio tower uses too (clipped linears, ReLU), is in dense.c. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"

static g4_cpu *cpu_of(g4_backend *be) { return be->impl; }

typedef struct {
    const float *a, *b;
    float *y;
} sigmoid_job;

static void sigmoid_range(void *ctx, int64_t i0, int64_t i1, int thread) {
    sigmoid_job *j = ctx;
    for (int64_t i = i0; i < i1; i++) j->y[i] = j->a[i] / (1.0f + expf(-j->b[i]));
}

void g4_cpu_sigmoid_mul(g4_backend *be, const float *a, const float *b, size_t n, float *y) {
    sigmoid_job j = {a, b, y};
    g4_pool_for(cpu_of(be)->pool, (int64_t)n, 8192, sigmoid_range, &j);
}

typedef struct {
    const float *x, *w, *b;
    float *y;
    int dim;
    float eps;
} ln_job;

static void ln_rows(void *ctx, int64_t r0, int64_t r1, int thread) {
    ln_job *j = ctx;
    const int D = j->dim;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = j->x + (size_t)r * D;
        float *y = j->y + (size_t)r * D;
        /* sums in double: a float running sum over thousands of values (a 48x48x3 pixel block) loses the
         * mean's low bits, which (x - mean) then magnifies */
        double sum = 0, var = 0;
        for (int i = 0; i < D; i++) sum += x[i];
        const float mean = (float)(sum / D);
        for (int i = 0; i < D; i++) var += ((double)x[i] - mean) * ((double)x[i] - mean);
        const float inv = (float)(1.0 / sqrt(var / D + j->eps));
        for (int i = 0; i < D; i++) {
            float v = (x[i] - mean) * inv;
            if (j->w) v *= j->w[i];
            if (j->b) v += j->b[i];
            y[i] = v;
        }
    }
}

void g4_cpu_layernorm(g4_backend *be, const float *x, const float *w, const float *b, int rows, int dim, float eps,
                      float *y) {
    ln_job j = {x, w, b, y, dim, eps};
    g4_pool_for(cpu_of(be)->pool, rows, 1 + 4096 / (dim + 1), ln_rows, &j);
}

void g4_cpu_im2col(g4_backend *be, const float *x, int h, int w, int c, int kh, int kw, int stride, int pad, int row0,
                   int nrows, float *out) {
    const int ow = (w + 2 * pad - kw) / stride + 1, cols = c * kh * kw;
    for (int oy = row0; oy < row0 + nrows; oy++)
        for (int ox = 0; ox < ow; ox++) {
            float *o = out + ((size_t)(oy - row0) * ow + ox) * cols;
            for (int i = 0; i < kh; i++) {
                int iy = oy * stride - pad + i;
                for (int jx = 0; jx < kw; jx++) {
                    int ix = ox * stride - pad + jx;
                    const int inside = iy >= 0 && iy < h && ix >= 0 && ix < w;
                    const float *src = x + ((size_t)iy * w + ix) * c;
                    for (int ch = 0; ch < c; ch++) o[(ch * kh + i) * kw + jx] = inside ? src[ch] : 0.0f;
                }
            }
        }
}

void g4_cpu_conv1d_causal_dw(g4_backend *be, const float *x, const float *w, int n, int c, int k, float *y) {
    for (int t = 0; t < n; t++) {
        float *yt = y + (size_t)t * c;
        memset(yt, 0, (size_t)c * sizeof *yt);
        for (int j = 0; j < k; j++) {
            int s = t - k + 1 + j;
            if (s < 0) continue;
            const float *xs = x + (size_t)s * c;
            for (int ch = 0; ch < c; ch++) yt[ch] += w[(size_t)ch * k + j] * xs[ch];
        }
    }
}

typedef struct {
    g4_cpu *cpu;
    const g4_local_attention_args *a;
} local_attn_job;

static void local_attn_items(void *ctx, int64_t b, int64_t e, int thread) {
    local_attn_job *j = ctx;
    const g4_local_attention_args *a = j->a;
    const g4_cpu_kernels *k = g4_cpu_kernels_get();
    const int D = a->head_dim, W = a->window;
    const size_t row = (size_t)a->heads * D;
    float *qs = g4_cpu_scratch_get(j->cpu, thread, (size_t)D + (size_t)W);
    if (!qs) return;
    float *sc = qs + D;
    for (int64_t it = b; it < e; it++) {
        const int t = (int)(it / a->heads), h = (int)(it % a->heads);
        const float *q = a->q + (size_t)t * row + (size_t)h * D;
        for (int i = 0; i < D; i++) qs[i] = a->q_dim_scale ? q[i] * a->q_scale * a->q_dim_scale[i] : q[i] * a->q_scale;
        const int nk = t + 1 < W ? t + 1 : W;
        float mx = -FLT_MAX;
        for (int d = 0; d < nk; d++) {
            const float *ks = a->k + (size_t)(t - d) * row + (size_t)h * D;
            const float *rd = a->rel + (size_t)d * row + (size_t)h * D;
            float s = k->dot_f32(qs, ks, (size_t)D) * a->k_scale + k->dot_f32(qs, rd, (size_t)D);
            s = a->logit_cap * tanhf(s / a->logit_cap);
            sc[d] = s;
            if (s > mx) mx = s;
        }
        float sum = 0;
        for (int d = 0; d < nk; d++) {
            sc[d] = expf(sc[d] - mx);
            sum += sc[d];
        }
        float *o = a->out + (size_t)t * row + (size_t)h * D;
        memset(o, 0, (size_t)D * sizeof *o);
        for (int d = 0; d < nk; d++) k->axpy(o, a->v + (size_t)(t - d) * row + (size_t)h * D, sc[d] / sum, (size_t)D);
    }
}

void g4_cpu_local_attention(g4_backend *be, const g4_local_attention_args *a) {
    local_attn_job j = {cpu_of(be), a};
    g4_pool_for(cpu_of(be)->pool, (int64_t)a->n * a->heads, 8, local_attn_items, &j);
}
