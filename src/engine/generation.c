/* g4_generation (gemma4c.h): one request on one sequence of a context.
 *
 * A step runs the model (the prompt's uncached part in batch-sized chunks, later one token),
 * samples a token and turns it into events: the token, then the text it makes printable.
 * Text goes token -> streaming detokenizer -> (parse_chat: chat output parser, which splits
 * answer, thinking and tool calls) -> stop strings (answer text only) -> events; the message
 * (g4_generation_message) accumulates exactly the events. The last token is never fed to the
 * model: a generation ends before the step that would. A batching scheduler reuses the same
 * pieces with its own model steps. With a drafter (speculative decoding, engine/speculative.h) the
 * prompt goes through the speculative prefill and every later step is a round of drafts and one
 * verification, which yields one or more tokens. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "chat/chat.h"
#include "core/error.h"
#include "core/strbuf.h"
#include "engine/context.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include "engine/stop.h"
#include "tokenizer/tokenizer.h"

typedef struct queued {
    g4_event_kind kind;
    int32_t token;
    size_t off, len; /* text in q_text */
} queued;

struct g4_generation {
    g4_context *ctx;
    const g4_tokenizer *tok; /* NULL: tokens only, no text */
    int seq;
    int32_t *prompt;
    int n_prompt, n_cached, n_fed; /* prompt tokens: all, held by the cache at the start, in the cache now */
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
    int32_t *seqs;            /* [n_batch] all `seq` */
    g4_spec *spec;            /* with a drafter */
    int32_t *round;           /* [drafts per round + 1] a round's tokens */
    uint8_t *want;            /* [n_batch] */
    g4_finish finish;
    atomic_int cancel;
    int broken;               /* an error happened: every later call repeats it */
    g4_error err;
    queued *q;                /* the current step's events */
    int q_len, q_next, q_cap;
    g4_strbuf q_text;
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

/* Ends the generation: text still held back is released (unless a stop string ended it). */
static int finish(g4_generation *g, g4_finish why) {
    g->finish = why;
    if (g->stopped_by_string || !g->detok) return 0;
    const char *t;
    size_t n;
    if (g4_detok_stream_flush(g->detok, &t, &n) == 0 && decoded(g, t, n)) return -1;
    if (g->parser && g4_chat_parser_finish(g->parser, &g->err)) return -1;
    if (g->stop) {
        g4_stop_result r;
        g4_stop_flush(g->stop, &r);
        if (r.len && queue(g, G4_EVENT_TEXT, -1, r.text, r.len)) return -1;
    }
    return 0;
}

/* -------------------------------------------------------------------- steps */

static int cancelled(g4_generation *g) { return atomic_load_explicit(&g->cancel, memory_order_relaxed) != 0; }

/* One batch step: logits for the sampler, or with a plain argmax the picked id itself. */
static int model_step(g4_generation *g, const g4_batch *b) {
    return g->greedy ? g4_decode_greedy(g->ctx, b, &g->picked, &g->err) : g4_decode(g->ctx, b, g->logits, &g->err);
}

static int spec_cancelled(void *user) { return cancelled(user); }

/* Runs the model: the rest of the prompt (checking for a cancel between chunks), or the last
 * token. Returns 1 when cancelled, 0 with a fresh result, -1 on error. */
static int run_model(g4_generation *g) {
    g4_context *ctx = g->ctx;
    if (cancelled(g)) return 1;
    if (g->spec && g->n_fed < g->n_prompt) { /* logits of the last row; the drafter keeps what it needs */
        int r = g4_spec_prefill(g->spec, g->prompt + g->n_fed, g->n_prompt - g->n_fed, g->logits, &g->err);
        if (r == 0) g->n_fed = g->n_prompt;
        return r;
    }
    if (g->n_fed == g->n_prompt) {
        g4_batch b = {1, &g->ids[g->n_ids - 1], g->seqs, NULL};
        return model_step(g, &b);
    }
    while (g->n_fed < g->n_prompt) {
        if (g->n_fed > g->n_cached && cancelled(g)) return 1;
        int k = g->n_prompt - g->n_fed < ctx->n_batch ? g->n_prompt - g->n_fed : ctx->n_batch;
        for (int j = 0; j < k; j++) g->want[j] = g->n_fed + j == g->n_prompt - 1;
        g4_batch b = {k, g->prompt + g->n_fed, g->seqs, g->want};
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

/* A generated token: its events, then the stop conditions. 1 when it ended the generation, 0 or -1. */
static int take(g4_generation *g, int32_t id) {
    g->ids[g->n_ids++] = id;
    g4_sampler_accept(g->sampler, id);
    if (queue(g, G4_EVENT_TOKEN, id, "", 0)) return -1;
    g4_finish why = G4_FINISH_NONE;
    if (is_stop_id(g, id)) { /* a stop token is not shown */
        why = G4_FINISH_STOP;
    } else {
        if (token_text(g, id)) return -1;
        if (g->stopped_by_string || (g->parser && !g->ignore_eos && g4_chat_parser_ended(g->parser)))
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

static int step(g4_generation *g) {
    if (g->spec && g->n_ids > 0) return spec_step(g);
    int r = run_model(g);
    if (r) return r < 0 ? -1 : finish(g, G4_FINISH_CANCELLED);
    int32_t id = g->greedy && !g->spec ? g->picked : g4_sampler_sample(g->sampler, g->logits);
    if (id < 0) return g4_fail(&g->err, "no token can be drawn: every token is banned");
    return take(g, id) < 0 ? -1 : 0;
}

int g4_generation_next(g4_generation *g, g4_event *ev, g4_error *err) {
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

int g4_generation_run(g4_generation *g, g4_event_fn on_event, void *user, g4_error *err) {
    g4_event ev;
    int rc;
    while ((rc = g4_generation_next(g, &ev, err)) == 1)
        if (on_event && on_event(&ev, user)) g4_generation_cancel(g);
    return rc;
}

void g4_generation_cancel(g4_generation *g) { atomic_store_explicit(&g->cancel, 1, memory_order_relaxed); }

g4_finish g4_generation_finish(const g4_generation *g) { return g->finish; }

const int32_t *g4_generation_tokens(const g4_generation *g, int *n) {
    *n = g->n_ids;
    return g->ids;
}

int g4_generation_n_cached(const g4_generation *g) { return g->n_cached; }

void g4_generation_rounds(const g4_generation *g, const int **drafted, const int **accepted, int *n) {
    *drafted = *accepted = NULL;
    *n = 0;
    if (g->spec) g4_spec_rounds(g->spec, drafted, accepted, n);
}

int g4_generation_message(const g4_generation *g, g4_chat_message *out, g4_error *err) {
    return g4_chat_accum_message(&g->out, out, err);
}

/* ------------------------------------------------------------------- start */

void g4_generation_free(g4_generation *g) {
    if (!g) return;
    free(g->prompt);
    g4_sampler_free(g->sampler);
    free(g->stop_ids);
    if (g->stop) g4_stop_free(g->stop);
    g4_detok_stream_free(g->detok);
    g4_chat_parser_free(g->parser);
    g4_chat_accum_free(&g->out);
    free(g->ids);
    free(g->logits);
    free(g->seqs);
    free(g->want);
    g4_spec_free(g->spec);
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

static int setup(g4_generation *g, const g4_generation_params *p, g4_error *err) {
    const g4_model *m = g->ctx->model;
    const int V = m->cfg.text.vocab_size, n_ctx = g->ctx->n_ctx;
    const int room = n_ctx - g->n_prompt;
    if (room <= 0)
        return g4_fail(err, "the prompt (%d tokens) does not fit the context of %d positions", g->n_prompt, n_ctx);
    g->max_new = p->max_new_tokens > 0 ? p->max_new_tokens : g4_generation_config_max_new(&m->gen_config, g->n_prompt);
    if (g->max_new <= 0 || g->max_new > room) g->max_new = room;
    g->ignore_eos = p->ignore_eos;
    if (p->max_new_tokens < 0 || p->n_stop_ids < 0 || p->n_stop_strings < 0)
        return g4_fail(err, "generation: negative max_new_tokens, n_stop_ids or n_stop_strings");
    g4_sampler_params sp;
    if (p->sampling) sp = *p->sampling;
    else g4_model_sampler_params(m, &sp);
    if (g4_sampler_new(&sp, V, &g->sampler, err)) return -1;
    /* argmax with nothing that changes logits: the model step finds it (no logits copied back) */
    g->greedy = g4_sampler_is_argmax(g->sampler);
    g4_sampler_accept_many(g->sampler, g->prompt, g->n_prompt);

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

    const size_t nb = (size_t)g->ctx->n_batch;
    g->ids = malloc((size_t)g->max_new * sizeof *g->ids);
    g->logits = malloc((size_t)V * sizeof *g->logits);
    g->seqs = malloc(nb * sizeof *g->seqs);
    g->want = malloc(nb);
    if (!g->ids || !g->logits || !g->seqs || !g->want) return g4_fail(err, "out of memory");
    for (size_t i = 0; i < nb; i++) g->seqs[i] = g->seq;
    if (p->drafter) { /* drafting stops at the generation's stop ids (transformers: the eos ids) */
        g4_spec_params spp = {.n_draft = p->n_draft, .stop_ids = g->stop_ids, .n_stop_ids = g->n_stop_ids,
                              .cancelled = spec_cancelled, .cancelled_user = g};
        if (g4_spec_new(g->ctx, g->seq, p->drafter, &spp, &g->spec, err)) return -1;
        if (!(g->round = malloc(((size_t)g->spec->cap + 1) * sizeof *g->round))) return g4_fail(err, "out of memory");
    }
    reuse_prefix(g);
    return 0;
}

int g4_generation_start(g4_context *ctx, int seq, const int32_t *prompt, int n_prompt,
                        const g4_generation_params *params, g4_generation **out, g4_error *err) {
    *out = NULL;
    if (seq < 0 || seq >= ctx->n_seq) return g4_fail(err, "sequence %d is outside 0..%d", seq, ctx->n_seq - 1);
    if (n_prompt <= 0 || !prompt) return g4_fail(err, "the prompt is empty");
    const int V = ctx->model->cfg.text.vocab_size;
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return g4_fail(err, "prompt token %d at %d is outside the vocabulary (0..%d)", prompt[i], i, V - 1);
    g4_generation_params none = {0};
    g4_generation *g = calloc(1, sizeof *g);
    if (!g) return g4_fail(err, "out of memory");
    g->ctx = ctx;
    g->seq = seq;
    g->n_prompt = n_prompt;
    atomic_init(&g->cancel, 0);
    g->prompt = malloc((size_t)n_prompt * sizeof *g->prompt);
    if (!g->prompt) {
        g4_generation_free(g);
        return g4_fail(err, "out of memory");
    }
    memcpy(g->prompt, prompt, (size_t)n_prompt * sizeof *prompt);
    if (setup(g, params ? params : &none, err)) {
        g4_generation_free(g);
        return -1;
    }
    *out = g;
    return 0;
}

/* ------------------------------------------------------------- chat replies */

int g4_chat_start(const g4_chat *c, g4_context *ctx, int seq, const g4_generation_params *params,
                  g4_generation **out, g4_error *err) {
    *out = NULL;
    const g4_tokenizer *tok = ctx->model->tok;
    if (!tok) return g4_fail(err, "chat replies need the model's tokenizer.json");
    char *text = NULL;
    size_t len;
    g4_tokens toks = {0};
    int rc = -1;
    /* the template writes <bos> itself */
    if (g4_chat_render_for_reply(c, &text, &len, err) == 0 && g4_tokenize(tok, text, len, 0, &toks, err) == 0) {
        g4_generation_params p = {0};
        if (params) p = *params;
        p.parse_chat = 1;
        rc = g4_generation_start(ctx, seq, toks.ids, (int)toks.n, &p, out, err);
    }
    free(text);
    free(toks.ids);
    return rc;
}

int g4_chat_add_reply(g4_chat *c, const g4_generation *g, g4_error *err) {
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
