#include "cli/cli_text.h"

#include <math.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli_common.h"
#include "cli/commands.h"

enum {
    OPT_TEMP = 1000, OPT_TOP_K, OPT_TOP_P, OPT_MIN_P, OPT_SEED, OPT_REPEAT, OPT_REPEAT_N, OPT_PRESENCE,
    OPT_FREQUENCY, OPT_STOP, OPT_IGNORE_EOS, OPT_CTX, OPT_BIAS, OPT_DRAFT, OPT_DRAFT_N, OPT_DRAFT_STATS, OPT_SCHEMA, OPT_GRAMMAR, OPT_GRAMMAR_FILE
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
    {"draft", required_argument, 0, OPT_DRAFT},
    {"draft-n", required_argument, 0, OPT_DRAFT_N},
    {"draft-stats", no_argument, 0, OPT_DRAFT_STATS},
    {"json-schema", required_argument, 0, OPT_SCHEMA},
    {"grammar", required_argument, 0, OPT_GRAMMAR},
    {"grammar-file", required_argument, 0, OPT_GRAMMAR_FILE},
    {0, 0, 0, 0},
};

void cli_options_with_sampling(const struct option *own, struct option *out, int cap) {
    int k = 0;
    for (int i = 0; own[i].name && k < cap - 1; i++) out[k++] = own[i];
    for (int i = 0; cli_sampling_options[i].name && k < cap - 1; i++) out[k++] = cli_sampling_options[i];
    memset(&out[k], 0, sizeof out[k]);
}

/* the generation Ctrl-C cancels (g4_generation_cancel is safe in a signal handler) */
static g4_generation *volatile streaming;

static void on_sigint(int sig) {
    (void)sig;
    g4_generation *g = streaming;
    if (g) {
        g4_generation_cancel(g);
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
    case OPT_CTX: s->have_ctx = 1; return cli_parse_int(arg, "--ctx", 16, 1 << 24, &s->n_ctx) ? -1 : 1;
    case OPT_DRAFT: s->draft_dir = arg; return 1;
    case OPT_DRAFT_N: return cli_parse_int(arg, "--draft-n", 1, 256, &s->draft_n) ? -1 : 1;
    case OPT_DRAFT_STATS: s->draft_stats = 1; return 1;
    case OPT_SCHEMA:
    case OPT_GRAMMAR:
    case OPT_GRAMMAR_FILE:
        if (s->constraint) return cli_error("--json-schema, --grammar and --grammar-file: give one"), -1;
        s->constraint = arg;
        s->constraint_kind = opt == OPT_SCHEMA ? 'j' : opt == OPT_GRAMMAR ? 'g' : 'f';
        return 1;
    default: return 0;
    }
}

/* --json-schema SCHEMA (inline JSON, or a file's path), --grammar GBNF, --grammar-file FILE: the output's grammar. */
static int cli_constraint(const cli_sampling *opt, g4_grammar **out) {
    const char *arg = opt->constraint;
    char *text = NULL;
    const int inline_text = opt->constraint_kind == 'g' || (opt->constraint_kind == 'j' && arg[0] == '{');
    if (inline_text) {
        text = strdup(arg);
    } else {
        FILE *f = fopen(arg, "rb");
        if (f && fseek(f, 0, SEEK_END) == 0) {
            long n = ftell(f);
            if (n >= 0 && n < (64L << 20) && fseek(f, 0, SEEK_SET) == 0 && (text = malloc((size_t)n + 1)))
                text[fread(text, 1, (size_t)n, f)] = 0;
        }
        if (f) fclose(f);
    }
    const char *flag = opt->constraint_kind == 'j' ? "--json-schema" : opt->constraint_kind == 'g' ? "--grammar"
                                                                                                  : "--grammar-file";
    if (!text) return cli_error("%s %s: cannot read the file (or it is over 64 MiB)", flag, arg), -1;
    g4_error err;
    const int rc = opt->constraint_kind == 'j' ? g4_grammar_json_schema(text, out, &err) : g4_grammar_gbnf(text, out, &err);
    free(text);
    if (rc) cli_error("%s: %s", flag, err.msg);
    return rc;
}

int cli_text_open(const cli_sampling *opt, int needs, int parallel, cli_text_model *tm) {
    memset(tm, 0, sizeof *tm);
    const char *dir = opt->model_dir;
    g4_error err;
    tm->model = cli_load_model(dir, (int)opt->threads);
    if (!tm->model) return -1;
    struct stat st; /* -m FILE is a GGUF file: its tokenizer and template are metadata */
    const int gguf = stat(dir, &st) == 0 && S_ISREG(st.st_mode);
    if ((needs & CLI_NEED_TOKENIZER) && !g4_model_tokenizer(tm->model)) {
        cli_error(gguf ? "%s: the file has no tokenizer (tokenizer.ggml.tokens)"
                       : "%s: no tokenizer.json", dir);
        goto fail;
    }
    if ((needs & CLI_NEED_TEMPLATE) && !g4_model_chat_template(tm->model)) {
        if (g4_model_chat_template_error(tm->model))
            cli_error("%s", g4_model_chat_template_error(tm->model));
        else if (gguf)
            cli_error("%s: the file has no chat template (tokenizer.chat_template)", dir);
        else
            cli_error("%s: no chat template (chat_template.jinja, \"chat_template\" in tokenizer_config.json, or "
                      "chat_template.json)", dir);
        goto fail;
    }
    if (!opt->draft_dir && (opt->draft_n || opt->draft_stats)) {
        cli_error("--draft-n and --draft-stats need --draft DIR");
        goto fail;
    }
    if (opt->draft_dir && g4_drafter_load(opt->draft_dir, tm->model, &tm->drafter, &err)) {
        cli_error("%s", err.msg);
        goto fail;
    }
    if (opt->constraint && cli_constraint(opt, &tm->grammar)) goto fail;
    const int max_pos = g4_model_n_ctx_train(tm->model);
    if (opt->have_ctx && opt->n_ctx > max_pos) { /* a default (generate --ids: prompt + -n) is capped instead */
        cli_error("--ctx %ld exceeds the model's max_position_embeddings %d", opt->n_ctx, max_pos);
        goto fail;
    }
    const int image = g4_image_max_tokens(tm->model, opt->image_budget); /* 0 without a vision tower */
    g4_context_params cp = {.n_ctx = opt->n_ctx < max_pos ? (int)opt->n_ctx : max_pos, /* 0: the library's default */
                            .n_batch = image > 512 ? image : 0, .kv_type = cli_kv_type(tm->model)};
    /* for a scheduler: nothing is rolled back but a verification's drafts, whose drafting reads a few sliding rows
     * more than a step does */
    const int sched_history = tm->drafter ? g4_drafter_kv_history(tm->drafter) : -1;
    if (parallel == CLI_PARALLEL_AUTO) {
        cp.kv_history = sched_history;
        parallel = CLI_PARALLEL_CPU;
        if (strcmp(g4_model_device(tm->model), "cpu")) {
            parallel = g4_context_fit_sequences(tm->model, &cp, CLI_PARALLEL_GPU_MAX, NULL, &err);
            if (parallel < 0) {
                cli_error("%s", err.msg);
                goto fail;
            }
        }
    }
    if (parallel > 0) {
        cp.n_seq_max = parallel;
        cp.kv_history = sched_history;
    }
    tm->n_seq = cp.n_seq_max > 0 ? cp.n_seq_max : 1;
    if (g4_context_new(tm->model, &cp, &tm->ctx, &err) == 0) return 0;
    cli_error("%s", err.msg);
fail:
    cli_text_close(tm);
    return -1;
}

void cli_text_close(cli_text_model *tm) {
    g4_grammar_free(tm->grammar);
    g4_context_free(tm->ctx);
    g4_drafter_free(tm->drafter);
    g4_model_free(tm->model);
    memset(tm, 0, sizeof *tm);
}

void cli_generation_params(const cli_sampling *opt, const cli_text_model *tm, g4_sampler_params *sp,
                           g4_generation_params *gp) {
    g4_model_sampler_params(tm->model, sp);
    if (opt->have_temp) sp->temperature = (float)opt->temp;
    if (opt->have_top_k) sp->top_k = (int)opt->top_k;
    if (opt->have_top_p) sp->top_p = (float)opt->top_p;
    if (opt->have_min_p) sp->min_p = (float)opt->min_p;
    if (opt->have_repeat) sp->repetition_penalty = (float)opt->repeat_penalty;
    if (opt->have_presence) sp->presence_penalty = (float)opt->presence_penalty;
    if (opt->have_frequency) sp->frequency_penalty = (float)opt->frequency_penalty;
    if (opt->repeat_last_n != -1) sp->penalty_last_n = (int)opt->repeat_last_n;
    if (opt->n_bias) {
        sp->bias_ids = opt->bias_ids;
        sp->bias_values = opt->bias_values;
        sp->n_bias = opt->n_bias;
    }
    sp->seed = opt->have_seed ? (uint64_t)opt->seed : (uint64_t)time(NULL);
    *gp = (g4_generation_params){
        .max_new_tokens = opt->n_predict > 0 ? (int)opt->n_predict : 0,
        .sampling = sp,
        .ignore_eos = opt->ignore_eos,
        .stop_strings = opt->stops,
        .n_stop_strings = opt->n_stops,
        .drafter = tm->drafter,
        .n_draft = (int)opt->draft_n,
        .grammar = tm->grammar,
    };
}

void cli_note_context_full(const cli_sampling *opt, const cli_text_model *tm, const g4_generation *g, const char *cmd) {
    int n = 0;
    g4_generation_tokens(g, &n);
    if (g4_generation_finish(g) == G4_FINISH_LENGTH && opt->n_predict > 0 && n < opt->n_predict)
        fprintf(stderr, "gemma4c: %s: the context of %d tokens is full after %d of the %ld new tokens asked for (--ctx "
                        "sets its size)\n", cmd, g4_context_n_ctx(tm->ctx), n, opt->n_predict);
}

int cli_stream(g4_generation *g, FILE *out, FILE *thinking_out) {
    g4_error err;
    g4_event ev;
    int rc;
    streaming = g;
    while ((rc = g4_generation_next(g, &ev, &err)) == 1) {
        FILE *f = ev.kind == G4_EVENT_TEXT ? out : ev.kind == G4_EVENT_THINKING ? thinking_out : NULL;
        if (f) {
            fwrite(ev.text, 1, ev.len, f);
            fflush(f);
        }
    }
    streaming = NULL;
    if (rc < 0) cli_error("%s", err.msg);
    return rc;
}

void cli_print_tool_calls(const g4_generation *g) {
    g4_chat_message m;
    g4_error err;
    if (g4_generation_message(g, &m, &err)) {
        cli_error("%s", err.msg);
        return;
    }
    if (m.n_tool_calls) printf("{\"tool_calls\":%s}\n", m.tool_calls);
    g4_chat_message_free(&m);
}

void cli_print_draft_stats(const cli_sampling *opt, const g4_generation *g) {
    if (!opt->draft_stats) return;
    const int *drafted, *accepted;
    int n;
    g4_generation_rounds(g, &drafted, &accepted, &n);
    fprintf(stderr, "{\"accepted_per_round\": [");
    for (int i = 0; i < n; i++) fprintf(stderr, i ? ", %d" : "%d", accepted[i]);
    fprintf(stderr, "], \"drafts_per_round\": [");
    for (int i = 0; i < n; i++) fprintf(stderr, i ? ", %d" : "%d", drafted[i]);
    fprintf(stderr, "]}\n");
}
