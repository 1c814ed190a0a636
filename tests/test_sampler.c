/* Sampler, generation_config.json and stop strings.
 *
 * The sampler is checked against an independent reference written here from transformers'
 * formulas (RepetitionPenaltyLogitsProcessor, SuppressTokensLogitsProcessor, TemperatureLogitsWarper,
 * TopKLogitsWarper, TopPLogitsWarper with its ascending-sort/cumsum rule, MinPLogitsWarper) and
 * the OpenAI presence/frequency formula, in double precision:
 *   - exactly, through g4_sampler_probs (the distribution sample() draws from), and
 *   - statistically, by drawing many tokens with a fixed seed and running a chi-square test
 *     whose threshold has a false-failure probability of about 1e-9 for a random seed.
 * The generation configs come from the shared fixtures (saved by transformers 5.17).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "backend/backend.h"
#include "check.h"
#include "model/generation_config.h"
#include "engine/sampler.h"
#include "engine/stop.h"

/* ------------------------------------------------------------------ helpers */

static uint64_t test_rng = 0x1234567ull;
static double urand(void) { /* a small LCG-free generator for test data: splitmix-style */
    uint64_t z = (test_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}
static double nrand(void) {
    double u = urand(), v = urand();
    if (u < 1e-300) u = 1e-300;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

static g4_sampler *make(const g4_sampler_params *p, int V) {
    g4_sampler *s = NULL;
    g4_error err = {{0}};
    if (g4_sampler_new(p, V, &s, &err)) {
        fprintf(stderr, "g4_sampler_new failed: %s\n", err.msg);
        return NULL;
    }
    return s;
}

/* Upper chi-square quantile for a false-failure probability of ~1e-9 (Wilson-Hilferty, z = 6). */
static double chi2_limit(int df) {
    double k = df, z = 6.0;
    double a = 1.0 - 2.0 / (9.0 * k) + z * sqrt(2.0 / (9.0 * k));
    return k * a * a * a;
}

/* ------------------------------------------------------------------ reference (HF formulas) */

typedef struct {
    int idx;
    double v;
} ref_pair;

static int cmp_asc(const void *pa, const void *pb) {
    const ref_pair *a = pa, *b = pb;
    if (a->v < b->v) return -1;
    if (a->v > b->v) return 1;
    return (a->idx < b->idx) - (a->idx > b->idx); /* equal values: larger id first (lower id "larger") */
}

static void softmax_d(const double *x, int V, double *p) {
    double m = -INFINITY, z = 0;
    for (int i = 0; i < V; i++)
        if (x[i] > m) m = x[i];
    for (int i = 0; i < V; i++) {
        p[i] = x[i] == -INFINITY ? 0.0 : exp(x[i] - m);
        z += p[i];
    }
    for (int i = 0; i < V; i++) p[i] /= z;
}

/* The adjusted logits before temperature (bias, repetition, presence/frequency, suppress). */
static void ref_adjust(const float *logits, int V, const g4_sampler_params *p, const int32_t *hist,
                       int n_hist, double *x) {
    for (int i = 0; i < V; i++) x[i] = isnan(logits[i]) ? -INFINITY : (double)logits[i];
    for (int i = 0; i < p->n_bias; i++) x[p->bias_ids[i]] += p->bias_values[i];
    int start = p->penalty_last_n < 0 ? 0 : (n_hist > p->penalty_last_n ? n_hist - p->penalty_last_n : 0);
    if (p->penalty_last_n != 0) {
        int *count = calloc((size_t)V, sizeof *count);
        for (int i = start; i < n_hist; i++) count[hist[i]]++;
        for (int i = 0; i < V; i++) {
            if (!count[i]) continue;
            double rp = p->repetition_penalty;
            x[i] = x[i] < 0 ? x[i] * rp : x[i] / rp; /* torch.where(score < 0, score * p, score / p) */
            x[i] = x[i] - count[i] * (double)p->frequency_penalty - (double)p->presence_penalty;
        }
        free(count);
    }
    for (int i = 0; i < p->n_suppress; i++) x[p->suppress_ids[i]] = -INFINITY;
}

/* Final distribution; returns the boundary margin of top-p/min-p decisions (how far the
 * closest kept/removed decision was from flipping), so callers can avoid ambiguous cases. */
static double ref_probs(const float *logits, int V, const g4_sampler_params *p, const int32_t *hist,
                        int n_hist, double *out) {
    double *x = malloc((size_t)V * sizeof *x), *pr = malloc((size_t)V * sizeof *pr);
    ref_pair *srt = malloc((size_t)V * sizeof *srt);
    double margin = INFINITY;
    ref_adjust(logits, V, p, hist, n_hist, x);
    if (p->temperature == 0.0f) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (x[i] > x[best]) best = i;
        for (int i = 0; i < V; i++) out[i] = i == best ? 1.0 : 0.0;
        goto done;
    }
    for (int i = 0; i < V; i++) x[i] /= p->temperature;
    if (p->top_k > 0) { /* indices_to_remove = scores < topk(scores, k)[..., -1] */
        int k = p->top_k < V ? p->top_k : V;
        for (int i = 0; i < V; i++) srt[i] = (ref_pair){i, x[i]};
        qsort(srt, (size_t)V, sizeof *srt, cmp_asc);
        double kth = srt[V - k].v;
        for (int i = 0; i < V; i++)
            if (x[i] < kth) x[i] = -INFINITY;
    }
    if (p->top_p < 1.0f) { /* ascending sort, cumsum(softmax) <= 1 - top_p removed, keep the last */
        softmax_d(x, V, pr);
        for (int i = 0; i < V; i++) srt[i] = (ref_pair){i, x[i]};
        qsort(srt, (size_t)V, sizeof *srt, cmp_asc);
        double cum = 0, lim = 1.0 - (double)p->top_p;
        for (int j = 0; j < V; j++) {
            cum += pr[srt[j].idx];
            if (pr[srt[j].idx] > 0 && fabs(cum - lim) < margin) margin = fabs(cum - lim);
            if (cum <= lim && j < V - 1) x[srt[j].idx] = -INFINITY;
        }
    }
    if (p->min_p > 0.0f) { /* probs < min_p * max(probs) removed */
        softmax_d(x, V, pr);
        double mx = 0;
        for (int i = 0; i < V; i++)
            if (pr[i] > mx) mx = pr[i];
        for (int i = 0; i < V; i++) {
            if (pr[i] > 0 && fabs(pr[i] / mx - p->min_p) < margin) margin = fabs(pr[i] / mx - p->min_p);
            if (pr[i] < p->min_p * mx) x[i] = -INFINITY;
        }
    }
    softmax_d(x, V, out);
done:
    free(x);
    free(pr);
    free(srt);
    return margin;
}

/* Exact check: g4_sampler_probs against the reference (same support, values within 1e-5). */
static void check_probs(g4_sampler *s, const float *logits, int V, const g4_sampler_params *p,
                        const int32_t *hist, int n_hist, const char *label) {
    double *ref = malloc((size_t)V * sizeof *ref);
    float *got = malloc((size_t)V * sizeof *got);
    ref_probs(logits, V, p, hist, n_hist, ref);
    int nz = g4_sampler_probs(s, logits, got);
    int bad_support = 0, bad_value = 0, ref_nz = 0, first_bad = -1;
    for (int i = 0; i < V; i++) {
        ref_nz += ref[i] > 0;
        if ((ref[i] > 0) != (got[i] > 0)) {
            bad_support++;
            if (first_bad < 0) first_bad = i;
        } else if (fabs(got[i] - ref[i]) > 1e-5 + 1e-4 * ref[i]) {
            bad_value++;
            if (first_bad < 0) first_bad = i;
        }
    }
    CHECKF(bad_support == 0 && bad_value == 0 && nz == ref_nz,
           "%s: %d support / %d value mismatches (first id %d: got %g want %g), %d vs %d tokens", label,
           bad_support, bad_value, first_bad, first_bad >= 0 ? got[first_bad] : 0.0,
           first_bad >= 0 ? ref[first_bad] : 0.0, nz, ref_nz);
    free(ref);
    free(got);
}

/* Statistical check: n draws; none outside the reference support; chi-square over bins of
 * expected count >= 5; every token expected >= 20 times seen at least once. */
static void check_draws(g4_sampler *s, const float *logits, int V, const g4_sampler_params *p,
                        const int32_t *hist, int n_hist, int n, const char *label) {
    double *ref = malloc((size_t)V * sizeof *ref);
    long *cnt = calloc((size_t)V, sizeof *cnt);
    ref_probs(logits, V, p, hist, n_hist, ref);
    int outside = 0, invalid = 0;
    for (int d = 0; d < n; d++) {
        int32_t id = g4_sampler_sample(s, logits);
        if (id < 0 || id >= V) {
            invalid++;
            continue;
        }
        cnt[id]++;
        if (ref[id] <= 0) outside++;
    }
    double stat = 0, pool_o = 0, pool_e = 0;
    int bins = 0, unseen = 0;
    for (int i = 0; i < V; i++) {
        if (ref[i] <= 0) continue;
        if (ref[i] * n >= 20 && cnt[i] == 0) unseen++;
        pool_o += (double)cnt[i];
        pool_e += ref[i] * n;
        if (pool_e >= 5) {
            stat += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
            bins++;
            pool_o = pool_e = 0;
        }
    }
    if (pool_e > 0) { /* leftover: a bin of its own (still a valid partition) */
        stat += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
        bins++;
    }
    CHECKF(invalid == 0, "%s: %d draws returned an invalid id", label, invalid);
    CHECKF(outside == 0, "%s: %d draws fell outside the allowed set", label, outside);
    CHECKF(unseen == 0, "%s: %d allowed tokens never drawn", label, unseen);
    if (bins > 1) {
        double lim = chi2_limit(bins - 1);
        CHECKF(stat < lim, "%s: chi-square %.1f >= %.1f (df %d, %d draws)", label, stat, lim, bins - 1, n);
    }
    free(ref);
    free(cnt);
}

/* ------------------------------------------------------------------ tests */

static void test_validation(void) {
    g4_sampler_params p;
    g4_sampler *s = NULL;
    g4_error err;
    /* each case: change one field, expect an error that names it */
    const int V = 100;
    int32_t bad_id = 100, ok_id = 3;
    float inf_bias = INFINITY, nan_bias = NAN;
    for (int c = 0; c < 13; c++) {
        g4_sampler_params_default(&p);
        const char *want = NULL;
        switch (c) {
        case 0: p.temperature = -0.5f; want = "temperature"; break;
        case 1: p.temperature = NAN; want = "temperature"; break;
        case 2: p.top_p = 0.0f; want = "top_p"; break;
        case 3: p.top_p = 1.5f; want = "top_p"; break;
        case 4: p.min_p = -0.1f; want = "min_p"; break;
        case 5: p.min_p = 1.1f; want = "min_p"; break;
        case 6: p.top_k = -1; want = "top_k"; break;
        case 7: p.repetition_penalty = 0.0f; want = "repetition_penalty"; break;
        case 8: p.penalty_last_n = -2; want = "penalty_last_n"; break;
        case 9: p.bias_ids = &bad_id; p.bias_values = &nan_bias; p.n_bias = 1; want = "bias"; break;
        case 10: p.bias_ids = &ok_id; p.bias_values = &inf_bias; p.n_bias = 1; want = "bias"; break;
        case 11: p.bias_ids = &bad_id; p.bias_values = &p.min_p; p.n_bias = 1; want = "vocabulary"; break;
        case 12: p.suppress_ids = &bad_id; p.n_suppress = 1; want = "suppress"; break;
        }
        memset(&err, 0, sizeof err);
        int rc = g4_sampler_new(&p, V, &s, &err);
        CHECKF(rc == -1 && s == NULL && strstr(err.msg, want) != NULL, "case %d: rc %d, message '%s'", c,
               rc, err.msg);
        if (rc == 0) g4_sampler_free(s);
    }
    g4_sampler_params_default(&p);
    memset(&err, 0, sizeof err);
    CHECK(g4_sampler_new(&p, 0, &s, &err) == -1 && strstr(err.msg, "vocabulary") != NULL);
    /* the defaults and the edges of the ranges are accepted */
    p.top_p = 1.0f;
    p.min_p = 1.0f;
    p.temperature = 0.0f;
    p.penalty_last_n = 0;
    CHECK(g4_sampler_new(&p, V, &s, &err) == 0);
    g4_sampler_free(s);
}

static void test_exp_variants(void) {
    enum { N = 4099, NB = N / 256 + 2 };
    float *v = malloc(N * sizeof *v), *o[3];
    double sum[3], prefix[3][NB];
    for (int i = 0; i < N; i++) v[i] = (float)(-120.0 * urand());
    v[0] = -INFINITY;
    v[1] = 0.0f;
    v[2] = -87.0f;
    v[3] = -86.99f;
    v[4] = NAN;
    int used[3];
    for (int k = 0; k < 3; k++) {
        o[k] = malloc(N * sizeof *o[k]);
        used[k] = g4_sampler_exp_row_variant(v, o[k], N, 0.0f, 1.0f, k, &sum[k], prefix[k]);
    }
    CHECK(used[0] == 0);
    for (int k = 1; k < 3; k++) {
        CHECKF(memcmp(o[0], o[k], N * sizeof *o[0]) == 0, "exp: variant %d differs from plain C", used[k]);
        CHECKF(memcmp(&sum[0], &sum[k], sizeof sum[0]) == 0 && memcmp(prefix[0], prefix[k], sizeof prefix[0]) == 0,
               "exp: variant %d sums differ from plain C", used[k]);
    }
    double worst = 0, exact = 0;
    for (int i = 0; i < N; i++) {
        double want = !(v[i] >= -87.0f) ? 0.0 : exp((double)v[i]);
        double rel = want > 0 ? fabs(o[0][i] - want) / want : fabs(o[0][i]);
        if (rel > worst) worst = rel;
        exact += o[0][i];
    }
    CHECKF(worst < 1e-6, "exp: worst relative error %g", worst);
    CHECKF(fabs(sum[0] - exact) <= 1e-12 * exact, "exp: sum %.17g vs %.17g", sum[0], exact);
    CHECKF(prefix[0][0] == 0.0 && prefix[0][NB - 1] == sum[0], "exp: prefix ends");
    fprintf(stderr, "exp variants: plain C, %s, %s agree bit for bit; worst relative error %.2g\n",
            used[1] == 1 ? "SSE2" : "(no SSE2)", used[2] == 2 ? "AVX2" : "(no AVX2)", worst);
    free(v);
    for (int k = 0; k < 3; k++) free(o[k]);
}

static void test_greedy(void) {
    g4_sampler_params p;
    g4_sampler_params_default(&p);
    p.temperature = 0.0f;
    p.top_k = 40; /* ignored when greedy */
    p.top_p = 0.5f;
    const int sizes[] = {1, 7, 64, 1000, 4097};
    for (int si = 0; si < 5; si++) {
        int V = sizes[si];
        g4_sampler *s = make(&p, V);
        float *x = malloc((size_t)V * sizeof *x);
        int fails = 0;
        for (int t = 0; t < 200; t++) {
            /* quantized logits: many ties; every third row puts the max in the tail */
            for (int i = 0; i < V; i++) x[i] = (float)floor(nrand() * 4.0) * 0.25f;
            if (t % 3 == 1) x[V - 1] = 100.0f;
            if (t % 3 == 2 && V > 2) x[V / 2] = x[V - 1] = 50.0f; /* tie: lowest id wins */
            int best = 0;
            for (int i = 1; i < V; i++)
                if (x[i] > x[best]) best = i;
            fails += g4_sampler_sample(s, x) != best;
        }
        CHECKF(fails == 0, "greedy V=%d: %d of 200 rows differ from argmax", V, fails);
        g4_sampler_free(s);
        free(x);
    }
}

static void test_special_values(void) {
    const int V = 300;
    float x[300];
    g4_sampler_params p;
    g4_sampler_params_default(&p);
    for (int mode = 0; mode < 4; mode++) {
        p.temperature = mode == 0 ? 0.0f : 1.0f;
        p.top_k = mode == 1 ? 10 : 0;
        p.top_p = mode == 2 ? 0.9f : 1.0f;
        p.min_p = mode == 3 ? 0.1f : 0.0f;
        g4_sampler *s = make(&p, V);
        for (int i = 0; i < V; i++) x[i] = -INFINITY;
        CHECKF(g4_sampler_sample(s, x) == -1, "mode %d: all -inf must give -1", mode);
        for (int i = 0; i < V; i++) x[i] = NAN;
        CHECKF(g4_sampler_sample(s, x) == -1, "mode %d: all NaN must give -1", mode);
        x[123] = 0.5f; /* one finite logit among NaN */
        CHECKF(g4_sampler_sample(s, x) == 123, "mode %d: the only finite logit", mode);
        for (int i = 0; i < V; i++) x[i] = (float)nrand();
        x[200] = INFINITY;
        x[250] = INFINITY;
        CHECKF(g4_sampler_sample(s, x) == 200, "mode %d: +inf takes the lowest id", mode);
        g4_sampler_free(s);
    }
}

static void test_temperature(void) {
    const int V = 24;
    float x[24];
    for (int i = 0; i < V; i++) x[i] = (float)(nrand() * 1.5);
    const float temps[] = {0.5f, 1.0f, 1.7f};
    for (int t = 0; t < 3; t++) {
        g4_sampler_params p;
        g4_sampler_params_default(&p);
        p.temperature = temps[t];
        p.seed = 100 + t;
        g4_sampler *s = make(&p, V);
        char label[64];
        snprintf(label, sizeof label, "temperature %.1f", temps[t]);
        check_probs(s, x, V, &p, NULL, 0, label);
        check_draws(s, x, V, &p, NULL, 0, 60000, label);
        g4_sampler_free(s);
    }
    /* a row of several 256-token blocks: the draw finds its block by prefix sums */
    enum { W = 1100 };
    float *w = malloc(W * sizeof *w);
    for (int i = 0; i < W; i++) w[i] = (float)(nrand() * 0.7);
    g4_sampler_params p;
    g4_sampler_params_default(&p);
    p.seed = 77;
    g4_sampler *s = make(&p, W);
    check_probs(s, w, W, &p, NULL, 0, "temperature 1, V=1100");
    check_draws(s, w, W, &p, NULL, 0, 20000, "temperature 1, V=1100");
    g4_sampler_free(s);
    free(w);
}

static void test_top_k(void) {
    const int V = 50;
    float x[50];
    for (int i = 0; i < V; i++) x[i] = (float)(nrand() * 2.0);
    g4_sampler_params p;
    g4_sampler_params_default(&p);
    p.top_k = 5;
    p.temperature = 1.3f;
    p.seed = 7;
    g4_sampler *s = make(&p, V);
    check_probs(s, x, V, &p, NULL, 0, "top-k 5");
    check_draws(s, x, V, &p, NULL, 0, 40000, "top-k 5");
    g4_sampler_free(s);

    /* ties at the k-th value are all kept (scores < kth are removed) */
    float tie[10] = {1.0f, 5.0f, 3.0f, 0.0f, 4.0f, 3.0f, 3.0f, -1.0f, 2.0f, 3.0f};
    p.top_k = 3;
    p.temperature = 1.0f;
    s = make(&p, 10);
    check_probs(s, tie, 10, &p, NULL, 0, "top-k ties");
    check_draws(s, tie, 10, &p, NULL, 0, 30000, "top-k ties");
    g4_sampler_free(s);

    /* top-k 1 == argmax on random rows; top-k larger than the vocabulary is everything */
    p.top_k = 1;
    s = make(&p, 3000);
    float *y = malloc(3000 * sizeof *y);
    int fails = 0;
    for (int t = 0; t < 100; t++) {
        for (int i = 0; i < 3000; i++) y[i] = (float)nrand();
        int best = 0;
        for (int i = 1; i < 3000; i++)
            if (y[i] > y[best]) best = i;
        fails += g4_sampler_sample(s, y) != best;
    }
    CHECKF(fails == 0, "top-k 1: %d of 100 rows differ from argmax", fails);
    g4_sampler_free(s);
    p.top_k = 100000;
    s = make(&p, 40);
    check_probs(s, x, 40, &p, NULL, 0, "top-k > V");
    g4_sampler_free(s);
    free(y);
}

/* Top-p and min-p on the paths with and without top-k, small (sorted directly) and large
 * (histogram-pruned) candidate sets. */
static void test_top_p_min_p(void) {
    struct {
        int V, top_k;
        float top_p, min_p, temp, scale;
        int draws;
        const char *label;
        float tail; /* != 0: one token at 0, every other one near this value */
    } cases[] = {
        {40, 0, 0.8f, 0.0f, 1.0f, 1.5f, 60000, "top-p 0.8 (full row)", 0.0f},
        {40, 30, 0.7f, 0.0f, 0.8f, 1.5f, 40000, "top-k 30 + top-p 0.7", 0.0f},
        {40, 0, 1.0f, 0.15f, 1.0f, 1.5f, 60000, "min-p 0.15 (full row)", 0.0f},
        {40, 25, 1.0f, 0.1f, 1.4f, 1.5f, 60000, "top-k 25 + min-p 0.1", 0.0f},
        {40, 0, 0.9f, 0.05f, 1.2f, 1.5f, 60000, "top-p 0.9 + min-p 0.05", 0.0f},
        {300, 64, 0.95f, 0.0f, 1.0f, 2.0f, 12000, "gemma defaults top-k 64 top-p 0.95", 0.0f},
        {700, 0, 0.9f, 0.0f, 1.0f, 0.4f, 2000, "top-p 0.9 flat row (histogram path)", 0.0f},
        {700, 550, 0.9f, 0.0f, 1.0f, 0.4f, 2000, "top-k 550 + top-p 0.9 (histogram path)", 0.0f},
        {700, 0, 0.99f, 0.02f, 0.7f, 3.0f, 3000, "top-p 0.99 + min-p 0.02 peaked row", 0.0f},
        /* the nucleus reaches ~e^-10 below the top: found in the second gathering round */
        {4000, 0, 0.9f, 0.0f, 1.0f, 0.3f, 3000, "top-p 0.9, dominant token + deep tail", -10.0f},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int V = cases[c].V;
        float *x = malloc((size_t)V * sizeof *x);
        double *tmp = malloc((size_t)V * sizeof *tmp);
        g4_sampler_params p;
        g4_sampler_params_default(&p);
        p.top_k = cases[c].top_k;
        p.top_p = cases[c].top_p;
        p.min_p = cases[c].min_p;
        p.temperature = cases[c].temp;
        p.seed = 1000 + c;
        /* redraw the row until no top-p/min-p decision is within 1e-6 of flipping */
        for (int tries = 0; tries < 50; tries++) {
            for (int i = 0; i < V; i++) x[i] = (float)(cases[c].tail + nrand() * cases[c].scale);
            if (cases[c].tail != 0.0f) x[V / 3] = 0.0f;
            if (ref_probs(x, V, &p, NULL, 0, tmp) > 1e-6) break;
        }
        g4_sampler *s = make(&p, V);
        check_probs(s, x, V, &p, NULL, 0, cases[c].label);
        check_draws(s, x, V, &p, NULL, 0, cases[c].draws, cases[c].label);
        g4_sampler_free(s);
        free(x);
        free(tmp);
    }
}

/* Larger rows: the modified ids (suppressed, biased, penalized) include the largest raw
 * logits, so the top-k scan must skip them in 64-wide blocks and still find the true top-k;
 * and rows made of ties, where the k-th value is shared by thousands of ids. */
static void test_large_rows(void) {
    const int V = 5000;
    float *x = malloc((size_t)V * sizeof *x);
    int32_t hist[400], sup[40], bias_ids[20];
    float bias_vals[20];
    for (int i = 0; i < V; i++) x[i] = (float)(nrand() * 2.0);
    /* the 40 largest logits get suppressed, 400 history ids sit among the top 600 */
    for (int i = 0; i < 40; i++) {
        sup[i] = (int32_t)(i * 97 + 13);
        x[sup[i]] = 20.0f + (float)i;
    }
    for (int i = 0; i < 400; i++) {
        hist[i] = (int32_t)(i * 11 + 5) % V;
        x[hist[i]] = 6.0f + (float)urand() * 4.0f;
    }
    for (int i = 0; i < 20; i++) {
        bias_ids[i] = (int32_t)(i * 233 + 7);
        bias_vals[i] = i % 2 ? 3.0f : -5.0f;
    }
    const int ks[] = {1, 8, 64, 700};
    for (int t = 0; t < 4; t++) {
        g4_sampler_params p;
        g4_sampler_params_default(&p);
        p.top_k = ks[t];
        p.top_p = t == 2 ? 0.95f : 1.0f;
        p.repetition_penalty = 1.3f;
        p.frequency_penalty = 0.2f;
        p.suppress_ids = sup;
        p.n_suppress = 40;
        p.bias_ids = bias_ids;
        p.bias_values = bias_vals;
        p.n_bias = 20;
        g4_sampler *s = make(&p, V);
        g4_sampler_accept_many(s, hist, 400);
        char label[80];
        snprintf(label, sizeof label, "V=5000 top-k %d with 460 modified ids", ks[t]);
        check_probs(s, x, V, &p, hist, 400, label);
        p.temperature = 0.0f;
        g4_sampler *g = make(&p, V);
        g4_sampler_accept_many(g, hist, 400);
        check_probs(g, x, V, &p, hist, 400, "V=5000 greedy with 460 modified ids");
        g4_sampler_free(s);
        g4_sampler_free(g);
    }
    /* ties: all equal (top-k keeps everything), and two levels with the k-th value shared */
    for (int t = 0; t < 2; t++) {
        for (int i = 0; i < V; i++) x[i] = t == 0 ? 1.0f : (i % 3 == 0 ? 2.0f : 1.0f);
        g4_sampler_params p;
        g4_sampler_params_default(&p);
        p.top_k = t == 0 ? 10 : 2000;
        g4_sampler *s = make(&p, V);
        check_probs(s, x, V, &p, NULL, 0, t == 0 ? "all ties, top-k 10" : "shared k-th value, top-k 2000");
        g4_sampler_free(s);
    }
    free(x);
}

/* Sampling from a row's top candidates (the backend's top_k op, as the engine does on a GPU) draws the ids that
 * sampling the whole row draws, from the same seed, and g4_sampler_probs_candidates gives the row's distribution
 * bit for bit: two samplers, one fed whole rows, one the CPU backend's
 * candidates for K = k or more (a batch's largest k); rows with NaN, -inf, +inf and ties at the k-th value. */
static void test_candidates(void) {
    g4_error err = {{0}};
    g4_backend *be = g4_backend_new("cpu", 1, 0, &err);
    CHECKF(be != NULL, "cpu backend: %s", err.msg);
    if (!be) return;
    const int Vs[] = {50, 5000, 262144}, ks[] = {1, 5, 64, 300, G4_SAMPLER_CANDIDATES_MAX};
    const float temps[] = {0.0f, 0.7f, 1.0f, 1.6f}, top_ps[] = {1.0f, 0.9f, 0.4f};
    int compared = 0, fell_back = 0, with_extras = 0, probs_compared = 0;
    for (int vi = 0; vi < 3; vi++) {
        const int V = Vs[vi];
        float *x = malloc((size_t)V * sizeof *x), *vals = malloc(2 * G4_SAMPLER_CANDIDATES_MAX * sizeof *vals);
        float *pa = malloc((size_t)V * sizeof *pa), *pb = malloc((size_t)V * sizeof *pb);
        int32_t *ids = malloc(2 * G4_SAMPLER_CANDIDATES_MAX * sizeof *ids), ex_ids[G4_SAMPLER_CANDIDATES_MAX];
        float ex_vals[G4_SAMPLER_CANDIDATES_MAX];
        for (int trial = 0; trial < (vi == 2 ? 12 : 60); trial++) {
            const int shape = trial % 4;
            for (int i = 0; i < V; i++) x[i] = (float)(nrand() * (1.0 + trial % 3));
            if (shape == 1) /* ties at every level */
                for (int i = 0; i < V; i++) x[i] = (float)(i % 23) * 0.5f;
            if (shape == 2) /* NaN, -inf, one +inf now and then */
                for (int i = 0; i < V; i += 7) x[i] = i % 2 ? NAN : -INFINITY;
            if (shape == 2 && trial % 8 == 2) x[V / 3] = INFINITY;
            if (shape == 3) /* few finite values */
                for (int i = 0; i < V; i++) x[i] = i % 17 ? -INFINITY : x[i];
            g4_sampler_params p;
            g4_sampler_params_default(&p);
            p.temperature = temps[trial % 4];
            p.top_k = ks[(trial / 4) % 5];
            p.top_p = top_ps[(trial / 3) % 3];
            p.min_p = trial % 5 == 0 ? 0.05f : 0.0f;
            p.seed = (uint64_t)trial * 7919u + (uint64_t)V;
            /* modified ids on some trials: a bias that lifts low ids into the top and bans others, suppressed
             * ids, penalties over a history that grows with every draw (the extras' logits come back besides) */
            const int mods = (trial / 2) % 3; /* 0 none, 1 bias + suppression, 2 penalties (+ a bias) */
            int32_t hist[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
            int32_t bias_ids[4] = {0, 3 % V, (V / 2) % V, (V - 1) % V}, sup_ids[2] = {1 % V, (V / 3) % V};
            float bias_vals[4] = {25.0f, -INFINITY, 8.0f, -3.0f};
            if (mods >= 1) p.n_bias = mods == 1 ? 4 : 1, p.bias_ids = bias_ids, p.bias_values = bias_vals;
            if (mods == 1) p.n_suppress = 2, p.suppress_ids = sup_ids;
            if (mods == 2) {
                p.repetition_penalty = 1.3f, p.presence_penalty = 0.4f, p.frequency_penalty = 0.25f;
                p.penalty_last_n = trial % 4 < 2 ? 8 : -1;
            }
            g4_sampler *a = make(&p, V), *b = make(&p, V);
            if (!a || !b) break;
            if (mods == 2) /* a history: the row's largest values (the draw needs K >= k + them) and others */
                for (int i = 0; i < 8; i++) {
                    int32_t id = (int32_t)((i * 2654435761u + (unsigned)trial) % (unsigned)V);
                    if (i < 6) { /* the i-th largest finite value (ties: the lowest id) */
                        id = -1;
                        for (int j = 0; j < V; j++) {
                            int taken = 0;
                            for (int q = 0; q < i; q++) taken |= hist[q] == j;
                            if (!taken && isfinite(x[j]) && (id < 0 || x[j] > x[id])) id = j;
                        }
                    }
                    if (id < 0) continue;
                    hist[i] = id;
                    g4_sampler_accept(a, id), g4_sampler_accept(b, id);
                }
            if (mods == 2 && trial % 4 == 1) { /* prompt ids (the repetition penalty's only): some of the largest */
                int32_t prompt[6];
                for (int i = 0; i < 6; i++) prompt[i] = i < 3 && hist[i] >= 0 ? (hist[i] + 1) % V : (int32_t)((i * 7919u + (unsigned)trial * 31u) % (unsigned)V);
                CHECK(g4_sampler_accept_prompt(a, prompt, 6) == 0 && g4_sampler_accept_prompt(b, prompt, 6) == 0);
            }
            for (int d = 0; d < 16; d++) {
                const int k = g4_sampler_candidates_k(b);
                const int k_plain = p.temperature == 0.0f ? 1 : p.top_k < V ? p.top_k : V;
                const int n_ex = g4_sampler_candidate_extras(b, NULL);
                if (d == 0 && mods == 0)
                    CHECKF(k == k_plain && n_ex == 0, "candidates_k %d for top_k %d", k, p.top_k);
                CHECKF(k == 0 ? k_plain + n_ex > G4_SAMPLER_CANDIDATES_MAX : k >= (k_plain + n_ex < V ? k_plain + n_ex : V),
                       "candidates_k %d for top_k %d and %d modified ids", k, p.top_k, n_ex);
                const int K = k > 0 && trial % 2 && 2 * k <= G4_SAMPLER_CANDIDATES_MAX ? 2 * k : k, cap = 2 * K;
                int32_t count = -1;
                if (K > 0) be->ops->top_k(be, x, 1, V, K, cap, ids, vals, &count);
                g4_sampler_candidate_extras(b, ex_ids);
                for (int e = 0; e < n_ex; e++) ex_vals[e] = x[ex_ids[e]];
                if (count >= 0) { /* the distribution from the candidates is the row's (speculative sampling) */
                    const int nza = g4_sampler_probs(a, x, pa), nzb = g4_sampler_probs_candidates(b, ids, vals, count,
                                                                                               n_ex ? ex_vals : NULL, pb);
                    CHECKF(nza == nzb && !memcmp(pa, pb, (size_t)V * sizeof *pa), "probs from candidates differ "
                           "(V=%d T=%g top_k %d mods %d draw %d: %d vs %d non-zero)", V, (double)p.temperature, p.top_k,
                           mods, d, nza, nzb);
                    probs_compared++;
                }
                const int32_t want = g4_sampler_sample(a, x);
                const int32_t got = count < 0 ? g4_sampler_sample(b, x)
                                              : g4_sampler_sample_candidates(b, ids, vals, count, n_ex ? ex_vals : NULL);
                CHECKF(want == got, "V=%d T=%g top_k %d (K %d) top_p %g min_p %g mods %d draw %d: row %d, candidates %d",
                       V, (double)p.temperature, p.top_k, K, (double)p.top_p, (double)p.min_p, mods, d, want, got);
                if (want != got) break;
                compared += count >= 0, fell_back += count < 0, with_extras += count >= 0 && n_ex > 0;
                g4_sampler_accept(a, want), g4_sampler_accept(b, got);
            }
            g4_sampler_free(a);
            g4_sampler_free(b);
        }
        free(x), free(vals), free(ids), free(pa), free(pb);
    }
    CHECKF(compared > 1000 && fell_back > 0 && with_extras > 500 && probs_compared == compared,
           "rows compared %d (%d with modified ids, %d distributions), rows beyond cap or k %d", compared, with_extras,
           probs_compared, fell_back);
    /* the samplers that need the whole row */
    g4_sampler_params p;
    g4_sampler_params_default(&p);
    p.top_k = 0;
    g4_sampler *s = make(&p, 100);
    CHECKF(g4_sampler_candidates_k(s) == 0, "no top-k: whole row");
    g4_sampler_free(s);
    p.top_k = G4_SAMPLER_CANDIDATES_MAX + 1;
    s = make(&p, 5000);
    CHECKF(g4_sampler_candidates_k(s) == 0, "top_k above the limit: whole row");
    g4_sampler_free(s);
    /* a penalty history beyond the limit: whole rows; modified ids without their logits: no draw */
    p.top_k = 40, p.presence_penalty = 0.5f;
    s = make(&p, 5000);
    CHECKF(g4_sampler_candidates_k(s) == 40, "penalties, no history yet: k %d", g4_sampler_candidates_k(s));
    for (int i = 0; i < G4_SAMPLER_CANDIDATES_MAX; i++) g4_sampler_accept(s, i);
    CHECKF(g4_sampler_candidates_k(s) == 0, "penalty history of %d ids: whole row", G4_SAMPLER_CANDIDATES_MAX);
    g4_sampler_free(s);
    s = make(&p, 5000);
    g4_sampler_accept(s, 7);
    int32_t one_id = 7;
    float one_val = 1.0f;
    CHECKF(g4_sampler_candidates_k(s) == 64 && g4_sampler_sample_candidates(s, &one_id, &one_val, 1, NULL) == -1,
           "penalties without the extras' logits: no draw");
    g4_sampler_free(s);
    g4_backend_free(be);
}

static void test_seeds(void) {
    const int V = 1000;
    float *x = malloc(V * sizeof *x);
    for (int i = 0; i < V; i++) x[i] = (float)(nrand() * 0.5);
    g4_sampler_params p;
    g4_sampler_params_default(&p);
    for (int mode = 0; mode < 3; mode++) {
        p.top_k = mode == 1 ? 100 : 0;
        p.top_p = mode == 2 ? 0.9f : 1.0f;
        int32_t a[300], b[300], c[300];
        p.seed = 42;
        g4_sampler *s1 = make(&p, V), *s2 = make(&p, V);
        p.seed = 43;
        g4_sampler *s3 = make(&p, V);
        for (int i = 0; i < 300; i++) {
            a[i] = g4_sampler_sample(s1, x);
            b[i] = g4_sampler_sample(s2, x);
            c[i] = g4_sampler_sample(s3, x);
        }
        CHECKF(memcmp(a, b, sizeof a) == 0, "mode %d: same seed, different sequences", mode);
        int same = 0;
        for (int i = 0; i < 300; i++) same += a[i] == c[i];
        CHECKF(same < 30, "mode %d: seeds 42 and 43 agree on %d of 300 draws", mode, same);
        /* reseeding restarts the sequence; reset keeps the random state */
        g4_sampler_seed(s1, 42);
        int again = 1;
        for (int i = 0; i < 300; i++) again &= g4_sampler_sample(s1, x) == a[i];
        CHECKF(again, "mode %d: g4_sampler_seed does not restart the sequence", mode);
        g4_sampler_free(s1);
        g4_sampler_free(s2);
        g4_sampler_free(s3);
    }
    free(x);
}

static void test_penalties(void) {
    enum { V = 12, HIST = 20, TRIALS = 400 };
    float x[V];
    int32_t hist[HIST];
    int fails = 0;
    for (int t = 0; t < TRIALS; t++) {
        g4_sampler_params p;
        g4_sampler_params_default(&p);
        p.temperature = 0.0f;
        int kind = t % 4;
        p.repetition_penalty = kind == 0 || kind == 3 ? (float)(1.0 + urand() * 1.5) : 1.0f;
        if (t % 8 == 7) p.repetition_penalty = (float)(0.5 + urand() * 0.4); /* < 1 boosts */
        p.presence_penalty = kind == 1 || kind == 3 ? (float)(urand() * 2.0 - 0.5) : 0.0f;
        p.frequency_penalty = kind == 2 || kind == 3 ? (float)(urand() * 1.0) : 0.0f;
        p.penalty_last_n = t % 3 == 0 ? -1 : 1 + (int)(urand() * 10);
        for (int i = 0; i < V; i++) x[i] = (float)(nrand() * 2.0);
        int n_hist = 1 + (int)(urand() * HIST);
        for (int i = 0; i < n_hist; i++) hist[i] = (int32_t)(urand() * 6); /* repeats of ids 0..5 */
        double adj[V];
        ref_adjust(x, V, &p, hist, n_hist, adj);
        int want = 0;
        for (int i = 1; i < V; i++)
            if (adj[i] > adj[want]) want = i;
        g4_sampler *s = make(&p, V);
        g4_sampler_accept(s, -5);  /* out of range: ignored */
        g4_sampler_accept(s, V);
        g4_sampler_accept_many(s, hist, n_hist);
        int got = g4_sampler_sample(s, x);
        if (got != want) {
            if (fails < 5)
                fprintf(stderr, "penalty trial %d: got %d want %d (rp %.3f pres %.3f freq %.3f last_n %d)\n", t,
                        got, want, p.repetition_penalty, p.presence_penalty, p.frequency_penalty,
                        p.penalty_last_n);
            fails++;
        }
        /* the same with sampling: the whole distribution */
        g4_sampler_free(s);
        p.temperature = 0.9f;
        p.top_k = t % 2 ? 6 : 0;
        s = make(&p, V);
        g4_sampler_accept_many(s, hist, n_hist);
        if (t < 40) check_probs(s, x, V, &p, hist, n_hist, "penalties, sampling");
        /* reset forgets the history */
        g4_sampler_reset(s);
        g4_sampler_params q = p;
        q.repetition_penalty = 1.0f;
        q.presence_penalty = q.frequency_penalty = 0.0f;
        if (t < 40) check_probs(s, x, V, &q, NULL, 0, "penalties after reset");
        g4_sampler_free(s);
    }
    CHECKF(fails == 0, "penalties: %d of %d greedy picks differ from the HF/OpenAI formulas", fails, TRIALS);

    /* a hand-made case: each penalty alone flips the greedy choice */
    float row[4] = {2.0f, 1.9f, -0.5f, -0.45f};
    int32_t seen[3] = {0, 0, 3};
    struct {
        float rp, pres, freq;
        int want;
    } hand[] = {
        {1.0f, 0.0f, 0.0f, 0},  /* no penalty */
        {1.1f, 0.0f, 0.0f, 1},  /* 2.0/1.1 = 1.82 < 1.9 */
        {1.0f, 0.2f, 0.0f, 1},  /* 2.0 - 0.2 */
        {1.0f, 0.0f, 0.06f, 1}, /* 2.0 - 2*0.06 = 1.88 */
        {1.0f, 0.0f, 0.04f, 0}, /* 2.0 - 0.08 = 1.92 */
    };
    for (int h = 0; h < 5; h++) {
        g4_sampler_params p;
        g4_sampler_params_default(&p);
        p.temperature = 0.0f;
        p.repetition_penalty = hand[h].rp;
        p.presence_penalty = hand[h].pres;
        p.frequency_penalty = hand[h].freq;
        g4_sampler *s = make(&p, 4);
        g4_sampler_accept_many(s, seen, 3);
        CHECKF(g4_sampler_sample(s, row) == hand[h].want, "hand case %d", h);
        g4_sampler_free(s);
    }
    /* negative logits are multiplied: with only ids 2 and 3 allowed, -0.45*1.2 < -0.5 */
    {
        g4_sampler_params p;
        g4_sampler_params_default(&p);
        p.temperature = 0.0f;
        p.repetition_penalty = 1.2f;
        int32_t banned[2] = {0, 1};
        p.suppress_ids = banned;
        p.n_suppress = 2;
        g4_sampler *s = make(&p, 4);
        CHECK(g4_sampler_sample(s, row) == 3);
        g4_sampler_accept(s, 3);
        CHECK(g4_sampler_sample(s, row) == 2);
        g4_sampler_free(s);
    }
    /* prompt ids for the repetition penalty only (vLLM's apply_penalties: repetition over the prompt's and the
     * output's ids, presence and frequency over the output's counts), outside the window; reset forgets them */
    for (int t = 0; t < 200; t++) {
        enum { PV = 12 };
        g4_sampler_params p;
        g4_sampler_params_default(&p);
        p.temperature = t % 2 ? 0.0f : 0.9f;
        p.repetition_penalty = t % 5 == 4 ? (float)(0.5 + urand() * 0.4) : (float)(1.1 + urand() * 2.0);
        p.presence_penalty = (float)(urand() * 1.5);
        p.frequency_penalty = (float)(urand() * 0.8);
        p.penalty_last_n = t % 3 == 0 ? -1 : 1 + (int)(urand() * 6);
        float px[PV];
        for (int i = 0; i < PV; i++) px[i] = (float)(nrand() * 2.0);
        int32_t prompt[10], out[10];
        const int n_prompt = 1 + (int)(urand() * 10), n_out = (int)(urand() * 10);
        for (int i = 0; i < n_prompt; i++) prompt[i] = (int32_t)(urand() * 8);
        for (int i = 0; i < n_out; i++) out[i] = (int32_t)(urand() * 8);
        double adj[PV];
        ref_adjust(px, PV, &p, out, n_out, adj); /* the output's ids: all three penalties */
        int in_window[PV] = {0};
        for (int i = n_out > p.penalty_last_n && p.penalty_last_n > 0 ? n_out - p.penalty_last_n : 0; i < n_out; i++)
            in_window[out[i]] = 1;
        int done[PV] = {0};
        for (int i = 0; i < n_prompt; i++) { /* the prompt's others: the repetition penalty alone */
            const int id = prompt[i];
            if (in_window[id] || done[id]) continue;
            done[id] = 1;
            adj[id] = adj[id] < 0 ? adj[id] * p.repetition_penalty : adj[id] / p.repetition_penalty;
        }
        g4_sampler *s = make(&p, PV);
        CHECK(g4_sampler_accept_prompt(s, prompt, n_prompt) == 0);
        g4_sampler_accept_many(s, out, n_out);
        float got[PV];
        const int nz = g4_sampler_probs(s, px, got);
        double want[PV], z = 0, m = -INFINITY, worst = 0;
        int best = 0;
        for (int i = 0; i < PV; i++) m = adj[i] > m ? adj[i] : m, best = adj[i] > adj[best] ? i : best;
        for (int i = 0; i < PV; i++) z += want[i] = p.temperature > 0 ? exp((adj[i] - m) / p.temperature) : i == best;
        for (int i = 0; i < PV; i++) worst = fmax(worst, fabs(got[i] - want[i] / z));
        CHECKF(nz > 0 && worst < 1e-5, "prompt ids for the repetition penalty, trial %d: probabilities off by %.2e",
               t, worst);
        if (p.temperature == 0.0f)
            CHECKF(g4_sampler_sample(s, px) == best, "prompt ids, greedy trial %d: want %d", t, best);
        g4_sampler_reset(s);
        g4_sampler_params q = p;
        q.repetition_penalty = 1.0f, q.presence_penalty = q.frequency_penalty = 0.0f;
        check_probs(s, px, PV, &q, NULL, 0, "prompt ids after a reset");
        g4_sampler_free(s);
    }
    /* the window: only the last penalty_last_n ids count */
    {
        g4_sampler_params p;
        g4_sampler_params_default(&p);
        p.temperature = 0.0f;
        p.repetition_penalty = 2.0f;
        p.penalty_last_n = 2;
        g4_sampler *s = make(&p, 4);
        g4_sampler_accept(s, 0);
        CHECK(g4_sampler_sample(s, row) == 1);
        g4_sampler_accept(s, 2);
        g4_sampler_accept(s, 2);
        CHECK(g4_sampler_sample(s, row) == 0); /* id 0 left the window */
        g4_sampler_free(s);
    }
}

/* Speculative decoding's helpers: a rewind takes accepted ids back out of the window (the distribution is the one
 * of the shorter history), within G4_SAMPLER_REWIND_MAX of the longest history; is_greedy; draw from weights. */
static void test_rewind_draw(void) {
    enum { V = 12, HIST = 30, EXTRA = 20 };
    float x[V];
    int32_t hist[HIST + EXTRA];
    for (int t = 0; t < 60; t++) {
        g4_sampler_params p;
        g4_sampler_params_default(&p);
        p.temperature = 0.9f;
        p.repetition_penalty = 1.5f;
        p.frequency_penalty = 0.3f;
        p.penalty_last_n = t % 3 == 0 ? -1 : 1 + (int)(urand() * 10);
        for (int i = 0; i < V; i++) x[i] = (float)(nrand() * 2.0);
        int n_hist = 1 + (int)(urand() * HIST), n_extra = 1 + (int)(urand() * EXTRA);
        for (int i = 0; i < n_hist + n_extra; i++) hist[i] = (int32_t)(urand() * 8);
        g4_sampler *s = make(&p, V);
        g4_sampler_accept_many(s, hist, n_hist + n_extra);
        check_probs(s, x, V, &p, hist, n_hist + n_extra, "before a rewind");
        CHECK(g4_sampler_rewind(s, n_extra) == 0);
        check_probs(s, x, V, &p, hist, n_hist, "after a rewind");
        /* accept other ids, rewind again */
        g4_sampler_accept(s, 11);
        g4_sampler_accept(s, 10);
        CHECK(g4_sampler_rewind(s, 2) == 0);
        check_probs(s, x, V, &p, hist, n_hist, "after a second rewind");
        CHECK(g4_sampler_rewind(s, n_hist + 1) != 0);
        check_probs(s, x, V, &p, hist, n_hist, "after a refused rewind");
        g4_sampler_free(s);
    }
    g4_sampler_params p;
    g4_sampler_params_default(&p);
    p.repetition_penalty = 1.2f;
    p.penalty_last_n = 4;
    g4_sampler *s = make(&p, V);
    for (int i = 0; i < G4_SAMPLER_REWIND_MAX + 10; i++) g4_sampler_accept(s, i % V);
    CHECK(g4_sampler_rewind(s, G4_SAMPLER_REWIND_MAX + 1) != 0); /* beyond what the ring keeps */
    CHECK(g4_sampler_rewind(s, G4_SAMPLER_REWIND_MAX) == 0);
    CHECK(g4_sampler_rewind(s, 1) != 0);
    CHECK(!g4_sampler_is_greedy(s) && !g4_sampler_is_argmax(s));
    g4_sampler_free(s);
    p.temperature = 0;
    s = make(&p, V);
    CHECK(g4_sampler_is_greedy(s) && !g4_sampler_is_argmax(s));
    g4_sampler_free(s);
    g4_sampler_params_default(&p);
    p.temperature = 0;
    s = make(&p, V);
    CHECK(g4_sampler_is_greedy(s) && g4_sampler_is_argmax(s));
    /* draws from weights: proportions, zero weights never drawn, all zero is -1 */
    float w[V] = {0};
    w[2] = 1.0f, w[5] = 3.0f, w[11] = 0.5f;
    long cnt[V] = {0};
    const int N = 45000;
    for (int i = 0; i < N; i++) {
        int32_t id = g4_sampler_draw(s, w);
        if (id >= 0 && id < V) cnt[id]++;
    }
    CHECK(cnt[2] + cnt[5] + cnt[11] == N);
    CHECKF(fabs(cnt[5] / (double)N - 3.0 / 4.5) < 0.01 && fabs(cnt[11] / (double)N - 0.5 / 4.5) < 0.01,
           "draws: %ld %ld %ld", cnt[2], cnt[5], cnt[11]);
    float zero[V] = {0};
    CHECK(g4_sampler_draw(s, zero) == -1);
    double u = g4_sampler_uniform(s);
    CHECK(u >= 0 && u < 1);
    g4_sampler_free(s);
}

/* The modified ids and candidates' k a verification row will have after drafts (g4_sampler_candidate_extras_after):
 * as a set, those of a sampler that accepted the drafts; the sampler itself as it was (the same distributions, the
 * same rewinds allowed, the same draws as a twin that was never asked). */
static int cmp_i32(const void *pa, const void *pb) {
    const int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    return (a > b) - (a < b);
}

static void test_extras_after(void) {
    enum { V = 64, HIST = 40, DRAFTS = 12 };
    float x[V];
    int32_t hist[HIST], drafts[DRAFTS], a[V + 8], b[V + 8];
    for (int t = 0; t < 80; t++) {
        g4_sampler_params p;
        g4_sampler_params_default(&p);
        p.temperature = t % 4 == 0 ? 0.0f : 0.8f;
        p.top_k = 8;
        p.repetition_penalty = 1.3f;
        p.presence_penalty = t % 2 ? 0.2f : 0.0f;
        p.penalty_last_n = t % 3 == 0 ? -1 : 2 + (int)(urand() * 12);
        p.seed = 99u + (unsigned)t;
        for (int i = 0; i < V; i++) x[i] = (float)(nrand() * 2.0);
        const int n_hist = (int)(urand() * HIST);
        for (int i = 0; i < n_hist; i++) hist[i] = (int32_t)(urand() * 20);
        for (int i = 0; i < DRAFTS; i++) drafts[i] = (int32_t)(urand() * V); /* mostly ids the history lacks */
        g4_sampler *s = make(&p, V), *twin = make(&p, V);
        g4_sampler_accept_many(s, hist, n_hist);
        g4_sampler_accept_many(twin, hist, n_hist);
        for (int j = 0; j <= DRAFTS; j++) {
            int k = -1;
            const int ne = g4_sampler_candidate_extras_after(s, drafts, j, a, &k);
            g4_sampler *w = make(&p, V);
            g4_sampler_accept_many(w, hist, n_hist);
            g4_sampler_accept_many(w, drafts, j);
            const int nw = g4_sampler_candidate_extras(w, b);
            qsort(a, (size_t)ne, sizeof *a, cmp_i32);
            qsort(b, (size_t)nw, sizeof *b, cmp_i32);
            CHECKF(ne == nw && !memcmp(a, b, (size_t)ne * sizeof *a) && k == g4_sampler_candidates_k(w),
                   "case %d: after %d drafts %d modified ids (k %d), a sampler that accepted them %d (k %d)", t, j, ne,
                   k, nw, g4_sampler_candidates_k(w));
            g4_sampler_free(w);
        }
        /* left as it was: the twin's distribution, rewinds and draws */
        check_probs(s, x, V, &p, hist, n_hist, "after extras_after");
        CHECK(g4_sampler_rewind(s, n_hist) == g4_sampler_rewind(twin, n_hist));
        g4_sampler_accept_many(s, drafts, DRAFTS);
        g4_sampler_accept_many(twin, drafts, DRAFTS);
        for (int d = 0; d < 20; d++) CHECK(g4_sampler_sample(s, x) == g4_sampler_sample(twin, x));
        g4_sampler_free(s);
        g4_sampler_free(twin);
    }
}

static void test_bias_suppress(void) {
    const int V = 30;
    float x[30];
    for (int i = 0; i < V; i++) x[i] = (float)(nrand() * 1.5);
    x[5] = 6.0f; /* dominant */
    x[6] = 5.5f;
    int32_t sup[2] = {5, 29};
    int32_t bias_ids[4] = {6, 7, 7, 8};
    float bias_vals[4] = {-INFINITY, 1.0f, 0.5f, -2.0f}; /* repeated id 7 adds up */
    for (int mode = 0; mode < 4; mode++) {
        g4_sampler_params p;
        g4_sampler_params_default(&p);
        p.suppress_ids = sup;
        p.n_suppress = 2;
        p.bias_ids = bias_ids;
        p.bias_values = bias_vals;
        p.n_bias = 4;
        p.top_k = mode == 1 ? 8 : 0;
        p.top_p = mode == 2 ? 0.9f : 1.0f;
        p.min_p = mode == 3 ? 0.05f : 0.0f;
        p.seed = 5 + mode;
        g4_sampler *s = make(&p, V);
        char label[64];
        snprintf(label, sizeof label, "bias + suppress mode %d", mode);
        check_probs(s, x, V, &p, NULL, 0, label);
        check_draws(s, x, V, &p, NULL, 0, 20000, label); /* includes: 5, 6 and 29 never drawn */
        g4_sampler_free(s);
        p.temperature = 0.0f;
        s = make(&p, V);
        double adj[30];
        ref_adjust(x, V, &p, NULL, 0, adj);
        int want = 0;
        for (int i = 1; i < V; i++)
            if (adj[i] > adj[want]) want = i;
        CHECKF(g4_sampler_sample(s, x) == want, "greedy with bias/suppress: want %d", want);
        g4_sampler_free(s);
    }
    /* the caller's arrays are copied */
    g4_sampler_params p;
    g4_sampler_params_default(&p);
    p.temperature = 0.0f;
    int32_t ids[1] = {5};
    p.suppress_ids = ids;
    p.n_suppress = 1;
    g4_sampler *s = make(&p, V);
    ids[0] = 0;
    CHECK(g4_sampler_sample(s, x) == 6);
    CHECK(g4_sampler_get_params(s)->suppress_ids[0] == 5);
    g4_sampler_free(s);
    /* everything suppressed: -1 */
    int32_t all[30];
    for (int i = 0; i < V; i++) all[i] = i;
    p.suppress_ids = all;
    p.n_suppress = V;
    s = make(&p, V);
    CHECK(g4_sampler_sample(s, x) == -1);
    g4_sampler_free(s);
}

/* ------------------------------------------------------------------ generation_config */

static int write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fputs(text, f);
    return fclose(f);
}

static void test_generation_config(void) {
    g4_generation_config gc;
    g4_error err;
    const char *fixtures[] = {"audio", "dense-keqv", "dense-ple", "moe", "unified", "vision"};
    for (int i = 0; i < 6; i++) {
        char dir[512];
        snprintf(dir, sizeof dir, "fixtures/%s", fixtures[i]);
        memset(&err, 0, sizeof err);
        int rc = g4_generation_config_load(g4t_shared(dir), &gc, &err);
        CHECKF(rc == 0, "%s: %s", dir, err.msg);
        if (rc) continue;
        CHECKF(gc.from_file && gc.n_eos == 1 && gc.eos_ids[0] == 1 && gc.pad_id == 0 && gc.bos_id == 2,
               "%s: eos/pad/bos", dir);
        CHECKF(gc.do_sample == 0 && gc.sampling.temperature == 0.0f, "%s: greedy by default", dir);
        CHECK(g4_generation_config_is_eos(&gc, 1) && !g4_generation_config_is_eos(&gc, 106));
        CHECK(gc.max_new_tokens == -1 && g4_generation_config_max_new(&gc, 10) == -1 && gc.warnings == NULL);
        g4_generation_config_free(&gc);
    }

    /* the instruction-tuned example model: unpack its two config files */
    const char *tmpdir = g4t_tmp("sampler-tolstoy");
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "rm -rf '%s' && mkdir -p '%s' && tar -xJf '%s' -C '%s' --occurrence=1 "
             "tolstoy-tiny/generation_config.json tolstoy-tiny/config.json 2>/dev/null",
             tmpdir, tmpdir, g4t_shared("models/tolstoy-tiny.tar.xz"), tmpdir);
    if (system(cmd) == 0) {
        char dir[2100];
        snprintf(dir, sizeof dir, "%s/tolstoy-tiny", tmpdir);
        memset(&err, 0, sizeof err);
        int rc = g4_generation_config_load(dir, &gc, &err);
        CHECKF(rc == 0, "tolstoy-tiny: %s", err.msg);
        if (rc == 0) {
            CHECK(gc.do_sample == 1 && gc.sampling.temperature == 1.0f && gc.sampling.top_k == 64);
            CHECK(fabsf(gc.sampling.top_p - 0.95f) < 1e-7f && gc.sampling.min_p == 0.0f);
            CHECK(gc.n_eos == 3 && gc.eos_ids[0] == 1 && gc.eos_ids[1] == 106 && gc.eos_ids[2] == 50);
            CHECK(g4_generation_config_is_eos(&gc, 50) && !g4_generation_config_is_eos(&gc, 2));
            CHECK(gc.n_suppress == 0 && gc.pad_id == 0 && gc.bos_id == 2);
            CHECKF(gc.warnings == NULL, "a published -it generation_config.json draws warnings: %s", gc.warnings);
            g4_sampler *s = NULL;
            CHECK(g4_sampler_new(&gc.sampling, 262144, &s, &err) == 0);
            g4_sampler_free(s);
            g4_generation_config_free(&gc);
        }
    } else {
        fprintf(stderr, "note: could not unpack tolstoy-tiny (tar/xz missing?); skipped that part\n");
    }

    /* no generation_config.json: greedy defaults, eos from config.json (top level, then text_config) */
    const char *d1 = g4t_tmp("sampler-gc-e2b");
    mkdir(d1, 0755);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s/config.json' && rm -f '%s/generation_config.json'",
             g4t_shared("configs/gemma-4-e2b.json"), d1, d1);
    if (system(cmd) == 0) {
        memset(&err, 0, sizeof err);
        CHECKF(g4_generation_config_load(d1, &gc, &err) == 0, "e2b config: %s", err.msg);
        CHECK(!gc.from_file && gc.sampling.temperature == 0.0f);
        CHECK(gc.n_eos == 3 && gc.eos_ids[0] == 1 && gc.eos_ids[1] == 106 && gc.eos_ids[2] == 50);
        g4_generation_config_free(&gc);
    }
    const char *d2 = g4t_tmp("sampler-gc-textonly");
    mkdir(d2, 0755);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s/config.json' && rm -f '%s/generation_config.json'",
             g4t_shared("fixtures/dense-ple/config.json"), d2, d2);
    if (system(cmd) == 0) {
        memset(&err, 0, sizeof err);
        CHECKF(g4_generation_config_load(d2, &gc, &err) == 0, "text_config eos: %s", err.msg);
        CHECK(gc.n_eos == 1 && gc.eos_ids[0] == 1);
        g4_generation_config_free(&gc);
    }
    /* nothing at all: defaults, no error */
    memset(&err, 0, sizeof err);
    CHECK(g4_generation_config_load(g4t_tmp("sampler-no-such-dir"), &gc, &err) == 0 && gc.n_eos == 0);
    g4_generation_config_free(&gc);

    /* explicit files: suppress_tokens, lengths, greedy with do_sample false */
    const char *gp = g4t_tmp("sampler-gc.json");
    write_file(gp, "{\"do_sample\": true, \"temperature\": 0.7, \"top_p\": 0.9, \"suppress_tokens\": "
                   "[258883, 258882], \"eos_token_id\": 106, \"max_new_tokens\": 100, \"max_length\": 50,"
                   " \"repetition_penalty\": 1.1, \"min_p\": 0.05}");
    memset(&err, 0, sizeof err);
    CHECKF(g4_generation_config_load_files(gp, NULL, &gc, &err) == 0, "explicit: %s", err.msg);
    CHECK(gc.sampling.temperature == 0.7f && gc.sampling.top_k == 50 && gc.sampling.top_p == 0.9f);
    CHECK(gc.sampling.min_p == 0.05f && gc.sampling.repetition_penalty == 1.1f);
    CHECK(gc.n_suppress == 2 && gc.suppress_ids[0] == 258883 && gc.sampling.n_suppress == 2 &&
          gc.sampling.suppress_ids == gc.suppress_ids);
    CHECK(gc.n_eos == 1 && gc.eos_ids[0] == 106);
    CHECK(g4_generation_config_max_new(&gc, 30) == 100);
    g4_generation_config_free(&gc);
    write_file(gp, "{\"max_length\": 50, \"do_sample\": false, \"temperature\": 0.7}");
    CHECK(g4_generation_config_load_files(gp, NULL, &gc, &err) == 0);
    CHECK(g4_generation_config_max_new(&gc, 30) == 20 && g4_generation_config_max_new(&gc, 60) == 0);
    CHECK(gc.sampling.temperature == 0.0f && gc.temperature == 0.7f);
    g4_generation_config_free(&gc);

    /* Sampling-only values out of range with do_sample false: transformers warns and decodes greedily
     * (GenerationConfig.validate() 2.1, "minor issues"; its warpers that refuse them are only built for sampling),
     * so the model loads and they are ignored (defaults kept). top_p 0 is valid there (TopPLogitsWarper accepts
     * [0, 1] and keeps min_tokens_to_keep = 1 token: top_k 1). A negative eos id only draws a warning in
     * transformers (_prepare_special_tokens) and never matches: it is dropped, not an error. */
    write_file(gp, "{\"do_sample\": false, \"top_p\": 1.5, \"temperature\": -1, \"top_k\": -3, \"min_p\": 2}");
    CHECKF(g4_generation_config_load_files(gp, NULL, &gc, &err) == 0, "greedy, warped values: %s", err.msg);
    CHECK(gc.sampling.temperature == 0.0f && gc.temperature == 1.0f && gc.sampling.top_k == 50 &&
          gc.sampling.top_p == 1.0f && gc.sampling.min_p == 0.0f);
    g4_generation_config_free(&gc);
    write_file(gp, "{\"do_sample\": true, \"top_p\": 0.0, \"top_k\": 0}");
    CHECKF(g4_generation_config_load_files(gp, NULL, &gc, &err) == 0, "top_p 0: %s", err.msg);
    CHECK(gc.sampling.temperature == 1.0f && gc.sampling.top_k == 1 && gc.sampling.top_p == 1.0f);
    g4_generation_config_free(&gc);
    write_file(gp, "{\"eos_token_id\": [1, -2, 106]}");
    CHECKF(g4_generation_config_load_files(gp, NULL, &gc, &err) == 0, "eos -2: %s", err.msg);
    CHECK(gc.n_eos == 2 && gc.eos_ids[0] == 1 && gc.eos_ids[1] == 106);
    g4_generation_config_free(&gc);
    write_file(gp, "{\"pad_token_id\": -5, \"bos_token_id\": -2}");
    CHECKF(g4_generation_config_load_files(gp, NULL, &gc, &err) == 0, "pad -5: %s", err.msg);
    CHECK(gc.pad_id == -1 && gc.bos_id == -1);
    g4_generation_config_free(&gc);
    write_file(gp, "{\"eos_token_id\": -1}");
    CHECKF(g4_generation_config_load_files(gp, NULL, &gc, &err) == 0, "eos -1: %s", err.msg);
    CHECK(gc.n_eos == 0);
    g4_generation_config_free(&gc);

    /* fields transformers acts on and this engine does not: one warning line each, naming the field; values
     * that change nothing there (and sampling-only ones without do_sample) draw none */
    write_file(gp, "{\"no_repeat_ngram_size\": 3, \"bad_words_ids\": [[5, 6]], \"min_new_tokens\": 4, \"min_length\": 9,"
                   " \"begin_suppress_tokens\": [7], \"forced_eos_token_id\": 1, \"sequence_bias\": [[[5], -1.0]],"
                   " \"num_beams\": 4, \"stop_strings\": [\"x\"], \"do_sample\": true, \"typical_p\": 0.5}");
    memset(&err, 0, sizeof err);
    CHECKF(g4_generation_config_load_files(gp, NULL, &gc, &err) == 0, "ignored fields: %s", err.msg);
    {
        const char *keys[] = {"no_repeat_ngram_size", "bad_words_ids", "min_new_tokens", "min_length", "begin_suppress_tokens",
                              "forced_eos_token_id", "sequence_bias", "num_beams", "stop_strings", "typical_p"};
        int lines = 0;
        for (const char *w = gc.warnings; w && *w; w++) lines += *w == '\n';
        CHECKF(lines == 10, "%d warning lines for 10 ignored fields:\n%s", lines, gc.warnings ? gc.warnings : "");
        for (int i = 0; i < 10; i++) {
            char quoted[64];
            snprintf(quoted, sizeof quoted, "\"%s\"", keys[i]);
            CHECKF(gc.warnings && strstr(gc.warnings, quoted), "no warning for %s", keys[i]);
        }
    }
    g4_generation_config_free(&gc);
    CHECK(gc.warnings == NULL);
    write_file(gp, "{\"no_repeat_ngram_size\": 0, \"bad_words_ids\": null, \"min_new_tokens\": 0, \"num_beams\": 1,"
                   " \"begin_suppress_tokens\": [], \"remove_invalid_values\": false, \"typical_p\": 0.5, \"top_h\": 0.3,"
                   " \"encoder_repetition_penalty\": 1.0, \"guidance_scale\": null, \"epsilon_cutoff\": 0.0}");
    CHECKF(g4_generation_config_load_files(gp, NULL, &gc, &err) == 0 && gc.warnings == NULL,
           "fields that change nothing: %s / %s", err.msg, gc.warnings ? gc.warnings : "");
    g4_generation_config_free(&gc);
    /* do_sample with temperature 0: transformers refuses to generate (TemperatureLogitsWarper); greedy here, said */
    write_file(gp, "{\"do_sample\": true, \"temperature\": 0.0, \"top_k\": 64}");
    CHECKF(g4_generation_config_load_files(gp, NULL, &gc, &err) == 0, "temperature 0: %s", err.msg);
    CHECK(gc.sampling.temperature == 0.0f && gc.warnings && strstr(gc.warnings, "\"temperature\" 0"));
    g4_generation_config_free(&gc);
    /* JSON types as transformers' processors check them: an integer temperature of 1 or a top_k of 64 loads, and
     * anything goes without do_sample (no warper is built) */
    const char *typed_ok[] = {"{\"do_sample\": true, \"temperature\": 1, \"top_k\": 64, \"top_p\": 1, \"min_p\": 0}",
                              "{\"do_sample\": false, \"temperature\": 2, \"top_k\": 64.0}",
                              "{\"do_sample\": true, \"top_k\": 0.0, \"repetition_penalty\": 1}"};
    for (int i = 0; i < 3; i++) {
        write_file(gp, typed_ok[i]);
        memset(&err, 0, sizeof err);
        CHECKF(g4_generation_config_load_files(gp, NULL, &gc, &err) == 0 && gc.warnings == NULL, "%s: %s", typed_ok[i],
               err.msg);
        g4_generation_config_free(&gc);
    }

    /* the types transformers' warpers refuse when generating: a warning each, the numbers used */
    const struct {
        const char *text, *want;
        float temperature, repetition;
        int top_k;
    } typed_warn[] = {
        {"{\"do_sample\": true, \"temperature\": 2}", "\"temperature\" 2 is an integer", 2.0f, 1.0f, 50},
        {"{\"do_sample\": true, \"top_k\": 64.0}", "\"top_k\" 64 is not an integer", 1.0f, 1.0f, 64},
        {"{\"repetition_penalty\": 2}", "\"repetition_penalty\" 2 is an integer", 0.0f, 2.0f, 50},
    };
    for (int i = 0; i < 3; i++) {
        write_file(gp, typed_warn[i].text);
        memset(&err, 0, sizeof err);
        CHECKF(g4_generation_config_load_files(gp, NULL, &gc, &err) == 0 && gc.warnings &&
                   strstr(gc.warnings, typed_warn[i].want) && gc.sampling.temperature == typed_warn[i].temperature &&
                   gc.sampling.repetition_penalty == typed_warn[i].repetition &&
                   (typed_warn[i].temperature == 0.0f || gc.sampling.top_k == typed_warn[i].top_k),
               "%s: %s / %s (temperature %g, top_k %d, repetition %g)", typed_warn[i].text, err.msg,
               gc.warnings ? gc.warnings : "", gc.sampling.temperature, gc.sampling.top_k,
               gc.sampling.repetition_penalty);
        g4_generation_config_free(&gc);
    }

    /* malformed files: one clear line naming the problem */
    struct {
        const char *text, *want;
    } bad[] = {
        {"{\"do_sample\": tru", "invalid JSON"},
        {"[1, 2]", "object"},
        {"{\"top_p\": \"high\"}", "top_p"},
        {"{\"do_sample\": true, \"top_p\": 1.5}", "top_p"},
        {"{\"do_sample\": true, \"temperature\": -1}", "temperature"},
        {"{\"do_sample\": true, \"top_k\": -3}", "top_k"},
        {"{\"do_sample\": true, \"min_p\": 2}", "min_p"},
        {"{\"do_sample\": 1}", "do_sample"},
        {"{\"eos_token_id\": \"x\"}", "eos_token_id"},
        {"{\"eos_token_id\": [1, 1e3]}", "eos_token_id"},
        {"{\"eos_token_id\": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}", "eos_token_id"},
        {"{\"suppress_tokens\": [1, \"a\"]}", "suppress_tokens"},
        {"{\"suppress_tokens\": 5}", "suppress_tokens"},
        {"{\"max_new_tokens\": 0}", "max_new_tokens"},
        {"{\"top_k\": 5, \"top_k\": 6}", "duplicate"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_file(gp, bad[i].text);
        memset(&err, 0, sizeof err);
        int rc = g4_generation_config_load_files(gp, NULL, &gc, &err);
        CHECKF(rc == -1 && strstr(err.msg, bad[i].want) && strstr(err.msg, "sampler-gc.json") &&
                   !strchr(err.msg, '\n'),
               "malformed %zu (%s): rc %d, '%s'", i, bad[i].text, rc, err.msg);
        CHECK(gc.suppress_ids == NULL);
    }
    /* a malformed config.json is an error too when it is needed for the eos ids */
    const char *cp = g4t_tmp("sampler-config-bad.json");
    write_file(cp, "{\"text_config\": {\"eos_token_id\": 1.5}}");
    write_file(gp, "{}");
    CHECK(g4_generation_config_load_files(gp, cp, &gc, &err) == -1 && strstr(err.msg, "eos_token_id"));
}

/* ------------------------------------------------------------------ stop strings */

typedef struct {
    char out[1024];
    size_t len;
    int stopped, which;
} stream_result;

static void stream(g4_stop_matcher *m, const char *text, const size_t *cuts, int n_cuts, stream_result *r) {
    g4_stop_reset(m);
    memset(r, 0, sizeof *r);
    r->which = -1;
    size_t pos = 0;
    g4_error err;
    g4_stop_result res;
    for (int i = 0; i <= n_cuts; i++) {
        size_t end = i < n_cuts ? cuts[i] : strlen(text);
        if (g4_stop_push(m, text + pos, end - pos, &res, &err)) return;
        memcpy(r->out + r->len, res.text, res.len);
        r->len += res.len;
        pos = end;
        if (res.stopped) {
            r->stopped = 1;
            r->which = res.which;
            return;
        }
    }
    g4_stop_flush(m, &res);
    memcpy(r->out + r->len, res.text, res.len);
    r->len += res.len;
}

static void test_stop_strings(void) {
    g4_error err;
    g4_stop_matcher *m = NULL;
    g4_stop_result r;
    const char *stops1[] = {"</s>", "STOP"};
    CHECK(g4_stop_new(stops1, 2, &m, &err) == 0);
    /* split across pushes: the partial "</" is held back */
    CHECK(g4_stop_push(m, "Hello </", 8, &r, &err) == 0);
    CHECK(r.len == 6 && memcmp(r.text, "Hello ", 6) == 0 && !r.stopped && g4_stop_held(m) == 2);
    CHECK(g4_stop_push(m, "s> more", 7, &r, &err) == 0);
    CHECK(r.stopped && r.which == 0 && r.len == 0);
    CHECK(g4_stop_push(m, "again", 5, &r, &err) == 0 && r.stopped && r.len == 0);
    /* a false start is released once it can no longer become a stop string */
    g4_stop_reset(m);
    CHECK(g4_stop_push(m, "a </", 4, &r, &err) == 0 && r.len == 2);
    CHECK(g4_stop_push(m, "b", 1, &r, &err) == 0 && r.len == 3 && memcmp(r.text, "</b", 3) == 0);
    CHECK(g4_stop_push(m, "ST", 2, &r, &err) == 0 && r.len == 0 && g4_stop_held(m) == 2);
    g4_stop_flush(m, &r);
    CHECK(r.len == 2 && memcmp(r.text, "ST", 2) == 0 && !r.stopped);
    /* text before the stop in the same push is emitted */
    g4_stop_reset(m);
    CHECK(g4_stop_push(m, "abc STOP def", 12, &r, &err) == 0 && r.stopped && r.which == 1 && r.len == 4 &&
          memcmp(r.text, "abc ", 4) == 0);
    g4_stop_free(m);

    /* overlapping prefixes: "bc" completes before "abcd" could */
    const char *stops2[] = {"abcd", "bc"};
    CHECK(g4_stop_new(stops2, 2, &m, &err) == 0);
    CHECK(g4_stop_push(m, "xab", 3, &r, &err) == 0 && r.len == 1 && g4_stop_held(m) == 2);
    CHECK(g4_stop_push(m, "c", 1, &r, &err) == 0 && r.stopped && r.which == 1 && r.len == 1 && r.text[0] == 'a');
    g4_stop_free(m);
    /* a self-overlapping stop string: "aab" inside "aaab" */
    const char *stops3[] = {"aab"};
    CHECK(g4_stop_new(stops3, 1, &m, &err) == 0);
    size_t total = 0;
    const char *pieces[] = {"a", "a", "a", "b"};
    int stopped = 0;
    for (int i = 0; i < 4; i++) {
        CHECK(g4_stop_push(m, pieces[i], 1, &r, &err) == 0);
        total += r.len;
        stopped = r.stopped;
    }
    CHECK(stopped && total == 1);
    g4_stop_free(m);
    /* no stop strings: everything passes through */
    CHECK(g4_stop_new(NULL, 0, &m, &err) == 0);
    CHECK(g4_stop_push(m, "anything", 8, &r, &err) == 0 && r.len == 8 && !r.stopped);
    g4_stop_free(m);
    const char *empty[] = {"ok", ""};
    CHECK(g4_stop_new(empty, 2, &m, &err) == -1 && strstr(err.msg, "empty"));

    /* property: any split gives what a whole-text search gives (earliest end, then longest) */
    const char *stops4[] = {"abcab", "bca", "cc", "ab", "cab"};
    CHECK(g4_stop_new(stops4, 5, &m, &err) == 0);
    const char alphabet[] = "abcd";
    int mismatches = 0, multi = 0;
    for (int t = 0; t < 3000; t++) {
        char text[64];
        int L = 1 + (int)(urand() * 40);
        double cut_p = (t % 3) * 0.25; /* 0: one push with the whole text */
        for (int i = 0; i < L; i++) text[i] = alphabet[(int)(urand() * (sizeof alphabet - 1))];
        text[L] = '\0';
        /* reference */
        size_t best_end = (size_t)-1, best_start = 0;
        int best = -1;
        for (int k = 0; k < 5; k++) {
            const char *p = strstr(text, stops4[k]);
            if (!p) continue;
            size_t st = (size_t)(p - text), en = st + strlen(stops4[k]);
            if (en < best_end || (en == best_end && st < best_start)) {
                best_end = en;
                best_start = st;
                best = k;
            }
        }
        int found = 0;
        for (int k = 0; k < 5; k++) found += strstr(text, stops4[k]) != NULL;
        multi += found > 1;
        size_t cuts[64];
        int nc = 0;
        for (int i = 1; i < L; i++)
            if (urand() < cut_p) cuts[nc++] = (size_t)i;
        stream_result sr;
        stream(m, text, cuts, nc, &sr);
        size_t want_len = best >= 0 ? best_start : (size_t)L;
        if (sr.stopped != (best >= 0) || sr.which != best || sr.len != want_len ||
            memcmp(sr.out, text, want_len) != 0)
            mismatches++;
    }
    CHECKF(mismatches == 0, "stop strings: %d of 3000 random splits differ from the whole-text search",
           mismatches);
    CHECKF(multi > 500, "stop strings: only %d texts hold several stop strings", multi);
    /* two stop strings complete in one push: the one ending first wins */
    g4_stop_reset(m);
    CHECK(g4_stop_push(m, "bcab", 4, &r, &err) == 0 && r.stopped && r.which == 1 && r.len == 0);
    g4_stop_reset(m);
    CHECK(g4_stop_push(m, "dcab", 4, &r, &err) == 0 && r.stopped && r.which == 4 && r.len == 1); /* tie: longer */
    g4_stop_reset(m);
    CHECK(g4_stop_push(m, "dd", 2, &r, &err) == 0 && !r.stopped && r.len == 2);
    CHECK(g4_stop_push(m, "dcc", 3, &r, &err) == 0 && r.stopped && r.which == 2 && r.len == 1);
    g4_stop_free(m);
}

/* ------------------------------------------------------------------ speed (reported only) */

static void test_speed(void) {
    const int V = 262144;
    float *x = malloc((size_t)V * sizeof *x);
    /* LLM-like: a Gaussian body and a handful of strong candidates */
    for (int i = 0; i < V; i++) x[i] = (float)(nrand() * 2.0);
    for (int i = 0; i < 20; i++) x[(int)(urand() * V)] = (float)(12.0 + 4.0 * urand());
    int32_t sup[2] = {258883, 258882};
    int32_t hist[512];
    for (int i = 0; i < 512; i++) hist[i] = (int32_t)(urand() * V);
    struct {
        const char *label;
        float temp, top_p, min_p, rep;
        int top_k, reps;
    } cases[] = {
        {"gemma defaults: top-k 64, top-p 0.95, 2 suppressed", 1.0f, 0.95f, 0.0f, 1.0f, 64, 200},
        {"greedy", 0.0f, 1.0f, 0.0f, 1.0f, 0, 200},
        {"top-k 64 + top-p 0.95 + repetition 1.1 over 512 ids", 1.0f, 0.95f, 0.0f, 1.1f, 64, 200},
        {"top-p 0.95 only", 1.0f, 0.95f, 0.0f, 1.0f, 0, 50},
        {"min-p 0.05 only", 1.0f, 1.0f, 0.05f, 1.0f, 0, 50},
        {"temperature 1 only (full softmax)", 1.0f, 1.0f, 0.0f, 1.0f, 0, 50},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        g4_sampler_params p;
        g4_sampler_params_default(&p);
        p.temperature = cases[c].temp;
        p.top_k = cases[c].top_k;
        p.top_p = cases[c].top_p;
        p.min_p = cases[c].min_p;
        p.repetition_penalty = cases[c].rep;
        p.suppress_ids = sup;
        p.n_suppress = 2;
        g4_sampler *s = make(&p, V);
        g4_sampler_accept_many(s, hist, 512);
        int invalid = 0;
        double t0 = now_us();
        for (int r = 0; r < cases[c].reps; r++) {
            int32_t id = g4_sampler_sample(s, x);
            invalid += id < 0 || id >= V || id == sup[0] || id == sup[1];
        }
        double us = (now_us() - t0) / cases[c].reps;
        CHECKF(invalid == 0, "speed %s: invalid ids", cases[c].label);
        fprintf(stderr, "speed V=%d %-55s %8.1f us/sample\n", V, cases[c].label, us);
        if (c == 0 || c == 3) { /* the large-vocabulary paths, exactly */
            g4_sampler_reset(s);
            check_probs(s, x, V, &p, NULL, 0, cases[c].label);
        }
        g4_sampler_free(s);
    }
    free(x);
}

#define RUN(fn)                                                                \
    do {                                                                       \
        double t_ = now_us();                                                  \
        fn();                                                                  \
        fprintf(stderr, "  %-26s %6.2f s\n", #fn, (now_us() - t_) * 1e-6);     \
    } while (0)

int main(void) {
    double t0 = now_us();
    RUN(test_validation);
    RUN(test_exp_variants);
    RUN(test_greedy);
    RUN(test_special_values);
    RUN(test_temperature);
    RUN(test_top_k);
    RUN(test_top_p_min_p);
    RUN(test_large_rows);
    RUN(test_candidates);
    RUN(test_seeds);
    RUN(test_penalties);
    RUN(test_rewind_draw);
    RUN(test_extras_after);
    RUN(test_bias_suppress);
    RUN(test_generation_config);
    RUN(test_stop_strings);
    RUN(test_speed);
    fprintf(stderr, "test_sampler: %.2f s\n", (now_us() - t0) * 1e-6);
    return g4t_done();
}
