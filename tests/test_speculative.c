/* Speculative decoding with the Gemma 4 assistant drafters (docs/gemma4-assistant.md) on
 * ../shared/fixtures/assistant, against transformers' assisted generation recorded there:
 * 1. both drafters: the 24 greedy ids, drafts and accepted drafts per round as reference.json; rounds 1 and 2
 *    step by step: position, drafter inputs, post_projection outputs and logits within DRAFT_TOL of
 *    reference.safetensors, the rows of the main cache each layer type attended to (counts of every round, and
 *    round 1's K/V values);
 * 2. greedy output equal to plain greedy decoding over many prompts (shorter and longer than the sliding window,
 *    chunked prefills, small KV blocks, several draft lengths, stop ids and a callback that stops), and the
 *    cache afterwards as a plain run leaves it: length, free blocks of both pools, bytes, and the logits of a
 *    further step;
 * 3. a greedy sampler with processors (penalty, bias) equal to plain decoding with the same sampler; speculative
 *    sampling draws the main model's own distribution (exact distribution of two tokens vs many seeded runs);
 * 4. the heuristic schedule; mismatched pairs and bad drafter files refused with one-line errors;
 * 5. NaN in the drafter's weights reported;
 * 6. images and audio in the prompt (the vision and audio fixtures with a drafter made for their hidden size):
 *    greedy output and cache equal to plain greedy decoding with the same inputs. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "engine/speculative.h"
#include "formats/safetensors.h"
#include "gemma4c.h"
#include "model_files.h"
#include "reference.h"

#define DRAFT_TOL 1e-4f /* drafter inputs, hidden outputs and logits vs transformers (the numpy port: 6.8e-6) */
#define KV_TOL 1e-4f
#define LOGIT_TOL 2e-3f /* main-model logits after different batchings (as tests/test_decoder.c) */
#define EOS 1           /* the fixture's eos_token_id */

static char FIX[4096];

static const char *fix_path(const char *rel) {
    static char bufs[4][4096];
    static int k;
    char *b = bufs[k++ & 3];
    snprintf(b, sizeof bufs[0], "%s/%s", FIX, rel);
    return b;
}

static g4_model *load_main(const char *dir) {
    g4_error err;
    g4_model *m = NULL;
    /* on the CPU: the checks read the KV cache as host memory, and equality with plain greedy decoding is exact
     * only where a step of k + 1 tokens computes each row as a step of one does (the CUDA backend's batched
     * products round differently from its one-token GEMVs) */
    g4_load_params lp = {.n_threads = 1, .device = "cpu"};
    if (g4_model_load(dir, &lp, &m, &err)) CHECKF(0, "load %s: %s", dir, err.msg);
    return m;
}

static g4_drafter *load_drafter(g4_model *m, const char *dir) {
    g4_error err;
    g4_drafter *d = NULL;
    if (g4_drafter_load(dir, m, &d, &err)) CHECKF(0, "drafter %s: %s", dir, err.msg);
    return d;
}

static g4_context *new_context_kv(g4_model *m, int n_batch, int block, g4_kv_type kv) {
    g4_error err;
    g4_context *ctx = NULL;
    g4_context_params cp = {.n_seq_max = 1, .n_ctx = 256, .n_batch = n_batch, .kv_block_size = block, .kv_type = kv};
    if (g4_context_new(m, &cp, &ctx, &err)) CHECKF(0, "context: %s", err.msg);
    return ctx;
}

static g4_context *new_context(g4_model *m, int n_batch, int block) { return new_context_kv(m, n_batch, block, 0); }

static int json_ints(const json_t *a, int *out, int cap) {
    int n = 0;
    for (size_t i = 0; json_is_array(a) && i < json_array_size(a) && n < cap; i++)
        out[n++] = (int)json_integer_value(json_array_get(a, i));
    return n;
}

/* A K/V row of the main cache at position p (f32 cache, host memory): [kv_heads * head_dim]. */
static const float *cache_row(const g4_context *ctx, int layer, int is_v, int p) {
    const g4_kv_layer *y = &ctx->kv.layers[layer];
    const g4_kv_pool *pool = &ctx->kv.pool[y->type];
    const int B = ctx->kv.block;
    size_t r = (size_t)pool->table[p / B] * (size_t)B + (size_t)(p % B);
    return (const float *)(is_v ? y->v : y->k) + r * (size_t)y->row;
}

/* ------------------------------------------------------------------ 1. transformers' rounds */
static void check_reference(g4_model *m, const g4_tensor_set *ref, const json_t *meta, const char *variant) {
    g4_error err;
    const json_t *info = json_object_get(json_object_get(meta, "assistant"), variant);
    const char *folder = json_string_value(json_object_get(info, "folder"));
    CHECKF(folder != NULL, "reference.json has no assistant.%s", variant);
    if (!folder) return;
    g4_drafter *d = load_drafter(m, fix_path(folder));
    g4_context *ctx = new_context(m, 64, 32);
    if (!d || !ctx) return;
    const int V = g4_model_vocab_size(m), Hb = g4_model_hidden_size(m), NA = g4_drafter_n_draft(d);
    const int Wa = d->m->cfg.text.sliding_window;
    CHECKF(NA == (int)json_integer_value(json_object_get(info, "num_assistant_tokens")), "%s: %d drafts per round",
           variant, NA);
    int32_t eos = EOS;
    g4_spec_params sp = {.stop_ids = &eos, .n_stop_ids = 1};
    g4_spec *s = NULL;
    CHECK(g4_spec_new(ctx, 0, d, &sp, &s, &err) == 0);
    if (!s) return;
    g4_spec_capture cap = {.max_draftings = 2, .max_steps = NA};
    cap.inputs = calloc((size_t)2 * NA * 2 * Hb, sizeof(float));
    cap.hidden = calloc((size_t)2 * NA * Hb, sizeof(float));
    cap.logits = calloc((size_t)2 * NA * V, sizeof(float));
    cap.position = calloc(2, sizeof(int));
    cap.steps = calloc(2, sizeof(int));
    cap.rows = calloc(2, sizeof(g4_draft_rows));
    s->capture = &cap;

    size_t n_prompt, n_want;
    int32_t *prompt = ref_ids(ref, "input_ids", &n_prompt);
    char name[128];
    snprintf(name, sizeof name, "%s.assisted_ids", variant);
    int32_t *want = ref_ids(ref, name, &n_want);
    int32_t *greedy = ref_ids(ref, "greedy_ids", NULL);
    float *row = malloc((size_t)V * sizeof(float));
    int32_t out[64], emit[300];
    int n = 0;
    CHECK(g4_spec_prefill(s, prompt, (int)n_prompt, row, &err) == 0);
    out[n++] = argmax_f32(row, V);
    while (n < (int)n_want && out[n - 1] != EOS) {
        int k = 0;
        if (g4_spec_round(s, out[n - 1], (int)n_want - n, NULL, emit, &k, &err)) {
            CHECKF(0, "%s: round: %s", variant, err.msg);
            break;
        }
        for (int i = 0; i < k && n < 64; i++) out[n++] = emit[i];
    }
    CHECKF(n == (int)n_want && !memcmp(out, want, n_want * sizeof *out) && !memcmp(out, greedy, n_want * sizeof *out),
           "%s: the generated ids differ from transformers'", variant);
    CHECKF(g4_seq_length(ctx, 0) == (int)(n_prompt + n_want) - 1, "%s: the sequence holds %d positions", variant,
           g4_seq_length(ctx, 0));

    const int *drafted, *accepted;
    int n_rounds, want_acc[64], want_drafts[64];
    g4_spec_rounds(s, &drafted, &accepted, &n_rounds);
    int na = json_ints(json_object_get(info, "accepted_per_round"), want_acc, 64);
    int nd = json_ints(json_object_get(info, "drafts_per_round"), want_drafts, 64);
    int same = n_rounds == na && n_rounds == nd;
    for (int r = 0; same && r < n_rounds; r++) same = drafted[r] == want_drafts[r] && accepted[r] == want_acc[r];
    CHECKF(same, "%s: drafts/accepted per round differ from reference.json (%d rounds)", variant, n_rounds);

    /* rounds 1 and 2 step by step; rows of every round */
    float worst[3] = {0, 0, 0};
    const json_t *rounds = json_object_get(info, "rounds");
    for (int r = 1; r <= 2; r++) {
        char pre[64];
        snprintf(pre, sizeof pre, "%s.r%d.", variant, r);
#define REF(x) (snprintf(name, sizeof name, "%s%s", pre, x), name)
        size_t n_ids = 0;
        int32_t *pos = ref_ids(ref, REF("position"), NULL), *ids = ref_ids(ref, REF("draft_ids"), &n_ids);
        float *in = ref_f32(ref, REF("draft_inputs"), NULL), *hid = ref_f32(ref, REF("draft_hidden"), NULL);
        float *lg = ref_f32(ref, REF("draft_logits"), NULL);
#undef REF
        const int slot = r - 1, k = cap.steps[slot];
        CHECKF(pos && ids && in && hid && lg, "%s: reference tensors of round %d missing", variant, r);
        if (pos && ids && in && hid && lg) {
            CHECKF(cap.position[slot] == pos[0] && k == (int)n_ids, "%s round %d: position %d, %d steps (ref %d, %zu)",
                   variant, r, cap.position[slot], k, pos[0], n_ids);
            for (int st = 0; st < k && st < (int)n_ids; st++) {
                float e[3] = {max_abs_diff(cap.inputs + ((size_t)slot * NA + st) * 2 * Hb, in + (size_t)st * 2 * Hb,
                                           (size_t)2 * Hb),
                              max_abs_diff(cap.hidden + ((size_t)slot * NA + st) * Hb, hid + (size_t)st * Hb, (size_t)Hb),
                              max_abs_diff(cap.logits + ((size_t)slot * NA + st) * V, lg + (size_t)st * V, (size_t)V)};
                for (int j = 0; j < 3; j++)
                    if (!(e[j] <= worst[j])) worst[j] = e[j];
                CHECKF(argmax_f32(cap.logits + ((size_t)slot * NA + st) * V, V) == ids[st],
                       "%s round %d step %d: draft differs", variant, r, st);
            }
        }
        free(pos), free(ids), free(in), free(hid), free(lg);
    }
    CHECKF(worst[0] <= DRAFT_TOL && worst[1] <= DRAFT_TOL && worst[2] <= DRAFT_TOL,
           "%s: drafter inputs %g, hidden %g, logits %g from transformers'", variant, worst[0], worst[1], worst[2]);
    /* the rows of round 1 (HF's shared_kv_states after the [:c] slice): all full rows, the last Wa + 1 sliding */
    const g4_draft_rows *r1 = &cap.rows[0];
    const json_t *j1 = json_array_get(rounds, 1);
    int full_rows = (int)json_integer_value(json_object_get(j1, "full_kv_rows"));
    int slide_rows = (int)json_integer_value(json_object_get(j1, "sliding_kv_rows"));
    CHECKF(r1->lo[G4_LAYER_FULL] == 0 && r1->hi[G4_LAYER_FULL] == full_rows, "%s round 1: full rows %d..%d, ref %d",
           variant, r1->lo[G4_LAYER_FULL], r1->hi[G4_LAYER_FULL], full_rows);
    CHECKF(r1->hi[G4_LAYER_SLIDING] - r1->lo[G4_LAYER_SLIDING] == (slide_rows < Wa + 1 ? slide_rows : Wa + 1),
           "%s round 1: sliding rows %d..%d", variant, r1->lo[G4_LAYER_SLIDING], r1->hi[G4_LAYER_SLIDING]);
    const g4_draft_rows *r2 = &cap.rows[1];
    const json_t *j2 = json_array_get(rounds, 2);
    full_rows = (int)json_integer_value(json_object_get(j2, "full_kv_rows"));
    slide_rows = (int)json_integer_value(json_object_get(j2, "sliding_kv_rows"));
    CHECKF(r2->lo[G4_LAYER_FULL] == 0 && r2->hi[G4_LAYER_FULL] == full_rows, "%s round 2: full rows %d..%d, ref %d",
           variant, r2->lo[G4_LAYER_FULL], r2->hi[G4_LAYER_FULL], full_rows);
    CHECKF(r2->hi[G4_LAYER_SLIDING] - r2->lo[G4_LAYER_SLIDING] == (slide_rows < Wa + 1 ? slide_rows : Wa + 1),
           "%s round 2: sliding rows %d..%d (array of %d)", variant, r2->lo[G4_LAYER_SLIDING],
           r2->hi[G4_LAYER_SLIDING], slide_rows);
    float e_kv = 0;
    int kv_checked = 0;
    for (int t = 0; t < G4_LAYER_TYPES; t++) { /* round 1's rows are prompt rows: still in the cache */
        const char *tn = t == G4_LAYER_FULL ? "full" : "sliding";
        size_t nk = 0;
        snprintf(name, sizeof name, "%s.r1.shared_k_%s", variant, tn);
        float *rk = ref_f32(ref, name, &nk);
        snprintf(name, sizeof name, "%s.r1.shared_v_%s", variant, tn);
        float *rv = ref_f32(ref, name, NULL);
        if (!rk || !rv) { /* recorded for one drafter only */
            free(rk), free(rv);
            continue;
        }
        const int src = d->src[t], KV = m->cfg.text.layer_kv_heads[src], D = m->cfg.text.layer_head_dim[src];
        const int N = (int)(nk / ((size_t)KV * D)); /* ref [KV, N, D], row j = position j (the array starts at 0) */
        CHECK(r1->hi[t] == N);
        kv_checked = 1;
        for (int p = r1->lo[t]; p < r1->hi[t] && p < N; p++)
            for (int h = 0; h < KV; h++) {
                float ek = max_abs_diff(cache_row(ctx, src, 0, p) + h * D, rk + ((size_t)h * N + p) * D, (size_t)D);
                float ev = max_abs_diff(cache_row(ctx, src, 1, p) + h * D, rv + ((size_t)h * N + p) * D, (size_t)D);
                if (!(ek <= e_kv)) e_kv = ek;
                if (!(ev <= e_kv)) e_kv = ev;
            }
        free(rk), free(rv);
    }
    CHECKF(e_kv <= KV_TOL, "%s: the K/V rows round 1 read differ by %g", variant, e_kv);
    printf("%-8s ids %s  rounds %d  drafter inputs %.2e hidden %.2e logits %.2e  K/V rows %s%.2e\n", variant,
           n == (int)n_want && !memcmp(out, want, n_want * sizeof *out) ? "equal" : "DIFFER", n_rounds, worst[0],
           worst[1], worst[2], kv_checked ? "" : "(not recorded) ", e_kv);
    free(prompt), free(want), free(greedy), free(row);
    free(cap.inputs), free(cap.hidden), free(cap.logits), free(cap.position), free(cap.steps), free(cap.rows);
    g4_spec_free(s);
    g4_context_free(ctx);
    g4_drafter_free(d);
}

/* ------------------------------------------------------------------ 2. greedy = plain greedy */
/* A generation on sequence 0 of ctx (reset first unless `keep`): its ids into out (*n); its finish reason.
 * rounds (may be NULL) gets the number of speculative rounds. */
static g4_finish run_gen(g4_context *ctx, int keep, const int32_t *prompt, int n_prompt, const g4_generation_params *gp,
                         int32_t *out, int *n, int *rounds) {
    g4_error err;
    g4_generation *g = NULL;
    g4_finish why = G4_FINISH_NONE;
    *n = 0;
    if (!keep) g4_seq_reset(ctx, 0);
    if (g4_generation_start(ctx, 0, prompt, n_prompt, gp, &g, &err) || g4_generation_run(g, NULL, NULL, &err)) {
        CHECKF(0, "generation: %s", err.msg);
    } else {
        const int32_t *ids = g4_generation_tokens(g, n);
        memcpy(out, ids, (size_t)*n * sizeof *out);
        why = g4_generation_finish(g);
        const int *dr, *ac;
        if (rounds) g4_generation_rounds(g, &dr, &ac, rounds);
    }
    g4_generation_free(g);
    return why;
}

static void prompt_ids(int n, unsigned seed, int V, int32_t *out) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        out[i] = i == 0 ? 2 : (int32_t)(3 + (seed >> 8) % (unsigned)(V - 3));
    }
}

/* The state a later step sees after a plain run (a) and a speculative one (b): length, free blocks of both pools
 * (the sliding pool holding the same roll-back history), bytes, every sliding row a step at the end reads, and
 * the logits of one more token. */
static int same_cache(g4_context *a, g4_context *b, float *la, float *lb, int V, float *e_next) {
    g4_error err;
    const int len = g4_seq_length(b, 0);
    int same = g4_seq_length(a, 0) == len && g4_kv_free_blocks(a) == g4_kv_free_blocks(b) &&
               g4_kv_bytes(a) == g4_kv_bytes(b) && g4_kv_cache_can_resume(&b->kv, 0, len);
    for (int t = 0; t < G4_LAYER_TYPES; t++) same &= a->kv.pool[t].n_free == b->kv.pool[t].n_free;
    int32_t tok = 77;
    g4_batch one = {.n_tokens = 1, .token = &tok};
    if (g4_seq_length(a, 0) < a->n_ctx && !g4_decode(a, &one, la, &err) && !g4_decode(b, &one, lb, &err)) {
        float e = max_abs_diff(la, lb, (size_t)V);
        if (!(e <= *e_next)) *e_next = e;
    }
    return same;
}

/* An event callback that returns non-zero at the third token: the generation ends cancelled, with what its round
 * made (the events already made are delivered: a step is a round, gemma4c.h), a prefix of plain greedy's ids; the
 * sequence then holds what was delivered, and a next turn on it is plain greedy's. */
typedef struct {
    int tokens, stop_at;
} stop_cb;

static int stop_on_token(const g4_event *ev, void *user) {
    stop_cb *c = user;
    return ev->kind == G4_EVENT_TOKEN && ++c->tokens >= c->stop_at;
}

static void check_callback_stop(g4_model *m) {
    g4_error err;
    const int V = g4_model_vocab_size(m);
    g4_sampler_params greedy;
    g4_sampler_params_default(&greedy);
    greedy.temperature = 0;
    g4_drafter *d = load_drafter(m, fix_path("assistant-lmhead"));
    g4_context *cp = new_context(m, 64, 32), *cs = new_context(m, 64, 32);
    int32_t prompt[40], plain[48], next[48];
    prompt_ids(37, 99u, V, prompt);
    int np = 0, nn = 0;
    g4_generation_params gp = {.max_new_tokens = 40, .sampling = &greedy};
    if (!d || !cp || !cs) return;
    run_gen(cp, 0, prompt, 37, &gp, plain, &np, NULL);
    for (int n_draft = 1; n_draft <= 8; n_draft *= 2) {
        g4_seq_reset(cs, 0);
        gp.drafter = d, gp.n_draft = n_draft;
        g4_generation *g = NULL;
        stop_cb cb = {0, 3};
        int ok = g4_generation_start(cs, 0, prompt, 37, &gp, &g, &err) == 0 &&
                 g4_generation_run(g, stop_on_token, &cb, &err) == 0;
        CHECKF(ok, "n_draft %d: %s", n_draft, err.msg);
        if (!ok) {
            g4_generation_free(g);
            continue;
        }
        int n = 0;
        const int32_t *ids = g4_generation_tokens(g, &n);
        CHECKF(g4_generation_finish(g) == G4_FINISH_CANCELLED && n == cb.tokens && n >= 3 && n <= 3 + n_draft &&
                   n <= np && !memcmp(ids, plain, (size_t)n * sizeof *ids),
               "n_draft %d: a callback that stops at the 3rd token: finish %d, %d tokens (%d delivered)", n_draft,
               (int)g4_generation_finish(g), n, cb.tokens);
        CHECKF(g4_seq_length(cs, 0) >= 37 + n - 1 && g4_seq_length(cs, 0) <= 37 + n,
               "n_draft %d: the sequence holds %d positions after %d tokens", n_draft, g4_seq_length(cs, 0), n);
        g4_generation_free(g);
        /* the next turn: the prompt and what was delivered, on the same sequence (its cached prefix reused) */
        int32_t turn[80];
        memcpy(turn, prompt, 37 * sizeof *turn);
        memcpy(turn + 37, plain, (size_t)n * sizeof *turn);
        gp.max_new_tokens = 8;
        run_gen(cs, 1, turn, 37 + n, &gp, next, &nn, NULL);
        gp.drafter = NULL;
        int32_t want[48];
        int nw = 0;
        run_gen(cp, 0, turn, 37 + n, &gp, want, &nw, NULL);
        CHECKF(nn == nw && !memcmp(next, want, (size_t)nn * sizeof *next), "n_draft %d: the next turn differs",
               n_draft);
        gp.max_new_tokens = 40;
    }
    printf("a callback that stops: cancelled with a prefix of plain greedy, next turns equal\n");
    g4_context_free(cp);
    g4_context_free(cs);
    g4_drafter_free(d);
}

static void check_greedy_equal(g4_model *m) {
    const int V = g4_model_vocab_size(m);
    const char *drafters[] = {"assistant-lmhead", "assistant-ordered"};
    const int lens[] = {1, 16, 17, 37, 100};
    /* the sanitizer build (memory errors, not coverage of shapes) takes every other prompt length, and of each
     * drafter's (draft count, length) pairs a third in rotation, every draft count and length still met (111 -> 34 s
     * there) */
    const int sanitize = getenv("G4_SANITIZE") != NULL;
    const size_t len_step = sanitize ? 2 : 1;
    const int n_drafts[] = {0, 1, 4};
    /* (n_batch, block, KV type): the CLI's shape, small blocks with a batch below the longer prompts, a bf16 cache */
    const int shapes[3][3] = {{64, 32, G4_KV_F32}, {24, 4, G4_KV_F32}, {32, 8, G4_KV_BF16}};
    int runs = 0, equal = 0, cache_equal = 0, stop_runs = 0, stop_equal = 0;
    float e_next = 0;
    float *la = malloc((size_t)V * sizeof(float)), *lb = malloc((size_t)V * sizeof(float));
    int32_t prompt[220], plain[64], spec[64];
    g4_sampler_params greedy;
    g4_sampler_params_default(&greedy);
    greedy.temperature = 0;
    for (int sh = 0; sh < 3; sh++) {
        g4_context *cp = new_context_kv(m, shapes[sh][0], shapes[sh][1], (g4_kv_type)shapes[sh][2]);
        g4_context *cs = new_context_kv(m, shapes[sh][0], shapes[sh][1], (g4_kv_type)shapes[sh][2]);
        for (int di = 0; di < 2 && cp && cs; di++) {
            g4_drafter *d = load_drafter(m, fix_path(drafters[di]));
            for (int ni = 0; ni < 3 && d; ni++)
                for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li += len_step)
                    for (int variant = 0; variant < 4; variant++) {
                        if (sanitize && (ni + (int)(li / len_step) + di) % 3 != 0) continue;
                        /* 0: 48 tokens (or the eos); 1: also stops at the plain run's 11th token; 2: 7 tokens (a
                         * round cut by the length); 3: a next turn on the same sequence (prompt = the last prompt,
                         * its output and 3 more tokens; the cached prefix is reused) */
                        if (sh == 2 && variant) continue; /* the bf16 cache: the first variant only */
                        int32_t stop = -1;
                        g4_generation_params gp = {.max_new_tokens = variant == 2 ? 7 : 48, .sampling = &greedy,
                                                   .stop_ids = &stop, .n_stop_ids = variant == 1};
                        int np = 0, ns = 0, n = lens[li];
                        if (variant < 3) prompt_ids(n, 1000u * (unsigned)li + 17u, V, prompt);
                        if (variant == 1) { /* a stop id the plain run meets */
                            gp.n_stop_ids = 0;
                            gp.max_new_tokens = 11;
                            run_gen(cp, 0, prompt, n, &gp, plain, &np, NULL);
                            stop = plain[np - 1];
                            gp.n_stop_ids = 1;
                            gp.max_new_tokens = 48;
                        }
                        if (variant == 3) { /* continue the previous variant-0 run of both contexts */
                            prompt_ids(n, 1000u * (unsigned)li + 17u, V, prompt);
                            run_gen(cp, 0, prompt, n, &gp, plain, &np, NULL);
                            gp.drafter = d, gp.n_draft = n_drafts[ni];
                            run_gen(cs, 0, prompt, n, &gp, spec, &ns, NULL);
                            gp.drafter = NULL;
                            memcpy(prompt + n, plain, (size_t)np * sizeof *prompt);
                            n += np;
                            prompt_ids(3, 7u, V, prompt + n);
                            n += 3;
                        }
                        g4_finish wp = run_gen(cp, variant == 3, prompt, n, &gp, plain, &np, NULL);
                        gp.drafter = d, gp.n_draft = n_drafts[ni];
                        g4_finish ws = run_gen(cs, variant == 3, prompt, n, &gp, spec, &ns, NULL);
                        int same = np == ns && wp == ws && !memcmp(plain, spec, (size_t)np * sizeof *plain);
                        CHECKF(same, "%s, n_draft %d, prompt of %d, batch %d, variant %d: %d vs %d tokens differ",
                               drafters[di], n_drafts[ni], n, shapes[sh][0], variant, np, ns);
                        int cache = same_cache(cp, cs, la, lb, V, &e_next);
                        CHECKF(cache, "%s, n_draft %d, prompt of %d, batch %d: the cache differs from a plain run's",
                               drafters[di], n_drafts[ni], n, shapes[sh][0]);
                        runs++;
                        equal += same;
                        cache_equal += cache;
                        if (variant) stop_runs++, stop_equal += same && cache;
                    }
            g4_drafter_free(d);
        }
        g4_context_free(cp);
        g4_context_free(cs);
    }
    CHECKF(e_next <= LOGIT_TOL, "the step after a speculative run differs by %g", e_next);
    printf("greedy   %d/%d runs equal to plain greedy (%d/%d with stops, lengths, next turns), cache as plain in %d, "
           "next-step logits %.2e\n", equal, runs, stop_equal, stop_runs, cache_equal, e_next);
    free(la);
    free(lb);
}

/* ------------------------------------------------------------------ 3. samplers */
static void check_samplers(g4_model *m) {
    g4_error err;
    const int V = g4_model_vocab_size(m);
    g4_drafter *d = load_drafter(m, fix_path("assistant-lmhead"));
    g4_context *cp = new_context(m, 64, 32), *cs = new_context(m, 64, 32);
    if (!d || !cp || !cs) return;
    int32_t prompt[40], a[40], b[40];
    /* greedy with processors: a repetition penalty and a bias change the picks; the rows' histories include the
     * drafts before them */
    int32_t bias_id = 407;
    float bias = -0.5f;
    g4_sampler_params sp;
    g4_sampler_params_default(&sp);
    sp.temperature = 0;
    sp.repetition_penalty = 1.3f;
    sp.penalty_last_n = 8;
    sp.bias_ids = &bias_id;
    sp.bias_values = &bias;
    sp.n_bias = 1;
    int same_proc = 0;
    for (int trial = 0; trial < 6; trial++) {
        int n = 5 + 7 * trial, na, nb;
        prompt_ids(n, 99u + (unsigned)trial, V, prompt);
        g4_generation_params gp = {.max_new_tokens = 30, .sampling = &sp};
        g4_finish fa = run_gen(cp, 0, prompt, n, &gp, a, &na, NULL);
        gp.drafter = d;
        g4_finish fb = run_gen(cs, 0, prompt, n, &gp, b, &nb, NULL);
        same_proc += fa == fb && na == nb && !memcmp(a, b, (size_t)na * sizeof *a);
    }
    CHECKF(same_proc == 6, "greedy with processors: %d of 6 runs equal to plain decoding", same_proc);

    /* speculative sampling: the first two tokens after a prompt, drawn many times (one draft and a bonus, or a
     * correction), against the exact distribution p(t1) p(t2 | t1) of the main model with the same processors */
    g4_sampler_params_default(&sp);
    sp.temperature = 0.8f;
    sp.top_k = 4;
    prompt_ids(6, 5u, V, prompt);
    g4_sampler *smp;
    CHECK(g4_sampler_new(&sp, V, &smp, &err) == 0);
    float *row = malloc((size_t)V * sizeof(float)), *p1 = malloc((size_t)V * sizeof(float));
    float *p2 = malloc((size_t)V * sizeof(float));
    double exact[4][4] = {{0}};
    int32_t t1s[4], t2s[4][4];
    int n1 = 0;
    g4_seq_reset(cp, 0);
    g4_batch pb = {.n_tokens = 6, .token = prompt};
    uint8_t want[6] = {0, 0, 0, 0, 0, 1};
    pb.want_logits = want;
    CHECK(g4_decode(cp, &pb, row, &err) == 0);
    g4_sampler_probs(smp, row, p1);
    for (int v = 0; v < V; v++) {
        if (p1[v] <= 0 || n1 == 4) continue;
        CHECK(g4_seq_truncate(cp, 0, 6, &err) == 0);
        g4_batch one = {.n_tokens = 1, .token = &v};
        CHECK(g4_decode(cp, &one, row, &err) == 0);
        g4_sampler_probs(smp, row, p2);
        int n2 = 0;
        for (int w = 0; w < V; w++)
            if (p2[w] > 0 && n2 < 4) {
                t2s[n1][n2] = w;
                exact[n1][n2++] = (double)p1[v] * p2[w];
            }
        t1s[n1++] = v;
    }
    /* (the sanitizer build: 800 draws, a total variation of about 0.055 expected, 0.12 allowed) */
    const int N = getenv("G4_SANITIZE") ? 800 : 2500;
    const double tv_most = getenv("G4_SANITIZE") ? 0.12 : 0.06;
    double count[4][4] = {{0}};
    int32_t out[4];
    int no, bad = 0, drafted_one = 0;
    for (int i = 0; i < N; i++) {
        sp.seed = 1000u + (unsigned)i;
        /* round 1 has a budget of 2: one draft */
        g4_generation_params gp = {.max_new_tokens = 3, .sampling = &sp, .ignore_eos = 1, .drafter = d};
        g4_generation *g = NULL;
        g4_seq_reset(cs, 0);
        CHECK(g4_generation_start(cs, 0, prompt, 6, &gp, &g, &err) == 0 && g4_generation_run(g, NULL, NULL, &err) == 0);
        const int32_t *ids = g ? g4_generation_tokens(g, &no) : NULL;
        const int *drafted, *accepted;
        int nr = 0;
        if (g) g4_generation_rounds(g, &drafted, &accepted, &nr);
        drafted_one += nr >= 1 && drafted[0] == 1;
        if (ids && no >= 2) memcpy(out, ids, 2 * sizeof *out);
        g4_generation_free(g);
        int hit = 0;
        for (int x = 0; x < n1 && !hit; x++)
            for (int y = 0; y < 4 && !hit; y++)
                if (t1s[x] == out[0] && exact[x][y] > 0 && t2s[x][y] == out[1]) count[x][y] += 1, hit = 1;
        bad += !hit;
    }
    double tv = 0;
    for (int x = 0; x < n1; x++)
        for (int y = 0; y < 4; y++) tv += fabs(count[x][y] / N - exact[x][y]);
    tv /= 2;
    if (getenv("G4_DEBUG"))
        for (int x = 0; x < n1; x++)
            for (int y = 0; y < 4; y++)
                fprintf(stderr, "t1 %d t2 %d: exact %.4f got %.4f\n", t1s[x], t2s[x][y], exact[x][y], count[x][y] / N);
    /* 16 outcomes, 2500 draws: a correct sampler's total variation is about 0.03 (transformers 5.17's rule: 0.45) */
    CHECKF(bad == 0 && tv < tv_most, "speculative sampling: %d draws outside the support, total variation %.3f", bad,
           tv);
    CHECKF(drafted_one == N, "speculative sampling: %d of %d runs drafted one token in round 1", drafted_one, N);
    /* transformers 5.17's rule (g4_spec_params.raw_q: q = softmax of the raw drafter logits) favours the drafts */
    double tv_raw = 0;
    {
        g4_spec *s = NULL;
        g4_spec_params spp = {.raw_q = 1};
        double cnt[4][4] = {{0}};
        const int NR = 600;
        CHECK(g4_spec_new(cs, 0, d, &spp, &s, &err) == 0);
        for (int i = 0; s && i < NR; i++) {
            int32_t e[4], t1;
            int k = 0;
            g4_sampler_seed(smp, 5000u + (unsigned)i);
            g4_seq_reset(cs, 0);
            if (g4_spec_prefill(s, prompt, 6, row, &err) || (t1 = g4_sampler_sample(smp, row)) < 0 ||
                g4_spec_round(s, t1, 2, smp, e, &k, &err) || k < 1) {
                CHECKF(0, "raw_q: %s", err.msg);
                break;
            }
            for (int x = 0; x < n1; x++)
                for (int y = 0; y < 4; y++)
                    if (t1s[x] == t1 && exact[x][y] > 0 && t2s[x][y] == e[0]) cnt[x][y] += 1;
        }
        for (int x = 0; x < n1; x++)
            for (int y = 0; y < 4; y++) tv_raw += fabs(cnt[x][y] / NR - exact[x][y]) / 2;
        g4_spec_free(s);
    }
    CHECKF(tv_raw > 0.15, "transformers' rule (raw_q) should favour the drafts: total variation %.3f", tv_raw);
    printf("samplers greedy with processors %d/6 equal; speculative sampling: total variation %.3f over %d draws "
           "(transformers' raw q: %.3f)\n", same_proc, tv, N, tv_raw);
    free(row), free(p1), free(p2);
    g4_sampler_free(smp);
    g4_context_free(cp);
    g4_context_free(cs);
    g4_drafter_free(d);
}

/* ------------------------------------------------------------------ 4. schedule and errors */
/* A copy of drafter folder `src` in the test folder with config.json edited by `edit` (a JSON object merged into
 * the config's text_config when `into_text`, else into the top level) and generation_config.json replaced by
 * gen (NULL: copied). */
static const char *edited_drafter(const char *src, const char *name, const char *edit, int into_text, const char *gen) {
    static char dir[4096];
    snprintf(dir, sizeof dir, "%s", g4t_tmp(name));
    mkdir(dir, 0755);
    char a[4200], b[4200];
    json_error_t je;
    snprintf(a, sizeof a, "%s/config.json", fix_path(src));
    json_t *cfg = json_load_file(a, 0, &je), *ed = json_loads(edit, 0, &je);
    json_object_update(into_text ? json_object_get(cfg, "text_config") : cfg, ed);
    snprintf(b, sizeof b, "%s/config.json", dir);
    json_dump_file(cfg, b, 0);
    json_decref(cfg);
    json_decref(ed);
    snprintf(a, sizeof a, "%s/model.safetensors", fix_path(src));
    snprintf(b, sizeof b, "%s/model.safetensors", dir);
    copy_file(a, b);
    snprintf(a, sizeof a, "%s/generation_config.json", fix_path(src));
    snprintf(b, sizeof b, "%s/generation_config.json", dir);
    if (gen)
        write_text(b, gen);
    else
        copy_file(a, b);
    return dir;
}

static void expect_refused(g4_model *m, const char *dir, const char *what, const char *needle) {
    g4_error err = {{0}};
    g4_drafter *d = NULL;
    int rc = g4_drafter_load(dir, m, &d, &err);
    CHECKF(rc != 0 && !d && strstr(err.msg, needle) && !strchr(err.msg, '\n'), "%s: rc %d, message '%s'", what, rc,
           err.msg);
    g4_drafter_free(d);
}

static void check_schedule_and_errors(g4_model *m) {
    g4_error err;
    const int V = g4_model_vocab_size(m);
    /* heuristic: +2 drafts after a round that kept them all, else -1 (at least 1); still plain greedy's output */
    const char *dir = edited_drafter("assistant-lmhead", "spec-heuristic", "{}", 0,
                                     "{\"num_assistant_tokens\": 3, \"num_assistant_tokens_schedule\": \"heuristic\"}");
    g4_drafter *d = load_drafter(m, dir);
    g4_context *cp = new_context(m, 64, 32), *cs = new_context(m, 64, 32);
    if (d && cp && cs) {
        int32_t prompt[37], a[60], b[60];
        int na, nb;
        prompt_ids(37, 3u, V, prompt);
        g4_sampler_params greedy;
        g4_sampler_params_default(&greedy);
        greedy.temperature = 0;
        g4_generation_params gp = {.max_new_tokens = 60, .sampling = &greedy, .ignore_eos = 1};
        run_gen(cp, 0, prompt, 37, &gp, a, &na, NULL);
        gp.drafter = d;
        g4_generation *g = NULL;
        CHECK(g4_generation_start(cs, 0, prompt, 37, &gp, &g, &err) == 0 && g4_generation_run(g, NULL, NULL, &err) == 0);
        const int32_t *ids = g4_generation_tokens(g, &nb);
        memcpy(b, ids, (size_t)nb * sizeof *b);
        CHECK(na == nb && !memcmp(a, b, (size_t)na * sizeof *a));
        const int *drafted, *accepted;
        int nr, ok = 1, left = 60 - 1, na_now = 3;
        g4_generation_rounds(g, &drafted, &accepted, &nr);
        for (int r = 0; r < nr; r++) {
            int want = na_now < left - 1 ? na_now : left - 1;
            ok &= drafted[r] == (want > 0 ? want : 0);
            na_now = accepted[r] == drafted[r] ? na_now + 2 : na_now > 2 ? na_now - 1 : 1;
            left -= accepted[r] + 1;
        }
        CHECKF(ok && nr > 2, "heuristic schedule: drafts per round do not follow the rule (%d rounds)", nr);
        CHECKF(g4_drafter_n_draft(d) == na_now, "the heuristic schedule keeps its value in the drafter (%d vs %d)",
               g4_drafter_n_draft(d), na_now);
        g4_generation_free(g);
        /* that value on a context whose batch cannot verify so many drafts: as many as it takes, not an error */
        const int small = na_now > 2 ? na_now : 2;
        g4_context *cb = new_context(m, small, 4);
        gp.drafter = NULL;
        run_gen(cp, 0, prompt, 37, &gp, a, &na, NULL);
        gp.drafter = d;
        g = NULL;
        int started = cb && g4_generation_start(cb, 0, prompt, 37, &gp, &g, &err) == 0;
        CHECKF(started && na_now > 2, "heuristic value %d on a context of batch %d: %s", na_now, small,
               started ? "no larger than the batch" : err.msg);
        if (started && g4_generation_run(g, NULL, NULL, &err) == 0) {
            ids = g4_generation_tokens(g, &nb);
            CHECK(na == nb && !memcmp(a, ids, (size_t)na * sizeof *a));
        }
        g4_generation_free(g);
        g4_context_free(cb);
    }
    g4_drafter_free(d);

    /* the spec's limits */
    d = load_drafter(m, fix_path("assistant-lmhead"));
    if (d && cs) {
        g4_spec *s = NULL;
        g4_context *tiny = new_context(m, 8, 4);
        CHECK(g4_spec_new(tiny, 0, d, NULL, &s, &err) != 0 && strstr(err.msg, "batch"));
        g4_spec_params sp = {.n_draft = 7};
        CHECK(g4_spec_new(tiny, 0, d, &sp, &s, &err) == 0);
        /* a round needs the prefill, and the sequence as the last round left it */
        int32_t pr[3] = {2, 40, 41}, emit[8], k;
        float *row = malloc((size_t)V * sizeof(float));
        CHECK(g4_spec_round(s, 5, 4, NULL, emit, &k, &err) != 0 && strstr(err.msg, "prefill"));
        CHECK(g4_spec_prefill(s, pr, 3, row, &err) == 0);
        CHECK(g4_spec_round(s, 5, 4, NULL, emit, &k, &err) == 0 && k >= 1 && k <= 4);
        CHECK(g4_spec_round(s, V, 4, NULL, emit, &k, &err) != 0 && strstr(err.msg, "vocabulary"));
        CHECK(g4_seq_truncate(tiny, 0, 2, &err) == 0);
        CHECK(g4_spec_round(s, 5, 4, NULL, emit, &k, &err) != 0 && strstr(err.msg, "changed"));
        free(row);
        g4_spec_free(s);
        g4_context_free(tiny);
        CHECK(g4_spec_new(cs, 3, d, NULL, &s, &err) != 0);
        g4_model *other = load_main(g4t_shared("fixtures/dense-ple"));
        g4_context *octx = other ? new_context(other, 64, 32) : NULL;
        CHECK(!octx || (g4_spec_new(octx, 0, d, NULL, &s, &err) != 0 && strstr(err.msg, "another model")));
        g4_context_free(octx);
        /* a drafter for another main model */
        if (other) expect_refused(other, fix_path("assistant-lmhead"), "drafter of another model", "cannot draft");
        g4_model_free(other);
    }
    g4_drafter_free(d);
    g4_context_free(cp);
    g4_context_free(cs);

    expect_refused(m, edited_drafter("assistant-lmhead", "spec-kvheads", "{\"num_key_value_heads\": 4}", 1, NULL),
                   "kv heads", "kv heads");
    expect_refused(m, edited_drafter("assistant-lmhead", "spec-rope", "{\"rope_parameters\": {\"sliding_attention\": "
                                     "{\"rope_type\": \"default\", \"rope_theta\": 20000.0}, \"full_attention\": "
                                     "{\"rope_type\": \"proportional\", \"rope_theta\": 1000000.0, "
                                     "\"partial_rotary_factor\": 0.25}}}", 1, NULL),
                   "RoPE", "RoPE");
    expect_refused(m, edited_drafter("assistant-lmhead", "spec-hb", "{\"backbone_hidden_size\": 32}", 0, NULL),
                   "backbone_hidden_size", "pre_projection");
    /* a message about a tensor names the drafter's folder (it could be the main model's) */
    const char *hb = edited_drafter("assistant-lmhead", "spec-hb", "{\"backbone_hidden_size\": 32}", 0, NULL);
    expect_refused(m, hb, "backbone_hidden_size: the folder", hb);
    expect_refused(m, edited_drafter("assistant-lmhead", "spec-shared", "{\"num_kv_shared_layers\": 2}", 1, NULL),
                   "num_kv_shared_layers", "num_kv_shared_layers");
    expect_refused(m, edited_drafter("assistant-lmhead", "spec-ple", "{\"hidden_size_per_layer_input\": 16, "
                                     "\"vocab_size_per_layer_input\": 512}", 1, NULL),
                   "PLE", "hidden_size_per_layer_input");
    expect_refused(m, edited_drafter("assistant-ordered", "spec-centroids", "{\"num_centroids\": 15}", 0, NULL),
                   "centroids", "num_centroids");
    expect_refused(m, edited_drafter("assistant-lmhead", "spec-sched", "{}", 0,
                                     "{\"num_assistant_tokens_schedule\": \"sometimes\"}"),
                   "schedule", "sometimes");
    expect_refused(m, FIX, "a main model as drafter", "not a gemma4_assistant");
    /* a token_ordering that is not a permutation */
    {
        int64_t bad[512];
        for (int i = 0; i < 512; i++) bad[i] = i;
        bad[7] = 3;
        g4_tensor t = {.name = "masked_embedding.token_ordering", .dtype = G4_I64, .ndim = 1, .shape = {512},
                       .data = bad, .nbytes = sizeof bad};
        resave_edit ed = {.extra = &t, .n_extra = 1};
        const char *dst = g4t_tmp("spec-ordering");
        CHECK(resave(fix_path("assistant-ordered"), dst, 1, 0, &ed) == 0);
        expect_refused(m, dst, "token_ordering", "permutation");
    }
    /* an assistant given as the main model */
    g4_model *dm = NULL;
    g4_load_params lp = {.n_threads = 1};
    CHECK(g4_model_load(fix_path("assistant-lmhead"), &lp, &dm, &err) != 0 && strstr(err.msg, "--draft"));
    printf("schedule and pairing errors checked\n");
}

/* ------------------------------------------------------------------ 5. NaN in the drafter's weights */
/* The drafter's argmax of a NaN row is -1 (backend.h) and the next draft step embeds it as a NaN row: the round and
 * g4_spec_draft report it rather than verify an id outside the vocabulary. */
static void check_nan_drafter(g4_model *m) {
    g4_error err = {{0}};
    char dir[4096], a[4200], b[4200];
    snprintf(dir, sizeof dir, "%s", g4t_tmp("spec-nan"));
    g4_tensor_set set;
    CHECK(g4_safetensors_open_dir(fix_path("assistant-lmhead"), &set, &err) == 0);
    const g4_tensor *t = g4_tensor_set_find(&set, "pre_projection.weight");
    static uint16_t w[48 * 128];
    CHECK(t && t->dtype == G4_BF16 && t->nbytes == sizeof w);
    if (t && t->nbytes == sizeof w) memcpy(w, t->data, sizeof w);
    g4_tensor_set_free(&set);
    w[7] = 0x7fc0; /* bf16 NaN */
    g4_tensor nan_t = {.name = "pre_projection.weight", .dtype = G4_BF16, .ndim = 2, .shape = {48, 128}, .data = w,
                       .nbytes = sizeof w};
    resave_edit ed = {.extra = &nan_t, .n_extra = 1};
    CHECK(resave(fix_path("assistant-lmhead"), dir, 1, 0, &ed) == 0);
    snprintf(a, sizeof a, "%s/generation_config.json", fix_path("assistant-lmhead"));
    snprintf(b, sizeof b, "%s/generation_config.json", dir);
    copy_file(a, b);
    g4_drafter *d = load_drafter(m, dir);
    g4_context *ctx = new_context(m, 64, 32);
    g4_spec *s = NULL;
    if (!d || !ctx || g4_spec_new(ctx, 0, d, NULL, &s, &err)) {
        CHECKF(0, "NaN drafter: %s", err.msg);
    } else {
        const int V = g4_model_vocab_size(m);
        const int32_t prompt[5] = {2, 17, 99, 150, 7};
        float *row = malloc((size_t)V * sizeof(float));
        int32_t out[16], drafts[4];
        int n = 0;
        CHECK(g4_spec_prefill(s, prompt, 5, row, &err) == 0);
        const int32_t first = argmax_f32(row, V);
        CHECK(g4_spec_draft(s, first, 2, drafts, &err) != 0);
        CHECKF(strstr(err.msg, "drafter computed NaN logits") != NULL, "g4_spec_draft: %s", err.msg);
        CHECK(g4_spec_round(s, first, 8, NULL, out, &n, &err) != 0);
        CHECKF(strstr(err.msg, "drafter computed NaN logits") != NULL && n == 0, "round: %d tokens, %s", n, err.msg);
        free(row);
    }
    g4_spec_free(s);
    g4_context_free(ctx);
    g4_drafter_free(d);
}

/* ------------------------------------------------------------------ 6. images and audio in the prompt */
/* The vision and audio fixtures have no drafter of their own: assistant-lmhead with projections for their hidden
 * size (128; the same layer shapes otherwise) pairs with both. Greedy output with an image or audio in the prompt
 * must equal plain greedy decoding with the same inputs, for prefills in one step and in several (the soft tokens
 * of one input always in one step), and leave the cache as a plain run does. */
static void check_media(void) {
    g4_error err;
    const char *dir = g4t_tmp("spec-media-drafter");
    static float pre[48 * 256], post[128 * 48];
    unsigned seed = 12345u;
    for (size_t i = 0; i < 48 * 256 + 128 * 48; i++) { /* uniform in [-0.1, 0.1] */
        seed = seed * 1103515245u + 12345u;
        float x = (float)((int)((seed >> 9) % 2001u) - 1000) * 1e-4f;
        if (i < 48 * 256) pre[i] = x;
        else post[i - 48 * 256] = x;
    }
    g4_tensor t[2] = {{.name = "pre_projection.weight", .dtype = G4_F32, .ndim = 2, .shape = {48, 256}, .data = pre,
                       .nbytes = sizeof pre},
                      {.name = "post_projection.weight", .dtype = G4_F32, .ndim = 2, .shape = {128, 48}, .data = post,
                       .nbytes = sizeof post}};
    resave_edit ed = {.extra = t, .n_extra = 2};
    char cfg_path[4200];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    json_error_t je;
    json_t *cfg = resave(fix_path("assistant-lmhead"), dir, 1, 0, &ed) == 0 ? json_load_file(cfg_path, 0, &je) : NULL;
    CHECK(cfg != NULL);
    if (!cfg) return;
    json_object_set_new(cfg, "backbone_hidden_size", json_integer(128));
    json_dump_file(cfg, cfg_path, 0);
    json_decref(cfg);

    const char *fixtures[2] = {"fixtures/vision", "fixtures/audio"};
    int runs = 0, equal = 0, cache_equal = 0;
    float e_next = 0;
    for (int f = 0; f < 2; f++) {
        g4_model *m = load_main(g4t_shared(fixtures[f]));
        g4_drafter *d = m ? load_drafter(m, dir) : NULL;
        g4_soft_tokens in[2] = {{0}};
        int n_in = 0;
        if (d && f == 0) {
            const char *imgs[2] = {"fixtures/vision/image0.png", "fixtures/vision/image1.png"};
            for (; n_in < 2; n_in++) {
                g4_image img;
                if (g4_image_load(g4t_shared(imgs[n_in]), NULL, &img, &err)) break;
                int rc = g4_image_encode(m, &img, 0, &in[n_in], &err);
                g4_image_free(&img);
                if (rc) break;
            }
        } else if (d) {
            float *pcm = NULL;
            size_t n_pcm = 0;
            if (g4_audio_load(g4t_shared("fixtures/audio/audio0.wav"), g4_audio_rate(m), &pcm, &n_pcm, &err) == 0 &&
                g4_audio_encode(m, pcm, n_pcm, &in[0], &err) == 0)
                n_in = 1;
            g4_free(pcm);
        }
        CHECKF(!d || n_in == (f == 0 ? 2 : 1), "%s: inputs: %s", fixtures[f], err.msg);
        const int V = m ? g4_model_vocab_size(m) : 0, ph = f == 0 ? 500 : 497; /* <|image|>, <|audio|> */
        float *la = malloc((size_t)(V ? V : 1) * sizeof(float)), *lb = malloc((size_t)(V ? V : 1) * sizeof(float));
        /* (n_batch: one step, several steps), prompt: text, placeholders at the start, middle and end */
        const int batches[2] = {256, 90};
        for (int bi = 0; bi < 2 && d && n_in; bi++) {
            g4_context *cp = new_context(m, batches[bi], 8), *cs = new_context(m, batches[bi], 8);
            for (int v = 0; v < 3 && cp && cs; v++) {
                int32_t prompt[64], plain[40], spec[40];
                int n = 0;
                prompt_ids(40, 31u + (unsigned)v, V - 20, prompt); /* ids below the multimodal ones (494..500) */
                n = 40;
                if (v == 0) prompt[1] = ph; /* right after <bos> */
                if (v == 1 || n_in == 2) prompt[20] = ph;
                if (v == 2) prompt[n - 1] = ph; /* the prompt ends with the input */
                int n_ph = 0;
                for (int i = 0; i < n; i++) n_ph += prompt[i] == ph;
                for (int dn = 1; dn <= 20; dn += 19) {
                    g4_sampler_params greedy;
                    g4_sampler_params_default(&greedy);
                    greedy.temperature = 0;
                    g4_generation_params gp = {.max_new_tokens = 24, .sampling = &greedy, .ignore_eos = 1,
                                               .media = in, .n_media = n_ph};
                    int np = 0, ns = 0;
                    g4_finish wp = run_gen(cp, 0, prompt, n, &gp, plain, &np, NULL);
                    gp.drafter = d, gp.n_draft = dn;
                    g4_finish ws = run_gen(cs, 0, prompt, n, &gp, spec, &ns, NULL);
                    int same = np == 24 && np == ns && wp == ws && !memcmp(plain, spec, (size_t)np * sizeof *plain);
                    CHECKF(same, "%s, n_batch %d, prompt %d, %d drafts: %d vs %d tokens differ", fixtures[f],
                           batches[bi], v, dn, np, ns);
                    int cache = same_cache(cp, cs, la, lb, V, &e_next);
                    CHECKF(cache, "%s, n_batch %d, prompt %d: the cache differs from a plain run's", fixtures[f],
                           batches[bi], v);
                    runs++, equal += same, cache_equal += cache;
                }
            }
            g4_context_free(cp);
            g4_context_free(cs);
        }
        free(la), free(lb);
        for (int i = 0; i < n_in; i++) g4_soft_tokens_free(&in[i]);
        g4_drafter_free(d);
        g4_model_free(m);
    }
    CHECKF(runs == 24 && e_next <= LOGIT_TOL, "images and audio: %d runs, the step after differs by %g", runs, e_next);
    printf("images and audio %d/%d runs equal to plain greedy, cache as plain in %d, next-step logits %.2e\n", equal,
           runs, cache_equal, e_next);
}

/* ------------------------------------------------------------------ 7. under the scheduler */
typedef struct {
    const char *drafter;       /* NULL: none */
    int seed_or_ref;           /* 0: the reference prompt, else the seed of a random prompt */
    int n_prompt, max_new;
    float temperature;         /* 0: greedy */
    int wave;                  /* submitted once the waves before it ended */
    float penalty;             /* a repetition penalty (0: none) */
} sched_req;

/* Generations with and without drafters through one scheduler (batched verifications of several requests, prefill
 * chunks beside them, a second wave that reuses the cached prefix, a pool small enough to preempt): each one's ids
 * and rounds equal a g4_generation of the same request alone (greedy and seeded sampling); the reference prompt's
 * rounds are transformers' (reference.json); the pools are whole again at the end. candidates: the steps bring back
 * each wanted row's top candidates, as on a GPU (G4_SAMPLE_CANDIDATES=1), where the request alone reads whole rows. */
static int sched_run(g4_model *m, const json_t *meta, const sched_req *rq, int n_req, int n_seq, int n_kv_blocks,
                     int candidates, const char *label) {
    g4_error err;
    const int V = g4_model_vocab_size(m);
    g4_drafter *ds[2] = {load_drafter(m, fix_path("assistant-lmhead")), load_drafter(m, fix_path("assistant-ordered"))};
    const char *dnames[2] = {"assistant-lmhead", "assistant-ordered"};
    g4_context *ctx = NULL, *alone = new_context(m, 64, 32);
    g4_context_params cp = {.n_seq_max = n_seq, .n_ctx = 256, .n_batch = 128, .kv_block_size = 8,
                            .kv_history = g4_drafter_kv_history(ds[0]), .n_kv_blocks = n_kv_blocks};
    g4_scheduler *s = NULL;
    if (candidates) setenv("G4_SAMPLE_CANDIDATES", "1", 1);
    const int made = ds[0] && ds[1] && alone && !g4_context_new(m, &cp, &ctx, &err) && !g4_scheduler_new(ctx, &s, &err);
    unsetenv("G4_SAMPLE_CANDIDATES");
    if (!made) {
        CHECKF(0, "%s: scheduler: %s", label, err.msg);
        return 0;
    }
    const int free0 = g4_kv_free_blocks(ctx);
    size_t n_ref;
    int32_t *ref_prompt = NULL;
    g4_tensor_set ref = {0};
    if (g4_safetensors_add_file(&ref, fix_path("reference.safetensors"), &err) == 0 &&
        g4_tensor_set_finish(&ref, &err) == 0)
        ref_prompt = ref_ids(&ref, "input_ids", &n_ref);
    int32_t prompts[12][200];
    int np[12];
    g4_sampler_params sp[12];
    g4_generation *g[12] = {0};
    int equal = 0, rounds_equal = 0, drafting = 0;
    for (int wave = 0; wave < 2; wave++) {
        for (int i = 0; i < n_req; i++) {
            if (rq[i].wave != wave) continue;
            np[i] = rq[i].seed_or_ref ? rq[i].n_prompt : (int)n_ref;
            if (rq[i].seed_or_ref) prompt_ids(np[i], (unsigned)rq[i].seed_or_ref, V, prompts[i]);
            else memcpy(prompts[i], ref_prompt, n_ref * sizeof *ref_prompt);
            g4_sampler_params_default(&sp[i]);
            sp[i].temperature = rq[i].temperature;
            sp[i].top_k = 8;
            sp[i].seed = 77u + (unsigned)i;
            if (rq[i].penalty > 0) sp[i].repetition_penalty = rq[i].penalty, sp[i].penalty_last_n = 16;
            g4_generation_params gp = {.max_new_tokens = rq[i].max_new, .sampling = &sp[i], .ignore_eos = 1};
            if (rq[i].drafter) gp.drafter = ds[strcmp(rq[i].drafter, dnames[0]) != 0];
            CHECKF(g4_scheduler_submit(s, prompts[i], np[i], &gp, NULL, NULL, &g[i], &err) == 0, "%s: submit: %s",
                   label, err.msg);
        }
        int left, steps = 0;
        while ((left = g4_scheduler_step(s, &err)) > 0 && steps < 10000) steps++;
        CHECKF(left == 0, "%s: a step failed: %s", label, err.msg);
    }
    g4_scheduler_stats st;
    g4_scheduler_get_stats(s, &st);
    long drafted_sum = 0, accepted_sum = 0, alone_steps = 0;
    for (int i = 0; i < n_req; i++) {
        if (!g[i]) continue;
        int n, na;
        const int32_t *ids = g4_generation_tokens(g[i], &n);
        const int *dr, *ac, *dr1, *ac1;
        int nr, nr1;
        g4_generation_rounds(g[i], &dr, &ac, &nr);
        for (int r = 0; r < nr; r++) drafted_sum += dr[r], accepted_sum += ac[r];
        /* drafter steps of its rounds alone: a round drafted after a stop draft or a cut drafts no fewer */
        for (int r = 0; r < nr; r++) alone_steps += dr[r];
        /* the same request alone */
        g4_generation_params gp = {.max_new_tokens = rq[i].max_new, .sampling = &sp[i], .ignore_eos = 1};
        if (rq[i].drafter) gp.drafter = ds[strcmp(rq[i].drafter, dnames[0]) != 0];
        g4_generation *a = NULL;
        g4_seq_reset(alone, 0);
        int32_t want[64];
        na = -1;
        if (g4_generation_start(alone, 0, prompts[i], np[i], &gp, &a, &err) == 0 &&
            g4_generation_run(a, NULL, NULL, &err) == 0) {
            const int32_t *w = g4_generation_tokens(a, &na);
            memcpy(want, w, (size_t)na * sizeof *want);
            g4_generation_rounds(a, &dr1, &ac1, &nr1);
        } else {
            CHECKF(0, "%s: request %d alone: %s", label, i, err.msg);
        }
        /* (a sampled request's draws follow its drafts per round, which a short pool cuts: then only its length) */
        const int cut = n_kv_blocks && rq[i].temperature > 0;
        const int same = na == n && (cut || !memcmp(ids, want, (size_t)n * sizeof *ids)) &&
                         g4_generation_finish(g[i]) == g4_generation_finish(a);
        CHECKF(same, "%s: request %d (%s, %s): %d ids differ from the request alone (%d)", label, i,
               rq[i].drafter ? rq[i].drafter : "no drafter", rq[i].temperature > 0 ? "sampled" : "greedy", n, na);
        equal += same;
        /* the rounds: equal to the request's alone where it read its whole prompt (no cached prefix) */
        if (rq[i].drafter && a && g4_generation_n_cached(g[i]) == 0 && rq[i].wave == 0 && !n_kv_blocks) {
            int same_r = nr == nr1;
            for (int r = 0; same_r && r < nr; r++) same_r = dr[r] == dr1[r] && ac[r] == ac1[r];
            CHECKF(same_r, "%s: request %d: its rounds differ from the request alone (%d vs %d)", label, i, nr, nr1);
            rounds_equal += same_r;
            drafting++;
            if (!rq[i].seed_or_ref && rq[i].temperature == 0) { /* transformers' rounds */
                const json_t *info = json_object_get(json_object_get(meta, "assistant"),
                                                     strcmp(rq[i].drafter, dnames[0]) ? "ordered" : "lmhead");
                int want_acc[64], want_dr[64];
                int nwa = json_ints(json_object_get(info, "accepted_per_round"), want_acc, 64);
                int nwd = json_ints(json_object_get(info, "drafts_per_round"), want_dr, 64);
                int same_t = nr == nwa && nr == nwd;
                for (int r = 0; same_t && r < nr; r++) same_t = dr[r] == want_dr[r] && ac[r] == want_acc[r];
                CHECKF(same_t, "%s: request %d: drafts/accepted per round differ from reference.json", label, i);
            }
        }
        if (rq[i].drafter && !rq[i].seed_or_ref && rq[i].temperature == 0 && rq[i].max_new == 24) {
            int32_t *greedy = ref_ids(&ref, "greedy_ids", NULL);
            CHECKF(greedy && n == 24 && !memcmp(ids, greedy, 24 * sizeof *ids),
                   "%s: request %d: the reference prompt's ids differ from transformers' greedy ids", label, i);
            free(greedy);
        }
        g4_generation_free(a);
    }
    CHECKF(st.draft_tokens == drafted_sum && st.accepted_tokens == accepted_sum && st.accepted_tokens > 0,
           "%s: the scheduler counted %ld drafts, %ld kept; the rounds say %ld, %ld", label, st.draft_tokens,
           st.accepted_tokens, drafted_sum, accepted_sum);
    CHECKF(g4_kv_free_blocks(ctx) == free0, "%s: %d of %d blocks free at the end", label, g4_kv_free_blocks(ctx), free0);
    printf("%s: %d/%d requests equal to each alone, rounds of %d/%d drafting ones equal; %ld drafts, %ld kept, %ld "
           "steps, %ld preemptions; %ld drafter steps for %ld drafts\n", label, equal, n_req, rounds_equal, drafting,
           st.draft_tokens, st.accepted_tokens, st.steps, st.preemptions, st.draft_steps, alone_steps);
    if (n_seq >= 4) /* requests drafting after one step share the drafter's steps */
        CHECKF(st.draft_steps > 0 && 3 * st.draft_steps < 2 * alone_steps, "%s: %ld drafter steps for %ld drafts", label,
               st.draft_steps, alone_steps);
    for (int i = 0; i < n_req; i++) g4_generation_free(g[i]);
    g4_scheduler_free(s);
    g4_context_free(ctx);
    g4_context_free(alone);
    g4_tensor_set_free(&ref);
    free(ref_prompt);
    g4_drafter_free(ds[0]);
    g4_drafter_free(ds[1]);
    return (int)st.preemptions;
}

static void check_scheduled(g4_model *m, const json_t *meta) {
    g4_error err;
    const sched_req mixed[] = {
        {"assistant-lmhead", 0, 0, 24, 0, 0, 0},   /* transformers' rounds */
        {NULL, 11, 9, 30, 0, 0, 0},                /* plain greedy beside them */
        {"assistant-lmhead", 12, 23, 30, 0.8f, 0, 0}, /* seeded speculative sampling */
        {"assistant-ordered", 13, 150, 30, 0, 0, 0},  /* a prompt read in chunks, longer than the window */
        {"assistant-lmhead", 14, 5, 3, 0, 0, 0},   /* a round cut by the length */
        {"assistant-ordered", 0, 0, 24, 0, 1, 0},  /* the reference prompt again: its cached prefix */
        {"assistant-lmhead", 15, 40, 40, 0.8f, 1, 0},
        {"assistant-lmhead", 18, 20, 30, 0.8f, 0, 1.3f}, /* sampled with a penalty (candidates: each verification
                                                            row with the modified ids after its drafts) */
        {NULL, 19, 15, 30, 0.8f, 0, 1.3f},
        {"assistant-ordered", 24, 30, 40, 0, 0, 1.3f}, /* greedy with a penalty: not a plain argmax */
    };
    sched_run(m, meta, mixed, (int)(sizeof mixed / sizeof mixed[0]), 3, 0, 0, "scheduled");
    sched_run(m, meta, mixed, (int)(sizeof mixed / sizeof mixed[0]), 3, 0, 1, "scheduled, top candidates");
    /* six requests drafting at once with both drafters (one drafter forward each after a step), rounds of every
     * length; the reference prompt's rounds among them are still transformers' */
    const sched_req together[] = {
        {"assistant-lmhead", 0, 0, 24, 0, 0, 0},   {"assistant-lmhead", 31, 12, 40, 0, 0, 0},
        {"assistant-ordered", 32, 30, 40, 0, 0, 0}, {"assistant-lmhead", 33, 7, 40, 0.8f, 0, 0},
        {"assistant-ordered", 34, 18, 9, 0, 0, 0},  {"assistant-lmhead", 35, 25, 40, 0, 0, 0},
    };
    sched_run(m, meta, together, 6, 6, 0, 0, "scheduled, drafted together");
    const sched_req ordered[] = {
        {"assistant-ordered", 0, 0, 24, 0, 0, 0}, /* transformers' rounds of the other drafter */
        {"assistant-lmhead", 16, 30, 40, 0, 0, 0},
        {"assistant-ordered", 17, 12, 40, 0.8f, 0, 0},
    };
    sched_run(m, meta, ordered, 3, 3, 0, 0, "scheduled, ordered drafter");
    const sched_req tight[] = {
        {"assistant-lmhead", 21, 60, 60, 0, 0, 0},
        {"assistant-ordered", 22, 60, 60, 0, 0, 0},
        {"assistant-lmhead", 23, 60, 60, 0.8f, 0, 0},
    };
    /* 3 sequences of up to 120 positions in 8-position blocks, a full pool of 28: someone is preempted */
    const int pre = sched_run(m, meta, tight, 3, 3, 28, 0, "scheduled, preempted");
    CHECKF(pre > 0, "the tight pool preempted no request");

    /* misuse: a context that keeps no sliding rows beyond a step's; a drafter with log-probabilities */
    g4_drafter *d = load_drafter(m, fix_path("assistant-lmhead"));
    g4_context *ctx = NULL;
    g4_scheduler *s = NULL;
    g4_context_params cp = {.n_seq_max = 2, .n_ctx = 128, .kv_history = -1};
    if (!d || g4_context_new(m, &cp, &ctx, &err) || g4_scheduler_new(ctx, &s, &err)) {
        CHECKF(0, "scheduler: %s", err.msg);
    } else {
        int32_t prompt[5] = {2, 10, 11, 12, 13};
        g4_generation *g = NULL;
        g4_generation_params gp = {.max_new_tokens = 4, .drafter = d};
        CHECK(g4_scheduler_submit(s, prompt, 5, &gp, NULL, NULL, &g, &err) == -1 && !g &&
              strstr(err.msg, "kv_history") && !strchr(err.msg, '\n'));
        printf("refused: %s\n", err.msg);
        g4_scheduler_free(s);
        g4_context_free(ctx);
        cp.kv_history = g4_drafter_kv_history(d);
        if (g4_context_new(m, &cp, &ctx, &err) == 0 && g4_scheduler_new(ctx, &s, &err) == 0) {
            gp.logprobs = 1;
            CHECK(g4_scheduler_submit(s, prompt, 5, &gp, NULL, NULL, &g, &err) == -1 && !g &&
                  strstr(err.msg, "drafter"));
            printf("refused: %s\n", err.msg);
            g4_scheduler_free(s);
        }
        g4_context_free(ctx);
    }
    g4_drafter_free(d);
}

/* Random schedules: contexts of 2..4 sequences, batches of 24..128 tokens, blocks of 4..16 positions, pools from
 * tight (a request alone fits) to ample; 7 requests each with no drafter or either one and 1..3 drafts a round or the
 * drafter's default, greedy or sampled, some cancelled at a random step. No step fails, every greedy request that ran
 * to its end has plain greedy decoding's ids alone, every sampled one its length, and the pools are whole at the
 * end. */
static void check_scheduled_random(g4_model *m) {
    g4_error err;
    const int V = g4_model_vocab_size(m);
    g4_drafter *ds[2] = {load_drafter(m, fix_path("assistant-lmhead")), load_drafter(m, fix_path("assistant-ordered"))};
    g4_context *alone = new_context(m, 64, 32);
    if (!ds[0] || !ds[1] || !alone) return;
    unsigned seed = 2026u;
#define RND(n) ((int)((seed = seed * 1103515245u + 12345u) >> 8) % (n))
    const char *more = getenv("G4_SCHED_TRIALS"); /* (a longer search, by hand) */
    const int trials = more && atoi(more) > 0 ? atoi(more) : getenv("G4_SANITIZE") ? 3 : 8;
    int greedy_equal = 0, greedy_runs = 0, sampled_ok = 0, sampled_runs = 0, cancelled = 0, whole = 0;
    for (int t = 0; t < trials; t++) {
        const int n_seq = 2 + RND(3), batches[3] = {24, 48, 128}, blocks[3] = {4, 8, 16};
        const int block = blocks[RND(3)];
        g4_context_params cp = {.n_seq_max = n_seq, .n_ctx = 128, .n_batch = batches[RND(3)], .kv_block_size = block,
                                .kv_history = g4_drafter_kv_history(ds[0])};
        if (RND(2)) cp.n_kv_blocks = 128 / block + RND(n_seq * 128 / block); /* a request alone fits */
        g4_context *ctx = NULL;
        g4_scheduler *s = NULL;
        if (g4_context_new(m, &cp, &ctx, &err) || g4_scheduler_new(ctx, &s, &err)) {
            CHECKF(0, "random schedule %d: %s", t, err.msg);
            g4_context_free(ctx);
            continue;
        }
        const int free0 = g4_kv_free_blocks(ctx);
        enum { NR = 7 };
        int32_t prompts[NR][80];
        int np[NR], cancel_at[NR];
        g4_sampler_params sp[NR];
        g4_generation_params gp[NR];
        g4_generation *g[NR] = {0};
        for (int i = 0; i < NR; i++) {
            np[i] = 1 + RND(79);
            prompt_ids(np[i], seed + (unsigned)i, V, prompts[i]);
            g4_sampler_params_default(&sp[i]);
            sp[i].temperature = RND(3) ? 0.0f : 0.9f;
            sp[i].top_k = 8;
            sp[i].seed = seed + (unsigned)i;
            const int dr = RND(3);
            gp[i] = (g4_generation_params){.max_new_tokens = 1 + RND(128 - np[i] < 40 ? 128 - np[i] : 40),
                                           .sampling = &sp[i], .ignore_eos = 1,
                                           .drafter = dr ? ds[dr - 1] : NULL, .n_draft = RND(4)};
            cancel_at[i] = RND(5) ? -1 : RND(20);
            CHECKF(g4_scheduler_submit(s, prompts[i], np[i], &gp[i], NULL, NULL, &g[i], &err) == 0,
                   "random schedule %d: submit: %s", t, err.msg);
        }
        int left, steps = 0;
        while ((left = g4_scheduler_step(s, &err)) > 0 && steps < 20000) {
            for (int i = 0; i < NR; i++)
                if (cancel_at[i] == steps && g[i]) g4_generation_cancel(g[i]);
            steps++;
        }
        CHECKF(left == 0, "random schedule %d: a step failed: %s", t, err.msg);
        for (int i = 0; i < NR; i++) {
            if (!g[i]) continue;
            int n;
            const int32_t *ids = g4_generation_tokens(g[i], &n);
            const g4_finish why = g4_generation_finish(g[i]);
            if (why == G4_FINISH_CANCELLED) {
                cancelled++;
            } else if (sp[i].temperature == 0) {
                g4_generation_params plain = gp[i];
                plain.drafter = NULL;
                int32_t want[64];
                int nw = 0;
                run_gen(alone, 0, prompts[i], np[i], &plain, want, &nw, NULL);
                const int same = why == G4_FINISH_LENGTH && n == nw && !memcmp(ids, want, (size_t)n * sizeof *ids);
                CHECKF(same, "random schedule %d: greedy request %d (%s, %d drafts a round): %d ids differ from plain "
                       "greedy's %d", t, i, gp[i].drafter ? "drafter" : "no drafter", gp[i].n_draft, n, nw);
                greedy_runs++, greedy_equal += same;
            } else {
                const int ok = why == G4_FINISH_LENGTH && n == gp[i].max_new_tokens;
                CHECKF(ok, "random schedule %d: sampled request %d: %d tokens of %d, finish %d", t, i, n,
                       gp[i].max_new_tokens, (int)why);
                sampled_runs++, sampled_ok += ok;
            }
            g4_generation_free(g[i]);
        }
        const int w = g4_kv_free_blocks(ctx) == free0;
        CHECKF(w, "random schedule %d: %d of %d blocks free at the end", t, g4_kv_free_blocks(ctx), free0);
        whole += w;
        g4_scheduler_free(s);
        g4_context_free(ctx);
    }
#undef RND
    printf("random schedules: %d, greedy requests equal to plain greedy %d/%d, sampled ones whole %d/%d, %d "
           "cancelled, pools whole after %d\n", trials, greedy_equal, greedy_runs, sampled_ok, sampled_runs, cancelled,
           whole);
    g4_context_free(alone);
    g4_drafter_free(ds[0]);
    g4_drafter_free(ds[1]);
}

int main(void) {
    snprintf(FIX, sizeof FIX, "%s", g4t_shared("fixtures/assistant"));
    g4_error err;
    g4_tensor_set ref = {0};
    json_error_t je;
    json_t *meta = json_load_file(fix_path("reference.json"), 0, &je);
    if (g4_safetensors_add_file(&ref, fix_path("reference.safetensors"), &err) || g4_tensor_set_finish(&ref, &err) ||
        !meta) {
        CHECKF(0, "cannot read the fixture's references in %s", FIX);
        return g4t_done();
    }
    g4_model *m = load_main(FIX);
    if (m) {
        check_reference(m, &ref, meta, "lmhead");
        check_reference(m, &ref, meta, "ordered");
        check_greedy_equal(m);
        check_callback_stop(m);
        check_samplers(m);
        check_schedule_and_errors(m);
        check_nan_drafter(m);
        check_media();
        check_scheduled(m, meta);
        check_scheduled_random(m);
    }
    g4_model_free(m);
    g4_tensor_set_free(&ref);
    json_decref(meta);
    return g4t_done();
}
