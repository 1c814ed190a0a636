/* gemma4c detokenize: ids to text. */
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_common.h"
#include "cli/commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: gemma4c detokenize (-m DIR | --tokenizer FILE) (-f FILE | --ids 2,17,99) [--skip-special]\n"
            "\n"
            "  -m, --model DIR        model folder (uses DIR/tokenizer.json)\n"
            "      --tokenizer FILE   a tokenizer.json\n"
            "  -f, --file FILE        JSON lines {\"ids\": [...], \"skip_special_tokens\": bool (default\n"
            "                         false)}; '-' reads stdin; writes one JSON string per input line\n"
            "  -i, --ids LIST         decode comma-separated ids and print the text as it is\n"
            "      --skip-special     drop special tokens (for -f: the default of skip_special_tokens)\n"
            "  -h, --help             this help\n"
            "\n"
            "Decoding is Hugging Face's decode. A malformed input line or an id out of the vocabulary\n"
            "gets {\"error\": ...} on its output line; the exit status is then 1.\n");
}

typedef struct {
    const g4_tokenizer *tok;
    int default_skip;
} detokenize_job;

/* {"ids": [...], "skip_special_tokens": bool} -> "text" */
static json_t *detokenize_line(const json_t *in, void *user, g4_error *err) {
    const detokenize_job *job = user;
    const json_t *ids = json_object_get(in, "ids");
    const json_t *skip = json_object_get(in, "skip_special_tokens");
    if (!json_is_array(ids)) return g4_fail(err, "\"ids\" must be an array of integers"), NULL;
    if (skip && !json_is_null(skip) && !json_is_boolean(skip))
        return g4_fail(err, "\"skip_special_tokens\" must be true or false"), NULL;
    size_t n = json_array_size(ids);
    int32_t *v = malloc((n ? n : 1) * sizeof *v);
    if (!v) return g4_fail(err, "out of memory"), NULL;
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_array_get(ids, i);
        if (!json_is_integer(x) || json_integer_value(x) < INT32_MIN || json_integer_value(x) > INT32_MAX) {
            free(v);
            return g4_fail(err, "\"ids\"[%zu] is not an integer token id", i), NULL;
        }
        v[i] = (int32_t)json_integer_value(x);
    }
    char *text;
    size_t len;
    int s = json_is_boolean(skip) ? json_is_true(skip) : job->default_skip;
    int rc = g4_detokenize(job->tok, v, n, s, &text, &len, err);
    free(v);
    if (rc) return NULL;
    json_t *out = json_stringn(text, len);
    free(text);
    if (!out) g4_fail(err, "the decoded text cannot be written as JSON");
    return out;
}

int cmd_detokenize(int argc, char **argv) {
    const char *model_dir = NULL, *tok_file = NULL, *file = NULL, *id_list = NULL;
    int skip = 0;
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"tokenizer", required_argument, 0, 't'},
                                         {"file", required_argument, 0, 'f'},
                                         {"ids", required_argument, 0, 'i'},
                                         {"skip-special", no_argument, 0, 'S'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "m:f:i:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model_dir = optarg; break;
        case 't': tok_file = optarg; break;
        case 'f': file = optarg; break;
        case 'i': id_list = optarg; break;
        case 'S': skip = 1; break;
        case 'h': usage(stdout); return 0;
        default: return cli_bad_option("detokenize", argv);
        }
    }
    if (optind < argc) return cli_error("detokenize: unexpected argument '%s' (see --help)", argv[optind]);
    if (!model_dir == !tok_file) return cli_error("detokenize: give one of -m DIR or --tokenizer FILE (see --help)");
    if (!file == !id_list) return cli_error("detokenize: give one of -f FILE or --ids LIST (see --help)");
    int32_t *ids = NULL;
    int n_ids = 0;
    g4_error err;
    if (id_list && cli_parse_ids(id_list, &ids, &n_ids, &err)) return cli_error("detokenize: %s", err.msg);

    g4_tokenizer *tok = cli_load_tokenizer(model_dir, tok_file);
    if (!tok) {
        free(ids);
        return 1;
    }
    int status = 0;
    if (id_list) {
        char *text;
        size_t len;
        if (g4_detokenize(tok, ids, (size_t)n_ids, skip, &text, &len, &err)) {
            status = cli_error("detokenize: %s", err.msg);
        } else {
            fwrite(text, 1, len, stdout);
            fputc('\n', stdout);
            free(text);
            if (fflush(stdout) != 0) status = cli_error("detokenize: cannot write the output");
        }
    } else {
        detokenize_job job = {tok, skip};
        status = cli_jsonl_map("detokenize", file, detokenize_line, &job);
    }
    free(ids);
    g4_tokenizer_free(tok);
    return status;
}
