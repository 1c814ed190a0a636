/* Dev-only helper for tests/data/jinja_diff.py (the differential fuzzer against jinja2): reads
 * JSON lines {"template": "...", "context": {...}} from stdin and writes for each one line
 * {"output": "..."} or {"error": "..."} to stdout, flushed, so one process renders many
 * templates.  Built by CMake as jinja-render (build/tests/jinja-render); not installed, not part
 * of the gemma4c CLI.  Renders under small limits so a runaway template stops quickly. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/jinja.h"

int main(void) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, stdin)) > 0) {
        json_error_t je;
        json_t *in = json_loadb(line, (size_t)n, 0, &je), *res = json_object();
        const json_t *tj = in ? json_object_get(in, "template") : NULL;
        if (!json_is_string(tj)) {
            json_object_set_new(res, "error", json_string("bad input line"));
        } else {
            g4_jinja *t = NULL;
            g4_error err = {{0}};
            char *out = NULL;
            size_t len = 0;
            g4_jinja_limits lim = {.max_output = 1 << 20, .max_steps = 5000000, .max_memory = 256 << 20};
            int rc = g4_jinja_parse(json_string_value(tj), json_string_length(tj), &t, &err);
            if (rc == 0) rc = g4_jinja_render_ex(t, json_object_get(in, "context"), &lim, &out, &len, &err);
            if (rc == 0) {
                json_t *s = json_stringn(out, len);
                json_object_set_new(res, "output", s ? s : json_string("<invalid utf-8 output>"));
            } else {
                json_object_set_new(res, "error", json_string(err.msg));
            }
            free(out);
            g4_jinja_free(t);
        }
        char *text = json_dumps(res, JSON_COMPACT | JSON_ENSURE_ASCII);
        fputs(text ? text : "{\"error\": \"dump failed\"}", stdout);
        fputc('\n', stdout);
        fflush(stdout);
        free(text);
        json_decref(res);
        json_decref(in);
    }
    free(line);
    return 0;
}
