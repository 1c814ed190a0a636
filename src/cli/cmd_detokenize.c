/* gemma4c detokenize: ids to text. */
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_tokenizer.h"
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

static int detokenize_ids(const g4_tokenizer *tok, const int32_t *ids, size_t n, int skip, int json) {
    char *out;
    size_t len;
    g4_error err;
    if (g4_detokenize(tok, ids, n, skip, &out, &len, &err)) {
        if (json) {
            cli_print_error_line(err.msg);
            return 1;
        }
        return cli_error("detokenize: %s", err.msg);
    }
    int rc = 0;
    if (json) {
        json_t *s = json_stringn(out, len);
        char *dump = s ? json_dumps(s, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
        if (dump) {
            fputs(dump, stdout);
            fputc('\n', stdout);
        } else {
            cli_print_error_line("the decoded text cannot be written as JSON");
            rc = 1;
        }
        free(dump);
        json_decref(s);
    } else {
        fwrite(out, 1, len, stdout);
        fputc('\n', stdout);
    }
    free(out);
    return rc;
}

static int detokenize_line(const g4_tokenizer *tok, const char *line, size_t len, int default_skip) {
    json_error_t je;
    json_t *o = json_loadb(line, len, JSON_ALLOW_NUL, &je);
    char msg[600];
    if (!o) {
        snprintf(msg, sizeof msg, "invalid JSON: %s", je.text);
        cli_print_error_line(msg);
        return 1;
    }
    int rc = 1;
    const json_t *ids = json_object_get(o, "ids");
    const json_t *skip = json_object_get(o, "skip_special_tokens");
    if (!json_is_object(o)) {
        cli_print_error_line("expected an object {\"ids\": [...]}");
    } else if (!json_is_array(ids)) {
        cli_print_error_line("\"ids\" must be an array of integers");
    } else if (skip && !json_is_null(skip) && !json_is_boolean(skip)) {
        cli_print_error_line("\"skip_special_tokens\" must be true or false");
    } else {
        size_t n = json_array_size(ids);
        int32_t *v = malloc((n ? n : 1) * sizeof *v);
        size_t i = 0;
        for (; v && i < n; i++) {
            const json_t *x = json_array_get(ids, i);
            if (!json_is_integer(x) || json_integer_value(x) < INT32_MIN || json_integer_value(x) > INT32_MAX) break;
            v[i] = (int32_t)json_integer_value(x);
        }
        if (!v) {
            cli_print_error_line("out of memory");
        } else if (i < n) {
            snprintf(msg, sizeof msg, "\"ids\"[%zu] is not an integer token id", i);
            cli_print_error_line(msg);
        } else {
            int s = skip && json_is_boolean(skip) ? json_is_true(skip) : default_skip;
            rc = detokenize_ids(tok, v, n, s, 1);
        }
        free(v);
    }
    json_decref(o);
    return rc;
}

/* "2,17,99" -> ids; -1 on a malformed list. */
static int parse_id_list(const char *s, int32_t **out, size_t *n) {
    size_t cap = 16;
    *n = 0;
    *out = malloc(cap * sizeof **out);
    if (!*out) return -1;
    while (*s) {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (end == s || v < INT32_MIN || v > INT32_MAX) return -1;
        if (*n == cap) {
            cap *= 2;
            int32_t *p = realloc(*out, cap * sizeof *p);
            if (!p) return -1;
            *out = p;
        }
        (*out)[(*n)++] = (int32_t)v;
        s = end;
        while (*s == ' ') s++;
        if (*s == ',') {
            s++;
            if (!*s) return -1;
        } else if (*s) {
            return -1;
        }
    }
    return 0;
}

static int blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return 0;
    return 1;
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
        default:
            if (optopt) return cli_error("detokenize: option -%c needs a value or is unknown (see --help)", optopt);
            return cli_error("detokenize: unknown option '%s' (see --help)", argv[optind - 1]);
        }
    }
    if (optind < argc) return cli_error("detokenize: unexpected argument '%s' (see --help)", argv[optind]);
    if (!model_dir == !tok_file) return cli_error("detokenize: give one of -m DIR or --tokenizer FILE (see --help)");
    if (!file == !id_list) return cli_error("detokenize: give one of -f FILE or --ids LIST (see --help)");
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (id_list && parse_id_list(id_list, &ids, &n_ids)) {
        free(ids);
        return cli_error("detokenize: --ids must be integers separated by commas");
    }

    g4_tokenizer *tok = cli_load_tokenizer(model_dir, tok_file);
    if (!tok) {
        free(ids);
        return 1;
    }
    int status = 0;
    if (id_list) {
        status = detokenize_ids(tok, ids, n_ids, skip, 0);
    } else {
        FILE *in = cli_open_input(file);
        if (!in) {
            g4_tokenizer_free(tok);
            return 1;
        }
        char *line = NULL;
        size_t cap = 0;
        ssize_t n;
        while ((n = getline(&line, &cap, in)) >= 0) {
            if (blank(line, (size_t)n)) continue;
            if (detokenize_line(tok, line, (size_t)n, skip)) status = 1;
        }
        if (ferror(in)) status = cli_error("detokenize: %s: read error", file);
        free(line);
        if (in != stdin) fclose(in);
    }
    free(ids);
    if (fflush(stdout) != 0) status = cli_error("detokenize: cannot write the output");
    g4_tokenizer_free(tok);
    return status;
}
