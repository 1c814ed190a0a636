/* Filters, tests, global functions and the methods of str / dict / list / loop values, each
 * written to behave as jinja2's built-in (or Python's method) does. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jinja/jinja_internal.h"

/* ------------------------------------------------------------- arguments */

typedef struct {
    jv **pos;
    size_t npos;
    const char **kwn;
    jv **kwv;
    size_t nkw;
} argv_t;

/* Binds call arguments to named parameters (out[i] borrowed, NULL when not given). */
static int bind(jrender *r, int line, const char *fname, const char *const *names, size_t n,
                const argv_t *a, jv **out) {
    for (size_t i = 0; i < n; i++) out[i] = NULL;
    if (a->npos > n)
        return jr_failc(r, line, "%s() takes at most %zu argument(s) (%zu given)", fname, n,
                        a->npos);
    for (size_t i = 0; i < a->npos; i++) out[i] = a->pos[i];
    for (size_t k = 0; k < a->nkw; k++) {
        size_t i;
        for (i = 0; i < n; i++)
            if (!strcmp(names[i], a->kwn[k])) break;
        if (i == n) return jr_failc(r, line, "%s() got an unexpected keyword argument '%s'", fname, a->kwn[k]);
        if (out[i]) return jr_failc(r, line, "%s() got multiple values for argument '%s'", fname, a->kwn[k]);
        out[i] = a->kwv[k];
    }
    return 0;
}

#define BIND(fname, ...)                                                                   \
    static const char *const P_[] = {__VA_ARGS__};                                         \
    jv *A_[sizeof P_ / sizeof P_[0]];                                                      \
    if (bind(r, line, fname, P_, sizeof P_ / sizeof P_[0], a, A_)) return NULL;

static int arg_bool(const jv *v, int def) { return v ? jv_truthy(v) : def; }

static int arg_int(jrender *r, int line, const jv *v, int64_t def, int64_t *out, const char *what) {
    if (!v || v->kind == JV_NONE) {
        *out = def;
        return 0;
    }
    if (v->kind == JV_INT) {
        *out = v->u.i;
        return 0;
    }
    if (v->kind == JV_BOOL) {
        *out = v->u.b;
        return 0;
    }
    return jr_failc(r, line, "%s must be an integer, not '%s'", what, jv_type_name(v));
}

static jv *new_string(jrender *r, int line, jbuf *b) {
    if (b->failed) {
        jbuf_free(b);
        return jr_fail(r, line, "string too long or out of memory");
    }
    size_t len;
    char *s = jbuf_take(b, &len);
    jv *v = jv_str_take(s, len);
    return v ? v : jr_oom(r, line);
}

/* str(v) as a view: the text is v's own or written into tmp. */
static void view_str(const jv *v, jbuf *tmp, const char **s, size_t *n) {
    if (v->kind == JV_STRING) {
        *s = v->u.str.s;
        *n = v->u.str.len;
        return;
    }
    jv_write_str(v, tmp);
    *s = tmp->p ? tmp->p : "";
    *n = tmp->len;
}

/* Python's full case mapping where it differs from the simple one (SpecialCasing.txt, its
 * unconditional part): the upper-case forms longer than one character, in code point order, as
 *   python3 -c "print([(hex(c), chr(c).upper()) for c in range(0x110000)
 *                      if not 0xD800 <= c < 0xE000 and len(chr(c).upper()) > 1])"
 * lists them (Unicode 14, Python 3.11), and the one lower-case form longer than one character:
 * U+0130 (I with dot above) -> "i" U+0307. */
typedef struct {
    uint32_t cp;
    const char *s;
} case_form;

static const case_form upper_full[] = {
    {0xDF, "\x53\x53"}, {0x149, "\xca\xbc\x4e"}, {0x1F0, "\x4a\xcc\x8c"}, {0x390, "\xce\x99\xcc\x88\xcc\x81"},
    {0x3B0, "\xce\xa5\xcc\x88\xcc\x81"}, {0x587, "\xd4\xb5\xd5\x92"}, {0x1E96, "\x48\xcc\xb1"},
    {0x1E97, "\x54\xcc\x88"}, {0x1E98, "\x57\xcc\x8a"}, {0x1E99, "\x59\xcc\x8a"}, {0x1E9A, "\x41\xca\xbe"},
    {0x1F50, "\xce\xa5\xcc\x93"}, {0x1F52, "\xce\xa5\xcc\x93\xcc\x80"}, {0x1F54, "\xce\xa5\xcc\x93\xcc\x81"},
    {0x1F56, "\xce\xa5\xcc\x93\xcd\x82"}, {0x1F80, "\xe1\xbc\x88\xce\x99"}, {0x1F81, "\xe1\xbc\x89\xce\x99"},
    {0x1F82, "\xe1\xbc\x8a\xce\x99"}, {0x1F83, "\xe1\xbc\x8b\xce\x99"}, {0x1F84, "\xe1\xbc\x8c\xce\x99"},
    {0x1F85, "\xe1\xbc\x8d\xce\x99"}, {0x1F86, "\xe1\xbc\x8e\xce\x99"}, {0x1F87, "\xe1\xbc\x8f\xce\x99"},
    {0x1F88, "\xe1\xbc\x88\xce\x99"}, {0x1F89, "\xe1\xbc\x89\xce\x99"}, {0x1F8A, "\xe1\xbc\x8a\xce\x99"},
    {0x1F8B, "\xe1\xbc\x8b\xce\x99"}, {0x1F8C, "\xe1\xbc\x8c\xce\x99"}, {0x1F8D, "\xe1\xbc\x8d\xce\x99"},
    {0x1F8E, "\xe1\xbc\x8e\xce\x99"}, {0x1F8F, "\xe1\xbc\x8f\xce\x99"}, {0x1F90, "\xe1\xbc\xa8\xce\x99"},
    {0x1F91, "\xe1\xbc\xa9\xce\x99"}, {0x1F92, "\xe1\xbc\xaa\xce\x99"}, {0x1F93, "\xe1\xbc\xab\xce\x99"},
    {0x1F94, "\xe1\xbc\xac\xce\x99"}, {0x1F95, "\xe1\xbc\xad\xce\x99"}, {0x1F96, "\xe1\xbc\xae\xce\x99"},
    {0x1F97, "\xe1\xbc\xaf\xce\x99"}, {0x1F98, "\xe1\xbc\xa8\xce\x99"}, {0x1F99, "\xe1\xbc\xa9\xce\x99"},
    {0x1F9A, "\xe1\xbc\xaa\xce\x99"}, {0x1F9B, "\xe1\xbc\xab\xce\x99"}, {0x1F9C, "\xe1\xbc\xac\xce\x99"},
    {0x1F9D, "\xe1\xbc\xad\xce\x99"}, {0x1F9E, "\xe1\xbc\xae\xce\x99"}, {0x1F9F, "\xe1\xbc\xaf\xce\x99"},
    {0x1FA0, "\xe1\xbd\xa8\xce\x99"}, {0x1FA1, "\xe1\xbd\xa9\xce\x99"}, {0x1FA2, "\xe1\xbd\xaa\xce\x99"},
    {0x1FA3, "\xe1\xbd\xab\xce\x99"}, {0x1FA4, "\xe1\xbd\xac\xce\x99"}, {0x1FA5, "\xe1\xbd\xad\xce\x99"},
    {0x1FA6, "\xe1\xbd\xae\xce\x99"}, {0x1FA7, "\xe1\xbd\xaf\xce\x99"}, {0x1FA8, "\xe1\xbd\xa8\xce\x99"},
    {0x1FA9, "\xe1\xbd\xa9\xce\x99"}, {0x1FAA, "\xe1\xbd\xaa\xce\x99"}, {0x1FAB, "\xe1\xbd\xab\xce\x99"},
    {0x1FAC, "\xe1\xbd\xac\xce\x99"}, {0x1FAD, "\xe1\xbd\xad\xce\x99"}, {0x1FAE, "\xe1\xbd\xae\xce\x99"},
    {0x1FAF, "\xe1\xbd\xaf\xce\x99"}, {0x1FB2, "\xe1\xbe\xba\xce\x99"}, {0x1FB3, "\xce\x91\xce\x99"},
    {0x1FB4, "\xce\x86\xce\x99"}, {0x1FB6, "\xce\x91\xcd\x82"}, {0x1FB7, "\xce\x91\xcd\x82\xce\x99"},
    {0x1FBC, "\xce\x91\xce\x99"}, {0x1FC2, "\xe1\xbf\x8a\xce\x99"}, {0x1FC3, "\xce\x97\xce\x99"},
    {0x1FC4, "\xce\x89\xce\x99"}, {0x1FC6, "\xce\x97\xcd\x82"}, {0x1FC7, "\xce\x97\xcd\x82\xce\x99"},
    {0x1FCC, "\xce\x97\xce\x99"}, {0x1FD2, "\xce\x99\xcc\x88\xcc\x80"}, {0x1FD3, "\xce\x99\xcc\x88\xcc\x81"},
    {0x1FD6, "\xce\x99\xcd\x82"}, {0x1FD7, "\xce\x99\xcc\x88\xcd\x82"}, {0x1FE2, "\xce\xa5\xcc\x88\xcc\x80"},
    {0x1FE3, "\xce\xa5\xcc\x88\xcc\x81"}, {0x1FE4, "\xce\xa1\xcc\x93"}, {0x1FE6, "\xce\xa5\xcd\x82"},
    {0x1FE7, "\xce\xa5\xcc\x88\xcd\x82"}, {0x1FF2, "\xe1\xbf\xba\xce\x99"}, {0x1FF3, "\xce\xa9\xce\x99"},
    {0x1FF4, "\xce\x8f\xce\x99"}, {0x1FF6, "\xce\xa9\xcd\x82"}, {0x1FF7, "\xce\xa9\xcd\x82\xce\x99"},
    {0x1FFC, "\xce\xa9\xce\x99"}, {0xFB00, "\x46\x46"}, {0xFB01, "\x46\x49"}, {0xFB02, "\x46\x4c"},
    {0xFB03, "\x46\x46\x49"}, {0xFB04, "\x46\x46\x4c"}, {0xFB05, "\x53\x54"}, {0xFB06, "\x53\x54"},
    {0xFB13, "\xd5\x84\xd5\x86"}, {0xFB14, "\xd5\x84\xd4\xb5"}, {0xFB15, "\xd5\x84\xd4\xbb"},
    {0xFB16, "\xd5\x8e\xd5\x86"}, {0xFB17, "\xd5\x84\xd4\xbd"},
};

/* The title-case forms that differ from the upper-case ones (digraphs, ligatures, ß, Georgian, Greek with
 * ypogegrammeni), in code point order, as
 *   python3 -c "print([(hex(c), chr(c).title()) for c in range(0x110000)
 *                      if not 0xD800 <= c < 0xE000 and chr(c).title() != chr(c).upper()])"
 * lists them (Python 3.11). */
static const case_form title_full[] = {
    {0xDF, "\x53\x73"}, {0x1C4, "\xc7\x85"}, {0x1C5, "\xc7\x85"}, {0x1C6, "\xc7\x85"}, {0x1C7, "\xc7\x88"},
    {0x1C8, "\xc7\x88"}, {0x1C9, "\xc7\x88"}, {0x1CA, "\xc7\x8b"}, {0x1CB, "\xc7\x8b"}, {0x1CC, "\xc7\x8b"},
    {0x1F1, "\xc7\xb2"}, {0x1F2, "\xc7\xb2"}, {0x1F3, "\xc7\xb2"}, {0x587, "\xd4\xb5\xd6\x82"},
    {0x10D0, "\xe1\x83\x90"}, {0x10D1, "\xe1\x83\x91"}, {0x10D2, "\xe1\x83\x92"}, {0x10D3, "\xe1\x83\x93"},
    {0x10D4, "\xe1\x83\x94"}, {0x10D5, "\xe1\x83\x95"}, {0x10D6, "\xe1\x83\x96"}, {0x10D7, "\xe1\x83\x97"},
    {0x10D8, "\xe1\x83\x98"}, {0x10D9, "\xe1\x83\x99"}, {0x10DA, "\xe1\x83\x9a"}, {0x10DB, "\xe1\x83\x9b"},
    {0x10DC, "\xe1\x83\x9c"}, {0x10DD, "\xe1\x83\x9d"}, {0x10DE, "\xe1\x83\x9e"}, {0x10DF, "\xe1\x83\x9f"},
    {0x10E0, "\xe1\x83\xa0"}, {0x10E1, "\xe1\x83\xa1"}, {0x10E2, "\xe1\x83\xa2"}, {0x10E3, "\xe1\x83\xa3"},
    {0x10E4, "\xe1\x83\xa4"}, {0x10E5, "\xe1\x83\xa5"}, {0x10E6, "\xe1\x83\xa6"}, {0x10E7, "\xe1\x83\xa7"},
    {0x10E8, "\xe1\x83\xa8"}, {0x10E9, "\xe1\x83\xa9"}, {0x10EA, "\xe1\x83\xaa"}, {0x10EB, "\xe1\x83\xab"},
    {0x10EC, "\xe1\x83\xac"}, {0x10ED, "\xe1\x83\xad"}, {0x10EE, "\xe1\x83\xae"}, {0x10EF, "\xe1\x83\xaf"},
    {0x10F0, "\xe1\x83\xb0"}, {0x10F1, "\xe1\x83\xb1"}, {0x10F2, "\xe1\x83\xb2"}, {0x10F3, "\xe1\x83\xb3"},
    {0x10F4, "\xe1\x83\xb4"}, {0x10F5, "\xe1\x83\xb5"}, {0x10F6, "\xe1\x83\xb6"}, {0x10F7, "\xe1\x83\xb7"},
    {0x10F8, "\xe1\x83\xb8"}, {0x10F9, "\xe1\x83\xb9"}, {0x10FA, "\xe1\x83\xba"}, {0x10FD, "\xe1\x83\xbd"},
    {0x10FE, "\xe1\x83\xbe"}, {0x10FF, "\xe1\x83\xbf"}, {0x1F80, "\xe1\xbe\x88"}, {0x1F81, "\xe1\xbe\x89"},
    {0x1F82, "\xe1\xbe\x8a"}, {0x1F83, "\xe1\xbe\x8b"}, {0x1F84, "\xe1\xbe\x8c"}, {0x1F85, "\xe1\xbe\x8d"},
    {0x1F86, "\xe1\xbe\x8e"}, {0x1F87, "\xe1\xbe\x8f"}, {0x1F88, "\xe1\xbe\x88"}, {0x1F89, "\xe1\xbe\x89"},
    {0x1F8A, "\xe1\xbe\x8a"}, {0x1F8B, "\xe1\xbe\x8b"}, {0x1F8C, "\xe1\xbe\x8c"}, {0x1F8D, "\xe1\xbe\x8d"},
    {0x1F8E, "\xe1\xbe\x8e"}, {0x1F8F, "\xe1\xbe\x8f"}, {0x1F90, "\xe1\xbe\x98"}, {0x1F91, "\xe1\xbe\x99"},
    {0x1F92, "\xe1\xbe\x9a"}, {0x1F93, "\xe1\xbe\x9b"}, {0x1F94, "\xe1\xbe\x9c"}, {0x1F95, "\xe1\xbe\x9d"},
    {0x1F96, "\xe1\xbe\x9e"}, {0x1F97, "\xe1\xbe\x9f"}, {0x1F98, "\xe1\xbe\x98"}, {0x1F99, "\xe1\xbe\x99"},
    {0x1F9A, "\xe1\xbe\x9a"}, {0x1F9B, "\xe1\xbe\x9b"}, {0x1F9C, "\xe1\xbe\x9c"}, {0x1F9D, "\xe1\xbe\x9d"},
    {0x1F9E, "\xe1\xbe\x9e"}, {0x1F9F, "\xe1\xbe\x9f"}, {0x1FA0, "\xe1\xbe\xa8"}, {0x1FA1, "\xe1\xbe\xa9"},
    {0x1FA2, "\xe1\xbe\xaa"}, {0x1FA3, "\xe1\xbe\xab"}, {0x1FA4, "\xe1\xbe\xac"}, {0x1FA5, "\xe1\xbe\xad"},
    {0x1FA6, "\xe1\xbe\xae"}, {0x1FA7, "\xe1\xbe\xaf"}, {0x1FA8, "\xe1\xbe\xa8"}, {0x1FA9, "\xe1\xbe\xa9"},
    {0x1FAA, "\xe1\xbe\xaa"}, {0x1FAB, "\xe1\xbe\xab"}, {0x1FAC, "\xe1\xbe\xac"}, {0x1FAD, "\xe1\xbe\xad"},
    {0x1FAE, "\xe1\xbe\xae"}, {0x1FAF, "\xe1\xbe\xaf"}, {0x1FB2, "\xe1\xbe\xba\xcd\x85"}, {0x1FB3, "\xe1\xbe\xbc"},
    {0x1FB4, "\xce\x86\xcd\x85"}, {0x1FB7, "\xce\x91\xcd\x82\xcd\x85"}, {0x1FBC, "\xe1\xbe\xbc"},
    {0x1FC2, "\xe1\xbf\x8a\xcd\x85"}, {0x1FC3, "\xe1\xbf\x8c"}, {0x1FC4, "\xce\x89\xcd\x85"},
    {0x1FC7, "\xce\x97\xcd\x82\xcd\x85"}, {0x1FCC, "\xe1\xbf\x8c"}, {0x1FF2, "\xe1\xbf\xba\xcd\x85"},
    {0x1FF3, "\xe1\xbf\xbc"}, {0x1FF4, "\xce\x8f\xcd\x85"}, {0x1FF7, "\xce\xa9\xcd\x82\xcd\x85"},
    {0x1FFC, "\xe1\xbf\xbc"}, {0xFB00, "\x46\x66"}, {0xFB01, "\x46\x69"}, {0xFB02, "\x46\x6c"},
    {0xFB03, "\x46\x66\x69"}, {0xFB04, "\x46\x66\x6c"}, {0xFB05, "\x53\x74"}, {0xFB06, "\x53\x74"},
    {0xFB13, "\xd5\x84\xd5\xb6"}, {0xFB14, "\xd5\x84\xd5\xa5"}, {0xFB15, "\xd5\x84\xd5\xab"},
    {0xFB16, "\xd5\x8e\xd5\xb6"}, {0xFB17, "\xd5\x84\xd5\xad"},
};

static int cmp_upper_full(const void *key, const void *item) {
    uint32_t a = *(const uint32_t *)key, b = *(const uint32_t *)item;
    return a < b ? -1 : a > b;
}

static const char *case_special(uint32_t cp, int upper) {
    if (!upper) return cp == 0x130 ? "i\xcc\x87" : NULL;
    if (cp < 0xDF) return NULL;
    const void *hit = bsearch(&cp, upper_full, sizeof upper_full / sizeof upper_full[0], sizeof upper_full[0],
                              cmp_upper_full);
    return hit ? ((const case_form *)hit)->s : NULL;
}

static const char *title_special(uint32_t cp) {
    if (cp < 0xDF) return NULL;
    const void *hit = bsearch(&cp, title_full, sizeof title_full / sizeof title_full[0], sizeof title_full[0],
                              cmp_upper_full);
    return hit ? ((const case_form *)hit)->s : NULL;
}

/* Python's lower() of the capital sigma at s[i .. i+k) (its Final_Sigma context, SpecialCasing.txt): U+03C2 after
 * a cased letter (case-ignorable characters between) that no cased letter follows (the same), else U+03C3. */
static uint32_t final_sigma(const char *s, size_t n, size_t i, size_t k) {
    uint32_t cp = 0;
    int before = 0;
    for (size_t j = i; j > 0;) { /* back to the start of the previous character */
        size_t a = j - 1;
        while (a > 0 && ((unsigned char)s[a] & 0xC0) == 0x80) a--;
        ju8_next(s + a, j - a, &cp);
        j = a;
        if (!ju_case_ignorable(cp)) {
            before = ju_cased(cp);
            break;
        }
    }
    if (!before) return 0x3C3;
    for (size_t j = i + k; j < n;) {
        j += ju8_next(s + j, n - j, &cp);
        if (!ju_case_ignorable(cp)) return ju_cased(cp) ? 0x3C3 : 0x3C2;
    }
    return 0x3C2;
}

/* Writes Python's full case form of the character cp at s[i .. i+k) to b: 'u' upper(), 'l' lower() (the final
 * sigma included), 't' title case (str.title() and capitalize() at a word's start). */
static void put_case(jbuf *b, const char *s, size_t n, size_t i, size_t k, uint32_t cp, int form) {
    const char *sp = form == 't' ? title_special(cp) : NULL;
    if (!sp) sp = case_special(cp, form != 'l');
    if (sp) {
        jbuf_puts(b, sp);
        return;
    }
    uint32_t m = form != 'l' ? ju_upper(cp) : cp == 0x3A3 ? final_sigma(s, n, i, k) : ju_lower(cp);
    if (m == cp)
        jbuf_put(b, s + i, k);
    else
        ju8_put(b, m);
}

static jv *case_map(jrender *r, int line, const char *s, size_t n, int upper) {
    jbuf b = {.limit = r->lim.max_output};
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = ju8_next(s + i, n - i, &cp);
        put_case(&b, s, n, i, k, cp, upper ? 'u' : 'l');
        i += k;
    }
    return new_string(r, line, &b);
}

static jv *lowered(jrender *r, int line, jv *v) { /* jinja's ignore_case */
    if (v->kind != JV_STRING) return jv_incref(v);
    return case_map(r, line, v->u.str.s, v->u.str.len, 0);
}

/* item[attr] for each dotted part ("a.b.0"), as jinja's attribute getters do: a part after one
 * that is undefined fails (jinja2 subscripts the Undefined), unless deflt (map's default=, not
 * None) replaces each undefined part. */
static jv *get_attribute_path(jrender *r, int line, jv *item, const jv *attr, const jv *deflt) {
    if (attr->kind == JV_INT) {
        jv *v = jr_getitem(r, line, item, (jv *)attr);
        if (v && deflt && v->kind == JV_UNDEFINED) {
            jv_decref(v);
            v = jv_incref((jv *)deflt);
        }
        return v;
    }
    if (attr->kind != JV_STRING) return jr_fail(r, line, "attribute must be a string");
    jv *cur = jv_incref(item);
    const char *s = attr->u.str.s;
    size_t n = attr->u.str.len, i = 0;
    while (1) {
        size_t j = i;
        while (j < n && s[j] != '.') j++;
        int digits = j > i;
        for (size_t k = i; k < j; k++)
            if (s[k] < '0' || s[k] > '9') digits = 0;
        jv *key = digits ? jv_int(strtoll(s + i, NULL, 10)) : jv_str(s + i, j - i);
        if (!key) {
            jv_decref(cur);
            return jr_oom(r, line);
        }
        jv *next = jr_getitem(r, line, cur, key);
        jv_decref(key);
        jv_decref(cur);
        if (!next) return NULL;
        if (deflt && next->kind == JV_UNDEFINED) {
            jv_decref(next);
            next = jv_incref((jv *)deflt);
        }
        cur = next;
        if (j >= n) break;
        i = j + 1;
    }
    return cur;
}

/* ------------------------------------------------------------- sorting */

typedef struct {
    jv *key;
    jv *item;
} sort_entry;

/* Stable merge sort by key; -1 on incomparable keys (unequal keys that do not order). */
static int sort_entries(jrender *r, int line, sort_entry *e, size_t n, int reverse) {
    if (n < 2) return 0;
    sort_entry *tmp = malloc(n * sizeof *tmp);
    if (!tmp) return jr_oom(r, line), -1;
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n;
            size_t hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int c = 0;
                /* jinja2's sort keys are lists ([key]), and Python compares lists item by item with
                 * == before <: equal keys (None and None, two equal dicts, two undefined
                 * attributes) are never ordered, so they are no error */
                if (!jv_eq(e[j].key, e[i].key) && jv_cmp(e[j].key, e[i].key, &c)) {
                    free(tmp);
                    return jr_failc(r, line, "'<' not supported between instances of '%s' and '%s'",
                                    jv_type_name(e[j].key), jv_type_name(e[i].key));
                }
                if (c == 2) c = 0;
                /* take the right element only when strictly before the left one */
                int right_first = reverse ? c > 0 : c < 0;
                tmp[k++] = right_first ? e[j++] : e[i++];
            }
            while (i < mid) tmp[k++] = e[i++];
            while (j < hi) tmp[k++] = e[j++];
        }
        memcpy(e, tmp, n * sizeof *e);
    }
    free(tmp);
    return 0;
}

static void free_entries(sort_entry *e, size_t n) {
    for (size_t i = 0; i < n; i++) {
        jv_decref(e[i].key);
        jv_decref(e[i].item);
    }
    free(e);
}

/* ------------------------------------------------------------ str helpers */

/* memmem from s + from; the bytes it may scan are charged as steps (NULL after a fault). */
static const char *scan(const char *s, size_t n, size_t from, const char *sub, size_t m) {
    if (from > n || n - from < m) return NULL;
    const char *hit = memmem(s + from, n - from, sub, m);
    size_t scanned = hit ? (size_t)(hit - (s + from)) : n - from;
    if (jv_work(jr_bytes_work(scanned + m) + 1)) return NULL;
    return hit;
}

static size_t cp_len_at(const char *s, size_t n) {
    uint32_t cp;
    return ju8_next(s, n, &cp);
}

/* Does the code point at s belong to the chars set? */
static int in_chars(const char *s, size_t k, const jv *chars) {
    const char *c = chars->u.str.s;
    size_t n = chars->u.str.len, i = 0;
    while (i < n) {
        size_t m = cp_len_at(c + i, n - i);
        if (m == k && memcmp(c + i, s, k) == 0) return 1;
        i += m;
    }
    return 0;
}

static jv *strip_impl(jrender *r, int line, const char *s, size_t n, const jv *chars, int left,
                      int right) {
    if (chars && chars->kind != JV_NONE && chars->kind != JV_STRING)
        return jr_fail(r, line, "strip arg must be None or str");
    size_t a = 0, b = n;
    if (!chars || chars->kind == JV_NONE) {
        if (left) a = ju8_lspace(s, n);
        if (right && b > a) b -= ju8_rspace(s + a, b - a);
    } else {
        if (left)
            while (a < b) {
                size_t k = cp_len_at(s + a, b - a);
                if (!in_chars(s + a, k, chars)) break;
                a += k;
            }
        if (right)
            while (b > a) {
                size_t st = b - 1;
                while (st > a && ((unsigned char)s[st] & 0xC0) == 0x80) st--;
                if (!in_chars(s + st, b - st, chars)) break;
                b = st;
            }
    }
    jv *v = jv_str(s + a, b - a);
    return v ? v : jr_oom(r, line);
}

static jv *split_impl(jrender *r, int line, const char *s, size_t n, const jv *sep,
                      int64_t maxsplit, int from_right) {
    jv *l = jv_list(0);
    if (!l) return jr_oom(r, line);
    if (sep && sep->kind != JV_NONE && sep->kind != JV_STRING) {
        jv_decref(l);
        return jr_fail(r, line, "must be str or None, not %s", jv_type_name(sep));
    }
    if (!sep || sep->kind == JV_NONE) { /* runs of whitespace; no empty strings */
        /* collect all words, then honour maxsplit */
        size_t count = 0;
        size_t i = 0;
        size_t *ws = NULL, *we = NULL, cap = 0;
        while (i < n) {
            i += ju8_lspace(s + i, n - i);
            if (i >= n) break;
            size_t st = i;
            while (i < n) {
                uint32_t cp;
                size_t k = ju8_next(s + i, n - i, &cp);
                if (ju_isspace(cp)) break;
                i += k;
            }
            if (count == cap) {
                cap = cap ? cap * 2 : 16;
                size_t *a2 = realloc(ws, cap * sizeof *ws), *b2;
                if (!a2) goto oom;
                ws = a2;
                b2 = realloc(we, cap * sizeof *we);
                if (!b2) goto oom;
                we = b2;
            }
            ws[count] = st;
            we[count] = i;
            count++;
        }
        if (maxsplit < 0 || (size_t)maxsplit >= count) { /* (maxsplit + 1 words: the last is the rest) */
            for (size_t k = 0; k < count; k++)
                if (jv_list_push(l, jv_str(s + ws[k], we[k] - ws[k]))) goto oom;
        } else if (!from_right) {
            for (size_t k = 0; k < (size_t)maxsplit; k++)
                if (jv_list_push(l, jv_str(s + ws[k], we[k] - ws[k]))) goto oom;
            size_t st = ws[maxsplit]; /* the rest keeps its trailing whitespace */
            if (jv_list_push(l, jv_str(s + st, n - st))) goto oom;
        } else {
            size_t first = count - (size_t)maxsplit;
            size_t en = we[first - 1]; /* the head keeps its leading whitespace */
            if (jv_list_push(l, jv_str(s, en))) goto oom;
            for (size_t k = first; k < count; k++)
                if (jv_list_push(l, jv_str(s + ws[k], we[k] - ws[k]))) goto oom;
        }
        free(ws);
        free(we);
        return l;
    oom:
        free(ws);
        free(we);
        jv_decref(l);
        return jr_oom(r, line);
    }
    const char *p = sep->u.str.s;
    size_t m = sep->u.str.len;
    if (m == 0) {
        jv_decref(l);
        return jr_fail(r, line, "empty separator");
    }
    /* positions of separators (non-overlapping, left to right) */
    size_t *pos = NULL, np = 0, cap = 0;
    for (const char *hit = scan(s, n, 0, p, m); hit; hit = scan(s, n, (size_t)(hit - s) + m, p, m)) {
        if (np == cap) {
            cap = cap ? cap * 2 : 16;
            size_t *q = realloc(pos, cap * sizeof *q);
            if (!q) {
                free(pos);
                jv_decref(l);
                return jr_oom(r, line);
            }
            pos = q;
        }
        pos[np++] = (size_t)(hit - s);
    }
    size_t first = 0, last = np;
    if (maxsplit >= 0 && (size_t)maxsplit < np) {
        if (from_right)
            first = np - (size_t)maxsplit;
        else
            last = (size_t)maxsplit;
    }
    size_t st = 0;
    int fail = 0;
    if (from_right && first > 0) st = 0; /* the head stays joined */
    for (size_t k = first; k < last && !fail; k++) {
        fail = jv_list_push(l, jv_str(s + st, pos[k] - st));
        st = pos[k] + m;
    }
    if (!fail) fail = jv_list_push(l, jv_str(s + st, n - st));
    free(pos);
    if (fail) {
        jv_decref(l);
        return jr_oom(r, line);
    }
    return l;
}

static jv *replace_impl(jrender *r, int line, const char *s, size_t n, const jv *old,
                        const jv *new_, int64_t count) {
    if (old->kind != JV_STRING || new_->kind != JV_STRING)
        return jr_fail(r, line, "replace() arguments must be strings");
    jbuf b = {.limit = r->lim.max_output};
    const char *o = old->u.str.s;
    size_t m = old->u.str.len;
    int64_t done = 0;
    if (m == 0) { /* insert between all characters */
        size_t i = 0;
        while (1) {
            if (count < 0 || done < count) {
                jbuf_put(&b, new_->u.str.s, new_->u.str.len);
                done++;
            }
            if (i >= n) break;
            size_t k = cp_len_at(s + i, n - i);
            jbuf_put(&b, s + i, k);
            i += k;
        }
        return new_string(r, line, &b);
    }
    size_t i = 0;
    for (const char *hit; (count < 0 || done < count) && (hit = scan(s, n, i, o, m)) != NULL; done++) {
        jbuf_put(&b, s + i, (size_t)(hit - (s + i)));
        jbuf_put(&b, new_->u.str.s, new_->u.str.len);
        i = (size_t)(hit - s) + m;
    }
    jbuf_put(&b, s + i, n - i);
    if (jv_faulted()) {
        jbuf_free(&b);
        return jr_fail(r, line, "budget");
    }
    return new_string(r, line, &b);
}

static int prefix_match(const jv *str, const jv *prefix, int suffix) {
    size_t n = str->u.str.len, m = prefix->u.str.len;
    if (m > n) return 0;
    return memcmp(str->u.str.s + (suffix ? n - m : 0), prefix->u.str.s, m) == 0;
}

/* Python's str.splitlines() (no keepends). */
static jv *splitlines_impl(jrender *r, int line, const char *s, size_t n) {
    jv *l = jv_list(0);
    if (!l) return jr_oom(r, line);
    size_t st = 0, i = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = ju8_next(s + i, n - i, &cp);
        int brk = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C ||
                  cp == 0x1D || cp == 0x1E || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
        if (brk) {
            if (jv_list_push(l, jv_str(s + st, i - st))) goto oom;
            i += k;
            if (cp == '\r' && i < n && s[i] == '\n') i++;
            st = i;
        } else {
            i += k;
        }
    }
    if (st < n && jv_list_push(l, jv_str(s + st, n - st))) goto oom;
    return l;
oom:
    jv_decref(l);
    return jr_oom(r, line);
}

/* Code-point index of the first (or last) occurrence of sub, or -1. */
static int64_t find_impl(const jv *str, const jv *sub, int last) {
    const char *s = str->u.str.s, *hit = NULL;
    size_t n = str->u.str.len, m = sub->u.str.len;
    if (m == 0) return last ? (int64_t)ju8_count(s, n) : 0;
    for (const char *p = scan(s, n, 0, sub->u.str.s, m); p; p = scan(s, n, (size_t)(p - s) + 1, sub->u.str.s, m)) {
        hit = p;
        if (!last) break;
    }
    return hit ? (int64_t)ju8_count(s, (size_t)(hit - s)) : -1;
}

/* Python's str.title(): a character after a cased one is lower-cased, others title-cased. */
static jv *py_title(jrender *r, int line, const char *s, size_t n) {
    jbuf b = {.limit = r->lim.max_output};
    int prev_cased = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = ju8_next(s + i, n - i, &cp);
        put_case(&b, s, n, i, k, cp, prev_cased ? 'l' : 't');
        prev_cased = ju_cased(cp);
        i += k;
    }
    return new_string(r, line, &b);
}

/* Python's str.capitalize(): the first character title-cased, the rest lower-cased. */
static jv *py_capitalize(jrender *r, int line, const char *s, size_t n) {
    jbuf b = {.limit = r->lim.max_output};
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = ju8_next(s + i, n - i, &cp);
        put_case(&b, s, n, i, k, cp, i == 0 ? 't' : 'l');
        i += k;
    }
    return new_string(r, line, &b);
}

/* jinja's title filter: words start after runs of "-", whitespace, "(", "{", "[", "<". */
static int title_sep(uint32_t cp) { return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || ju_isspace(cp); }

static jv *jinja_title(jrender *r, int line, const char *s, size_t n) {
    jbuf b = {.limit = r->lim.max_output};
    for (size_t i = 0; i < n;) {
        uint32_t cp, c2;
        size_t k = ju8_next(s + i, n - i, &cp), k2;
        if (title_sep(cp)) {
            jbuf_put(&b, s + i, k);
            i += k;
            continue;
        }
        /* a word: item[0].upper() + item[1:].lower(), the rest lower-cased as a string of its own */
        size_t e = i + k;
        while (e < n && !title_sep((k2 = ju8_next(s + e, n - e, &c2), c2))) e += k2;
        put_case(&b, s, n, i, k, cp, 'u');
        const char *rest = s + i + k;
        for (size_t j = 0; j < e - i - k; j += k2) {
            k2 = ju8_next(rest + j, e - i - k - j, &c2);
            put_case(&b, rest, e - i - k, j, k2, c2, 'l');
        }
        i = e;
    }
    return new_string(r, line, &b);
}

static int str_all(const jv *v, int (*pred)(uint32_t)) {
    const char *s = v->u.str.s;
    size_t n = v->u.str.len, i = 0;
    if (n == 0 || jv_work(jr_bytes_work(n))) return 0;
    while (i < n) {
        uint32_t cp;
        i += ju8_next(s + i, n - i, &cp);
        if (!pred(cp)) return 0;
    }
    return 1;
}

static int p_alnum(uint32_t cp) { return ju_isalpha(cp) || ju_isdigit(cp); }

/* islower / isupper: at least one cased character and no cased character of the other case. */
static int str_case_is(const jv *v, int want_upper) {
    const char *s = v->u.str.s;
    size_t n = v->u.str.len, i = 0;
    int cased = 0;
    if (jv_work(jr_bytes_work(n))) return 0;
    while (i < n) {
        uint32_t cp;
        i += ju8_next(s + i, n - i, &cp);
        /* Python: an upper (lower) or title case character makes islower (isupper) false */
        int kind = ju_case_kind(cp);
        if (kind == 3 || kind == (want_upper ? 1 : 2)) return 0;
        if (kind) cased = 1;
    }
    return cased;
}

/* ----------------------------------------------------------------- methods */

enum {
    M_STR_UPPER = F_METHODS_BEGIN,
    M_STR_LOWER,
    M_STR_STRIP,
    M_STR_LSTRIP,
    M_STR_RSTRIP,
    M_STR_SPLIT,
    M_STR_RSPLIT,
    M_STR_SPLITLINES,
    M_STR_STARTSWITH,
    M_STR_ENDSWITH,
    M_STR_REPLACE,
    M_STR_FIND,
    M_STR_RFIND,
    M_STR_COUNT,
    M_STR_JOIN,
    M_STR_TITLE,
    M_STR_CAPITALIZE,
    M_STR_ISDIGIT,
    M_STR_ISALPHA,
    M_STR_ISALNUM,
    M_STR_ISSPACE,
    M_STR_ISUPPER,
    M_STR_ISLOWER,
    M_STR_REMOVEPREFIX,
    M_STR_REMOVESUFFIX,
    M_DICT_GET,
    M_DICT_ITEMS,
    M_DICT_KEYS,
    M_DICT_VALUES,
    M_LIST_INDEX,
    M_LIST_COUNT,
    M_LOOP_CYCLE,
    M_END
};

static const struct {
    int id;
    jv_kind kind;
    const char *name;
} methods[] = {
    {M_STR_UPPER, JV_STRING, "upper"},
    {M_STR_LOWER, JV_STRING, "lower"},
    {M_STR_STRIP, JV_STRING, "strip"},
    {M_STR_LSTRIP, JV_STRING, "lstrip"},
    {M_STR_RSTRIP, JV_STRING, "rstrip"},
    {M_STR_SPLIT, JV_STRING, "split"},
    {M_STR_RSPLIT, JV_STRING, "rsplit"},
    {M_STR_SPLITLINES, JV_STRING, "splitlines"},
    {M_STR_STARTSWITH, JV_STRING, "startswith"},
    {M_STR_ENDSWITH, JV_STRING, "endswith"},
    {M_STR_REPLACE, JV_STRING, "replace"},
    {M_STR_FIND, JV_STRING, "find"},
    {M_STR_RFIND, JV_STRING, "rfind"},
    {M_STR_COUNT, JV_STRING, "count"},
    {M_STR_JOIN, JV_STRING, "join"},
    {M_STR_TITLE, JV_STRING, "title"},
    {M_STR_CAPITALIZE, JV_STRING, "capitalize"},
    {M_STR_ISDIGIT, JV_STRING, "isdigit"},
    {M_STR_ISALPHA, JV_STRING, "isalpha"},
    {M_STR_ISALNUM, JV_STRING, "isalnum"},
    {M_STR_ISSPACE, JV_STRING, "isspace"},
    {M_STR_ISUPPER, JV_STRING, "isupper"},
    {M_STR_ISLOWER, JV_STRING, "islower"},
    {M_STR_REMOVEPREFIX, JV_STRING, "removeprefix"},
    {M_STR_REMOVESUFFIX, JV_STRING, "removesuffix"},
    {M_DICT_GET, JV_DICT, "get"},
    {M_DICT_ITEMS, JV_DICT, "items"},
    {M_DICT_KEYS, JV_DICT, "keys"},
    {M_DICT_VALUES, JV_DICT, "values"},
    {M_LIST_INDEX, JV_LIST, "index"},
    {M_LIST_COUNT, JV_LIST, "count"},
    {M_LOOP_CYCLE, JV_LOOP, "cycle"},
};

int jb_method_id(const jv *self, const char *name, size_t len) {
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (methods[i].kind == self->kind && strlen(methods[i].name) == len &&
            memcmp(methods[i].name, name, len) == 0)
            return methods[i].id;
    return 0;
}

static const struct {
    int id;
    const char *name;
} globals[] = {
    {F_RANGE, "range"},
    {F_NAMESPACE, "namespace"},
    {F_DICT, "dict"},
    {F_RAISE_EXCEPTION, "raise_exception"},
    {F_STRFTIME_NOW, "strftime_now"},
};

int jb_global_id(const char *name) {
    for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++)
        if (!strcmp(globals[i].name, name)) return globals[i].id;
    return 0;
}

const char *jb_func_name(int id) {
    for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++)
        if (globals[i].id == id) return globals[i].name;
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (methods[i].id == id) return methods[i].name;
    return "?";
}

static jv *items_of(jrender *r, int line, const jv *d) {
    jv *l = jv_list(d->u.dict.n);
    if (!l) return jr_oom(r, line);
    for (size_t i = 0; i < d->u.dict.n; i++) {
        jv *t = jv_list(2);
        if (!t) goto oom;
        t->u.list.tuple = 1;
        if (jv_list_push(t, jv_incref(d->u.dict.keys[i])) || jv_list_push(t, jv_incref(d->u.dict.vals[i]))) {
            jv_decref(t);
            goto oom;
        }
        if (jv_list_push(l, t)) goto oom;
    }
    return l;
oom:
    jv_decref(l);
    return jr_oom(r, line);
}

/* Fills a namespace/dict from dict(*args, **kwargs)-style arguments. */
static int fill_mapping(jrender *r, int line, const char *fname, jv *target, const argv_t *a) {
    if (a->npos > 1) return jr_failc(r, line, "%s() takes at most 1 positional argument", fname);
    if (a->npos == 1) {
        jv *src = a->pos[0];
        if (src->kind == JV_DICT || src->kind == JV_NAMESPACE) {
            for (size_t i = 0; i < src->u.dict.n; i++)
                if (jv_dict_set(target, jv_incref(src->u.dict.keys[i]), jv_incref(src->u.dict.vals[i])))
                    return jr_oom(r, line), -1;
        } else if (src->kind == JV_LIST) {
            for (size_t i = 0; i < src->u.list.n; i++) {
                jv *pair = src->u.list.items[i];
                if (pair->kind != JV_LIST || pair->u.list.n != 2)
                    return jr_failc(r, line, "%s(): sequence elements must be pairs", fname);
                if (jv_dict_set(target, jv_incref(pair->u.list.items[0]), jv_incref(pair->u.list.items[1])))
                    return jr_oom(r, line), -1;
            }
        } else if (src->kind == JV_UNDEFINED) { /* Python asks the Undefined for keys(), which fails */
            jr_undefined_error(r, line, src);
            return -1;
        } else {
            return jr_failc(r, line, "%s(): '%s' object is not a mapping", fname, jv_type_name(src));
        }
    }
    for (size_t k = 0; k < a->nkw; k++)
        if (jv_dict_set(target, jv_cstr(a->kwn[k]), jv_incref(a->kwv[k])))
            return jr_oom(r, line), -1;
    return 0;
}

static jv *call_global(jrender *r, int line, int id, const argv_t *a) {
    switch (id) {
    case F_RANGE: {
        if (a->nkw) return jr_fail(r, line, "range() takes no keyword arguments");
        if (a->npos < 1 || a->npos > 3)
            return jr_fail(r, line, "range expected 1 to 3 arguments, got %zu", a->npos);
        int64_t v[3] = {0, 0, 0};
        for (size_t i = 0; i < a->npos; i++)
            if (arg_int(r, line, a->pos[i], 0, &v[i], "range() argument")) return NULL;
        int64_t start = 0, stop, stepv = 1;
        if (a->npos == 1) {
            stop = v[0];
        } else {
            start = v[0];
            stop = v[1];
            if (a->npos == 3) stepv = v[2];
        }
        if (stepv == 0) return jr_fail(r, line, "range() arg 3 must not be zero");
        /* the length, exactly: the distance fits in 64 bits unsigned */
        uint64_t count = 0;
        if (stepv > 0 && stop > start)
            count = ((uint64_t)stop - (uint64_t)start - 1) / (uint64_t)stepv + 1;
        else if (stepv < 0 && start > stop)
            count = ((uint64_t)start - (uint64_t)stop - 1) / (0 - (uint64_t)stepv) + 1;
        if (count > 100000)
            return jr_fail(r, line, "Range too big. The sandbox blocks ranges larger than "
                                    "MAX_RANGE (100000).");
        jv *l = jv_list((size_t)count);
        if (!l) return jr_oom(r, line);
        for (uint64_t i = 0; i < count; i++) /* start + i*step, in two's complement: no overflow */
            if (jv_list_push(l, jv_int((int64_t)((uint64_t)start + i * (uint64_t)stepv)))) {
                jv_decref(l);
                return jr_oom(r, line);
            }
        return l;
    }
    case F_NAMESPACE: {
        jv *ns = jv_namespace();
        if (!ns) return jr_oom(r, line);
        if (fill_mapping(r, line, "namespace", ns, a) || jr_register_namespace(r, ns)) {
            jv_decref(ns);
            return NULL;
        }
        return ns;
    }
    case F_DICT: {
        jv *d = jv_dict();
        if (!d) return jr_oom(r, line);
        if (fill_mapping(r, line, "dict", d, a)) {
            jv_decref(d);
            return NULL;
        }
        return d;
    }
    case F_RAISE_EXCEPTION: {
        jbuf b = {0};
        if (a->npos) jv_write_str(a->pos[0], &b);
        jr_fail(r, line, "%s", b.p ? b.p : "raise_exception() called");
        jbuf_free(&b);
        return NULL;
    }
    case F_STRFTIME_NOW: {
        if (a->npos != 1 || a->pos[0]->kind != JV_STRING)
            return jr_fail(r, line, "strftime_now() takes one format string");
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        char out[512];
        size_t n = strftime(out, sizeof out, a->pos[0]->u.str.s, &tm);
        jv *v = jv_str(out, n);
        return v ? v : jr_oom(r, line);
    }
    }
    return jr_fail(r, line, "unknown function");
}

static jv *call_method(jrender *r, int line, int id, jv *self, const argv_t *a) {
    const char *s = self->kind == JV_STRING ? self->u.str.s : NULL;
    size_t n = self->kind == JV_STRING ? self->u.str.len : 0;
    switch (id) {
    case M_STR_UPPER:
    case M_STR_LOWER:
        if (a->npos || a->nkw) return jr_fail(r, line, "%s() takes no arguments", jb_func_name(id));
        return case_map(r, line, s, n, id == M_STR_UPPER);
    case M_STR_STRIP:
    case M_STR_LSTRIP:
    case M_STR_RSTRIP: {
        BIND("strip", "chars");
        return strip_impl(r, line, s, n, A_[0], id != M_STR_RSTRIP, id != M_STR_LSTRIP);
    }
    case M_STR_SPLIT:
    case M_STR_RSPLIT: {
        BIND("split", "sep", "maxsplit");
        int64_t maxsplit = 0;
        if (arg_int(r, line, A_[1], -1, &maxsplit, "maxsplit")) return NULL;
        return split_impl(r, line, s, n, A_[0], maxsplit, id == M_STR_RSPLIT);
    }
    case M_STR_SPLITLINES: {
        BIND("splitlines", "keepends");
        if (A_[0] && jv_truthy(A_[0])) return jr_fail(r, line, "splitlines(keepends=True) is not supported");
        return splitlines_impl(r, line, s, n);
    }
    case M_STR_STARTSWITH:
    case M_STR_ENDSWITH: {
        BIND(id == M_STR_STARTSWITH ? "startswith" : "endswith", "prefix");
        const jv *p = A_[0];
        if (!p) return jr_fail(r, line, "startswith/endswith need an argument");
        int suffix = id == M_STR_ENDSWITH;
        if (p->kind == JV_STRING) return jv_bool(prefix_match(self, p, suffix));
        if (p->kind == JV_LIST) {
            for (size_t i = 0; i < p->u.list.n; i++) {
                if (p->u.list.items[i]->kind != JV_STRING)
                    return jr_fail(r, line, "tuple for startswith/endswith must only contain str");
                if (prefix_match(self, p->u.list.items[i], suffix)) return jv_bool(1);
            }
            return jv_bool(0);
        }
        return jr_fail(r, line, "startswith/endswith first arg must be str or a tuple of str, not %s",
                       jv_type_name(p));
    }
    case M_STR_REPLACE: {
        BIND("replace", "old", "new", "count");
        if (!A_[0] || !A_[1]) return jr_fail(r, line, "replace() takes at least 2 arguments");
        int64_t count = 0;
        if (arg_int(r, line, A_[2], -1, &count, "count")) return NULL;
        return replace_impl(r, line, s, n, A_[0], A_[1], count);
    }
    case M_STR_FIND:
    case M_STR_RFIND:
    case M_STR_COUNT: {
        BIND(id == M_STR_COUNT ? "count" : "find", "sub");
        if (!A_[0] || A_[0]->kind != JV_STRING)
            return jr_fail(r, line, "must be str, not %s", A_[0] ? jv_type_name(A_[0]) : "nothing");
        if (id != M_STR_COUNT) return jv_int(find_impl(self, A_[0], id == M_STR_RFIND));
        size_t m = A_[0]->u.str.len;
        if (m == 0) return jv_int((int64_t)ju8_count(s, n) + 1);
        int64_t c = 0;
        for (const char *p = scan(s, n, 0, A_[0]->u.str.s, m); p; p = scan(s, n, (size_t)(p - s) + m, A_[0]->u.str.s, m))
            c++;
        return jv_faulted() ? jr_fail(r, line, "budget") : jv_int(c);
    }
    case M_STR_JOIN: {
        BIND("join", "iterable");
        if (!A_[0]) return jr_fail(r, line, "join() takes exactly one argument");
        jv *items = jr_iterate(r, line, A_[0]);
        if (!items) return NULL;
        jbuf b = {.limit = r->lim.max_output};
        for (size_t i = 0; i < items->u.list.n; i++) {
            jv *it = items->u.list.items[i];
            if (it->kind != JV_STRING) {
                jbuf_free(&b);
                jv_decref(items);
                return jr_fail(r, line, "sequence item %zu: expected str instance, %s found", i,
                               jv_type_name(it));
            }
            if (i) jbuf_put(&b, s, n);
            jbuf_put(&b, it->u.str.s, it->u.str.len);
        }
        jv_decref(items);
        return new_string(r, line, &b);
    }
    case M_STR_TITLE:
        return py_title(r, line, s, n);
    case M_STR_CAPITALIZE:
        return py_capitalize(r, line, s, n);
    case M_STR_ISDIGIT:
        return jv_bool(str_all(self, ju_isdigit));
    case M_STR_ISALPHA:
        return jv_bool(str_all(self, ju_isalpha));
    case M_STR_ISALNUM:
        return jv_bool(str_all(self, p_alnum));
    case M_STR_ISSPACE:
        return jv_bool(str_all(self, ju_isspace));
    case M_STR_ISUPPER:
        return jv_bool(str_case_is(self, 1));
    case M_STR_ISLOWER:
        return jv_bool(str_case_is(self, 0));
    case M_STR_REMOVEPREFIX:
    case M_STR_REMOVESUFFIX: {
        BIND("removeprefix", "prefix");
        if (!A_[0] || A_[0]->kind != JV_STRING) return jr_fail(r, line, "argument must be str");
        int suffix = id == M_STR_REMOVESUFFIX;
        if (!prefix_match(self, A_[0], suffix)) return jv_incref(self);
        size_t m = A_[0]->u.str.len;
        jv *v = suffix ? jv_str(s, n - m) : jv_str(s + m, n - m);
        return v ? v : jr_oom(r, line);
    }
    case M_DICT_GET: {
        BIND("get", "key", "default");
        if (!A_[0]) return jr_fail(r, line, "get expected at least 1 argument, got 0");
        jv *v = jv_dict_get(self, A_[0]);
        if (v) return jv_incref(v);
        return A_[1] ? jv_incref(A_[1]) : jv_none();
    }
    case M_DICT_ITEMS:
        return items_of(r, line, self);
    case M_DICT_KEYS:
    case M_DICT_VALUES: {
        jv *l = jv_list(self->u.dict.n);
        if (!l) return jr_oom(r, line);
        for (size_t i = 0; i < self->u.dict.n; i++)
            if (jv_list_push(l, jv_incref(id == M_DICT_KEYS ? self->u.dict.keys[i] : self->u.dict.vals[i]))) {
                jv_decref(l);
                return jr_oom(r, line);
            }
        return l;
    }
    case M_LIST_INDEX:
    case M_LIST_COUNT: {
        BIND(id == M_LIST_INDEX ? "index" : "count", "value");
        if (!A_[0]) return jr_fail(r, line, "missing argument");
        int64_t c = 0;
        for (size_t i = 0; i < self->u.list.n; i++)
            if (jv_eq(self->u.list.items[i], A_[0])) {
                if (id == M_LIST_INDEX) return jv_int((int64_t)i);
                c++;
            }
        if (id == M_LIST_INDEX) return jr_fail(r, line, "value is not in list");
        return jv_int(c);
    }
    case M_LOOP_CYCLE:
        if (a->npos == 0) return jr_fail(r, line, "no items for cycling given");
        return jv_incref(a->pos[self->u.loop.index0 % a->npos]);
    }
    return jr_fail(r, line, "unknown method");
}

jv *jb_call_func(jrender *r, int line, int id, jv *self, jv **pos, size_t npos,
                 const char **kwnames, jv **kwvals, size_t nkw) {
    argv_t a = {pos, npos, kwnames, kwvals, nkw};
    if (!self) return call_global(r, line, id, &a);
    return call_method(r, line, id, self, &a);
}

/* ------------------------------------------------------------------ tests */

static const char *const test_names[] = {
    "defined", "undefined", "none",     "boolean", "false",     "true",     "integer",
    "float",   "number",    "string",   "mapping", "sequence",  "iterable", "callable",
    "sameas",  "escaped",   "in",       "odd",     "even",      "divisibleby", "eq",
    "equalto", "==",        "ne",       "!=",      "lt",        "lessthan", "<",
    "le",      "<=",        "gt",       "greaterthan", ">",     "ge",       ">=",
    "lower",   "upper",     "filter",   "test",    NULL};

int jb_has_test(const char *name) {
    for (size_t i = 0; test_names[i]; i++)
        if (!strcmp(test_names[i], name)) return 1;
    return 0;
}

static int need_arg(jrender *r, int line, const char *name, const argv_t *a) {
    if (a->npos + a->nkw < 1) return jr_failc(r, line, "test '%s' needs an argument", name);
    return 0;
}

static int cmp_test(jrender *r, int line, const char *op, jv *v, jv *o) {
    if (v->kind == JV_UNDEFINED) return jr_undefined_error(r, line, v), -1;
    if (o->kind == JV_UNDEFINED) return jr_undefined_error(r, line, o), -1;
    int c;
    if (jv_cmp(v, o, &c))
        return jr_failc(r, line, "'%s' not supported between instances of '%s' and '%s'", op,
                        jv_type_name(v), jv_type_name(o));
    if (c == 2) return 0;
    if (!strcmp(op, "<")) return c < 0;
    if (!strcmp(op, "<=")) return c <= 0;
    if (!strcmp(op, ">")) return c > 0;
    return c >= 0;
}

int jb_test(jrender *r, int line, const char *name, jv *v, jv **pos, size_t npos,
            const char **kwnames, jv **kwvals, size_t nkw) {
    argv_t a = {pos, npos, kwnames, kwvals, nkw};
    jv *arg = npos ? pos[0] : nkw ? kwvals[0] : NULL;
    static const char *const unary[] = {"defined", "undefined", "none", "boolean", "false", "true",
                                        "integer", "float", "number", "string", "mapping",
                                        "sequence", "iterable", "callable", "escaped", "odd",
                                        "even", "lower", "upper", "filter", "test", NULL};
    for (size_t k = 0; unary[k]; k++)
        if (!strcmp(unary[k], name) && npos + nkw > 0)
            return jr_failc(r, line, "test '%s' takes no argument (%zu given)", name, npos + nkw);
#define T(s) (!strcmp(name, s))
    if (T("defined")) return v->kind != JV_UNDEFINED;
    if (T("undefined")) return v->kind == JV_UNDEFINED;
    if (T("none")) return v->kind == JV_NONE;
    if (T("boolean")) return v->kind == JV_BOOL;
    if (T("false")) return v->kind == JV_BOOL && !v->u.b;
    if (T("true")) return v->kind == JV_BOOL && v->u.b;
    if (T("integer")) return v->kind == JV_INT;
    if (T("float")) return v->kind == JV_FLOAT;
    if (T("number")) return jv_is_number(v);
    if (T("string")) return v->kind == JV_STRING;
    if (T("mapping")) return v->kind == JV_DICT;
    if (T("sequence"))
        return v->kind == JV_STRING || (v->kind == JV_LIST && !v->u.list.gen) ||
               v->kind == JV_DICT || v->kind == JV_UNDEFINED;
    if (T("iterable"))
        return v->kind == JV_STRING || v->kind == JV_LIST || v->kind == JV_DICT ||
               v->kind == JV_UNDEFINED || v->kind == JV_LOOP;
    if (T("callable"))
        return v->kind == JV_MACRO || v->kind == JV_FUNC || v->kind == JV_UNDEFINED;
    if (T("escaped")) return 0;
    if (T("lower") || T("upper")) {
        jbuf tmp = {0};
        const char *s;
        size_t n;
        view_str(v, &tmp, &s, &n);
        jv fake = {.kind = JV_STRING, .refs = -1};
        fake.u.str.s = (char *)s;
        fake.u.str.len = n;
        int res = str_case_is(&fake, T("upper"));
        jbuf_free(&tmp);
        return res;
    }
    if (T("odd") || T("even")) {
        if (v->kind != JV_INT && v->kind != JV_BOOL) {
            if (v->kind == JV_UNDEFINED) return jr_undefined_error(r, line, v), -1;
            if (v->kind != JV_FLOAT) return jr_failc(r, line, "test '%s' needs a number, not '%s'", name, jv_type_name(v));
            double m = fmod(v->u.f, 2.0);
            return T("odd") ? fabs(m) == 1.0 : m == 0.0;
        }
        int64_t x = v->kind == JV_BOOL ? v->u.b : v->u.i;
        int odd = (x % 2) != 0;
        return T("odd") ? odd : !odd;
    }
    if (T("filter")) return v->kind == JV_STRING && jb_has_filter(v->u.str.s);
    if (T("test")) return v->kind == JV_STRING && jb_has_test(v->u.str.s);
    if (!jb_has_test(name)) return jr_failc(r, line, "no test named '%s'", name);
    if (need_arg(r, line, name, &a)) return -1;
    if (T("sameas")) {
        if (v->kind != arg->kind) return 0;
        if (v->kind == JV_NONE || v->kind == JV_UNDEFINED) return 1;
        if (v->kind == JV_BOOL) return v->u.b == arg->u.b;
        return v == arg;
    }
    if (T("in")) {
        if (arg->kind == JV_STRING) {
            if (v->kind != JV_STRING)
                return jr_failc(r, line, "'in <string>' requires string as left operand, not %s", jv_type_name(v));
            if (jr_work(r, line, jr_bytes_work(arg->u.str.len))) return -1;
            return v->u.str.len == 0 ||
                   memmem(arg->u.str.s, arg->u.str.len, v->u.str.s, v->u.str.len) != NULL;
        }
        if (arg->kind == JV_LIST) {
            for (size_t i = 0; i < arg->u.list.n; i++)
                if (jv_eq(arg->u.list.items[i], v)) return 1;
            return 0;
        }
        if (arg->kind == JV_DICT) return jv_dict_get(arg, v) != NULL;
        if (arg->kind == JV_UNDEFINED) return 0;
        return jr_failc(r, line, "argument of type '%s' is not iterable", jv_type_name(arg));
    }
    if (T("divisibleby")) {
        if (!jv_is_number(v) || !jv_is_number(arg))
            return jr_failc(r, line, "divisibleby needs numbers");
        if (v->kind != JV_FLOAT && arg->kind != JV_FLOAT) {
            int64_t x = v->kind == JV_BOOL ? v->u.b : v->u.i, y = arg->kind == JV_BOOL ? arg->u.b : arg->u.i;
            if (y == 0) return jr_failc(r, line, "integer division or modulo by zero");
            return x % y == 0;
        }
        if (jv_num(arg) == 0) return jr_failc(r, line, "float modulo");
        return fmod(jv_num(v), jv_num(arg)) == 0;
    }
    if (T("eq") || T("equalto") || T("==")) return jv_eq(v, arg);
    if (T("ne") || T("!=")) return !jv_eq(v, arg);
    if (T("lt") || T("lessthan") || T("<")) return cmp_test(r, line, "<", v, arg);
    if (T("le") || T("<=")) return cmp_test(r, line, "<=", v, arg);
    if (T("gt") || T("greaterthan") || T(">")) return cmp_test(r, line, ">", v, arg);
    if (T("ge") || T(">=")) return cmp_test(r, line, ">=", v, arg);
#undef T
    return jr_failc(r, line, "no test named '%s'", name);
}

/* ----------------------------------------------------------------- filters */

static const char *const filter_names[] = {
    "abs",      "attr",   "batch",      "capitalize", "center", "count",    "d",        "default",
    "dictsort", "e",      "escape",     "first",   "float",     "format",   "indent",
    "int",      "items",  "join",       "last",    "length",    "list",     "lower",
    "map",      "max",    "min",        "reject",  "rejectattr", "replace", "reverse",
    "round",    "safe",   "select",     "selectattr", "slice",  "sort",     "string",   "sum",
    "title",    "tojson", "trim",       "truncate", "unique",   "upper",     "wordcount", NULL};

int jb_has_filter(const char *name) {
    for (size_t i = 0; filter_names[i]; i++)
        if (!strcmp(filter_names[i], name)) return 1;
    return 0;
}

static jv *f_length(jrender *r, int line, jv *v) {
    switch (v->kind) {
    case JV_STRING:
        return jv_int((int64_t)ju8_count(v->u.str.s, v->u.str.len));
    case JV_LIST:
        if (v->u.list.gen) return jr_fail(r, line, "object of type 'generator' has no len()");
        return jv_int((int64_t)v->u.list.n);
    case JV_DICT:
        return jv_int((int64_t)v->u.dict.n);
    case JV_UNDEFINED:
        return jv_int(0);
    case JV_LOOP:
        return jv_int((int64_t)v->u.loop.length);
    default:
        return jr_fail(r, line, "object of type '%s' has no len()", jv_type_name(v));
    }
}

/* Items of the value for a filter that iterates it ("if value" first: falsy -> nothing). */
static jv *filter_items(jrender *r, int line, jv *v) {
    if (!jv_truthy(v) && v->kind != JV_LOOP) return jv_list(0);
    return jr_iterate(r, line, v);
}

/* map / select / reject / selectattr / rejectattr */
static jv *f_map_select(jrender *r, int line, const char *fname, jv *v, const argv_t *a) {
    int is_map = !strcmp(fname, "map");
    int attr_mode = !strcmp(fname, "selectattr") || !strcmp(fname, "rejectattr");
    int reject = !strcmp(fname, "reject") || !strcmp(fname, "rejectattr");
    jv *items = filter_items(r, line, v);
    if (!items) return NULL;
    jv *out = jv_list(0);
    if (!out) {
        jv_decref(items);
        return jr_oom(r, line);
    }
    const jv *attribute = NULL, *deflt = NULL;
    const char *name = NULL;
    size_t first_extra = 0;
    if (is_map) {
        if (a->npos == 0) {
            for (size_t k = 0; k < a->nkw; k++) {
                if (!strcmp(a->kwn[k], "attribute"))
                    attribute = a->kwv[k];
                else if (!strcmp(a->kwn[k], "default"))
                    deflt = a->kwv[k]->kind == JV_NONE ? NULL : a->kwv[k]; /* jinja2: `default is not None` */
                else {
                    jr_fail(r, line, "map() got an unexpected keyword argument '%s'", a->kwn[k]);
                    goto fail;
                }
            }
            if (!attribute) {
                jr_fail(r, line, "map() needs a filter name or attribute=");
                goto fail;
            }
        } else {
            if (a->pos[0]->kind != JV_STRING) {
                jr_fail(r, line, "map() filter name must be a string");
                goto fail;
            }
            name = a->pos[0]->u.str.s;
            first_extra = 1;
        }
    } else if (attr_mode) {
        if (a->npos == 0) {
            jr_fail(r, line, "%s() needs an attribute name", fname);
            goto fail;
        }
        attribute = a->pos[0];
        if (a->npos > 1) {
            if (a->pos[1]->kind != JV_STRING) {
                jr_fail(r, line, "test name must be a string");
                goto fail;
            }
            name = a->pos[1]->u.str.s;
            first_extra = 2;
        }
    } else if (a->npos > 0) {
        if (a->pos[0]->kind != JV_STRING) {
            jr_fail(r, line, "test name must be a string");
            goto fail;
        }
        name = a->pos[0]->u.str.s;
        first_extra = 1;
    }
    for (size_t i = 0; i < items->u.list.n; i++) {
        jv *item = items->u.list.items[i];
        jv *subject = attribute ? get_attribute_path(r, line, item, attribute, deflt) : jv_incref(item);
        if (!subject) goto fail;
        if (is_map) {
            jv *res;
            if (name) {
                size_t ne = a->npos - first_extra;
                res = jb_filter(r, line, name, subject, a->pos + first_extra, ne, a->kwn, a->kwv, a->nkw);
                jv_decref(subject);
            } else {
                res = subject;
            }
            if (!res || jv_list_push(out, res)) goto fail;
            continue;
        }
        int t;
        if (name) {
            size_t ne = a->npos > first_extra ? a->npos - first_extra : 0;
            t = jb_test(r, line, name, subject, a->pos + first_extra, ne, a->kwn, a->kwv, a->nkw);
        } else {
            t = jv_truthy(subject);
        }
        jv_decref(subject);
        if (t < 0) goto fail;
        if (t != reject && jv_list_push(out, jv_incref(item))) goto fail;
    }
    jv_decref(items);
    out->u.list.gen = 1;
    return out;
fail:
    jv_decref(items);
    jv_decref(out);
    if (!r->err->msg[0]) jr_oom(r, line);
    return NULL;
}

/* sort(attribute="age,name"): the key is the list of the comma-separated attributes' values
 * (jinja2's make_multi_attrgetter), each lower-cased unless case_sensitive. */
static jv *multi_attribute_key(jrender *r, int line, jv *item, const jv *attribute, int case_sensitive) {
    jv *key = jv_list(0);
    if (!key) return jr_oom(r, line);
    const char *s = attribute->u.str.s;
    size_t n = attribute->u.str.len, i = 0;
    while (1) {
        size_t j = i;
        while (j < n && s[j] != ',') j++;
        jv *part = jv_str(s + i, j - i), *k = part ? get_attribute_path(r, line, item, part, NULL) : jr_oom(r, line);
        if (part) jv_decref(part);
        if (k && !case_sensitive) {
            jv *low = lowered(r, line, k);
            jv_decref(k);
            k = low;
        }
        if (!k || jv_list_push(key, k)) {
            jv_decref(key);
            return k ? jr_oom(r, line) : NULL;
        }
        if (j >= n) break;
        i = j + 1;
    }
    return key;
}

/* sort / dictsort / unique / min / max share the key computation (multi: sort's attribute may
 * name several, separated by commas). */
static sort_entry *make_entries(jrender *r, int line, jv *items, const jv *attribute,
                                int case_sensitive, int pair_pos, int multi) {
    size_t n = items->u.list.n;
    sort_entry *e = calloc(n ? n : 1, sizeof *e);
    if (!e) return jr_oom(r, line), NULL;
    for (size_t i = 0; i < n; i++) {
        jv *item = items->u.list.items[i];
        jv *k;
        if (pair_pos >= 0)
            k = jv_incref(item->u.list.items[pair_pos]);
        else if (multi && attribute && attribute->kind == JV_STRING && memchr(attribute->u.str.s, ',', attribute->u.str.len))
            k = multi_attribute_key(r, line, item, attribute, case_sensitive);
        else if (attribute)
            k = get_attribute_path(r, line, item, attribute, NULL);
        else
            k = jv_incref(item);
        if (k && !case_sensitive) { /* (a multi-attribute key, a list, is lowered already) */
            jv *low = lowered(r, line, k);
            jv_decref(k);
            k = low;
        }
        if (!k) {
            free_entries(e, i);
            return NULL;
        }
        e[i].key = k;
        e[i].item = jv_incref(item);
    }
    return e;
}

static jv *entries_to_list(jrender *r, int line, sort_entry *e, size_t n) {
    jv *l = jv_list(n);
    if (!l) {
        free_entries(e, n);
        return jr_oom(r, line);
    }
    int bad = 0;
    for (size_t i = 0; i < n && !bad; i++) bad = jv_list_push(l, jv_incref(e[i].item));
    free_entries(e, n);
    if (bad) {
        jv_decref(l);
        return jr_oom(r, line);
    }
    return l;
}

static jv *f_sortlike(jrender *r, int line, const char *fname, jv *v, const argv_t *a) {
    int is_dictsort = !strcmp(fname, "dictsort");
    jv *A[4] = {NULL, NULL, NULL, NULL};
    int reverse = 0, case_sensitive = 0, pair_pos = -1;
    const jv *attribute = NULL;
    jv *items;
    if (is_dictsort) {
        static const char *const names[] = {"case_sensitive", "by", "reverse"};
        if (bind(r, line, fname, names, 3, a, A)) return NULL;
        case_sensitive = arg_bool(A[0], 0);
        reverse = arg_bool(A[2], 0);
        pair_pos = 0;
        if (A[1]) {
            if (A[1]->kind == JV_STRING && !strcmp(A[1]->u.str.s, "value"))
                pair_pos = 1;
            else if (!(A[1]->kind == JV_STRING && !strcmp(A[1]->u.str.s, "key")))
                return jr_fail(r, line, "You can only sort by either \"key\" or \"value\"");
        }
        if (v->kind == JV_UNDEFINED) return jr_undefined_error(r, line, v);
        if (v->kind != JV_DICT) return jr_fail(r, line, "dictsort: '%s' object has no attribute 'items'", jv_type_name(v));
        items = items_of(r, line, v);
    } else if (!strcmp(fname, "sort")) {
        static const char *const names[] = {"reverse", "case_sensitive", "attribute"};
        if (bind(r, line, fname, names, 3, a, A)) return NULL;
        reverse = arg_bool(A[0], 0);
        case_sensitive = arg_bool(A[1], 0);
        attribute = A[2];
        items = jr_iterate(r, line, v);
    } else { /* unique, min, max */
        static const char *const names[] = {"case_sensitive", "attribute"};
        if (bind(r, line, fname, names, 2, a, A)) return NULL;
        case_sensitive = arg_bool(A[0], 0);
        attribute = A[1];
        items = jr_iterate(r, line, v);
    }
    if (!items) return NULL;
    size_t n = items->u.list.n;
    sort_entry *e = make_entries(r, line, items, attribute, case_sensitive, pair_pos, !strcmp(fname, "sort"));
    jv_decref(items);
    if (!e) return NULL;
    if (!strcmp(fname, "unique")) {
        size_t kept = 0;
        for (size_t i = 0; i < n; i++) {
            int dup = 0;
            for (size_t j = 0; j < kept && !dup && !jv_faulted(); j++) dup = jv_eq(e[j].key, e[i].key);
            if (dup) {
                jv_decref(e[i].key);
                jv_decref(e[i].item);
            } else {
                e[kept++] = e[i];
            }
        }
        if (jv_faulted()) {
            free_entries(e, kept);
            return jr_fail(r, line, "budget");
        }
        jv *res = entries_to_list(r, line, e, kept);
        if (res) res->u.list.gen = 1;
        return res;
    }
    if (!strcmp(fname, "min") || !strcmp(fname, "max")) {
        if (n == 0) {
            free_entries(e, n);
            return jv_undefined_hint("No aggregated item, sequence was empty.");
        }
        int want = !strcmp(fname, "max") ? 1 : -1;
        size_t best = 0;
        for (size_t i = 1; i < n; i++) {
            int c;
            if (jv_cmp(e[i].key, e[best].key, &c)) {
                jr_fail(r, line, "'<' not supported between instances of '%s' and '%s'",
                        jv_type_name(e[i].key), jv_type_name(e[best].key));
                free_entries(e, n);
                return NULL;
            }
            if (c == want) best = i;
        }
        jv *res = jv_incref(e[best].item);
        free_entries(e, n);
        return res;
    }
    if (sort_entries(r, line, e, n, reverse)) {
        free_entries(e, n);
        return NULL;
    }
    return entries_to_list(r, line, e, n);
}

/* batch(linecount, fill_with=None) and slice(slices, fill_with=None): jinja2's generators of
 * lists, as written there (batch: a chunk goes out when it holds linecount items and another one
 * comes; slice: `slices` columns, the first len % slices one item longer, the others filled). */
static jv *f_batch_slice(jrender *r, int line, int is_slice, jv *v, const argv_t *a) {
    static const char *const batch_names[] = {"linecount", "fill_with"}, *const slice_names[] = {"slices", "fill_with"};
    jv *A_[2];
    if (bind(r, line, is_slice ? "slice" : "batch", is_slice ? slice_names : batch_names, 2, a, A_)) return NULL;
    int64_t count = 0;
    if (!A_[0]) return jr_fail(r, line, "%s() missing 1 required positional argument: '%s'",
                               is_slice ? "do_slice" : "do_batch", is_slice ? "slices" : "linecount");
    if (A_[0]->kind == JV_NONE) return jr_fail(r, line, "'NoneType' object cannot be interpreted as an integer");
    if (arg_int(r, line, A_[0], 0, &count, is_slice ? "slices" : "linecount")) return NULL;
    const jv *fill = A_[1] && A_[1]->kind != JV_NONE ? A_[1] : NULL;
    jv *items = jr_iterate(r, line, v);
    if (!items) return NULL;
    size_t n = items->u.list.n;
    if (is_slice && count == 0) {
        jv_decref(items);
        return jr_fail(r, line, "integer division or modulo by zero");
    }
    jv *out = jv_list(0);
    if (!out || jr_work(r, line, n)) goto fail;
    if (is_slice) {
        /* Python's floor division and modulo (count may be negative: then range() is empty) */
        int64_t len = (int64_t)n, per = len / count, extra = len % count;
        if (extra != 0 && (extra < 0) != (count < 0)) {
            per--;
            extra += count;
        }
        int64_t offset = 0;
        for (int64_t k = 0; k < count; k++) {
            int64_t start = offset + k * per;
            if (k < extra) offset++;
            int64_t end = offset + (k + 1) * per;
            if (start < 0) start = 0;
            if (end > len) end = len;
            jv *chunk = jv_list(end > start ? (size_t)(end - start) : 0);
            if (!chunk) goto fail;
            for (int64_t i = start; i < end; i++)
                if (jv_list_push(chunk, jv_incref(items->u.list.items[i]))) goto fail_chunk;
            if (fill && k >= extra && jv_list_push(chunk, jv_incref((jv *)fill))) goto fail_chunk;
            if (jv_list_push(out, chunk)) goto fail;
            if (jr_work(r, line, 1)) goto fail;
            continue;
        fail_chunk:
            jv_decref(chunk);
            goto fail;
        }
    } else {
        jv *tmp = jv_list(0);
        if (!tmp) goto fail;
        for (size_t i = 0; i < n; i++) {
            if ((int64_t)tmp->u.list.n == count) {
                if (jv_list_push(out, tmp)) goto fail;
                if (!(tmp = jv_list(0))) goto fail;
            }
            if (jv_list_push(tmp, jv_incref(items->u.list.items[i]))) {
                jv_decref(tmp);
                goto fail;
            }
        }
        if (tmp->u.list.n) {
            for (int64_t k = (int64_t)tmp->u.list.n; fill && k < count; k++)
                if (jv_list_push(tmp, jv_incref((jv *)fill)) || jr_work(r, line, 1)) {
                    jv_decref(tmp);
                    goto fail;
                }
            if (jv_list_push(out, tmp)) goto fail;
        } else {
            jv_decref(tmp);
        }
    }
    jv_decref(items);
    out->u.list.gen = 1;
    return out;
fail:
    jv_decref(items);
    if (out) jv_decref(out);
    if (!r->err->msg[0]) jr_oom(r, line);
    return NULL;
}

static jv *f_indent(jrender *r, int line, jv *v, const argv_t *a) {
    BIND("indent", "width", "first", "blank");
    jbuf ind = {0};
    if (A_[0] && A_[0]->kind == JV_STRING) {
        jbuf_put(&ind, A_[0]->u.str.s, A_[0]->u.str.len);
    } else {
        int64_t w = 0;
        if (arg_int(r, line, A_[0], 4, &w, "width")) return NULL;
        for (int64_t i = 0; i < w && i < 10000; i++) jbuf_putc(&ind, ' ');
    }
    const char *indent = ind.p ? ind.p : "";
    if (v->kind != JV_STRING) { /* jinja2 does `s += "\n"` */
        jbuf_free(&ind);
        if (v->kind == JV_UNDEFINED) return jr_undefined_error(r, line, v);
        return jr_fail(r, line, "unsupported operand type(s) for +=: '%s' and 'str'", jv_type_name(v));
    }
    jbuf tmp = {0};
    jv_write_str(v, &tmp);
    jbuf_putc(&tmp, '\n');
    jv *lines = splitlines_impl(r, line, tmp.p, tmp.len);
    jbuf_free(&tmp);
    if (!lines) {
        jbuf_free(&ind);
        return NULL;
    }
    jbuf b = {.limit = r->lim.max_output};
    int blank = arg_bool(A_[2], 0);
    if (arg_bool(A_[1], 0)) jbuf_puts(&b, indent);
    for (size_t i = 0; i < lines->u.list.n; i++) {
        jv *ln = lines->u.list.items[i];
        if (i) {
            jbuf_putc(&b, '\n');
            if (blank || ln->u.str.len) jbuf_puts(&b, indent);
        }
        jbuf_put(&b, ln->u.str.s, ln->u.str.len);
    }
    jv_decref(lines);
    jbuf_free(&ind);
    return new_string(r, line, &b);
}

static jv *f_tojson(jrender *r, int line, jv *v, const argv_t *a) {
    BIND("tojson", "ensure_ascii", "indent", "separators", "sort_keys");
    /* Python's json: an int indent is that many spaces (none when negative), a str is the text
     * of one level; either puts items on lines of their own */
    char unit[1001];
    const char *indent = NULL;
    if (A_[1] && A_[1]->kind == JV_STRING) {
        if (A_[1]->u.str.len >= sizeof unit || memchr(A_[1]->u.str.s, 0, A_[1]->u.str.len))
            return jr_fail(r, line, "tojson: indent text too long");
        memcpy(unit, A_[1]->u.str.s, A_[1]->u.str.len + 1);
        indent = unit;
    } else if (A_[1] && A_[1]->kind != JV_NONE) {
        int64_t width = 0;
        if (arg_int(r, line, A_[1], 0, &width, "indent")) return NULL;
        if (width > 1000) width = 1000;
        if (width < 0) width = 0;
        memset(unit, ' ', (size_t)width);
        unit[width] = 0;
        indent = unit;
    }
    const char *item_sep = indent ? "," : ", ", *key_sep = ": ";
    char seps[2][64];
    if (A_[2] && A_[2]->kind != JV_NONE) {
        const jv *s = A_[2];
        if (s->kind != JV_LIST || s->u.list.n != 2 || s->u.list.items[0]->kind != JV_STRING ||
            s->u.list.items[1]->kind != JV_STRING || s->u.list.items[0]->u.str.len >= 64 ||
            s->u.list.items[1]->u.str.len >= 64)
            return jr_fail(r, line, "tojson: separators must be a pair of short strings");
        snprintf(seps[0], sizeof seps[0], "%s", s->u.list.items[0]->u.str.s);
        snprintf(seps[1], sizeof seps[1], "%s", s->u.list.items[1]->u.str.s);
        item_sep = seps[0];
        key_sep = seps[1];
    }
    jbuf b = {.limit = r->lim.max_output};
    char emsg[200] = "";
    if (jv_write_json(v, &b, indent, item_sep, key_sep,
                      arg_bool(A_[3], 0), arg_bool(A_[0], 0), emsg, sizeof emsg)) {
        jbuf_free(&b);
        return jr_fail(r, line, "tojson: %s", emsg);
    }
    return new_string(r, line, &b);
}

/* Python's int() and float() read any Unicode decimal digit (Nd: '１２', '٣') and white space:
 * they turn the text into ASCII first.  Points *s at tmp when it has non-ASCII characters; -1 when
 * one of them is neither (or tmp is too small): then it is no number. */
static int ascii_number_text(const char **s, size_t *n, char *tmp, size_t cap) {
    static const uint32_t zeros[] = {
        0x660,   0x6F0,   0x7C0,   0x966,   0x9E6,   0xA66,   0xAE6,   0xB66,   0xBE6,   0xC66,   0xCE6,
        0xD66,   0xDE6,   0xE50,   0xED0,   0xF20,   0x1040,  0x1090,  0x17E0,  0x1810,  0x1946,  0x19D0,
        0x1A80,  0x1A90,  0x1B50,  0x1BB0,  0x1C40,  0x1C50,  0xA620,  0xA8D0,  0xA900,  0xA9D0,  0xA9F0,
        0xAA50,  0xABF0,  0xFF10,  0x104A0, 0x10D30, 0x11066, 0x110F0, 0x11136, 0x111D0, 0x112F0, 0x11450,
        0x114D0, 0x11650, 0x116C0, 0x11730, 0x118E0, 0x11950, 0x11C50, 0x11D50, 0x11DA0, 0x16A60, 0x16AC0,
        0x16B50, 0x1D7CE, 0x1D7D8, 0x1D7E2, 0x1D7EC, 0x1D7F6, 0x1E140, 0x1E2F0, 0x1E950, 0x1FBF0};
    size_t i = 0, k = 0;
    while (i < *n && !((unsigned char)(*s)[i] & 0x80)) i++;
    if (i == *n) return 0;
    for (i = 0; i < *n;) {
        uint32_t cp;
        i += ju8_next(*s + i, *n - i, &cp);
        char c = 0;
        if (cp < 0x80)
            c = (char)cp;
        else if (ju_isspace(cp))
            c = ' ';
        else
            for (size_t z = 0; z < sizeof zeros / sizeof zeros[0] && !c; z++)
                if (cp >= zeros[z] && cp < zeros[z] + 10) c = (char)('0' + (cp - zeros[z]));
        if (!c || k + 1 >= cap) return -1;
        tmp[k++] = c;
    }
    *s = tmp;
    *n = k;
    return 0;
}

/* Python's int(str, base) with surrounding whitespace and underscores between digits. */
static int parse_int_str(const char *s, size_t n, int base, int64_t *out) {
    char ascii[512];
    if (ascii_number_text(&s, &n, ascii, sizeof ascii)) return -1;
    size_t a = ju8_lspace(s, n), b = n - ju8_rspace(s, n);
    if (a >= b) return -1;
    int neg = 0;
    if (s[a] == '+' || s[a] == '-') neg = s[a++] == '-';
    if (base == 0 || base == 16 || base == 8 || base == 2) {
        if (b - a > 2 && s[a] == '0') {
            char c = (char)(s[a + 1] | 0x20);
            int pb = c == 'x' ? 16 : c == 'o' ? 8 : c == 'b' ? 2 : 0;
            if (pb && (base == 0 || base == pb)) {
                base = pb;
                a += 2;
            }
        }
        if (base == 0) base = 10;
    }
    if (a >= b) return -1;
    uint64_t v = 0;
    int prev_us = 1;
    for (size_t i = a; i < b; i++) {
        char c = s[i];
        if (c == '_') {
            if (prev_us) return -1;
            prev_us = 1;
            continue;
        }
        int d = c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'z' ? (c | 0x20) - 'a' + 10 : 99;
        if (d >= base) return -1;
        if (v > ((uint64_t)INT64_MAX - (uint64_t)d) / (uint64_t)base) return -1;
        v = v * (uint64_t)base + (uint64_t)d;
        prev_us = 0;
    }
    if (prev_us) return -1;
    *out = neg ? -(int64_t)v : (int64_t)v;
    return 0;
}

static int parse_float_str(const char *s, size_t n, double *out) {
    char ascii[512];
    if (ascii_number_text(&s, &n, ascii, sizeof ascii)) return -1;
    size_t a = ju8_lspace(s, n), b = n - ju8_rspace(s, n);
    if (a >= b || b - a > 400) return -1;
    char tmp[512];
    size_t k = 0;
    for (size_t i = a; i < b; i++) {
        if (s[i] == '_') {
            if (i == a || i + 1 >= b || !(s[i - 1] >= '0' && s[i - 1] <= '9') ||
                !(s[i + 1] >= '0' && s[i + 1] <= '9'))
                return -1;
            continue;
        }
        tmp[k++] = s[i];
    }
    tmp[k] = 0;
    /* reject hex floats and other strtod extensions Python does not accept */
    for (size_t i = 0; i < k; i++)
        if ((tmp[i] | 0x20) == 'x' || (tmp[i] | 0x20) == 'p') return -1;
    char *end;
    double d = strtod(tmp, &end);
    if (end == tmp || *end) return -1;
    *out = d;
    return 0;
}

/* Pads s[0..n) to `width` code points (left-aligned when `left`). */
static void put_padded(jbuf *b, const char *s, size_t n, long width, int left) {
    long len = (long)ju8_count(s, n);
    if (!left)
        for (long k = len; k < width; k++) jbuf_putc(b, ' ');
    jbuf_put(b, s, n);
    if (left)
        for (long k = len; k < width; k++) jbuf_putc(b, ' ');
}

jv *jb_percent_format(jrender *r, int line, const char *s, size_t n, jv **args, size_t nargs,
                      const jv *mapping, int lenient) {
    jbuf b = {.limit = r->lim.max_output};
    size_t ai = 0;
    const char *err = NULL;
    char errbuf[96];
    for (size_t i = 0; i < n && !err; i++) {
        if (s[i] != '%') {
            jbuf_putc(&b, s[i]);
            continue;
        }
        if (++i >= n) {
            err = "incomplete format";
            break;
        }
        const jv *val = NULL;
        if (s[i] == '(') { /* %(name)s */
            size_t k = i + 1;
            while (k < n && s[k] != ')') k++;
            if (k >= n) {
                err = "incomplete format key";
                break;
            }
            if (!mapping) {
                err = "format requires a mapping";
                break;
            }
            val = jv_dict_get_str(mapping, s + i + 1, k - i - 1);
            if (!val) {
                snprintf(errbuf, sizeof errbuf, "KeyError: '%.60s'", s + i + 1);
                char *q = strchr(errbuf, ')');
                if (q) strcpy(q, "'");
                err = errbuf;
                break;
            }
            i = k + 1;
        }
        char flags[8] = "";
        size_t nf = 0;
        while (i < n && strchr("-+ #0", s[i]) && nf < 5) flags[nf++] = s[i++];
        flags[nf] = 0;
        long width = -1, prec = -1;
        if (i < n && s[i] == '*') {
            err = "'*' in formats is not supported";
            break;
        }
        while (i < n && s[i] >= '0' && s[i] <= '9' && width < 100000) width = (width < 0 ? 0 : width * 10) + (s[i++] - '0');
        if (i < n && s[i] == '.') {
            i++;
            prec = 0;
            while (i < n && s[i] >= '0' && s[i] <= '9' && prec < 100000) prec = prec * 10 + (s[i++] - '0');
        }
        while (i < n && (s[i] == 'h' || s[i] == 'l' || s[i] == 'L')) i++;
        if (i >= n) {
            err = "incomplete format";
            break;
        }
        char c = s[i];
        if (c == '%') {
            jbuf_putc(&b, '%');
            continue;
        }
        if (!val) {
            if (ai >= nargs) {
                err = "not enough arguments for format string";
                break;
            }
            val = args[ai++];
        }
        int left = strchr(flags, '-') != NULL;
        if (width > 4096) width = 4096;
        if (prec > 4096) prec = 4096;
        char spec[32];
        switch (c) {
        case 's':
        case 'r':
        case 'a': {
            jbuf t = {0};
            if (c == 's')
                jv_write_str(val, &t);
            else
                jv_write_repr(val, &t);
            if (c == 'a' && t.p) { /* ascii(): repr() with every non-ASCII character escaped */
                jbuf e = {0};
                for (size_t at = 0; at < t.len;) {
                    uint32_t cp;
                    at += ju8_next(t.p + at, t.len - at, &cp);
                    char esc[12];
                    if (cp < 0x80)
                        jbuf_putc(&e, (char)cp);
                    else
                        jbuf_put(&e, esc, (size_t)snprintf(esc, sizeof esc,
                                                           cp < 0x100 ? "\\x%02x" : cp < 0x10000 ? "\\u%04x" : "\\U%08x", cp));
                }
                jbuf_free(&t);
                t = e;
            }
            const char *ts = t.p ? t.p : "";
            size_t tn = t.len;
            if (prec >= 0) tn = ju8_offset(ts, tn, (size_t)prec);
            put_padded(&b, ts, tn, width, left);
            jbuf_free(&t);
            break;
        }
        case 'd':
        case 'i':
        case 'u':
        case 'x':
        case 'X':
        case 'o': {
            long long x;
            if (val->kind == JV_INT || val->kind == JV_BOOL) {
                x = val->kind == JV_BOOL ? val->u.b : val->u.i;
            } else if (val->kind == JV_FLOAT && (c == 'd' || c == 'i' || c == 'u')) {
                if (val->u.f != val->u.f || isinf(val->u.f) || fabs(val->u.f) > 9.2e18) {
                    err = "cannot convert float to integer";
                    break;
                }
                x = (long long)trunc(val->u.f);
            } else {
                snprintf(errbuf, sizeof errbuf, "%%%c format: a number is required, not %s", c,
                         jv_type_name(val));
                err = errbuf;
                break;
            }
            char conv = c == 'i' || c == 'u' ? 'd' : c;
            if ((conv == 'x' || conv == 'X' || conv == 'o') && x < 0) { /* Python: -ff */
                jbuf t = {0};
                snprintf(spec, sizeof spec, "%%%s%c", strchr(flags, '#') ? "#" : "", conv == 'o' ? 'o' : conv);
                jbuf_printf(&t, spec, (unsigned long long)-(unsigned long long)x);
                jbuf num = {0};
                jbuf_putc(&num, '-');
                jbuf_put(&num, t.p ? t.p : "", t.len);
                put_padded(&b, num.p, num.len, width, left);
                jbuf_free(&t);
                jbuf_free(&num);
                break;
            }
            if (width >= 0 && prec >= 0)
                snprintf(spec, sizeof spec, "%%%s%ld.%ldll%c", flags, width, prec, conv);
            else if (width >= 0)
                snprintf(spec, sizeof spec, "%%%s%ldll%c", flags, width, conv);
            else if (prec >= 0)
                snprintf(spec, sizeof spec, "%%%s.%ldll%c", flags, prec, conv);
            else
                snprintf(spec, sizeof spec, "%%%sll%c", flags, conv);
            if (conv == 'o' && strchr(flags, '#')) { /* Python writes 0o17, C 017 */
                err = "'%#o' is not supported";
                break;
            }
            jbuf_printf(&b, spec, x);
            break;
        }
        case 'e':
        case 'E':
        case 'f':
        case 'F':
        case 'g':
        case 'G': {
            if (!jv_is_number(val)) {
                snprintf(errbuf, sizeof errbuf, "must be real number, not %s", jv_type_name(val));
                err = errbuf;
                break;
            }
            if (width >= 0 && prec >= 0)
                snprintf(spec, sizeof spec, "%%%s%ld.%ld%c", flags, width, prec, c);
            else if (width >= 0)
                snprintf(spec, sizeof spec, "%%%s%ld%c", flags, width, c);
            else if (prec >= 0)
                snprintf(spec, sizeof spec, "%%%s.%ld%c", flags, prec, c);
            else
                snprintf(spec, sizeof spec, "%%%s%c", flags, c);
            jbuf_printf(&b, spec, jv_num(val));
            break;
        }
        case 'c':
            if (val->kind == JV_INT && val->u.i >= 0 && val->u.i <= 0x10FFFF) {
                jbuf t = {0};
                ju8_put(&t, (uint32_t)val->u.i);
                put_padded(&b, t.p, t.len, width, left);
                jbuf_free(&t);
            } else if (val->kind == JV_STRING && ju8_count(val->u.str.s, val->u.str.len) == 1) {
                put_padded(&b, val->u.str.s, val->u.str.len, width, left);
            } else {
                err = "%c requires an int or a single character";
            }
            break;
        default:
            snprintf(errbuf, sizeof errbuf, "unsupported format character '%c' (0x%x)", c,
                     (unsigned char)c);
            err = errbuf;
        }
    }
    if (!err && !mapping && !lenient && ai < nargs)
        err = "not all arguments converted during string formatting";
    if (err) {
        jbuf_free(&b);
        return jr_fail(r, line, "%s", err);
    }
    return new_string(r, line, &b);
}

static jv *f_format(jrender *r, int line, jv *v, const argv_t *a) {
    if (a->npos && a->nkw) return jr_fail(r, line, "can't handle positional and keyword arguments at the same time");
    jbuf tmp = {0};
    const char *s;
    size_t n;
    view_str(v, &tmp, &s, &n);
    jv *res;
    if (a->nkw) {
        jv *m = jv_dict();
        if (!m) {
            jbuf_free(&tmp);
            return jr_oom(r, line);
        }
        for (size_t k = 0; k < a->nkw; k++) jv_dict_set(m, jv_cstr(a->kwn[k]), jv_incref(a->kwv[k]));
        res = jb_percent_format(r, line, s, n, &m, 1, m, 1);
        jv_decref(m);
    } else {
        res = jb_percent_format(r, line, s, n, a->pos, a->npos, NULL, 0);
    }
    jbuf_free(&tmp);
    return res;
}

static jv *filter_inner(jrender *r, int line, const char *name, jv *v, jv **pos, size_t npos,
                        const char **kwnames, jv **kwvals, size_t nkw);

/* Filters nest (map applies filters, which may be map): each is an evaluation level. */
jv *jb_filter(jrender *r, int line, const char *name, jv *v, jv **pos, size_t npos,
              const char **kwnames, jv **kwvals, size_t nkw) {
    if (jr_enter(r, line)) return NULL;
    jv *res = filter_inner(r, line, name, v, pos, npos, kwnames, kwvals, nkw);
    jr_leave(r);
    return res;
}

static jv *filter_inner(jrender *r, int line, const char *name, jv *v, jv **pos, size_t npos,
                        const char **kwnames, jv **kwvals, size_t nkw) {
    argv_t args = {pos, npos, kwnames, kwvals, nkw};
    const argv_t *a = &args;
#define F(s) (!strcmp(name, s))
    if (F("default") || F("d")) {
        BIND("default", "default_value", "boolean");
        int use = v->kind == JV_UNDEFINED || (arg_bool(A_[1], 0) && !jv_truthy(v));
        if (!use) return jv_incref(v);
        return A_[0] ? jv_incref(A_[0]) : jv_str("", 0);
    }
    if (F("length") || F("count")) return f_length(r, line, v);
    if (F("upper") || F("lower")) {
        jbuf tmp = {0};
        const char *s;
        size_t n;
        view_str(v, &tmp, &s, &n);
        jv *res = case_map(r, line, s, n, F("upper"));
        jbuf_free(&tmp);
        return res;
    }
    if (F("trim")) {
        BIND("trim", "chars");
        jbuf tmp = {0};
        const char *s;
        size_t n;
        view_str(v, &tmp, &s, &n);
        jv *res = strip_impl(r, line, s, n, A_[0], 1, 1);
        jbuf_free(&tmp);
        return res;
    }
    if (F("string")) return jr_to_string(r, line, v);
    if (F("safe")) { /* jinja2's Markup(value): a string, str() of anything else ('' for undefined) */
        if (v->kind == JV_STRING) return jv_incref(v);
        if (v->kind == JV_UNDEFINED) return jv_str("", 0);
        jbuf b = {.limit = r->lim.max_output};
        jv_write_str(v, &b);
        return new_string(r, line, &b);
    }
    if (F("escape") || F("e")) {
        jbuf tmp = {0};
        const char *s;
        size_t n;
        view_str(v, &tmp, &s, &n);
        jbuf b = {.limit = r->lim.max_output};
        for (size_t i = 0; i < n; i++) {
            switch (s[i]) {
            case '&': jbuf_puts(&b, "&amp;"); break;
            case '<': jbuf_puts(&b, "&lt;"); break;
            case '>': jbuf_puts(&b, "&gt;"); break;
            case '"': jbuf_puts(&b, "&#34;"); break;
            case '\'': jbuf_puts(&b, "&#39;"); break;
            default: jbuf_putc(&b, s[i]);
            }
        }
        jbuf_free(&tmp);
        return new_string(r, line, &b);
    }
    if (F("capitalize") || F("title")) {
        jbuf tmp = {0};
        const char *s;
        size_t n;
        view_str(v, &tmp, &s, &n);
        jv *res = F("title") ? jinja_title(r, line, s, n) : py_capitalize(r, line, s, n);
        jbuf_free(&tmp);
        return res;
    }
    if (F("replace")) {
        BIND("replace", "old", "new", "count");
        if (!A_[0] || !A_[1]) return jr_fail(r, line, "replace filter needs old and new");
        int64_t count = 0;
        if (arg_int(r, line, A_[2], -1, &count, "count")) return NULL;
        jbuf tmp = {0};
        const char *s;
        size_t n;
        view_str(v, &tmp, &s, &n);
        jv *o = jr_to_string(r, line, A_[0]), *nw = o ? jr_to_string(r, line, A_[1]) : NULL;
        jv *res = nw ? replace_impl(r, line, s, n, o, nw, count) : NULL;
        if (o) jv_decref(o);
        if (nw) jv_decref(nw);
        jbuf_free(&tmp);
        return res;
    }
    if (F("truncate")) { /* jinja2's do_truncate, in code points, with the default leeway 5 */
        BIND("truncate", "length", "killwords", "end", "leeway");
        int64_t length = 255, leeway = 5;
        if (arg_int(r, line, A_[0], 255, &length, "length") || arg_int(r, line, A_[3], 5, &leeway, "leeway"))
            return NULL;
        if (A_[2] && A_[2]->kind != JV_STRING) return jr_fail(r, line, "truncate: end must be a string");
        const char *end = A_[2] ? A_[2]->u.str.s : "...";
        size_t end_n = A_[2] ? A_[2]->u.str.len : 3;
        int64_t end_len = (int64_t)ju8_count(end, end_n);
        if (length < end_len) return jr_fail(r, line, "expected length >= %lld, got %lld", (long long)end_len, (long long)length);
        if (leeway < 0) return jr_fail(r, line, "expected leeway >= 0, got %lld", (long long)leeway);
        if (v->kind != JV_STRING) { /* what len() takes and is short enough comes back as it is */
            int64_t len = v->kind == JV_UNDEFINED                      ? 0
                          : v->kind == JV_DICT                         ? (int64_t)v->u.dict.n
                          : v->kind == JV_LIST && !v->u.list.gen ? (int64_t)v->u.list.n
                                                                       : -1;
            if (len < 0) return jr_fail(r, line, "object of type '%s' has no len()", jv_type_name(v));
            if (len <= length + leeway) return jv_incref(v);
            return jr_fail(r, line, "truncate: cannot add a str to a sliced '%s'", jv_type_name(v));
        }
        const char *str = v->u.str.s;
        size_t n = v->u.str.len;
        if (jr_work(r, line, jr_bytes_work(n))) return NULL;
        int64_t len = (int64_t)ju8_count(str, n);
        if (len <= length + leeway) return jv_incref(v);
        size_t cut = ju8_offset(str, n, (size_t)(length - end_len));
        if (!arg_bool(A_[1], 0)) { /* s[:cut].rsplit(" ", 1)[0] */
            size_t k = cut;
            while (k > 0 && str[k - 1] != ' ') k--;
            if (k > 0) cut = k - 1;
        }
        jbuf b = {.limit = r->lim.max_output};
        jbuf_put(&b, str, cut);
        jbuf_put(&b, end, end_n);
        return new_string(r, line, &b);
    }
    if (F("center")) {
        BIND("center", "width");
        int64_t w = 0;
        if (arg_int(r, line, A_[0], 80, &w, "width")) return NULL;
        jbuf tmp = {0};
        const char *s;
        size_t n;
        view_str(v, &tmp, &s, &n);
        int64_t len = (int64_t)ju8_count(s, n);
        jbuf b = {.limit = r->lim.max_output};
        if (w > len && w < 100000) {
            int64_t marg = w - len, left = marg / 2 + (marg & w & 1);
            for (int64_t i = 0; i < left; i++) jbuf_putc(&b, ' ');
            jbuf_put(&b, s, n);
            for (int64_t i = 0; i < marg - left; i++) jbuf_putc(&b, ' ');
        } else {
            jbuf_put(&b, s, n);
        }
        jbuf_free(&tmp);
        return new_string(r, line, &b);
    }
    if (F("wordcount")) {
        jbuf tmp = {0};
        const char *s;
        size_t n;
        view_str(v, &tmp, &s, &n);
        int64_t words = 0;
        int in_word = 0;
        size_t i = 0;
        if (jr_work(r, line, jr_bytes_work(n))) {
            jbuf_free(&tmp);
            return NULL;
        }
        while (i < n) {
            uint32_t cp;
            i += ju8_next(s + i, n - i, &cp);
            int w = cp == '_' || ju_isalpha(cp) || ju_isdigit(cp);
            if (w && !in_word) words++;
            in_word = w;
        }
        jbuf_free(&tmp);
        return jv_int(words);
    }
    if (F("indent")) return f_indent(r, line, v, a);
    if (F("tojson")) return f_tojson(r, line, v, a);
    if (F("format")) return f_format(r, line, v, a);
    if (F("dictsort") || F("sort") || F("unique") || F("min") || F("max"))
        return f_sortlike(r, line, name, v, a);
    if (F("map") || F("select") || F("reject") || F("selectattr") || F("rejectattr"))
        return f_map_select(r, line, name, v, a);
    if (F("batch") || F("slice")) return f_batch_slice(r, line, F("slice"), v, a);
    if (F("list")) {
        jv *l = jr_iterate(r, line, v);
        if (l && l->kind == JV_LIST && (l->u.list.tuple || l->u.list.gen || l == v)) { /* a new list */
            jv *c = jv_list(l->u.list.n);
            if (!c || jv_list_extend(c, l)) {
                if (c) jv_decref(c);
                jv_decref(l);
                return jr_oom(r, line);
            }
            jv_decref(l);
            l = c;
        }
        return l;
    }
    if (F("items")) {
        jv *res;
        if (v->kind == JV_UNDEFINED)
            res = jv_list(0);
        else if (v->kind != JV_DICT)
            return jr_fail(r, line, "Can only get item pairs from a mapping.");
        else
            res = items_of(r, line, v);
        if (res) res->u.list.gen = 1;
        return res;
    }
    if (F("first") || F("last")) {
        if (F("last") && v->kind == JV_LIST && v->u.list.gen)
            return jr_fail(r, line, "'generator' object is not reversible");
        jv *items = jr_iterate(r, line, v);
        if (!items) return NULL;
        jv *res;
        if (items->u.list.n == 0)
            res = jv_undefined_hint("No %s item, sequence was empty.", F("first") ? "first" : "last");
        else
            res = jv_incref(items->u.list.items[F("first") ? 0 : items->u.list.n - 1]);
        jv_decref(items);
        return res;
    }
    if (F("reverse")) {
        if (v->kind == JV_STRING) {
            const char *s = v->u.str.s;
            size_t n = v->u.str.len;
            jbuf b = {.limit = r->lim.max_output};
            size_t end = n;
            while (end > 0) {
                size_t st = end - 1;
                while (st > 0 && end - st < 4 && ((unsigned char)s[st] & 0xC0) == 0x80) st--;
                if (st + cp_len_at(s + st, end - st) != end) st = end - 1;
                jbuf_put(&b, s + st, end - st);
                end = st;
            }
            return new_string(r, line, &b);
        }
        jv *items = jr_iterate(r, line, v);
        if (!items) return NULL;
        jv *l = jv_list(items->u.list.n);
        if (!l) {
            jv_decref(items);
            return jr_oom(r, line);
        }
        int bad = 0;
        for (size_t i = items->u.list.n; i > 0 && !bad; i--)
            bad = jv_list_push(l, jv_incref(items->u.list.items[i - 1]));
        jv_decref(items);
        if (bad) {
            jv_decref(l);
            return jr_oom(r, line);
        }
        l->u.list.gen = 1; /* reversed(): an iterator */
        return l;
    }
    if (F("join")) {
        BIND("join", "d", "attribute");
        jv *items = jr_iterate(r, line, v);
        if (!items) return NULL;
        jbuf sep = {0};
        if (A_[0]) jv_write_str(A_[0], &sep);
        jbuf b = {.limit = r->lim.max_output};
        for (size_t i = 0; i < items->u.list.n; i++) {
            if (i && sep.p) jbuf_put(&b, sep.p, sep.len);
            jv *it = items->u.list.items[i];
            if (A_[1]) {
                jv *x = get_attribute_path(r, line, it, A_[1], NULL);
                if (!x) {
                    jbuf_free(&b);
                    jbuf_free(&sep);
                    jv_decref(items);
                    return NULL;
                }
                jv_write_str(x, &b);
                jv_decref(x);
            } else {
                jv_write_str(it, &b);
            }
        }
        jbuf_free(&sep);
        jv_decref(items);
        return new_string(r, line, &b);
    }
    if (F("sum")) {
        BIND("sum", "attribute", "start");
        jv *items = jr_iterate(r, line, v);
        if (!items) return NULL;
        int is_float = A_[1] && A_[1]->kind == JV_FLOAT;
        int64_t isum = 0;
        double fsum = 0;
        if (A_[1]) {
            if (!jv_is_number(A_[1])) {
                jv_decref(items);
                return jr_fail(r, line, "sum: start must be a number");
            }
            if (is_float)
                fsum = A_[1]->u.f;
            else
                isum = A_[1]->kind == JV_BOOL ? A_[1]->u.b : A_[1]->u.i;
        }
        for (size_t i = 0; i < items->u.list.n; i++) {
            jv *x = A_[0] ? get_attribute_path(r, line, items->u.list.items[i], A_[0], NULL)
                          : jv_incref(items->u.list.items[i]);
            if (!x) {
                jv_decref(items);
                return NULL;
            }
            if (!jv_is_number(x)) {
                jr_fail(r, line, "unsupported operand type(s) for +: 'int' and '%s'", jv_type_name(x));
                jv_decref(x);
                jv_decref(items);
                return NULL;
            }
            if (x->kind == JV_FLOAT && !is_float) {
                is_float = 1;
                fsum = (double)isum;
            }
            if (is_float)
                fsum += jv_num(x);
            else if (__builtin_add_overflow(isum, x->kind == JV_BOOL ? x->u.b : x->u.i, &isum)) {
                jv_decref(x);
                jv_decref(items);
                return jr_fail(r, line, "integer overflow");
            }
            jv_decref(x);
        }
        jv_decref(items);
        return is_float ? jv_float(fsum) : jv_int(isum);
    }
    if (F("abs")) {
        if (v->kind == JV_FLOAT) return jv_float(fabs(v->u.f));
        if (v->kind == JV_INT) {
            if (v->u.i == INT64_MIN) return jr_fail(r, line, "integer overflow");
            return jv_int(v->u.i < 0 ? -v->u.i : v->u.i);
        }
        if (v->kind == JV_BOOL) return jv_int(v->u.b);
        if (v->kind == JV_UNDEFINED) return jr_undefined_error(r, line, v);
        return jr_fail(r, line, "bad operand type for abs(): '%s'", jv_type_name(v));
    }
    if (F("int")) {
        BIND("int", "default", "base");
        int64_t base = 0;
        if (arg_int(r, line, A_[1], 10, &base, "base")) return NULL;
        jv *deflt = A_[0] ? jv_incref(A_[0]) : jv_int(0);
        if (v->kind == JV_INT) return jv_decref(deflt), jv_incref(v);
        if (v->kind == JV_BOOL) return jv_decref(deflt), jv_int(v->u.b);
        if (v->kind == JV_UNDEFINED) {
            jv_decref(deflt);
            return jr_undefined_error(r, line, v);
        }
        double fv;
        if (v->kind == JV_STRING) {
            int64_t x;
            if (parse_int_str(v->u.str.s, v->u.str.len, (int)base, &x) == 0) {
                jv_decref(deflt);
                return jv_int(x);
            }
            /* int(float(s)) runs inside jinja2's handler, which also catches OverflowError */
            if (parse_float_str(v->u.str.s, v->u.str.len, &fv) != 0 || isinf(fv)) return deflt;
        } else if (v->kind == JV_FLOAT) {
            fv = v->u.f;
        } else {
            return deflt;
        }
        /* Python: int(nan) is a ValueError (the default), int(inf) of a float an OverflowError
         * that jinja2 does not catch; past 64 bits Python has big ints, gemma4c an overflow error */
        if (fv != fv) return deflt;
        jv_decref(deflt);
        if (isinf(fv)) return jr_fail(r, line, "cannot convert float infinity to integer");
        if (fabs(fv) >= 9223372036854775808.0) return jr_fail(r, line, "integer overflow");
        return jv_int((int64_t)trunc(fv));
    }
    if (F("float")) {
        BIND("float", "default");
        if (jv_is_number(v)) return jv_float(jv_num(v));
        if (v->kind == JV_UNDEFINED) return jr_undefined_error(r, line, v);
        double d;
        if (v->kind == JV_STRING && parse_float_str(v->u.str.s, v->u.str.len, &d) == 0) {
            return jv_float(d);
        }
        return A_[0] ? jv_incref(A_[0]) : jv_float(0.0);
    }
    if (F("round")) {
        BIND("round", "precision", "method");
        int64_t prec = 0;
        if (arg_int(r, line, A_[0], 0, &prec, "precision")) return NULL;
        const char *method = A_[1] && A_[1]->kind == JV_STRING ? A_[1]->u.str.s : "common";
        if (strcmp(method, "common") && strcmp(method, "ceil") && strcmp(method, "floor"))
            return jr_fail(r, line, "method must be common, ceil or floor");
        if (!jv_is_number(v)) return jr_fail(r, line, "round: '%s' is not a number", jv_type_name(v));
        if (v->kind != JV_FLOAT && !strcmp(method, "common")) {
            /* Python's round(int, n) is an int: exact, halves to even for n < 0 */
            int64_t x = v->kind == JV_BOOL ? v->u.b : v->u.i;
            if (prec >= 0) return jv_int(x);
            if (prec < -18) {
                if (x > 5000000000000000000 || x < -5000000000000000000) return jr_fail(r, line, "integer overflow");
                return jv_int(0);
            }
            int64_t p = 1, q, rem, res;
            for (int64_t k = 0; k < -prec; k++) p *= 10;
            q = x / p;
            rem = x % p;
            if (rem < 0) {
                q--;
                rem += p;
            }
            if (2 * rem > p || (2 * rem == p && (q & 1))) q++;
            if (__builtin_mul_overflow(q, p, &res)) return jr_fail(r, line, "integer overflow");
            return jv_int(res);
        }
        double x = jv_num(v), res;
        if (prec > 300) prec = 300;
        if (prec < -300) prec = -300;
        if (!strcmp(method, "common")) {
            if (prec >= 0) {
                char tmp[400];
                snprintf(tmp, sizeof tmp, "%.*f", (int)prec, x);
                res = strtod(tmp, NULL);
            } else {
                double p = pow(10.0, (double)-prec);
                res = nearbyint(x / p) * p;
            }
        } else {
            double p = pow(10.0, (double)prec);
            /* Python's math.ceil/floor return ints, which have no negative zero */
            double whole = !strcmp(method, "ceil") ? ceil(x * p) : floor(x * p);
            res = (whole == 0 ? 0.0 : whole) / p;
        }
        return jv_float(res);
    }
    if (F("attr")) {
        BIND("attr", "name");
        if (!A_[0] || A_[0]->kind != JV_STRING) return jr_fail(r, line, "attr() needs a name");
        if (v->kind == JV_UNDEFINED) return jr_undefined_error(r, line, v);
        const char *s = A_[0]->u.str.s;
        size_t n = A_[0]->u.str.len;
        if (v->kind == JV_NAMESPACE || v->kind == JV_LOOP) return jr_getattr(r, line, v, s, n);
        int id = n && s[0] != '_' ? jb_method_id(v, s, n) : 0;
        if (id) return jv_func(id, jv_incref(v));
        return jv_undefined_hint("'%s object' has no attribute '%s'", jv_type_name(v), s);
    }
#undef F
    return jr_fail(r, line, "no filter named '%s'", name);
}
