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
 *
 * Supported: text with jinja2's whitespace rules ({%- -%} {{- -}} {#- -#}, {%+ +%}, trim_blocks,
 * lstrip_blocks, \r\n normalisation, the dropped final newline), comments, {% raw %};
 * statements if/elif/else, for (tuple targets, `if` filter, else, loop.index/index0/revindex/
 * revindex0/first/last/length/previtem/nextitem/depth/cycle(), break/continue), set (names,
 * tuples, ns.attr, block set with filters), macro (positional/keyword arguments, defaults that
 * may use earlier parameters, varargs/kwargs, recursion), with, filter blocks, generation;
 * expressions with jinja2's precedence: literals (str with Python escapes, int incl. 0x/0o/0b/_,
 * float, list, tuple, dict, true/false/none), + - * / // % ** ~, comparisons (chained), in /
 * not in, and/or/not, `a if c else b`, attribute and item access, slices, calls, filters, tests;
 * Python semantics for truthiness, equality (1 == 1.0 == True), ordering, str() and repr() of
 * values, int overflow (an error), dict insertion order; jinja2's Undefined (prints as '',
 * iterates as empty, errors on arithmetic, attribute access and calls).
 * Python's printf-style `str % values` (s r a d i u x X o e E f F g G c, flags, width, precision,
 * %(name)s).  Lazy filter results (map, select, reject, selectattr, rejectattr, unique, items,
 * reverse, batch, slice) behave as jinja2's generators: always true, no length, no indexing.
 * Filters: abs attr batch capitalize center count d default dictsort e escape first float format
 * indent int items join last length list lower map max min reject rejectattr replace reverse
 * round safe select selectattr slice sort string sum title tojson trim truncate unique upper
 * wordcount.
 * Tests: defined undefined none boolean true false integer float number string mapping sequence
 * iterable callable sameas escaped in odd even divisibleby eq/ne/lt/le/gt/ge (and their aliases)
 * lower upper filter test.  Globals: range (max 100000 items, as the sandbox), namespace, dict,
 * raise_exception, strftime_now.  Methods: str.upper/lower/strip/lstrip/rstrip/split/rsplit/
 * splitlines/startswith/endswith/replace/find/rfind/count/join/title/capitalize/isdigit/isalpha/
 * isalnum/isspace/isupper/islower/removeprefix/removesuffix, dict.get/items/keys/values,
 * list.index/count; mutating methods (append, update, ...) are refused like the immutable sandbox.
 *
 * Not supported (an error naming the line): {% call %}/caller, include/import/extends/block,
 * recursive loops, loop.changed, star-arguments (*args, **kwargs) at call sites, str.format,
 * '*' widths in % formats, autoescaping, line statements, integers beyond 64 bits, filters and
 * tests not listed above.  Known differences from jinja2: an unknown filter or test fails when it
 * is reached, not when parsing; lazy filters run at once, so an error inside one shows even when
 * jinja2 would never consume the generator; a slice of a non-sequence is an error even in a
 * constant expression; safe and escape give plain strings (jinja2: Markup, which escapes the
 * other side of + and the arguments of %); dict.items()/keys()/values() and range() print as
 * lists (jinja2: dict_items, range objects); upper/lower use the C library's simple case mapping plus Python's
 * multi-character forms (ß -> SS, ligatures, U+0130 -> i U+0307, ...), its title case (str.title,
 * capitalize: ǆ -> ǅ, ß -> Ss) and lower()'s final sigma (Cased and Case_Ignorable approximated:
 * jinja_internal.h);
 * repr() escapes an approximation of Python's non-printable set; a macro or a loop body that
 * reads a top-level variable shadowing a render variable before the top level assigns it sees the
 * render variable (jinja2: undefined), and so does a block set's body that reads its own target or a name the
 * frame assigns later ({% set s %}{{ s }}{% endset %}: jinja2 decides from the order of a frame's
 * first uses of a name); a macro defined inside a loop no longer sees the loop variables after the
 * loop ends.
 */
#ifndef G4_TOKENIZER_JINJA_H
#define G4_TOKENIZER_JINJA_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "gemma4c.h"

typedef struct g4_jinja g4_jinja;

/* Guards against runaway and hostile templates; a zero field takes the default.  Besides these,
 * evaluation nests at most 1000 levels (expressions, statements, filters: the C stack, of which
 * a render needs up to 1 MiB in an optimized build, several in a sanitizer build) and values at
 * most 1000 levels (lists in lists ...).  Going past any limit is a one-line error. */
typedef struct g4_jinja_limits {
    size_t max_output;   /* bytes of any output or string value (default 64 MiB) */
    uint64_t max_steps;  /* evaluated expressions, statements and loop iterations, and the work
                            inside filters and methods: an item compared, copied or visited, 16
                            bytes scanned (default 1e9, ~15 s) */
    int max_depth;       /* nested macro calls (default 200) */
    size_t max_memory;   /* bytes of all live values and buffers of one render, the context
                            included (default 256 MiB) */
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
