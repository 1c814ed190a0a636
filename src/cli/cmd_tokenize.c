/* gemma4c tokenize: text to ids. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_common.h"
#include "cli/commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: gemma4c tokenize (-m DIR | --tokenizer FILE) (-p TEXT | -f FILE) [--no-bos]\n"
            "\n"
            "  -m, --model DIR        model folder (uses DIR/tokenizer.json)\n"
            "      --tokenizer FILE   a tokenizer.json (tokenizer_config.json beside it is read too)\n"
            "  -p, --prompt TEXT      encode TEXT; prints the ids comma-separated on one line\n"
            "  -f, --file FILE        JSON lines {\"text\": ..., \"add_special_tokens\": bool}; '-' reads\n"
            "                         stdin; writes one JSON array of ids per input line, in order\n"
            "      --no-bos           do not add BOS (for -f: the default of add_special_tokens)\n"
            "  -h, --help             this help\n"
            "\n"
            "Special tokens written in the text are matched, as Hugging Face does. BOS is added as\n"
            "HF encode(text) adds it. A malformed input line gets {\"error\": ...} on its output line;\n"
            "the exit status is then 1.\n");
}

static void print_ids(const g4_tokens *t) {
    for (size_t i = 0; i < t->n; i++) printf(i ? ",%d" : "%d", t->ids[i]);
    fputc('\n', stdout);
}

typedef struct {
    const g4_tokenizer *tok;
    int default_specials;
} tokenize_job;

/* {"text": ..., "add_special_tokens": bool} -> [ids] */
static json_t *tokenize_line(const json_t *in, void *user, g4_error *err) {
    const tokenize_job *job = user;
    const json_t *text = json_object_get(in, "text");
    const json_t *specials = json_object_get(in, "add_special_tokens");
    if (!json_is_string(text)) return g4_fail(err, "\"text\" must be a string"), NULL;
    if (specials && !json_is_null(specials) && !json_is_boolean(specials))
        return g4_fail(err, "\"add_special_tokens\" must be true or false"), NULL;
    int add = json_is_boolean(specials) ? json_is_true(specials) : job->default_specials;
    g4_tokens t = {0};
    if (g4_tokenize(job->tok, json_string_value(text), json_string_length(text), add, &t, err)) return NULL;
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < t.n; i++) json_array_append_new(arr, json_integer(t.ids[i]));
    free(t.ids);
    if (!arr) g4_fail(err, "out of memory");
    return arr;
}

int cmd_tokenize(int argc, char **argv) {
    const char *model_dir = NULL, *tok_file = NULL, *prompt = NULL, *file = NULL;
    int no_bos = 0;
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"tokenizer", required_argument, 0, 't'},
                                         {"prompt", required_argument, 0, 'p'},
                                         {"file", required_argument, 0, 'f'},
                                         {"no-bos", no_argument, 0, 'B'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "m:p:f:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model_dir = optarg; break;
        case 't': tok_file = optarg; break;
        case 'p': prompt = optarg; break;
        case 'f': file = optarg; break;
        case 'B': no_bos = 1; break;
        case 'h': usage(stdout); return 0;
        default: return cli_bad_option("tokenize", argv);
        }
    }
    if (optind < argc) return cli_error("tokenize: unexpected argument '%s' (see --help)", argv[optind]);
    if (!model_dir == !tok_file) return cli_error("tokenize: give one of -m DIR or --tokenizer FILE (see --help)");
    if (!prompt == !file) return cli_error("tokenize: give one of -p TEXT or -f FILE (see --help)");

    g4_tokenizer *tok = cli_load_tokenizer(model_dir, tok_file);
    if (!tok) return 1;
    int status = 0;
    if (prompt) {
        g4_tokens t = {0};
        g4_error err;
        if (g4_tokenize(tok, prompt, strlen(prompt), !no_bos, &t, &err))
            status = cli_error("tokenize: %s", err.msg);
        else
            print_ids(&t);
        free(t.ids);
        if (fflush(stdout) != 0) status = cli_error("tokenize: cannot write the output");
    } else {
        tokenize_job job = {tok, !no_bos};
        status = cli_jsonl_map("tokenize", file, tokenize_line, &job);
    }
    g4_tokenizer_free(tok);
    return status;
}
