/* Small helpers over jansson for reading configuration files with clear errors. */
#ifndef G4_CORE_JSON_H
#define G4_CORE_JSON_H

#include <jansson.h>
#include <stdint.h>

#include "gemma4c.h"

/* Parses a JSON file; duplicate keys are an error. */
int g4_json_load_file(const char *path, json_t **out, g4_error *err);

/* Optional fields: absent or null gives the default; a present value of the
 * wrong type is an error naming `what` and the key. */
int g4_json_int(const json_t *obj, const char *key, int64_t def, int64_t *out, const char *what,
                g4_error *err);
int g4_json_num(const json_t *obj, const char *key, double def, double *out, const char *what,
                g4_error *err);
int g4_json_bool(const json_t *obj, const char *key, int def, int *out, const char *what,
                 g4_error *err);
/* *out points into obj (NULL when absent or null). */
int g4_json_str(const json_t *obj, const char *key, const char **out, const char *what,
                g4_error *err);

/* Keys (a NULL-terminated list) whose JSON null is an error: the fields a transformers config class types
 * without `| None` (its @strict dataclass refuses None for them), where taking the default would run a
 * different model than the one transformers refuses. */
int g4_json_reject_nulls(const json_t *obj, const char *const *keys, const char *what, g4_error *err);

/* A value is "absent" when missing or JSON null. */
static inline int g4_json_present(const json_t *obj, const char *key) {
    const json_t *v = json_object_get(obj, key);
    return v && !json_is_null(v);
}

#endif
