/* gemma4c generate: text completion.
 *   gemma4c generate -m DIR -p TEXT          streams the continuation of TEXT (BOS added)
 *   gemma4c generate -m DIR --ids 2,17,99    prints the generated ids, comma-separated, on one line
 *   gemma4c generate -m DIR -f FILE.jsonl    every line at once through the scheduler (--parallel P
 *                                            running together); one output line per input line, in order
 * With --image FILE / --audio FILE the prompt holds one <|image|> / <|audio|> placeholder per file, as a chat
 * template writes them; each kind's placeholders take its files in order and are expanded into their blocks
 * (g4_generation_params.media). Sampling defaults come from the model's generation_config.json; --temp 0 is
 * greedy. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_batch.h"
#include "cli/cli_common.h"
#include "cli/cli_media.h"
#include "cli/cli_text.h"
#include "cli/commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: gemma4c generate -m DIR (-p TEXT | --ids 2,17,99 | -f FILE) [options]\n"
            "  -p TEXT        text to continue (the continuation is streamed to stdout)\n"
            "  --ids LIST     token ids to continue; prints the generated ids on one line\n"
            "  -f FILE        JSON lines ('-': standard input), all generated at once:\n"
            "                 {\"prompt\": TEXT} or {\"ids\": [...]}, optional \"max_tokens\", \"temperature\",\n"
            "                 \"seed\", \"stop\" (a string or a list), one of \"json_schema\" (an object or its\n"
            "                 text), \"grammar\" (GBNF), \"regex\" (in place of the command's constraint);\n"
            "                 prints {\"ids\": [...], \"text\": ...} (the generated part) or {\"error\": ...} per line,\n"
            "                 in input order; with --draft-stats also each line's accepted and drafted tokens\n"
            "                 per round (with --draft, constrained lines decode without drafts)\n"
            "  --parallel P   requests running at once with -f (default: 8 on the CPU; on a GPU as many as its\n"
            "                 free memory holds the KV cache of, at most 128)\n"
            "  --no-bos       do not add the BOS token to TEXT\n"
            "  --image FILE   fills the prompt's next <|image|> placeholder (one per image; repeatable)\n"
            "  --audio FILE   fills the prompt's next <|audio|> placeholder (one per file; repeatable)\n"
            "  --budget N     soft tokens per image at most: 70, 140, 280, 560, 1120 (default: the model's)\n"
            CLI_SAMPLING_HELP);
}

/* -f: the command line's settings, then each line's */
typedef struct gen_batch {
    const g4_model *model;
    g4_sampler_params sp;
    g4_generation_params gp;
    int add_bos;
    int draft_stats; /* each output line also has its rounds' drafts and kept drafts */
} gen_batch;

/* A line's own constraint: "json_schema" (an object, or its text), "grammar" (GBNF) or "regex"; 0 with *g NULL when
 * it has none. */
static int line_grammar(const json_t *line, g4_grammar **g, g4_error *err) {
    static const char *const keys[] = {"json_schema", "grammar", "regex"};
    const json_t *v = NULL;
    int k = -1;
    for (int i = 0; i < 3; i++)
        if (json_object_get(line, keys[i])) {
            if (v) return g4_fail(err, "\"%s\" and \"%s\": give one constraint a line", keys[k], keys[i]);
            v = json_object_get(line, keys[i]), k = i;
        }
    if (!v) return 0;
    if (k == 0 && json_is_object(v)) {
        char *text = json_dumps(v, JSON_COMPACT);
        if (!text) return g4_fail(err, "out of memory");
        const int rc = g4_grammar_json_schema(text, g, err);
        free(text);
        return rc;
    }
    if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))
        return g4_fail(err, "\"%s\" must be %s", keys[k], k == 0 ? "a JSON Schema (an object or its text)" : "a string");
    const char *text = json_string_value(v);
    return k == 0 ? g4_grammar_json_schema(text, g, err) : k == 1 ? g4_grammar_gbnf(text, g, err)
                                                                  : g4_grammar_regex(text, g, err);
}

static int gen_submit(const json_t *line, long index, g4_scheduler *s, void *user, g4_generation **out,
                      g4_grammar **grammar, g4_error *err) {
    const gen_batch *b = user;
    g4_sampler_params sp = b->sp;
    g4_generation_params gp = b->gp;
    gp.sampling = &sp;
    sp.seed += (uint64_t)index; /* each line its own draws unless it gives a seed */
    const json_t *v;
    if ((v = json_object_get(line, "max_tokens"))) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > (1 << 24))
            return g4_fail(err, "\"max_tokens\" must be an integer in 1..%d", 1 << 24);
        gp.max_new_tokens = (int)json_integer_value(v);
    }
    if ((v = json_object_get(line, "temperature"))) {
        if (!json_is_number(v) || json_number_value(v) < 0 || json_number_value(v) > 100)
            return g4_fail(err, "\"temperature\" must be a number in 0..100");
        sp.temperature = (float)json_number_value(v);
    }
    if ((v = json_object_get(line, "seed"))) {
        if (!json_is_integer(v) || json_integer_value(v) < 0) return g4_fail(err, "\"seed\" must be an integer >= 0");
        sp.seed = (uint64_t)json_integer_value(v);
    }
    const char *stops[CLI_MAX_STOPS];
    if ((v = json_object_get(line, "stop"))) {
        size_t n = json_is_array(v) ? json_array_size(v) : 1;
        if (n > CLI_MAX_STOPS) return g4_fail(err, "\"stop\": at most %d strings", CLI_MAX_STOPS);
        for (size_t i = 0; i < n; i++) {
            const json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
            if (!json_is_string(e) || json_string_length(e) == 0 || strlen(json_string_value(e)) != json_string_length(e))
                return g4_fail(err, "\"stop\" must be a non-empty string or a list of them");
            stops[i] = json_string_value(e);
        }
        gp.stop_strings = stops;
        gp.n_stop_strings = (int)n;
    }
    if (line_grammar(line, grammar, err)) return -1;
    if (*grammar) gp.grammar = *grammar, gp.json_object = 0; /* (the line's replaces the command's) */
    if (gp.grammar || gp.json_object) gp.drafter = NULL; /* constrained lines decode without drafts */
    int n;
    int32_t *ids = cli_batch_line_ids(line, "prompt", b->add_bos, b->model, &n, err);
    if (!ids) return -1;
    int rc = g4_scheduler_submit(s, ids, n, &gp, NULL, NULL, out, err);
    free(ids);
    return rc;
}

static json_t *gen_result(const g4_generation *g, void *user, g4_error *err) {
    const gen_batch *b = user;
    int n;
    const int32_t *ids = g4_generation_tokens(g, &n);
    json_t *o = json_object(), *arr = json_array();
    for (int i = 0; arr && i < n; i++) json_array_append_new(arr, json_integer(ids[i]));
    json_object_set_new(o, "ids", arr);
    if (b->draft_stats) {
        const int *drafted, *accepted;
        int nr;
        g4_generation_rounds(g, &drafted, &accepted, &nr);
        json_t *a = json_array(), *d = json_array();
        for (int i = 0; i < nr && a && d; i++) {
            json_array_append_new(a, json_integer(accepted[i]));
            json_array_append_new(d, json_integer(drafted[i]));
        }
        json_object_set_new(o, "accepted_per_round", a);
        json_object_set_new(o, "drafts_per_round", d);
    }
    if (g4_model_tokenizer(b->model)) {
        g4_chat_message m;
        if (g4_generation_message(g, &m, err)) {
            json_decref(o);
            return NULL;
        }
        json_object_set_new(o, "text", json_stringn(m.content, strlen(m.content)));
        g4_chat_message_free(&m);
    }
    return o;
}

static int generate_file(const char *file, cli_sampling *smp, int parallel, int no_bos) {
    cli_text_model tm;
    if (smp->n_predict <= 0) smp->n_predict = 128;
    if (cli_text_open(smp, 0, parallel, &tm)) return 1;
    gen_batch b = {.model = tm.model, .add_bos = !no_bos, .draft_stats = smp->draft_stats};
    cli_generation_params(smp, &tm, &b.sp, &b.gp);
    g4_scheduler *s;
    g4_error err;
    int rc = 1;
    if (g4_scheduler_new(tm.ctx, &s, &err) == 0) {
        rc = cli_batch_run("generate", file, s, 2 * tm.n_seq, gen_submit, gen_result, &b);
        g4_scheduler_free(s);
    } else {
        cli_error("%s", err.msg);
    }
    cli_text_close(&tm);
    return rc;
}

int cmd_generate(int argc, char **argv) {
    enum { OPT_IDS = 2000, OPT_NO_BOS, OPT_IMAGE, OPT_AUDIO, OPT_BUDGET, OPT_PARALLEL };
    static const struct option own[] = {{"prompt", required_argument, 0, 'p'}, {"ids", required_argument, 0, OPT_IDS},
                                        {"file", required_argument, 0, 'f'},
                                        {"parallel", required_argument, 0, OPT_PARALLEL},
                                        {"no-bos", no_argument, 0, OPT_NO_BOS}, {"image", required_argument, 0, OPT_IMAGE},
                                        {"audio", required_argument, 0, OPT_AUDIO}, {"budget", required_argument, 0, OPT_BUDGET},
                                        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0}};
    struct option opts[40];
    cli_options_with_sampling(own, opts, 40);
    const char *text = NULL, *ids_s = NULL, *file = NULL;
    int no_bos = 0, c;
    long budget = 0, parallel = CLI_PARALLEL_AUTO;
    cli_sampling smp;
    cli_sampling_init(&smp);
    cli_media_files files = {0};
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "m:p:f:n:t:h", opts, NULL)) != -1) {
        int r = cli_sampling_parse(&smp, c, optarg);
        if (r < 0) return 1;
        if (r > 0) continue;
        switch (c) {
        case 'p': text = optarg; break;
        case OPT_IDS: ids_s = optarg; break;
        case 'f': file = optarg; break;
        case OPT_PARALLEL:
            if (cli_parse_int(optarg, "--parallel", 1, 65536, &parallel)) return 1;
            break;
        case OPT_NO_BOS: no_bos = 1; break;
        case OPT_IMAGE:
        case OPT_AUDIO:
            if (cli_media_file(&files, "generate", optarg, c == OPT_AUDIO)) return 1;
            break;
        case OPT_BUDGET:
            if (cli_parse_int(optarg, "--budget", 1, 1 << 20, &budget)) return 1;
            break;
        case 'h': usage(stdout); return 0;
        default: return cli_bad_option("generate", argv);
        }
    }
    if (optind < argc) return cli_error("generate: unexpected argument '%s'", argv[optind]);
    if (!!text + !!ids_s + !!file != 1) return cli_error("generate: give exactly one of -p TEXT, --ids LIST and -f FILE");
    if (file && files.n) return cli_error("generate: --image and --audio do not go with -f (one request per command)");
    if (file) return generate_file(file, &smp, (int)parallel, no_bos);

    g4_error err;
    int32_t *prompt = NULL;
    int n_prompt = 0;
    if (ids_s && cli_parse_ids(ids_s, &prompt, &n_prompt, &err)) return cli_error("%s", err.msg);

    cli_text_model tm;
    long n_new = smp.n_predict > 0 ? smp.n_predict : 128;
    if (smp.n_predict <= 0) smp.n_predict = n_new;
    if (ids_s && !files.n && smp.n_ctx <= 0) smp.n_ctx = n_prompt + n_new; /* soft tokens: the default */
    smp.image_budget = (int)budget;
    cli_media md = {0};
    if (cli_text_open(&smp, text ? CLI_NEED_TOKENIZER : 0, 0, &tm)) {
        free(prompt);
        return 1;
    }
    int rc = 1;
    g4_generation *gen = NULL;
    if (text) {
        g4_tokens toks = {0};
        if (g4_tokenize(g4_model_tokenizer(tm.model), text, strlen(text), !no_bos, &toks, &err)) {
            cli_error("%s", err.msg);
            goto done;
        }
        prompt = toks.ids;
        n_prompt = (int)toks.n;
        if (n_prompt == 0) {
            cli_error("generate: the prompt is empty");
            goto done;
        }
    }
    if (cli_media_add_files(&md, tm.model, &files, (int)budget)) goto done;
    g4_sampler_params sp;
    g4_generation_params gp;
    cli_generation_params(&smp, &tm, &sp, &gp);
    gp.media = md.items;
    gp.n_media = md.n;
    if (g4_generation_start(tm.ctx, 0, prompt, n_prompt, &gp, &gen, &err)) {
        cli_error("%s", err.msg);
        goto done;
    }
    cli_catch_sigint();
    if (cli_stream(gen, ids_s ? NULL : stdout, NULL)) goto done;
    cli_print_draft_stats(&smp, gen);
    if (ids_s) {
        int n;
        const int32_t *ids = g4_generation_tokens(gen, &n);
        for (int i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
    }
    printf("\n");
    cli_note_context_full(&smp, &tm, gen, "generate");
    rc = g4_generation_finish(gen) == G4_FINISH_CANCELLED ? 130 : 0;
done:
    g4_generation_free(gen);
    cli_media_truncate(&md, 0);
    free(prompt);
    cli_text_close(&tm);
    return rc;
}
