#include "core/json.h"

#include <math.h>
#include <stdlib.h>

#include "core/error.h"
#include "core/mapped_file.h"

int g4_json_load_file(const char *path, json_t **out, g4_error *err) {
    json_error_t je;
    char *text;
    size_t len;
    *out = NULL;
    if (g4_read_file(path, &text, &len, err)) return -1; /* a regular file only */
    *out = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!*out) return g4_fail(err, "%s:%d: invalid JSON: %s", path, je.line, je.text);
    return 0;
}

int g4_json_int(const json_t *obj, const char *key, int64_t def, int64_t *out, const char *what,
                g4_error *err) {
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return 0;
    }
    if (json_is_real(v)) { /* 16.0 written by some tools */
        double d = json_real_value(v);
        if (d == floor(d) && fabs(d) < 9e15) {
            *out = (int64_t)d;
            return 0;
        }
    }
    return g4_fail(err, "%s: \"%s\" must be an integer", what, key);
}

int g4_json_num(const json_t *obj, const char *key, double def, double *out, const char *what,
                g4_error *err) {
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_number(v)) return g4_fail(err, "%s: \"%s\" must be a number", what, key);
    *out = json_number_value(v);
    return 0;
}

int g4_json_bool(const json_t *obj, const char *key, int def, int *out, const char *what,
                 g4_error *err) {
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v)) return g4_fail(err, "%s: \"%s\" must be true or false", what, key);
    *out = json_is_true(v);
    return 0;
}

int g4_json_str(const json_t *obj, const char *key, const char **out, const char *what,
                g4_error *err) {
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = NULL;
        return 0;
    }
    if (!json_is_string(v)) return g4_fail(err, "%s: \"%s\" must be a string", what, key);
    *out = json_string_value(v);
    return 0;
}

int g4_json_reject_nulls(const json_t *obj, const char *const *keys, const char *what, g4_error *err) {
    for (; *keys; keys++)
        if (json_is_null(json_object_get(obj, *keys)))
            return g4_fail(err, "%s: \"%s\" is null (it needs a value; leave the key out for the default)", what,
                           *keys);
    return 0;
}
