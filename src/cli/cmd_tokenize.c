/* gemma4c tokenize: text to ids. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_tokenizer.h"
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

static void print_ids(const g4_tokens *t, int json) {
    if (json) fputc('[', stdout);
    for (size_t i = 0; i < t->n; i++) printf(i ? ",%d" : "%d", t->ids[i]);
    fputs(json ? "]\n" : "\n", stdout);
}

/* One JSON line; 0 ok, 1 error line written. */
static int tokenize_line(const g4_tokenizer *tok, const char *line, size_t len, int default_specials) {
    json_error_t je;
    json_t *o = json_loadb(line, len, JSON_ALLOW_NUL, &je);
    char msg[600];
    if (!o) {
        snprintf(msg, sizeof msg, "invalid JSON: %s", je.text);
        cli_print_error_line(msg);
        return 1;
    }
    int rc = 1;
    const json_t *text = json_object_get(o, "text");
    const json_t *specials = json_object_get(o, "add_special_tokens");
    if (!json_is_object(o)) {
        cli_print_error_line("expected an object {\"text\": ...}");
    } else if (!json_is_string(text)) {
        cli_print_error_line("\"text\" must be a string");
    } else if (specials && !json_is_null(specials) && !json_is_boolean(specials)) {
        cli_print_error_line("\"add_special_tokens\" must be true or false");
    } else {
        int add = specials && json_is_boolean(specials) ? json_is_true(specials) : default_specials;
        g4_tokens t = {0};
        g4_error err;
        if (g4_tokenize(tok, json_string_value(text), json_string_length(text), add, &t, &err)) {
            cli_print_error_line(err.msg);
        } else {
            print_ids(&t, 1);
            rc = 0;
        }
        free(t.ids);
    }
    json_decref(o);
    return rc;
}

static int blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return 0;
    return 1;
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
        default:
            if (optopt) return cli_error("tokenize: option -%c needs a value or is unknown (see --help)", optopt);
            return cli_error("tokenize: unknown option '%s' (see --help)", argv[optind - 1]);
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
            print_ids(&t, 0);
        free(t.ids);
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
            if (tokenize_line(tok, line, (size_t)n, !no_bos)) status = 1;
        }
        if (ferror(in)) status = cli_error("tokenize: %s: read error", file);
        free(line);
        if (in != stdin) fclose(in);
    }
    if (fflush(stdout) != 0) status = cli_error("tokenize: cannot write the output");
    g4_tokenizer_free(tok);
    return status;
}
