/* The mixture-of-experts block on the GPU (src/backend/backend.h: moe; docs/gemma4-text.md 3.7): routing,
 * grouping and the experts' products without a host round trip, reading only the chosen experts' weights.
 *
 * 1. route: per token, the router's logits from the normalized residual, softmax, top-k (ties to the lower
 *    expert id), weights renormalized and scaled per expert;
 * 2. group: the (token, k) pairs sorted by expert, the list of active experts with their pairs' range;
 * 3. gate_up: a block per (active expert, 8 rows): a warp per intermediate row reads that expert's gate row and
 *    up row once for up to 8 of its pairs at a time and writes gelu(gate) * up;
 * 4. down: likewise per output row, times the pair's routing weight;
 * 5. combine: per token, the sum of its k pairs' rows (in k order).
 * Grids are sized by the most experts a step can touch (min(E, n * top_k)); blocks of experts beyond the
 * active count return at once, so the launch does not depend on the routing. */
#include "backend/cuda/cuda_common.cuh"

#define MOE_NT 8

typedef struct moe_ws {
    int32_t *ids;     /* [n*TK] expert of each pair */
    float *w;         /* [n*TK] routing weight of each pair */
    int32_t *n_active;
    int32_t *act_e, *act_off, *act_cnt; /* [E] */
    int32_t *pairs;   /* [n*TK] pair ids (t*TK + k) grouped by expert, experts ascending */
    float *act;       /* [n*TK, Im] */
    float *dn;        /* [n*TK, H] */
} moe_ws;

typedef struct moe_args {
    const float *residual, *x2;
    float *out;
    int n, H, E, TK, Im;
    float eps;
    const unsigned char *router, *gate_up, *down;
    size_t router_row, gu_row, dn_row; /* bytes of a row */
    int router_dt, expert_dt;
    const float *router_scale, *per_expert_scale;
    moe_ws ws;
} moe_args;

static __device__ float dot_row(int dt, const unsigned char *row, const float *x, int in) {
    /* a warp: lanes over 8-element chunks; x in shared or global memory */
    const int lane = threadIdx.x & 31;
    float s = 0.0f;
    for (int k = lane * 8; k < in; k += 256) {
        float w[8];
        if (dt == G4_BF16)
            g4_wload<G4_BF16>::load(row, k, w);
        else if (dt == G4_F16)
            g4_wload<G4_F16>::load(row, k, w);
        else
            g4_wload<G4_F32>::load(row, k, w);
        for (int i = 0; i < 8; i++)
            if (k + i < in) s = fmaf(w[i], x[k + i], s);
    }
    return g4_warp_sum(s);
}

/* 1. one block per token */
__global__ void moe_route_kernel(moe_args a) {
    G4_DYN_SMEM(float, sm);
    float *z = sm;          /* [H] */
    float *lg = sm + a.H;   /* [E] */
    __shared__ float red[32];
    g4_grid_wait();
    const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const float *r = a.residual + (size_t)t * a.H;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < a.H; i += blockDim.x) ss += r[i] * r[i];
    const float inv = rsqrtf(g4_block_sum(ss, red) / (float)a.H + a.eps), inv_sqrt_h = 1.0f / sqrtf((float)a.H);
    for (int i = threadIdx.x; i < a.H; i += blockDim.x) z[i] = r[i] * inv * a.router_scale[i] * inv_sqrt_h;
    __syncthreads();
    for (int e = warp; e < a.E; e += warps) {
        const float v = dot_row(a.router_dt, a.router + (size_t)e * a.router_row, z, a.H);
        if (lane == 0) lg[e] = v;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float mx = -INFINITY, sum = 0.0f;
        for (int e = 0; e < a.E; e++) mx = fmaxf(mx, lg[e]);
        for (int e = 0; e < a.E; e++) {
            lg[e] = expf(lg[e] - mx);
            sum += lg[e];
        }
        for (int e = 0; e < a.E; e++) lg[e] /= sum;
        float wsum = 0.0f;
        int32_t *ids = a.ws.ids + (size_t)t * a.TK;
        float *w = a.ws.w + (size_t)t * a.TK;
        for (int k = 0; k < a.TK; k++) {
            int best = -1;
            for (int e = 0; e < a.E; e++) {
                int taken = 0;
                for (int q = 0; q < k; q++) taken |= ids[q] == e;
                if (!taken && (best < 0 || lg[e] > lg[best])) best = e;
            }
            ids[k] = best;
            w[k] = lg[best];
            wsum += lg[best];
        }
        for (int k = 0; k < a.TK; k++) w[k] = w[k] / wsum * a.per_expert_scale[ids[k]];
    }
}

/* 2. one block: thread e collects expert e's pairs in (token, k) order */
__global__ void moe_group_kernel(moe_args a) {
    G4_DYN_SMEM(int, cnt); /* [E] */
    g4_grid_wait();
    const int np = a.n * a.TK;
    for (int e = threadIdx.x; e < a.E; e += blockDim.x) {
        int c = 0;
        for (int p = 0; p < np; p++) c += a.ws.ids[p] == e;
        cnt[e] = c;
    }
    __syncthreads();
    if (threadIdx.x == 0) { /* active experts ascending, their offsets */
        int na = 0, off = 0;
        for (int e = 0; e < a.E; e++) {
            if (!cnt[e]) continue;
            a.ws.act_e[na] = e;
            a.ws.act_off[na] = off;
            a.ws.act_cnt[na] = cnt[e];
            cnt[e] = off; /* now the expert's first slot */
            off += a.ws.act_cnt[na];
            na++;
        }
        *a.ws.n_active = na;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < a.E; e += blockDim.x) {
        int slot = cnt[e];
        for (int p = 0; p < np; p++)
            if (a.ws.ids[p] == e) a.ws.pairs[slot++] = p;
    }
}

/* 3. gate/up of an active expert: block (row group, active slot); a warp per intermediate row c */
template <int DT> __global__ __launch_bounds__(256) void moe_gate_up_kernel(moe_args a) {
    g4_grid_wait();
    const int slot = blockIdx.y;
    if (slot >= *a.ws.n_active) return;
    const int lane = threadIdx.x & 31, c = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (c >= a.Im) return;
    const int e = a.ws.act_e[slot], off = a.ws.act_off[slot], cnt = a.ws.act_cnt[slot];
    const unsigned char *base = a.gate_up + (size_t)e * 2 * a.Im * a.gu_row;
    const unsigned char *gr = base + (size_t)c * a.gu_row, *ur = base + (size_t)(a.Im + c) * a.gu_row;
    for (int p0 = 0; p0 < cnt; p0 += MOE_NT) {
        const int np = cnt - p0 < MOE_NT ? cnt - p0 : MOE_NT;
        const float *x[MOE_NT];
        for (int j = 0; j < MOE_NT; j++) {
            const int pr = a.ws.pairs[off + p0 + (j < np ? j : 0)];
            x[j] = a.x2 + (size_t)(pr / a.TK) * a.H;
        }
        float g[MOE_NT], u[MOE_NT];
        for (int j = 0; j < MOE_NT; j++) g[j] = u[j] = 0.0f;
        for (int k = lane * 8; k < a.H; k += 256) {
            float wg[8], wu[8];
            g4_wload<DT>::load(gr, k, wg);
            g4_wload<DT>::load(ur, k, wu);
#pragma unroll
            for (int j = 0; j < MOE_NT; j++) {
                if (j >= np) break;
                for (int i = 0; i < 8; i++) {
                    const float xv = k + i < a.H ? x[j][k + i] : 0.0f;
                    g[j] = fmaf(wg[i], xv, g[j]);
                    u[j] = fmaf(wu[i], xv, u[j]);
                }
            }
        }
#pragma unroll
        for (int j = 0; j < MOE_NT; j++) {
            g[j] = g4_warp_sum(g[j]);
            u[j] = g4_warp_sum(u[j]);
        }
        if (lane < np) {
            float gv = 0.0f, uv = 0.0f;
#pragma unroll
            for (int j = 0; j < MOE_NT; j++)
                if (j == lane) gv = g[j], uv = u[j];
            const int pr = a.ws.pairs[off + p0 + lane];
            a.ws.act[(size_t)pr * a.Im + c] = g4_gelu_tanh(gv) * uv;
        }
    }
}

/* 4. down of an active expert: a warp per output row i, times the routing weight */
template <int DT> __global__ __launch_bounds__(256) void moe_down_kernel(moe_args a) {
    g4_grid_wait();
    const int slot = blockIdx.y;
    if (slot >= *a.ws.n_active) return;
    const int lane = threadIdx.x & 31, i = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (i >= a.H) return;
    const int e = a.ws.act_e[slot], off = a.ws.act_off[slot], cnt = a.ws.act_cnt[slot];
    const unsigned char *row = a.down + ((size_t)e * a.H + i) * a.dn_row;
    for (int p0 = 0; p0 < cnt; p0 += MOE_NT) {
        const int np = cnt - p0 < MOE_NT ? cnt - p0 : MOE_NT;
        const float *x[MOE_NT];
        for (int j = 0; j < MOE_NT; j++) x[j] = a.ws.act + (size_t)a.ws.pairs[off + p0 + (j < np ? j : 0)] * a.Im;
        float d[MOE_NT];
        for (int j = 0; j < MOE_NT; j++) d[j] = 0.0f;
        for (int k = lane * 8; k < a.Im; k += 256) {
            float w[8];
            g4_wload<DT>::load(row, k, w);
#pragma unroll
            for (int j = 0; j < MOE_NT; j++) {
                if (j >= np) break;
                for (int q = 0; q < 8; q++) d[j] = fmaf(w[q], k + q < a.Im ? x[j][k + q] : 0.0f, d[j]);
            }
        }
#pragma unroll
        for (int j = 0; j < MOE_NT; j++) d[j] = g4_warp_sum(d[j]);
        if (lane < np) {
            float dv = 0.0f;
#pragma unroll
            for (int j = 0; j < MOE_NT; j++)
                if (j == lane) dv = d[j];
            const int pr = a.ws.pairs[off + p0 + lane];
            a.ws.dn[(size_t)pr * a.H + i] = a.ws.w[pr] * dv;
        }
    }
}

/* 5. out[t] = sum over k of the pair rows */
__global__ void moe_combine_kernel(moe_args a) {
    g4_grid_wait();
    const int t = blockIdx.x;
    for (int i = threadIdx.x; i < a.H; i += blockDim.x) {
        float s = 0.0f;
        for (int k = 0; k < a.TK; k++) s += a.ws.dn[((size_t)t * a.TK + k) * a.H + i];
        a.out[(size_t)t * a.H + i] = s;
    }
}

void g4c_moe(g4_backend *be, const g4_moe_args *m) {
    g4c *c = g4c_of(be);
    const int n = m->n, E = m->n_experts, TK = m->top_k, H = m->hidden, Im = m->expert_dim;
    if (n <= 0) return;
    if (TK <= 0 || TK > E) {
        g4c_note(c, cudaErrorInvalidValue, "moe: top_k must be in 1..n_experts");
        return;
    }
    moe_args a;
    memset(&a, 0, sizeof a);
    a.residual = m->residual;
    a.x2 = m->x2;
    a.out = m->out;
    a.n = n, a.H = H, a.E = E, a.TK = TK, a.Im = Im;
    a.eps = m->eps;
    a.router = (const unsigned char *)m->router_proj->data;
    a.gate_up = (const unsigned char *)m->gate_up->data;
    a.down = (const unsigned char *)m->down->data;
    a.router_row = g4c_row_bytes(m->router_proj->dtype, H);
    a.gu_row = g4c_row_bytes(m->gate_up->dtype, H);
    a.dn_row = g4c_row_bytes(m->down->dtype, Im);
    a.router_dt = (int)m->router_proj->dtype;
    a.expert_dt = (int)m->gate_up->dtype;
    a.router_scale = m->router_scale;
    a.per_expert_scale = m->per_expert_scale;
    const size_t np = (size_t)n * TK;
    const size_t ints = np * 2 + 1 + 3 * (size_t)E, need = ((ints + 3) & ~(size_t)3) * 4 + np * 4 + np * ((size_t)Im + H) * 4;
    unsigned char *ws = (unsigned char *)g4c_ws(c, &c->ws_moe, need);
    if (!ws) return;
    int32_t *iw = (int32_t *)ws;
    a.ws.ids = iw;
    a.ws.pairs = iw + np;
    a.ws.n_active = iw + 2 * np;
    a.ws.act_e = a.ws.n_active + 1;
    a.ws.act_off = a.ws.act_e + E;
    a.ws.act_cnt = a.ws.act_off + E;
    float *fw = (float *)(ws + ((ints + 3) & ~(size_t)3) * 4);
    a.ws.w = fw;
    a.ws.act = fw + np;
    a.ws.dn = a.ws.act + np * Im;

    const size_t route_smem = ((size_t)H + E) * sizeof(float);
    g4c_smem_limit(moe_route_kernel, route_smem);
    g4c_launch(c, moe_route_kernel, dim3((unsigned)n), dim3(256), route_smem, a);
    g4c_launch(c, moe_group_kernel, dim3(1), dim3(256), (size_t)E * sizeof(int), a);
    const unsigned max_active = (unsigned)(np < (size_t)E ? np : (size_t)E);
    const dim3 gu_grid((unsigned)((Im + 7) / 8), max_active), dn_grid((unsigned)((H + 7) / 8), max_active);
    switch (m->gate_up->dtype) {
    case G4_BF16: g4c_launch(c, moe_gate_up_kernel<G4_BF16>, gu_grid, dim3(256), 0, a); break;
    case G4_F16: g4c_launch(c, moe_gate_up_kernel<G4_F16>, gu_grid, dim3(256), 0, a); break;
    default: g4c_launch(c, moe_gate_up_kernel<G4_F32>, gu_grid, dim3(256), 0, a); break;
    }
    switch (m->down->dtype) {
    case G4_BF16: g4c_launch(c, moe_down_kernel<G4_BF16>, dn_grid, dim3(256), 0, a); break;
    case G4_F16: g4c_launch(c, moe_down_kernel<G4_F16>, dn_grid, dim3(256), 0, a); break;
    default: g4c_launch(c, moe_down_kernel<G4_F32>, dn_grid, dim3(256), 0, a); break;
    }
    g4c_launch(c, moe_combine_kernel, dim3((unsigned)n), dim3(256), 0, a);
}
