/* Errors are values: a function that can fail returns 0 or -1 and fills a g4_error. */
#ifndef G4_CORE_ERROR_H
#define G4_CORE_ERROR_H

#include "gemma4c.h"

/* g4_fail (format a one-line message into err, return -1) is public: gemma4c.h. */

/* Prefixes an existing message: "context: old message". Returns -1. */
int g4_fail_prefix(g4_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Warnings are lines ending in '\n' in one malloc'ed string (NULL: none). g4_warn appends one formatted line
 * (a newline inside it becomes a space), g4_warn_lines appends lines as they are; out of memory drops them. */
void g4_warn(char **lines, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void g4_warn_lines(char **lines, const char *more);

/* A public entry point's check of a pointer argument: NULL is an error naming the call and the argument
 * ("g4_decode: batch is NULL"). */
#define G4_ARG(p, err)                                                                                         \
    do {                                                                                                       \
        if (!(p)) return g4_fail((err), "%s: %s is NULL", __func__, #p);                                      \
    } while (0)

/* Overflow-checked size arithmetic: return 0 on overflow. */
static inline int g4_mul_ok(size_t a, size_t b, size_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline int g4_add_ok(size_t a, size_t b, size_t *out) {
    return !__builtin_add_overflow(a, b, out);
}

#endif
