/* Renders a parsed template.
 *
 * Scopes follow jinja2: a for-loop iteration, a macro call, a with block and the body of a set
 * or filter block each get a scope of their own (assignments inside do not leak out); if blocks
 * do not.  A macro sees the scope it was defined in, as it is when the macro is called.
 * Values are reference counted; a scope's variables are dropped when the scope ends, and the
 * namespaces' attributes when the render ends, so reference cycles through them cannot leak. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "jinja/jinja_internal.h"

enum { X_OK = 0, X_ERR = -1, X_BREAK = 1, X_CONTINUE = 2 };

#define DEFAULT_MAX_OUTPUT ((size_t)64 << 20)
#define DEFAULT_MAX_STEPS ((uint64_t)1000000000)
#define DEFAULT_MAX_DEPTH 200
#define DEFAULT_MAX_MEMORY ((size_t)256 << 20)
#define MAX_NEST 1000 /* evaluation levels; ~1 KiB of C stack each (ASan: a few) */

/* ----------------------------------------------------------------- errors */

static int error_set(jrender *r) { return r->err && r->err->msg[0]; }

/* The message of a budget fault (the cause of whatever failed after it). */
static void fault_message(const jrender *r, char *msg, size_t cap) {
    switch (r->budget.fault) {
    case JF_STEPS:
        snprintf(msg, cap, "template took more than %llu steps (runaway loop?)",
                 (unsigned long long)r->budget.max_steps);
        break;
    case JF_MEMORY:
        snprintf(msg, cap, "template values use more than the memory limit (%zu bytes)", r->budget.max_mem);
        break;
    case JF_DEPTH:
        snprintf(msg, cap, "values nested deeper than %d levels", JV_MAX_DEPTH);
        break;
    default:
        snprintf(msg, cap, "expressions, statements or filters nested deeper than %d levels", MAX_NEST);
    }
}

static void vfail(jrender *r, int line, const char *fmt, va_list ap) {
    if (!r->err || error_set(r)) return; /* keep the first (innermost) message */
    char msg[450];
    if (r->budget.fault)
        fault_message(r, msg, sizeof msg);
    else
        vsnprintf(msg, sizeof msg, fmt, ap);
    g4_fail(r->err, "template line %d: %s", line, msg);
}

jv *jr_fail(jrender *r, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(r, line, fmt, ap);
    va_end(ap);
    return NULL;
}

int jr_failc(jrender *r, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(r, line, fmt, ap);
    va_end(ap);
    return -1;
}

jv *jr_undefined_error(jrender *r, int line, const jv *undef) {
    const char *hint = undef && undef->kind == JV_UNDEFINED ? undef->u.undef.hint : NULL;
    return jr_fail(r, line, "%s", hint ? hint : "a value is undefined");
}

jv *jr_oom(jrender *r, int line) { return jr_fail(r, line, "out of memory"); }

int jr_register_namespace(jrender *r, jv *ns) {
    if (r->nns == r->capns) {
        size_t cap = r->capns ? r->capns * 2 : 16;
        jv **p = realloc(r->namespaces, cap * sizeof *p);
        if (!p) return -1;
        r->namespaces = p;
        r->capns = cap;
    }
    r->namespaces[r->nns++] = jv_incref(ns);
    return 0;
}

int jr_work(jrender *r, int line, uint64_t n) {
    if (jv_work(n)) return jr_failc(r, line, "budget"); /* the fault's message */
    return 0;
}

static int step(jrender *r, int line) {
    r->line = line;
    return jr_work(r, line, 1);
}

int jr_enter(jrender *r, int line) {
    if (r->nest >= MAX_NEST) {
        jv_fault(JF_NEST);
        return jr_failc(r, line, "nesting");
    }
    r->nest++;
    return 0;
}

/* ----------------------------------------------------------------- scopes */

static jscope *scope_new(jscope *parent) {
    jscope *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->refs = 1;
    s->parent = parent;
    if (parent) parent->refs++;
    return s;
}

static void scope_clear(jscope *s) {
    size_t n = s->n;
    s->n = 0;
    for (size_t i = 0; i < n; i++) jv_decref(s->vals[i]);
}

void jscope_release(jscope *s) {
    while (s && --s->refs == 0) {
        jscope *parent = s->parent;
        scope_clear(s);
        free(s->names);
        free(s->vals);
        free(s);
        s = parent;
    }
}

/* The scope's life ends: drop its variables (macros defined in it may keep the struct). */
static void scope_exit(jscope *s) {
    if (!s) return;
    scope_clear(s);
    jscope_release(s);
}

/* A sorted scope (the render variables, which may be many) is searched by bisection, others
 * (the template's own names) one by one, a step per name. */
static jv *scope_lookup(const jscope *s, const char *name) {
    for (; s; s = s->parent) {
        if (s->sorted) {
            size_t lo = 0, hi = s->n;
            while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                int c = strcmp(s->names[mid], name);
                if (c == 0) return s->vals[mid];
                if (c < 0)
                    lo = mid + 1;
                else
                    hi = mid;
            }
            continue;
        }
        if (jv_work(s->n)) return NULL;
        for (size_t i = s->n; i > 0; i--)
            if (strcmp(s->names[i - 1], name) == 0) return s->vals[i - 1];
    }
    return NULL;
}

/* Steals val. */
static int scope_set(jscope *s, const char *name, jv *val) {
    if (jv_work(s->n)) {
        jv_decref(val);
        return -1;
    }
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->names[i], name) == 0) {
            jv_decref(s->vals[i]);
            s->vals[i] = val;
            return 0;
        }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        const char **nn = realloc(s->names, cap * sizeof *nn);
        if (!nn) goto fail;
        s->names = nn;
        jv **vv = realloc(s->vals, cap * sizeof *vv);
        if (!vv) goto fail;
        s->vals = vv;
        s->cap = cap;
    }
    s->names[s->n] = name;
    s->vals[s->n] = val;
    s->n++;
    return 0;
fail:
    jv_decref(val);
    return -1;
}

/* ------------------------------------------------------------ conversions */

jv *jr_to_string(jrender *r, int line, const jv *v) {
    if (v->kind == JV_STRING) return jv_incref((jv *)v);
    jbuf b = {.limit = r->lim.max_output};
    jv_write_str(v, &b);
    if (b.failed) {
        jbuf_free(&b);
        return jr_fail(r, line, b.failed == 2 ? "string longer than the output limit" : "out of memory");
    }
    size_t len;
    char *s = jbuf_take(&b, &len);
    jv *out = jv_str_take(s, len);
    return out ? out : jr_oom(r, line);
}

jv *jr_iterate(jrender *r, int line, jv *v) {
    switch (v->kind) {
    case JV_LIST:
        return jv_incref(v);
    case JV_UNDEFINED: {
        jv *l = jv_list(0);
        return l ? l : jr_oom(r, line);
    }
    case JV_DICT: {
        jv *l = jv_list(v->u.dict.n);
        if (!l) return jr_oom(r, line);
        for (size_t i = 0; i < v->u.dict.n; i++)
            if (jv_list_push(l, jv_incref(v->u.dict.keys[i]))) {
                jv_decref(l);
                return jr_oom(r, line);
            }
        return l;
    }
    case JV_STRING: {
        jv *l = jv_list(0);
        if (!l) return jr_oom(r, line);
        const char *s = v->u.str.s;
        size_t n = v->u.str.len, i = 0;
        while (i < n) {
            uint32_t cp;
            size_t k = ju8_next(s + i, n - i, &cp);
            if (jv_list_push(l, jv_str(s + i, k))) {
                jv_decref(l);
                return jr_oom(r, line);
            }
            i += k;
        }
        return l;
    }
    default:
        return jr_fail(r, line, "'%s' object is not iterable", jv_type_name(v));
    }
}

/* --------------------------------------------------------------- getattr */

static const char *const mutating_methods[] = {
    "append", "extend", "insert", "pop",   "remove",     "reverse", "sort",
    "clear",  "update", "popitem", "setdefault", "add", "discard", NULL};

static jv *loop_attr(jrender *r, int line, jv *loop, const char *name, size_t len) {
    size_t i = loop->u.loop.index0, n = loop->u.loop.length;
#define IS(s) (len == sizeof(s) - 1 && memcmp(name, s, len) == 0)
    if (IS("index")) return jv_int((int64_t)i + 1);
    if (IS("index0")) return jv_int((int64_t)i);
    if (IS("revindex")) return jv_int((int64_t)(n - i));
    if (IS("revindex0")) return jv_int((int64_t)(n - i - 1));
    if (IS("first")) return jv_bool(i == 0);
    if (IS("last")) return jv_bool(i + 1 == n);
    if (IS("length")) return jv_int((int64_t)n);
    if (IS("depth")) return jv_int(1);
    if (IS("depth0")) return jv_int(0);
    if (IS("previtem")) {
        if (i == 0) return jv_undefined_hint("there is no previous item");
        return jv_incref(loop->u.loop.items->u.list.items[i - 1]);
    }
    if (IS("nextitem")) {
        if (i + 1 >= n) return jv_undefined_hint("there is no next item");
        return jv_incref(loop->u.loop.items->u.list.items[i + 1]);
    }
#undef IS
    int id = jb_method_id(loop, name, len);
    if (id) return jv_func(id, jv_incref(loop));
    (void)r;
    (void)line;
    return jv_undefined_hint("'LoopContext' object has no attribute '%.*s'", (int)len, name);
}

jv *jr_getattr(jrender *r, int line, jv *obj, const char *name, size_t len) {
    if (obj->kind == JV_UNDEFINED) return jr_undefined_error(r, line, obj);
    if (len > 0 && name[0] == '_')
        return jv_undefined_hint("access to attribute '%.*s' of '%s' object is unsafe.", (int)len,
                                 name, jv_type_name(obj));
    switch (obj->kind) {
    case JV_NAMESPACE: {
        jv *v = jv_dict_get_str(obj, name, len);
        if (v) return jv_incref(v);
        return jv_undefined_hint("'Namespace' object has no attribute '%.*s'", (int)len, name);
    }
    case JV_LOOP:
        return loop_attr(r, line, obj, name, len);
    default:
        break;
    }
    int id = jb_method_id(obj, name, len);
    if (id) return jv_func(id, jv_incref(obj));
    if (obj->kind == JV_LIST || obj->kind == JV_DICT) {
        for (size_t k = 0; mutating_methods[k]; k++)
            if (strlen(mutating_methods[k]) == len && !memcmp(mutating_methods[k], name, len))
                return jv_undefined_hint("access to attribute '%.*s' of '%s' object is unsafe.",
                                         (int)len, name, jv_type_name(obj));
    }
    if (obj->kind == JV_DICT) {
        jv *v = jv_dict_get_str(obj, name, len);
        if (v) return jv_incref(v);
    }
    return jv_undefined_hint("'%s object' has no attribute '%.*s'", jv_type_name(obj), (int)len,
                             name);
}

static int as_index(const jv *k, int64_t *out) {
    if (k->kind == JV_INT) {
        *out = k->u.i;
        return 1;
    }
    if (k->kind == JV_BOOL) {
        *out = k->u.b;
        return 1;
    }
    return 0;
}

jv *jr_getitem(jrender *r, int line, jv *obj, jv *key) {
    if (obj->kind == JV_UNDEFINED) return jr_undefined_error(r, line, obj);
    int64_t idx;
    switch (obj->kind) {
    case JV_DICT: {
        jv *v = jv_dict_get(obj, key);
        if (v) return jv_incref(v);
        break;
    }
    case JV_LIST:
        if (obj->u.list.gen) return jv_undefined_hint("'generator' object is not subscriptable");
        if (as_index(key, &idx)) {
            int64_t n = (int64_t)obj->u.list.n;
            if (idx < 0) idx += n;
            if (idx < 0 || idx >= n)
                return jv_undefined_hint("'%s object' has no element %lld", jv_type_name(obj),
                                         (long long)(idx < 0 ? idx - n : idx));
            return jv_incref(obj->u.list.items[idx]);
        }
        break;
    case JV_STRING:
        if (as_index(key, &idx)) {
            int64_t n = (int64_t)ju8_count(obj->u.str.s, obj->u.str.len);
            if (idx < 0) idx += n;
            if (idx < 0 || idx >= n)
                return jv_undefined_hint("'str object' has no element %lld", (long long)idx);
            size_t a = ju8_offset(obj->u.str.s, obj->u.str.len, (size_t)idx);
            uint32_t cp;
            size_t k = ju8_next(obj->u.str.s + a, obj->u.str.len - a, &cp);
            return jv_str(obj->u.str.s + a, k);
        }
        break;
    default:
        break;
    }
    if (key->kind == JV_STRING) return jr_getattr(r, line, obj, key->u.str.s, key->u.str.len);
    jbuf b = {0};
    jv_write_repr(key, &b);
    jv *u = jv_undefined_hint("'%s object' has no element %.100s", jv_type_name(obj),
                              b.p ? b.p : "?");
    jbuf_free(&b);
    return u;
}

/* Python slice semantics. */
static void slice_range(int64_t n, const jv *start, const jv *stop, int64_t stepv, int64_t *a,
                        int64_t *b) {
    int64_t lower = stepv > 0 ? 0 : -1, upper = stepv > 0 ? n : n - 1;
    int64_t x = 0;
    if (!start || start->kind == JV_NONE) {
        *a = stepv > 0 ? lower : upper;
    } else {
        as_index(start, &x);
        if (x < 0) {
            x += n;
            if (x < lower) x = lower;
        } else if (x > upper) {
            x = upper;
        }
        *a = x;
    }
    if (!stop || stop->kind == JV_NONE) {
        *b = stepv > 0 ? upper : lower;
    } else {
        as_index(stop, &x);
        if (x < 0) {
            x += n;
            if (x < lower) x = lower;
        } else if (x > upper) {
            x = upper;
        }
        *b = x;
    }
}

/* Is k the last index before b (the next step would pass b, or overflow)? */
static int slice_last(int64_t k, int64_t b, int64_t stepv) {
    return stepv > 0 ? stepv >= b - k : stepv <= b - k;
}

static jv *do_slice(jrender *r, int line, jv *obj, jv *start, jv *stop, jv *stepval) {
    int64_t tmp, stepv = 1;
    if ((start && start->kind != JV_NONE && !as_index(start, &tmp)) ||
        (stop && stop->kind != JV_NONE && !as_index(stop, &tmp)) ||
        (stepval && stepval->kind != JV_NONE && !as_index(stepval, &tmp)))
        return jv_undefined_hint("slice indices must be integers or None");
    if (stepval && stepval->kind != JV_NONE) as_index(stepval, &stepv);
    if (stepv == 0) return jr_fail(r, line, "slice step cannot be zero");
    if (obj->kind == JV_LIST && !obj->u.list.gen) {
        int64_t a, b;
        slice_range((int64_t)obj->u.list.n, start, stop, stepv, &a, &b);
        jv *l = jv_list(0);
        if (!l) return jr_oom(r, line);
        l->u.list.tuple = obj->u.list.tuple;
        for (int64_t i = a; stepv > 0 ? i < b : i > b; i += stepv) {
            if (jv_list_push(l, jv_incref(obj->u.list.items[i]))) {
                jv_decref(l);
                return jr_oom(r, line);
            }
            if (slice_last(i, b, stepv)) break;
        }
        return l;
    }
    if (obj->kind == JV_STRING) {
        const char *s = obj->u.str.s;
        size_t n = obj->u.str.len;
        size_t count = ju8_count(s, n);
        int64_t a, b;
        slice_range((int64_t)count, start, stop, stepv, &a, &b);
        jbuf out = {.limit = r->lim.max_output};
        if (stepv == 1) { /* a substring */
            if (a < b) {
                size_t oa = ju8_offset(s, n, (size_t)a);
                size_t ob = oa + ju8_offset(s + oa, n - oa, (size_t)(b - a));
                jbuf_put(&out, s + oa, ob - oa);
            }
        } else { /* the offsets of every code point, charged as values are */
            size_t bytes = (count + 1) * sizeof(size_t);
            if (jv_charge(bytes)) return jr_oom(r, line);
            size_t *offs = malloc(bytes);
            if (!offs) {
                jv_refund(bytes);
                return jr_oom(r, line);
            }
            size_t i = 0, c = 0;
            while (i < n) {
                uint32_t cp;
                offs[c++] = i;
                i += ju8_next(s + i, n - i, &cp);
            }
            offs[count] = n;
            for (int64_t k = a; stepv > 0 ? k < b : k > b; k += stepv) {
                jbuf_put(&out, s + offs[k], offs[k + 1] - offs[k]);
                if (slice_last(k, b, stepv)) break;
            }
            free(offs);
            jv_refund(bytes);
        }
        if (out.failed) {
            jbuf_free(&out);
            return jr_oom(r, line);
        }
        size_t len;
        char *p = jbuf_take(&out, &len);
        jv *v = jv_str_take(p, len);
        return v ? v : jr_oom(r, line);
    }
    if (obj->kind == JV_DICT) return jr_fail(r, line, "unhashable type: 'slice'");
    return jr_fail(r, line, "'%s' object is not subscriptable", jv_type_name(obj));
}

/* ------------------------------------------------------------- operators */

static jv *type_error2(jrender *r, int line, const char *op, const jv *a, const jv *b) {
    return jr_fail(r, line, "unsupported operand type(s) for %s: '%s' and '%s'", op,
                   jv_type_name(a), jv_type_name(b));
}

static int64_t ival(const jv *v) { return v->kind == JV_BOOL ? v->u.b : v->u.i; }

static double py_fmod(double a, double b) {
    double m = fmod(a, b);
    if (m != 0) {
        if ((b < 0) != (m < 0)) m += b;
    } else {
        m = copysign(0.0, b);
    }
    return m;
}

static double py_floordiv(double a, double b) {
    double m = fmod(a, b);
    double div = (a - m) / b;
    if (m != 0 && ((b < 0) != (m < 0))) div -= 1.0;
    if (div != 0) {
        double f = floor(div);
        if (div - f > 0.5) f += 1.0;
        return f;
    }
    return copysign(0.0, a / b);
}

static jv *repeat(jrender *r, int line, const jv *seq, int64_t times) {
    if (times < 0) times = 0;
    if (seq->kind == JV_STRING) {
        size_t len = seq->u.str.len;
        if (len && (uint64_t)times > r->lim.max_output / len)
            return jr_fail(r, line, "string longer than the output limit");
        size_t total = len * (size_t)times;
        if (jr_work(r, line, jr_bytes_work(total))) return NULL;
        char *p = malloc(total + 1);
        if (!p) return jr_oom(r, line);
        if (total) memcpy(p, seq->u.str.s, len);
        for (size_t done = len; done < total; done *= 2) /* doubling copies */
            memcpy(p + done, p, done < total - done ? done : total - done);
        p[total] = 0;
        jv *v = jv_str_take(p, total);
        return v ? v : jr_oom(r, line);
    }
    size_t n = seq->u.list.n;
    if (!n) times = 0; /* an empty list stays empty (no loop of `times` empty extensions) */
    if (n && (uint64_t)times > (r->lim.max_output / 8) / n)
        return jr_fail(r, line, "list too long");
    jv *l = jv_list(n * (size_t)times);
    if (!l) return jr_oom(r, line);
    l->u.list.tuple = seq->u.list.tuple;
    for (int64_t t = 0; t < times; t++)
        if (jv_list_extend(l, seq)) {
            jv_decref(l);
            return jr_oom(r, line);
        }
    return l;
}

static jv *concat_values(jrender *r, int line, const jv *a, const jv *b) {
    if (a->kind == JV_STRING) {
        size_t n = a->u.str.len + b->u.str.len;
        if (n > r->lim.max_output) return jr_fail(r, line, "string longer than the output limit");
        char *p = malloc(n + 1);
        if (!p) return jr_oom(r, line);
        memcpy(p, a->u.str.s, a->u.str.len);
        memcpy(p + a->u.str.len, b->u.str.s, b->u.str.len);
        p[n] = 0;
        jv *v = jv_str_take(p, n);
        return v ? v : jr_oom(r, line);
    }
    jv *l = jv_list(a->u.list.n + b->u.list.n);
    if (!l) return jr_oom(r, line);
    l->u.list.tuple = a->u.list.tuple;
    if (jv_list_extend(l, a) || jv_list_extend(l, b)) {
        jv_decref(l);
        return jr_oom(r, line);
    }
    return l;
}

static jv *binop(jrender *r, int line, int op, const jv *a, const jv *b) {
    if (op == OP_MOD && a->kind == JV_STRING) { /* str % value: Python's printf-style format */
        if (b->kind == JV_LIST && b->u.list.tuple)
            return jb_percent_format(r, line, a->u.str.s, a->u.str.len, b->u.list.items,
                                     b->u.list.n, NULL, 0);
        jv *one = (jv *)b;
        int mapping_like = b->kind == JV_DICT || (b->kind == JV_LIST && !b->u.list.gen) ||
                           b->kind == JV_UNDEFINED;
        return jb_percent_format(r, line, a->u.str.s, a->u.str.len, &one, 1,
                                 b->kind == JV_DICT ? b : NULL, mapping_like);
    }
    if (a->kind == JV_UNDEFINED) return jr_undefined_error(r, line, a);
    if (b->kind == JV_UNDEFINED) return jr_undefined_error(r, line, b);
    static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**"};
    const char *opname = names[op];
    int num = jv_is_number(a) && jv_is_number(b);
    int ints = num && a->kind != JV_FLOAT && b->kind != JV_FLOAT;
    switch (op) {
    case OP_ADD:
        if (ints) {
            int64_t x;
            if (__builtin_add_overflow(ival(a), ival(b), &x))
                return jr_fail(r, line, "integer overflow");
            return jv_int(x);
        }
        if (num) return jv_float(jv_num(a) + jv_num(b));
        if (a->kind == JV_STRING && b->kind == JV_STRING) return concat_values(r, line, a, b);
        if (a->kind == JV_LIST && b->kind == JV_LIST && a->u.list.tuple == b->u.list.tuple &&
            !a->u.list.gen && !b->u.list.gen)
            return concat_values(r, line, a, b);
        if (a->kind == JV_STRING || a->kind == JV_LIST)
            return jr_fail(r, line, "can only concatenate %s (not \"%s\") to %s",
                           jv_type_name(a), jv_type_name(b), jv_type_name(a));
        return type_error2(r, line, opname, a, b);
    case OP_SUB:
        if (ints) {
            int64_t x;
            if (__builtin_sub_overflow(ival(a), ival(b), &x))
                return jr_fail(r, line, "integer overflow");
            return jv_int(x);
        }
        if (num) return jv_float(jv_num(a) - jv_num(b));
        return type_error2(r, line, opname, a, b);
    case OP_MUL:
        if (ints) {
            int64_t x;
            if (__builtin_mul_overflow(ival(a), ival(b), &x))
                return jr_fail(r, line, "integer overflow");
            return jv_int(x);
        }
        if (num) return jv_float(jv_num(a) * jv_num(b));
        if ((a->kind == JV_STRING || (a->kind == JV_LIST && !a->u.list.gen)) &&
            (b->kind == JV_INT || b->kind == JV_BOOL))
            return repeat(r, line, a, ival(b));
        if ((b->kind == JV_STRING || (b->kind == JV_LIST && !b->u.list.gen)) &&
            (a->kind == JV_INT || a->kind == JV_BOOL))
            return repeat(r, line, b, ival(a));
        return type_error2(r, line, opname, a, b);
    case OP_DIV:
        if (!num) return type_error2(r, line, opname, a, b);
        if (jv_num(b) == 0) return jr_fail(r, line, "division by zero");
        return jv_float(jv_num(a) / jv_num(b));
    case OP_FLOORDIV:
    case OP_MOD:
        if (!num) return type_error2(r, line, opname, a, b);
        if (jv_num(b) == 0)
            return jr_fail(r, line, op == OP_MOD ? "modulo by zero" : "division by zero");
        if (ints) {
            int64_t x = ival(a), y = ival(b);
            if (x == INT64_MIN && y == -1) {
                if (op == OP_MOD) return jv_int(0);
                return jr_fail(r, line, "integer overflow");
            }
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
                q--;
                m += y;
            }
            return jv_int(op == OP_MOD ? m : q);
        }
        if (op == OP_MOD) return jv_float(py_fmod(jv_num(a), jv_num(b)));
        return jv_float(py_floordiv(jv_num(a), jv_num(b)));
    case OP_POW:
        if (!num) return type_error2(r, line, opname, a, b);
        if (ints && ival(b) >= 0) {
            int64_t base = ival(a), e = ival(b), res = 1;
            while (e > 0) {
                if (e & 1) {
                    if (__builtin_mul_overflow(res, base, &res))
                        return jr_fail(r, line, "integer overflow");
                }
                e >>= 1;
                if (e && __builtin_mul_overflow(base, base, &base))
                    return jr_fail(r, line, "integer overflow");
            }
            return jv_int(res);
        }
        if (jv_num(a) == 0 && jv_num(b) < 0)
            return jr_fail(r, line, "0.0 cannot be raised to a negative power");
        {
            double x = jv_num(a), y = jv_num(b), p = pow(x, y);
            if (isinf(p) && !isinf(x) && !isinf(y))
                return jr_fail(r, line, "(34, 'Numerical result out of range')");
            if (p != p && x < 0 && y != floor(y))
                return jr_fail(r, line, "negative number cannot be raised to a fractional power");
            return jv_float(p);
        }
    }
    return jr_fail(r, line, "bad operator");
}

/* `needle in haystack`: 1/0, -1 on error. */

/* The part of v that Python cannot hash (a list, dict or namespace, also inside a tuple), or NULL. */
static const jv *unhashable(const jv *v) {
    if (v->kind == JV_DICT || v->kind == JV_NAMESPACE || (v->kind == JV_LIST && !v->u.list.tuple)) return v;
    if (v->kind == JV_LIST)
        for (size_t i = 0; i < v->u.list.n; i++) {
            const jv *bad = unhashable(v->u.list.items[i]);
            if (bad) return bad;
        }
    return NULL;
}
static int contains(jrender *r, int line, const jv *needle, const jv *hay) {
    switch (hay->kind) {
    case JV_STRING:
        if (needle->kind != JV_STRING)
            return jr_failc(r, line, "'in <string>' requires string as left operand, not %s",
                            jv_type_name(needle));
        if (needle->u.str.len == 0) return 1;
        if (jr_work(r, line, jr_bytes_work(hay->u.str.len))) return -1;
        return memmem(hay->u.str.s, hay->u.str.len, needle->u.str.s, needle->u.str.len) != NULL;
    case JV_LIST:
        for (size_t i = 0; i < hay->u.list.n; i++)
            if (jv_eq(hay->u.list.items[i], needle)) return 1;
        return 0;
    case JV_DICT: {
        const jv *bad = unhashable(needle);
        if (bad) return jr_failc(r, line, "unhashable type: '%s'", jv_type_name(bad));
        return jv_dict_get(hay, needle) != NULL;
    }
    case JV_UNDEFINED:
        return 0;
    default:
        return jr_failc(r, line, "argument of type '%s' is not iterable", jv_type_name(hay));
    }
}

/* Comparison: 1/0, -1 on error. */
static int compare(jrender *r, int line, int op, const jv *a, const jv *b) {
    switch (op) {
    case OP_EQ:
        return jv_eq(a, b);
    case OP_NE:
        return !jv_eq(a, b);
    case OP_IN:
        return contains(r, line, a, b);
    case OP_NOTIN: {
        int c = contains(r, line, a, b);
        return c < 0 ? -1 : !c;
    }
    default:
        break;
    }
    if (a->kind == JV_UNDEFINED) return jr_undefined_error(r, line, a), -1;
    if (b->kind == JV_UNDEFINED) return jr_undefined_error(r, line, b), -1;
    static const char *const names[] = {"<", "<=", ">", ">="};
    int c;
    if (jv_cmp(a, b, &c))
        return jr_failc(r, line, "'%s' not supported between instances of '%s' and '%s'",
                        names[op - OP_LT], jv_type_name(a), jv_type_name(b));
    if (c == 2) return 0; /* NaN */
    switch (op) {
    case OP_LT:
        return c < 0;
    case OP_LE:
        return c <= 0;
    case OP_GT:
        return c > 0;
    default:
        return c >= 0;
    }
}

/* ------------------------------------------------------------------ calls */

static int exec_body(jrender *r, jscope *sc, const jbody *b, jbuf *out);

static jv *render_to_string(jrender *r, int line, jbuf *b) {
    if (b->failed) {
        jbuf_free(b);
        return jr_fail(r, line, b->failed == 2 ? "output longer than the limit (%zu bytes)"
                                                : "out of memory (%zu bytes)",
                       r->lim.max_output);
    }
    size_t len;
    char *s = jbuf_take(b, &len);
    jv *v = jv_str_take(s, len);
    return v ? v : jr_oom(r, line);
}

static jv *call_macro(jrender *r, int line, jv *macro, jv **pos, size_t npos,
                      const char **kwnames, jv **kwvals, size_t nkw) {
    const jstmt *def = macro->u.macro.def;
    if (r->depth >= r->lim.max_depth)
        return jr_fail(r, line, "macro calls nested deeper than %d (endless recursion?)",
                       r->lim.max_depth);
    if (npos > def->nparams && !def->uses_varargs)
        return jr_fail(r, line, "macro '%s' takes not more than %zu argument(s)", def->name,
                       def->nparams);
    jscope *sc = scope_new(macro->u.macro.closure);
    if (!sc) return jr_oom(r, line);
    jv *result = NULL;
    jv *kwargs = NULL;
    unsigned char bound_small[32];
    unsigned char *bound = def->nparams <= sizeof bound_small ? bound_small : calloc(def->nparams, 1);
    if (!bound) goto oom;
    memset(bound, 0, def->nparams < sizeof bound_small ? sizeof bound_small : def->nparams);
    for (size_t i = 0; i < npos && i < def->nparams; i++) {
        if (scope_set(sc, def->params[i], jv_incref(pos[i]))) goto oom;
        bound[i] = 1;
    }
    for (size_t k = 0; k < nkw; k++) {
        size_t i;
        for (i = 0; i < def->nparams; i++)
            if (!strcmp(def->params[i], kwnames[k])) break;
        if (i < def->nparams) {
            if (bound[i]) {
                jr_fail(r, line, "macro '%s' got multiple values for argument '%s'", def->name,
                        kwnames[k]);
                goto done;
            }
            if (scope_set(sc, def->params[i], jv_incref(kwvals[k]))) goto oom;
            bound[i] = 1;
        } else if (def->uses_kwargs) {
            if (!kwargs && !(kwargs = jv_dict())) goto oom;
            if (jv_dict_set(kwargs, jv_cstr(kwnames[k]), jv_incref(kwvals[k]))) goto oom;
        } else {
            jr_fail(r, line, "macro '%s' takes no keyword argument '%s'", def->name, kwnames[k]);
            goto done;
        }
    }
    for (size_t i = 0; i < def->nparams; i++) {
        if (bound[i]) continue;
        jv *v;
        if (def->defaults[i]) {
            v = jr_eval(r, sc, def->defaults[i]);
            if (!v) goto done;
        } else {
            v = jv_undefined_hint("parameter '%s' was not provided", def->params[i]);
        }
        if (scope_set(sc, def->params[i], v)) goto oom;
    }
    if (def->uses_varargs) {
        jv *va = jv_list(0);
        if (!va) goto oom;
        va->u.list.tuple = 1;
        for (size_t i = def->nparams; i < npos; i++)
            if (jv_list_push(va, jv_incref(pos[i]))) {
                jv_decref(va);
                goto oom;
            }
        if (scope_set(sc, "varargs", va)) goto oom;
    }
    if (def->uses_kwargs) {
        if (!kwargs && !(kwargs = jv_dict())) goto oom;
        if (scope_set(sc, "kwargs", kwargs)) {
            kwargs = NULL;
            goto oom;
        }
        kwargs = NULL;
    }
    {
        jbuf b = {.limit = r->lim.max_output};
        r->depth++;
        int rc = exec_body(r, sc, &def->body, &b);
        r->depth--;
        if (rc == X_ERR) {
            jbuf_free(&b);
            goto done;
        }
        result = render_to_string(r, line, &b);
    }
    goto done;
oom:
    jr_oom(r, line);
done:
    if (bound && bound != bound_small) free(bound);
    if (kwargs) jv_decref(kwargs);
    scope_exit(sc);
    return result;
}

jv *jr_call(jrender *r, int line, jv *callee, jv **pos, size_t npos, const char **kwnames,
            jv **kwvals, size_t nkw) {
    switch (callee->kind) {
    case JV_MACRO:
        return call_macro(r, line, callee, pos, npos, kwnames, kwvals, nkw);
    case JV_FUNC:
        return jb_call_func(r, line, callee->u.func.id, callee->u.func.self, pos, npos, kwnames,
                            kwvals, nkw);
    case JV_UNDEFINED:
        return jr_undefined_error(r, line, callee);
    default:
        return jr_fail(r, line, "'%s' object is not callable", jv_type_name(callee));
    }
}

typedef struct {
    jv *pos_small[8];
    jv *kw_small[8];
    jv **pos, **kw;
    size_t npos, nkw;
} evargs;

static void evargs_free(evargs *a) {
    for (size_t i = 0; i < a->npos; i++) jv_decref(a->pos[i]);
    for (size_t i = 0; i < a->nkw; i++) jv_decref(a->kw[i]);
    if (a->pos && a->pos != a->pos_small) free(a->pos);
    if (a->kw && a->kw != a->kw_small) free(a->kw);
}

static int eval_args(jrender *r, jscope *sc, const jargs *args, evargs *out, int line) {
    memset(out, 0, sizeof *out);
    out->pos = args->npos <= 8 ? out->pos_small : malloc(args->npos * sizeof(jv *));
    out->kw = args->nkw <= 8 ? out->kw_small : malloc(args->nkw * sizeof(jv *));
    if (!out->pos || !out->kw) {
        evargs_free(out);
        return jr_oom(r, line), -1;
    }
    for (size_t i = 0; i < args->npos; i++) {
        jv *v = jr_eval(r, sc, args->pos[i]);
        if (!v) {
            evargs_free(out);
            return -1;
        }
        out->pos[out->npos++] = v;
    }
    for (size_t i = 0; i < args->nkw; i++) {
        jv *v = jr_eval(r, sc, args->kwvals[i]);
        if (!v) {
            evargs_free(out);
            return -1;
        }
        out->kw[out->nkw++] = v;
    }
    return 0;
}

/* ------------------------------------------------------------ expressions */

static jv *global_value(jrender *r, const char *name) {
    int id = jb_global_id(name);
    if (id) return jv_func(id, NULL);
    (void)r;
    return jv_undefined_hint("'%s' is undefined", name);
}

static jv *eval_inner(jrender *r, jscope *sc, const jexpr *e) {
    int line = e->line;
    switch (e->kind) {
    case E_CONST:
        return jv_incref(e->value);
    case E_NAME: {
        jv *v = scope_lookup(sc, e->name);
        return v ? jv_incref(v) : global_value(r, e->name);
    }
    case E_INPUT:
        return r->input ? jv_incref(r->input) : jv_undefined();
    case E_LIST:
    case E_TUPLE: {
        jv *l = jv_list(e->n);
        if (!l) return jr_oom(r, line);
        l->u.list.tuple = e->kind == E_TUPLE;
        for (size_t i = 0; i < e->n; i++) {
            jv *v = jr_eval(r, sc, e->items[i]);
            if (!v || jv_list_push(l, v)) {
                jv_decref(l);
                return v ? jr_oom(r, line) : NULL;
            }
        }
        return l;
    }
    case E_DICT: {
        jv *d = jv_dict();
        if (!d) return jr_oom(r, line);
        for (size_t i = 0; i < e->n; i++) {
            jv *k = jr_eval(r, sc, e->items[2 * i]);
            if (!k) {
                jv_decref(d);
                return NULL;
            }
            const jv *bad = unhashable(k);
            if (bad || k->kind == JV_UNDEFINED) {
                jv_decref(d);
                if (bad)
                    jr_fail(r, line, "unhashable type: '%s'", jv_type_name(bad));
                else
                    jr_fail(r, line, "dictionary key is undefined");
                jv_decref(k);
                return NULL;
            }
            jv *v = jr_eval(r, sc, e->items[2 * i + 1]);
            if (!v) {
                jv_decref(k);
                jv_decref(d);
                return NULL;
            }
            if (jv_dict_set(d, k, v)) {
                jv_decref(d);
                return jr_oom(r, line);
            }
        }
        return d;
    }
    case E_GETATTR: {
        jv *obj = jr_eval(r, sc, e->a);
        if (!obj) return NULL;
        jv *v = jr_getattr(r, line, obj, e->name, strlen(e->name));
        jv_decref(obj);
        return v;
    }
    case E_GETITEM: {
        jv *obj = jr_eval(r, sc, e->a);
        if (!obj) return NULL;
        jv *key = jr_eval(r, sc, e->b);
        if (!key) {
            jv_decref(obj);
            return NULL;
        }
        jv *v = obj->kind == JV_UNDEFINED ? jr_undefined_error(r, line, obj)
                                          : jr_getitem(r, line, obj, key);
        jv_decref(obj);
        jv_decref(key);
        return v;
    }
    case E_SLICE: {
        jv *obj = jr_eval(r, sc, e->a);
        if (!obj) return NULL;
        jv *parts[3] = {NULL, NULL, NULL};
        const jexpr *pe[3] = {e->b, e->c, e->items[0]};
        jv *v = NULL;
        for (int k = 0; k < 3; k++)
            if (pe[k] && !(parts[k] = jr_eval(r, sc, pe[k]))) goto slice_done;
        if (obj->kind == JV_UNDEFINED)
            v = jr_undefined_error(r, line, obj);
        else
            v = do_slice(r, line, obj, parts[0], parts[1], parts[2]);
    slice_done:
        for (int k = 0; k < 3; k++)
            if (parts[k]) jv_decref(parts[k]);
        jv_decref(obj);
        return v;
    }
    case E_CALL: {
        jv *callee;
        if (e->a->kind == E_GETATTR) {
            /* obj.method(...): look the method up without making a bound method first */
            jv *obj = jr_eval(r, sc, e->a->a);
            if (!obj) return NULL;
            int id = obj->kind == JV_UNDEFINED || obj->kind == JV_NAMESPACE
                         ? 0
                         : jb_method_id(obj, e->a->name, strlen(e->a->name));
            if (id) {
                evargs a;
                if (eval_args(r, sc, &e->args, &a, line)) {
                    jv_decref(obj);
                    return NULL;
                }
                jv *v = jb_call_func(r, line, id, obj, a.pos, a.npos, e->args.kwnames, a.kw,
                                     a.nkw);
                evargs_free(&a);
                jv_decref(obj);
                return v;
            }
            callee = jr_getattr(r, e->a->line, obj, e->a->name, strlen(e->a->name));
            jv_decref(obj);
        } else {
            callee = jr_eval(r, sc, e->a);
        }
        if (!callee) return NULL;
        evargs a;
        if (eval_args(r, sc, &e->args, &a, line)) {
            jv_decref(callee);
            return NULL;
        }
        jv *v = jr_call(r, line, callee, a.pos, a.npos, e->args.kwnames, a.kw, a.nkw);
        evargs_free(&a);
        jv_decref(callee);
        return v;
    }
    case E_FILTER: {
        jv *val = jr_eval(r, sc, e->a);
        if (!val) return NULL;
        evargs a;
        if (eval_args(r, sc, &e->args, &a, line)) {
            jv_decref(val);
            return NULL;
        }
        jv *v = jb_filter(r, line, e->name, val, a.pos, a.npos, e->args.kwnames, a.kw, a.nkw);
        evargs_free(&a);
        jv_decref(val);
        return v;
    }
    case E_TEST: {
        jv *val = jr_eval(r, sc, e->a);
        if (!val) return NULL;
        evargs a;
        if (eval_args(r, sc, &e->args, &a, line)) {
            jv_decref(val);
            return NULL;
        }
        int t = jb_test(r, line, e->name, val, a.pos, a.npos, e->args.kwnames, a.kw, a.nkw);
        evargs_free(&a);
        jv_decref(val);
        if (t < 0) return NULL;
        return jv_bool(e->negated ? !t : t);
    }
    case E_NOT: {
        jv *v = jr_eval(r, sc, e->a);
        if (!v) return NULL;
        int t = jv_truthy(v);
        jv_decref(v);
        return jv_bool(!t);
    }
    case E_NEG:
    case E_POS: {
        jv *v = jr_eval(r, sc, e->a);
        if (!v) return NULL;
        jv *res;
        if (v->kind == JV_UNDEFINED)
            res = jr_undefined_error(r, line, v);
        else if (!jv_is_number(v))
            res = jr_fail(r, line, "bad operand type for unary %c: '%s'",
                          e->kind == E_NEG ? '-' : '+', jv_type_name(v));
        else if (v->kind == JV_FLOAT)
            res = jv_float(e->kind == E_NEG ? -v->u.f : v->u.f);
        else if (e->kind == E_NEG && ival(v) == INT64_MIN)
            res = jr_fail(r, line, "integer overflow");
        else
            res = jv_int(e->kind == E_NEG ? -ival(v) : ival(v));
        jv_decref(v);
        return res;
    }
    case E_BIN: {
        jv *a = jr_eval(r, sc, e->a);
        if (!a) return NULL;
        jv *b = jr_eval(r, sc, e->b);
        if (!b) {
            jv_decref(a);
            return NULL;
        }
        jv *v = binop(r, line, e->op, a, b);
        jv_decref(a);
        jv_decref(b);
        return v;
    }
    case E_AND:
    case E_OR: {
        jv *a = jr_eval(r, sc, e->a);
        if (!a) return NULL;
        int t = jv_truthy(a);
        if (e->kind == E_AND ? !t : t) return a;
        jv_decref(a);
        return jr_eval(r, sc, e->b);
    }
    case E_COMPARE: {
        jv *left = jr_eval(r, sc, e->items[0]);
        if (!left) return NULL;
        for (size_t i = 1; i < e->n; i++) {
            jv *right = jr_eval(r, sc, e->items[i]);
            if (!right) {
                jv_decref(left);
                return NULL;
            }
            int c = compare(r, line, e->ops[i - 1], left, right);
            jv_decref(left);
            left = right;
            if (c <= 0) {
                jv_decref(left);
                return c < 0 ? NULL : jv_bool(0);
            }
        }
        jv_decref(left);
        return jv_bool(1);
    }
    case E_COND: {
        jv *c = jr_eval(r, sc, e->b);
        if (!c) return NULL;
        int t = jv_truthy(c);
        jv_decref(c);
        if (t) return jr_eval(r, sc, e->a);
        if (e->c) return jr_eval(r, sc, e->c);
        return jv_undefined_hint("the inline if-expression on line %d evaluated to false and no "
                                 "else section was defined.",
                                 line);
    }
    case E_CONCAT: {
        jbuf b = {.limit = r->lim.max_output};
        for (size_t i = 0; i < e->n; i++) {
            jv *v = jr_eval(r, sc, e->items[i]);
            if (!v) {
                jbuf_free(&b);
                return NULL;
            }
            jv_write_str(v, &b);
            jv_decref(v);
        }
        return render_to_string(r, line, &b);
    }
    }
    return jr_fail(r, line, "internal error: unknown expression");
}

jv *jr_eval(jrender *r, jscope *sc, const jexpr *e) {
    if (step(r, e->line) || jr_enter(r, e->line)) return NULL;
    jv *v = eval_inner(r, sc, e);
    jr_leave(r);
    if (!v && !error_set(r)) jr_oom(r, e->line);
    return v;
}

/* ------------------------------------------------------------- statements */

static int bind_target(jrender *r, jscope *sc, const jtarget *t, jv *val /* borrowed */) {
    if (t->kind == TG_NAME) {
        if (scope_set(sc, t->name, jv_incref(val))) return jr_oom(r, t->line), -1;
        return 0;
    }
    if (t->kind == TG_ATTR) {
        jv *ns = scope_lookup(sc, t->name);
        if (!ns || ns->kind != JV_NAMESPACE)
            return jr_failc(r, t->line, "cannot assign attribute on non-namespace object '%s'",
                            t->name);
        if (jv_dict_set(ns, jv_cstr(t->attr), jv_incref(val))) return jr_oom(r, t->line), -1;
        return 0;
    }
    if (val->kind == JV_UNDEFINED) return jr_undefined_error(r, t->line, val), -1;
    jv *items = jr_iterate(r, t->line, val);
    if (!items) return -1;
    int rc = 0;
    if (items->u.list.n != t->n) {
        rc = jr_failc(r, t->line, items->u.list.n > t->n
                                      ? "too many values to unpack (expected %zu)"
                                      : "not enough values to unpack (expected %zu)",
                      t->n);
    } else {
        for (size_t i = 0; i < t->n && rc == 0; i++)
            rc = bind_target(r, sc, &t->items[i], items->u.list.items[i]);
    }
    jv_decref(items);
    return rc;
}

static int write_value(jrender *r, int line, jbuf *out, const jv *v) {
    jv_write_str(v, out);
    if (out->failed)
        return jr_failc(r, line, out->failed == 2 ? "output longer than the limit (%zu bytes)"
                                                   : "out of memory (%zu bytes)",
                        r->lim.max_output);
    return 0;
}

/* Renders a body in a new scope to a string.  A break / continue inside it (the body is part
 * of an enclosing loop, as in jinja2) leaves *ctl set and returns NULL without an error. */
static jv *capture(jrender *r, jscope *sc, const jbody *body, int line, int *ctl) {
    *ctl = X_OK;
    jscope *inner = scope_new(sc);
    if (!inner) return jr_oom(r, line);
    jbuf b = {.limit = r->lim.max_output};
    int rc = exec_body(r, inner, body, &b);
    scope_exit(inner);
    if (rc != X_OK) {
        jbuf_free(&b);
        *ctl = rc;
        return NULL;
    }
    return render_to_string(r, line, &b);
}

static jv *apply_block_filter(jrender *r, jscope *sc, const jexpr *filter, jv *input) {
    jv *saved = r->input;
    r->input = input;
    jv *v = jr_eval(r, sc, filter);
    r->input = saved;
    return v;
}

static int exec_for(jrender *r, jscope *sc, const jstmt *s, jbuf *out) {
    jv *iterable = jr_eval(r, sc, s->expr);
    if (!iterable) return X_ERR;
    if (iterable->kind == JV_NONE || !(iterable->kind == JV_LIST || iterable->kind == JV_DICT ||
                                       iterable->kind == JV_STRING ||
                                       iterable->kind == JV_UNDEFINED)) {
        jr_fail(r, s->line, "'%s' object is not iterable", jv_type_name(iterable));
        jv_decref(iterable);
        return X_ERR;
    }
    jv *items = jr_iterate(r, s->line, iterable);
    jv_decref(iterable);
    if (!items) return X_ERR;
    if (s->cond) { /* for x in xs if cond */
        jv *kept = jv_list(0);
        if (!kept) {
            jv_decref(items);
            return jr_oom(r, s->line), X_ERR;
        }
        for (size_t i = 0; i < items->u.list.n; i++) {
            if (step(r, s->line)) {
                jv_decref(items);
                jv_decref(kept);
                return X_ERR;
            }
            jscope *tmp = scope_new(sc);
            if (!tmp) {
                jv_decref(items);
                jv_decref(kept);
                return jr_oom(r, s->line), X_ERR;
            }
            int rc = bind_target(r, tmp, &s->target, items->u.list.items[i]);
            jv *c = rc ? NULL : jr_eval(r, tmp, s->cond);
            scope_exit(tmp);
            if (!c) {
                jv_decref(items);
                jv_decref(kept);
                return X_ERR;
            }
            int t = jv_truthy(c);
            jv_decref(c);
            if (t && jv_list_push(kept, jv_incref(items->u.list.items[i]))) {
                jv_decref(items);
                jv_decref(kept);
                return jr_oom(r, s->line), X_ERR;
            }
        }
        jv_decref(items);
        items = kept;
    }
    size_t n = items->u.list.n;
    int result = X_OK, completed = 0; /* an iteration ran to the end of the body */
    for (size_t i = 0; i < n; i++) {
        if (step(r, s->line)) {
            result = X_ERR;
            break;
        }
        jscope *inner = scope_new(sc);
        jv *loop = jv_loop(items, i);
        if (!inner || !loop) {
            if (loop) jv_decref(loop);
            scope_exit(inner);
            result = X_ERR;
            jr_oom(r, s->line);
            break;
        }
        int rc = bind_target(r, inner, &s->target, items->u.list.items[i]);
        if (rc == 0) {
            if (scope_set(inner, "loop", loop)) { /* scope_set dropped loop */
                jr_oom(r, s->line);
                rc = X_ERR;
            }
        } else {
            jv_decref(loop);
        }
        if (rc == 0) rc = exec_body(r, inner, &s->body, out);
        scope_exit(inner);
        if (rc == X_ERR) {
            result = X_ERR;
            break;
        }
        if (rc == X_OK) completed = 1;
        if (rc == X_BREAK) break;
    }
    jv_decref(items);
    /* jinja2 clears its "run the else block" flag at the end of the body, so the else block runs
     * when no iteration got there: no items, or each one left by break or continue.  It runs
     * after the loop, so a break or continue in it is the enclosing loop's. */
    if (result == X_OK && !completed && s->else_body.n) {
        jscope *inner = scope_new(sc);
        if (!inner) return jr_oom(r, s->line), X_ERR;
        result = exec_body(r, inner, &s->else_body, out);
        scope_exit(inner);
    }
    return result;
}

static int exec_stmt_inner(jrender *r, jscope *sc, const jstmt *s, jbuf *out);

static int exec_stmt(jrender *r, jscope *sc, const jstmt *s, jbuf *out) {
    if (step(r, s->line) || jr_enter(r, s->line)) return X_ERR;
    int rc = exec_stmt_inner(r, sc, s, out);
    jr_leave(r);
    return rc;
}

static int exec_stmt_inner(jrender *r, jscope *sc, const jstmt *s, jbuf *out) {
    switch (s->kind) {
    case S_TEXT:
        jbuf_put(out, s->text, s->text_len);
        if (out->failed)
            return jr_failc(r, s->line, "output longer than the limit (%zu bytes)",
                            r->lim.max_output);
        return X_OK;
    case S_OUTPUT: {
        jv *v = jr_eval(r, sc, s->expr);
        if (!v) return X_ERR;
        int rc = write_value(r, s->line, out, v);
        jv_decref(v);
        return rc ? X_ERR : X_OK;
    }
    case S_IF: {
        jv *c = jr_eval(r, sc, s->expr);
        if (!c) return X_ERR;
        int t = jv_truthy(c);
        jv_decref(c);
        return exec_body(r, sc, t ? &s->body : &s->else_body, out);
    }
    case S_FOR:
        return exec_for(r, sc, s, out);
    case S_SET: {
        jv *v = jr_eval(r, sc, s->expr);
        if (!v) return X_ERR;
        int rc = bind_target(r, sc, &s->target, v);
        jv_decref(v);
        return rc ? X_ERR : X_OK;
    }
    case S_SET_BLOCK: {
        int ctl;
        jv *v = capture(r, sc, &s->body, s->line, &ctl);
        if (!v) return ctl == X_OK ? X_ERR : ctl;
        if (s->filter) {
            jv *f = apply_block_filter(r, sc, s->filter, v);
            jv_decref(v);
            if (!f) return X_ERR;
            v = f;
        }
        int rc = bind_target(r, sc, &s->target, v);
        jv_decref(v);
        return rc ? X_ERR : X_OK;
    }
    case S_FILTER_BLOCK: {
        int ctl;
        jv *v = capture(r, sc, &s->body, s->line, &ctl);
        if (!v) return ctl == X_OK ? X_ERR : ctl;
        jv *f = apply_block_filter(r, sc, s->filter, v);
        jv_decref(v);
        if (!f) return X_ERR;
        int rc = write_value(r, s->line, out, f);
        jv_decref(f);
        return rc ? X_ERR : X_OK;
    }
    case S_MACRO: {
        jv *m = jv_new(JV_MACRO);
        if (!m) return jr_oom(r, s->line), X_ERR;
        m->u.macro.def = s;
        m->u.macro.closure = sc;
        sc->refs++;
        if (scope_set(sc, s->name, m)) return jr_oom(r, s->line), X_ERR;
        return X_OK;
    }
    case S_WITH: {
        jv *vals_small[8];
        jv **vals = s->nvalues <= 8 ? vals_small : calloc(s->nvalues, sizeof *vals);
        if (!vals) return jr_oom(r, s->line), X_ERR;
        size_t got = 0;
        int rc = X_OK;
        for (; got < s->nvalues; got++) {
            vals[got] = jr_eval(r, sc, s->values[got]);
            if (!vals[got]) {
                rc = X_ERR;
                break;
            }
        }
        jscope *inner = rc == X_OK ? scope_new(sc) : NULL;
        if (rc == X_OK && !inner) rc = (jr_oom(r, s->line), X_ERR);
        for (size_t i = 0; rc == X_OK && i < s->nvalues; i++)
            if (bind_target(r, inner, &s->targets[i], vals[i])) rc = X_ERR;
        if (rc == X_OK) rc = exec_body(r, inner, &s->body, out);
        scope_exit(inner);
        for (size_t i = 0; i < got; i++) jv_decref(vals[i]);
        if (vals != vals_small) free(vals);
        return rc;
    }
    case S_BLOCK:
        return exec_body(r, sc, &s->body, out);
    case S_BREAK:
        return X_BREAK;
    case S_CONTINUE:
        return X_CONTINUE;
    }
    return jr_failc(r, s->line, "internal error: unknown statement");
}

static int exec_body(jrender *r, jscope *sc, const jbody *b, jbuf *out) {
    for (size_t i = 0; i < b->n; i++) {
        int rc = exec_stmt(r, sc, b->items[i], out);
        if (rc != X_OK) return rc;
    }
    return X_OK;
}

/* ------------------------------------------------------------------- API */

int g4_jinja_parse(const char *source, size_t len, g4_jinja **out, g4_error *err) {
    *out = NULL;
    g4_jinja *tpl = calloc(1, sizeof *tpl);
    if (!tpl) return g4_fail(err, "template: out of memory");
    jtokens toks = {0};
    int rc = jinja_lex(source, len, &tpl->arena, &toks, err);
    if (rc == 0) rc = jinja_parse_tokens(tpl, &toks, err);
    free(toks.items);
    if (rc) {
        g4_jinja_free(tpl);
        return -1;
    }
    *out = tpl;
    return 0;
}

void g4_jinja_free(g4_jinja *tpl) {
    if (!tpl) return;
    for (size_t i = 0; i < tpl->nconsts; i++) jv_free_immortal(tpl->consts[i]);
    free(tpl->consts);
    jarena_free(&tpl->arena);
    free(tpl);
}

int g4_jinja_render(const g4_jinja *tpl, const json_t *context, char **out, size_t *len,
                    g4_error *err) {
    return g4_jinja_render_ex(tpl, context, NULL, out, len, err);
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The members of the context object, as a sorted scope. */
static int load_context(jrender *r, jscope *ctx, const json_t *context) {
    size_t n = json_object_size(context);
    const char **keys = calloc(n ? n : 1, sizeof *keys);
    ctx->names = calloc(n ? n : 1, sizeof *ctx->names);
    ctx->vals = calloc(n ? n : 1, sizeof *ctx->vals);
    if (!keys || !ctx->names || !ctx->vals) {
        free(keys);
        return g4_fail(r->err, "template context: out of memory");
    }
    ctx->cap = n;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)context, key, val) keys[ctx->n++] = key;
    qsort(keys, ctx->n, sizeof *keys, cmp_name);
    int rc = 0;
    for (size_t i = 0; i < ctx->n && rc == 0; i++) {
        ctx->names[i] = keys[i];
        ctx->vals[i] = jv_from_json(json_object_get(context, keys[i]), 0);
        if (!ctx->vals[i]) {
            ctx->n = i; /* the scope holds what was converted */
            char msg[300] = "out of memory";
            if (r->budget.fault) fault_message(r, msg, sizeof msg);
            rc = g4_fail(r->err, "template context: '%.60s': %s", keys[i], msg);
        }
    }
    free(keys);
    ctx->sorted = 1;
    return rc;
}

int g4_jinja_render_ex(const g4_jinja *tpl, const json_t *context, const g4_jinja_limits *limits,
                       char **out, size_t *len, g4_error *err) {
    *out = NULL;
    if (len) *len = 0;
    if (context && !json_is_object(context))
        return g4_fail(err, "template context must be a JSON object");
    g4_error local;
    if (!err) err = &local;
    err->msg[0] = 0;
    jrender r = {.tpl = tpl, .err = err};
    r.lim.max_output = limits && limits->max_output ? limits->max_output : DEFAULT_MAX_OUTPUT;
    r.lim.max_steps = limits && limits->max_steps ? limits->max_steps : DEFAULT_MAX_STEPS;
    r.lim.max_depth = limits && limits->max_depth > 0 ? limits->max_depth : DEFAULT_MAX_DEPTH;
    r.lim.max_memory = limits && limits->max_memory ? limits->max_memory : DEFAULT_MAX_MEMORY;
    r.budget.max_steps = r.lim.max_steps;
    r.budget.max_mem = r.lim.max_memory;
    jbudget *saved_budget = jv_budget;
    jv_budget = &r.budget;

    int rc = X_OK;
    jscope *ctx = scope_new(NULL);
    jscope *root = ctx ? scope_new(ctx) : NULL;
    if (!root) rc = g4_fail(err, "template: out of memory");
    if (rc == X_OK && context && load_context(&r, ctx, context)) rc = X_ERR;
    jbuf buf = {.limit = r.lim.max_output};
    if (rc == X_OK) rc = exec_body(&r, root, &tpl->root, &buf);
    if (rc != X_ERR && r.budget.fault) rc = jr_failc(&r, r.line, "budget"); /* a builtin gave up */
    scope_exit(root);
    scope_exit(ctx);
    for (size_t i = 0; i < r.nns; i++) { /* break cycles through namespaces */
        jv *ns = r.namespaces[i];
        for (size_t k = 0; k < ns->u.dict.n; k++) {
            jv_decref(ns->u.dict.keys[k]);
            jv_decref(ns->u.dict.vals[k]);
        }
        ns->u.dict.n = 0;
        jv_decref(ns);
    }
    free(r.namespaces);
    if (rc != X_OK) jbuf_free(&buf);
    char *s = rc == X_OK ? jbuf_take(&buf, len) : NULL;
    jv_budget = saved_budget;
    if (rc != X_OK) {
        if (!err->msg[0]) g4_fail(err, "template: render failed");
        return -1;
    }
    if (!s) return g4_fail(err, "template: out of memory");
    *out = s;
    return 0;
}
