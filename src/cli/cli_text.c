#include "cli/cli_text.h"

#include <math.h>
#include <signal.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "core/error.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "engine/stop.h"
#include "formats/gguf.h"
#include "model/model.h"

enum {
    OPT_TEMP = 1000, OPT_TOP_K, OPT_TOP_P, OPT_MIN_P, OPT_SEED, OPT_REPEAT, OPT_REPEAT_N, OPT_PRESENCE,
    OPT_FREQUENCY, OPT_STOP, OPT_IGNORE_EOS, OPT_CTX, OPT_BIAS
};

const struct option cli_sampling_options[] = {
    {"temp", required_argument, 0, OPT_TEMP},
    {"top-k", required_argument, 0, OPT_TOP_K},
    {"top-p", required_argument, 0, OPT_TOP_P},
    {"min-p", required_argument, 0, OPT_MIN_P},
    {"seed", required_argument, 0, OPT_SEED},
    {"repeat-penalty", required_argument, 0, OPT_REPEAT},
    {"repeat-last-n", required_argument, 0, OPT_REPEAT_N},
    {"presence-penalty", required_argument, 0, OPT_PRESENCE},
    {"frequency-penalty", required_argument, 0, OPT_FREQUENCY},
    {"stop", required_argument, 0, OPT_STOP},
    {"ignore-eos", no_argument, 0, OPT_IGNORE_EOS},
    {"logit-bias", required_argument, 0, OPT_BIAS},
    {"n-predict", required_argument, 0, 'n'},
    {"model", required_argument, 0, 'm'},
    {"threads", required_argument, 0, 't'},
    {"ctx", required_argument, 0, OPT_CTX},
    {0, 0, 0, 0},
};

void cli_options_with_sampling(const struct option *own, struct option *out, int cap) {
    int k = 0;
    for (int i = 0; own[i].name && k < cap - 1; i++) out[k++] = own[i];
    for (int i = 0; cli_sampling_options[i].name && k < cap - 1; i++) out[k++] = cli_sampling_options[i];
    memset(&out[k], 0, sizeof out[k]);
}

volatile int cli_cancel, cli_generating;

static void on_sigint(int sig) {
    (void)sig;
    if (cli_generating) {
        cli_cancel = 1;
        return;
    }
    static const char nl[] = "\n";
    ssize_t w = write(STDOUT_FILENO, nl, 1);
    (void)w;
    _exit(130);
}

void cli_catch_sigint(void) { signal(SIGINT, on_sigint); }

void cli_sampling_init(cli_sampling *s) {
    memset(s, 0, sizeof *s);
    s->n_predict = -1;
    s->repeat_last_n = -1;
}

int cli_sampling_parse(cli_sampling *s, int opt, const char *arg) {
    switch (opt) {
    case OPT_TEMP: s->have_temp = 1; return cli_parse_float(arg, "--temp", 0, 1e6, &s->temp) ? -1 : 1;
    case OPT_TOP_K: s->have_top_k = 1; return cli_parse_int(arg, "--top-k", 0, 1 << 30, &s->top_k) ? -1 : 1;
    case OPT_TOP_P: s->have_top_p = 1; return cli_parse_float(arg, "--top-p", 1e-9, 1, &s->top_p) ? -1 : 1;
    case OPT_MIN_P: s->have_min_p = 1; return cli_parse_float(arg, "--min-p", 0, 1, &s->min_p) ? -1 : 1;
    case OPT_SEED: s->have_seed = 1; return cli_parse_int(arg, "--seed", 0, 0x7fffffffL, &s->seed) ? -1 : 1;
    case OPT_REPEAT:
        s->have_repeat = 1;
        return cli_parse_float(arg, "--repeat-penalty", 1e-6, 1e6, &s->repeat_penalty) ? -1 : 1;
    case OPT_REPEAT_N: return cli_parse_int(arg, "--repeat-last-n", -1, 1 << 30, &s->repeat_last_n) ? -1 : 1;
    case OPT_PRESENCE:
        s->have_presence = 1;
        return cli_parse_float(arg, "--presence-penalty", -100, 100, &s->presence_penalty) ? -1 : 1;
    case OPT_FREQUENCY:
        s->have_frequency = 1;
        return cli_parse_float(arg, "--frequency-penalty", -100, 100, &s->frequency_penalty) ? -1 : 1;
    case OPT_STOP:
        if (!*arg) return cli_error("--stop: the stop string is empty"), -1;
        if (s->n_stops == CLI_MAX_STOPS) return cli_error("--stop: at most %d stop strings", CLI_MAX_STOPS), -1;
        s->stops[s->n_stops++] = arg;
        return 1;
    case OPT_IGNORE_EOS: s->ignore_eos = 1; return 1;
    case OPT_BIAS: {
        const char *eq = strchr(arg, '=');
        char id_s[32];
        long id;
        double bias;
        if (!eq || eq == arg || (size_t)(eq - arg) >= sizeof id_s)
            return cli_error("--logit-bias: '%s' must be ID=BIAS", arg), -1;
        memcpy(id_s, arg, (size_t)(eq - arg));
        id_s[eq - arg] = 0;
        if (cli_parse_int(id_s, "--logit-bias id", 0, INT32_MAX, &id)) return -1;
        if (!strcmp(eq + 1, "-inf") || !strcmp(eq + 1, "-infinity"))
            bias = -INFINITY;
        else if (cli_parse_float(eq + 1, "--logit-bias value", -1e9, 1e9, &bias))
            return -1;
        if (s->n_bias == CLI_MAX_BIAS) return cli_error("--logit-bias: at most %d", CLI_MAX_BIAS), -1;
        s->bias_ids[s->n_bias] = (int32_t)id;
        s->bias_values[s->n_bias++] = (float)bias;
        return 1;
    }
    case 'n': return cli_parse_int(arg, "-n", 1, 1 << 24, &s->n_predict) ? -1 : 1;
    case 'm': s->model_dir = arg; return 1;
    case 't': return cli_parse_int(arg, "--threads", 0, 1024, &s->threads) ? -1 : 1;
    case OPT_CTX: return cli_parse_int(arg, "--ctx", 16, 1 << 24, &s->n_ctx) ? -1 : 1;
    default: return 0;
    }
}

/* A GGUF file has no generation_config.json: default sampling, the tokenizer's eos and
 * Gemma's end-of-turn token as stop ids (as llama.cpp takes end-of-generation tokens), and
 * the chat template of tokenizer.chat_template. */
static int gguf_extras(const char *path, int needs, cli_text_model *tm, g4_error *err) {
    if (g4_generation_config_load_files(NULL, NULL, &tm->gc, err)) return -1;
    if (!tm->tok) return 0;
    const int32_t stops[] = {g4_tokenizer_eos_id(tm->tok), g4_tokenizer_token_id(tm->tok, "<turn|>")};
    for (int i = 0; i < 2; i++)
        if (stops[i] >= 0 && tm->gc.n_eos < G4_MAX_EOS_IDS) tm->gc.eos_ids[tm->gc.n_eos++] = stops[i];
    if (!(needs & CLI_NEED_TEMPLATE)) return 0;
    g4_gguf g;
    if (g4_gguf_open(path, &g, err)) return -1;
    const char *tpl = json_string_value(json_object_get(g.meta, "tokenizer.chat_template"));
    int rc = tpl ? 0 : g4_fail(err, "%s: the file has no chat template (tokenizer.chat_template)", path);
    int32_t b = g4_tokenizer_bos_id(tm->tok), e = g4_tokenizer_eos_id(tm->tok);
    if (!rc)
        rc = g4_chat_template_load_string(tpl, strlen(tpl), b >= 0 ? g4_tokenizer_piece(tm->tok, b) : NULL,
                                          e >= 0 ? g4_tokenizer_piece(tm->tok, e) : NULL, &tm->tpl, err);
    g4_gguf_free(&g);
    return rc;
}

int cli_text_open(const cli_sampling *opt, int needs, cli_text_model *tm) {
    memset(tm, 0, sizeof *tm);
    const char *dir = opt->model_dir;
    int n_ctx = (int)opt->n_ctx;
    g4_error err;
    if (!dir) return cli_error("no model folder: pass -m DIR"), -1;
    /* the small files first, so that a broken folder fails before the weights load */
    if ((needs & (CLI_NEED_TOKENIZER | CLI_NEED_TEMPLATE)) && g4_tokenizer_load_dir(dir, &tm->tok, &err)) goto fail;
    if (g4_gguf_is_file(dir)) { /* -m FILE.gguf: sampling defaults, template and stop ids from its metadata */
        if (gguf_extras(dir, needs, tm, &err)) goto fail;
    } else {
        if (g4_generation_config_load(dir, &tm->gc, &err)) goto fail;
        if ((needs & CLI_NEED_TEMPLATE) && g4_chat_template_load_dir(dir, &tm->tpl, &err)) goto fail;
    }
    tm->model = cli_load_model(dir, (int)opt->threads);
    if (!tm->model) {
        cli_text_close(tm);
        return -1;
    }
    if (tm->tok && g4_tokenizer_vocab_size(tm->tok) > g4_model_vocab_size(tm->model)) {
        g4_fail(&err, "%s: the tokenizer has %d tokens, the model only %d", dir, g4_tokenizer_vocab_size(tm->tok),
                g4_model_vocab_size(tm->model));
        goto fail;
    }
    const int max_pos = tm->model->cfg.text.max_position_embeddings;
    if (n_ctx <= 0) n_ctx = max_pos < 8192 ? max_pos : 8192;
    if (n_ctx > max_pos) n_ctx = max_pos;
    g4_context_params cp = {.n_seq_max = 1, .n_ctx = n_ctx, .n_batch = 512};
    if (g4_context_new(tm->model, &cp, &tm->ctx, &err)) goto fail;
    tm->channel_open = tm->channel_close = tm->tool_call_open = tm->tool_call_close = -1;
    if (tm->tok) {
        tm->channel_open = g4_tokenizer_token_id(tm->tok, "<|channel>");
        tm->channel_close = g4_tokenizer_token_id(tm->tok, "<channel|>");
        tm->tool_call_open = g4_tokenizer_token_id(tm->tok, "<|tool_call>");
        tm->tool_call_close = g4_tokenizer_token_id(tm->tok, "<tool_call|>");
    }
    return 0;
fail:
    cli_error("%s", err.msg);
    cli_text_close(tm);
    return -1;
}

void cli_text_close(cli_text_model *tm) {
    g4_context_free(tm->ctx);
    g4_model_free(tm->model);
    if (tm->tpl) g4_chat_template_free(tm->tpl);
    if (tm->tok) g4_tokenizer_free(tm->tok);
    g4_generation_config_free(&tm->gc); /* safe on the zeroed struct of a failed open */
    memset(tm, 0, sizeof *tm);
}

/* ------------------------------------------------------------- streaming */
typedef enum { MODE_ANSWER, MODE_THINKING, MODE_TOOL } stream_mode;

typedef struct stream_state {
    cli_text_model *tm;
    g4_sampler *sampler;
    g4_detok_stream *detok;
    g4_stop_matcher *stop;
    cli_show show;
    FILE *out, *thinking_out;
    stream_mode mode;
    int skip_channel_name; /* the first line after <|channel> names the channel ("thought") */
    int answer_started;    /* leading whitespace of the answer is not printed */
    int32_t *ids;
    int n_ids, cap_ids;
    int stopped_by_string;
    int ignore_eos;
    int failed;
    g4_error err;
} stream_state;

static void emit(stream_state *st, const char *text, size_t len) {
    if (!len) return;
    if (st->mode == MODE_TOOL) return;
    if (st->mode == MODE_THINKING) {
        if (st->skip_channel_name) {
            const char *nl = memchr(text, '\n', len);
            if (!nl) return;
            st->skip_channel_name = 0;
            len -= (size_t)(nl + 1 - text);
            text = nl + 1;
        }
        if (st->thinking_out && len) {
            fwrite(text, 1, len, st->thinking_out);
            fflush(st->thinking_out);
        }
        return;
    }
    if (st->show == CLI_SHOW_CHAT && !st->answer_started) {
        while (len && (*text == ' ' || *text == '\n' || *text == '\t' || *text == '\r')) {
            text++;
            len--;
        }
        if (!len) return;
        st->answer_started = 1;
    }
    g4_stop_result r;
    if (g4_stop_push(st->stop, text, len, &r, &st->err)) {
        st->failed = 1;
        return;
    }
    if (r.len) {
        fwrite(r.text, 1, r.len, st->out);
        fflush(st->out);
    }
    if (r.stopped) st->stopped_by_string = 1;
}

static void flush_detok(stream_state *st) {
    const char *t;
    size_t n;
    if (g4_detok_stream_flush(st->detok, &t, &n) == 0) emit(st, t, n);
}

static int32_t pick_token(const float *logits, int vocab, void *user) {
    stream_state *st = user;
    return g4_sampler_sample(st->sampler, logits);
}

static int on_token(int32_t id, void *user) {
    stream_state *st = user;
    if (st->n_ids == st->cap_ids) {
        int cap = st->cap_ids ? 2 * st->cap_ids : 256;
        int32_t *n = realloc(st->ids, (size_t)cap * sizeof *n);
        if (!n) {
            st->failed = 1;
            g4_fail(&st->err, "out of memory");
            return 1;
        }
        st->ids = n;
        st->cap_ids = cap;
    }
    st->ids[st->n_ids++] = id;
    g4_sampler_accept(st->sampler, id);
    if (!st->detok) return 0; /* no tokenizer: ids only */
    if (!st->ignore_eos && g4_generation_config_is_eos(&st->tm->gc, id)) return 0; /* a stop token is not shown */
    if (st->show == CLI_SHOW_CHAT) {
        const cli_text_model *tm = st->tm;
        stream_mode next = st->mode;
        if (id == tm->channel_open) next = MODE_THINKING;
        else if (id == tm->channel_close) next = MODE_ANSWER;
        else if (id == tm->tool_call_open) next = MODE_TOOL;
        else if (id == tm->tool_call_close) next = MODE_ANSWER;
        if (next != st->mode || id == tm->channel_open) {
            flush_detok(st);
            st->mode = next;
            if (id == tm->channel_open) st->skip_channel_name = 1;
            return st->failed || st->stopped_by_string;
        }
    }
    const char *t;
    size_t n;
    if (g4_detok_stream_push(st->detok, id, &t, &n, &st->err)) {
        st->failed = 1;
        return 1;
    }
    emit(st, t, n);
    return st->failed || st->stopped_by_string;
}

int cli_generate_text(cli_text_model *tm, const int32_t *prompt, int n_prompt, const cli_sampling *opt,
                      cli_show show, FILE *out, FILE *thinking_out, cli_generation *g) {
    memset(g, 0, sizeof *g);
    g4_error err;
    stream_state st = {.tm = tm, .show = show, .out = out, .thinking_out = thinking_out, .ignore_eos = opt->ignore_eos};
    int rc = -1;
    g4_sampler_params sp = tm->gc.sampling;
    if (opt->have_temp) sp.temperature = (float)opt->temp;
    if (opt->have_top_k) sp.top_k = (int)opt->top_k;
    if (opt->have_top_p) sp.top_p = (float)opt->top_p;
    if (opt->have_min_p) sp.min_p = (float)opt->min_p;
    if (opt->have_repeat) sp.repetition_penalty = (float)opt->repeat_penalty;
    if (opt->have_presence) sp.presence_penalty = (float)opt->presence_penalty;
    if (opt->have_frequency) sp.frequency_penalty = (float)opt->frequency_penalty;
    if (opt->repeat_last_n != -1) sp.penalty_last_n = (int)opt->repeat_last_n;
    if (opt->n_bias) {
        sp.bias_ids = opt->bias_ids;
        sp.bias_values = opt->bias_values;
        sp.n_bias = opt->n_bias;
    }
    sp.seed = opt->have_seed ? (uint64_t)opt->seed : (uint64_t)time(NULL);
    const int len = g4_seq_length(tm->ctx, 0), n_ctx = g4_context_n_ctx(tm->ctx);
    int room = n_ctx - len - n_prompt;
    if (room <= 0) {
        cli_error("the prompt (%d tokens) does not fit the context of %d positions (%d used)", n_prompt, n_ctx, len);
        return -1;
    }
    int max_new = opt->n_predict > 0 ? (int)opt->n_predict : g4_generation_config_max_new(&tm->gc, n_prompt);
    if (max_new <= 0 || max_new > room) max_new = room;
    if (g4_sampler_new(&sp, g4_model_vocab_size(tm->model), &st.sampler, &err)) {
        cli_error("%s", err.msg);
        return -1;
    }
    g4_sampler_accept_many(st.sampler, prompt, n_prompt);
    if (tm->tok) {
        st.detok = g4_detok_stream_new(tm->tok, 1);
        if (!st.detok || g4_stop_new(opt->stops, opt->n_stops, &st.stop, &err)) {
            cli_error("%s", st.detok ? err.msg : "out of memory");
            goto done;
        }
    } else if (opt->n_stops) {
        cli_error("--stop needs the model's tokenizer.json");
        goto done;
    }
    int32_t *out_ids = malloc((size_t)max_new * sizeof *out_ids);
    if (!out_ids) {
        cli_error("out of memory");
        goto done;
    }
    g4_generate_params gp = {
        .max_new_tokens = max_new, .pick = pick_token, .pick_user = &st, .on_token = on_token,
        .on_token_user = &st, .stop_ids = tm->gc.eos_ids, .n_stop = opt->ignore_eos ? 0 : tm->gc.n_eos,
        .cancel = &cli_cancel,
    };
    int n_out = 0, why = 0;
    cli_cancel = 0;
    cli_generating = 1;
    int grc = g4_generate(tm->ctx, 0, prompt, n_prompt, &gp, out_ids, &n_out, &why, &err);
    cli_generating = 0;
    free(out_ids);
    if (grc) {
        cli_error("%s", err.msg);
        goto done;
    }
    if (st.failed) {
        cli_error("%s", st.err.msg);
        goto done;
    }
    if (st.detok) {
        flush_detok(&st);
        g4_stop_result r;
        g4_stop_flush(st.stop, &r);
        if (r.len && st.mode == MODE_ANSWER) fwrite(r.text, 1, r.len, out);
        fflush(out);
    }
    g->finish = why == 3 ? "cancelled" : (why == 1 || st.stopped_by_string) ? "stop" : "length";
    g->ids = st.ids;
    g->n_ids = st.n_ids;
    st.ids = NULL;
    size_t rl;
    if (tm->tok && g4_detokenize(tm->tok, g->ids, (size_t)g->n_ids, 0, &g->raw, &rl, &err)) {
        cli_error("%s", err.msg);
        goto done;
    }
    rc = 0;
done:
    free(st.ids);
    if (st.stop) g4_stop_free(st.stop);
    if (st.detok) g4_detok_stream_free(st.detok);
    g4_sampler_free(st.sampler);
    return rc;
}

void cli_generation_free(cli_generation *g) {
    free(g->ids);
    free(g->raw);
    memset(g, 0, sizeof *g);
}
