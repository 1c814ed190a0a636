/* Internals of the Jinja2 interpreter (jinja.h): values, syntax tree, lexer, parser, evaluator.
 *
 *   jinja_value.c    values (Python-like: None, bool, int, float, str, list/tuple, dict, ...),
 *                    str()/repr(), equality, ordering, JSON in and out
 *   jinja_lexer.c    template text -> tokens (Jinja2's whitespace rules)
 *   jinja_parser.c   tokens -> syntax tree
 *   jinja_eval.c     renders a syntax tree
 *   jinja_builtins.c filters, tests, global functions, methods of str/dict/list/loop
 */
#ifndef G4_TOKENIZER_JINJA_INTERNAL_H
#define G4_TOKENIZER_JINJA_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "jinja/jinja.h"

/* ----------------------------------------------------------------- budget */

/* What one render may use, and why it must stop.  The render running on this thread installs its
 * budget in jv_budget; values and string buffers charge their memory to it, and comparisons,
 * copies and scans charge their work as steps (one per item, one per 16 bytes).  A charge over a
 * limit (or a value nested too deeply) records a fault and fails; the render then stops with the
 * fault's message.  Outside a render (the parser's constants) nothing is charged. */
enum { JF_NONE, JF_STEPS, JF_MEMORY, JF_DEPTH, JF_NEST };

#define JV_MAX_DEPTH 1000 /* containers (list, tuple, dict) inside containers */

typedef struct jbudget {
    size_t mem, max_mem;
    uint64_t steps, max_steps;
    int fault; /* JF_*: sticky */
} jbudget;

extern _Thread_local jbudget *jv_budget;

int jv_charge(size_t bytes); /* 0, or -1 with JF_MEMORY */
void jv_refund(size_t bytes);
int jv_work(uint64_t steps); /* 0, or -1 with JF_STEPS (or an earlier fault) */
int jv_fault(int fault);     /* records a fault (the first one stays); returns -1 */
static inline int jv_faulted(void) { return jv_budget && jv_budget->fault; }

/* ------------------------------------------------------------------ arena */

typedef struct jarena_block jarena_block;
typedef struct jarena {
    jarena_block *head;
} jarena;

void *jarena_alloc(jarena *a, size_t size); /* zeroed; NULL when out of memory */
char *jarena_strndup(jarena *a, const char *s, size_t len);
void jarena_free(jarena *a);

/* ------------------------------------------------------------ byte buffer */

typedef struct jbuf {
    char *p;
    size_t len, cap;
    size_t limit; /* 0: none */
    int failed;   /* out of memory or over the limit; further appends do nothing */
} jbuf;

void jbuf_put(jbuf *b, const char *s, size_t n);
void jbuf_puts(jbuf *b, const char *s);
void jbuf_putc(jbuf *b, char c);
void jbuf_printf(jbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void jbuf_free(jbuf *b);
char *jbuf_take(jbuf *b, size_t *len); /* NUL-terminated; the buffer is reset */

/* ----------------------------------------------------------------- UTF-8 */

/* Decodes one code point at s[0..n); returns its byte length (invalid bytes count as one code
 * point U+FFFD-like of length 1). */
size_t ju8_next(const char *s, size_t n, uint32_t *cp);
size_t ju8_count(const char *s, size_t n);
/* Byte offset of the code point with index `idx` (idx <= count). */
size_t ju8_offset(const char *s, size_t n, size_t idx);
void ju8_put(jbuf *b, uint32_t cp);
int ju_isspace(uint32_t cp); /* Python's str.isspace() */
/* Length of the whitespace run at the start / end of s (Python's str.strip()). */
size_t ju8_lspace(const char *s, size_t n);
size_t ju8_rspace(const char *s, size_t n);
uint32_t ju_upper(uint32_t cp);
uint32_t ju_lower(uint32_t cp);
/* Unicode's Cased (a letter with case) and Case_Ignorable, as Python's str.lower() reads them for its final sigma
 * (approximated from the C library's classes and the ignorable ranges that occur in text). */
int ju_cased(uint32_t cp);
/* Python's view of one character for str.islower()/isupper(): 1 lower case (Unicode's Lowercase,
 * so also 'ﬁ', 'ª'), 2 upper case, 3 title case (neither), 0 uncased */
int ju_case_kind(uint32_t cp);
int ju_case_ignorable(uint32_t cp);
int ju_isalpha(uint32_t cp);
int ju_isdigit(uint32_t cp);

/* ----------------------------------------------------------------- values */

typedef enum {
    JV_UNDEFINED,
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STRING,
    JV_LIST, /* also tuples (u.list.tuple) */
    JV_DICT,
    JV_NAMESPACE, /* attributes in u.dict */
    JV_MACRO,
    JV_FUNC, /* a global function or a bound method */
    JV_LOOP,
} jv_kind;

typedef struct jv jv;
typedef struct jscope jscope;
typedef struct jstmt jstmt;
typedef struct jexpr jexpr;

struct jv {
    jv_kind kind;
    int refs;  /* < 0: immortal (static singletons, template constants) */
    int depth; /* containers: 1 + the deepest item (bound methods and loops count their
                  receiver / items); a namespace counts as a scalar inside others (it is freed
                  by the render, compared by identity, printed to a bounded depth) */
    union {
        int b;
        int64_t i;
        double f;
        struct {
            char *s; /* NUL-terminated */
            size_t len;
        } str;
        struct {
            jv **items;
            size_t n, cap;
            int tuple;
            int gen; /* a lazy result in jinja2 (map, select, unique, reverse, ...): always
                        true, no len(), no indexing, prints as a generator */
        } list;
        struct {
            jv **keys;
            jv **vals;
            size_t n, cap;
        } dict;
        struct {
            const jstmt *def;
            jscope *closure;
        } macro;
        struct {
            int id;
            jv *self; /* bound methods: the receiver; NULL for globals */
        } func;
        struct {
            size_t index0, length;
            jv *items; /* the list being iterated */
        } loop;
        struct {
            char *hint; /* "'x' is undefined" etc.; NULL: none */
        } undef;
    } u;
};

jv *jv_new(jv_kind kind); /* refs 1, zeroed payload */
jv *jv_undefined(void);
jv *jv_undefined_hint(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
jv *jv_none(void);
jv *jv_bool(int b);
jv *jv_int(int64_t i);
jv *jv_float(double f);
jv *jv_str(const char *s, size_t len);
jv *jv_cstr(const char *s);
jv *jv_str_take(char *s, size_t len); /* takes a malloc'd NUL-terminated buffer */
jv *jv_list(size_t cap);
int jv_list_push(jv *list, jv *item); /* steals item (also on failure); 0 / -1 (memory, depth) */
int jv_list_extend(jv *list, const jv *src); /* appends src's items (new references); 0 / -1 */
jv *jv_dict(void);
jv *jv_namespace(void);
int jv_dict_set(jv *dict, jv *key, jv *val); /* steals both; replaces an equal key in place */
jv *jv_dict_get(const jv *dict, const jv *key); /* borrowed; NULL when absent */
jv *jv_dict_get_str(const jv *dict, const char *key, size_t len);
jv *jv_func(int id, jv *self); /* steals self */
jv *jv_loop(jv *items, size_t index0); /* takes a new reference to items */

jv *jv_incref(jv *v);
void jv_decref(jv *v);
void jv_make_immortal(jv *v);  /* for template constants: no counting (thread-safe sharing) */
void jv_free_immortal(jv *v);

int jv_truthy(const jv *v);
int jv_is_number(const jv *v); /* bool, int, float */
double jv_num(const jv *v);
int jv_eq(const jv *a, const jv *b);
/* Python ordering: *res = -1/0/1; returns -1 when the types cannot be ordered. */
int jv_cmp(const jv *a, const jv *b, int *res);
const char *jv_type_name(const jv *v);

void jv_write_str(const jv *v, jbuf *b);  /* Python str() */
void jv_write_repr(const jv *v, jbuf *b); /* Python repr() */
/* json.dumps(v, ensure_ascii=ascii, indent=indent (the text of one level, NULL: None), separators,
 * sort_keys); returns -1 (with a message in err) for values JSON cannot hold. */
int jv_write_json(const jv *v, jbuf *b, const char *indent, const char *item_sep, const char *key_sep,
                  int sort_keys, int ascii, char *err, size_t errcap);
void jv_write_float(double f, jbuf *b); /* Python repr(float) */

jv *jv_from_json(const json_t *j, int depth);

/* ------------------------------------------------------------ syntax tree */

typedef enum {
    E_CONST,
    E_NAME,
    E_LIST,
    E_TUPLE,
    E_DICT,
    E_GETATTR,
    E_GETITEM,
    E_SLICE,
    E_CALL,
    E_FILTER,
    E_TEST,
    E_NOT,
    E_NEG,
    E_POS,
    E_BIN,
    E_AND,
    E_OR,
    E_COMPARE,
    E_COND,
    E_CONCAT,
    E_INPUT, /* the body of a filter block / set block */
} jexpr_kind;

typedef enum {
    OP_ADD,
    OP_SUB,
    OP_MUL,
    OP_DIV,
    OP_FLOORDIV,
    OP_MOD,
    OP_POW,
    OP_EQ,
    OP_NE,
    OP_LT,
    OP_LE,
    OP_GT,
    OP_GE,
    OP_IN,
    OP_NOTIN,
} jop;

typedef struct jargs {
    jexpr **pos;
    size_t npos;
    const char **kwnames;
    jexpr **kwvals;
    size_t nkw;
} jargs;

struct jexpr {
    jexpr_kind kind;
    int line;
    int op;           /* E_BIN */
    int negated;      /* E_TEST */
    const char *name; /* E_NAME; E_GETATTR attribute; E_FILTER / E_TEST name */
    jv *value;        /* E_CONST */
    jexpr *a, *b, *c; /* E_GETATTR/E_GETITEM/E_SLICE/E_CALL/E_FILTER/E_TEST: a = operand;
                         E_GETITEM: b = index; E_BIN/E_AND/E_OR: a, b; E_NOT/E_NEG/E_POS: a;
                         E_COND: a = value, b = condition, c = else (may be NULL);
                         E_SLICE: b, c = start, stop (may be NULL), items[0] = step */
    jexpr **items;    /* E_LIST/E_TUPLE; E_DICT (2n: key, value); E_CONCAT; E_COMPARE operands */
    size_t n;
    int *ops; /* E_COMPARE: n - 1 operators */
    jargs args;
};

typedef enum {
    S_TEXT,
    S_OUTPUT,
    S_IF,
    S_FOR,
    S_SET,
    S_SET_BLOCK,
    S_MACRO,
    S_BREAK,
    S_CONTINUE,
    S_FILTER_BLOCK,
    S_WITH,
    S_BLOCK, /* a body rendered in place (HF's {% generation %}) */
} jstmt_kind;

typedef struct jbody {
    jstmt **items;
    size_t n;
} jbody;

typedef enum { TG_NAME, TG_ATTR, TG_TUPLE } jtarget_kind;

typedef struct jtarget {
    jtarget_kind kind;
    int line;
    const char *name; /* TG_NAME; TG_ATTR: the namespace variable */
    const char *attr; /* TG_ATTR */
    struct jtarget *items;
    size_t n;
} jtarget;

struct jstmt {
    jstmt_kind kind;
    int line;
    const char *text; /* S_TEXT */
    size_t text_len;
    jexpr *expr;   /* S_OUTPUT; S_IF condition; S_FOR iterable; S_SET value */
    jexpr *cond;   /* S_FOR: the `if` filter (may be NULL) */
    jexpr *filter; /* S_SET_BLOCK (may be NULL) / S_FILTER_BLOCK: a filter chain over E_INPUT */
    jbody body, else_body;
    jtarget target; /* S_FOR, S_SET, S_SET_BLOCK */
    /* S_MACRO */
    const char *name;
    const char **params;
    jexpr **defaults; /* NULL entries: no default */
    size_t nparams;
    int uses_varargs, uses_kwargs;
    /* S_WITH */
    jtarget *targets;
    jexpr **values;
    size_t nvalues;
};

struct g4_jinja {
    jarena arena;
    jbody root;
    jv **consts; /* immortal constants to free */
    size_t nconsts, capconsts;
};

/* ----------------------------------------------------------------- lexer */

typedef enum {
    T_DATA,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STRING,
    T_INT,
    T_FLOAT,
    T_OP,
    T_EOF,
} jtok_kind;

typedef struct jtok {
    jtok_kind kind;
    int line;
    const char *s; /* T_DATA text, T_NAME, T_STRING value, T_OP text (arena) */
    size_t len;
    int64_t i;
    double f;
} jtok;

typedef struct jtokens {
    jtok *items;
    size_t n, cap;
} jtokens;

int jinja_lex(const char *src, size_t len, jarena *arena, jtokens *out, g4_error *err);

/* ---------------------------------------------------------------- parser */

int jinja_parse_tokens(g4_jinja *tpl, const jtokens *toks, g4_error *err);

/* ------------------------------------------------------------- evaluator */

struct jscope {
    int refs;
    jscope *parent;
    const char **names; /* borrowed: template, context or static strings */
    jv **vals;
    size_t n, cap;
    int sorted; /* names in strcmp order, never assigned to (the render variables) */
};

typedef struct jrender {
    const g4_jinja *tpl;
    g4_error *err;
    g4_jinja_limits lim;
    jbudget budget;
    int depth; /* macro calls */
    int nest;  /* evaluations in progress (expressions, statements, filters): the C stack */
    int line;  /* of the latest step */
    jscope *context; /* the render variables */
    jv *input;       /* E_INPUT value while a filter block applies its filters */
    jv **namespaces; /* weak: cleared at the end of the render to break reference cycles */
    size_t nns, capns;
} jrender;

/* Reports a runtime error "template line N: ..." and returns NULL / -1. */
jv *jr_fail(jrender *r, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int jr_failc(jrender *r, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
jv *jr_undefined_error(jrender *r, int line, const jv *undef);
jv *jr_oom(jrender *r, int line);
/* Work of n steps inside a builtin: 0, or -1 with the error set. */
int jr_work(jrender *r, int line, uint64_t n);
/* Bytes scanned or copied, as steps. */
static inline uint64_t jr_bytes_work(size_t bytes) { return bytes / 16; }
/* One more evaluation level (0, or -1 with the error set); jr_leave ends it. */
int jr_enter(jrender *r, int line);
static inline void jr_leave(jrender *r) { r->nest--; }
int jr_register_namespace(jrender *r, jv *ns);

jv *jr_eval(jrender *r, jscope *scope, const jexpr *e);
jv *jr_call(jrender *r, int line, jv *callee, jv **pos, size_t npos, const char **kwnames,
            jv **kwvals, size_t nkw);
jv *jr_getattr(jrender *r, int line, jv *obj, const char *name, size_t len);
jv *jr_getitem(jrender *r, int line, jv *obj, jv *key);
/* A list of the items of an iterable (list: a new reference to it; dict: keys; str: characters;
 * undefined: empty); NULL with an error for other values. */
jv *jr_iterate(jrender *r, int line, jv *v);
jv *jr_to_string(jrender *r, int line, const jv *v); /* str(v) as a string value */

/* ----------------------------------------------------------------- builtins */

enum {
    /* globals */
    F_RANGE = 1,
    F_NAMESPACE,
    F_DICT,
    F_RAISE_EXCEPTION,
    F_STRFTIME_NOW,
    /* bound methods */
    F_METHODS_BEGIN,
};

int jb_global_id(const char *name);                  /* 0: none */
int jb_method_id(const jv *self, const char *name, size_t len); /* 0: none */
const char *jb_func_name(int id);
jv *jb_call_func(jrender *r, int line, int id, jv *self, jv **pos, size_t npos,
                 const char **kwnames, jv **kwvals, size_t nkw);
jv *jb_filter(jrender *r, int line, const char *name, jv *value, jv **pos, size_t npos,
              const char **kwnames, jv **kwvals, size_t nkw);
int jb_has_filter(const char *name);
/* 1 / 0, or -1 with an error. */
int jb_test(jrender *r, int line, const char *name, jv *value, jv **pos, size_t npos,
            const char **kwnames, jv **kwvals, size_t nkw);
int jb_has_test(const char *name);
/* Python's `fmt % args` (mapping: a dict for %(name)s; lenient: the right operand was a single
 * mapping-like value, so unused arguments are no error). */
jv *jb_percent_format(jrender *r, int line, const char *fmt, size_t len, jv **args, size_t nargs,
                      const jv *mapping, int lenient);

#endif
