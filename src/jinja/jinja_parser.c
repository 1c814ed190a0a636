/* Tokens -> syntax tree, with jinja2's grammar and operator precedence:
 *   expr     := or ['if' or ['else' expr]]
 *   or       := and ('or' and)*          and := not ('and' not)*     not := 'not' not | compare
 *   compare  := math1 (('=='|'!='|'<'|'<='|'>'|'>='|'in'|'not in') math1)*
 *   math1    := concat (('+'|'-') concat)*   concat := math2 ('~' math2)*
 *   math2    := pow (('*'|'/'|'//'|'%') pow)*  pow := unary ('**' unary)*
 *   unary    := ('-'|'+') unary | primary postfix* ; then ('|' filter | 'is' test | call)*
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "jinja/jinja_internal.h"

#define MAX_NESTING 600 /* ~200 nested brackets; also blocks */

typedef struct {
    g4_jinja *tpl;
    const jtok *t;
    size_t n, i;
    g4_error *err;
    int depth;
    int loop_depth;
    jstmt *macro; /* the macro being parsed (varargs / kwargs use) */
} parser;

/* ------------------------------------------------------------- helpers */

static int pfail(parser *P, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int pfail(parser *P, int line, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return g4_fail(P->err, "template line %d: %s", line, msg);
}

static const jtok *cur(const parser *P) { return &P->t[P->i]; }
static const jtok *peek(const parser *P, size_t k) {
    size_t j = P->i + k;
    return &P->t[j < P->n ? j : P->n - 1];
}
static void advance(parser *P) {
    if (P->i + 1 < P->n) P->i++;
}

static int tok_is_op(const jtok *t, const char *op) {
    return t->kind == T_OP && strcmp(t->s, op) == 0;
}
static int tok_is_name(const jtok *t, const char *name) {
    return t->kind == T_NAME && strcmp(t->s, name) == 0;
}
static int is_op(const parser *P, const char *op) { return tok_is_op(cur(P), op); }
static int is_name(const parser *P, const char *name) { return tok_is_name(cur(P), name); }

static void describe(const jtok *t, char *buf, size_t cap) {
    switch (t->kind) {
    case T_NAME:
        snprintf(buf, cap, "'%.60s'", t->s);
        break;
    case T_OP:
        snprintf(buf, cap, "'%s'", t->s);
        break;
    case T_STRING:
        snprintf(buf, cap, "string literal");
        break;
    case T_INT:
        snprintf(buf, cap, "integer");
        break;
    case T_FLOAT:
        snprintf(buf, cap, "float");
        break;
    case T_VAR_END:
        snprintf(buf, cap, "end of print statement '}}'");
        break;
    case T_BLOCK_END:
        snprintf(buf, cap, "end of statement block '%%}'");
        break;
    case T_VAR_BEGIN:
        snprintf(buf, cap, "'{{'");
        break;
    case T_BLOCK_BEGIN:
        snprintf(buf, cap, "'{%%'");
        break;
    case T_DATA:
        snprintf(buf, cap, "template text");
        break;
    case T_EOF:
        snprintf(buf, cap, "end of template");
        break;
    }
}

static int unexpected(parser *P, const char *expected) {
    char d[96];
    describe(cur(P), d, sizeof d);
    if (expected) return pfail(P, cur(P)->line, "expected %s, got %s", expected, d);
    return pfail(P, cur(P)->line, "unexpected %s", d);
}

static int expect_op(parser *P, const char *op) {
    if (!is_op(P, op)) {
        char e[16];
        snprintf(e, sizeof e, "'%s'", op);
        return unexpected(P, e);
    }
    advance(P);
    return 0;
}

static int expect_block_end(parser *P) {
    if (cur(P)->kind != T_BLOCK_END) return unexpected(P, "end of statement block '%}'");
    advance(P);
    return 0;
}

static void *palloc(parser *P, size_t size) {
    void *p = jarena_alloc(&P->tpl->arena, size);
    if (!p) g4_fail(P->err, "template: out of memory");
    return p;
}

/* A growable array of pointers, copied into the arena when done. */
typedef struct {
    void **p;
    size_t n, cap;
} pvec;

static int pvec_push(parser *P, pvec *v, void *x) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 8;
        void **q = realloc(v->p, cap * sizeof *q);
        if (!q) return g4_fail(P->err, "template: out of memory");
        v->p = q;
        v->cap = cap;
    }
    v->p[v->n++] = x;
    return 0;
}

static void **pvec_finish(parser *P, pvec *v) {
    void **out = NULL;
    if (v->n) {
        out = palloc(P, v->n * sizeof *out);
        if (out) memcpy(out, v->p, v->n * sizeof *out);
    }
    free(v->p);
    v->p = NULL;
    return out;
}

static int add_const(parser *P, jv *v) {
    g4_jinja *t = P->tpl;
    if (!v) return g4_fail(P->err, "template: out of memory");
    if (t->nconsts == t->capconsts) {
        size_t cap = t->capconsts ? t->capconsts * 2 : 32;
        jv **q = realloc(t->consts, cap * sizeof *q);
        if (!q) {
            jv_decref(v);
            return g4_fail(P->err, "template: out of memory");
        }
        t->consts = q;
        t->capconsts = cap;
    }
    jv_make_immortal(v);
    t->consts[t->nconsts++] = v;
    return 0;
}

static jexpr *new_expr(parser *P, jexpr_kind kind, int line) {
    jexpr *e = palloc(P, sizeof *e);
    if (e) {
        e->kind = kind;
        e->line = line;
    }
    return e;
}

static jexpr *const_expr(parser *P, jv *v, int line) {
    if (add_const(P, v)) return NULL;
    jexpr *e = new_expr(P, E_CONST, line);
    if (e) e->value = v;
    return e;
}

static jstmt *new_stmt(parser *P, jstmt_kind kind, int line) {
    jstmt *s = palloc(P, sizeof *s);
    if (s) {
        s->kind = kind;
        s->line = line;
    }
    return s;
}

/* ---------------------------------------------------------- expressions */

static jexpr *parse_expression(parser *P, int with_condexpr);
static jexpr *parse_tuple(parser *P, int with_condexpr, const char *extra_end, int explicit_parens);
static jexpr *parse_unary(parser *P, int with_filter);
static jexpr *parse_primary(parser *P);
static jexpr *parse_postfix(parser *P, jexpr *node);
static jexpr *parse_filter(parser *P, jexpr *node, int start_inline);

static int enter(parser *P) {
    if (++P->depth > MAX_NESTING) {
        pfail(P, cur(P)->line, "expression or block nesting deeper than %d", MAX_NESTING);
        return -1;
    }
    return 0;
}
static void leave(parser *P) { P->depth--; }

static int parse_call_args(parser *P, jargs *args) {
    int line = cur(P)->line;
    if (expect_op(P, "(")) return -1;
    pvec pos = {0}, kwn = {0}, kwv = {0};
    int need_comma = 0;
    while (!is_op(P, ")")) {
        if (need_comma) {
            if (expect_op(P, ",")) goto fail;
            if (is_op(P, ")")) break;
        }
        if (is_op(P, "*") || is_op(P, "**")) {
            pfail(P, cur(P)->line, "*args and **kwargs in calls are not supported");
            goto fail;
        }
        if (cur(P)->kind == T_NAME && tok_is_op(peek(P, 1), "=")) {
            const char *key = cur(P)->s;
            advance(P);
            advance(P);
            jexpr *v = parse_expression(P, 1);
            if (!v || pvec_push(P, &kwn, (void *)key) || pvec_push(P, &kwv, v)) goto fail;
        } else {
            if (kwn.n) {
                pfail(P, line, "invalid syntax for function call expression (positional argument after keyword argument)");
                goto fail;
            }
            jexpr *v = parse_expression(P, 1);
            if (!v || pvec_push(P, &pos, v)) goto fail;
        }
        need_comma = 1;
    }
    advance(P); /* ')' */
    args->npos = pos.n;
    args->nkw = kwn.n;
    args->pos = (jexpr **)pvec_finish(P, &pos);
    args->kwnames = (const char **)pvec_finish(P, &kwn);
    args->kwvals = (jexpr **)pvec_finish(P, &kwv);
    if ((args->npos && !args->pos) || (args->nkw && (!args->kwnames || !args->kwvals))) return -1;
    return 0;
fail:
    free(pos.p);
    free(kwn.p);
    free(kwv.p);
    return -1;
}

static jexpr *parse_list_literal(parser *P) {
    int line = cur(P)->line;
    advance(P); /* [ */
    pvec items = {0};
    while (!is_op(P, "]")) {
        if (items.n && expect_op(P, ",")) goto fail;
        if (is_op(P, "]")) break;
        jexpr *e = parse_expression(P, 1);
        if (!e || pvec_push(P, &items, e)) goto fail;
    }
    advance(P);
    jexpr *e = new_expr(P, E_LIST, line);
    if (!e) goto fail;
    e->n = items.n;
    e->items = (jexpr **)pvec_finish(P, &items);
    return e;
fail:
    free(items.p);
    return NULL;
}

static jexpr *parse_dict_literal(parser *P) {
    int line = cur(P)->line;
    advance(P); /* { */
    pvec items = {0};
    while (!is_op(P, "}")) {
        if (items.n && expect_op(P, ",")) goto fail;
        if (is_op(P, "}")) break;
        jexpr *k = parse_expression(P, 1);
        if (!k || expect_op(P, ":")) goto fail;
        jexpr *v = parse_expression(P, 1);
        if (!v || pvec_push(P, &items, k) || pvec_push(P, &items, v)) goto fail;
    }
    advance(P);
    jexpr *e = new_expr(P, E_DICT, line);
    if (!e) goto fail;
    e->n = items.n / 2;
    e->items = (jexpr **)pvec_finish(P, &items);
    return e;
fail:
    free(items.p);
    return NULL;
}

static jexpr *parse_primary(parser *P) {
    const jtok *t = cur(P);
    int line = t->line;
    if (enter(P)) return NULL;
    jexpr *e = NULL;
    switch (t->kind) {
    case T_NAME:
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True")) {
            e = new_expr(P, E_CONST, line);
            if (e) e->value = jv_bool(1);
        } else if (!strcmp(t->s, "false") || !strcmp(t->s, "False")) {
            e = new_expr(P, E_CONST, line);
            if (e) e->value = jv_bool(0);
        } else if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) {
            e = new_expr(P, E_CONST, line);
            if (e) e->value = jv_none();
        } else {
            e = new_expr(P, E_NAME, line);
            if (e) e->name = t->s;
            if (P->macro && !strcmp(t->s, "varargs")) P->macro->uses_varargs = 1;
            if (P->macro && !strcmp(t->s, "kwargs")) P->macro->uses_kwargs = 1;
        }
        advance(P);
        break;
    case T_STRING: {
        jbuf b = {0};
        while (cur(P)->kind == T_STRING) {
            jbuf_put(&b, cur(P)->s, cur(P)->len);
            advance(P);
        }
        if (b.failed) {
            jbuf_free(&b);
            g4_fail(P->err, "template: out of memory");
            break;
        }
        size_t len;
        char *s = jbuf_take(&b, &len);
        e = const_expr(P, jv_str_take(s, len), line);
        break;
    }
    case T_INT:
        e = const_expr(P, jv_int(t->i), line);
        advance(P);
        break;
    case T_FLOAT:
        e = const_expr(P, jv_float(t->f), line);
        advance(P);
        break;
    case T_OP:
        if (is_op(P, "(")) {
            advance(P);
            e = parse_tuple(P, 1, NULL, 1);
            if (e && expect_op(P, ")")) e = NULL;
        } else if (is_op(P, "[")) {
            e = parse_list_literal(P);
        } else if (is_op(P, "{")) {
            e = parse_dict_literal(P);
        } else {
            unexpected(P, NULL);
        }
        break;
    default:
        unexpected(P, "an expression");
    }
    leave(P);
    return e;
}

/* The inside of [...]: an expression or a slice. */
static jexpr *parse_subscript(parser *P, jexpr *node) {
    int line = cur(P)->line;
    advance(P); /* [ */
    jexpr *parts[3] = {NULL, NULL, NULL};
    int is_slice = 0;
    if (!is_op(P, ":")) {
        parts[0] = parse_expression(P, 1);
        if (!parts[0]) return NULL;
    }
    if (is_op(P, ":")) {
        is_slice = 1;
        advance(P);
        if (!is_op(P, ":") && !is_op(P, "]")) {
            parts[1] = parse_expression(P, 1);
            if (!parts[1]) return NULL;
        }
        if (is_op(P, ":")) {
            advance(P);
            if (!is_op(P, "]")) {
                parts[2] = parse_expression(P, 1);
                if (!parts[2]) return NULL;
            }
        }
    }
    if (is_op(P, ",")) { /* x[a, b]: the key is a tuple */
        if (is_slice) {
            pfail(P, cur(P)->line, "slices inside tuple subscripts are not supported");
            return NULL;
        }
        pvec items = {0};
        if (pvec_push(P, &items, parts[0])) return NULL;
        while (is_op(P, ",")) {
            advance(P);
            if (is_op(P, "]")) break;
            jexpr *x = parse_expression(P, 1);
            if (!x || pvec_push(P, &items, x)) {
                free(items.p);
                return NULL;
            }
        }
        jexpr *t = new_expr(P, E_TUPLE, line);
        if (!t) {
            free(items.p);
            return NULL;
        }
        t->n = items.n;
        t->items = (jexpr **)pvec_finish(P, &items);
        if (!t->items) return NULL;
        parts[0] = t;
    }
    if (expect_op(P, "]")) return NULL;
    jexpr *e = new_expr(P, is_slice ? E_SLICE : E_GETITEM, line);
    if (!e) return NULL;
    e->a = node;
    if (is_slice) {
        e->b = parts[0];
        e->c = parts[1];
        e->items = palloc(P, sizeof(jexpr *));
        if (!e->items) return NULL;
        e->items[0] = parts[2];
        e->n = 1;
    } else {
        e->b = parts[0];
    }
    return e;
}

static jexpr *parse_postfix(parser *P, jexpr *node) {
    while (node) {
        if (is_op(P, ".")) {
            int line = cur(P)->line;
            advance(P);
            const jtok *t = cur(P);
            if (t->kind == T_NAME) {
                jexpr *e = new_expr(P, E_GETATTR, line);
                if (!e) return NULL;
                e->a = node;
                e->name = t->s;
                advance(P);
                node = e;
            } else if (t->kind == T_INT) {
                jexpr *k = const_expr(P, jv_int(t->i), line);
                jexpr *e = k ? new_expr(P, E_GETITEM, line) : NULL;
                if (!e) return NULL;
                e->a = node;
                e->b = k;
                advance(P);
                node = e;
            } else {
                unexpected(P, "name or number after '.'");
                return NULL;
            }
        } else if (is_op(P, "[")) {
            node = parse_subscript(P, node);
        } else if (is_op(P, "(")) {
            jexpr *e = new_expr(P, E_CALL, cur(P)->line);
            if (!e || parse_call_args(P, &e->args)) return NULL;
            e->a = node;
            node = e;
        } else {
            break;
        }
    }
    return node;
}

static int parse_dotted_name(parser *P, const char **out) {
    if (cur(P)->kind != T_NAME) return unexpected(P, "a name");
    const char *name = cur(P)->s;
    advance(P);
    if (!is_op(P, ".")) {
        *out = name;
        return 0;
    }
    jbuf b = {0};
    jbuf_puts(&b, name);
    while (is_op(P, ".")) {
        advance(P);
        if (cur(P)->kind != T_NAME) {
            jbuf_free(&b);
            return unexpected(P, "a name");
        }
        jbuf_putc(&b, '.');
        jbuf_puts(&b, cur(P)->s);
        advance(P);
    }
    *out = b.p ? jarena_strndup(&P->tpl->arena, b.p, b.len) : NULL;
    jbuf_free(&b);
    if (!*out) return g4_fail(P->err, "template: out of memory");
    return 0;
}

static jexpr *parse_filter(parser *P, jexpr *node, int start_inline) {
    while (is_op(P, "|") || start_inline) {
        if (!start_inline) advance(P);
        start_inline = 0;
        int line = cur(P)->line;
        jexpr *e = new_expr(P, E_FILTER, line);
        if (!e || parse_dotted_name(P, &e->name)) return NULL;
        if (is_op(P, "(") && parse_call_args(P, &e->args)) return NULL;
        e->a = node;
        node = e;
    }
    return node;
}

static jexpr *parse_test(parser *P, jexpr *node) {
    int line = cur(P)->line;
    advance(P); /* is */
    int negated = 0;
    if (is_name(P, "not")) {
        advance(P);
        negated = 1;
    }
    jexpr *e = new_expr(P, E_TEST, line);
    if (!e || parse_dotted_name(P, &e->name)) return NULL;
    e->a = node;
    e->negated = negated;
    const jtok *t = cur(P);
    if (is_op(P, "(")) {
        if (parse_call_args(P, &e->args)) return NULL;
    } else if ((t->kind == T_NAME || t->kind == T_STRING || t->kind == T_INT ||
                t->kind == T_FLOAT || is_op(P, "[") || is_op(P, "{")) &&
               !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and")) {
        if (is_name(P, "is")) {
            pfail(P, t->line, "you cannot chain multiple tests with 'is'");
            return NULL;
        }
        jexpr *arg = parse_postfix(P, parse_primary(P));
        if (!arg) return NULL;
        e->args.pos = palloc(P, sizeof(jexpr *));
        if (!e->args.pos) return NULL;
        e->args.pos[0] = arg;
        e->args.npos = 1;
    }
    return e;
}

static jexpr *parse_filter_expr(parser *P, jexpr *node) {
    while (node) {
        if (is_op(P, "|")) {
            node = parse_filter(P, node, 0);
        } else if (is_name(P, "is")) {
            node = parse_test(P, node);
        } else if (is_op(P, "(")) {
            jexpr *e = new_expr(P, E_CALL, cur(P)->line);
            if (!e || parse_call_args(P, &e->args)) return NULL;
            e->a = node;
            node = e;
        } else {
            break;
        }
    }
    return node;
}

static jexpr *parse_unary(parser *P, int with_filter) {
    int line = cur(P)->line;
    if (enter(P)) return NULL;
    jexpr *node;
    if (is_op(P, "-") || is_op(P, "+")) {
        jexpr_kind k = is_op(P, "-") ? E_NEG : E_POS;
        advance(P);
        jexpr *operand = parse_unary(P, 0);
        node = operand ? new_expr(P, k, line) : NULL;
        if (node) node->a = operand;
    } else {
        node = parse_primary(P);
    }
    node = parse_postfix(P, node);
    if (with_filter) node = parse_filter_expr(P, node);
    leave(P);
    return node;
}

static jexpr *binary(parser *P, jexpr_kind kind, int op, jexpr *a, jexpr *b, int line) {
    if (!a || !b) return NULL;
    jexpr *e = new_expr(P, kind, line);
    if (!e) return NULL;
    e->op = op;
    e->a = a;
    e->b = b;
    return e;
}

static jexpr *parse_pow(parser *P) {
    jexpr *left = parse_unary(P, 1);
    while (left && is_op(P, "**")) {
        int line = cur(P)->line;
        advance(P);
        left = binary(P, E_BIN, OP_POW, left, parse_unary(P, 1), line);
    }
    return left;
}

static jexpr *parse_math2(parser *P) {
    jexpr *left = parse_pow(P);
    while (left) {
        int op;
        if (is_op(P, "*"))
            op = OP_MUL;
        else if (is_op(P, "/"))
            op = OP_DIV;
        else if (is_op(P, "//"))
            op = OP_FLOORDIV;
        else if (is_op(P, "%"))
            op = OP_MOD;
        else
            break;
        int line = cur(P)->line;
        advance(P);
        left = binary(P, E_BIN, op, left, parse_pow(P), line);
    }
    return left;
}

static jexpr *parse_concat(parser *P) {
    int line = cur(P)->line;
    jexpr *first = parse_math2(P);
    if (!first || !is_op(P, "~")) return first;
    pvec items = {0};
    if (pvec_push(P, &items, first)) return NULL;
    while (is_op(P, "~")) {
        advance(P);
        jexpr *e = parse_math2(P);
        if (!e || pvec_push(P, &items, e)) {
            free(items.p);
            return NULL;
        }
    }
    jexpr *e = new_expr(P, E_CONCAT, line);
    if (!e) {
        free(items.p);
        return NULL;
    }
    e->n = items.n;
    e->items = (jexpr **)pvec_finish(P, &items);
    return e->items ? e : NULL;
}

static jexpr *parse_math1(parser *P) {
    jexpr *left = parse_concat(P);
    while (left && (is_op(P, "+") || is_op(P, "-"))) {
        int op = is_op(P, "+") ? OP_ADD : OP_SUB;
        int line = cur(P)->line;
        advance(P);
        left = binary(P, E_BIN, op, left, parse_concat(P), line);
    }
    return left;
}

static jexpr *parse_compare(parser *P) {
    int line = cur(P)->line;
    jexpr *first = parse_math1(P);
    if (!first) return NULL;
    pvec items = {0};
    int ops[64];
    size_t nops = 0;
    while (1) {
        int op;
        if (is_op(P, "=="))
            op = OP_EQ;
        else if (is_op(P, "!="))
            op = OP_NE;
        else if (is_op(P, "<"))
            op = OP_LT;
        else if (is_op(P, "<="))
            op = OP_LE;
        else if (is_op(P, ">"))
            op = OP_GT;
        else if (is_op(P, ">="))
            op = OP_GE;
        else if (is_name(P, "in"))
            op = OP_IN;
        else if (is_name(P, "not") && tok_is_name(peek(P, 1), "in"))
            op = OP_NOTIN;
        else
            break;
        if (nops == sizeof ops / sizeof ops[0]) {
            free(items.p);
            pfail(P, line, "comparison chain too long");
            return NULL;
        }
        advance(P);
        if (op == OP_NOTIN) advance(P);
        if (items.n == 0 && pvec_push(P, &items, first)) return NULL;
        jexpr *e = parse_math1(P);
        if (!e || pvec_push(P, &items, e)) {
            free(items.p);
            return NULL;
        }
        ops[nops++] = op;
    }
    if (nops == 0) return first;
    jexpr *e = new_expr(P, E_COMPARE, line);
    if (!e) {
        free(items.p);
        return NULL;
    }
    e->n = items.n;
    e->items = (jexpr **)pvec_finish(P, &items);
    e->ops = palloc(P, nops * sizeof(int));
    if (!e->items || !e->ops) return NULL;
    memcpy(e->ops, ops, nops * sizeof(int));
    return e;
}

static jexpr *parse_not(parser *P) {
    if (is_name(P, "not")) {
        int line = cur(P)->line;
        advance(P);
        if (enter(P)) return NULL;
        jexpr *operand = parse_not(P);
        leave(P);
        jexpr *e = operand ? new_expr(P, E_NOT, line) : NULL;
        if (e) e->a = operand;
        return e;
    }
    return parse_compare(P);
}

static jexpr *parse_and(parser *P) {
    jexpr *left = parse_not(P);
    while (left && is_name(P, "and")) {
        int line = cur(P)->line;
        advance(P);
        left = binary(P, E_AND, 0, left, parse_not(P), line);
    }
    return left;
}

static jexpr *parse_or(parser *P) {
    jexpr *left = parse_and(P);
    while (left && is_name(P, "or")) {
        int line = cur(P)->line;
        advance(P);
        left = binary(P, E_OR, 0, left, parse_and(P), line);
    }
    return left;
}

static jexpr *parse_condexpr(parser *P) {
    int line = cur(P)->line;
    jexpr *e1 = parse_or(P);
    while (e1 && is_name(P, "if")) {
        advance(P);
        jexpr *cond = parse_or(P);
        if (!cond) return NULL;
        jexpr *e3 = NULL;
        if (is_name(P, "else")) {
            advance(P);
            if (enter(P)) return NULL;
            e3 = parse_condexpr(P);
            leave(P);
            if (!e3) return NULL;
        }
        jexpr *e = new_expr(P, E_COND, line);
        if (!e) return NULL;
        e->a = e1;
        e->b = cond;
        e->c = e3;
        e1 = e;
        line = cur(P)->line;
    }
    return e1;
}

static jexpr *parse_expression(parser *P, int with_condexpr) {
    if (enter(P)) return NULL;
    jexpr *e = with_condexpr ? parse_condexpr(P) : parse_or(P);
    leave(P);
    return e;
}

static int is_tuple_end(parser *P, const char *extra_end) {
    const jtok *t = cur(P);
    if (t->kind == T_VAR_END || t->kind == T_BLOCK_END || t->kind == T_EOF || tok_is_op(t, ")"))
        return 1;
    return extra_end && tok_is_name(t, extra_end);
}

static jexpr *parse_tuple(parser *P, int with_condexpr, const char *extra_end, int explicit_parens) {
    int line = cur(P)->line;
    pvec items = {0};
    int is_tuple = 0;
    while (1) {
        if (items.n && expect_op(P, ",")) goto fail;
        if (is_tuple_end(P, extra_end)) break;
        jexpr *e = parse_expression(P, with_condexpr);
        if (!e || pvec_push(P, &items, e)) goto fail;
        if (is_op(P, ","))
            is_tuple = 1;
        else
            break;
    }
    if (!is_tuple) {
        if (items.n) {
            jexpr *e = items.p[0];
            free(items.p);
            return e;
        }
        if (!explicit_parens) {
            unexpected(P, "an expression");
            goto fail;
        }
    }
    jexpr *e = new_expr(P, E_TUPLE, line);
    if (!e) goto fail;
    e->n = items.n;
    e->items = (jexpr **)pvec_finish(P, &items);
    return e;
fail:
    free(items.p);
    return NULL;
}

/* ----------------------------------------------------------- statements */

static int parse_body(parser *P, jbody *out, const char *const *ends, const char **ended,
                      const char *block, int block_line);

static int parse_target_item(parser *P, jtarget *t, int allow_ns);

static int parse_target(parser *P, jtarget *t, int allow_ns, const char *extra_end) {
    int line = cur(P)->line;
    jtarget first;
    memset(&first, 0, sizeof first);
    if (parse_target_item(P, &first, allow_ns)) return -1;
    if (!is_op(P, ",")) {
        *t = first;
        return 0;
    }
    if (first.kind == TG_ATTR) return pfail(P, line, "cannot assign to a namespace attribute in a tuple");
    jtarget items[32];
    size_t n = 0;
    items[n++] = first;
    while (is_op(P, ",")) {
        advance(P);
        if (cur(P)->kind == T_BLOCK_END || (extra_end && is_name(P, extra_end)) || is_op(P, "="))
            break;
        if (n == sizeof items / sizeof items[0]) return pfail(P, line, "too many assignment targets");
        memset(&items[n], 0, sizeof items[n]);
        if (parse_target_item(P, &items[n], 0)) return -1;
        n++;
    }
    t->kind = TG_TUPLE;
    t->line = line;
    t->n = n;
    t->items = palloc(P, n * sizeof *t->items);
    if (!t->items) return -1;
    memcpy(t->items, items, n * sizeof *items);
    return 0;
}

static int parse_target_item(parser *P, jtarget *t, int allow_ns) {
    const jtok *tk = cur(P);
    t->line = tk->line;
    if (is_op(P, "(")) {
        advance(P);
        if (parse_target(P, t, 0, NULL)) return -1;
        return expect_op(P, ")");
    }
    if (tk->kind != T_NAME) return unexpected(P, "a variable name to assign to");
    static const char *const reserved[] = {"true", "false", "none", "True", "False", "None"};
    for (size_t k = 0; k < sizeof reserved / sizeof reserved[0]; k++)
        if (!strcmp(tk->s, reserved[k])) return pfail(P, tk->line, "cannot assign to '%s'", tk->s);
    t->name = tk->s;
    t->kind = TG_NAME;
    advance(P);
    if (is_op(P, ".")) {
        if (!allow_ns) return pfail(P, tk->line, "cannot assign to an attribute here");
        advance(P);
        if (cur(P)->kind != T_NAME) return unexpected(P, "an attribute name");
        t->kind = TG_ATTR;
        t->attr = cur(P)->s;
        advance(P);
    }
    return 0;
}

static jstmt *parse_for(parser *P, int line) {
    jstmt *s = new_stmt(P, S_FOR, line);
    if (!s || parse_target(P, &s->target, 0, "in")) return NULL;
    if (s->target.kind == TG_ATTR) {
        pfail(P, line, "cannot use a namespace attribute as a loop variable");
        return NULL;
    }
    if (!is_name(P, "in")) {
        unexpected(P, "'in'");
        return NULL;
    }
    advance(P);
    s->expr = parse_tuple(P, 0, "recursive", 0);
    if (!s->expr) return NULL;
    if (is_name(P, "if")) {
        advance(P);
        s->cond = parse_expression(P, 1);
        if (!s->cond) return NULL;
    }
    if (is_name(P, "recursive")) {
        pfail(P, line, "recursive for loops are not supported");
        return NULL;
    }
    if (expect_block_end(P)) return NULL;
    static const char *const ends[] = {"endfor", "else", NULL};
    const char *ended;
    P->loop_depth++;
    int rc = parse_body(P, &s->body, ends, &ended, "for", line);
    P->loop_depth--;
    if (rc) return NULL;
    if (expect_block_end(P)) return NULL;
    if (!strcmp(ended, "else")) {
        static const char *const ends2[] = {"endfor", NULL};
        if (parse_body(P, &s->else_body, ends2, &ended, "for", line) || expect_block_end(P))
            return NULL;
    }
    return s;
}

static jstmt *parse_if(parser *P, int line) {
    jstmt *s = new_stmt(P, S_IF, line);
    if (!s) return NULL;
    s->expr = parse_tuple(P, 0, NULL, 0);
    if (!s->expr || expect_block_end(P)) return NULL;
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    const char *ended;
    if (parse_body(P, &s->body, ends, &ended, "if", line)) return NULL;
    if (!strcmp(ended, "elif")) {
        jstmt *next = parse_if(P, cur(P)->line);
        if (!next) return NULL;
        s->else_body.items = palloc(P, sizeof(jstmt *));
        if (!s->else_body.items) return NULL;
        s->else_body.items[0] = next;
        s->else_body.n = 1;
        return s; /* the nested if consumed the final {% endif %} */
    }
    if (expect_block_end(P)) return NULL;
    if (!strcmp(ended, "else")) {
        static const char *const ends2[] = {"endif", NULL};
        if (parse_body(P, &s->else_body, ends2, &ended, "if", line) || expect_block_end(P))
            return NULL;
    }
    return s;
}

static jstmt *parse_set(parser *P, int line) {
    jstmt *s = new_stmt(P, S_SET, line);
    if (!s || parse_target(P, &s->target, 1, NULL)) return NULL;
    if (is_op(P, "=")) {
        advance(P);
        s->expr = parse_tuple(P, 1, NULL, 0);
        if (!s->expr || expect_block_end(P)) return NULL;
        return s;
    }
    s->kind = S_SET_BLOCK;
    if (s->target.kind == TG_TUPLE) {
        pfail(P, line, "a set block assigns one variable");
        return NULL;
    }
    if (is_op(P, "|")) {
        jexpr *input = new_expr(P, E_INPUT, line);
        s->filter = input ? parse_filter(P, input, 0) : NULL;
        if (!s->filter) return NULL;
    }
    if (expect_block_end(P)) return NULL;
    static const char *const ends[] = {"endset", NULL};
    const char *ended;
    if (parse_body(P, &s->body, ends, &ended, "set", line) || expect_block_end(P)) return NULL;
    return s;
}

static jstmt *parse_macro(parser *P, int line) {
    jstmt *s = new_stmt(P, S_MACRO, line);
    if (!s) return NULL;
    if (cur(P)->kind != T_NAME) {
        unexpected(P, "a macro name");
        return NULL;
    }
    s->name = cur(P)->s;
    advance(P);
    if (expect_op(P, "(")) return NULL;
    pvec names = {0}, defs = {0};
    while (!is_op(P, ")")) {
        if (names.n && expect_op(P, ",")) goto fail;
        if (is_op(P, ")")) break;
        if (cur(P)->kind != T_NAME) {
            unexpected(P, "a parameter name");
            goto fail;
        }
        const char *pname = cur(P)->s;
        advance(P);
        jexpr *def = NULL;
        if (is_op(P, "=")) {
            advance(P);
            def = parse_expression(P, 1);
            if (!def) goto fail;
        } else if (defs.n && defs.p[defs.n - 1]) {
            pfail(P, line, "non-default argument follows default argument");
            goto fail;
        }
        if (pvec_push(P, &names, (void *)pname) || pvec_push(P, &defs, def)) goto fail;
    }
    advance(P);
    s->nparams = names.n;
    s->params = (const char **)pvec_finish(P, &names);
    s->defaults = (jexpr **)pvec_finish(P, &defs);
    if (s->nparams && (!s->params || !s->defaults)) return NULL;
    if (expect_block_end(P)) return NULL;
    static const char *const ends[] = {"endmacro", NULL};
    const char *ended;
    jstmt *saved_macro = P->macro;
    int saved_loop = P->loop_depth;
    P->macro = s;
    P->loop_depth = 0;
    int rc = parse_body(P, &s->body, ends, &ended, "macro", line);
    P->macro = saved_macro;
    P->loop_depth = saved_loop;
    if (rc) return NULL;
    if (cur(P)->kind == T_NAME) advance(P); /* {% endmacro name %} */
    if (expect_block_end(P)) return NULL;
    return s;
fail:
    free(names.p);
    free(defs.p);
    return NULL;
}

static jstmt *parse_with(parser *P, int line) {
    jstmt *s = new_stmt(P, S_WITH, line);
    if (!s) return NULL;
    jtarget targets[32];
    jexpr *values[32];
    size_t n = 0;
    while (cur(P)->kind != T_BLOCK_END) {
        if (n && expect_op(P, ",")) return NULL;
        if (n == 32) {
            pfail(P, line, "too many assignments in 'with'");
            return NULL;
        }
        memset(&targets[n], 0, sizeof targets[n]);
        if (parse_target_item(P, &targets[n], 0) || expect_op(P, "=")) return NULL;
        values[n] = parse_expression(P, 1);
        if (!values[n]) return NULL;
        n++;
    }
    advance(P);
    s->nvalues = n;
    if (n) {
        s->targets = palloc(P, n * sizeof *s->targets);
        s->values = palloc(P, n * sizeof *s->values);
        if (!s->targets || !s->values) return NULL;
        memcpy(s->targets, targets, n * sizeof *targets);
        memcpy(s->values, values, n * sizeof *values);
    }
    static const char *const ends[] = {"endwith", NULL};
    const char *ended;
    if (parse_body(P, &s->body, ends, &ended, "with", line) || expect_block_end(P)) return NULL;
    return s;
}

static jstmt *parse_filter_block(parser *P, int line) {
    jstmt *s = new_stmt(P, S_FILTER_BLOCK, line);
    jexpr *input = s ? new_expr(P, E_INPUT, line) : NULL;
    if (!input) return NULL;
    s->filter = parse_filter(P, input, 1);
    if (!s->filter || expect_block_end(P)) return NULL;
    static const char *const ends[] = {"endfilter", NULL};
    const char *ended;
    if (parse_body(P, &s->body, ends, &ended, "filter", line) || expect_block_end(P)) return NULL;
    return s;
}

static jstmt *parse_statement(parser *P) {
    const jtok *t = cur(P);
    int line = t->line;
    if (t->kind != T_NAME) {
        unexpected(P, "a tag name");
        return NULL;
    }
    const char *name = t->s;
    if (enter(P)) return NULL;
    advance(P);
    jstmt *s = NULL;
    if (!strcmp(name, "for")) {
        s = parse_for(P, line);
    } else if (!strcmp(name, "if")) {
        s = parse_if(P, line);
    } else if (!strcmp(name, "set")) {
        s = parse_set(P, line);
    } else if (!strcmp(name, "macro")) {
        s = parse_macro(P, line);
    } else if (!strcmp(name, "with")) {
        s = parse_with(P, line);
    } else if (!strcmp(name, "filter")) {
        s = parse_filter_block(P, line);
    } else if (!strcmp(name, "break") || !strcmp(name, "continue")) {
        if (P->loop_depth == 0)
            pfail(P, line, "'%s' outside of a for loop", name);
        else if (expect_block_end(P) == 0)
            s = new_stmt(P, name[0] == 'b' ? S_BREAK : S_CONTINUE, line);
    } else if (!strcmp(name, "generation")) {
        s = new_stmt(P, S_BLOCK, line);
        static const char *const ends[] = {"endgeneration", NULL};
        const char *ended;
        if (s && (expect_block_end(P) ||
                  parse_body(P, &s->body, ends, &ended, "generation", line) ||
                  expect_block_end(P)))
            s = NULL;
    } else if (!strcmp(name, "call") || !strcmp(name, "include") || !strcmp(name, "import") ||
               !strcmp(name, "from") || !strcmp(name, "extends") || !strcmp(name, "block") ||
               !strcmp(name, "autoescape") || !strcmp(name, "do") || !strcmp(name, "print") ||
               !strcmp(name, "trans")) {
        pfail(P, line, "the '%s' tag is not supported", name);
    } else if (!strncmp(name, "end", 3) || !strcmp(name, "else") || !strcmp(name, "elif")) {
        pfail(P, line, "unexpected '%s' (no open block to close)", name);
    } else {
        pfail(P, line, "unknown tag '%s'", name);
    }
    leave(P);
    return s;
}

static int parse_body(parser *P, jbody *out, const char *const *ends, const char **ended,
                      const char *block, int block_line) {
    pvec items = {0};
    while (1) {
        const jtok *t = cur(P);
        if (t->kind == T_EOF) {
            if (ends) {
                char want[128] = "";
                for (size_t k = 0; ends[k]; k++) {
                    size_t l = strlen(want);
                    snprintf(want + l, sizeof want - l, "%s'%s'", k ? " or " : "", ends[k]);
                }
                pfail(P, t->line,
                      "unexpected end of template: expected %s to close the '%s' block of line %d",
                      want, block, block_line);
                goto fail;
            }
            break;
        }
        jstmt *s = NULL;
        if (t->kind == T_DATA) {
            s = new_stmt(P, S_TEXT, t->line);
            if (!s) goto fail;
            s->text = t->s;
            s->text_len = t->len;
            advance(P);
        } else if (t->kind == T_VAR_BEGIN) {
            advance(P);
            s = new_stmt(P, S_OUTPUT, t->line);
            if (!s) goto fail;
            s->expr = parse_tuple(P, 1, NULL, 0);
            if (!s->expr) goto fail;
            if (cur(P)->kind != T_VAR_END) {
                unexpected(P, "end of print statement '}}'");
                goto fail;
            }
            advance(P);
        } else if (t->kind == T_BLOCK_BEGIN) {
            const jtok *nt = peek(P, 1);
            if (ends && nt->kind == T_NAME) {
                int hit = 0;
                for (size_t k = 0; ends[k]; k++)
                    if (!strcmp(nt->s, ends[k])) {
                        *ended = ends[k];
                        hit = 1;
                    }
                if (hit) {
                    advance(P);
                    advance(P);
                    break;
                }
            }
            advance(P);
            s = parse_statement(P);
            if (!s) goto fail;
        } else {
            unexpected(P, NULL);
            goto fail;
        }
        if (pvec_push(P, &items, s)) goto fail;
    }
    out->n = items.n;
    out->items = (jstmt **)pvec_finish(P, &items);
    if (out->n && !out->items) return -1;
    return 0;
fail:
    free(items.p);
    return -1;
}

int jinja_parse_tokens(g4_jinja *tpl, const jtokens *toks, g4_error *err) {
    parser P = {.tpl = tpl, .t = toks->items, .n = toks->n, .i = 0, .err = err};
    return parse_body(&P, &tpl->root, NULL, NULL, NULL, 0);
}
