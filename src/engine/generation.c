/* g4_generation (gemma4c.h): one request on one sequence of a context.
 *
 * A step runs the model (the prompt's uncached part in batch-sized chunks, later one token),
 * samples a token and turns it into events: the token, then the text it makes printable.
 * Text goes token -> streaming detokenizer -> (parse_chat: chat output parser, which splits
 * answer, thinking and tool calls) -> stop strings (answer text only) -> events; the message
 * (g4_generation_message) accumulates exactly the events. The last token is never fed to the
 * model: a generation ends before the step that would. The scheduler (scheduler.c) runs
 * generations made with g4_generation_new_scheduled with its own model steps and the same
 * pieces: it hands each sampled token to g4_generation_take and the events to their callback
 * (engine/generation.h). With a drafter (speculative decoding, engine/speculative.h) the
 * prompt goes through the speculative prefill and every later step is a round of drafts and one
 * verification, which yields one or more tokens.
 * Log-probabilities (params.logprobs) are the log-softmax of the step's raw logits, as vLLM reports
 * them by default (OpenAI's logprobs / top_logprobs). With params.grammar (or json_object: the grammar of any JSON
 * object) the logits of tokens that would not continue the grammar's output are set to -infinity before
 * sampling (engine/grammar.h), the stop ids come only where the output is whole, and the generation stops where
 * nothing more can follow. Neither goes with a drafter (its rounds sample inside). */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "chat/chat.h"
#include "core/error.h"
#include "core/strbuf.h"
#include "engine/context.h"
#include "engine/generation.h"
#include "engine/grammar.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include "engine/stop.h"
#include "tokenizer/tokenizer.h"

#define G4_MAX_TOP_LOGPROBS 20

typedef struct queued {
    g4_event_kind kind;
    int32_t token;
    size_t off, len; /* text in q_text */
} queued;

struct g4_generation {
    g4_context *ctx;          /* NULL for a scheduled generation */
    const g4_model *model;
    const g4_tokenizer *tok; /* NULL: tokens only, no text */
    int seq;
    int32_t *prompt;
    int n_prompt, n_cached, n_fed; /* prompt tokens: all, held by the cache at the start, in the cache now */
    float *embd;                   /* [soft tokens of the prompt, H]: the rows of its placeholders, or NULL */
    int max_new;
    int ignore_eos;
    g4_sampler *sampler;
    int32_t *stop_ids;
    int n_stop_ids;
    g4_stop_matcher *stop;    /* NULL without stop strings */
    int stopped_by_string;
    g4_detok_stream *detok;   /* NULL without a tokenizer */
    g4_chat_parser *parser;   /* parse_chat only */
    g4_chat_accum out;        /* the text events so far */
    int32_t *ids;             /* generated, capacity max_new */
    int n_ids;
    float *logits;            /* [vocab]: the last step's */
    int greedy;               /* plain argmax: the model step picks the id (g4_decode_greedy) */
    int32_t picked;           /* that id */
    int cand_max;             /* g4_context_candidates_max where the logits are in device memory (without a drafter,
                                 log-probabilities or a JSON constraint), else 0: a step whose sampler needs only a
                                 row's top candidates (g4_sampler_candidates_k, at most this many) and its modified
                                 ids' logits brings only those back */
    g4_candidates cand;       /* k > 0: the last step's (one row; a row of ties beyond cap brings its logits);
                                 buffers for the largest k */
    int32_t *extra_id;        /* [G4_TOP_K_MAX] the sampler's modified ids of the step */
    int32_t *seqs;            /* [n_batch] all `seq` */
    g4_spec *spec;            /* with a drafter */
    g4_drafter *drafter;      /* scheduled: params.drafter, params.n_draft (the scheduler's g4_spec verifies its drafts,
                                 rounds: what it kept) */
    int n_draft;
    g4_round_log rounds;
    int32_t *round;           /* [drafts per round + 1] a round's tokens */
    uint8_t *want;            /* [n_batch] */
    int logprobs, n_top;      /* params.logprobs, top_logprobs */
    int have_logprobs;        /* chosen and top describe the last token */
    g4_token_logprob chosen;
    g4_token_logprob top[G4_MAX_TOP_LOGPROBS];
    double lse;               /* log-sum-exp of the step's logits */
    g4_gr_match *grammar;     /* params.grammar or json_object: the output's grammar and where it stands */
    g4_finish finish;
    atomic_int cancel;
    int broken;               /* an error happened: every later call repeats it */
    g4_error err;
    queued *q;                /* the current step's events */
    int q_len, q_next, q_cap;
    g4_strbuf q_text;
    /* scheduled generations (g4_generation_new_scheduled) */
    int scheduled;
    g4_event_fn on_event;     /* gets the events */
    void *on_event_user;
    atomic_int refs;          /* the caller's handle, and the scheduler's while it holds the generation */
    float *embedding;         /* an embedding request: hidden_size floats once finished */
};

/* ------------------------------------------------------------------ events */

static int queue(g4_generation *g, g4_event_kind kind, int32_t token, const char *text, size_t len) {
    if (g->q_len == g->q_cap) {
        int cap = g->q_cap ? 2 * g->q_cap : 8;
        queued *q = realloc(g->q, (size_t)cap * sizeof *q);
        if (!q) return g4_fail(&g->err, "out of memory");
        g->q = q;
        g->q_cap = cap;
    }
    g->q[g->q_len++] = (queued){kind, token, g->q_text.len, len};
    g4_strbuf_put(&g->q_text, text, len);
    g4_strbuf_put(&g->q_text, "", 1); /* each text ends in a NUL */
    if (g->q_text.failed || (kind != G4_EVENT_TOKEN && g4_chat_accum_add(&g->out, kind, text, len)))
        return g4_fail(&g->err, "out of memory");
    return 0;
}

/* An answer, thinking or tool-call piece (the parser's callback too): answer text passes the
 * stop strings first; after a stop string nothing more is shown. */
static int piece(g4_event_kind kind, const char *text, size_t len, void *user) {
    g4_generation *g = user;
    if (g->stopped_by_string) return 0;
    if (g->stop) {
        g4_stop_result r;
        if (kind == G4_EVENT_TEXT) {
            if (g4_stop_push(g->stop, text, len, &r, &g->err)) return -1;
            g->stopped_by_string = r.stopped;
            return r.len ? queue(g, kind, -1, r.text, r.len) : 0;
        }
        g4_stop_flush(g->stop, &r); /* a stop string does not span thinking or a tool call */
        if (r.len && queue(g, G4_EVENT_TEXT, -1, r.text, r.len)) return -1;
    }
    return queue(g, kind, -1, text, len);
}

/* Decoded text: to the chat parser, or all of it is answer text. */
static int decoded(g4_generation *g, const char *text, size_t len) {
    if (!len) return 0;
    return g->parser ? g4_chat_parser_push(g->parser, text, len, &g->err) : piece(G4_EVENT_TEXT, text, len, g);
}

static int token_text(g4_generation *g, int32_t id) {
    if (!g->detok) return 0;
    /* parse_chat decodes with special tokens kept, for the parser's markers; others are not shown */
    if (g->parser && g4_tokenizer_is_special(g->tok, id)) {
        const char *p = g4_tokenizer_piece(g->tok, id);
        if (!p || !g4_chat_reads_token(p)) return 0;
    }
    const char *t;
    size_t n;
    if (g4_detok_stream_push(g->detok, id, &t, &n, &g->err)) return -1;
    return decoded(g, t, n);
}

/* Ends the generation: text still held back is released (unless a stop string ended it); a
 * scheduled generation's last event says it ended. */
static int finish(g4_generation *g, g4_finish why) {
    g->finish = why;
    if (!g->stopped_by_string && g->detok) {
        const char *t;
        size_t n;
        if (g4_detok_stream_flush(g->detok, &t, &n) == 0 && decoded(g, t, n)) return -1;
        if (g->parser && g4_chat_parser_finish(g->parser, &g->err)) return -1;
        if (g->stop) {
            g4_stop_result r;
            g4_stop_flush(g->stop, &r);
            if (r.len && queue(g, G4_EVENT_TEXT, -1, r.text, r.len)) return -1;
        }
    }
    return g->scheduled ? queue(g, G4_EVENT_FINISH, -1, "", 0) : 0;
}

/* -------------------------------------------------------------------- steps */

static int cancelled(g4_generation *g) { return atomic_load_explicit(&g->cancel, memory_order_relaxed) != 0; }

/* One batch step: logits for the sampler, its top candidates, or with a plain argmax the picked id itself. */
static int model_step(g4_generation *g, const g4_batch *b) {
    if (g->greedy) return g4_decode_greedy(g->ctx, b, &g->picked, &g->err);
    const int k = g->cand_max ? g4_generation_candidates_k(g) : 0; /* grows with a penalty's history */
    g->cand.k = k > 0 && k <= g->cand_max ? k : 0;
    if (g->cand.k) {
        g->cand.cap = g4_candidates_cap(k);
        g->cand.n_extra = g4_sampler_candidate_extras(g->sampler, g->extra_id);
        g->cand.extra_id = g->extra_id;
        return g4_decode_candidates(g->ctx, b, &g->cand, &g->err);
    }
    return g4_decode(g->ctx, b, g->logits, &g->err);
}

static int spec_cancelled(void *user) { return cancelled(user); }

/* Runs the model: the rest of the prompt (checking for a cancel between chunks), or the last
 * token. Returns 1 when cancelled, 0 with a fresh result, -1 on error. */
static int run_model(g4_generation *g) {
    g4_context *ctx = g->ctx;
    if (cancelled(g)) return 1;
    /* the sequence holds what this generation fed it (the drafter's rounds check their own): a reset or truncate
     * of it while the generation runs would have it go on from another state */
    const int want = g->n_fed < g->n_prompt ? g->n_fed : g->n_prompt + g->n_ids - 1;
    if (!g->spec && !g->scheduled && g4_seq_length(ctx, g->seq) != want)
        return g4_fail(&g->err, "sequence %d changed under its generation (%d positions, %d expected): it was reset "
                       "or truncated while the generation ran", g->seq, g4_seq_length(ctx, g->seq), want);
    if (g->spec && g->n_fed < g->n_prompt) { /* logits of the last row; the drafter keeps what it needs */
        const float *embd = g->embd ? g->embd + (size_t)g4_count_soft_tokens(ctx->model, g->prompt, g->n_fed) *
                                                    ctx->model->cfg.text.hidden_size
                                    : NULL;
        int r = g4_spec_prefill_embd(g->spec, g->prompt + g->n_fed, g->n_prompt - g->n_fed, embd, g->logits, &g->err);
        if (r == 0) g->n_fed = g->n_prompt;
        return r;
    }
    if (g->n_fed == g->n_prompt) {
        g4_batch b = {.n_tokens = 1, .token = &g->ids[g->n_ids - 1], .seq = g->seqs};
        return model_step(g, &b);
    }
    const g4_model *m = ctx->model;
    while (g->n_fed < g->n_prompt) {
        if (g->n_fed > g->n_cached && cancelled(g)) return 1;
        const int32_t *ids = g->prompt + g->n_fed;
        int k = g4_step_length(m, ids, g->n_prompt - g->n_fed, ctx->n_batch, &g->err); /* an image in one step */
        if (k < 0) return -1;
        for (int j = 0; j < k; j++) g->want[j] = g->n_fed + j == g->n_prompt - 1;
        g4_batch b = {.n_tokens = k, .token = ids, .seq = g->seqs, .want_logits = g->want};
        if (g->embd) { /* the rows of this step's placeholders: those before it were taken by earlier steps */
            b.embd = g->embd + (size_t)g4_count_soft_tokens(m, g->prompt, g->n_fed) * m->cfg.text.hidden_size;
            b.n_embd = g4_count_soft_tokens(m, ids, k);
        }
        if (model_step(g, &b)) return -1;
        g->n_fed += k;
    }
    return 0;
}

static int is_stop_id(const g4_generation *g, int32_t id) {
    for (int i = 0; i < g->n_stop_ids; i++)
        if (g->stop_ids[i] == id) return 1;
    return 0;
}

/* The step's log-sum-exp and its n_top most likely tokens, from the raw logits l (before any constraint). */
static void step_logprobs(g4_generation *g, const float *l) {
    const int V = g->model->cfg.text.vocab_size;
    float mx = -INFINITY;
    for (int i = 0; i < V; i++)
        if (l[i] > mx) mx = l[i];
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)l[i] - mx);
    g->lse = mx + log(sum);
    int n = 0; /* top: insertion into a short list kept in order (larger first, then lower id) */
    for (int i = 0; i < V && g->n_top; i++) {
        if (n == g->n_top && !(l[i] > g->top[n - 1].logprob)) continue;
        int j = n < g->n_top ? n++ : n - 1;
        while (j > 0 && l[i] > g->top[j - 1].logprob) {
            g->top[j] = g->top[j - 1];
            j--;
        }
        g->top[j] = (g4_token_logprob){i, l[i]};
    }
    for (int i = 0; i < n; i++) g->top[i].logprob = (float)(g->top[i].logprob - g->lse);
}

/* A generated token: its events, then the stop conditions. 1 when it ended the generation, 0 or -1. */
static int take(g4_generation *g, int32_t id) {
    if (g->grammar && g4_gr_match_accept(g->grammar, id))
        return g4_fail(&g->err, "grammar: token %d does not continue the constrained output", id);
    g->ids[g->n_ids++] = id;
    g4_sampler_accept(g->sampler, id);
    if (queue(g, G4_EVENT_TOKEN, id, "", 0)) return -1;
    g4_finish why = G4_FINISH_NONE;
    if (is_stop_id(g, id)) { /* a stop token is not shown */
        why = G4_FINISH_STOP;
    } else {
        if (token_text(g, id)) return -1;
        if (g->stopped_by_string || (g->parser && !g->ignore_eos && g4_chat_parser_ended(g->parser)) ||
            (g->grammar && g4_gr_match_done(g->grammar)))
            why = G4_FINISH_STOP;
        else if (g->n_ids == g->max_new)
            why = G4_FINISH_LENGTH;
    }
    return why == G4_FINISH_NONE ? 0 : finish(g, why) ? -1 : 1;
}

/* A speculative round: its tokens in order, up to one that ends the generation; the sequence then keeps what
 * plain decoding would have fed (everything but the newest token). */
static int spec_step(g4_generation *g) {
    if (cancelled(g)) return finish(g, G4_FINISH_CANCELLED);
    int n;
    if (g4_spec_round(g->spec, g->ids[g->n_ids - 1], g->max_new - g->n_ids, g->sampler, g->round, &n, &g->err))
        return -1;
    for (int i = 0; i < n; i++) {
        int r = take(g, g->round[i]);
        if (r < 0) return -1;
        if (r > 0 && i + 1 < n) return g4_seq_truncate(g->ctx, g->seq, g->n_prompt + g->n_ids - 1, &g->err);
        if (r > 0) break;
    }
    return 0;
}

/* The next id from a row of the step's logits (-1: every id banned): the log-probabilities first, from the logits
 * as the model computed them, then the grammar masks the row (in place) and the sampler draws. */
static int32_t pick(g4_generation *g, float *logits) {
    if (g->logprobs) step_logprobs(g, logits);
    if (g->grammar) g4_gr_match_mask(g->grammar, logits);
    const int32_t id = g4_sampler_sample(g->sampler, logits);
    if (id >= 0 && g->logprobs) {
        g->chosen = (g4_token_logprob){id, (float)(logits[id] - g->lse)}; /* a drawn id's logit is unmasked */
        g->have_logprobs = 1;
    }
    return id;
}

static int step(g4_generation *g) {
    if (g->spec && g->n_ids > 0) return spec_step(g);
    int r = run_model(g);
    if (r) return r < 0 ? -1 : finish(g, G4_FINISH_CANCELLED);
    int32_t id = g->greedy && !g->spec ? g->picked
                 : g->cand.k && g->cand.count[0] >= 0
                     ? g4_sampler_sample_candidates(g->sampler, g->cand.ids, g->cand.vals, g->cand.count[0],
                                                    g->cand.extra_vals)
                     : pick(g, g->logits);
    if (id < 0) return g4_fail(&g->err, "no token can be drawn: every token is banned");
    return take(g, id) < 0 ? -1 : 0;
}

int g4_generation_next(g4_generation *g, g4_event *ev, g4_error *err) {
    G4_ARG(g, err);
    G4_ARG(ev, err);
    if (g->scheduled) return g4_fail(err, "a scheduled generation hands its events to its callback");
    if (g->broken) {
        if (err) *err = g->err;
        return -1;
    }
    if (g->q_next == g->q_len && !g->finish) {
        g->q_len = g->q_next = 0;
        g4_strbuf_clear(&g->q_text);
        if (step(g)) {
            g->broken = 1;
            if (err) *err = g->err;
            return -1;
        }
    }
    if (g->q_next == g->q_len) return 0;
    const queued *q = &g->q[g->q_next++];
    *ev = (g4_event){q->kind, q->token, g->q_text.p + q->off, q->len};
    return 1;
}

int g4_generation_step(g4_generation *g, g4_event_fn on_event, void *user, g4_error *err) {
    G4_ARG(g, err);
    g4_event ev;
    int rc, stepped = 0;
    /* the events already queued, then one step's (g4_generation_next steps when the queue is empty) */
    for (;;) {
        if (g->q_next == g->q_len) {
            if (stepped || g->finish) break;
            stepped = 1;
        }
        if ((rc = g4_generation_next(g, &ev, err)) != 1) return rc;
        if (on_event && on_event(&ev, user)) g4_generation_cancel(g);
    }
    return g->finish == G4_FINISH_NONE;
}

int g4_generation_run(g4_generation *g, g4_event_fn on_event, void *user, g4_error *err) {
    G4_ARG(g, err);
    g4_event ev;
    int rc;
    while ((rc = g4_generation_next(g, &ev, err)) == 1)
        if (on_event && on_event(&ev, user)) g4_generation_cancel(g);
    return rc;
}

void g4_generation_cancel(g4_generation *g) {
    if (g) atomic_store_explicit(&g->cancel, 1, memory_order_relaxed);
}

g4_finish g4_generation_finish(const g4_generation *g) { return g ? g->finish : G4_FINISH_NONE; }

const int32_t *g4_generation_tokens(const g4_generation *g, int *n) {
    if (n) *n = g ? g->n_ids : 0;
    return g ? g->ids : NULL;
}

int g4_generation_n_cached(const g4_generation *g) { return g ? g->n_cached : 0; }

int g4_generation_logprobs(const g4_generation *g, g4_token_logprob *chosen, const g4_token_logprob **top,
                           int *n_top) {
    if (!g || !g->have_logprobs) return -1;
    if (chosen) *chosen = g->chosen;
    if (top) *top = g->top;
    if (n_top) *n_top = g->n_top;
    return 0;
}

void g4_generation_rounds(const g4_generation *g, const int **drafted, const int **accepted, int *n) {
    const int *d_unused, *a_unused;
    int n_unused;
    if (!drafted) drafted = &d_unused;
    if (!accepted) accepted = &a_unused;
    if (!n) n = &n_unused;
    *drafted = *accepted = NULL;
    *n = 0;
    if (g && g->spec) {
        g4_spec_rounds(g->spec, drafted, accepted, n);
    } else if (g) {
        *drafted = g->rounds.drafted, *accepted = g->rounds.accepted, *n = g->rounds.n;
    }
}

int g4_generation_message(const g4_generation *g, g4_chat_message *out, g4_error *err) {
    G4_ARG(out, err);
    memset(out, 0, sizeof *out);
    G4_ARG(g, err);
    return g4_chat_accum_message(&g->out, out, err);
}

/* ------------------------------------------------------------------- start */

void g4_generation_free(g4_generation *g) {
    if (!g) return;
    if (g->scheduled) {
        /* the scheduler may still hold it: it is cancelled, and the last of the two lets it go */
        g4_generation_cancel(g);
        if (atomic_fetch_sub(&g->refs, 1) > 1) return;
    }
    free(g->embedding);
    free(g->prompt);
    free(g->embd);
    g4_sampler_free(g->sampler);
    free(g->stop_ids);
    if (g->stop) g4_stop_free(g->stop);
    g4_detok_stream_free(g->detok);
    g4_chat_parser_free(g->parser);
    g4_chat_accum_free(&g->out);
    g4_gr_match_free(g->grammar);
    free(g->ids);
    free(g->logits);
    free(g->cand.ids);
    free(g->cand.vals);
    free(g->cand.count);
    free((void *)g->cand.extra_row);
    free(g->cand.extra_vals);
    free(g->extra_id);
    free(g->seqs);
    free(g->want);
    g4_spec_free(g->spec);
    g4_round_log_free(&g->rounds);
    free(g->round);
    free(g->q);
    g4_strbuf_free(&g->q_text);
    free(g);
}

/* Keeps what the sequence holds of the prompt (at least one token is left to run, for logits). */
static void reuse_prefix(g4_generation *g) {
    int n_held;
    const int32_t *held = g4_seq_tokens(g->ctx, g->seq, &n_held);
    int same = 0;
    while (same < n_held && same < g->n_prompt && held[same] == g->prompt[same]) same++;
    if (same == g->n_prompt) same--;
    if (g4_seq_truncate(g->ctx, g->seq, same, NULL)) {
        g4_seq_reset(g->ctx, g->seq); /* the sliding window's ring cannot roll back that far */
        same = 0;
    }
    g->n_cached = g->n_fed = same;
}

typedef struct constrain_tables {
    g4_gr_tokens *tokens;
    g4_grammar *json_object;
} constrain_tables;

static void constrain_free(void *p) {
    constrain_tables *c = p;
    g4_gr_tokens_free(c->tokens);
    g4_grammar_free(c->json_object);
    free(c);
}

/* The model's tables for constrained decoding (made once: about 0.1 s for Gemma's 262144 tokens, which a
 * scheduler's step would pay for every request), shared by its generations. */
static int constrain_of(const g4_model *cm, constrain_tables **out, g4_error *err) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    g4_model *m = (g4_model *)cm; /* the tables are a cache of what the model holds */
    pthread_mutex_lock(&mu);
    int rc = 0;
    if (!m->constrain) {
        constrain_tables *c = calloc(1, sizeof *c);
        if (!c) rc = g4_fail(err, "out of memory");
        else if ((rc = g4_gr_tokens_new(m->tok, m->cfg.text.vocab_size, &c->tokens, err)) == 0)
            rc = g4_grammar_json_schema("{\"type\": \"object\"}", &c->json_object, err);
        if (rc) {
            if (c) constrain_free(c);
        } else {
            m->constrain = c;
            m->constrain_free = constrain_free;
        }
    }
    *out = m->constrain;
    pthread_mutex_unlock(&mu);
    return rc;
}

/* The grammar's walk of a generation. The tokens that end a constrained output where it is whole: the stop ids, and
 * with parse_chat the chat parser's ends (chat_output.c: a turn's end, <eos>, a tool response's start). */
static int constrain_start(g4_generation *g, const g4_generation_params *p, g4_error *err) {
    const g4_model *m = g->model;
    if (!g->tok) return g4_fail(err, "constrained output needs the model's tokenizer.json");
    if (p->json_object && p->grammar) return g4_fail(err, "generation: json_object and a grammar: give one of them");
    constrain_tables *c;
    if (constrain_of(m, &c, err)) return -1;
    static const char *const chat_ends[] = {"<turn|>", "<eos>", "<|tool_response>"};
    int32_t *ends = malloc(((size_t)g->n_stop_ids + 3) * sizeof *ends);
    if (!ends) return g4_fail(err, "out of memory");
    int n = 0;
    for (int i = 0; i < g->n_stop_ids; i++) ends[n++] = g->stop_ids[i];
    for (int i = 0; p->parse_chat && i < 3; i++) {
        int32_t id = g4_tokenizer_token_id(g->tok, chat_ends[i]);
        if (id >= 0) ends[n++] = id;
    }
    /* a chat reply may think first (its thinking channel, then the constrained answer), as vLLM's reasoning
       parsers let it */
    const int rc = g4_gr_match_new(p->grammar ? p->grammar : c->json_object, c->tokens, g->tok, ends, n,
                                   p->parse_chat, &g->grammar, err);
    free(ends);
    return rc;
}

/* What every generation needs: token limit, sampler, stop ids and strings, text decoding. */
static int setup(g4_generation *g, const g4_generation_params *p, int n_ctx, g4_error *err) {
    const g4_model *m = g->model;
    const int V = m->cfg.text.vocab_size;
    const int room = n_ctx - g->n_prompt;
    if (room <= 0)
        return g4_fail(err, "the prompt (%d tokens) does not fit the context of %d positions", g->n_prompt, n_ctx);
    g->max_new = p->max_new_tokens > 0 ? p->max_new_tokens : g4_generation_config_max_new(&m->gen_config, g->n_prompt);
    if (g->max_new <= 0 || g->max_new > room) g->max_new = room;
    g->ignore_eos = p->ignore_eos;
    if (p->max_new_tokens < 0 || p->n_stop_ids < 0 || p->n_stop_strings < 0)
        return g4_fail(err, "generation: negative max_new_tokens, n_stop_ids or n_stop_strings");
    if ((p->n_stop_ids && !p->stop_ids) || (p->n_stop_strings && !p->stop_strings))
        return g4_fail(err, "generation: %d stop ids and %d stop strings without their arrays", p->n_stop_ids,
                       p->n_stop_strings);
    if (p->top_logprobs < 0 || p->top_logprobs > G4_MAX_TOP_LOGPROBS)
        return g4_fail(err, "generation: top_logprobs must be 0..%d, got %d", G4_MAX_TOP_LOGPROBS, p->top_logprobs);
    g->logprobs = p->logprobs != 0;
    g->n_top = g->logprobs ? p->top_logprobs : 0;
    g4_sampler_params sp;
    if (p->sampling) sp = *p->sampling;
    else g4_model_sampler_params(m, &sp);
    if (g4_sampler_new(&sp, V, &g->sampler, err)) return -1;
    /* argmax with nothing that changes logits: the model step finds it (no logits copied back) */
    /* log-probabilities and the JSON constraint need the logits */
    g->greedy = g4_sampler_is_argmax(g->sampler) && !g->logprobs && !p->json_object && !p->grammar;
    if (!p->penalties_output_only)
        g4_sampler_accept_many(g->sampler, g->prompt, g->n_prompt);
    else if (g4_sampler_accept_prompt(g->sampler, g->prompt, g->n_prompt)) /* vLLM: the repetition penalty's */
        return g4_fail(err, "generation: out of memory (the prompt's ids for the repetition penalty)");

    const int n_eos = p->ignore_eos ? 0 : m->gen_config.n_eos;
    g->stop_ids = malloc((size_t)(n_eos + p->n_stop_ids + 1) * sizeof *g->stop_ids);
    if (!g->stop_ids) return g4_fail(err, "out of memory");
    for (int i = 0; i < n_eos; i++) g->stop_ids[g->n_stop_ids++] = m->gen_config.eos_ids[i];
    for (int i = 0; i < p->n_stop_ids; i++) g->stop_ids[g->n_stop_ids++] = p->stop_ids[i];

    g->tok = m->tok;
    if (!g->tok && (p->n_stop_strings || p->parse_chat))
        return g4_fail(err, "%s need the model's tokenizer.json", p->parse_chat ? "chat replies" : "stop strings");
    if (g->tok && !(g->detok = g4_detok_stream_new(g->tok, !p->parse_chat))) return g4_fail(err, "out of memory");
    if (p->n_stop_strings && g4_stop_new(p->stop_strings, p->n_stop_strings, &g->stop, err)) return -1;
    if (p->parse_chat && !(g->parser = g4_chat_parser_new(piece, g))) return g4_fail(err, "out of memory");
    if (!(g->ids = malloc((size_t)g->max_new * sizeof *g->ids))) return g4_fail(err, "out of memory");

    if ((p->json_object || p->grammar) && constrain_start(g, p, err)) return -1;
    return 0;
}

/* What a generation running its own steps on a sequence needs besides. */
static int setup_seq(g4_generation *g, const g4_generation_params *p, g4_error *err) {
    const size_t nb = (size_t)g->ctx->n_batch;
    g->logits = malloc((size_t)g->model->cfg.text.vocab_size * sizeof *g->logits);
    g->seqs = malloc(nb * sizeof *g->seqs);
    g->want = malloc(nb);
    if (!g->logits || !g->seqs || !g->want) return g4_fail(err, "out of memory");
    for (size_t i = 0; i < nb; i++) g->seqs[i] = g->seq;
    if (p->drafter && (g->logprobs || p->json_object || p->grammar))
        return g4_fail(err, "generation: logprobs and constrained output do not go with a drafter");
    if (p->drafter) { /* drafting stops at the generation's stop ids (transformers: the eos ids) */
        g4_spec_params spp = {.n_draft = p->n_draft, .stop_ids = g->stop_ids, .n_stop_ids = g->n_stop_ids,
                              .cancelled = spec_cancelled, .cancelled_user = g};
        if (g4_spec_new(g->ctx, g->seq, p->drafter, &spp, &g->spec, err)) return -1;
        if (!(g->round = malloc(((size_t)g->spec->cap + 1) * sizeof *g->round))) return g4_fail(err, "out of memory");
    }
    const int cand_max = g4_context_candidates_max(g->ctx);
    if (!g->greedy && !g->spec && !g->logprobs && !g->grammar && cand_max > 0) {
        const size_t cap = (size_t)g4_candidates_cap(G4_TOP_K_MAX);
        g->cand_max = cand_max;
        g->cand = (g4_candidates){.ids = malloc(cap * sizeof(int32_t)), .count = malloc(sizeof(int32_t)),
                                  .vals = malloc(cap * sizeof(float)), .fallback = g->logits};
        g->cand.extra_row = calloc(G4_TOP_K_MAX, sizeof(int32_t)); /* one row: row 0 */
        g->cand.extra_vals = malloc(G4_TOP_K_MAX * sizeof(float));
        g->extra_id = malloc(G4_TOP_K_MAX * sizeof(int32_t));
        if (!g->cand.ids || !g->cand.count || !g->cand.vals || !g->cand.extra_row || !g->cand.extra_vals ||
            !g->extra_id)
            return g4_fail(err, "out of memory");
    }
    reuse_prefix(g);
    return 0;
}

/* A generation with a copy of the prompt (checked against the vocabulary), not yet set up. */
static g4_generation *generation_new(const g4_model *m, const int32_t *prompt, int n_prompt, g4_error *err) {
    if (n_prompt <= 0 || !prompt) {
        g4_fail(err, "the prompt is empty");
        return NULL;
    }
    const int V = m->cfg.text.vocab_size;
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V) {
            g4_fail(err, "prompt token %d at %d is outside the vocabulary (0..%d)", prompt[i], i, V - 1);
            return NULL;
        }
    g4_generation *g = calloc(1, sizeof *g);
    if (!g || !(g->prompt = malloc((size_t)n_prompt * sizeof *g->prompt))) {
        free(g);
        g4_fail(err, "out of memory");
        return NULL;
    }
    g->model = m;
    g->n_prompt = n_prompt;
    atomic_init(&g->cancel, 0);
    atomic_init(&g->refs, 1);
    memcpy(g->prompt, prompt, (size_t)n_prompt * sizeof *prompt);
    return g;
}

/* The prompt's placeholders become the inputs' soft tokens (params.media): the prompt is expanded and the rows of
 * its soft tokens kept in g->embd. */
static int expand_media(g4_generation *g, const g4_generation_params *p, g4_error *err) {
    if (p->n_media < 0 || (p->n_media && !p->media))
        return g4_fail(err, "generation: n_media %d with media %s", p->n_media, p->media ? "given" : "NULL");
    if (!p->n_media) return 0;
    int32_t *expanded;
    int n_expanded, n_embd;
    if (g4_prompt_expand(g->model, g->prompt, g->n_prompt, p->media, p->n_media, &expanded, &n_expanded, &g->embd,
                         &n_embd, err))
        return -1;
    free(g->prompt);
    g->prompt = expanded;
    g->n_prompt = n_expanded;
    return 0;
}

int g4_generation_start(g4_context *ctx, int seq, const int32_t *prompt, int n_prompt,
                        const g4_generation_params *params, g4_generation **out, g4_error *err) {
    G4_ARG(out, err);
    *out = NULL;
    G4_ARG(ctx, err);
    if (ctx->scheduler)
        return g4_fail(err, "the context's sequences belong to its scheduler: submit the request there "
                            "(g4_scheduler_submit)");
    if (seq < 0 || seq >= ctx->n_seq) return g4_fail(err, "sequence %d is outside 0..%d", seq, ctx->n_seq - 1);
    g4_generation_params none = {0};
    const g4_generation_params *p = params ? params : &none;
    g4_generation *g = generation_new(ctx->model, prompt, n_prompt, err);
    if (!g) return -1;
    g->ctx = ctx;
    g->seq = seq;
    if (expand_media(g, p, err) || setup(g, p, ctx->n_ctx, err) || setup_seq(g, p, err)) {
        g4_generation_free(g);
        return -1;
    }
    *out = g;
    return 0;
}

/* ------------------------------------------------------------ for the scheduler */

int g4_generation_new_scheduled(const g4_model *m, int n_ctx, const int32_t *prompt, int n_prompt,
                                const g4_generation_params *params, int embed, g4_event_fn on_event, void *user,
                                g4_generation **out, g4_error *err) {
    *out = NULL;
    g4_generation_params none = {0};
    g4_generation *g = generation_new(m, prompt, n_prompt, err);
    if (!g) return -1;
    g->scheduled = 1;
    g->seq = -1;
    g->on_event = on_event;
    g->on_event_user = user;
    atomic_init(&g->refs, 2);
    if (embed) {
        if (n_prompt > n_ctx) {
            g4_fail(err, "%d tokens do not fit the context of %d positions", n_prompt, n_ctx);
        } else if (!(g->embedding = malloc((size_t)m->cfg.text.hidden_size * sizeof *g->embedding))) {
            g4_fail(err, "out of memory");
        } else {
            *out = g;
            return 0;
        }
    } else if (expand_media(g, params ? params : &none, err) == 0 && setup(g, params ? params : &none, n_ctx, err) == 0) {
        if (params && params->drafter && (g->logprobs || params->json_object || params->grammar)) {
            g4_fail(err, "generation: logprobs and constrained output do not go with a drafter");
        } else {
            g->drafter = params ? params->drafter : NULL;
            g->n_draft = params ? params->n_draft : 0;
            *out = g;
            return 0;
        }
    }
    atomic_store(&g->refs, 1);
    g4_generation_free(g);
    return -1;
}

int g4_generation_max_new(const g4_generation *g) { return g->max_new; }
int g4_generation_left(const g4_generation *g) { return g->max_new - g->n_ids; }
g4_drafter *g4_generation_drafter(const g4_generation *g, g4_spec_params *p) {
    *p = (g4_spec_params){.n_draft = g->n_draft, .stop_ids = g->stop_ids, .n_stop_ids = g->n_stop_ids};
    return g->drafter;
}
void g4_generation_add_round(g4_generation *g, int drafted, int accepted) {
    g4_error e; /* (out of memory: the round is not recorded) */
    g4_round_log_add(&g->rounds, drafted, accepted, &e);
}
g4_sampler *g4_generation_sampler(g4_generation *g) { return g->sampler; }
int g4_generation_is_argmax(const g4_generation *g) { return g->greedy; }
int g4_generation_candidates_k(const g4_generation *g) {
    return g->logprobs || g->grammar ? 0 : g4_sampler_candidates_k(g->sampler);
}
int g4_generation_candidate_extras(const g4_generation *g, int32_t *ids) {
    return g4_sampler_candidate_extras(g->sampler, ids);
}
int32_t g4_generation_sample_candidates(g4_generation *g, const int32_t *ids, const float *vals, int n,
                                        const float *extra_vals) {
    return g4_sampler_sample_candidates(g->sampler, ids, vals, n, extra_vals);
}
int g4_generation_cancelled(const g4_generation *g) { return cancelled((g4_generation *)g); }
int32_t g4_generation_sample(g4_generation *g, float *logits) { return pick(g, logits); }
const int32_t *g4_generation_prompt(const g4_generation *g, int *n) {
    *n = g->n_prompt;
    return g->prompt;
}
const float *g4_generation_embd(const g4_generation *g) { return g->embd; }
float *g4_generation_embedding_out(g4_generation *g) { return g->embedding; }
void g4_generation_set_cached(g4_generation *g, int n_cached) { g->n_cached = n_cached; }

void g4_generation_take(g4_generation *g, int32_t id) {
    if (id < 0) g4_fail(&g->err, "no token can be drawn: every token is banned");
    if (id < 0 || take(g, id) < 0) g4_generation_end(g, G4_FINISH_ERROR);
}

void g4_generation_fail(g4_generation *g, const char *why) {
    if (g->finish) return;
    g4_fail(&g->err, "%s", why);
    g4_generation_end(g, G4_FINISH_ERROR);
}

void g4_generation_end(g4_generation *g, g4_finish why) {
    if (g->finish) return;
    if (why == G4_FINISH_ERROR) {
        g->finish = why;
        g->broken = 1;
        queue(g, G4_EVENT_FINISH, -1, "", 0);
    } else if (finish(g, why)) {
        g4_generation_end(g, G4_FINISH_ERROR);
    }
}

void g4_generation_deliver(g4_generation *g) {
    /* no callbacks once the caller freed its handle */
    for (int i = 0; i < g->q_len && g->on_event && atomic_load(&g->refs) > 1; i++) {
        const queued *q = &g->q[i];
        g4_event ev = {q->kind, q->token, g->q_text.p + q->off, q->len};
        if (g->on_event(&ev, g->on_event_user)) g4_generation_cancel(g);
    }
    g->q_len = 0;
    g4_strbuf_clear(&g->q_text);
}

void g4_generation_release(g4_generation *g) {
    if (atomic_fetch_sub(&g->refs, 1) == 1) {
        atomic_store(&g->refs, 1); /* the caller is gone: free it as an unscheduled one */
        g->scheduled = 0;
        g4_generation_free(g);
    }
}

const char *g4_generation_error(const g4_generation *g) { return g && g->broken ? g->err.msg : NULL; }

const float *g4_generation_embedding(const g4_generation *g) {
    return g && g->embedding && g->finish == G4_FINISH_STOP ? g->embedding : NULL;
}

/* ------------------------------------------------------------- chat replies */

int g4_chat_reply_prompt(const g4_chat *c, const g4_model *m, g4_tokens *toks, g4_error *err) {
    if (!m->tok) return g4_fail(err, "chat replies need the model's tokenizer.json");
    char *text = NULL;
    size_t len;
    /* the template writes <bos> itself */
    int rc = g4_chat_render_for_reply(c, &text, &len, err) == 0 && g4_tokenize(m->tok, text, len, 0, toks, err) == 0
                 ? 0 : -1;
    free(text);
    return rc;
}

int g4_chat_start(const g4_chat *c, g4_context *ctx, int seq, const g4_generation_params *params,
                  g4_generation **out, g4_error *err) {
    G4_ARG(out, err);
    *out = NULL;
    G4_ARG(c, err);
    G4_ARG(ctx, err);
    g4_tokens toks = {0};
    int rc = -1;
    if (g4_chat_reply_prompt(c, ctx->model, &toks, err) == 0) {
        g4_generation_params p = {0};
        if (params) p = *params;
        p.parse_chat = 1;
        rc = g4_generation_start(ctx, seq, toks.ids, (int)toks.n, &p, out, err);
    }
    free(toks.ids);
    return rc;
}

int g4_chat_add_reply(g4_chat *c, const g4_generation *g, g4_error *err) {
    G4_ARG(c, err);
    G4_ARG(g, err);
    g4_chat_message m;
    if (g4_generation_message(g, &m, err)) return -1;
    json_t *msg = json_pack("{s:s,s:s}", "role", "assistant", "content", m.content);
    if (msg && m.n_tool_calls) {
        json_t *calls = json_loads(m.tool_calls, 0, NULL), *wrapped = json_array();
        size_t i;
        json_t *call;
        json_array_foreach(calls, i, call) {
            json_array_append_new(wrapped, json_pack("{s:s,s:O}", "type", "function", "function", call));
        }
        json_object_set_new(msg, "tool_calls", wrapped);
        json_decref(calls);
    }
    g4_chat_message_free(&m);
    return g4_chat_add_object(c, msg, err);
}
