/* Values of the Jinja interpreter, printed and compared the way Python does. */
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wctype.h>

#include "jinja/jinja_internal.h"

/* ----------------------------------------------------------------- budget */

_Thread_local jbudget *jv_budget;

#define ALLOC_OVERHEAD 16 /* what malloc adds to a block, roughly */

int jv_fault(int fault) {
    jbudget *b = jv_budget;
    if (b && !b->fault) b->fault = fault;
    return -1;
}

int jv_charge(size_t bytes) {
    jbudget *b = jv_budget;
    if (!b) return 0;
    if (b->fault) return -1;
    if (bytes > b->max_mem - b->mem) return jv_fault(JF_MEMORY);
    b->mem += bytes;
    return 0;
}

void jv_refund(size_t bytes) {
    jbudget *b = jv_budget;
    if (b) b->mem = bytes < b->mem ? b->mem - bytes : 0;
}

int jv_work(uint64_t steps) {
    jbudget *b = jv_budget;
    if (!b) return 0;
    if (b->fault) return -1;
    if (steps > b->max_steps - b->steps) {
        b->steps = b->max_steps;
        return jv_fault(JF_STEPS);
    }
    b->steps += steps;
    return 0;
}

/* ------------------------------------------------------------------ arena */

struct jarena_block {
    jarena_block *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

void *jarena_alloc(jarena *a, size_t size) {
    size = (size + 15) & ~(size_t)15;
    if (size == 0) size = 16;
    jarena_block *b = a->head;
    if (!b || b->cap - b->used < size) {
        size_t cap = size > 16384 ? size : 16384;
        b = malloc(sizeof *b + cap);
        if (!b) return NULL;
        b->next = a->head;
        b->used = 0;
        b->cap = cap;
        a->head = b;
    }
    void *p = b->data + b->used;
    b->used += size;
    memset(p, 0, size);
    return p;
}

char *jarena_strndup(jarena *a, const char *s, size_t len) {
    char *p = jarena_alloc(a, len + 1);
    if (!p) return NULL;
    if (len) memcpy(p, s, len);
    p[len] = 0;
    return p;
}

void jarena_free(jarena *a) {
    jarena_block *b = a->head;
    while (b) {
        jarena_block *next = b->next;
        free(b);
        b = next;
    }
    a->head = NULL;
}

/* ------------------------------------------------------------ byte buffer */

static int jbuf_reserve(jbuf *b, size_t extra) {
    if (b->failed) return -1;
    if ((b->limit && (extra > b->limit || b->len > b->limit - extra)) || extra > SIZE_MAX / 4 ||
        b->len > SIZE_MAX / 4 - extra) {
        b->failed = 2;
        return -1;
    }
    if (jv_work((b->len + extra) / 16 - b->len / 16)) { /* the bytes written are the work */
        b->failed = 1;
        return -1;
    }
    if (b->len + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) cap *= 2;
    if (jv_charge(cap - b->cap)) {
        b->failed = 1;
        return -1;
    }
    char *p = realloc(b->p, cap);
    if (!p) {
        jv_refund(cap - b->cap);
        b->failed = 1;
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

void jbuf_put(jbuf *b, const char *s, size_t n) {
    if (n == 0 || jbuf_reserve(b, n)) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void jbuf_puts(jbuf *b, const char *s) { jbuf_put(b, s, strlen(s)); }

void jbuf_putc(jbuf *b, char c) { jbuf_put(b, &c, 1); }

void jbuf_printf(jbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        jbuf_put(b, tmp, (size_t)n);
        return;
    }
    if (jbuf_reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void jbuf_free(jbuf *b) {
    free(b->p);
    jv_refund(b->cap);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* The buffer leaves the budget: a string value made of it charges its own length. */
char *jbuf_take(jbuf *b, size_t *len) {
    if (!b->p) {
        b->p = malloc(1);
        if (!b->p) return NULL;
        b->p[0] = 0;
    }
    jv_refund(b->cap);
    char *p = b->p;
    if (len) *len = b->len;
    b->p = NULL;
    b->len = b->cap = 0;
    return p;
}

/* ----------------------------------------------------------------- UTF-8 */

size_t ju8_next(const char *str, size_t n, uint32_t *cp) {
    const unsigned char *s = (const unsigned char *)str;
    if (n == 0) {
        *cp = 0;
        return 0;
    }
    unsigned c = s[0];
    size_t need;
    uint32_t v;
    if (c < 0x80) {
        *cp = c;
        return 1;
    } else if (c >= 0xC2 && c < 0xE0) {
        need = 1;
        v = c & 0x1F;
    } else if (c >= 0xE0 && c < 0xF0) {
        need = 2;
        v = c & 0x0F;
    } else if (c >= 0xF0 && c < 0xF5) {
        need = 3;
        v = c & 0x07;
    } else {
        *cp = 0xFFFD;
        return 1;
    }
    if (n < need + 1) {
        *cp = 0xFFFD;
        return 1;
    }
    for (size_t k = 1; k <= need; k++) {
        if ((s[k] & 0xC0) != 0x80) {
            *cp = 0xFFFD;
            return 1;
        }
        v = (v << 6) | (s[k] & 0x3F);
    }
    if ((need == 2 && v < 0x800) || (need == 3 && (v < 0x10000 || v > 0x10FFFF))) {
        *cp = 0xFFFD;
        return 1;
    }
    *cp = v;
    return need + 1;
}

size_t ju8_count(const char *s, size_t n) {
    size_t count = 0, i = 0;
    jv_work(jr_bytes_work(n)); /* a fault stops the render at its next step */
    while (i < n) {
        uint32_t cp;
        i += ju8_next(s + i, n - i, &cp);
        count++;
    }
    return count;
}

size_t ju8_offset(const char *s, size_t n, size_t idx) {
    size_t i = 0;
    while (idx > 0 && i < n) {
        uint32_t cp;
        i += ju8_next(s + i, n - i, &cp);
        idx--;
    }
    jv_work(jr_bytes_work(i));
    return i;
}

void ju8_put(jbuf *b, uint32_t cp) {
    char t[4];
    if (cp < 0x80) {
        t[0] = (char)cp;
        jbuf_put(b, t, 1);
    } else if (cp < 0x800) {
        t[0] = (char)(0xC0 | (cp >> 6));
        t[1] = (char)(0x80 | (cp & 0x3F));
        jbuf_put(b, t, 2);
    } else if (cp < 0x10000) {
        t[0] = (char)(0xE0 | (cp >> 12));
        t[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        t[2] = (char)(0x80 | (cp & 0x3F));
        jbuf_put(b, t, 3);
    } else {
        t[0] = (char)(0xF0 | (cp >> 18));
        t[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        t[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        t[3] = (char)(0x80 | (cp & 0x3F));
        jbuf_put(b, t, 4);
    }
}

int ju_isspace(uint32_t cp) {
    if (cp < 0x80) return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20);
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

size_t ju8_lspace(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = ju8_next(s + i, n - i, &cp);
        if (!ju_isspace(cp)) break;
        i += k;
    }
    return i;
}

size_t ju8_rspace(const char *s, size_t n) {
    size_t end = n;
    while (end > 0) {
        /* step back to the start of the previous code point */
        size_t start = end - 1;
        while (start > 0 && end - start < 4 && ((unsigned char)s[start] & 0xC0) == 0x80) start--;
        uint32_t cp;
        size_t k = ju8_next(s + start, end - start, &cp);
        if (start + k != end) { /* not a whole code point: treat the last byte alone */
            start = end - 1;
            ju8_next(s + start, 1, &cp);
        }
        if (!ju_isspace(cp)) break;
        end = start;
    }
    return n - end;
}

static pthread_once_t utf8_locale_once = PTHREAD_ONCE_INIT;
static locale_t utf8_locale = (locale_t)0;

static void utf8_locale_init(void) {
    utf8_locale = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
}

uint32_t ju_upper(uint32_t cp) {
    if (cp < 0x80) return (cp >= 'a' && cp <= 'z') ? cp - 32 : cp;
    pthread_once(&utf8_locale_once, utf8_locale_init);
    if (!utf8_locale) return cp;
    return (uint32_t)towupper_l((wint_t)cp, utf8_locale);
}

int ju_isalpha(uint32_t cp) {
    if (cp < 0x80) return (cp | 32) >= 'a' && (cp | 32) <= 'z';
    pthread_once(&utf8_locale_once, utf8_locale_init);
    return utf8_locale ? iswalpha_l((wint_t)cp, utf8_locale) != 0 : 0;
}

int ju_isdigit(uint32_t cp) {
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    pthread_once(&utf8_locale_once, utf8_locale_init);
    return utf8_locale ? iswdigit_l((wint_t)cp, utf8_locale) != 0 : 0;
}

uint32_t ju_lower(uint32_t cp) {
    if (cp < 0x80) return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
    pthread_once(&utf8_locale_once, utf8_locale_init);
    if (!utf8_locale) return cp;
    return (uint32_t)towlower_l((wint_t)cp, utf8_locale);
}

int ju_cased(uint32_t cp) {
    if (cp < 0x80) return (cp >= 'A' && cp <= 'Z') || (cp >= 'a' && cp <= 'z');
    pthread_once(&utf8_locale_once, utf8_locale_init);
    if (!utf8_locale) return 0;
    return iswupper_l((wint_t)cp, utf8_locale) || iswlower_l((wint_t)cp, utf8_locale) || ju_lower(cp) != cp ||
           ju_upper(cp) != cp;
}

int ju_case_kind(uint32_t cp) {
    if (cp < 0x80) return (cp >= 'a' && cp <= 'z') ? 1 : (cp >= 'A' && cp <= 'Z') ? 2 : 0;
    /* Unicode's title case letters (Lt), which the C library counts as upper (and lower) case */
    if (cp == 0x1C5 || cp == 0x1C8 || cp == 0x1CB || cp == 0x1F2 || (cp >= 0x1F88 && cp <= 0x1FAF && (cp & 8)) ||
        cp == 0x1FBC || cp == 0x1FCC || cp == 0x1FFC)
        return 3;
    pthread_once(&utf8_locale_once, utf8_locale_init);
    if (!utf8_locale) return 0;
    if (iswlower_l((wint_t)cp, utf8_locale)) return 1;
    return iswupper_l((wint_t)cp, utf8_locale) ? 2 : 0;
}

int ju_case_ignorable(uint32_t cp) {
    /* Unicode's Case_Ignorable: the word-internal punctuation (' . : and kin), modifier letters and symbols,
     * combining marks and format characters; the ranges that occur in text (not the whole table) */
    static const uint32_t ranges[][2] = {
        {0x27, 0x27},     {0x2E, 0x2E},     {0x3A, 0x3A},     {0x5E, 0x5E},     {0x60, 0x60},     {0xA8, 0xA8},
        {0xAD, 0xAD},     {0xAF, 0xAF},     {0xB4, 0xB4},     {0xB7, 0xB8},     {0x2B0, 0x36F},   {0x374, 0x375},
        {0x37A, 0x37A},   {0x384, 0x385},   {0x387, 0x387},   {0x483, 0x489},   {0x591, 0x5BD},   {0x5BF, 0x5BF},
        {0x5C1, 0x5C2},   {0x5C4, 0x5C5},   {0x5C7, 0x5C7},   {0x5F4, 0x5F4},   {0x600, 0x605},   {0x610, 0x61A},
        {0x61C, 0x61C},   {0x640, 0x640},   {0x64B, 0x65F},   {0x670, 0x670},   {0x1AB0, 0x1AFF}, {0x1DC0, 0x1DFF},
        {0x1FBD, 0x1FBD}, {0x1FBF, 0x1FC1}, {0x1FCD, 0x1FCF}, {0x1FDD, 0x1FDF}, {0x1FED, 0x1FEF}, {0x1FFD, 0x1FFE},
        {0x200B, 0x200F}, {0x2018, 0x2019}, {0x2024, 0x2024}, {0x2027, 0x2027}, {0x202A, 0x202E}, {0x2060, 0x2064},
        {0x2066, 0x206F}, {0x2071, 0x2071}, {0x207F, 0x207F}, {0x2090, 0x209C}, {0x20D0, 0x20F0}, {0xFE00, 0xFE0F},
        {0xFE13, 0xFE13}, {0xFE20, 0xFE2F}, {0xFE52, 0xFE52}, {0xFE55, 0xFE55}, {0xFEFF, 0xFEFF}, {0xFF07, 0xFF07},
        {0xFF0E, 0xFF0E}, {0xFF1A, 0xFF1A}, {0xFF3E, 0xFF3E}, {0xFF40, 0xFF40}, {0xE0001, 0xE0001},
        {0xE0020, 0xE007F}, {0xE0100, 0xE01EF}};
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++)
        if (cp >= ranges[i][0] && cp <= ranges[i][1]) return 1;
    return 0;
}

/* ----------------------------------------------------------------- values */

static jv v_undefined = {.kind = JV_UNDEFINED, .refs = -1};
static jv v_none = {.kind = JV_NONE, .refs = -1};
static jv v_true = {.kind = JV_BOOL, .refs = -1, .u.b = 1};
static jv v_false = {.kind = JV_BOOL, .refs = -1, .u.b = 0};

jv *jv_undefined(void) { return &v_undefined; }
jv *jv_none(void) { return &v_none; }
jv *jv_bool(int b) { return b ? &v_true : &v_false; }

/* A block of bytes for a value's payload, charged to the render's budget. */
static void *payload_alloc(size_t bytes) {
    if (jv_charge(bytes)) return NULL;
    void *p = malloc(bytes ? bytes : 1);
    if (!p) jv_refund(bytes);
    return p;
}

/* Resizes a payload block from old to new bytes (both charged sizes). */
static void *payload_realloc(void *p, size_t old_bytes, size_t new_bytes) {
    if (new_bytes > old_bytes && jv_charge(new_bytes - old_bytes)) return NULL;
    void *q = realloc(p, new_bytes ? new_bytes : 1);
    if (!q && new_bytes > old_bytes) jv_refund(new_bytes - old_bytes);
    return q;
}

static void payload_free(void *p, size_t bytes) {
    free(p);
    jv_refund(bytes);
}

jv *jv_new(jv_kind kind) {
    if (jv_charge(sizeof(jv) + ALLOC_OVERHEAD)) return NULL;
    jv *v = calloc(1, sizeof *v);
    if (!v) {
        jv_refund(sizeof(jv) + ALLOC_OVERHEAD);
        return NULL;
    }
    v->kind = kind;
    v->refs = 1;
    return v;
}

jv *jv_undefined_hint(const char *fmt, ...) {
    jv *v = jv_new(JV_UNDEFINED);
    if (!v) return jv_undefined();
    char tmp[300];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1;
    v->u.undef.hint = payload_alloc(len + 1);
    if (v->u.undef.hint) memcpy(v->u.undef.hint, tmp, len + 1);
    return v;
}

jv *jv_int(int64_t i) {
    jv *v = jv_new(JV_INT);
    if (v) v->u.i = i;
    return v;
}

jv *jv_float(double f) {
    jv *v = jv_new(JV_FLOAT);
    if (v) v->u.f = f;
    return v;
}

jv *jv_str(const char *s, size_t len) {
    if (len >= SIZE_MAX / 2 || jv_work(jr_bytes_work(len))) return NULL;
    char *p = malloc(len + 1);
    if (!p) return NULL;
    if (len) memcpy(p, s, len);
    p[len] = 0;
    return jv_str_take(p, len);
}

jv *jv_cstr(const char *s) { return jv_str(s, strlen(s)); }

jv *jv_str_take(char *s, size_t len) {
    if (!s) return NULL;
    if (jv_charge(len + 1)) {
        free(s);
        return NULL;
    }
    jv *v = jv_new(JV_STRING);
    if (!v) {
        payload_free(s, len + 1);
        return NULL;
    }
    v->u.str.s = s;
    v->u.str.len = len;
    return v;
}

jv *jv_list(size_t cap) {
    jv *v = jv_new(JV_LIST);
    if (!v) return NULL;
    if (cap) {
        v->u.list.items = cap <= SIZE_MAX / 16 ? payload_alloc(cap * sizeof(jv *)) : NULL;
        if (!v->u.list.items) {
            jv_decref(v);
            return NULL;
        }
        v->u.list.cap = cap;
    }
    return v;
}

/* The depth of a container holding v (namespaces count as scalars: see struct jv). */
static int depth_in(const jv *v) { return v->kind == JV_NAMESPACE ? 0 : v->depth; }

/* Raises c's depth for a new item; -1 (a JF_DEPTH fault) when that is too deep. */
static int contain(jv *c, const jv *item) {
    int d = depth_in(item);
    if (d >= JV_MAX_DEPTH) return jv_fault(JF_DEPTH);
    if (d + 1 > c->depth) c->depth = d + 1;
    return 0;
}

int jv_list_push(jv *list, jv *item) {
    if (!item) return -1;
    if (contain(list, item) || jv_work(1)) {
        jv_decref(item);
        return -1;
    }
    if (list->u.list.n == list->u.list.cap) {
        size_t cap = list->u.list.cap ? list->u.list.cap * 2 : 4;
        jv **p = cap <= SIZE_MAX / 16 ? payload_realloc(list->u.list.items, list->u.list.cap * sizeof(jv *),
                                                        cap * sizeof(jv *))
                                      : NULL;
        if (!p) {
            jv_decref(item);
            return -1;
        }
        list->u.list.items = p;
        list->u.list.cap = cap;
    }
    list->u.list.items[list->u.list.n++] = item;
    return 0;
}

int jv_list_extend(jv *list, const jv *src) {
    size_t n = src->u.list.n, have = list->u.list.n;
    if (n == 0) return 0;
    if (jv_work(n)) return -1;
    if (src->depth > JV_MAX_DEPTH) return jv_fault(JF_DEPTH);
    if (n > list->u.list.cap - have) {
        size_t cap = list->u.list.cap * 2 > have + n ? list->u.list.cap * 2 : have + n;
        jv **p = cap <= SIZE_MAX / 16 ? payload_realloc(list->u.list.items, list->u.list.cap * sizeof(jv *),
                                                        cap * sizeof(jv *))
                                      : NULL;
        if (!p) return -1;
        list->u.list.items = p;
        list->u.list.cap = cap;
    }
    for (size_t i = 0; i < n; i++) list->u.list.items[have + i] = jv_incref(src->u.list.items[i]);
    list->u.list.n = have + n;
    if (src->depth > list->depth) list->depth = src->depth; /* the items are one level down */
    return 0;
}

jv *jv_dict(void) { return jv_new(JV_DICT); }
jv *jv_namespace(void) { return jv_new(JV_NAMESPACE); }

static int dict_push(jv *d, jv *key, jv *val) {
    if (contain(d, key) || contain(d, val) || jv_work(1)) goto fail;
    if (d->u.dict.n == d->u.dict.cap) {
        size_t old = d->u.dict.cap, cap = old ? old * 2 : 4;
        if (cap > SIZE_MAX / 16) goto fail;
        jv **k = payload_realloc(d->u.dict.keys, old * sizeof(jv *), cap * sizeof(jv *));
        if (!k) goto fail;
        d->u.dict.keys = k; /* its growth stays charged even when vals cannot grow */
        jv **v = payload_realloc(d->u.dict.vals, old * sizeof(jv *), cap * sizeof(jv *));
        if (!v) goto fail;
        d->u.dict.vals = v;
        d->u.dict.cap = cap;
    }
    d->u.dict.keys[d->u.dict.n] = key;
    d->u.dict.vals[d->u.dict.n] = val;
    d->u.dict.n++;
    return 0;
fail:
    jv_decref(key);
    jv_decref(val);
    return -1;
}

int jv_dict_set(jv *d, jv *key, jv *val) {
    if (!key || !val) {
        if (key) jv_decref(key);
        if (val) jv_decref(val);
        return -1;
    }
    for (size_t i = 0; i < d->u.dict.n && !jv_faulted(); i++) {
        if (jv_eq(d->u.dict.keys[i], key)) {
            jv_decref(key);
            if (contain(d, val)) {
                jv_decref(val);
                return -1;
            }
            jv_decref(d->u.dict.vals[i]);
            d->u.dict.vals[i] = val;
            return 0;
        }
    }
    if (jv_faulted()) { /* jv_eq gave up: the key may be there */
        jv_decref(key);
        jv_decref(val);
        return -1;
    }
    return dict_push(d, key, val);
}

jv *jv_dict_get(const jv *d, const jv *key) {
    for (size_t i = 0; i < d->u.dict.n; i++) {
        if (jv_eq(d->u.dict.keys[i], key)) return d->u.dict.vals[i];
        if (jv_faulted()) break;
    }
    return NULL;
}

jv *jv_dict_get_str(const jv *d, const char *key, size_t len) {
    if (jv_work(d->u.dict.n)) return NULL;
    for (size_t i = 0; i < d->u.dict.n; i++) {
        const jv *k = d->u.dict.keys[i];
        if (k->kind == JV_STRING && k->u.str.len == len && memcmp(k->u.str.s, key, len) == 0)
            return d->u.dict.vals[i];
    }
    return NULL;
}

jv *jv_func(int id, jv *self) {
    jv *v = jv_new(JV_FUNC);
    if (!v || (self && contain(v, self))) {
        if (self) jv_decref(self);
        if (v) jv_decref(v);
        return NULL;
    }
    v->u.func.id = id;
    v->u.func.self = self;
    return v;
}

jv *jv_loop(jv *items, size_t index0) {
    jv *v = jv_new(JV_LOOP);
    if (!v || contain(v, items)) {
        if (v) jv_decref(v);
        return NULL;
    }
    v->u.loop.index0 = index0;
    v->u.loop.length = items->u.list.n;
    v->u.loop.items = jv_incref(items);
    return v;
}

jv *jv_incref(jv *v) {
    if (v && v->refs > 0) v->refs++;
    return v;
}

void jscope_release(jscope *s); /* jinja_eval.c */

/* Recursion as deep as the value (JV_MAX_DEPTH at most). */
static void jv_destroy(jv *v) {
    switch (v->kind) {
    case JV_STRING:
        payload_free(v->u.str.s, v->u.str.len + 1);
        break;
    case JV_LIST:
        for (size_t i = 0; i < v->u.list.n; i++) jv_decref(v->u.list.items[i]);
        payload_free(v->u.list.items, v->u.list.cap * sizeof(jv *));
        break;
    case JV_DICT:
    case JV_NAMESPACE:
        for (size_t i = 0; i < v->u.dict.n; i++) {
            jv_decref(v->u.dict.keys[i]);
            jv_decref(v->u.dict.vals[i]);
        }
        payload_free(v->u.dict.keys, v->u.dict.cap * sizeof(jv *));
        payload_free(v->u.dict.vals, v->u.dict.cap * sizeof(jv *));
        break;
    case JV_MACRO:
        if (v->u.macro.closure) jscope_release(v->u.macro.closure);
        break;
    case JV_FUNC:
        if (v->u.func.self) jv_decref(v->u.func.self);
        break;
    case JV_LOOP:
        if (v->u.loop.items) jv_decref(v->u.loop.items);
        break;
    case JV_UNDEFINED:
        if (v->u.undef.hint) payload_free(v->u.undef.hint, strlen(v->u.undef.hint) + 1);
        break;
    default:
        break;
    }
    free(v);
    jv_refund(sizeof(jv) + ALLOC_OVERHEAD);
}

void jv_decref(jv *v) {
    if (!v || v->refs < 0) return;
    if (--v->refs == 0) jv_destroy(v);
}

void jv_make_immortal(jv *v) {
    if (!v || v->refs < 0) return;
    v->refs = -2;
    if (v->kind == JV_LIST)
        for (size_t i = 0; i < v->u.list.n; i++) jv_make_immortal(v->u.list.items[i]);
}

void jv_free_immortal(jv *v) {
    if (!v || v->refs != -2) return;
    if (v->kind == JV_LIST) {
        for (size_t i = 0; i < v->u.list.n; i++) jv_free_immortal(v->u.list.items[i]);
        v->u.list.n = 0;
    }
    jv_destroy(v);
}

int jv_truthy(const jv *v) {
    switch (v->kind) {
    case JV_UNDEFINED:
    case JV_NONE:
        return 0;
    case JV_BOOL:
        return v->u.b;
    case JV_INT:
        return v->u.i != 0;
    case JV_FLOAT:
        return v->u.f != 0.0;
    case JV_STRING:
        return v->u.str.len != 0;
    case JV_LIST:
        return v->u.list.gen || v->u.list.n != 0;
    case JV_DICT:
        return v->u.dict.n != 0;
    default:
        return 1;
    }
}

int jv_is_number(const jv *v) {
    return v->kind == JV_BOOL || v->kind == JV_INT || v->kind == JV_FLOAT;
}

double jv_num(const jv *v) {
    if (v->kind == JV_BOOL) return v->u.b;
    if (v->kind == JV_INT) return (double)v->u.i;
    if (v->kind == JV_FLOAT) return v->u.f;
    return 0;
}

static int num_eq(const jv *a, const jv *b) {
    if (a->kind != JV_FLOAT && b->kind != JV_FLOAT) {
        int64_t x = a->kind == JV_BOOL ? a->u.b : a->u.i;
        int64_t y = b->kind == JV_BOOL ? b->u.b : b->u.i;
        return x == y;
    }
    return jv_num(a) == jv_num(b);
}

/* Recursion as deep as the values; each item compared is a step (with a fault: "not equal"). */
int jv_eq(const jv *a, const jv *b) {
    if (jv_work(1)) return 0;
    if (a == b) return a->kind != JV_FLOAT || a->u.f == a->u.f;
    if (jv_is_number(a) && jv_is_number(b)) return num_eq(a, b);
    if (a->kind != b->kind) return 0;
    switch (a->kind) {
    case JV_UNDEFINED:
    case JV_NONE:
        return 1;
    case JV_STRING:
        if (a->u.str.len != b->u.str.len || jv_work(jr_bytes_work(a->u.str.len))) return 0;
        return memcmp(a->u.str.s, b->u.str.s, a->u.str.len) == 0;
    case JV_LIST:
        if (a->u.list.gen || b->u.list.gen) return 0; /* iterators compare by identity */
        if (a->u.list.tuple != b->u.list.tuple || a->u.list.n != b->u.list.n) return 0;
        for (size_t i = 0; i < a->u.list.n; i++)
            if (!jv_eq(a->u.list.items[i], b->u.list.items[i])) return 0;
        return 1;
    case JV_DICT:
        if (a->u.dict.n != b->u.dict.n) return 0;
        for (size_t i = 0; i < a->u.dict.n; i++) {
            const jv *o = jv_dict_get(b, a->u.dict.keys[i]);
            if (!o || !jv_eq(a->u.dict.vals[i], o)) return 0;
        }
        return 1;
    case JV_FUNC:
        return a->u.func.id == b->u.func.id && a->u.func.self == b->u.func.self;
    default:
        return 0; /* identity compared above */
    }
}

int jv_cmp(const jv *a, const jv *b, int *res) {
    if (jv_work(1)) return -1;
    if (jv_is_number(a) && jv_is_number(b)) {
        if (a->kind != JV_FLOAT && b->kind != JV_FLOAT) {
            int64_t x = a->kind == JV_BOOL ? a->u.b : a->u.i;
            int64_t y = b->kind == JV_BOOL ? b->u.b : b->u.i;
            *res = x < y ? -1 : x > y;
        } else {
            double x = jv_num(a), y = jv_num(b);
            *res = x < y ? -1 : x > y ? 1 : 0; /* NaN: "equal" (all comparisons false) */
            if (x != x || y != y) *res = 2;
        }
        return 0;
    }
    if (a->kind == JV_STRING && b->kind == JV_STRING) {
        size_t n = a->u.str.len < b->u.str.len ? a->u.str.len : b->u.str.len;
        if (jv_work(jr_bytes_work(n))) return -1;
        int c = memcmp(a->u.str.s, b->u.str.s, n);
        if (c == 0) c = a->u.str.len < b->u.str.len ? -1 : a->u.str.len > b->u.str.len;
        *res = c < 0 ? -1 : c > 0;
        return 0;
    }
    if (a->kind == JV_LIST && b->kind == JV_LIST && a->u.list.tuple == b->u.list.tuple &&
        !a->u.list.gen && !b->u.list.gen) {
        size_t n = a->u.list.n < b->u.list.n ? a->u.list.n : b->u.list.n;
        for (size_t i = 0; i < n; i++) {
            if (jv_eq(a->u.list.items[i], b->u.list.items[i])) continue;
            if (jv_faulted()) return -1;
            return jv_cmp(a->u.list.items[i], b->u.list.items[i], res);
        }
        *res = a->u.list.n < b->u.list.n ? -1 : a->u.list.n > b->u.list.n;
        return 0;
    }
    return -1;
}

const char *jv_type_name(const jv *v) {
    switch (v->kind) {
    case JV_UNDEFINED:
        return "Undefined";
    case JV_NONE:
        return "NoneType";
    case JV_BOOL:
        return "bool";
    case JV_INT:
        return "int";
    case JV_FLOAT:
        return "float";
    case JV_STRING:
        return "str";
    case JV_LIST:
        return v->u.list.gen ? "generator" : v->u.list.tuple ? "tuple" : "list";
    case JV_DICT:
        return "dict";
    case JV_NAMESPACE:
        return "Namespace";
    case JV_MACRO:
        return "Macro";
    case JV_FUNC:
        return v->u.func.self ? "method" : "function";
    case JV_LOOP:
        return "LoopContext";
    }
    return "object";
}

/* ------------------------------------------------------- str() and repr() */

void jv_write_float(double f, jbuf *b) {
    if (f != f) {
        jbuf_puts(b, "nan");
        return;
    }
    if (isinf(f)) {
        jbuf_puts(b, f < 0 ? "-inf" : "inf");
        return;
    }
    char tmp[48];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    const char *p = tmp;
    if (*p == '-') {
        jbuf_putc(b, '-');
        p++;
    }
    char digits[24];
    int nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9' && nd < 20) digits[nd++] = *p;
    int exp10 = *p == 'e' ? atoi(p + 1) : 0;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    if (exp10 < -4 || exp10 >= 16) {
        jbuf_putc(b, digits[0]);
        if (nd > 1) {
            jbuf_putc(b, '.');
            jbuf_put(b, digits + 1, (size_t)nd - 1);
        }
        jbuf_printf(b, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    } else if (exp10 >= 0) {
        for (int i = 0; i <= exp10; i++) jbuf_putc(b, i < nd ? digits[i] : '0');
        jbuf_putc(b, '.');
        if (nd > exp10 + 1)
            jbuf_put(b, digits + exp10 + 1, (size_t)(nd - exp10 - 1));
        else
            jbuf_putc(b, '0');
    } else {
        jbuf_puts(b, "0.");
        for (int i = 0; i < -exp10 - 1; i++) jbuf_putc(b, '0');
        jbuf_put(b, digits, (size_t)nd);
    }
}

/* Python's str.isprintable(), approximately: controls, separators other than the space and
 * format characters are escaped by repr(). */
static int py_printable(uint32_t cp) {
    if (cp < 0x20 || cp == 0x7F) return 0;
    if (cp >= 0x80 && cp <= 0xA0) return 0;
    if (cp == 0xAD || cp == 0x1680 || cp == 0x061C || cp == 0x180E) return 0;
    if ((cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F) ||
        (cp >= 0x205F && cp <= 0x206F))
        return 0;
    if (cp == 0x3000 || cp == 0xFEFF || (cp >= 0xFFF9 && cp <= 0xFFFB)) return 0;
    if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
    if ((cp >= 0xE000 && cp <= 0xF8FF) || cp >= 0xF0000) return 0; /* private use */
    return 1;
}

static void write_str_repr(const char *s, size_t n, jbuf *b) {
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    jbuf_putc(b, q);
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = ju8_next(s + i, n - i, &cp);
        if (cp == (uint32_t)q || cp == '\\') {
            jbuf_putc(b, '\\');
            jbuf_putc(b, (char)cp);
        } else if (cp == '\n') {
            jbuf_puts(b, "\\n");
        } else if (cp == '\r') {
            jbuf_puts(b, "\\r");
        } else if (cp == '\t') {
            jbuf_puts(b, "\\t");
        } else if (!py_printable(cp)) {
            if (cp < 0x100)
                jbuf_printf(b, "\\x%02x", cp);
            else if (cp < 0x10000)
                jbuf_printf(b, "\\u%04x", cp);
            else
                jbuf_printf(b, "\\U%08x", cp);
        } else {
            jbuf_put(b, s + i, k);
        }
        i += k;
    }
    jbuf_putc(b, q);
}

/* Stops as soon as the buffer fails: a value that shares its items can be far larger printed
 * than in memory. */
static void write_value(const jv *v, jbuf *b, int repr, int depth) {
    if (b->failed) return;
    if (depth > 200) {
        jbuf_puts(b, "...");
        return;
    }
    switch (v->kind) {
    case JV_UNDEFINED:
        if (repr) jbuf_puts(b, "Undefined");
        break;
    case JV_NONE:
        jbuf_puts(b, "None");
        break;
    case JV_BOOL:
        jbuf_puts(b, v->u.b ? "True" : "False");
        break;
    case JV_INT:
        jbuf_printf(b, "%lld", (long long)v->u.i);
        break;
    case JV_FLOAT:
        jv_write_float(v->u.f, b);
        break;
    case JV_STRING:
        if (repr)
            write_str_repr(v->u.str.s, v->u.str.len, b);
        else
            jbuf_put(b, v->u.str.s, v->u.str.len);
        break;
    case JV_LIST:
        if (v->u.list.gen) {
            jbuf_puts(b, "<generator object>");
            break;
        }
        jbuf_putc(b, v->u.list.tuple ? '(' : '[');
        for (size_t i = 0; i < v->u.list.n; i++) {
            if (i) jbuf_puts(b, ", ");
            write_value(v->u.list.items[i], b, 1, depth + 1);
        }
        if (v->u.list.tuple && v->u.list.n == 1) jbuf_putc(b, ',');
        jbuf_putc(b, v->u.list.tuple ? ')' : ']');
        break;
    case JV_DICT:
    case JV_NAMESPACE:
        if (v->kind == JV_NAMESPACE) jbuf_puts(b, "<Namespace ");
        jbuf_putc(b, '{');
        for (size_t i = 0; i < v->u.dict.n; i++) {
            if (i) jbuf_puts(b, ", ");
            write_value(v->u.dict.keys[i], b, 1, depth + 1);
            jbuf_puts(b, ": ");
            write_value(v->u.dict.vals[i], b, 1, depth + 1);
        }
        jbuf_putc(b, '}');
        if (v->kind == JV_NAMESPACE) jbuf_putc(b, '>');
        break;
    case JV_MACRO:
        jbuf_printf(b, "<Macro '%s'>", v->u.macro.def ? v->u.macro.def->name : "?");
        break;
    case JV_FUNC:
        jbuf_printf(b, "<%s %s>", v->u.func.self ? "bound method" : "function",
                    jb_func_name(v->u.func.id));
        break;
    case JV_LOOP:
        jbuf_printf(b, "<LoopContext %zu/%zu>", v->u.loop.index0 + 1, v->u.loop.length);
        break;
    }
}

void jv_write_str(const jv *v, jbuf *b) { write_value(v, b, 0, 0); }
void jv_write_repr(const jv *v, jbuf *b) { write_value(v, b, 1, 0); }

/* ------------------------------------------------------------------- JSON */

static void json_write_string(const char *s, size_t n, jbuf *b, int ascii) {
    jbuf_putc(b, '"');
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = ju8_next(s + i, n - i, &cp);
        switch (cp) {
        case '"':
            jbuf_puts(b, "\\\"");
            break;
        case '\\':
            jbuf_puts(b, "\\\\");
            break;
        case '\n':
            jbuf_puts(b, "\\n");
            break;
        case '\r':
            jbuf_puts(b, "\\r");
            break;
        case '\t':
            jbuf_puts(b, "\\t");
            break;
        case '\b':
            jbuf_puts(b, "\\b");
            break;
        case '\f':
            jbuf_puts(b, "\\f");
            break;
        default:
            if (cp < 0x20) {
                jbuf_printf(b, "\\u%04x", cp);
            } else if (ascii && cp >= 0x7F) {
                if (cp == 0x7F) {
                    jbuf_putc(b, 0x7F);
                } else if (cp >= 0x10000) {
                    uint32_t c = cp - 0x10000;
                    jbuf_printf(b, "\\u%04x\\u%04x", 0xD800 + (c >> 10), 0xDC00 + (c & 0x3FF));
                } else {
                    jbuf_printf(b, "\\u%04x", cp);
                }
            } else {
                jbuf_put(b, s + i, k);
            }
        }
        i += k;
    }
    jbuf_putc(b, '"');
}

typedef struct {
    const char *indent; /* NULL: no newlines */
    const char *item_sep, *key_sep;
    int sort_keys, ascii;
    char *err;
    size_t errcap;
} json_opts;

static void json_newline(jbuf *b, const json_opts *o, int level) {
    jbuf_putc(b, '\n');
    for (int i = 0; i < level; i++) jbuf_puts(b, o->indent);
}

static int json_key(const jv *k, jbuf *b, const json_opts *o) {
    switch (k->kind) {
    case JV_STRING:
        json_write_string(k->u.str.s, k->u.str.len, b, o->ascii);
        return 0;
    case JV_INT:
    case JV_BOOL:
    case JV_NONE:
    case JV_FLOAT: {
        jbuf t = {0};
        if (k->kind == JV_BOOL)
            jbuf_puts(&t, k->u.b ? "true" : "false");
        else if (k->kind == JV_NONE)
            jbuf_puts(&t, "null");
        else
            jv_write_str(k, &t);
        json_write_string(t.p ? t.p : "", t.len, b, o->ascii);
        jbuf_free(&t);
        return 0;
    }
    default:
        snprintf(o->err, o->errcap, "keys must be str, int, float, bool or None, not %s",
                 jv_type_name(k));
        return -1;
    }
}

static int json_value(const jv *v, jbuf *b, const json_opts *o, int level) {
    if (level > 500) {
        snprintf(o->err, o->errcap, "value nested too deeply for JSON");
        return -1;
    }
    if (b->failed) {
        snprintf(o->err, o->errcap, b->failed == 2 ? "output longer than the limit" : "out of memory");
        return -1;
    }
    switch (v->kind) {
    case JV_NONE:
        jbuf_puts(b, "null");
        return 0;
    case JV_BOOL:
        jbuf_puts(b, v->u.b ? "true" : "false");
        return 0;
    case JV_INT:
        jbuf_printf(b, "%lld", (long long)v->u.i);
        return 0;
    case JV_FLOAT:
        if (v->u.f != v->u.f)
            jbuf_puts(b, "NaN");
        else if (isinf(v->u.f))
            jbuf_puts(b, v->u.f < 0 ? "-Infinity" : "Infinity");
        else
            jv_write_float(v->u.f, b);
        return 0;
    case JV_STRING:
        json_write_string(v->u.str.s, v->u.str.len, b, o->ascii);
        return 0;
    case JV_LIST:
        if (v->u.list.gen) {
            snprintf(o->err, o->errcap, "Object of type generator is not JSON serializable");
            return -1;
        }
        if (v->u.list.n == 0) {
            jbuf_puts(b, "[]");
            return 0;
        }
        jbuf_putc(b, '[');
        for (size_t i = 0; i < v->u.list.n; i++) {
            if (i) jbuf_puts(b, o->item_sep);
            if (o->indent) json_newline(b, o, level + 1);
            if (json_value(v->u.list.items[i], b, o, level + 1)) return -1;
        }
        if (o->indent) json_newline(b, o, level);
        jbuf_putc(b, ']');
        return 0;
    case JV_DICT: {
        size_t n = v->u.dict.n;
        if (n == 0) {
            jbuf_puts(b, "{}");
            return 0;
        }
        size_t *order = malloc(n * sizeof *order);
        if (!order) {
            snprintf(o->err, o->errcap, "out of memory");
            return -1;
        }
        for (size_t i = 0; i < n; i++) order[i] = i;
        if (o->sort_keys) { /* insertion sort: stable, keys are few */
            for (size_t i = 1; i < n; i++) {
                size_t x = order[i], j = i;
                while (j > 0) {
                    int c;
                    if (jv_cmp(v->u.dict.keys[order[j - 1]], v->u.dict.keys[x], &c)) {
                        free(order);
                        snprintf(o->err, o->errcap, "cannot sort keys of different types");
                        return -1;
                    }
                    if (c <= 0) break;
                    order[j] = order[j - 1];
                    j--;
                }
                order[j] = x;
            }
        }
        jbuf_putc(b, '{');
        for (size_t i = 0; i < n; i++) {
            if (i) jbuf_puts(b, o->item_sep);
            if (o->indent) json_newline(b, o, level + 1);
            if (json_key(v->u.dict.keys[order[i]], b, o) ||
                (jbuf_puts(b, o->key_sep), json_value(v->u.dict.vals[order[i]], b, o, level + 1))) {
                free(order);
                return -1;
            }
        }
        free(order);
        if (o->indent) json_newline(b, o, level);
        jbuf_putc(b, '}');
        return 0;
    }
    default:
        snprintf(o->err, o->errcap, "Object of type %s is not JSON serializable",
                 jv_type_name(v));
        return -1;
    }
}

int jv_write_json(const jv *v, jbuf *b, const char *indent, const char *item_sep, const char *key_sep,
                  int sort_keys, int ascii, char *err, size_t errcap) {
    json_opts o = {indent, item_sep, key_sep, sort_keys, ascii, err, errcap};
    return json_value(v, b, &o, 0);
}

jv *jv_from_json(const json_t *j, int depth) {
    if (depth >= JV_MAX_DEPTH) {
        jv_fault(JF_DEPTH);
        return NULL;
    }
    switch (json_typeof(j)) {
    case JSON_NULL:
        return jv_none();
    case JSON_TRUE:
        return jv_bool(1);
    case JSON_FALSE:
        return jv_bool(0);
    case JSON_INTEGER:
        return jv_int((int64_t)json_integer_value(j));
    case JSON_REAL:
        return jv_float(json_real_value(j));
    case JSON_STRING:
        return jv_str(json_string_value(j), json_string_length(j));
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        jv *l = jv_list(n);
        if (!l) return NULL;
        for (size_t i = 0; i < n; i++) {
            jv *item = jv_from_json(json_array_get(j, i), depth + 1);
            if (jv_list_push(l, item)) {
                jv_decref(l);
                return NULL;
            }
        }
        return l;
    }
    case JSON_OBJECT: {
        jv *d = jv_dict();
        if (!d) return NULL;
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)j, key, val) {
            jv *k = jv_cstr(key);
            jv *x = jv_from_json(val, depth + 1);
            if (!k || !x) {
                if (k) jv_decref(k);
                if (x) jv_decref(x);
                jv_decref(d);
                return NULL;
            }
            if (dict_push(d, k, x)) {
                jv_decref(d);
                return NULL;
            }
        }
        return d;
    }
    }
    return NULL;
}
