/* The token sampler (see sampler.h for the order of operations and its sources).
 *
 * How a row is processed without copying or sorting the vocabulary:
 *
 * - The "modified" ids of a step are the union of the biased ids, the suppressed ids and, when
 *   a penalty is on, the distinct ids in the history window. Their adjusted logits are
 *   computed first (mods_build); everything else keeps its raw logit.
 * - Greedy and top-k: one pass over the raw logits keeps every unmodified id whose value is >=
 *   the k-th largest unmodified value (select_top: a candidate buffer behind a rising
 *   threshold, compacted with quickselect; the modified ids are skipped when admitted). An
 *   unmodified id of the true top-k has fewer than k unmodified ids above it, so it is in that
 *   set; the modified ids are added with their adjusted values and the exact top-k (ties at
 *   the k-th value kept) is cut from the small candidate set.
 * - Without top-k the row is copied once (with the modified values patched in). Top-p then
 *   needs the softmax mass of the whole row (one vectorized exp pass), gathers the tokens above
 *   a falling probability threshold until their mass reaches top_p, and sorts only the part of
 *   that set whose histogram bucket can hold the nucleus boundary. Min-p alone keeps only
 *   tokens near the maximum (p / p_max = exp((l - l_max) / T) >= min_p), found with a raw
 *   threshold, so it needs no exp over the row.
 */
#include "engine/sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define G4_SAMPLER_HAVE_AVX2 1
#endif

/* Largest history window we accept (it is a ring buffer of ids). */
#define G4_SAMPLER_MAX_LAST_N (1 << 26)
/* Below this temperature the scaled logits would overflow: treated as greedy (vLLM does the same). */
#define G4_SAMPLER_MIN_TEMPERATURE 1e-5f
/* Top-p histogram: buckets of 1/16 nat below the maximum; the last one collects the tail. */
#define G4_TOPP_BUCKETS 1024
#define G4_TOPP_BUCKETS_PER_NAT 16.0f
#define G4_TOPP_SORT_DIRECT 256

typedef struct g4_cand {
    float v;  /* adjusted logit */
    float e;  /* exp((v - max) / T) once computed */
    int32_t id;
} g4_cand;

struct g4_sampler {
    g4_sampler_params p;
    int V;
    int32_t *bias_ids; /* owned copies of the caller's arrays */
    float *bias_values;
    int32_t *suppress_ids;

    /* Bias and suppression merged per id: mod slots [0, n_static). */
    int n_static;
    int32_t *static_ids;
    float *static_bias;
    unsigned char *static_suppressed;

    /* History (only when a penalty is on). */
    int penalties_on;
    int32_t *count;    /* [V] occurrences inside the window */
    int32_t *seen;     /* distinct ids with count > 0 */
    int32_t *seen_pos; /* [V] index in seen */
    int n_seen;
    int32_t *ring; /* the last ring_cap accepted ids: the window (penalty_last_n > 0) and what a rewind
                      takes back (G4_SAMPLER_REWIND_MAX more) */
    int ring_cap;
    uint64_t n_accepted;
    uint64_t n_accepted_max; /* the most n_accepted has been since the last reset (bounds a rewind) */
    /* Prompt ids only the repetition penalty sees (g4_sampler_accept_prompt): outside the window and the counts. */
    unsigned char *in_prompt; /* [V] */
    int32_t *prompt_ids;      /* the distinct ones */
    int n_prompt;

    /* The modified ids of the current step and their adjusted values. */
    int32_t *slot; /* [V] index into mod_* or -1; static slots stay set */
    int32_t *mod_ids;
    float *mod_values;
    int n_mod;
    int mod_cap;

    /* Scratch. */
    float *work;      /* [V] adjusted row (paths without top-k) */
    float *expv;      /* [V] exp((work - max) / T) */
    double *prefix;   /* [V / G4_SUM_BLOCK + 2] block prefix sums of expv */
    float *fscratch;  /* [V] quickselect copies */
    g4_cand *cand;    /* [V] */
    double bucket_mass[G4_TOPP_BUCKETS];

    uint64_t rng[4];
};

/* ------------------------------------------------------------------ random numbers */

static uint64_t splitmix64_next(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* xoshiro256** (Blackman & Vigna). */
static uint64_t rng_next(uint64_t st[4]) {
    const uint64_t result = rotl64(st[1] * 5, 7) * 9;
    const uint64_t t = st[1] << 17;
    st[2] ^= st[0];
    st[3] ^= st[1];
    st[1] ^= st[2];
    st[0] ^= st[3];
    st[2] ^= t;
    st[3] = rotl64(st[3], 45);
    return result;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t st[4]) { return (double)(rng_next(st) >> 11) * 0x1.0p-53; }

void g4_sampler_seed(g4_sampler *s, uint64_t seed) {
    if (!s) return;
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64_next(&x);
}

/* ------------------------------------------------------------------ exp
 * exp(t) for t <= 0 with ~2.4e-7 relative error: t = n*ln2 + r, |r| <= ln2/2, a degree-6
 * Taylor polynomial for e^r, 2^n from the exponent bits. t < -87 (and -inf, NaN) gives
 * exactly 0. Every variant performs the same float operations in the same order, so results
 * are bit-identical across SSE2, AVX2 and plain C (the build uses -std=c11: no FMA
 * contraction).
 *
 * The rows are summed in the same pass, in double, with a fixed order that every variant
 * reproduces: lane j (0..15) accumulates e[i] for i = j (mod 16) in index order, and a sum
 * adds the lanes pairwise (comb16). prefix[b] (optional) is that sum over the first b blocks
 * of G4_SUM_BLOCK elements, prefix[number of blocks] the total. */

#define G4_EXP_LO (-87.0f)
#define G4_EXP_LOG2E 1.44269504088896341f
#define G4_EXP_LN2_HI 0.693359375f
#define G4_EXP_LN2_LO (-2.12194440e-4f)
#define G4_SUM_BLOCK 256

static inline float exp_nonpos(float t) {
    if (!(t >= G4_EXP_LO)) return 0.0f;
    int32_t n = (int32_t)(t * G4_EXP_LOG2E - 0.5f); /* truncation: ceil(y - 0.5) for y <= 0 */
    float fn = (float)n;
    float r = t - fn * G4_EXP_LN2_HI;
    r = r - fn * G4_EXP_LN2_LO;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t bits = (n + 127) * (1 << 23);
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

static inline float exp_scaled(float v, float m, float inv_t) { return exp_nonpos((v - m) * inv_t); }

static inline double comb16(const double a[16]) {
    return (((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))) +
           (((a[8] + a[9]) + (a[10] + a[11])) + ((a[12] + a[13]) + (a[14] + a[15])));
}

static double exp_sum_c(const float *v, float *out, int n, float m, float inv_t, double *prefix) {
    double acc[16] = {0};
    if (prefix) prefix[0] = 0.0;
    for (int i = 0; i < n; i++) {
        float e = exp_scaled(v[i], m, inv_t);
        out[i] = e;
        acc[i & 15] += (double)e;
        if (prefix && ((i + 1) % G4_SUM_BLOCK == 0 || i + 1 == n))
            prefix[(i + G4_SUM_BLOCK) / G4_SUM_BLOCK] = comb16(acc);
    }
    return comb16(acc);
}

#if defined(__SSE2__)
static inline __m128 exp_nonpos_sse2(__m128 t) {
    const __m128 lo = _mm_set1_ps(G4_EXP_LO);
    __m128 ok = _mm_cmpge_ps(t, lo);
    __m128 x = _mm_max_ps(t, lo);
    __m128i n = _mm_cvttps_epi32(_mm_sub_ps(_mm_mul_ps(x, _mm_set1_ps(G4_EXP_LOG2E)), _mm_set1_ps(0.5f)));
    __m128 fn = _mm_cvtepi32_ps(n);
    __m128 r = _mm_sub_ps(x, _mm_mul_ps(fn, _mm_set1_ps(G4_EXP_LN2_HI)));
    r = _mm_sub_ps(r, _mm_mul_ps(fn, _mm_set1_ps(G4_EXP_LN2_LO)));
    __m128 p = _mm_set1_ps(1.0f / 720.0f);
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.0f / 120.0f));
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.0f / 24.0f));
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.0f / 6.0f));
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(0.5f));
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.0f));
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.0f));
    __m128 scale = _mm_castsi128_ps(_mm_slli_epi32(_mm_add_epi32(n, _mm_set1_epi32(127)), 23));
    return _mm_and_ps(_mm_mul_ps(p, scale), ok);
}

static double exp_sum_sse2(const float *v, float *out, int n, float m, float inv_t, double *prefix) {
    const __m128 vm = _mm_set1_ps(m), vi = _mm_set1_ps(inv_t);
    __m128d a[8];
    for (int k = 0; k < 8; k++) a[k] = _mm_setzero_pd();
    double acc[16];
    if (prefix) prefix[0] = 0.0;
    int i = 0;
    while (i < n) {
        int end = i + G4_SUM_BLOCK <= n ? i + G4_SUM_BLOCK : n;
        int vend = i + ((end - i) & ~15);
        for (; i < vend; i += 16) {
            for (int q = 0; q < 4; q++) {
                __m128 e = exp_nonpos_sse2(_mm_mul_ps(_mm_sub_ps(_mm_loadu_ps(v + i + 4 * q), vm), vi));
                _mm_storeu_ps(out + i + 4 * q, e);
                a[2 * q] = _mm_add_pd(a[2 * q], _mm_cvtps_pd(e));
                a[2 * q + 1] = _mm_add_pd(a[2 * q + 1], _mm_cvtps_pd(_mm_movehl_ps(e, e)));
            }
        }
        if (i < end || prefix) {
            for (int k = 0; k < 8; k++) _mm_storeu_pd(acc + 2 * k, a[k]);
            for (; i < end; i++) { /* only at the very end of the row */
                float e = exp_scaled(v[i], m, inv_t);
                out[i] = e;
                acc[i & 15] += (double)e;
            }
            for (int k = 0; k < 8; k++) a[k] = _mm_loadu_pd(acc + 2 * k);
            if (prefix) prefix[(end + G4_SUM_BLOCK - 1) / G4_SUM_BLOCK] = comb16(acc);
        }
    }
    for (int k = 0; k < 8; k++) _mm_storeu_pd(acc + 2 * k, a[k]);
    return comb16(acc);
}
#endif

#if defined(G4_SAMPLER_HAVE_AVX2)
__attribute__((target("avx2"))) static inline __m256 exp_nonpos_avx2(__m256 t) {
    const __m256 lo = _mm256_set1_ps(G4_EXP_LO);
    __m256 ok = _mm256_cmp_ps(t, lo, _CMP_GE_OQ);
    __m256 x = _mm256_max_ps(t, lo);
    __m256i k = _mm256_cvttps_epi32(
        _mm256_sub_ps(_mm256_mul_ps(x, _mm256_set1_ps(G4_EXP_LOG2E)), _mm256_set1_ps(0.5f)));
    __m256 fn = _mm256_cvtepi32_ps(k);
    __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(fn, _mm256_set1_ps(G4_EXP_LN2_HI)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(fn, _mm256_set1_ps(G4_EXP_LN2_LO)));
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(0.5f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f));
    __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23));
    return _mm256_and_ps(_mm256_mul_ps(p, scale), ok);
}

__attribute__((target("avx2"))) static double exp_sum_avx2(const float *v, float *out, int n, float m,
                                                           float inv_t, double *prefix) {
    const __m256 vm = _mm256_set1_ps(m), vi = _mm256_set1_ps(inv_t);
    __m256d a0 = _mm256_setzero_pd(), a4 = _mm256_setzero_pd(), a8 = _mm256_setzero_pd(),
            a12 = _mm256_setzero_pd();
    double acc[16];
    if (prefix) prefix[0] = 0.0;
    int i = 0;
    while (i < n) {
        int end = i + G4_SUM_BLOCK <= n ? i + G4_SUM_BLOCK : n;
        int vend = i + ((end - i) & ~15);
        for (; i < vend; i += 16) {
            __m256 e0 = exp_nonpos_avx2(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(v + i), vm), vi));
            __m256 e1 = exp_nonpos_avx2(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(v + i + 8), vm), vi));
            _mm256_storeu_ps(out + i, e0);
            _mm256_storeu_ps(out + i + 8, e1);
            a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(e0)));
            a4 = _mm256_add_pd(a4, _mm256_cvtps_pd(_mm256_extractf128_ps(e0, 1)));
            a8 = _mm256_add_pd(a8, _mm256_cvtps_pd(_mm256_castps256_ps128(e1)));
            a12 = _mm256_add_pd(a12, _mm256_cvtps_pd(_mm256_extractf128_ps(e1, 1)));
        }
        if (i < end || prefix) {
            _mm256_storeu_pd(acc, a0);
            _mm256_storeu_pd(acc + 4, a4);
            _mm256_storeu_pd(acc + 8, a8);
            _mm256_storeu_pd(acc + 12, a12);
            for (; i < end; i++) {
                float e = exp_scaled(v[i], m, inv_t);
                out[i] = e;
                acc[i & 15] += (double)e;
            }
            a0 = _mm256_loadu_pd(acc);
            a4 = _mm256_loadu_pd(acc + 4);
            a8 = _mm256_loadu_pd(acc + 8);
            a12 = _mm256_loadu_pd(acc + 12);
            if (prefix) prefix[(end + G4_SUM_BLOCK - 1) / G4_SUM_BLOCK] = comb16(acc);
        }
    }
    _mm256_storeu_pd(acc, a0);
    _mm256_storeu_pd(acc + 4, a4);
    _mm256_storeu_pd(acc + 8, a8);
    _mm256_storeu_pd(acc + 12, a12);
    return comb16(acc);
}

static int cpu_has_avx2(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx2") ? 1 : 0;
    }
    return cached;
}
#endif

/* out[i] = exp((v[i] - m) * inv_t); returns their sum (see above for the order). */
static double exp_sum_row(const float *v, float *out, int n, float m, float inv_t, double *prefix) {
#if defined(G4_SAMPLER_HAVE_AVX2)
    if (cpu_has_avx2()) return exp_sum_avx2(v, out, n, m, inv_t, prefix);
#endif
#if defined(__SSE2__)
    return exp_sum_sse2(v, out, n, m, inv_t, prefix);
#else
    return exp_sum_c(v, out, n, m, inv_t, prefix);
#endif
}

int g4_sampler_exp_row_variant(const float *v, float *out, int n, float m, float inv_t, int variant,
                               double *sum, double *prefix) {
#if defined(G4_SAMPLER_HAVE_AVX2)
    if (variant == 2 && cpu_has_avx2()) {
        *sum = exp_sum_avx2(v, out, n, m, inv_t, prefix);
        return 2;
    }
#endif
#if defined(__SSE2__)
    if (variant == 1) {
        *sum = exp_sum_sse2(v, out, n, m, inv_t, prefix);
        return 1;
    }
#endif
    *sum = exp_sum_c(v, out, n, m, inv_t, prefix);
    return 0;
}

/* dst = src with NaN replaced by -inf; returns the maximum (-inf when n == 0). */
static float copy_scrub_max(const float *src, float *dst, int n) {
    int i = 0;
    float m = -INFINITY;
#if defined(__SSE2__)
    __m128 vmax = _mm_set1_ps(-INFINITY);
    const __m128 ninf = _mm_set1_ps(-INFINITY);
    for (; i + 4 <= n; i += 4) {
        __m128 x = _mm_loadu_ps(src + i);
        __m128 ord = _mm_cmpord_ps(x, x);
        x = _mm_or_ps(_mm_and_ps(ord, x), _mm_andnot_ps(ord, ninf));
        _mm_storeu_ps(dst + i, x);
        vmax = _mm_max_ps(vmax, x);
    }
    float lanes[4];
    _mm_storeu_ps(lanes, vmax);
    for (int j = 0; j < 4; j++)
        if (lanes[j] > m) m = lanes[j];
#endif
    for (; i < n; i++) {
        float x = src[i];
        if (x != x) x = -INFINITY;
        dst[i] = x;
        if (x > m) m = x;
    }
    return m;
}

/* Maximum of a row without NaN (-inf when n == 0). */
static float row_max(const float *x, int n) {
    int i = 0;
    float m = -INFINITY;
#if defined(__SSE2__)
    __m128 vmax = _mm_set1_ps(-INFINITY);
    for (; i + 4 <= n; i += 4) vmax = _mm_max_ps(vmax, _mm_loadu_ps(x + i));
    float lanes[4];
    _mm_storeu_ps(lanes, vmax);
    for (int j = 0; j < 4; j++)
        if (lanes[j] > m) m = lanes[j];
#endif
    for (; i < n; i++)
        if (x[i] > m) m = x[i];
    return m;
}

/* ------------------------------------------------------------------ parameters */

void g4_sampler_params_default(g4_sampler_params *p) {
    if (!p) return;
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->repetition_penalty = 1.0f;
    p->presence_penalty = 0.0f;
    p->frequency_penalty = 0.0f;
    p->penalty_last_n = -1;
    p->seed = 0;
}

int g4_sampler_params_check(const g4_sampler_params *p, int vocab_size, g4_error *err) {
    if (!p) return g4_fail(err, "sampler: no parameters");
    if (!isfinite(p->temperature) || p->temperature < 0)
        return g4_fail(err, "sampler: temperature must be a finite number >= 0 (0 = greedy), got %g",
                       (double)p->temperature);
    if (p->top_k < 0) return g4_fail(err, "sampler: top_k must be >= 0 (0 = off), got %d", p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return g4_fail(err, "sampler: top_p must be in (0, 1] (1 = off), got %g", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return g4_fail(err, "sampler: min_p must be in [0, 1] (0 = off), got %g", (double)p->min_p);
    if (!isfinite(p->repetition_penalty) || !(p->repetition_penalty > 0.0f))
        return g4_fail(err, "sampler: repetition_penalty must be a finite number > 0 (1 = off), got %g",
                       (double)p->repetition_penalty);
    if (!isfinite(p->presence_penalty))
        return g4_fail(err, "sampler: presence_penalty must be finite, got %g", (double)p->presence_penalty);
    if (!isfinite(p->frequency_penalty))
        return g4_fail(err, "sampler: frequency_penalty must be finite, got %g",
                       (double)p->frequency_penalty);
    if (p->penalty_last_n < -1 || p->penalty_last_n > G4_SAMPLER_MAX_LAST_N)
        return g4_fail(err, "sampler: penalty_last_n must be -1 (all), 0 (none) or up to %d, got %d",
                       G4_SAMPLER_MAX_LAST_N, p->penalty_last_n);
    if (p->n_bias < 0 || (p->n_bias > 0 && (!p->bias_ids || !p->bias_values)))
        return g4_fail(err, "sampler: logit bias needs n_bias >= 0 ids and values");
    if (p->n_suppress < 0 || (p->n_suppress > 0 && !p->suppress_ids))
        return g4_fail(err, "sampler: suppress list needs n_suppress >= 0 ids");
    for (int i = 0; i < p->n_bias; i++) {
        float b = p->bias_values[i];
        if (b != b || b == INFINITY)
            return g4_fail(err, "sampler: logit bias for id %d must be finite or -inf, got %g",
                           (int)p->bias_ids[i], (double)b);
        if (p->bias_ids[i] < 0 || (vocab_size > 0 && p->bias_ids[i] >= vocab_size))
            return g4_fail(err, "sampler: logit bias id %d is outside the vocabulary [0, %d)",
                           (int)p->bias_ids[i], vocab_size);
    }
    for (int i = 0; i < p->n_suppress; i++)
        if (p->suppress_ids[i] < 0 || (vocab_size > 0 && p->suppress_ids[i] >= vocab_size))
            return g4_fail(err, "sampler: suppressed id %d is outside the vocabulary [0, %d)",
                           (int)p->suppress_ids[i], vocab_size);
    return 0;
}

/* ------------------------------------------------------------------ create / free */

void g4_sampler_free(g4_sampler *s) {
    if (!s) return;
    free(s->bias_ids);
    free(s->bias_values);
    free(s->suppress_ids);
    free(s->static_ids);
    free(s->static_bias);
    free(s->static_suppressed);
    free(s->count);
    free(s->seen);
    free(s->seen_pos);
    free(s->ring);
    free(s->in_prompt);
    free(s->prompt_ids);
    free(s->slot);
    free(s->mod_ids);
    free(s->mod_values);
    free(s->work);
    free(s->expv);
    free(s->prefix);
    free(s->fscratch);
    free(s->cand);
    free(s);
}

int g4_sampler_new(const g4_sampler_params *p, int vocab_size, g4_sampler **out, g4_error *err) {
    G4_ARG(out, err);
    *out = NULL;
    if (vocab_size <= 0) return g4_fail(err, "sampler: vocabulary size must be > 0, got %d", vocab_size);
    if (g4_sampler_params_check(p, vocab_size, err)) return -1;
    g4_sampler *s = calloc(1, sizeof *s);
    if (!s) return g4_fail(err, "sampler: out of memory");
    s->p = *p;
    s->V = vocab_size;
    size_t V = (size_t)vocab_size;
    int ok = 1;

    /* Own copies of the caller's arrays. */
    if (p->n_bias > 0) {
        s->bias_ids = malloc((size_t)p->n_bias * sizeof *s->bias_ids);
        s->bias_values = malloc((size_t)p->n_bias * sizeof *s->bias_values);
        ok = ok && s->bias_ids && s->bias_values;
        if (ok) {
            memcpy(s->bias_ids, p->bias_ids, (size_t)p->n_bias * sizeof *s->bias_ids);
            memcpy(s->bias_values, p->bias_values, (size_t)p->n_bias * sizeof *s->bias_values);
        }
    }
    if (p->n_suppress > 0) {
        s->suppress_ids = malloc((size_t)p->n_suppress * sizeof *s->suppress_ids);
        ok = ok && s->suppress_ids;
        if (ok) memcpy(s->suppress_ids, p->suppress_ids, (size_t)p->n_suppress * sizeof *s->suppress_ids);
    }
    s->p.bias_ids = s->bias_ids;
    s->p.bias_values = s->bias_values;
    s->p.suppress_ids = s->suppress_ids;

    s->penalties_on = p->penalty_last_n != 0 &&
                      (p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f ||
                       p->frequency_penalty != 0.0f);
    int n_static_max = p->n_bias + p->n_suppress;
    int window = s->penalties_on ? (p->penalty_last_n < 0 || p->penalty_last_n > vocab_size
                                        ? vocab_size
                                        : p->penalty_last_n)
                                 : 0;
    s->mod_cap = n_static_max + window;

    s->slot = malloc(V * sizeof *s->slot);
    s->work = malloc(V * sizeof *s->work);
    s->expv = malloc(V * sizeof *s->expv);
    s->prefix = malloc((V / G4_SUM_BLOCK + 2) * sizeof *s->prefix);
    s->fscratch = malloc(V * sizeof *s->fscratch);
    s->cand = malloc(V * sizeof *s->cand);
    ok = ok && s->slot && s->work && s->expv && s->prefix && s->fscratch && s->cand;
    if (ok && s->mod_cap > 0) {
        s->mod_ids = malloc((size_t)s->mod_cap * sizeof *s->mod_ids);
        s->mod_values = malloc((size_t)s->mod_cap * sizeof *s->mod_values);
        ok = s->mod_ids && s->mod_values;
    }
    if (ok && n_static_max > 0) {
        s->static_ids = malloc((size_t)n_static_max * sizeof *s->static_ids);
        s->static_bias = malloc((size_t)n_static_max * sizeof *s->static_bias);
        s->static_suppressed = malloc((size_t)n_static_max);
        ok = s->static_ids && s->static_bias && s->static_suppressed;
    }
    if (ok && s->penalties_on) {
        s->count = calloc(V, sizeof *s->count);
        s->seen = malloc(V * sizeof *s->seen);
        s->seen_pos = malloc(V * sizeof *s->seen_pos);
        ok = s->count && s->seen && s->seen_pos;
        if (ok) {
            s->ring_cap = (p->penalty_last_n > 0 ? p->penalty_last_n : 0) + G4_SAMPLER_REWIND_MAX;
            s->ring = malloc((size_t)s->ring_cap * sizeof *s->ring);
            ok = s->ring != NULL;
        }
    }
    if (!ok) {
        g4_sampler_free(s);
        return g4_fail(err, "sampler: out of memory (vocabulary %d)", vocab_size);
    }

    /* Merge bias and suppression per id into the static slots. */
    for (size_t i = 0; i < V; i++) s->slot[i] = -1;
    for (int i = 0; i < p->n_bias; i++) {
        int32_t id = p->bias_ids[i];
        if (s->slot[id] < 0) {
            s->slot[id] = s->n_static;
            s->static_ids[s->n_static] = id;
            s->static_bias[s->n_static] = 0.0f;
            s->static_suppressed[s->n_static] = 0;
            s->n_static++;
        }
        s->static_bias[s->slot[id]] += p->bias_values[i];
    }
    for (int i = 0; i < p->n_suppress; i++) {
        int32_t id = p->suppress_ids[i];
        if (s->slot[id] < 0) {
            s->slot[id] = s->n_static;
            s->static_ids[s->n_static] = id;
            s->static_bias[s->n_static] = 0.0f;
            s->n_static++;
        }
        s->static_suppressed[s->slot[id]] = 1;
    }
    g4_sampler_seed(s, p->seed);
    *out = s;
    return 0;
}

const g4_sampler_params *g4_sampler_get_params(const g4_sampler *s) { return &s->p; }

/* ------------------------------------------------------------------ history */

static void hist_inc(g4_sampler *s, int32_t id) {
    if (s->count[id]++ == 0) {
        s->seen_pos[id] = s->n_seen;
        s->seen[s->n_seen++] = id;
    }
}

static void hist_dec(g4_sampler *s, int32_t id) {
    if (--s->count[id] == 0) {
        int pos = s->seen_pos[id];
        int32_t last = s->seen[--s->n_seen];
        s->seen[pos] = last;
        s->seen_pos[last] = pos;
    }
}

/* Accepted id number i (0-based) sits in ring[i % ring_cap]; with a window of last_n ids, accepting number i
 * drops number i - last_n from the counts. */
static int32_t ring_at(const g4_sampler *s, uint64_t i) { return s->ring[i % (uint64_t)s->ring_cap]; }

void g4_sampler_accept(g4_sampler *s, int32_t id) {
    if (!s || !s->penalties_on || id < 0 || id >= s->V) return;
    const int last_n = s->p.penalty_last_n;
    if (last_n > 0 && s->n_accepted >= (uint64_t)last_n) hist_dec(s, ring_at(s, s->n_accepted - (uint64_t)last_n));
    s->ring[s->n_accepted % (uint64_t)s->ring_cap] = id;
    s->n_accepted++;
    if (s->n_accepted > s->n_accepted_max) s->n_accepted_max = s->n_accepted;
    hist_inc(s, id);
}

int g4_sampler_rewind(g4_sampler *s, int n) {
    if (!s || !s->penalties_on || n <= 0) return 0;
    /* ids back to number n_accepted_max - REWIND_MAX and the ones they pushed out of the window are still in the ring */
    if ((uint64_t)n > s->n_accepted || s->n_accepted - (uint64_t)n + G4_SAMPLER_REWIND_MAX < s->n_accepted_max)
        return -1;
    const int last_n = s->p.penalty_last_n;
    for (int i = 0; i < n; i++) {
        s->n_accepted--;
        hist_dec(s, ring_at(s, s->n_accepted));
        if (last_n > 0 && s->n_accepted >= (uint64_t)last_n) hist_inc(s, ring_at(s, s->n_accepted - (uint64_t)last_n));
    }
    return 0;
}

void g4_sampler_accept_many(g4_sampler *s, const int32_t *ids, int n) {
    for (int i = 0; ids && i < n; i++) g4_sampler_accept(s, ids[i]);
}

int g4_sampler_accept_prompt(g4_sampler *s, const int32_t *ids, int n) {
    if (!s || !s->penalties_on || s->p.repetition_penalty == 1.0f || !ids || n <= 0) return 0;
    if (!s->in_prompt) {
        unsigned char *mark = calloc((size_t)s->V, 1);
        int32_t *list = malloc((size_t)s->V * sizeof *list);
        if (!mark || !list) {
            free(mark), free(list);
            return -1;
        }
        s->in_prompt = mark, s->prompt_ids = list;
    }
    /* room first: a step's modified ids are the static ones, the window's and the prompt's, never more than V */
    int cap = n > s->V ? s->n_static + s->V : s->mod_cap + n;
    if (cap > s->n_static + s->V) cap = s->n_static + s->V;
    if (cap > s->mod_cap) {
        int32_t *ids2 = realloc(s->mod_ids, (size_t)cap * sizeof *ids2);
        if (!ids2) return -1;
        s->mod_ids = ids2;
        float *vals2 = realloc(s->mod_values, (size_t)cap * sizeof *vals2);
        if (!vals2) return -1;
        s->mod_values = vals2;
        s->mod_cap = cap;
    }
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < s->V && !s->in_prompt[ids[i]]) {
            s->in_prompt[ids[i]] = 1;
            s->prompt_ids[s->n_prompt++] = ids[i];
        }
    return 0;
}

void g4_sampler_reset(g4_sampler *s) {
    if (!s || !s->penalties_on) return;
    for (int i = 0; i < s->n_seen; i++) s->count[s->seen[i]] = 0;
    for (int i = 0; i < s->n_prompt; i++) s->in_prompt[s->prompt_ids[i]] = 0;
    s->n_prompt = 0;
    s->n_seen = 0;
    s->n_accepted = 0;
    s->n_accepted_max = 0;
}

/* ------------------------------------------------------------------ modified ids */

/* Fills mod_ids/mod_values with the adjusted logits of every biased, suppressed or
 * penalized id; dynamic slots are registered in s->slot until mods_clear. The raw logits are
 * logits[id], or raw[i] for the i-th id in this order (g4_sampler_candidate_extras). */
static void mods_build(g4_sampler *s, const float *logits, const float *raw) {
    int n = s->n_static;
    for (int i = 0; i < s->n_static; i++) s->mod_ids[i] = s->static_ids[i];
    if (s->penalties_on) {
        for (int i = 0; i < s->n_seen; i++) {
            int32_t id = s->seen[i];
            if (s->slot[id] < 0) {
                s->slot[id] = n;
                s->mod_ids[n++] = id;
            }
        }
        for (int i = 0; i < s->n_prompt; i++) { /* (those also in the window have their slot now) */
            int32_t id = s->prompt_ids[i];
            if (s->slot[id] < 0) {
                s->slot[id] = n;
                s->mod_ids[n++] = id;
            }
        }
    }
    s->n_mod = n;
    const float rp = s->p.repetition_penalty;
    const float pres = s->p.presence_penalty, freq = s->p.frequency_penalty;
    for (int i = 0; i < n; i++) {
        int32_t id = s->mod_ids[i];
        float v = raw ? raw[i] : logits[id];
        if (v != v) v = -INFINITY;
        if (i < s->n_static) v += s->static_bias[i];
        if (s->penalties_on && (s->count[id] > 0 || (s->n_prompt > 0 && s->in_prompt[id]))) {
            int32_t c = s->count[id];
            if (rp != 1.0f) v = v > 0.0f ? v / rp : v * rp; /* HF: score < 0 ? score * p : score / p */
            if (c > 0) v -= freq * (float)c + pres;
        }
        if (i < s->n_static && s->static_suppressed[i]) v = -INFINITY;
        if (v != v) v = -INFINITY; /* +inf logit with a -inf bias */
        s->mod_values[i] = v;
    }
}

static void mods_clear(g4_sampler *s) {
    for (int i = s->n_static; i < s->n_mod; i++) s->slot[s->mod_ids[i]] = -1;
    s->n_mod = s->n_static;
}

/* ------------------------------------------------------------------ selection helpers */

static inline void swapf(float *a, float *b) {
    float t = *a;
    *a = *b;
    *b = t;
}

/* The k-th largest (1-based) of a[0..n); reorders a. Three-way partition: fine with ties. */
static float kth_largest(float *a, int n, int k) {
    int lo = 0, hi = n - 1, target = k - 1;
    while (lo < hi) {
        float x = a[lo], y = a[lo + (hi - lo) / 2], z = a[hi];
        float pivot = x > y ? (y > z ? y : (x > z ? z : x)) : (x > z ? x : (y > z ? z : y));
        int lt = lo, i = lo, gt = hi;
        while (i <= gt) {
            if (a[i] > pivot)
                swapf(&a[lt++], &a[i++]);
            else if (a[i] < pivot)
                swapf(&a[i], &a[gt--]);
            else
                i++;
        }
        if (target < lt)
            hi = lt - 1;
        else if (target > gt)
            lo = gt + 1;
        else
            return pivot;
    }
    return a[lo];
}

/* Keeps the candidates >= the k-th largest value (all ties kept); returns the new count. */
static int cut_top_k(g4_sampler *s, g4_cand *c, int n, int k) {
    if (n <= k) return n;
    for (int i = 0; i < n; i++) s->fscratch[i] = c[i].v;
    float t = kth_largest(s->fscratch, n, k);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (c[i].v >= t) c[m++] = c[i];
    return m;
}

/* Whether any of x[0..64) is >= thr (NaN never is). */
static inline int block64_any_ge(const float *x, float thr) {
#if defined(__SSE2__)
    const __m128 t = _mm_set1_ps(thr);
    __m128 any = _mm_cmpge_ps(_mm_loadu_ps(x), t);
    for (int j = 4; j < 64; j += 4) any = _mm_or_ps(any, _mm_cmpge_ps(_mm_loadu_ps(x + j), t));
    return _mm_movemask_ps(any) != 0;
#else
    int any = 0;
    for (int j = 0; j < 64; j++) any |= x[j] >= thr;
    return any;
#endif
}

/* Offsets j < n (n <= 64) with x[j] >= thr, in increasing order; returns how many. */
static inline int block_hits(const float *x, int n, float thr, int *hits) {
    int k = 0, j = 0;
#if defined(__SSE2__)
    const __m128 t = _mm_set1_ps(thr);
    for (; j + 4 <= n; j += 4) {
        int mask = _mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(x + j), t));
        while (mask) {
            hits[k++] = j + __builtin_ctz((unsigned)mask);
            mask &= mask - 1;
        }
    }
#endif
    for (; j < n; j++)
        if (x[j] >= thr) hits[k++] = j;
    return k;
}

/* Every id whose raw logit is >= the kk-th largest raw logit, leaving out the modified ids when
 * exclude_mods is set (NaN and -inf never qualify). A candidate buffer behind a threshold that
 * rises to the kk-th largest value seen so far whenever the buffer fills (quickselect). */
static int select_top(g4_sampler *s, const float *x, int kk, int exclude_mods) {
    const int V = s->V;
    const int32_t *slot = exclude_mods ? s->slot : NULL;
    g4_cand *c = s->cand;
    int cap = kk * 4 < 256 ? 256 : kk * 4;
    if (cap > V) cap = V;
    float thr = -FLT_MAX;
    int n = 0, hits[64];
    for (int i = 0; i < V; i += 64) {
        int len = V - i < 64 ? V - i : 64;
        if (len == 64 && !block64_any_ge(x + i, thr)) continue;
        int h = block_hits(x + i, len, thr, hits);
        for (int q = 0; q < h; q++) {
            int id = i + hits[q];
            if (slot && slot[id] >= 0) continue;
            c[n].v = x[id];
            c[n].id = id;
            n++;
        }
        if (n > cap - 64 && cap < V) {
            int before = n;
            for (int q = 0; q < n; q++) s->fscratch[q] = c[q].v;
            float t = kth_largest(s->fscratch, n, kk);
            int m = 0;
            for (int q = 0; q < n; q++)
                if (c[q].v >= t) c[m++] = c[q];
            n = m;
            thr = t;
            if (n > before / 2) cap = cap * 2 > V ? V : cap * 2; /* many ties: make room */
        }
    }
    return n;
}

static int cand_cmp_desc(const void *pa, const void *pb) {
    const g4_cand *a = pa, *b = pb;
    if (a->v > b->v) return -1;
    if (a->v < b->v) return 1;
    return (a->id > b->id) - (a->id < b->id);
}

/* Moves a prefix of c that surely contains the top-p nucleus (mass target) to the front and
 * returns its length: a histogram of the mass per 1/16-nat bucket below the maximum. */
static int nucleus_prune(g4_sampler *s, g4_cand *c, int n, float m, float inv_t, double target) {
    double *mass = s->bucket_mass;
    memset(mass, 0, sizeof s->bucket_mass);
    const float scale = G4_TOPP_BUCKETS_PER_NAT * inv_t;
    for (int i = 0; i < n; i++) {
        float d = (m - c[i].v) * scale;
        int b = d < (float)(G4_TOPP_BUCKETS - 1) ? (int)d : G4_TOPP_BUCKETS - 1;
        mass[b] += (double)c[i].e;
    }
    /* A small margin so that rounding in this sum never cuts the boundary bucket short. */
    double goal = target * (1.0 + 1e-9), cum = 0.0;
    int last = G4_TOPP_BUCKETS - 1;
    for (int b = 0; b < G4_TOPP_BUCKETS; b++) {
        cum += mass[b];
        if (cum >= goal) {
            last = b;
            break;
        }
    }
    if (last == G4_TOPP_BUCKETS - 1) return n;
    int k = 0;
    for (int i = 0; i < n; i++) {
        float d = (m - c[i].v) * scale;
        int b = d < (float)(G4_TOPP_BUCKETS - 1) ? (int)d : G4_TOPP_BUCKETS - 1;
        if (b <= last) {
            g4_cand t = c[k];
            c[k++] = c[i];
            c[i] = t;
        }
    }
    return k;
}

/* Reorders c so the nucleus comes first in descending order; returns its size: tokens are
 * kept while the mass before them is < target (= top_p * total mass of the input set). */
static int nucleus(g4_sampler *s, g4_cand *c, int n, float m, float inv_t, double target) {
    int k = n > G4_TOPP_SORT_DIRECT ? nucleus_prune(s, c, n, m, inv_t, target) : n;
    qsort(c, (size_t)k, sizeof *c, cand_cmp_desc);
    double cum = 0.0;
    int keep = 0;
    while (keep < k && cum < target) cum += (double)c[keep++].e;
    return keep;
}

/* Index of the lowest id among candidates with the largest value (-1 when n == 0). */
static int best_cand(const g4_cand *c, int n) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (best < 0 || c[i].v > c[best].v || (c[i].v == c[best].v && c[i].id < c[best].id)) best = i;
    return best;
}

/* Writes the final choice: a draw (probs == NULL) or the distribution. */
static int32_t draw_or_write(g4_sampler *s, const g4_cand *c, int n, float *probs, int *n_nonzero) {
    double z = 0.0;
    for (int i = 0; i < n; i++) z += (double)c[i].e;
    if (!(z > 0.0)) return -1; /* cannot happen: the top token (e = 1) is always kept */
    if (probs) {
        int nz = 0;
        for (int i = 0; i < n; i++) {
            float q = (float)((double)c[i].e / z);
            probs[c[i].id] = q;
            nz += q > 0.0f;
        }
        *n_nonzero = nz;
        return 0;
    }
    double u = rng_uniform(s->rng) * z, acc = 0.0;
    int last = 0;
    for (int i = 0; i < n; i++) {
        if (c[i].e <= 0.0f) continue;
        acc += (double)c[i].e;
        last = i;
        if (u < acc) return c[i].id;
    }
    return c[last].id; /* u landed in the rounding gap at the very end */
}

/* Temperature, top-p (over the mass z_total of the set these candidates came from, or over
 * the candidates themselves when z_total < 0), min-p, then the draw. c[].e must be set. */
static int32_t finish(g4_sampler *s, g4_cand *c, int n, float m, float inv_t, double z_total,
                      float *probs, int *n_nonzero) {
    if (s->p.top_p < 1.0f) {
        double z = z_total;
        if (z < 0) {
            z = 0.0;
            for (int i = 0; i < n; i++) z += (double)c[i].e;
        }
        n = nucleus(s, c, n, m, inv_t, (double)s->p.top_p * z);
    }
    if (s->p.min_p > 0.0f) { /* e = exp((l - l_max) / T) is exactly p / p_max */
        int k = 0;
        for (int i = 0; i < n; i++)
            if (c[i].e >= s->p.min_p) c[k++] = c[i];
        n = k;
    }
    return draw_or_write(s, c, n, probs, n_nonzero);
}

/* ------------------------------------------------------------------ the paths */

/* Greedy or top-k over the n candidates in s->cand: every id whose value is >= the k-th largest of the row
 * (ties kept), unmodified ones in ascending id order, then the modified ones. */
static int32_t top_k_from(g4_sampler *s, int n, int k, int greedy, float *probs, int *n_nonzero) {
    g4_cand *c = s->cand;
    if (n == 0) return -1;
    int b = best_cand(c, n);
    float m = c[b].v;
    if (greedy || m == INFINITY) {
        /* +inf logits: those tokens take all the mass; the lowest such id is returned.
         * No random number is consumed. */
        if (probs) {
            probs[c[b].id] = 1.0f;
            *n_nonzero = 1;
        }
        return c[b].id;
    }
    n = cut_top_k(s, c, n, k);
    const float inv_t = 1.0f / s->p.temperature;
    for (int i = 0; i < n; i++) c[i].e = exp_scaled(c[i].v, m, inv_t);
    return finish(s, c, n, m, inv_t, -1.0, probs, n_nonzero);
}

/* Greedy or top-k: no copy of the row. */
static int32_t run_top_k(g4_sampler *s, const float *logits, int k, int greedy, float *probs,
                         int *n_nonzero) {
    /* The modified ids are left out of the scan and added with their adjusted values: an
     * unmodified id of the true top-k has fewer than k unmodified ids above it. */
    int n = select_top(s, logits, k, s->n_mod > 0);
    g4_cand *c = s->cand;
    if (s->n_mod > 0) {
        for (int i = 0; i < s->n_mod; i++)
            if (s->mod_values[i] > -INFINITY) {
                c[n].v = s->mod_values[i];
                c[n].id = s->mod_ids[i];
                n++;
            }
    }
    return top_k_from(s, n, k, greedy, probs, n_nonzero);
}

/* No top-k: the adjusted row is materialized in s->work. */
static int32_t run_full(g4_sampler *s, const float *logits, float *probs, int *n_nonzero) {
    const int V = s->V;
    float *w = s->work;
    float m = copy_scrub_max(logits, w, V);
    if (s->n_mod > 0) {
        int lowered_max = 0;
        float mod_max = -INFINITY;
        for (int i = 0; i < s->n_mod; i++) {
            float *x = &w[s->mod_ids[i]];
            if (*x == m && s->mod_values[i] < m) lowered_max = 1;
            *x = s->mod_values[i];
            if (*x > mod_max) mod_max = *x;
        }
        if (lowered_max) /* a modified id held the maximum: look again */
            m = row_max(w, V);
        else if (mod_max > m)
            m = mod_max;
    }
    if (m == -INFINITY) return -1;
    g4_cand *c = s->cand;
    if (m == INFINITY) { /* those tokens take all the mass; the lowest such id wins */
        int i = 0;
        while (w[i] != INFINITY) i++;
        if (probs) {
            probs[i] = 1.0f;
            *n_nonzero = 1;
        }
        return i;
    }
    const float inv_t = 1.0f / s->p.temperature;

    if (s->p.top_p >= 1.0f && s->p.min_p > 0.0f) {
        /* Min-p alone: only tokens near the maximum qualify, so no exp over the row. A raw
         * threshold one nat looser than log(min_p) picks the candidates; the exact test is
         * e >= min_p, as in finish(). */
        const float loose = m + (logf(s->p.min_p) - 1.0f) * s->p.temperature;
        int n = 0, hits[64];
        for (int i = 0; i < V; i += 64) {
            int len = V - i < 64 ? V - i : 64;
            if (len == 64 && !block64_any_ge(w + i, loose)) continue;
            int h = block_hits(w + i, len, loose, hits);
            for (int q = 0; q < h; q++) {
                int j = i + hits[q];
                float e = exp_scaled(w[j], m, inv_t);
                if (e >= s->p.min_p) {
                    c[n].v = w[j];
                    c[n].id = j;
                    c[n].e = e;
                    n++;
                }
            }
        }
        return finish(s, c, n, m, inv_t, -1.0, probs, n_nonzero);
    }

    float *e = s->expv;
    double *prefix = s->prefix;
    double z = exp_sum_row(w, e, V, m, inv_t, prefix);

    if (s->p.top_p >= 1.0f) {
        /* Plain softmax sampling over the whole row. */
        if (probs) {
            int nz = 0;
            for (int i = 0; i < V; i++) {
                probs[i] = (float)((double)e[i] / z);
                nz += probs[i] > 0.0f;
            }
            *n_nonzero = nz;
            return 0;
        }
        double u = rng_uniform(s->rng) * z;
        /* The block whose prefix sums bracket u (binary search), then a walk from there. If
         * rounding makes the walk overshoot its block, it simply goes on into the next. */
        int lo_b = 0, hi_b = (V + G4_SUM_BLOCK - 1) / G4_SUM_BLOCK; /* prefix[lo_b] <= u */
        while (hi_b - lo_b > 1) {
            int mid = (lo_b + hi_b) / 2;
            if (prefix[mid] <= u)
                lo_b = mid;
            else
                hi_b = mid;
        }
        double acc = prefix[lo_b];
        int i = lo_b * G4_SUM_BLOCK, last = -1;
        for (; i < V; i++) {
            if (e[i] <= 0.0f) continue;
            acc += (double)e[i];
            last = i;
            if (u < acc) return i;
        }
        if (last >= 0) return last;
        for (i = V - 1; i >= 0; i--)
            if (e[i] > 0.0f) return i;
        return -1;
    }

    /* Top-p over the whole row: gather tokens above a falling probability threshold until
     * their mass covers top_p (with a margin for rounding), then find the nucleus among them. */
    const double target = (double)s->p.top_p * z;
    float hi = INFINITY, lo = 1.0f / 2981.0f; /* about e^-8 of the maximum */
    double mass = 0.0;
    int n = 0;
    for (;;) {
        for (int i = 0; i < V; i += 64) {
            int end = i + 64 <= V ? i + 64 : V;
            if (end - i == 64 && !block64_any_ge(e + i, lo)) continue;
            for (int j = i; j < end; j++)
                if (e[j] >= lo && e[j] < hi && e[j] > 0.0f) {
                    c[n].v = w[j];
                    c[n].e = e[j];
                    c[n].id = j;
                    n++;
                    mass += (double)e[j];
                }
        }
        if (mass >= target * (1.0 + 1e-9) || lo == 0.0f) break;
        hi = lo;
        lo = lo < 1e-30f ? 0.0f : lo * (1.0f / 2981.0f);
    }
    return finish(s, c, n, m, inv_t, z, probs, n_nonzero);
}

static int32_t run(g4_sampler *s, const float *logits, float *probs, int *n_nonzero) {
    if (s->n_static > 0 || s->penalties_on) mods_build(s, logits, NULL);
    else s->n_mod = 0;
    int greedy = s->p.temperature < G4_SAMPLER_MIN_TEMPERATURE;
    int32_t r;
    if (greedy)
        r = run_top_k(s, logits, 1, 1, probs, n_nonzero);
    else if (s->p.top_k > 0)
        r = run_top_k(s, logits, s->p.top_k < s->V ? s->p.top_k : s->V, 0, probs, n_nonzero);
    else
        r = run_full(s, logits, probs, n_nonzero);
    if (s->n_mod > 0) mods_clear(s);
    return r;
}

int32_t g4_sampler_sample(g4_sampler *s, const float *logits) { return s && logits ? run(s, logits, NULL, NULL) : -1; }

/* The modified ids of this step in mods_build's order (static ones, then the history's others), when there are
 * any; returns their number. */
static int mod_ids_now(const g4_sampler *s, int32_t *ids) {
    int n = s->n_static;
    if (ids)
        for (int i = 0; i < n; i++) ids[i] = s->static_ids[i];
    if (s->penalties_on) {
        for (int i = 0; i < s->n_seen; i++)
            if (s->slot[s->seen[i]] < 0) {
                if (ids) ids[n] = s->seen[i];
                n++;
            }
        for (int i = 0; i < s->n_prompt; i++) /* those not in the window */
            if (s->slot[s->prompt_ids[i]] < 0 && s->count[s->prompt_ids[i]] == 0) {
                if (ids) ids[n] = s->prompt_ids[i];
                n++;
            }
    }
    return n;
}

/* The k of run(): 1 for greedy, else top_k up to the vocabulary (0: no top-k) */
static int run_k(const g4_sampler *s) {
    return s->p.temperature < G4_SAMPLER_MIN_TEMPERATURE ? 1 : s->p.top_k < s->V ? s->p.top_k : s->V;
}

int g4_sampler_candidates_k(const g4_sampler *s) {
    const int k = run_k(s);
    if (k <= 0) return 0;
    const int n_mod = s->n_static > 0 || s->penalties_on ? mod_ids_now(s, NULL) : 0;
    if (n_mod == 0) return k <= G4_SAMPLER_CANDIDATES_MAX ? k : 0;
    /* an unmodified id among the row's k largest adjusted values has fewer than k unmodified and at most n_mod
     * modified ids above it, so it is among the k + n_mod largest raw values; rounded up to a power of two so
     * that steps with a growing history share a few k (a model step is recorded per k) */
    int kk = 1;
    while (kk < k + n_mod) kk *= 2;
    if (kk > s->V) kk = s->V;
    return kk <= G4_SAMPLER_CANDIDATES_MAX ? kk : 0;
}

int g4_sampler_candidate_extras(const g4_sampler *s, int32_t *ids) {
    return s->n_static > 0 || s->penalties_on ? mod_ids_now(s, ids) : 0;
}

int g4_sampler_candidate_extras_after(g4_sampler *s, const int32_t *ids, int n, int32_t *extras, int *k) {
    const uint64_t max = s->n_accepted_max, before = s->n_accepted;
    g4_sampler_accept_many(s, ids, n);
    const int ne = g4_sampler_candidate_extras(s, extras);
    if (k) *k = g4_sampler_candidates_k(s);
    g4_sampler_rewind(s, (int)(s->n_accepted - before));
    s->n_accepted_max = max;
    return ne;
}

/* sample_candidates' draw (probs NULL), or its distribution into probs (*nz its non-zero entries) */
static int32_t run_candidates(g4_sampler *s, const int32_t *ids, const float *vals, int n, const float *extra_vals,
                              float *probs, int *nz) {
    const int kk = g4_sampler_candidates_k(s);
    if (kk == 0 || n < 0 || n > s->V) return -1;
    const int greedy = s->p.temperature < G4_SAMPLER_MIN_TEMPERATURE, k = run_k(s);
    s->n_mod = 0;
    if (s->n_static > 0 || s->penalties_on) {
        if (mod_ids_now(s, NULL) > 0 && !extra_vals) return -1;
        mods_build(s, NULL, extra_vals);
    }
    /* as run_top_k: the unmodified candidates in ascending id order, then the modified ids' adjusted values */
    g4_cand *c = s->cand;
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= s->V) {
            if (s->n_mod > 0) mods_clear(s);
            return -1;
        }
        if (s->n_mod > 0 && s->slot[ids[i]] >= 0) continue;
        c[m++] = (g4_cand){vals[i] != vals[i] ? -INFINITY : vals[i], 0.0f, ids[i]};
    }
    for (int i = 0; i < s->n_mod; i++)
        if (s->mod_values[i] > -INFINITY) c[m++] = (g4_cand){s->mod_values[i], 0.0f, s->mod_ids[i]};
    const int32_t r = top_k_from(s, m, k, greedy, probs, nz);
    if (s->n_mod > 0) mods_clear(s);
    return r;
}

int32_t g4_sampler_sample_candidates(g4_sampler *s, const int32_t *ids, const float *vals, int n,
                                     const float *extra_vals) {
    return run_candidates(s, ids, vals, n, extra_vals, NULL, NULL);
}

int g4_sampler_probs_candidates(g4_sampler *s, const int32_t *ids, const float *vals, int n, const float *extra_vals,
                                float *probs) {
    memset(probs, 0, (size_t)s->V * sizeof *probs);
    int nz = 0;
    return run_candidates(s, ids, vals, n, extra_vals, probs, &nz) < 0 ? -1 : nz;
}

int g4_sampler_is_argmax(const g4_sampler *s) {
    return s->p.temperature < G4_SAMPLER_MIN_TEMPERATURE && s->n_static == 0 && !s->penalties_on;
}

int g4_sampler_is_greedy(const g4_sampler *s) { return s->p.temperature < G4_SAMPLER_MIN_TEMPERATURE; }

double g4_sampler_uniform(g4_sampler *s) { return rng_uniform(s->rng); }

int32_t g4_sampler_draw(g4_sampler *s, const float *probs) {
    double z = 0.0;
    for (int i = 0; i < s->V; i++) z += probs[i] > 0.0f ? (double)probs[i] : 0.0;
    if (!(z > 0.0)) return -1;
    double u = rng_uniform(s->rng) * z, acc = 0.0;
    int32_t last = -1;
    for (int i = 0; i < s->V; i++) {
        if (!(probs[i] > 0.0f)) continue;
        acc += (double)probs[i];
        last = i;
        if (u < acc) return i;
    }
    return last; /* u landed in the rounding gap at the very end */
}

int g4_sampler_probs(g4_sampler *s, const float *logits, float *probs) {
    memset(probs, 0, (size_t)s->V * sizeof *probs);
    int nz = 0;
    if (run(s, logits, probs, &nz) < 0) return -1;
    return nz;
}
