#include "cli/cli_common.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/commands.h"

int cli_parse_ids(const char *s, int32_t **ids, int *n, g4_error *err) {
    *ids = NULL;
    *n = 0;
    if (!s || !*s) return g4_fail(err, "--ids: empty list");
    size_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return g4_fail(err, "out of memory");
    const char *p = s;
    int k = 0;
    for (;;) {
        while (*p == ' ') p++;
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX) {
            free(v);
            return g4_fail(err, "--ids: '%.32s' is not a token id (ids are non-negative integers, comma-separated)", p);
        }
        v[k++] = (int32_t)x;
        p = end;
        while (*p == ' ') p++;
        if (!*p) break;
        if (*p != ',') {
            free(v);
            return g4_fail(err, "--ids: unexpected '%c' (ids are comma-separated)", *p);
        }
        p++;
    }
    *ids = v;
    *n = k;
    return 0;
}

int cli_parse_int(const char *s, const char *opt, long min, long max, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < min || v > max) {
        cli_error("%s: '%s' must be an integer in %ld..%ld", opt, s, min, max);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_float(const char *s, const char *opt, double min, double max, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v) || v < min || v > max) {
        cli_error("%s: '%s' must be a number in %g..%g", opt, s, min, max);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_bad_option(const char *cmd, char **argv) {
    const char *opt = optind > 0 ? argv[optind - 1] : "?";
    if (optopt && strncmp(opt, "--", 2) != 0)
        return cli_error("%s: unknown option or missing value: -%c (see 'gemma4c %s --help')", cmd, optopt, cmd);
    return cli_error("%s: unknown option or missing value: %s (see 'gemma4c %s --help')", cmd, opt, cmd);
}

void cli_print_json_line(json_t *v) {
    /* 9 significant digits: a float32 value reads back exactly */
    if (!v || json_dumpf(v, stdout, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(9)) != 0)
        fputs("{\"error\":\"the result cannot be written as JSON\"}", stdout);
    fputc('\n', stdout);
}

void cli_print_error_line(const char *msg) {
    json_t *o = json_pack("{s:s}", "error", msg);
    cli_print_json_line(o);
    json_decref(o);
}

FILE *cli_jsonl_open(const char *cmd, const char *path) {
    if (!path || !strcmp(path, "-")) return stdin;
    FILE *in = fopen(path, "rb");
    struct stat st;
    if (!in) cli_error("%s: %s: %s", cmd, path, strerror(errno));
    else if (fstat(fileno(in), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(in);
        in = NULL;
        cli_error("%s: %s: is a directory, not a JSON lines file", cmd, path);
    }
    return in;
}

ssize_t cli_read_line(FILE *in, char **line, size_t *cap, size_t max) {
    size_t n = 0;
    int c = EOF;
    flockfile(in);
    while ((c = getc_unlocked(in)) != EOF) {
        if (n + 2 > *cap) { /* room for c and the terminating zero */
            if (*cap >= max + 2) {
                ungetc(c, in); /* the line's rest, this byte too, is still to read */
                funlockfile(in);
                return -2;
            }
            size_t want = *cap ? *cap * 2 : 4096;
            if (want > max + 2) want = max + 2;
            char *p = realloc(*line, want);
            if (!p) {
                funlockfile(in);
                return -3;
            }
            *line = p;
            *cap = want;
        }
        (*line)[n++] = (char)c;
        if (c == '\n') break;
    }
    funlockfile(in);
    if (n == 0) return -1;
    (*line)[n] = 0;
    return (ssize_t)n;
}

/* After cli_read_line returned -2 (the `got` bytes in `line` are the start of an overlong line): reads
 * on to the line's end. 1 when it was text (a JSON line too long to take: the next lines are still
 * lines), 0 when it was not (a zero byte: /dev/zero, a binary file; or more than 1 GiB without a
 * newline): then the input ends there. */
static int skip_long_line(FILE *in, const char *line, size_t got) {
    if (memchr(line, 0, got)) return 0;
    size_t n = got;
    int c, text = 1;
    flockfile(in);
    while ((c = getc_unlocked(in)) != EOF && c != '\n') {
        if (c == 0 || ++n > ((size_t)1 << 30)) {
            text = 0;
            break;
        }
    }
    funlockfile(in);
    return text;
}

int cli_jsonl_next(FILE *in, char **line, size_t *cap, json_t **obj, g4_error *err) {
    ssize_t n;
    *obj = NULL;
    while ((n = cli_read_line(in, line, cap, CLI_MAX_LINE)) >= 0 || n < -1) {
        if (n == -2 && skip_long_line(in, *line, *cap - 1)) { /* an error line in its place; the rest goes on */
            memset(err, 0, sizeof *err);
            g4_fail(err, "a line longer than %d MiB", CLI_MAX_LINE >> 20);
            return 1;
        }
        if (n < -1) { /* the rest of the input cannot be read line by line: the end, with an error */
            memset(err, 0, sizeof *err);
            if (n == -2) g4_fail(err, "a line longer than %d MiB (not a JSON lines file?)", CLI_MAX_LINE >> 20);
            else g4_fail(err, "out of memory for a line");
            return -1;
        }
        size_t len = (size_t)n, k = 0;
        while (k < len && ((*line)[k] == ' ' || (*line)[k] == '\t' || (*line)[k] == '\r' || (*line)[k] == '\n')) k++;
        if (k == len) continue; /* blank line */
        json_error_t je;
        json_t *o = json_loadb(*line, len, JSON_ALLOW_NUL, &je);
        memset(err, 0, sizeof *err);
        if (!o)
            g4_fail(err, "invalid JSON: %s (column %d)", je.text, je.column);
        else if (!json_is_object(o))
            g4_fail(err, "a line must be a JSON object");
        if (err->msg[0]) json_decref(o);
        else *obj = o;
        return 1;
    }
    return 0;
}

int cli_jsonl_close(const char *cmd, const char *path, FILE *in, int failed) {
    int rc = 0;
    if (ferror(in)) rc = cli_error("%s: %s: read error", cmd, path ? path : "stdin");
    if (in != stdin) fclose(in);
    if (fflush(stdout) != 0) rc = cli_error("%s: cannot write the output", cmd);
    if (failed) {
        fprintf(stderr, "gemma4c: %s: %d line%s failed (see the error lines)\n", cmd, failed, failed > 1 ? "s" : "");
        rc = 1;
    }
    return rc;
}

int cli_jsonl_map(const char *cmd, const char *path, cli_jsonl_fn fn, void *user) {
    FILE *in = cli_jsonl_open(cmd, path);
    if (!in) return 1;
    char *line = NULL;
    size_t cap = 0;
    int failed = 0;
    json_t *o;
    g4_error err;
    int r, rc;
    while ((r = cli_jsonl_next(in, &line, &cap, &o, &err)) > 0) {
        json_t *out = o ? fn(o, user, &err) : NULL;
        if (out) {
            cli_print_json_line(out);
        } else {
            cli_print_error_line(err.msg[0] ? err.msg : "failed");
            failed++;
        }
        json_decref(out);
        json_decref(o);
    }
    free(line);
    if (r < 0) cli_error("%s: %s: %s", cmd, path && strcmp(path, "-") ? path : "stdin", err.msg);
    rc = cli_jsonl_close(cmd, path, in, failed);
    return rc || r < 0;
}

g4_tokenizer *cli_load_tokenizer(const char *model_dir, const char *file) {
    g4_tokenizer *tok = NULL;
    g4_error err;
    int rc = file ? g4_tokenizer_load(file, &tok, &err) : g4_tokenizer_load_dir(model_dir, &tok, &err);
    if (rc) {
        cli_error("%s", err.msg);
        return NULL;
    }
    return tok;
}

static void show_progress(float f, const char *what, void *user) {
    int *last = user;
    int pct = (int)(f * 100.0f + 0.5f);
    if (pct == *last) return;
    *last = pct;
    fprintf(stderr, "\r%s %3d%%", what, pct);
    if (pct >= 100) fprintf(stderr, "\r\033[K");
    fflush(stderr);
}

g4_model *cli_load_model(const char *dir, int n_threads) {
    if (!dir) {
        cli_error("no model folder: pass -m DIR");
        return NULL;
    }
    int last = -1;
    g4_load_params lp = {.n_threads = n_threads, .device = cli_device, .bf16_activations = cli_bf16_act,
                         .mmproj = cli_mmproj};
    if (isatty(STDERR_FILENO)) {
        lp.progress = show_progress;
        lp.progress_user = &last;
    }
    g4_model *m;
    g4_error err;
    if (g4_model_load(dir, &lp, &m, &err)) {
        if (last >= 0) fprintf(stderr, "\r\033[K");
        cli_error("%s", err.msg);
        return NULL;
    }
    const char *w = g4_model_warnings(m);
    while (w && *w) {
        const char *nl = strchr(w, '\n');
        int len = nl ? (int)(nl - w) : (int)strlen(w);
        fprintf(stderr, "gemma4c: warning: %.*s\n", len, w);
        w += len + (nl ? 1 : 0);
    }
    return m;
}

void cli_remove_output(const char *path) {
    struct stat st;
    if (path && strcmp(path, "-") && !stat(path, &st) && S_ISREG(st.st_mode)) remove(path);
}

FILE *cli_open_output(const char *path) { return strcmp(path, "-") ? fopen(path, "wb") : stdout; }

int cli_close_output(FILE *f) {
    if (f != stdout) return fclose(f);
    return fflush(f) | ferror(f);
}
