#include "cli/cli_batch.h"

#include <stdlib.h>
#include <string.h>

#include "cli/cli_common.h"
#include "cli/commands.h"

typedef struct pending {
    g4_generation *g;     /* NULL when the line failed before it could be submitted */
    g4_grammar *grammar;  /* the line's own grammar (NULL: none), freed after g */
    char err[512];
} pending;

int cli_batch_run(const char *cmd, const char *path, g4_scheduler *s, int window, cli_batch_submit_fn submit,
                  cli_batch_result_fn result, void *user) {
    FILE *in = cli_jsonl_open(cmd, path);
    if (!in) return 1;
    pending *q = calloc((size_t)window, sizeof *q); /* ring of the lines in flight, in input order */
    char *line = NULL;
    size_t cap = 0;
    int head = 0, count = 0, failed = 0, eof = 0, broken = 0, unreadable = 0;
    long index = 0;
    if (!q) eof = broken = cli_error("%s: out of memory", cmd);
    while (!broken && (!eof || count > 0)) {
        while (!eof && count < window) {
            json_t *o;
            g4_error err;
            int r = cli_jsonl_next(in, &line, &cap, &o, &err);
            if (r <= 0) { /* the lines in flight still finish and print */
                if (r < 0) unreadable = cli_error("%s: %s: %s", cmd, path && strcmp(path, "-") ? path : "stdin", err.msg);
                eof = 1;
                break;
            }
            pending *p = &q[(head + count++) % window];
            memset(p, 0, sizeof *p);
            if (o && submit(o, index, s, user, &p->g, &p->grammar, &err)) p->g = NULL;
            if (!p->g) snprintf(p->err, sizeof p->err, "%s", err.msg[0] ? err.msg : "failed");
            json_decref(o);
            index++;
        }
        /* print what has finished, in order */
        while (count > 0 && (!q[head].g || g4_generation_finish(q[head].g) != G4_FINISH_NONE)) {
            pending *p = &q[head];
            g4_error err = {{0}};
            json_t *out = NULL;
            if (p->g && g4_generation_error(p->g)) g4_fail(&err, "%s", g4_generation_error(p->g));
            else if (p->g) out = result(p->g, user, &err);
            else g4_fail(&err, "%s", p->err);
            if (out) cli_print_json_line(out);
            else cli_print_error_line(err.msg[0] ? err.msg : "failed"), failed++;
            json_decref(out);
            g4_generation_free(p->g);
            g4_grammar_free(p->grammar);
            head = (head + 1) % window;
            count--;
        }
        fflush(stdout);
        if (count > 0) {
            g4_error err;
            if (g4_scheduler_step(s, &err) < 0) broken = cli_error("%s: %s", cmd, err.msg);
        }
    }
    for (; count > 0; count--, head = (head + 1) % window) g4_generation_free(q[head].g), g4_grammar_free(q[head].grammar);
    free(q);
    free(line);
    return cli_jsonl_close(cmd, path, in, failed) || broken || unreadable;
}

int32_t *cli_batch_line_ids(const json_t *line, const char *text_key, int add_bos, const g4_model *model, int *n,
                            g4_error *err) {
    const json_t *text = json_object_get(line, text_key), *ids = json_object_get(line, "ids");
    *n = 0;
    if (!text == !ids) return g4_fail(err, "a line needs one of \"%s\" and \"ids\"", text_key), NULL;
    if (ids) {
        size_t k = json_array_size(ids);
        if (!json_is_array(ids) || k == 0) return g4_fail(err, "\"ids\" must be a non-empty array of integers"), NULL;
        int32_t *out = malloc(k * sizeof *out);
        if (!out) return g4_fail(err, "out of memory"), NULL;
        for (size_t i = 0; i < k; i++) {
            const json_t *v = json_array_get(ids, i);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
                free(out);
                return g4_fail(err, "\"ids\"[%zu] must be a token id (an integer >= 0)", i), NULL;
            }
            out[i] = (int32_t)json_integer_value(v);
        }
        *n = (int)k;
        return out;
    }
    if (!json_is_string(text)) return g4_fail(err, "\"%s\" must be a string", text_key), NULL;
    const g4_tokenizer *tok = g4_model_tokenizer(model);
    if (!tok) return g4_fail(err, "\"%s\" needs the model's tokenizer.json (give \"ids\")", text_key), NULL;
    g4_tokens t = {0};
    if (g4_tokenize(tok, json_string_value(text), json_string_length(text), add_bos, &t, err)) {
        free(t.ids);
        return NULL;
    }
    if (t.n == 0) {
        free(t.ids);
        return g4_fail(err, "\"%s\" is empty", text_key), NULL;
    }
    *n = (int)t.n;
    return t.ids;
}
