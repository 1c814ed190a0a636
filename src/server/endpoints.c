/* The endpoints: /v1/chat/completions, /v1/completions (plain and streamed as server-sent events),
 * /v1/embeddings, /v1/models, /health, /metrics (platform.openai.com/docs/api-reference; the streaming
 * format: chat/streaming and completions/object with "data: {...}\n\n" events ending in "data: [DONE]").
 *
 * A generation request becomes one job per prompt and choice: its prompt is rendered by the model's chat
 * template (chat) or taken as text or ids (completions) and tokenized here, on the connection's thread, so
 * that a prompt over the context is a 400 before anything is queued; the http(s) URLs of its images and audio
 * are fetched here too (fetch.h), and their bytes decoded as a data URL's. Output events map to OpenAI's fields:
 * answer text to content (text for completions), thinking to reasoning_content, each tool call to one entry
 * of tool_calls ({"id", "type": "function", "function": {"name", "arguments": "<JSON text>"}}), streamed
 * as soon as the model has written it whole; logprobs from the tokens' log-probabilities. Sampling fields
 * the request leaves out take the model's defaults (generation_config.json), as vLLM does; the penalties
 * see only the generated tokens, as OpenAI defines presence and frequency penalties. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "server/fetch.h"
#include "server/server_internal.h"

/* ------------------------------------------------------------------ helpers */

static uint64_t random_u64(void) {
    uint64_t x = 0;
    if (getrandom(&x, sizeof x, 0) != (ssize_t)sizeof x) x = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    return x;
}

static void random_id(char *out, size_t cap, const char *prefix) {
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    size_t n = (size_t)snprintf(out, cap, "%s", prefix);
    for (int k = 0; k < 2; k++) {
        uint64_t r = random_u64();
        for (int i = 0; i < 12 && n + 1 < cap; i++, r /= 62) out[n++] = abc[r % 62];
    }
    out[n] = 0;
}

/* A JSON string of possibly invalid UTF-8 (a token can end inside a character): invalid bytes become U+FFFD. */
static json_t *lossy_string(const char *s, size_t n) {
    json_t *v = json_stringn(s, n);
    if (v) return v;
    srv_buf b = {0};
    for (size_t i = 0; i < n;) {
        size_t k = 1;
        while (k <= 4 && i + k <= n && !(v = json_stringn(s + i, k))) k++;
        if (v) {
            srv_buf_put(&b, s + i, k);
            json_decref(v);
            v = NULL;
            i += k;
        } else {
            srv_buf_put(&b, "\xEF\xBF\xBD", 3);
            i++;
        }
    }
    v = json_stringn(b.p ? b.p : "", b.len);
    srv_buf_free(&b);
    return v;
}

/* The text of one token (special tokens as written), malloc'ed; "token_id:N" without a tokenizer. */
static char *token_text(const srv_state *s, int32_t id, size_t *len) {
    char *t = NULL;
    if (s->tok && g4_detokenize(s->tok, &id, 1, 0, &t, len, NULL) == 0) return t;
    char buf[32];
    *len = (size_t)snprintf(buf, sizeof buf, "token_id:%d", id);
    return strdup(buf);
}

static json_t *bytes_json(const char *t, size_t len) {
    json_t *a = json_array();
    for (size_t i = 0; i < len; i++) json_array_append_new(a, json_integer((unsigned char)t[i]));
    return a;
}

/* One entry of chat logprobs.content: {"token", "logprob", "bytes", "top_logprobs": [...]}. */
static json_t *chat_logprob(const srv_state *s, const srv_job *j, const srv_event *ev) {
    size_t len;
    char *t = token_text(s, ev->token, &len);
    json_t *top = json_array();
    for (int i = 0; i < ev->n_top; i++) {
        const g4_token_logprob *tl = &j->top[ev->top_off + (uint32_t)i];
        size_t tlen;
        char *tt = token_text(s, tl->token, &tlen);
        json_array_append_new(top, json_pack("{s:o,s:f,s:o}", "token", lossy_string(tt ? tt : "", tt ? tlen : 0),
                                             "logprob", (double)tl->logprob, "bytes", bytes_json(tt, tt ? tlen : 0)));
        free(tt);
    }
    json_t *o = json_pack("{s:o,s:f,s:o,s:o}", "token", lossy_string(t ? t : "", t ? len : 0), "logprob",
                          (double)ev->logprob, "bytes", bytes_json(t, t ? len : 0), "top_logprobs", top);
    free(t);
    return o;
}

/* Completions' logprobs, one token appended: tokens, token_logprobs, top_logprobs, text_offset. */
static void completion_logprob(const srv_state *s, const srv_job *j, const srv_event *ev, json_t *lp, size_t offset) {
    size_t len;
    char *t = token_text(s, ev->token, &len);
    json_array_append_new(json_object_get(lp, "tokens"), lossy_string(t ? t : "", t ? len : 0));
    json_array_append_new(json_object_get(lp, "token_logprobs"), json_real(ev->logprob));
    json_t *top = json_object();
    for (int i = 0; i < ev->n_top; i++) {
        const g4_token_logprob *tl = &j->top[ev->top_off + (uint32_t)i];
        size_t tlen;
        char *tt = token_text(s, tl->token, &tlen);
        json_t *key = lossy_string(tt ? tt : "", tt ? tlen : 0);
        if (key && !json_object_get(top, json_string_value(key)))
            json_object_set_new(top, json_string_value(key), json_real(tl->logprob));
        json_decref(key);
        free(tt);
    }
    json_array_append_new(json_object_get(lp, "top_logprobs"), top);
    json_array_append_new(json_object_get(lp, "text_offset"), json_integer((json_int_t)offset));
    free(t);
}

static json_t *completion_logprobs_new(void) {
    return json_pack("{s:[],s:[],s:[],s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
}

/* An OpenAI tool call from the library's {"name", "arguments"}. */
static json_t *tool_call_json(const char *text, size_t len, int index, int with_index) {
    json_t *call = json_loadb(text, len, 0, NULL);
    json_t *args = json_object_get(call, "arguments");
    char *args_text = args ? json_dumps(args, JSON_COMPACT) : strdup("{}");
    char id[40];
    random_id(id, sizeof id, "call_");
    const char *name = json_string_value(json_object_get(call, "name"));
    json_t *out = json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", id, "type", "function", "function", "name",
                            name ? name : "", "arguments", args_text ? args_text : "{}");
    if (out && with_index) json_object_set_new(out, "index", json_integer(index));
    free(args_text);
    json_decref(call);
    return out;
}

static const char *finish_reason(const srv_job *j, int n_tool_calls) {
    if (j->finish == G4_FINISH_LENGTH) return "length";
    return n_tool_calls ? "tool_calls" : "stop";
}

static json_t *usage_json(const srv_conn *c) {
    const srv_group *g = c->group;
    long long prompt = 0, gen = 0, cached = 0;
    const int n = c->req->n;
    for (int p = 0; p < c->n_prompts; p++) prompt += c->n_prompt[p];
    for (int i = 0; i < g->n_jobs; i++) {
        gen += g->jobs[i].n_generated;
        if (i % n == 0) cached += g->jobs[i].n_cached;
    }
    return json_pack("{s:I,s:I,s:I,s:{s:I}}", "prompt_tokens", prompt, "completion_tokens", gen, "total_tokens",
                     prompt + gen, "prompt_tokens_details", "cached_tokens", cached);
}

static int model_matches(const srv_state *s, const char *name) {
    return !strcmp(name, s->model_id) || !strcmp(name, s->opt.model_path);
}

static enum MHD_Result fail(srv_conn *c, int status, const char *param, const char *code, const char *msg) {
    srv_error e;
    srv_fail(&e, status, param, code, "%s", msg);
    return srv_reply_error(c, &e);
}

/* --------------------------------------------------------------- prompts */

static void free_request(void *p) {
    srv_request *r = p;
    for (int i = 0; r->soft && i < r->n_media; i++) g4_soft_tokens_free(&r->soft[i]);
    srv_request_free(r);
    free(r);
}

/* The token ids of prompt i of the request (chat: the conversation rendered with a generation prompt). */
static int prompt_ids(srv_conn *c, int i, g4_tokens *toks, srv_error *e) {
    const srv_state *s = c->s;
    srv_request *r = c->req;
    g4_error err;
    if (r->kind == SRV_CHAT) {
        if (!s->tpl || !s->tok)
            return srv_fail(e, 400, "messages", "unsupported", "this model has no chat template and tokenizer: use "
                                                               "/v1/completions with token ids");
        json_object_set_new(r->chat, "add_generation_prompt", json_true());
        char *js = json_dumps(r->chat, JSON_COMPACT), *text = NULL;
        size_t len;
        g4_chat *chat = NULL;
        int rc = -1;
        if (!js) return srv_fail(e, 500, NULL, NULL, "out of memory");
        if (g4_chat_new(s->tpl, js, &chat, &err) || g4_chat_render(chat, &text, &len, &err))
            srv_fail(e, 400, "messages", "invalid_value", "the chat template cannot render these messages: %s", err.msg);
        else if (g4_tokenize(s->tok, text, len, 0, toks, &err)) /* the template writes <bos> itself */
            srv_fail(e, 400, "messages", "invalid_value", "%s", err.msg);
        else rc = 0;
        free(js);
        g4_free(text);
        g4_chat_free(chat);
        return rc;
    }
    const srv_prompt *p = &r->prompts[i];
    if (!p->text) {
        toks->ids = malloc((size_t)p->n_ids * sizeof *toks->ids);
        if (!toks->ids) return srv_fail(e, 500, NULL, NULL, "out of memory");
        memcpy(toks->ids, p->ids, (size_t)p->n_ids * sizeof *p->ids);
        toks->n = toks->cap = (size_t)p->n_ids;
        return 0;
    }
    const char *field = r->kind == SRV_EMBEDDING ? "input" : "prompt";
    if (!s->tok)
        return srv_fail(e, 400, field, "unsupported", "this model has no tokenizer: send token ids instead of text");
    if (g4_tokenize(s->tok, p->text, strlen(p->text), 1, toks, &err))
        return srv_fail(e, 400, field, "invalid_value", "%s", err.msg);
    if (toks->n == 0) return srv_fail(e, 400, field, "invalid_value", "the prompt is empty");
    return 0;
}

/* A fetch stops when its client has left or the server stops (fetch.h) */
static int fetch_cancelled(void *c) { return srv_client_gone(c) || atomic_load(&((srv_conn *)c)->s->stopping); }

/* The bytes of the request's http(s) media (srv_media.url), fetched here, on the connection's thread, before the
 * request goes to the engine: a slow or large download holds this request alone. */
static int fetch_media(srv_conn *c, srv_error *e) {
    const srv_options *o = &c->s->opt;
    const srv_fetch_limits lim = {.max_bytes = o->max_media_bytes, .timeout_s = o->media_fetch_timeout_s,
                                  .max_redirects = o->media_max_redirects, .allowed_domains = o->allowed_media_domains,
                                  .allow_private = o->allow_private_media};
    srv_request *r = c->req;
    for (int i = 0; i < r->n_media; i++) {
        srv_media *md = &r->media[i];
        char msg[400];
        if (md->url && !md->data && srv_fetch(md->url, &lim, fetch_cancelled, c, &md->data, &md->len, msg, sizeof msg))
            return srv_fail(e, 400, "messages.content", md->audio ? "invalid_audio_url" : "invalid_image_url",
                            "%s %d (%.200s): %s", md->audio ? "audio" : "image", i + 1, md->url, msg);
    }
    return 0;
}

/* The soft tokens of a chat request's images and audio (r->soft, in the order of their placeholders), and the
 * length the prompt of *np tokens expands to with them. */
static int encode_media(srv_conn *c, const int32_t *ids, int *np, srv_error *e) {
    srv_request *r = c->req;
    g4_model *m = c->s->model;
    g4_error err;
    if (r->n_media <= 0) return 0;
    if (fetch_media(c, e)) return -1;
    if (!(r->soft = calloc((size_t)r->n_media, sizeof *r->soft))) return srv_fail(e, 500, NULL, NULL, "out of memory");
    for (int i = 0; i < r->n_media; i++) {
        srv_media *md = &r->media[i];
        int rc;
        if (!md->audio) {
            g4_image img;
            if (g4_image_decode(md->data, md->len, NULL, &img, &err))
                return srv_fail(e, 400, "messages.content", "invalid_value", "image %d: %s", i + 1, err.msg);
            rc = g4_image_encode(m, &img, 0, &r->soft[i], &err);
            g4_image_free(&img);
        } else {
            float *pcm = NULL;
            size_t n = 0;
            if (g4_audio_decode(md->data, md->len, "input_audio", g4_audio_rate(m), &pcm, &n, &err))
                return srv_fail(e, 400, "messages.content", "invalid_value", "audio %d: %s", i + 1, err.msg);
            rc = g4_audio_encode(m, pcm, n, &r->soft[i], &err);
            g4_free(pcm);
        }
        if (rc) return srv_fail(e, 400, "messages.content", "invalid_value", "%s %d: %s", md->audio ? "audio" : "image",
                                i + 1, err.msg);
        free(md->data); /* (the bytes are not needed any more) */
        md->data = NULL;
    }
    int32_t *expanded = NULL;
    float *rows = NULL;
    int n_expanded = 0, n_rows = 0;
    if (g4_prompt_expand(m, ids, *np, r->soft, r->n_media, &expanded, &n_expanded, &rows, &n_rows, &err))
        return srv_fail(e, 400, "messages", "invalid_value", "%s", err.msg);
    g4_free(expanded);
    g4_free(rows);
    *np = n_expanded;
    return 0;
}

/* Parses the body, checks the model, and prepares a group of jobs (one per prompt and choice). */
static int prepare(srv_conn *c, srv_kind kind, srv_error *e) {
    srv_state *s = c->s;
    srv_request *r = calloc(1, sizeof *r);
    if (!r) return srv_fail(e, 500, NULL, NULL, "out of memory");
    if (srv_parse_request(kind, c->body.p ? c->body.p : "", c->body.len, &s->limits, s->tool_role, r, e)) {
        free(r);
        return -1;
    }
    c->req = r;
    if (!model_matches(s, r->model)) {
        srv_fail(e, 404, "model", "model_not_found", "The model '%.200s' does not exist; this server has '%s'.",
                 r->model, s->model_id);
        goto fail;
    }
    const int n_prompts = kind == SRV_CHAT ? 1 : r->n_prompts, n = kind == SRV_EMBEDDING ? 1 : r->n;
    if ((long long)n_prompts * n > s->opt.max_queue) { /* it could never be queued: no use retrying (a 503) */
        srv_fail(e, 400, n > 1 ? "n" : kind == SRV_EMBEDDING ? "input" : "prompt", "invalid_value",
                 "This request asks for %d generations (%d prompt(s), n = %d); this server queues at most %d "
                 "(--max-queue).", n_prompts * n, n_prompts, n, s->opt.max_queue);
        goto fail;
    }
    if (kind == SRV_CHAT && s->tool_call_token >= 0 && !json_object_get(r->chat, "tools")) {
        /* no tools offered (none given, or tool_choice "none"): the model cannot start a tool call, as OpenAI's
         * "will not call any tool and instead generates a message" */
        int32_t *ids = realloc(r->bias_ids, (size_t)(r->n_bias + 1) * sizeof *ids);
        if (ids) r->bias_ids = ids;
        float *values = ids ? realloc(r->bias_values, (size_t)(r->n_bias + 1) * sizeof *values) : NULL;
        if (!values) {
            srv_fail(e, 500, NULL, NULL, "out of memory");
            goto fail;
        }
        r->bias_values = values;
        r->bias_ids[r->n_bias] = s->tool_call_token;
        r->bias_values[r->n_bias++] = -INFINITY;
    }
    c->n_prompts = n_prompts;
    if (!(c->n_prompt = calloc((size_t)n_prompts, sizeof *c->n_prompt)) || !(c->group = srv_group_new(n_prompts * n))) {
        srv_fail(e, 500, NULL, NULL, "out of memory");
        goto fail;
    }
    c->group->data = r;
    c->group->stream = r->stream;
    c->group->free_data = free_request;
    const int n_ctx = srv_engine_n_ctx(s->engine);
    if (kind == SRV_CHAT) {
        /* every message, tool call and tool takes at least one token of the rendered prompt (its turn or block
         * markers): more of them than the context cannot fit, and are refused before the template renders them
         * (rendering costs time per message: 16000 short messages, a 600 kB body, took 13 s of a core for a 400;
         * 31B's template matches every tool reply against every call of its turn) */
        const json_t *msgs = json_object_get(r->chat, "messages"), *m;
        size_t n_msgs = json_array_size(msgs), n_calls = 0, n_tools = json_array_size(json_object_get(r->chat, "tools")), i;
        json_array_foreach(msgs, i, m) n_calls += json_array_size(json_object_get(m, "tool_calls"));
        if (n_msgs + n_calls + n_tools > (size_t)n_ctx)
            return srv_fail(e, 400, "messages", "context_length_exceeded",
                            "This model's maximum context length is %d tokens. However, your request holds %zu "
                            "messages, %zu tool calls and %zu tools, each at least one token. Please reduce the "
                            "length of the messages.", n_ctx, n_msgs, n_calls, n_tools);
    }
    int max_new = r->max_tokens ? r->max_tokens : s->opt.max_tokens;
    for (int p = 0; p < n_prompts; p++) {
        g4_tokens toks = {0};
        if (prompt_ids(c, p, &toks, e)) {
            g4_free(toks.ids);
            return -1;
        }
        int np = (int)toks.n; /* (with images or audio: the expanded prompt's length) */
        if (kind == SRV_CHAT && encode_media(c, toks.ids, &np, e)) {
            g4_free(toks.ids);
            return -1;
        }
        c->n_prompt[p] = np;
        const char *param = kind == SRV_CHAT ? "messages" : kind == SRV_EMBEDDING ? "input" : "prompt";
        if (np > n_ctx - (kind != SRV_EMBEDDING) || (r->max_tokens && np + r->max_tokens > n_ctx)) {
            g4_free(toks.ids);
            if (r->max_tokens && np < n_ctx)
                return srv_fail(e, 400, param, "context_length_exceeded",
                                "This model's maximum context length is %d tokens. However, you requested %d tokens "
                                "(%d in the %s, %d in the completion). Please reduce the length of the %s or "
                                "completion.", n_ctx, np + r->max_tokens, np, param, r->max_tokens, param);
            return srv_fail(e, 400, param, "context_length_exceeded",
                            "This model's maximum context length is %d tokens. However, your %s resulted in %d "
                            "tokens. Please reduce the length of the %s.", n_ctx, param, np, param);
        }
        for (int k = 0; k < n; k++) {
            srv_job *j = &c->group->jobs[p * n + k];
            if (!(j->prompt = malloc(toks.n * sizeof *j->prompt))) {
                g4_free(toks.ids);
                return srv_fail(e, 500, NULL, NULL, "out of memory");
            }
            memcpy(j->prompt, toks.ids, toks.n * sizeof *j->prompt);
            j->n_prompt = (int)toks.n;
            j->embed = kind == SRV_EMBEDDING;
            if (j->embed) continue;
            g4_sampler_params *sp = &j->sp;
            g4_model_sampler_params(s->model, sp);
            if (r->have_temperature) sp->temperature = r->temperature;
            if (r->have_top_p) sp->top_p = r->top_p;
            if (r->have_top_k) sp->top_k = r->top_k;
            if (r->have_min_p) sp->min_p = r->min_p;
            if (r->have_repetition) sp->repetition_penalty = r->repetition_penalty;
            sp->presence_penalty = r->presence_penalty;
            sp->frequency_penalty = r->frequency_penalty;
            sp->penalty_last_n = -1;
            sp->seed = r->have_seed ? r->seed + (uint64_t)k : random_u64();
            if (r->n_bias) sp->bias_ids = r->bias_ids, sp->bias_values = r->bias_values, sp->n_bias = r->n_bias;
            j->gp = (g4_generation_params){.max_new_tokens = max_new, .ignore_eos = r->ignore_eos,
                                           .stop_strings = (const char *const *)r->stops, .n_stop_strings = r->n_stops,
                                           .parse_chat = kind == SRV_CHAT, .penalties_output_only = 1,
                                           .logprobs = r->logprobs, .top_logprobs = r->top_logprobs,
                                           .json_object = r->format == SRV_FORMAT_JSON_OBJECT,
                                           .media = r->soft, .n_media = r->n_media, .grammar = r->grammar};
        }
        g4_free(toks.ids);
    }
    return 0;
fail:
    if (!c->group) free_request(r), c->req = NULL;
    return -1;
}

static int submit(srv_conn *c, srv_error *e) {
    g4_error err;
    srv_idle_timeout(c, 0);
    if (srv_engine_submit(c->s->engine, c->group, &err))
        return srv_fail(e, 503, NULL, "server_overloaded", "%s; retry later", err.msg);
    c->created = (long long)time(NULL);
    return 0;
}

/* Waits (with g->mu held) until every job is done; -1 when the client left or the server stops first. */
static int wait_all(srv_conn *c) {
    srv_group *g = c->group;
    while (g->n_done < g->n_jobs) {
        srv_group_wait(g, 0.1);
        if (g->n_done < g->n_jobs && (srv_client_gone(c) || atomic_load(&c->s->stopping))) return -1;
    }
    return 0;
}

/* --------------------------------------------------------- plain responses */

static json_t *chat_choice(const srv_conn *c, const srv_job *j) {
    srv_buf content = {0}, reasoning = {0};
    json_t *calls = json_array(), *lp = c->req->logprobs ? json_array() : NULL;
    for (int i = 0; i < j->n_ev; i++) {
        const srv_event *ev = &j->ev[i];
        const char *t = j->text + ev->off;
        if (ev->kind == G4_EVENT_TEXT) srv_buf_put(&content, t, ev->len);
        else if (ev->kind == G4_EVENT_THINKING) srv_buf_put(&reasoning, t, ev->len);
        else if (ev->kind == G4_EVENT_TOOL_CALL) json_array_append_new(calls, tool_call_json(t, ev->len, 0, 0));
        else if (lp && ev->has_logprob) json_array_append_new(lp, chat_logprob(c->s, j, ev));
    }
    const int n_calls = (int)json_array_size(calls);
    json_t *msg = json_pack("{s:s,s:o}", "role", "assistant", "content",
                            content.len || !n_calls ? lossy_string(content.p ? content.p : "", content.len) : json_null());
    if (reasoning.len) json_object_set_new(msg, "reasoning_content", lossy_string(reasoning.p, reasoning.len));
    if (n_calls) json_object_set(msg, "tool_calls", calls);
    json_decref(calls);
    srv_buf_free(&content);
    srv_buf_free(&reasoning);
    return json_pack("{s:i,s:o,s:o,s:s}", "index", j->index, "message", msg, "logprobs",
                     lp ? json_pack("{s:o,s:n}", "content", lp, "refusal") : json_null(), "finish_reason",
                     finish_reason(j, n_calls));
}

/* Completions' echo: the prompt of choice `index` as text, appended to out. */
static void echo_prompt(const srv_conn *c, int index, srv_buf *out) {
    const srv_request *r = c->req;
    const srv_prompt *p = &r->prompts[index / r->n];
    if (p->text) {
        srv_buf_put(out, p->text, strlen(p->text));
        return;
    }
    char *t = NULL;
    size_t len = 0;
    if (c->s->tok && g4_detokenize(c->s->tok, p->ids, (size_t)p->n_ids, 0, &t, &len, NULL) == 0) srv_buf_put(out, t, len);
    g4_free(t);
}

static json_t *completion_choice(const srv_conn *c, const srv_job *j) {
    srv_buf text = {0};
    const srv_request *r = c->req;
    if (r->echo) echo_prompt(c, j->index, &text);
    json_t *lp = r->logprobs ? completion_logprobs_new() : NULL;
    for (int i = 0; i < j->n_ev; i++) {
        const srv_event *ev = &j->ev[i];
        if (ev->kind == G4_EVENT_TEXT) srv_buf_put(&text, j->text + ev->off, ev->len);
        else if (lp && ev->kind == G4_EVENT_TOKEN && ev->has_logprob) completion_logprob(c->s, j, ev, lp, text.len);
    }
    json_t *o = json_pack("{s:o,s:i,s:o,s:s}", "text", lossy_string(text.p ? text.p : "", text.len), "index",
                          j->index, "logprobs", lp ? lp : json_null(), "finish_reason", finish_reason(j, 0));
    srv_buf_free(&text);
    return o;
}

static enum MHD_Result reply_whole(srv_conn *c) {
    srv_group *g = c->group;
    pthread_mutex_lock(&g->mu);
    if (wait_all(c)) {
        pthread_mutex_unlock(&g->mu);
        srv_group_cancel(g);
        c->status = 499;
        return MHD_NO; /* nobody to answer */
    }
    pthread_mutex_unlock(&g->mu); /* every job is done: nothing changes any more */
    for (int i = 0; i < g->n_jobs; i++)
        if (g->jobs[i].failed) return fail(c, 500, NULL, NULL, g->jobs[i].errmsg);
    const int chat = c->req->kind == SRV_CHAT;
    json_t *choices = json_array();
    for (int i = 0; i < g->n_jobs; i++)
        json_array_append_new(choices, chat ? chat_choice(c, &g->jobs[i]) : completion_choice(c, &g->jobs[i]));
    json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:s,s:o,s:o}", "id", c->id, "object",
                          chat ? "chat.completion" : "text_completion", "created", c->created, "model",
                          c->s->model_id, "system_fingerprint", "gemma4c-" G4_VERSION, "choices", choices, "usage",
                          usage_json(c));
    char *js = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return srv_reply_json(c, 200, js);
}

/* --------------------------------------------------------------- streaming */

static void sse(srv_conn *c, json_t *o) {
    char *js = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!js) {
        c->out.failed = 1;
        return;
    }
    srv_buf_put(&c->out, "data: ", 6);
    srv_buf_put(&c->out, js, strlen(js));
    srv_buf_put(&c->out, "\n\n", 2);
    free(js);
}

/* A chunk with one choice (index, delta or text, logprobs, finish_reason), or with none and the usage. */
static json_t *chunk(srv_conn *c, json_t *choice) {
    const int chat = c->req->kind == SRV_CHAT;
    json_t *choices = json_array();
    if (choice) json_array_append_new(choices, choice);
    json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:s,s:o}", "id", c->id, "object",
                          chat ? "chat.completion.chunk" : "text_completion", "created", c->created, "model",
                          c->s->model_id, "system_fingerprint", "gemma4c-" G4_VERSION, "choices", choices);
    if (o && c->req->include_usage) json_object_set_new(o, "usage", choice ? json_null() : usage_json(c));
    return o;
}

static json_t *chat_delta_choice(int index, json_t *delta, json_t *lp, const char *finish) {
    return json_pack("{s:i,s:o,s:o,s:o}", "index", index, "delta", delta, "logprobs",
                     lp ? json_pack("{s:o,s:n}", "content", lp, "refusal") : json_null(), "finish_reason",
                     finish ? json_string(finish) : json_null());
}

/* Pending text of one kind for a chunk. */
typedef struct {
    g4_event_kind kind;
    srv_buf text;
    json_t *lp; /* chat: array; completions: object */
} pending;

static void flush(srv_conn *c, const srv_job *j, pending *p) {
    const int chat = c->req->kind == SRV_CHAT;
    if (p->text.len || p->lp) {
        json_t *t = lossy_string(p->text.p ? p->text.p : "", p->text.len);
        json_t *choice = chat ? chat_delta_choice(j->index,
                                                  json_pack("{s:o}", p->kind == G4_EVENT_THINKING ? "reasoning_content"
                                                                                                  : "content", t),
                                                  p->lp, NULL)
                              : json_pack("{s:o,s:i,s:o,s:n}", "text", t, "index", j->index, "logprobs",
                                          p->lp ? p->lp : json_null(), "finish_reason");
        sse(c, chunk(c, choice));
    }
    p->lp = NULL;
    p->text.len = 0;
}

/* Turns the events of j not yet sent into chunks (with g->mu held). */
static void stream_job(srv_conn *c, srv_job *j) {
    const int chat = c->req->kind == SRV_CHAT;
    pending p = {.kind = G4_EVENT_TEXT};
    size_t offset = 0; /* completions' text_offset within this chunk */
    for (int i = c->taken[j->index]; i < j->n_ev; i++) {
        const srv_event *ev = &j->ev[i];
        const char *t = j->text + ev->off;
        if (ev->kind == G4_EVENT_TOKEN) {
            if (!ev->has_logprob || !c->req->logprobs) continue;
            if (!p.lp) p.lp = chat ? json_array() : completion_logprobs_new();
            if (chat) json_array_append_new(p.lp, chat_logprob(c->s, j, ev));
            else completion_logprob(c->s, j, ev, p.lp, offset + p.text.len);
        } else if (ev->kind == G4_EVENT_TOOL_CALL) {
            flush(c, j, &p);
            json_t *call = tool_call_json(t, ev->len, c->n_tool_calls[j->index]++, 1);
            sse(c, chunk(c, chat_delta_choice(j->index, json_pack("{s:[o]}", "tool_calls", call), NULL, NULL)));
        } else {
            if (ev->kind != p.kind && p.text.len) flush(c, j, &p);
            p.kind = ev->kind;
            srv_buf_put(&p.text, t, ev->len);
        }
    }
    c->taken[j->index] = j->n_ev;
    flush(c, j, &p);
    srv_buf_free(&p.text);
    if (j->done && !c->finished_sent[j->index]) {
        c->finished_sent[j->index] = 1;
        if (j->failed) {
            srv_error e;
            srv_fail(&e, 500, NULL, NULL, "%s", j->errmsg);
            char *js = srv_error_json(&e);
            if (js) {
                srv_buf_put(&c->out, "data: ", 6);
                srv_buf_put(&c->out, js, strlen(js));
                srv_buf_put(&c->out, "\n\n", 2);
                free(js);
            }
            return;
        }
        const char *why = finish_reason(j, c->n_tool_calls[j->index]);
        sse(c, chunk(c, chat ? chat_delta_choice(j->index, json_object(), NULL, why)
                             : json_pack("{s:s,s:i,s:n,s:s}", "text", "", "index", j->index, "logprobs",
                                         "finish_reason", why)));
    }
}

/* Appends what the jobs have made since the last call; the end of the stream once all are done. */
static void stream_take(srv_conn *c) {
    srv_group *g = c->group;
    for (int i = 0; i < g->n_jobs; i++) stream_job(c, &g->jobs[i]);
    if (g->n_done == g->n_jobs && !c->stream_over) {
        if (c->req->include_usage) sse(c, chunk(c, NULL));
        srv_buf_put(&c->out, "data: [DONE]\n\n", 14);
        c->stream_over = 1;
    }
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    srv_conn *c = cls;
    (void)pos;
    for (;;) {
        if (c->out.failed) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (c->out_pos < c->out.len) {
            size_t n = c->out.len - c->out_pos < max ? c->out.len - c->out_pos : max;
            srv_idle_timeout(c, 1);
            memcpy(buf, c->out.p + c->out_pos, n);
            c->out_pos += n;
            return (ssize_t)n;
        }
        c->out.len = c->out_pos = 0;
        if (c->stream_over) return MHD_CONTENT_READER_END_OF_STREAM;
        srv_group *g = c->group;
        pthread_mutex_lock(&g->mu);
        stream_take(c);
        if (!c->out.len && !c->stream_over) {
            srv_group_wait(g, 0.1);
            stream_take(c);
        }
        pthread_mutex_unlock(&g->mu);
        if (!c->out.len && !c->stream_over && (srv_client_gone(c) || atomic_load(&c->s->stopping))) {
            srv_group_cancel(g);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static enum MHD_Result reply_stream(srv_conn *c) {
    srv_group *g = c->group;
    if (!(c->taken = calloc((size_t)g->n_jobs, sizeof *c->taken)) ||
        !(c->finished_sent = calloc((size_t)g->n_jobs, 1)) ||
        !(c->n_tool_calls = calloc((size_t)g->n_jobs, sizeof *c->n_tool_calls)))
        return MHD_NO;
    if (c->req->kind == SRV_CHAT) /* the role first, for every choice, as OpenAI sends it */
        for (int i = 0; i < g->n_jobs; i++)
            sse(c, chunk(c, chat_delta_choice(i, json_pack("{s:s,s:s}", "role", "assistant", "content", ""), NULL,
                                              NULL)));
    else if (c->req->echo) /* the prompt first, for every choice, as the plain reply starts with it */
        for (int i = 0; i < g->n_jobs; i++) {
            srv_buf text = {0};
            echo_prompt(c, i, &text);
            sse(c, chunk(c, json_pack("{s:o,s:i,s:n,s:n}", "text", lossy_string(text.p ? text.p : "", text.len), "index",
                                      i, "logprobs", "finish_reason")));
            srv_buf_free(&text);
        }
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, c, NULL);
    if (!r) return MHD_NO;
    srv_idle_timeout(c, 1);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    c->status = 200;
    enum MHD_Result ok = MHD_queue_response(c->mc, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ok;
}

/* --------------------------------------------------------------- endpoints */

enum MHD_Result srv_handle_generate(srv_conn *c, srv_kind kind) {
    srv_error e;
    if (prepare(c, kind, &e) || submit(c, &e)) return srv_reply_error(c, &e);
    random_id(c->id, sizeof c->id, kind == SRV_CHAT ? "chatcmpl-" : "cmpl-");
    return c->req->stream ? reply_stream(c) : reply_whole(c);
}

static void base64(const unsigned char *in, size_t n, srv_buf *out) {
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)in[i] << 16 | (i + 1 < n ? (unsigned)in[i + 1] << 8 : 0) | (i + 2 < n ? in[i + 2] : 0);
        char q[4] = {abc[v >> 18], abc[(v >> 12) & 63], i + 1 < n ? abc[(v >> 6) & 63] : '=', i + 2 < n ? abc[v & 63] : '='};
        srv_buf_put(out, q, 4);
    }
}

enum MHD_Result srv_handle_embeddings(srv_conn *c) {
    srv_error e;
    if (prepare(c, SRV_EMBEDDING, &e) || submit(c, &e)) return srv_reply_error(c, &e);
    srv_group *g = c->group;
    pthread_mutex_lock(&g->mu);
    int gone = wait_all(c);
    pthread_mutex_unlock(&g->mu);
    if (gone) {
        srv_group_cancel(g);
        c->status = 499;
        return MHD_NO;
    }
    const int H = g4_model_hidden_size(c->s->model);
    json_t *data = json_array();
    long long tokens = 0;
    for (int i = 0; i < g->n_jobs; i++) {
        srv_job *j = &g->jobs[i];
        if (j->failed) {
            json_decref(data);
            return fail(c, 500, NULL, NULL, j->errmsg);
        }
        tokens += j->n_prompt;
        double norm = 0; /* unit length, as OpenAI's embeddings are */
        for (int h = 0; h < H; h++) norm += (double)j->embedding[h] * j->embedding[h];
        const float scale = norm > 0 ? (float)(1.0 / sqrt(norm)) : 0.0f;
        json_t *v;
        if (c->req->base64) { /* little-endian float32, as OpenAI's clients decode it */
            unsigned char *raw = malloc((size_t)H * 4);
            srv_buf b64 = {0};
            for (int h = 0; raw && h < H; h++) {
                float x = j->embedding[h] * scale;
                uint32_t u;
                memcpy(&u, &x, 4);
                for (int k = 0; k < 4; k++) raw[4 * h + k] = (unsigned char)(u >> (8 * k));
            }
            if (raw) base64(raw, (size_t)H * 4, &b64);
            v = raw && !b64.failed ? json_stringn(b64.p, b64.len) : NULL;
            free(raw);
            srv_buf_free(&b64);
        } else {
            v = json_array();
            for (int h = 0; h < H; h++) json_array_append_new(v, json_real(j->embedding[h] * scale));
        }
        json_array_append_new(data, json_pack("{s:s,s:i,s:o}", "object", "embedding", "index", i, "embedding", v));
    }
    json_t *o = json_pack("{s:s,s:o,s:s,s:{s:I,s:I}}", "object", "list", "data", data, "model", c->s->model_id,
                          "usage", "prompt_tokens", tokens, "total_tokens", tokens);
    char *js = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(o);
    return srv_reply_json(c, 200, js);
}

static json_t *model_json(const srv_state *s) {
    return json_pack("{s:s,s:s,s:I,s:s,s:i}", "id", s->model_id, "object", "model", "created", s->created,
                     "owned_by", "gemma4c", "max_model_len", srv_engine_n_ctx(s->engine));
}

enum MHD_Result srv_handle_models(srv_conn *c, const char *id) {
    const srv_state *s = c->s;
    if (id) {
        if (!model_matches(s, id)) {
            srv_error e;
            srv_fail(&e, 404, "model", "model_not_found", "The model '%.200s' does not exist.", id);
            return srv_reply_error(c, &e);
        }
        json_t *o = model_json(s);
        char *js = o ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
        return srv_reply_json(c, 200, js);
    }
    json_t *o = json_pack("{s:s,s:[o]}", "object", "list", "data", model_json(s));
    char *js = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return srv_reply_json(c, 200, js);
}

enum MHD_Result srv_handle_health(srv_conn *c) {
    const int draining = atomic_load(&c->s->draining);
    return srv_reply_json(c, draining ? 503 : 200, strdup(draining ? "{\"status\":\"draining\"}" : "{\"status\":\"ok\"}"));
}

enum MHD_Result srv_handle_metrics(srv_conn *c) {
    srv_engine_stats st;
    srv_engine_stats_get(c->s->engine, &st);
    return srv_reply_text(c, 200, "text/plain; version=0.0.4", srv_metrics_text(&c->s->metrics, &st));
}

void srv_conn_release(srv_conn *c) {
    if (c->group) srv_group_release(c->group); /* frees the request too, once the jobs are done with it */
    else if (c->req) free_request(c->req);
    c->group = NULL;
    c->req = NULL;
    free(c->n_prompt);
    free(c->taken);
    free(c->finished_sent);
    free(c->n_tool_calls);
    srv_buf_free(&c->out);
}
