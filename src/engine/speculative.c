/* Speculative decoding with a Gemma 4 assistant (docs/gemma4-assistant.md sections 1.1 pairing, 1.2 settings,
 * 4 the assisted loop as transformers 5.17 runs it, 4.9 speculative sampling): loading a drafter beside its main
 * model, the rounds (drafting, one verification step, acceptance, roll-back of the rejected rows) and a
 * generation loop on top. The drafter forward is src/model/drafter.c. */
#include "engine/speculative.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/json.h"
#include "core/mapped_file.h"

#define OPS (be->ops)

/* ------------------------------------------------------------------ the drafter */

static const char *type_name(int t) { return t == G4_LAYER_FULL ? "full-attention" : "sliding"; }

/* The pairing rules of section 1.1 (transformers checks none of them). */
static int check_pair(g4_drafter *d, g4_error *err) {
    const g4_text_config *a = &d->m->cfg.text, *m = &d->main->cfg.text;
    if (d->m->cfg.asst.backbone_hidden_size != m->hidden_size)
        return g4_fail(err, "backbone_hidden_size %d differs from the main model's hidden_size %d",
                       d->m->cfg.asst.backbone_hidden_size, m->hidden_size);
    if (a->vocab_size != m->vocab_size)
        return g4_fail(err, "vocab_size %d differs from the main model's %d", a->vocab_size, m->vocab_size);
    const int first_shared = m->n_layers - m->num_kv_shared_layers;
    for (int t = 0; t < G4_LAYER_TYPES; t++) {
        d->src[t] = -1;
        for (int l = 0; l < first_shared; l++)
            if (m->layer_type[l] == (g4_layer_type)t) d->src[t] = l;
    }
    for (int l = 0; l < a->n_layers; l++) {
        const int t = a->layer_type[l], src = d->src[t];
        if (src < 0)
            return g4_fail(err, "its layer %d is %s but the main model has no %s layer with K/V of its own", l,
                           type_name(t), type_name(t));
        if (a->layer_head_dim[l] != m->layer_head_dim[src] || a->layer_kv_heads[l] != m->layer_kv_heads[src])
            return g4_fail(err, "its %s layer %d has head_dim %d and %d kv heads, the main model's layer %d has %d "
                                "and %d", type_name(t), l, a->layer_head_dim[l], a->layer_kv_heads[l], src,
                           m->layer_head_dim[src], m->layer_kv_heads[src]);
        const g4_rope_config *ra = &a->rope[t], *rm = &m->rope[t];
        if (ra->type != rm->type || ra->theta != rm->theta || ra->partial_rotary_factor != rm->partial_rotary_factor ||
            ra->factor != rm->factor)
            return g4_fail(err, "its %s RoPE parameters differ from the main model's", type_name(t));
    }
    return 0;
}

/* The drafter's generation_config.json: num_assistant_tokens (default 20) and its schedule (1.2). */
static int read_generation_config(g4_drafter *d, const char *dir, g4_error *err) {
    char path[4096];
    d->n_draft = 20;
    d->schedule = G4_SCHEDULE_CONSTANT;
    if (g4_path_join(path, sizeof path, dir, "generation_config.json", err)) return -1;
    if (!g4_file_exists(path)) return 0;
    json_t *root;
    if (g4_json_load_file(path, &root, err)) return -1;
    int64_t n;
    const char *sched;
    int rc = -1;
    if (g4_json_int(root, "num_assistant_tokens", 20, &n, path, err) ||
        g4_json_str(root, "num_assistant_tokens_schedule", &sched, path, err))
        goto done;
    if (n < 0 || n > 1 << 16) {
        g4_fail(err, "%s: num_assistant_tokens %lld is out of range", path, (long long)n);
        goto done;
    }
    d->n_draft = (int)n;
    if (sched && !strcmp(sched, "heuristic")) {
        d->schedule = G4_SCHEDULE_HEURISTIC;
    } else if (sched && !strcmp(sched, "heuristic_transient")) {
        d->schedule = G4_SCHEDULE_HEURISTIC_TRANSIENT;
    } else if (sched && strcmp(sched, "constant")) {
        g4_fail(err, "%s: num_assistant_tokens_schedule \"%s\" is not known (constant, heuristic, "
                     "heuristic_transient)", path, sched);
        goto done;
    }
    rc = 0;
done:
    json_decref(root);
    return rc;
}

int g4_drafter_load(const char *dir, g4_model *main, g4_drafter **out, g4_error *err) {
    G4_ARG(out, err);
    *out = NULL;
    G4_ARG(dir, err);
    G4_ARG(main, err);
    g4_drafter *d = calloc(1, sizeof *d);
    if (!d) return g4_fail(err, "out of memory");
    d->main = main;
    if (main->cfg.assistant) {
        g4_fail(err, "the main model is itself an assistant");
        goto fail;
    }
    if (g4_model_load_assistant(dir, main->be, &d->m, err) || read_generation_config(d, dir, err)) {
        if (err && strncmp(err->msg, dir, strlen(dir))) { /* a message about a tensor or field: say whose */
            char why[sizeof err->msg];
            snprintf(why, sizeof why, "%s", err->msg);
            g4_fail(err, "%s: %s", dir, why);
        }
        goto fail;
    }
    if (check_pair(d, err)) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        g4_fail(err, "%s cannot draft for %s: %s", dir, main->dir, why);
        goto fail;
    }
    *out = d;
    return 0;
fail:
    g4_drafter_free(d);
    return -1;
}

void g4_drafter_free(g4_drafter *d) {
    if (!d) return;
    if (d->m) g4_draft_ws_release(d, &d->batch);
    g4_model_free(d->m);
    free(d);
}

int g4_drafter_n_draft(const g4_drafter *d) { return d ? d->n_draft : 0; }

/* ------------------------------------------------------------------ the state of one sequence */

void g4_spec_free(g4_spec *s) {
    if (!s) return;
    g4_model *main = (g4_model *)s->d->main; /* outlives the drafter (the context may be gone); its lock is mutable */
    pthread_mutex_lock(&main->backend_lock);
    g4_backend *be = s->d->m->be;
    g4_draft_ws_release(s->d, &s->ws);
    if (s->h0) OPS->release(be, s->h0);
    free(s->stop_ids);
    free(s->drafts);
    free(s->vlogits);
    free(s->dlogits);
    free(s->probs);
    free(s->resid);
    free(s->vids);
    free(s->vtoks);
    free(s->seqs);
    free(s->want);
    g4_round_log_free(&s->log);
    pthread_mutex_unlock(&main->backend_lock);
    free(s);
}

/* Heuristic schedules let the drafts per round grow (+2 after a round that kept every draft); the buffers hold
 * this many, and the verification step must fit the context's batch. */
#define HEURISTIC_MAX_DRAFTS 64

/* The drafts per round of a new state, or -1 when it cannot be made (see spec_new_locked). */
static int spec_check(g4_context *ctx, int seq, g4_drafter *d, const g4_spec_params *params, int scheduled,
                      g4_error *err) {
    if (ctx->scheduler && !scheduled) return g4_fail(err, "the context's sequences belong to its scheduler");
    g4_spec_params p = {0};
    if (params) p = *params;
    if (ctx->model != d->main) return g4_fail(err, "the context belongs to another model than the drafter's");
    if (!scheduled && (seq < 0 || seq >= ctx->n_seq))
        return g4_fail(err, "sequence %d is outside 0..%d", seq, ctx->n_seq - 1);
    if (p.n_draft < 0) return g4_fail(err, "negative number of drafts per round %d", p.n_draft);
    int n_draft = p.n_draft ? p.n_draft : d->n_draft;
    if (scheduled || (!p.n_draft && d->schedule == G4_SCHEDULE_HEURISTIC)) { /* what earlier rounds learned, on
                                    another context perhaps, or a scheduler's request: as many as the batch takes */
        if (n_draft > ctx->n_batch - 1) n_draft = ctx->n_batch - 1;
    }
    if (n_draft > G4_SAMPLER_REWIND_MAX)
        return g4_fail(err, "%d drafts per round: at most %d", n_draft, G4_SAMPLER_REWIND_MAX);
    if (n_draft + 1 > ctx->n_batch)
        return g4_fail(err, "%d drafts per round do not fit the context's batch of %d tokens (a verification runs "
                            "the round's last token and its drafts in one step)", n_draft, ctx->n_batch);
    /* a drafting reads the last Wa + 1 sliding rows up to the end of the main model's last step (4.3); the cache
     * keeps W - 1 + history rows before it (a scheduler's steps may be one token) or W - 1 + n_batch */
    const g4_text_config *ac = &d->m->cfg.text, *mc = &d->main->cfg.text;
    if (scheduled && ac->sliding_window + 2 - mc->sliding_window > ctx->kv.history)
        return g4_fail(err, "the drafter's sliding window %d needs a context with kv_history of at least %d "
                            "(g4_drafter_kv_history)", ac->sliding_window, ac->sliding_window + 2 - mc->sliding_window);
    if (ac->sliding_window + 1 > mc->sliding_window - 1 + ctx->n_batch)
        return g4_fail(err, "the drafter's sliding window %d needs a context batch of at least %d", ac->sliding_window,
                       ac->sliding_window + 2 - mc->sliding_window);
    return n_draft;
}

/* scheduled: a request of the context's scheduler (g4_spec_new_scheduled): no sequence yet (g4_spec_bind), the
 * verification's outputs are the scheduler's, and only the last draft step's logits are kept */
static int spec_new_locked(g4_context *ctx, int seq, g4_drafter *d, const g4_spec_params *params, int scheduled,
                           g4_spec **out, g4_error *err) {
    const int n_draft = spec_check(ctx, seq, d, params, scheduled, err);
    if (n_draft < 0) return -1;
    g4_spec_params p = {0};
    if (params) p = *params;
    const g4_text_config *mc = &d->main->cfg.text;
    g4_spec *s = calloc(1, sizeof *s);
    if (!s) return g4_fail(err, "out of memory");
    s->ctx = ctx;
    s->seq = seq;
    s->d = d;
    s->n_draft = n_draft;
    s->cap = n_draft;
    if (d->schedule != G4_SCHEDULE_CONSTANT) {
        int most = ctx->n_batch - 1 < HEURISTIC_MAX_DRAFTS ? ctx->n_batch - 1 : HEURISTIC_MAX_DRAFTS;
        if (most > s->cap) s->cap = most;
    }
    s->n_pending = -1;
    s->cancelled = p.cancelled;
    s->cancelled_user = p.cancelled_user;
    s->raw_q = !scheduled && p.raw_q;
    s->scheduled = scheduled;
    g4_backend *be = d->m->be;
    const size_t Hb = (size_t)mc->hidden_size, V = (size_t)mc->vocab_size;
    const size_t cap = (size_t)s->cap;
    s->roll_back_to = -1;
    int ok = (s->h0 = OPS->alloc(be, Hb * sizeof *s->h0)) != NULL;
    if (!scheduled) ok = ok && g4_draft_ws_reserve(d, &s->ws, 1, s->cap, 1) == 0;
    s->drafts = malloc((cap + 1) * sizeof *s->drafts);
    s->probs = malloc(V * sizeof *s->probs);
    s->resid = malloc(V * sizeof *s->resid);
    if (!scheduled) { /* the verification's outputs and batch */
        s->vlogits = malloc((cap + 2) * V * sizeof *s->vlogits);
        if (s->raw_q) s->dlogits = malloc((cap + 1) * V * sizeof *s->dlogits);
        s->vids = malloc((cap + 1) * sizeof *s->vids);
        s->vtoks = malloc((cap + 1) * sizeof *s->vtoks);
        s->seqs = malloc((size_t)ctx->n_batch * sizeof *s->seqs);
        s->want = malloc((size_t)ctx->n_batch);
    }
    if (p.n_stop_ids > 0 && (s->stop_ids = malloc((size_t)p.n_stop_ids * sizeof *s->stop_ids)))
        memcpy(s->stop_ids, p.stop_ids, (size_t)p.n_stop_ids * sizeof *s->stop_ids);
    s->n_stop = p.n_stop_ids > 0 ? p.n_stop_ids : 0;
    if (!ok || !s->drafts || !s->probs || !s->resid || (s->n_stop && !s->stop_ids) ||
        (!scheduled && (!s->vlogits || (s->raw_q && !s->dlogits) || !s->vids || !s->vtoks || !s->seqs || !s->want))) {
        g4_spec_free(s);
        return g4_fail(err, "out of memory for speculative decoding (%d drafts per round)", (int)cap);
    }
    for (int i = 0; !scheduled && i < ctx->n_batch; i++) s->seqs[i] = seq;
    *out = s;
    return 0;
}

static int is_stop(const g4_spec *s, int32_t id) {
    for (int i = 0; i < s->n_stop; i++)
        if (s->stop_ids[i] == id) return 1;
    return 0;
}

/* Rows the drafter reads at length c (the last token at c - 1), after the main call that processed q0 .. q1-1
 * (4.3): the full layer's first c rows; the sliding layer's array (the W - 1 rows before q0, then the call's
 * rows), cut to its first c rows, of which the last Wa + 1 are attended. */
static g4_draft_rows draft_rows(const g4_spec *s, int c) {
    const int W = s->d->main->cfg.text.sliding_window, Wa = s->d->m->cfg.text.sliding_window;
    g4_draft_rows r;
    r.lo[G4_LAYER_FULL] = 0;
    r.hi[G4_LAYER_FULL] = s->q1 < c ? s->q1 : c;
    const int a = s->q0 - W + 1 > 0 ? s->q0 - W + 1 : 0;
    const int hi = s->q1 < a + c ? s->q1 : a + c;
    r.hi[G4_LAYER_SLIDING] = hi;
    r.lo[G4_LAYER_SLIDING] = hi - Wa - 1 > a ? hi - Wa - 1 : a;
    return r;
}

/* A draft of -1: the drafter's logits held NaN (the argmax's, backend.h). */
static int drafts_nan(const g4_spec *s, int k, g4_error *err) {
    for (int i = 0; i < k; i++)
        if (s->drafts[i] < 0)
            return g4_fail(err, "the drafter computed NaN logits (draft %d): its weights hold NaN or infinite values",
                           i + 1);
    return 0;
}

static g4_draft_job draft_job(g4_spec *s, int32_t last, int c, int k) {
    return (g4_draft_job){.s = s, .h0 = s->h0, .tok = last, .p = c - 1, .k = k, .rows = draft_rows(s, c)};
}

/* How many of a drafting's k drafts count: up to a stop id (kept as the last candidate, 4.2), or -1. */
static int drafted(g4_spec *s, int k, g4_error *err) {
    if (drafts_nan(s, k, err)) return -1;
    for (int i = 0; i < k; i++)
        if (is_stop(s, s->drafts[i])) return i + 1;
    return k;
}

/* Drafts up to k tokens after `last` (at position c - 1) into s->drafts with the state's own buffers; stops after a
 * stop id. How many, or -1. */
static int draft(g4_spec *s, int32_t last, int c, int k, g4_error *err) {
    if (k <= 0) return 0;
    const g4_draft_job job = draft_job(s, last, c, k);
    g4_drafter_forward(s->d, &s->ws, &job, 1);
    return drafted(s, k, err);
}


static int spec_prefill_locked(g4_spec *s, const int32_t *prompt, int n_prompt, const float *embd, float *logits,
                               g4_error *err) {
    g4_context *ctx = s->ctx;
    g4_backend *be = ctx->model->be;
    const int V = ctx->model->cfg.text.vocab_size, H = ctx->model->cfg.text.hidden_size;
    if (n_prompt <= 0) return g4_fail(err, "empty prompt");
    s->ready = 0;
    s->n_pending = -1;
    s->log.n = 0;
    const int start = g4_seq_length(ctx, s->seq);
    for (int i = 0, n; i < n_prompt; i += n) {
        /* steps as plain decoding takes them: an image's soft tokens in one step */
        if ((n = g4_step_length(ctx->model, prompt + i, n_prompt - i, ctx->n_batch, err)) < 0) return -1;
        const int last = i + n == n_prompt;
        /* the first row gives round 1's hidden state (4.2: row 0 of the prefill, an HF quirk), the last one the
         * logits */
        memset(s->want, 0, (size_t)n);
        if (i == 0) s->want[0] = 1;
        if (last) s->want[n - 1] = 1;
        const int two = last && i == 0 && n > 1; /* both rows wanted: logits of two rows */
        g4_batch b = {.n_tokens = n, .token = prompt + i, .seq = s->seqs, .want_logits = s->want};
        if (embd) { /* the rows of this step's placeholders: those before it were taken by earlier steps */
            b.embd = embd + (size_t)g4_count_soft_tokens(ctx->model, prompt, i) * H;
            b.n_embd = g4_count_soft_tokens(ctx->model, prompt + i, n);
        }
        if (g4_decode(ctx, &b, last ? (two ? s->vlogits : logits) : NULL, err)) return -1;
        if (i == 0) OPS->copy(be, s->h0, g4_step_final_rows(ctx), (size_t)H * sizeof(float));
        if (two) memcpy(logits, s->vlogits + V, (size_t)V * sizeof(float));
        if (!last && s->cancelled && s->cancelled(s->cancelled_user)) return 1;
    }
    s->q0 = start;
    s->q1 = start + n_prompt;
    s->ready = 1;
    return 0;
}

static double softmax_at(const float *x, int n, int i) {
    float m = x[0];
    for (int j = 1; j < n; j++) m = x[j] > m ? x[j] : m;
    double z = 0;
    for (int j = 0; j < n; j++) z += exp((double)x[j] - m);
    return exp((double)x[i] - m) / z;
}

/* A verification's rows as the step left them: their argmax ids (a plain argmax), their logits [k + 1][V], or a
 * scheduler's top candidates (rows w .. w + k of cand; a row beyond its cap has its logits in cand->fallback). */
typedef struct {
    const int32_t *ids;
    float *logits;
    const g4_candidates *cand;
    int w;
} verify_rows;

static float *row_logits(const verify_rows *r, int i, int V) {
    return r->cand ? r->cand->fallback + (size_t)(r->w + i) * V : r->logits + (size_t)i * V;
}

/* The raw logits of a candidates row's extras in the order the sampler lists its modified ids now (the step fetched
 * them by id, for the history the row's verification has: g4_sampler_candidate_extras_after) into vals, or NULL
 * when it has none; 0, or -1 when one was not fetched. */
static int row_extras(const g4_sampler *smp, const g4_candidates *c, int row, const float **out, int32_t *ids,
                      float *vals) {
    *out = NULL;
    const int ne = g4_sampler_candidate_extras(smp, NULL);
    if (ne == 0) return 0;
    if (!c->extra_at || ne > G4_SAMPLER_CANDIDATES_MAX) return -1;
    g4_sampler_candidate_extras(smp, ids);
    const int a = c->extra_at[row], b = c->extra_at[row + 1];
    for (int e = 0; e < ne; e++) {
        int f = a;
        while (f < b && c->extra_id[f] != ids[e]) f++;
        if (f == b) return -1;
        vals[e] = c->extra_vals[f];
    }
    *out = vals;
    return 0;
}

/* The sampler on row i: a draw (probs NULL; -1 when every id is banned) or the distribution into probs (its non-zero
 * entries, -1 when every id is banned); -2 for a candidates row without its sampler's modified ids (a scheduler bug) */
static int32_t row_sampler(g4_sampler *smp, const verify_rows *r, int i, int V, float *probs) {
    const g4_candidates *c = r->cand;
    const int row = r->w + i;
    if (!c || c->count[row] < 0) {
        float *x = row_logits(r, i, V);
        return probs ? g4_sampler_probs(smp, x, probs) : g4_sampler_sample(smp, x);
    }
    int32_t ids[G4_SAMPLER_CANDIDATES_MAX];
    float vals[G4_SAMPLER_CANDIDATES_MAX];
    const float *extra;
    if (row_extras(smp, c, row, &extra, ids, vals)) return -2;
    const int32_t *cid = c->ids + (size_t)row * c->cap;
    const float *cval = c->vals + (size_t)row * c->cap;
    return probs ? g4_sampler_probs_candidates(smp, cid, cval, c->count[row], extra, probs)
                 : g4_sampler_sample_candidates(smp, cid, cval, c->count[row], extra);
}

static int row_failed(int rc, int row, g4_error *err) {
    return rc == -2 ? g4_fail(err, "verification row %d came back without its sampler's modified ids", row)
                    : g4_fail(err, "every token of verification row %d is banned", row);
}

/* Speculative sampling (4.9; transformers' _speculative_sampling): draft i is kept while a uniform draw is
 * <= p_i(d_i) / q_i(d_i), p the sampler's distribution of verification row i (its processors see the drafts
 * before it) and q the distribution the draft was drawn from; then one token from norm(max(p_n - q_n, 0)) after a
 * rejection, or from p_k. The drafts are argmaxes, so q is a point mass on d_i: a draft is kept with probability
 * p_i(d_i) and a rejection draws from p_n without d_n, which keeps the output distributed as the main model's
 * (transformers 5.17 takes q = softmax of the raw drafter logits instead, which favours the drafts: raw_q).
 * rows: the verification's. Returns the number kept; *next the token after them; *hist drafts
 * added to smp. */
static int verify_sampling(g4_spec *s, g4_sampler *smp, int k, int done, const verify_rows *rows, int32_t *next,
                           int *hist, g4_error *err) {
    const int V = s->ctx->model->cfg.text.vocab_size;
    int n = 0;
    for (; n <= k; n++) {
        const int nz = row_sampler(smp, rows, n, V, s->probs);
        if (nz < 0) return row_failed(nz, n, err);
        if (n == k) break;
        const int32_t d = s->drafts[n];
        const double q = s->raw_q ? softmax_at(s->dlogits + (size_t)n * V, V, d) : 1.0, r = g4_sampler_uniform(smp);
        if (!(s->probs[d] > 0.0f) || !(r <= (double)s->probs[d] / q)) break;
        g4_sampler_accept(smp, d);
        (*hist)++;
    }
    if (done && n == k) { /* the last draft ends generation: no bonus token (4.5) */
        *next = s->drafts[k - 1];
        return k - 1;
    }
    const float *p = s->probs;
    if (n < k) { /* the residual distribution max(p - q, 0); p itself if that is all zero */
        double left = 0;
        if (s->raw_q) {
            const float *dl = s->dlogits + (size_t)n * V;
            float m = dl[0];
            for (int j = 1; j < V; j++) m = dl[j] > m ? dl[j] : m;
            double z = 0;
            for (int j = 0; j < V; j++) z += exp((double)dl[j] - m);
            for (int j = 0; j < V; j++) {
                double r = (double)s->probs[j] - exp((double)dl[j] - m) / z;
                s->resid[j] = r > 0 ? (float)r : 0.0f;
                left += s->resid[j];
            }
        } else {
            memcpy(s->resid, s->probs, (size_t)V * sizeof *s->resid);
            s->resid[s->drafts[n]] = 0.0f;
            for (int j = 0; j < V; j++) left += s->resid[j];
        }
        if (left > 0) p = s->resid;
    }
    *next = g4_sampler_draw(smp, p);
    if (*next < 0) return g4_fail(err, "no token can be drawn from verification row %d", n);
    return n;
}

int g4_round_log_add(g4_round_log *l, int drafted, int accepted, g4_error *err) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        int *a = realloc(l->drafted, (size_t)cap * sizeof *a);
        if (a) l->drafted = a;
        int *b = a ? realloc(l->accepted, (size_t)cap * sizeof *b) : NULL;
        if (b) l->accepted = b;
        if (!a || !b) return g4_fail(err, "out of memory");
        l->cap = cap;
    }
    l->drafted[l->n] = drafted;
    l->accepted[l->n++] = accepted;
    return 0;
}

void g4_round_log_free(g4_round_log *l) {
    free(l->drafted);
    free(l->accepted);
    memset(l, 0, sizeof *l);
}

/* Acceptance of a verification of k drafts (4.5): the longest prefix of drafts the main model agrees with, then
 * its own token, from the rows' argmax ids (a plain argmax: smp NULL or g4_sampler_is_argmax) or with smp from
 * their logits or candidates. The kept drafts and the token after them go to out; returns how many drafts
 * were kept, or -1. */
static int accept_round(g4_spec *s, int k, const verify_rows *rows, g4_sampler *smp, int32_t *out, g4_error *err) {
    const int V = s->ctx->model->cfg.text.vocab_size;
    const int plain = rows->ids != NULL, greedy = plain || !smp || g4_sampler_is_greedy(smp);
    const int done = k > 0 && is_stop(s, s->drafts[k - 1]);
    int n = 0, hist = 0;
    int32_t next = -1;
    if (greedy) {
        for (;; n++) {
            next = plain ? rows->ids[n] : row_sampler(smp, rows, n, V, NULL);
            if (next < 0) {
                g4_sampler_rewind(smp, hist);
                return row_failed(next, n, err);
            }
            if (n == k || next != s->drafts[n]) break;
            if (!plain) {
                g4_sampler_accept(smp, next);
                hist++;
            }
        }
        if (done && n == k) next = s->drafts[--n]; /* the last draft ends generation: no bonus token */
    } else {
        n = verify_sampling(s, smp, k, done, rows, &next, &hist, err);
    }
    if (smp) g4_sampler_rewind(smp, hist);
    if (n < 0) return -1;
    memcpy(out, s->drafts, (size_t)n * sizeof *out);
    out[n] = next;
    if (!s->scheduled && g4_round_log_add(&s->log, k, n, err)) return -1; /* (a scheduler's: its generation's log) */
    return n;
}

/* The roll-back of the rejected rows after a drafting: the verification kept the history of a step ending at c
 * (tentative, or a scheduler's cache: kv_history -1 keeps what a step from c - 1 reads), so it is always possible and
 * leaves the sliding pool as a plain run's (kv_cache.h). */
static int roll_back(g4_spec *s, g4_error *err) {
    const int to = s->roll_back_to;
    if (to < 0) return 0;
    s->roll_back_to = -1;
    if (g4_seq_truncate(s->ctx, s->seq, to, err)) return -1;
    s->q0 = s->q1 = to;
    return 0;
}

/* After a verification of `last` (at c - 1) and k drafts of which n were kept, then `next`: the next round's state.
 * final_row (backend memory) is the main model's state that produced `next` (4.6); the next round's drafts are made
 * from the rows as the verification left them (4.7), at most `left` - 1 (the tokens the generation may still take
 * after this round's), then the rejected rows are rolled back: the sequence holds everything but `next`. */
static int next_round(g4_spec *s, const float *final_row, int c, int k, int n, int32_t next, int left, g4_error *err) {
    g4_context *ctx = s->ctx;
    g4_backend *be = ctx->model->be;
    if (!s->scheduled) OPS->copy(be, s->h0, final_row, (size_t)ctx->model->cfg.text.hidden_size * sizeof(float));
    if (s->d->schedule != G4_SCHEDULE_CONSTANT) { /* 1.2: HF's update_candidate_strategy */
        int na = n == k ? s->n_draft + 2 : s->n_draft - 1 > 1 ? s->n_draft - 1 : 1;
        s->n_draft = na < s->cap ? na : s->cap;
        if (s->d->schedule == G4_SCHEDULE_HEURISTIC) s->d->n_draft = s->n_draft;
    }
    s->q0 = c - 1;
    s->q1 = c + k;
    const int c2 = c + n + 1;
    int k2 = s->n_draft < left - 1 ? s->n_draft : left - 1;
    if (k2 > ctx->n_ctx - c2) k2 = ctx->n_ctx - c2;
    s->n_pending = -1;
    if (k2 > 0 && !is_stop(s, next)) {
        if (s->scheduled) {
            s->planned = draft_job(s, next, c2, k2); /* drafted with the step's other requests, before the next step */
            s->planned.h0 = final_row;
        } else {
            g4_error derr; /* (a failed draft is none: the next round drafts again and reports it) */
            s->n_pending = draft(s, next, c2, k2, &derr);
        }
        s->pending_after = next;
    }
    s->roll_back_to = c2 - 1;
    return s->scheduled ? 0 : roll_back(s, err);
}

static int spec_round_locked(g4_spec *s, int32_t last, int budget, g4_sampler *smp, int32_t *out, int *n_out,
                             g4_error *err) {
    g4_context *ctx = s->ctx;
    g4_backend *be = ctx->model->be;
    const int V = ctx->model->cfg.text.vocab_size, H = ctx->model->cfg.text.hidden_size;
    if (!s->ready) return g4_fail(err, "speculative decoding: run the prompt first (g4_spec_prefill)");
    if (last < 0 || last >= V) return g4_fail(err, "token %d is outside the vocabulary (0..%d)", last, V - 1);
    if (budget <= 0) return 0;
    const int c = g4_seq_length(ctx, s->seq) + 1; /* the sequence with `last`; last sits at c - 1 */
    if (c - 1 != s->q1)
        return g4_fail(err, "speculative decoding: sequence %d changed since the last round (%d positions, %d "
                            "expected): run its prompt through g4_spec_prefill", s->seq, c - 1, s->q1);
    int k = s->n_draft < budget - 1 ? s->n_draft : budget - 1;
    if (k > ctx->n_ctx - c) k = ctx->n_ctx - c; /* the verification writes positions c - 1 .. c - 1 + k */
    if (k < 0) k = 0;
    if (s->n_pending >= 0 && s->pending_after == last)
        k = s->n_pending < k ? s->n_pending : k;
    else
        k = draft(s, last, c, k, err); /* nothing drafted for this token yet: from the sequence as it is */
    if (k < 0) return -1;
    s->n_pending = -1;

    /* verification: one step over [last, drafts] */
    s->vtoks[0] = last;
    memcpy(s->vtoks + 1, s->drafts, (size_t)k * sizeof *s->vtoks);
    const int plain = !smp || g4_sampler_is_argmax(smp), greedy = !smp || g4_sampler_is_greedy(smp);
    g4_batch b = {.n_tokens = k + 1, .token = s->vtoks, .seq = s->seqs};
    ctx->kv.tentative = k; /* the drafts' rows are rolled back unless accepted (kv_cache.h) */
    int rc = plain ? g4_decode_greedy(ctx, &b, s->vids, err) : g4_decode(ctx, &b, s->vlogits, err);
    ctx->kv.tentative = 0;
    if (rc) return -1;
    if (!greedy && s->raw_q && k > 0) {
        OPS->to_host(be, s->dlogits, s->ws.logits, (size_t)k * V * sizeof(float));
        OPS->sync(be);
    }

    /* acceptance (4.5), then the next round's state */
    const verify_rows rows = {.ids = plain ? s->vids : NULL, .logits = s->vlogits};
    const int n = accept_round(s, k, &rows, smp, out, err);
    if (n < 0) return -1;
    *n_out = n + 1;
    return next_round(s, g4_step_final_rows(ctx) + (size_t)n * H, c, k, n, out[n], budget - n - 1, err);
}

void g4_spec_rounds(const g4_spec *s, const int **drafted, const int **accepted, int *n) {
    if (drafted) *drafted = s ? s->log.drafted : NULL;
    if (accepted) *accepted = s ? s->log.accepted : NULL;
    if (n) *n = s ? s->log.n : 0;
}

static int spec_draft_locked(g4_spec *s, int32_t last, int k, int32_t *drafts, g4_error *err) {
    if (!s->ready) return g4_fail(err, "speculative decoding: run the prompt first (g4_spec_prefill)");
    if (k < 0 || k > s->cap) return g4_fail(err, "%d drafts: at most %d", k, s->cap);
    if (last < 0 || last >= s->ctx->model->cfg.text.vocab_size)
        return g4_fail(err, "token %d is outside the vocabulary", last);
    const int c = g4_seq_length(s->ctx, s->seq) + 1;
    if (c - 1 != s->q1)
        return g4_fail(err, "speculative decoding: sequence %d changed since the last round", s->seq);
    if (k > 0) {
        const g4_draft_job job = draft_job(s, last, c, k);
        g4_drafter_forward(s->d, &s->ws, &job, 1);
    }
    if (drafts_nan(s, k, err)) return -1;
    memcpy(drafts, s->drafts, (size_t)k * sizeof *drafts);
    s->n_pending = -1;
    return 0;
}

/* The drafter runs on its main model's backend: its steps take turns with the contexts' (g4_decode). */
int g4_spec_prefill_embd(g4_spec *s, const int32_t *prompt, int n_prompt, const float *embd, float *logits,
                         g4_error *err) {
    G4_ARG(s, err);
    G4_ARG(prompt, err);
    G4_ARG(logits, err);
    pthread_mutex_lock(&s->ctx->model->backend_lock);
    int rc = spec_prefill_locked(s, prompt, n_prompt, embd, logits, err);
    pthread_mutex_unlock(&s->ctx->model->backend_lock);
    return rc;
}

int g4_spec_prefill(g4_spec *s, const int32_t *prompt, int n_prompt, float *logits, g4_error *err) {
    return g4_spec_prefill_embd(s, prompt, n_prompt, NULL, logits, err);
}

int g4_spec_round(g4_spec *s, int32_t last, int budget, g4_sampler *smp, int32_t *out, int *n_out, g4_error *err) {
    G4_ARG(n_out, err);
    *n_out = 0;
    G4_ARG(s, err);
    G4_ARG(out, err);
    pthread_mutex_lock(&s->ctx->model->backend_lock);
    int rc = spec_round_locked(s, last, budget, smp, out, n_out, err);
    pthread_mutex_unlock(&s->ctx->model->backend_lock);
    return rc;
}

int g4_spec_draft(g4_spec *s, int32_t last, int k, int32_t *drafts, g4_error *err) {
    G4_ARG(s, err);
    G4_ARG(drafts, err);
    pthread_mutex_lock(&s->ctx->model->backend_lock);
    int rc = spec_draft_locked(s, last, k, drafts, err);
    pthread_mutex_unlock(&s->ctx->model->backend_lock);
    return rc;
}

int g4_spec_new(g4_context *ctx, int seq, g4_drafter *d, const g4_spec_params *params, g4_spec **out,
                g4_error *err) {
    G4_ARG(out, err);
    *out = NULL;
    G4_ARG(ctx, err);
    G4_ARG(d, err);
    pthread_mutex_lock(&ctx->model->backend_lock);
    int rc = spec_new_locked(ctx, seq, d, params, 0, out, err);
    pthread_mutex_unlock(&ctx->model->backend_lock);
    return rc;
}

/* ------------------------------------------------------------------ for the scheduler */

int g4_drafter_kv_history(const g4_drafter *d) {
    if (!d) return -1;
    const int need = d->m->cfg.text.sliding_window + 2 - d->main->cfg.text.sliding_window;
    return need > 0 ? need : -1;
}

int g4_spec_check_scheduled(g4_context *ctx, g4_drafter *d, const g4_spec_params *params, g4_error *err) {
    return spec_check(ctx, -1, d, params, 1, err) < 0 ? -1 : 0;
}

int g4_spec_new_scheduled(g4_context *ctx, g4_drafter *d, const g4_spec_params *params, g4_spec **out,
                          g4_error *err) {
    *out = NULL;
    pthread_mutex_lock(&ctx->model->backend_lock);
    int rc = spec_new_locked(ctx, -1, d, params, 1, out, err);
    pthread_mutex_unlock(&ctx->model->backend_lock);
    if (rc == 0) (*out)->seq = -1;
    return rc;
}

void g4_spec_bind(g4_spec *s, int seq) {
    s->seq = seq;
    s->ready = 0;
    s->n_pending = -1;
    s->planned.k = 0;
    s->roll_back_to = -1;
}

int g4_spec_pending(const g4_spec *s) { return s->ready && s->n_pending > 0 ? s->n_pending : 0; }
const int32_t *g4_spec_drafts(const g4_spec *s) { return s->drafts; }

void g4_spec_set_h0(g4_spec *s, const float *final_row) {
    g4_backend *be = s->d->m->be;
    pthread_mutex_lock(&s->ctx->model->backend_lock);
    OPS->copy(be, s->h0, final_row, (size_t)s->ctx->model->cfg.text.hidden_size * sizeof(float));
    pthread_mutex_unlock(&s->ctx->model->backend_lock);
}

void g4_spec_start(g4_spec *s, int q0, int q1, int32_t next, int left) {
    g4_context *ctx = s->ctx;
    s->q0 = q0;
    s->q1 = q1;
    s->ready = 1;
    s->n_pending = -1;
    s->planned.k = 0;
    const int c = q1 + 1;
    int k = s->n_draft < left - 1 ? s->n_draft : left - 1;
    if (k > ctx->n_ctx - c) k = ctx->n_ctx - c;
    if (k <= 0 || is_stop(s, next)) return;
    s->planned = draft_job(s, next, c, k);
    s->pending_after = next;
}

int g4_spec_verified(g4_spec *s, int k, const int32_t *vids, float *vlogits, const g4_candidates *cand, int w,
                     g4_sampler *smp, int32_t *out, g4_error *err) {
    s->n_pending = -1;
    const verify_rows rows = {.ids = vids, .logits = vlogits, .cand = cand, .w = w};
    return accept_round(s, k, &rows, smp, out, err);
}

void g4_spec_next(g4_spec *s, const float *final_row, int k, int n, int32_t next, int left) {
    pthread_mutex_lock(&s->ctx->model->backend_lock);
    next_round(s, final_row, s->q1 + 1, k, n, next, left, NULL); /* (a scheduled round only plans) */
    pthread_mutex_unlock(&s->ctx->model->backend_lock);
}

/* a step's draftings: one forward per drafter, its rows the most steps first (then by sequence: one order a step) */
static int by_drafter_and_steps(const void *pa, const void *pb) {
    const g4_draft_job *a = pa, *b = pb;
    if (a->s->d != b->s->d) return (uintptr_t)a->s->d < (uintptr_t)b->s->d ? -1 : 1;
    if (a->k != b->k) return a->k > b->k ? -1 : 1;
    return a->s->seq < b->s->seq ? -1 : a->s->seq > b->s->seq;
}

int g4_spec_draft_planned(g4_spec *const *specs, int n, int *rc, g4_error *errs) {
    if (n <= 0) return 0;
    int steps = 0;
    pthread_mutex_lock(&specs[0]->ctx->model->backend_lock);
    g4_draft_job *jobs = malloc((size_t)n * sizeof *jobs);
    int nj = 0;
    for (int i = 0; jobs && i < n; i++)
        if (specs[i]->planned.k > 0) jobs[nj++] = specs[i]->planned;
    if (nj > 1) qsort(jobs, (size_t)nj, sizeof *jobs, by_drafter_and_steps);
    for (int a = 0, b; a < nj; a = b) { /* (out of memory: no drafts this round) */
        g4_drafter *d = jobs[a].s->d;
        for (b = a; b < nj && jobs[b].s->d == d; b++) {}
        if (g4_draft_ws_reserve(d, &d->batch, b - a, jobs[a].k, 0)) continue;
        g4_drafter_forward(d, &d->batch, jobs + a, b - a);
        steps += jobs[a].k;
        for (int j = a; j < b; j++) {
            g4_error derr; /* (a failed draft is none: the next round drafts again and reports it) */
            jobs[j].s->n_pending = drafted(jobs[j].s, jobs[j].k, &derr);
        }
    }
    free(jobs);
    for (int i = 0; i < n; i++) {
        specs[i]->planned.k = 0;
        rc[i] = roll_back(specs[i], &errs[i]);
    }
    pthread_mutex_unlock(&specs[0]->ctx->model->backend_lock);
    return steps;
}
