/* A Jinja2 interpreter for chat templates.
 *
 * It implements the subset of Jinja2 that chat templates use, with the semantics of Hugging Face
 * transformers' environment (jinja2 ImmutableSandboxedEnvironment, trim_blocks=True,
 * lstrip_blocks=True, the loopcontrols extension, the `generation` block, a `tojson` filter that
 * writes json.dumps text, and the globals raise_exception() and strftime_now()).  Values are printed
 * the way Python's str() prints them (True, None, 1.0, ['a', 1]).
 *
 * Parse once, render many times; a parsed template is read-only and may be rendered from several
 * threads at once.  Every failure is one line naming the template line ("template line 12: ...").
 */
#ifndef G4_TOKENIZER_JINJA_H
#define G4_TOKENIZER_JINJA_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "gemma4c.h"

typedef struct g4_jinja g4_jinja;

/* Guards against runaway templates; a zero field takes the default. */
typedef struct g4_jinja_limits {
    size_t max_output;   /* bytes of any output or string value (default 64 MiB) */
    uint64_t max_steps;  /* evaluated expressions + executed statements (default 200 million) */
    int max_depth;       /* nested macro calls (default 200) */
} g4_jinja_limits;

int g4_jinja_parse(const char *source, size_t len, g4_jinja **out, g4_error *err);

/* context: a JSON object whose members become the template's variables (JSON null is None).
 * *out is a NUL-terminated heap string (free()); *len its length (len may be NULL). */
int g4_jinja_render(const g4_jinja *tpl, const json_t *context, char **out, size_t *len,
                    g4_error *err);
int g4_jinja_render_ex(const g4_jinja *tpl, const json_t *context, const g4_jinja_limits *limits,
                       char **out, size_t *len, g4_error *err);

void g4_jinja_free(g4_jinja *tpl);

#endif
