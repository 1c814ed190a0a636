#include "cli/cli_tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"

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

FILE *cli_open_input(const char *path) {
    if (!strcmp(path, "-")) return stdin;
    FILE *f = fopen(path, "rb");
    if (!f) cli_error("%s: %s", path, strerror(errno));
    return f;
}

void cli_print_error_line(const char *msg) {
    json_t *o = json_object();
    json_object_set_new(o, "error", json_string(msg));
    char *s = json_dumps(o, JSON_COMPACT);
    if (s) {
        fputs(s, stdout);
        fputc('\n', stdout);
        free(s);
    } else {
        fputs("{\"error\":\"(unprintable error)\"}\n", stdout);
    }
    json_decref(o);
}
