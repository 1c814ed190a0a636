/* Grammars of JSON output (engine/grammar.h): a JSON Schema's documents (OpenAI's response_format json_schema),
 * any JSON object (response_format json_object), and tool calls in Gemma 4's notation whose arguments follow
 * each function's parameter schema (tool_choice "required" or a named function).
 *
 * JSON (RFC 8259): the value starts at its first byte (no blank before it: a model cannot loop on blanks there);
 * between the grammar's tokens at most 20 blanks in a row; strings hold any character from U+0020 up or an
 * escape, as UTF-8; integers at most 19 digits, fractions 20, exponents 3. Objects list the schema's properties
 * in its order, required ones always, optional ones or not (as llama.cpp's json-schema-to-grammar and OpenAI's
 * strict mode write them). Where a schema lists properties, other keys come only with additionalProperties
 * true or a schema; an object schema without properties takes any keys.
 *
 * Gemma 4's tool-call notation (chat template, format_argument with escape_keys=False):
 * `<|tool_call>call:NAME{key:value,...}<tool_call|>`, strings between `<|"|>` tokens, bare keys in sorted order
 * (the template's dictsort), no blanks, null as None or null.
 *
 * Keywords read: type (a name or a list), properties, required, additionalProperties, items, prefixItems,
 * minItems, maxItems, minLength, maxLength (characters), enum, const, anyOf, oneOf, allOf (several schemas merged:
 * allof_rule), $ref (#, #/$defs/..., any JSON pointer into the root), nullable (OpenAPI), minimum / maximum /
 * exclusiveMinimum / exclusiveMaximum of integers and of numbers (a bounded number is written without an exponent,
 * but for minimum 0 alone), multipleOf (multiple_schema: with bounds that pick a sign or hold at most 256
 * multiples), format date, time, date-time, duration, uuid, ipv4, ipv6, hostname and email (subsets of each
 * standard: format_pattern), pattern (anchored ^...$; the subset at pattern_rule); annotations (title, description,
 * default, examples, $schema, $id, $comment, deprecated, readOnly, writeOnly) are skipped. Any other keyword is an
 * error naming it: a constraint is never dropped silently. */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/strbuf.h"
#include "engine/grammar.h"

#define MAX_WS 20        /* blanks in a row */
#define MAX_NESTING 64   /* schemas inside schemas */
#define MAX_REPEAT 4096  /* bounds of a repetition written out */
#define QUOTE "<|\"|>"

typedef struct sc {
    g4_grammar *g;
    const json_t *root;
    int gemma;       /* Gemma's tool-call notation instead of JSON */
    int raw;         /* plain text (g4_grammar_regex): characters as themselves */
    json_t *refs;    /* $ref -> its rule */
    g4_error *err;
    int failed;
    int depth;
    int ws, any, string, number, integer, boolean, null_, chr, digit, key; /* shared rules, -1 until made */
    int64_t lengths[16][3]; /* strings' (min, max, rule) made so far */
    int n_lengths;
} sc;

static int fail(sc *c, const char *fmt, const char *arg) {
    if (!c->failed) g4_fail(c->err, fmt, arg);
    c->failed = 1;
    return -1;
}

static int check(sc *c, int r) {
    if (r < 0 || c->failed) return fail(c, "json_schema: %s", gr_failed(c->g) ? gr_failed(c->g) : "out of memory");
    return r;
}

/* ------------------------------------------------------------------ shared pieces */

static int ws_rule(sc *c) {
    if (c->ws >= 0 || c->gemma) return c->ws;
    gr_seq s;
    gr_seq_init(&s);
    uint64_t set[4] = {0};
    set[0] = (1ull << ' ') | (1ull << '\t') | (1ull << '\n') | (1ull << '\r');
    gr_seq_set(c->g, &s, set);
    c->ws = check(c, gr_repeat(c->g, gr_rule_of(c->g, &s), 0, MAX_WS));
    gr_seq_free(&s);
    return c->ws;
}

static void put_ws(sc *c, gr_seq *s) {
    if (!c->gemma && ws_rule(c) >= 0) gr_seq_ref(s, c->ws);
}

static void lit(sc *c, gr_seq *s, const char *t) { gr_seq_lit(c->g, s, t, strlen(t)); }

/* A rule of alternatives, each a literal (NULL-terminated list). */
static int words_rule(sc *c, const char *const *w) {
    gr_seq s;
    gr_seq_init(&s);
    int r = gr_rule(c->g);
    for (; *w; w++) {
        gr_seq_clear(&s);
        lit(c, &s, *w);
        gr_alt(c->g, r, &s);
    }
    gr_seq_free(&s);
    return check(c, r);
}

static int range_rule(sc *c, unsigned lo, unsigned hi) {
    gr_seq s;
    gr_seq_init(&s);
    gr_seq_range(c->g, &s, lo, hi);
    int r = gr_rule_of(c->g, &s);
    gr_seq_free(&s);
    return check(c, r);
}

static int digit(sc *c) { return c->digit >= 0 ? c->digit : (c->digit = range_rule(c, '0', '9')); }

/* The bytes of hexadecimal digits, either case. */
static const uint64_t hex_set[4] = {0x03ff000000000000ull, 0x0000007e0000007eull, 0, 0};

/* One character of a JSON string, counted as JSON Schema counts (a code point; an escape is one). */
static int char_rule(sc *c) {
    if (c->chr >= 0) return c->chr;
    g4_grammar *g = c->g;
    gr_seq s;
    gr_seq_init(&s);
    int r = gr_rule(g);
    if (c->gemma) { /* any byte: the string ends at the <|"|> token */
        gr_seq_range(g, &s, 0, 255);
        gr_alt(g, r, &s);
    } else { /* any code point from U+0020 but '"' and '\', in UTF-8; or an escape */
        gr_class plain = {0};
        gr_class_add(&plain, 0x20, '"' - 1);
        gr_class_add(&plain, '"' + 1, '\\' - 1);
        gr_class_add(&plain, '\\' + 1, 0x10ffff);
        gr_alt_class(g, r, &plain);
        gr_class_free(&plain);
        lit(c, &s, "\\");
        gr_seq_set(g, &s, (const uint64_t[4]){(1ull << '"') | (1ull << '/'),
                                             (1ull << ('\\' - 64)) | (1ull << ('b' - 64)) | (1ull << ('f' - 64)) |
                                                 (1ull << ('n' - 64)) | (1ull << ('r' - 64)) | (1ull << ('t' - 64)),
                                             0, 0});
        gr_alt(g, r, &s);
        gr_seq_clear(&s);
        lit(c, &s, "\\u");
        for (int j = 0; j < 4; j++) gr_seq_set(g, &s, hex_set);
        gr_alt(g, r, &s);
    }
    gr_seq_free(&s);
    return c->chr = check(c, r);
}

static void open_string(sc *c, gr_seq *s) {
    if (c->gemma) gr_seq_special(c->g, s, QUOTE);
    else lit(c, s, "\"");
}

/* A string of min..max characters (max < 0: any number). */
static int string_rule(sc *c, int64_t min, int64_t max) {
    const int plain = min == 0 && max < 0;
    if (plain && c->string >= 0) return c->string;
    if (min > MAX_REPEAT || max > MAX_REPEAT) return fail(c, "json_schema: %s", "string lengths above 4096");
    for (int i = 0; i < c->n_lengths; i++) /* strings of the same bounds share their rule */
        if (c->lengths[i][0] == min && c->lengths[i][1] == max) return (int)c->lengths[i][2];
    gr_seq s;
    gr_seq_init(&s);
    open_string(c, &s);
    gr_seq_ref(&s, check(c, gr_repeat(c->g, char_rule(c), (int)min, (int)max)));
    open_string(c, &s);
    int r = check(c, gr_rule_of(c->g, &s));
    gr_seq_free(&s);
    if (plain) c->string = r;
    else if (r >= 0 && c->n_lengths < 16) {
        c->lengths[c->n_lengths][0] = min, c->lengths[c->n_lengths][1] = max, c->lengths[c->n_lengths][2] = r;
        c->n_lengths++;
    }
    return r;
}

/* Digits 0-9, min..max of them. */
static int digits(sc *c, int min, int max) { return check(c, gr_repeat(c->g, digit(c), min, max)); }

/* A JSON integer: -? (0 | [1-9][0-9]{0,18}). */
static int integer_rule(sc *c) {
    if (c->integer >= 0) return c->integer;
    g4_grammar *g = c->g;
    gr_seq s;
    gr_seq_init(&s);
    int mag = gr_rule(g);
    lit(c, &s, "0");
    gr_alt(g, mag, &s);
    gr_seq_clear(&s);
    gr_seq_range(g, &s, '1', '9');
    gr_seq_ref(&s, digits(c, 0, 18));
    gr_alt(g, mag, &s);
    int r = gr_rule(g);
    gr_seq_clear(&s);
    gr_seq_ref(&s, mag);
    gr_alt(g, r, &s);
    gr_seq_clear(&s);
    lit(c, &s, "-");
    gr_seq_ref(&s, mag);
    gr_alt(g, r, &s);
    gr_seq_free(&s);
    return c->integer = check(c, r);
}

/* The fraction and exponent a number may add to an integer part. */
static void number_tail(sc *c, gr_seq *s) {
    g4_grammar *g = c->g;
    gr_seq t;
    gr_seq_init(&t);
    int frac = gr_rule(g), ex = gr_rule(g);
    lit(c, &t, ".");
    gr_seq_ref(&t, digits(c, 1, 20));
    gr_alt(g, frac, &t);
    gr_seq_clear(&t);
    gr_alt(g, frac, &t);
    gr_seq_set(g, &t, (const uint64_t[4]){0, (1ull << ('e' - 64)) | (1ull << ('E' - 64)), 0, 0});
    gr_seq_ref(&t, words_rule(c, (const char *const[]){"", "+", "-", NULL}));
    gr_seq_ref(&t, digits(c, 1, 3));
    gr_alt(g, ex, &t);
    gr_seq_clear(&t);
    gr_alt(g, ex, &t);
    gr_seq_free(&t);
    gr_seq_ref(s, frac);
    gr_seq_ref(s, ex);
}

static int number_rule(sc *c, int nonnegative) {
    if (!nonnegative && c->number >= 0) return c->number;
    gr_seq s;
    gr_seq_init(&s);
    if (nonnegative) { /* 0... or [1-9]... without a sign */
        int mag = gr_rule(c->g);
        lit(c, &s, "0");
        gr_alt(c->g, mag, &s);
        gr_seq_clear(&s);
        gr_seq_range(c->g, &s, '1', '9');
        gr_seq_ref(&s, digits(c, 0, 18));
        gr_alt(c->g, mag, &s);
        gr_seq_clear(&s);
        gr_seq_ref(&s, mag);
    } else {
        gr_seq_ref(&s, integer_rule(c));
    }
    number_tail(c, &s);
    int r = check(c, gr_rule_of(c->g, &s));
    gr_seq_free(&s);
    if (!nonnegative) c->number = r;
    return r;
}

/* ------------------------------------------------------------------ integer ranges */

/* Decimal strings of exactly n digits between a and b (same length, a <= b, as text). */
static int fixed_range(sc *c, const char *a, const char *b, int n) {
    if (n > 0 && strspn(a, "0") == (size_t)n && strspn(b, "9") == (size_t)n) /* (any n digits: else each level */
        return digits(c, n, n);                                             /*  split in two, 2^n rules) */
    g4_grammar *g = c->g;
    gr_seq s;
    gr_seq_init(&s);
    int r = gr_rule(g);
    if (n == 0) {
        gr_alt(g, r, &s);
    } else if (a[0] == b[0]) {
        gr_seq_range(g, &s, (unsigned char)a[0], (unsigned char)a[0]);
        gr_seq_ref(&s, fixed_range(c, a + 1, b + 1, n - 1));
        gr_alt(g, r, &s);
    } else {
        char lo_top[24], hi_bot[24];
        memset(lo_top, '9', (size_t)n - 1);
        lo_top[n - 1] = 0;
        memset(hi_bot, '0', (size_t)n - 1);
        hi_bot[n - 1] = 0;
        gr_seq_range(g, &s, (unsigned char)a[0], (unsigned char)a[0]);
        gr_seq_ref(&s, fixed_range(c, a + 1, lo_top, n - 1));
        gr_alt(g, r, &s);
        if (b[0] - a[0] > 1) {
            gr_seq_clear(&s);
            gr_seq_range(g, &s, (unsigned char)a[0] + 1, (unsigned char)b[0] - 1);
            gr_seq_ref(&s, digits(c, n - 1, n - 1));
            gr_alt(g, r, &s);
        }
        gr_seq_clear(&s);
        gr_seq_range(g, &s, (unsigned char)b[0], (unsigned char)b[0]);
        gr_seq_ref(&s, fixed_range(c, hi_bot, b + 1, n - 1));
        gr_alt(g, r, &s);
    }
    gr_seq_free(&s);
    return check(c, r);
}

/* Alternatives of r: the magnitudes lo..hi (0 <= lo <= hi) written without leading zeros. */
static void magnitudes(sc *c, int r, uint64_t lo, uint64_t hi) {
    gr_seq s;
    gr_seq_init(&s);
    for (int n = 1; n <= 20; n++) {
        uint64_t first = 1, last;
        for (int k = 1; k < n; k++) first *= 10;
        if (n == 1) first = 0;
        last = n == 20 ? UINT64_MAX : (n == 1 ? 9 : first * 10 - 1);
        if (last < lo || first > hi) continue;
        char a[24], b[24];
        snprintf(a, sizeof a, "%" PRIu64, lo > first ? lo : first);
        snprintf(b, sizeof b, "%" PRIu64, hi < last ? hi : last);
        gr_seq_clear(&s);
        gr_seq_ref(&s, fixed_range(c, a, b, n));
        gr_alt(c->g, r, &s);
    }
    gr_seq_free(&s);
}

/* Integers in [lo, hi]. */
static int int_range(sc *c, int64_t lo, int64_t hi) {
    int r = gr_rule(c->g);
    if (hi >= 0) magnitudes(c, r, lo > 0 ? (uint64_t)lo : 0, (uint64_t)hi);
    if (lo < 0) { /* negative: "-" then the magnitudes max(1, -hi)..-lo */
        int m = gr_rule(c->g);
        magnitudes(c, m, hi < 0 ? (uint64_t)0 - (uint64_t)hi : 1, (uint64_t)0 - (uint64_t)lo);
        gr_seq s;
        gr_seq_init(&s);
        lit(c, &s, "-");
        gr_seq_ref(&s, m);
        gr_alt(c->g, r, &s);
        gr_seq_free(&s);
    }
    return check(c, r);
}

/* An integer bound of the schema (exclusive ones moved by one); 0 when absent. */
static int int_bound(sc *c, const json_t *schema, const char *key, int64_t *v, int dir) {
    const json_t *x = json_object_get(schema, key);
    if (!x) return 0;
    double d = json_number_value(x);
    if (!json_is_number(x) || !isfinite(d)) return fail(c, "json_schema: %s must be a number", key);
    if (d < -9.2e18 || d > 9.2e18) return fail(c, "json_schema: %s is beyond 64-bit integers", key);
    int64_t b = (int64_t)(dir > 0 ? ceil(d) : floor(d));
    if (strstr(key, "exclusive") && (double)b == d) b += dir;
    if (dir > 0 ? b > *v : b < *v) *v = b;
    return 0;
}

static int multiple_schema(sc *c, const json_t *schema, int integer);

static int integer_schema(sc *c, const json_t *schema) {
    if (json_object_get(schema, "multipleOf")) return multiple_schema(c, schema, 1);
    int64_t lo = INT64_MIN, hi = INT64_MAX;
    if (int_bound(c, schema, "minimum", &lo, 1) || int_bound(c, schema, "exclusiveMinimum", &lo, 1) ||
        int_bound(c, schema, "maximum", &hi, -1) || int_bound(c, schema, "exclusiveMaximum", &hi, -1))
        return -1;
    if (lo == INT64_MIN && hi == INT64_MAX) return integer_rule(c);
    if (lo > hi) return fail(c, "json_schema: %s", "an integer range holds no integer");
    if (lo == INT64_MIN) lo = -999999999999999999; /* 18 digits, as the unbounded rule allows 19 */
    if (hi == INT64_MAX) hi = 999999999999999999;
    return int_range(c, lo, hi);
}

/* ------------------------------------------------------------------ number ranges
 * A number with bounds is written without an exponent: -? I (. F)? with I an integer part as integers are and F up to
 * 20 digits, its value within the bounds. Bounds are read as decimals (the shortest text of each double). */

#define MAX_FRAC 20
enum { NO_RULE = -2, NO_FORMAT = -3 }; /* a set with no string in it; a format not written as a pattern */

/* Fraction digits D (one or more, at most `room`) compared digit by digit with a bound's fraction digits (missing
 * digits are zeros): while lo_t, D's digits so far equal lo's (D >= lo, > where gt); while hi_t, hi's (D <= hi, <
 * where lt). NO_RULE when no D fits. */
static int frac_digits(sc *c, const char *lo, int lo_t, int gt, const char *hi, int hi_t, int lt, int room) {
    if (!lo_t && !hi_t) return digits(c, 1, room);
    const int a = lo_t && *lo ? *lo : '0', b = hi_t ? (*hi ? *hi : '0') : '9';
    if (a > b) return NO_RULE;
    const char *nl = lo_t && *lo ? lo + 1 : lo, *nh = hi_t && *hi ? hi + 1 : hi;
    /* the digit a keeping lo tight (and hi, where a is b too); b keeping hi tight; those between, free */
    const struct {
        int d0, d1, lo_t, hi_t, on;
    } parts[3] = {{a, a, 1, hi_t && a == b, lo_t},
                  {b, b, 0, 1, hi_t && !(lo_t && a == b)},
                  {lo_t ? a + 1 : a, hi_t ? b - 1 : b, 0, 0, 1}};
    gr_seq s;
    gr_seq_init(&s);
    int r = NO_RULE;
    for (int p = 0; p < 3 && !c->failed; p++) {
        if (!parts[p].on || parts[p].d0 > parts[p].d1) continue;
        const int tl = parts[p].lo_t, th = parts[p].hi_t;
        /* D may end after this digit: its value is then lo's / hi's where still tight */
        const int end_ok = (!tl || (!*nl && !gt)) && (!th || !(lt && !*nh));
        const int more = room > 1 ? frac_digits(c, nl, tl, gt, nh, th, lt, room - 1) : NO_RULE;
        for (int k = 0; k < 2 && !c->failed; k++) {
            if (k == 0 ? !end_ok : more < 0) continue;
            gr_seq_clear(&s);
            gr_seq_range(c->g, &s, (unsigned)parts[p].d0, (unsigned)parts[p].d1);
            if (k == 1) gr_seq_ref(&s, more);
            if (r == NO_RULE) r = gr_rule(c->g);
            gr_alt(c->g, r, &s);
        }
    }
    gr_seq_free(&s);
    if (c->failed) return -1;
    return r == NO_RULE ? NO_RULE : check(c, r);
}

/* An integer part (the literal `ip`, or the magnitudes m0..m1 where ip is NULL) and an optional fraction within the
 * fraction bounds, as alternatives of r; nothing where no such number exists. */
static void number_part(sc *c, int r, const char *ip, uint64_t m0, uint64_t m1, const char *lo, int lo_t, int gt,
                        const char *hi, int hi_t, int lt) {
    const int zero_ok = (!lo_t || (!*lo && !gt)) && (!hi_t || !(lt && !*hi));
    const int frac = frac_digits(c, lo, lo_t, gt, hi, hi_t, lt, MAX_FRAC);
    if (c->failed || (!zero_ok && frac == NO_RULE)) return;
    int ir;
    gr_seq s;
    gr_seq_init(&s);
    if (ip) {
        lit(c, &s, ip);
        ir = gr_rule_of(c->g, &s);
    } else {
        ir = gr_rule(c->g);
        magnitudes(c, ir, m0, m1);
    }
    for (int k = 0; k < 2; k++) {
        if (k == 0 ? !zero_ok : frac == NO_RULE) continue;
        gr_seq_clear(&s);
        gr_seq_ref(&s, ir);
        if (k == 1) lit(c, &s, "."), gr_seq_ref(&s, frac);
        gr_alt(c->g, r, &s);
    }
    gr_seq_free(&s);
}

/* A bound as a plain decimal: integer part (no leading zeros) and fraction digits (no trailing zeros) of |x|. */
static int decimal_parts(sc *c, double x, char *ip, uint64_t *iv, char *fp) {
    char t[40];
    for (int p = 1; p <= 17; p++) { /* the shortest text that reads back as x: d0.d1d2... e E */
        snprintf(t, sizeof t, "%.*e", p - 1, fabs(x));
        if (strtod(t, NULL) == fabs(x)) break;
    }
    char mant[24] = {0};
    int n = 0;
    const int e = atoi(strchr(t, 'e') + 1);
    for (const char *q = t; *q != 'e'; q++)
        if (*q >= '0' && *q <= '9') mant[n++] = *q;
    if (e >= 18 || n - 1 - e > MAX_FRAC) /* (n - 1 - e: the fraction's digits) */
        return fail(c, "json_schema: %s", "a number bound beyond 18 integer digits or 20 fraction digits");
    int k = 0;
    if (e < 0) ip[k++] = '0';
    for (int i = 0; i <= e; i++) ip[k++] = i < n ? mant[i] : '0';
    ip[k] = 0;
    k = 0;
    for (int i = e + 1; i < n; i++) fp[k++] = i < 0 ? '0' : mant[i]; /* (e < 0: -e - 1 zeros, then the digits) */
    while (k > 0 && fp[k - 1] == '0') k--;
    fp[k] = 0;
    *iv = strtoull(ip, NULL, 10);
    return 0;
}

/* Non-negative numbers u with lo <= u (lo < u where gt; lo a decimal >= 0) and, where has_hi, u <= hi (< where lt),
 * as alternatives of r, each part behind `sign` ("" or "-"). */
static int nonneg_range(sc *c, int r, const char *sign, double lo, int gt, int has_hi, double hi, int lt) {
    char li[24], lf[24], hi_i[24], hf[24];
    uint64_t lv, hv = 999999999999999999ull;
    if (decimal_parts(c, lo, li, &lv, lf) || (has_hi && decimal_parts(c, hi, hi_i, &hv, hf))) return -1;
    const int rr = gr_rule(c->g);
    if (has_hi && lv == hv) {
        number_part(c, rr, li, 0, 0, lf, 1, gt, hf, 1, lt);
    } else {
        number_part(c, rr, li, 0, 0, lf, 1, gt, "", 0, 0);
        if (lv + 1 <= hv - (has_hi ? 1 : 0) && lv + 1 > lv)
            number_part(c, rr, NULL, lv + 1, has_hi ? hv - 1 : hv, "", 0, 0, "", 0, 0);
        if (has_hi) number_part(c, rr, hi_i, 0, 0, "", 0, 0, hf, 1, lt);
    }
    gr_seq s;
    gr_seq_init(&s);
    lit(c, &s, sign);
    gr_seq_ref(&s, rr);
    gr_alt(c->g, r, &s);
    gr_seq_free(&s);
    return c->failed ? -1 : 0;
}

/* A number bound of the schema (minimum / exclusiveMinimum, or maximum / exclusiveMaximum: the tighter; equal ones
 * exclusive): 1 when there is one. */
static int number_bound(sc *c, const json_t *schema, int upper, double *v, int *excl) {
    int have = 0;
    for (int k = 0; k < 2; k++) {
        const char *key = upper ? (k ? "exclusiveMaximum" : "maximum") : (k ? "exclusiveMinimum" : "minimum");
        const json_t *x = json_object_get(schema, key);
        if (!x) continue;
        const double d = json_number_value(x);
        if (!json_is_number(x) || !isfinite(d)) return fail(c, "json_schema: %s must be a number", key);
        if (!have || (upper ? d < *v : d > *v) || (d == *v && k)) *v = d, *excl = k;
        have = 1;
    }
    return have;
}

/* ------------------------------------------------------------------ multiples (multipleOf)
 * multipleOf x, with x = a * 10^-d in its shortest decimal text (an integer schema: the integer multiples of x are
 * those of a / gcd(a, 10^d)): the multiples v are written as the digits of v * 10^d read by a finite automaton of
 * their remainder mod a, without an exponent, with at most 19 integer digits and at most d fraction digits (the
 * same value with more, even zeros, is left out: a subset, as bounded numbers leave exponents out); a's trailing
 * zeros (d = 0) are literal zeros after the automaton's digits (multipleOf 1000: the multiples of 1, then "000").
 * a is at most 1000 after its trailing zeros (the automaton has a states a digit position). With bounds: the
 * multiples between them as literals where there are at most 256; bounds that only pick a sign (the least multiple
 * 0 or x, the greatest 0 or -x) by the sign; other bounds are an error naming them. */
#define MAX_DIVISOR 1000
#define MAX_LISTED 256

typedef struct mult {
    sc *c;
    int a, d, z, len; /* divisor, fraction digits, literal trailing zeros, integer digits after the first */
    int *gf;          /* gf[k * a + j]: after k fraction digits at remainder j; -1 until made */
    int *gi;          /* gi[n * a + j]: after an integer digit at remainder j, n more integer digits allowed */
} mult;

static int frac_state(mult *m, int j, int k);
static int int_state(mult *m, int j, int n);

/* Digits c0..9 then the state of remainder (10 j + c) mod a (frac: after k + 1 fraction digits; else: n - 1 more
 * integer digits), made first; runs of digits into one state as one range. The number of runs (states with no
 * string left out). */
typedef struct {
    int lo, hi, to;
} digit_run;
static int digit_runs(mult *m, digit_run runs[10], int c0, int j, int frac, int kn) {
    int n = 0;
    for (int ch = c0; ch <= 9 && !m->c->failed; ch++) {
        const int next = (10 * j + ch) % m->a;
        const int t = frac ? frac_state(m, next, kn + 1) : int_state(m, next, kn - 1);
        if (t < 0) continue;
        if (n && runs[n - 1].to == t && runs[n - 1].hi == ch - 1) runs[n - 1].hi = ch;
        else runs[n++] = (digit_run){ch, ch, t};
    }
    return m->c->failed ? 0 : n;
}

static void add_runs(mult *m, int r, const digit_run *runs, int n) {
    gr_seq s;
    gr_seq_init(&s);
    for (int i = 0; i < n; i++) {
        gr_seq_clear(&s);
        gr_seq_range(m->c->g, &s, (unsigned)('0' + runs[i].lo), (unsigned)('0' + runs[i].hi));
        gr_seq_ref(&s, runs[i].to);
        gr_alt(m->c->g, r, &s);
    }
    gr_seq_free(&s);
}

/* Remainder j times 10^e, mod a. */
static int shifted(const mult *m, int j, int e) {
    for (; e > 0; e--) j = 10 * j % m->a;
    return j;
}

/* After k fraction digits at remainder j: the end where the value is a multiple, or more digits (NO_RULE: no
 * string leads to a multiple; the states' positions only grow, so each is made after those it refers to). */
static int frac_state(mult *m, int j, int k) {
    int *slot = &m->gf[k * m->a + j];
    if (*slot != -1) return *slot;
    const int end = shifted(m, j, m->d - k) == 0;
    digit_run runs[10];
    const int n = k < m->d ? digit_runs(m, runs, 0, j, 1, k) : 0;
    if (m->c->failed) return -1;
    if (!end && !n) return *slot = NO_RULE;
    const int r = gr_rule(m->c->g);
    if (end) {
        gr_seq s;
        gr_seq_init(&s);
        gr_alt(m->c->g, r, &s);
        gr_seq_free(&s);
    }
    add_runs(m, r, runs, n);
    return *slot = check(m->c, r);
}

/* After an integer digit at remainder j, n more allowed: the trailing zeros and the end (where the integer is a
 * multiple), "." and a fraction, or a digit. */
static int int_state(mult *m, int j, int n) {
    int *slot = &m->gi[n * m->a + j];
    if (*slot != -1) return *slot;
    const int end = shifted(m, j, m->d) == 0;
    digit_run fr[10], dr[10];
    const int nf = m->d > 0 ? digit_runs(m, fr, 0, j, 1, 0) : 0, nd = n > 0 ? digit_runs(m, dr, 0, j, 0, n) : 0;
    if (m->c->failed) return -1;
    if (!end && !nf && !nd) return *slot = NO_RULE;
    const int r = gr_rule(m->c->g);
    gr_seq s;
    gr_seq_init(&s);
    if (end) {
        for (int k = 0; k < m->z; k++) lit(m->c, &s, "0");
        gr_alt(m->c->g, r, &s);
    }
    if (nf) {
        const int f = gr_rule(m->c->g);
        add_runs(m, f, fr, nf);
        gr_seq_clear(&s);
        lit(m->c, &s, ".");
        gr_seq_ref(&s, f);
        gr_alt(m->c->g, r, &s);
    }
    gr_seq_free(&s);
    add_runs(m, r, dr, nd);
    return *slot = check(m->c, r);
}

/* The positive multiples: 1-9 then the automaton, or "0." and fraction digits not all zeros. */
static int positive_multiples(mult *m) {
    digit_run runs[10];
    int n = digit_runs(m, runs, 1, 0, 0, m->len + 1);
    const int r = gr_rule(m->c->g);
    add_runs(m, r, runs, n);
    int zeros = NO_RULE; /* after "0." and k zeros, k from d - 1 down to 0 */
    gr_seq s;
    gr_seq_init(&s);
    for (int k = m->d - 1; k >= 0 && !m->c->failed; k--) {
        n = digit_runs(m, runs, 1, 0, 1, k);
        if (!n && zeros == NO_RULE) continue;
        const int z = gr_rule(m->c->g);
        add_runs(m, z, runs, n);
        if (zeros >= 0) {
            gr_seq_clear(&s);
            lit(m->c, &s, "0");
            gr_seq_ref(&s, zeros);
            gr_alt(m->c->g, z, &s);
        }
        zeros = check(m->c, z);
    }
    if (zeros >= 0) {
        gr_seq_clear(&s);
        lit(m->c, &s, "0.");
        gr_seq_ref(&s, zeros);
        gr_alt(m->c->g, r, &s);
    }
    gr_seq_free(&s);
    return m->c->failed ? -1 : check(m->c, r);
}

/* x's digits: *a and *d with x = a * 10^-d (the shortest text of x); -1 where x is no such number. */
static int decimal_of(sc *c, double x, uint64_t *a, int *d) {
    char ip[24], fp[24], t[48];
    uint64_t iv;
    if (!(x >= 1e-20 && x < 1e17)) return fail(c, "json_schema: %s", "multipleOf must be from 1e-20 to 1e17");
    if (decimal_parts(c, x, ip, &iv, fp)) return -1;
    snprintf(t, sizeof t, "%s%s", ip, fp);
    *a = strtoull(t, NULL, 10), *d = (int)strlen(fp);
    return 0;
}

/* floor(p / q) and ceil(p / q), q > 0. */
static int64_t floor_div(int64_t p, int64_t q) { return p / q - (p % q != 0 && p < 0); }
static int64_t ceil_div(int64_t p, int64_t q) { return p / q + (p % q != 0 && p > 0); }

/* The bound of the schema as a count of steps of step * 10^-e: *k the least (upper: greatest) multiple's count.
 * 0 where there is no bound, 1 where there is; -1 on an error. */
static int multiple_bound(sc *c, const json_t *schema, int upper, uint64_t step, int e, int64_t *k) {
    double v;
    int excl;
    const int have = number_bound(c, schema, upper, &v, &excl);
    if (have <= 0) return have;
    char ip[24], fp[24];
    uint64_t iv;
    if (fabs(v) >= 1e17 || decimal_parts(c, v, ip, &iv, fp))
        return fail(c, "json_schema: %s", "a bound of multipleOf beyond 17 digits of its unit");
    int fd = (int)strlen(fp), de = e > fd ? e : fd; /* both in units of 10^-de */
    __int128 b = iv, s = step;
    for (int i = 0; i < de; i++) b = b * 10 + (i < fd ? fp[i] - '0' : 0);
    for (int i = e; i < de; i++) s *= 10;
    if (v < 0) b = -b;
    if (b > (__int128)INT64_MAX / 2 || b < -(__int128)INT64_MAX / 2 || s > (__int128)INT64_MAX / 2)
        return fail(c, "json_schema: %s", "a bound of multipleOf beyond 17 digits of its unit");
    const int64_t bb = (int64_t)b, ss = (int64_t)s;
    if (upper) *k = excl ? ceil_div(bb, ss) - 1 : floor_div(bb, ss);
    else *k = excl ? floor_div(bb, ss) + 1 : ceil_div(bb, ss);
    return 1;
}

/* The multiples of the schema's multipleOf (integers only where `integer`) within its bounds. */
static int multiple_schema(sc *c, const json_t *schema, int integer) {
    const json_t *mx = json_object_get(schema, "multipleOf");
    const double x = json_number_value(mx);
    if (!json_is_number(mx) || !(x > 0) || !isfinite(x))
        return fail(c, "json_schema: %s", "multipleOf must be a number above 0");
    uint64_t a;
    int d, z = 0;
    if (decimal_of(c, x, &a, &d)) return -1;
    for (; integer && d > 0 && a % 2 == 0; d--) a /= 2; /* integers: the multiples of a / gcd(a, 10^d) */
    for (int e = d; integer && e > 0 && a % 5 == 0; e--) a /= 5;
    if (integer) d = 0;
    const uint64_t step = a; /* the multiples in units of 10^-d */
    for (; d == 0 && a % 10 == 0; a /= 10) z++;
    int64_t kmin = INT64_MIN, kmax = INT64_MAX;
    const int has_lo = multiple_bound(c, schema, 0, step, d, &kmin), has_hi = multiple_bound(c, schema, 1, step, d, &kmax);
    if (has_lo < 0 || has_hi < 0) return -1;
    if (kmin > kmax) return fail(c, "json_schema: %s", "no multiple of multipleOf within the bounds");
    if (has_lo && has_hi && (uint64_t)kmax - (uint64_t)kmin < MAX_LISTED) { /* the multiples, each as a literal */
        int r = gr_rule(c->g);
        gr_seq s;
        gr_seq_init(&s);
        for (int64_t k = kmin; k <= kmax && !c->failed; k++) {
            char t[64], *p = t;
            const unsigned __int128 v = (unsigned __int128)(k < 0 ? -(__int128)k : k) * step; /* |k| * step * 10^-d */
            char dig[48];
            int n = 0;
            unsigned __int128 w = v;
            do dig[n++] = (char)('0' + (int)(w % 10)), w /= 10;
            while (w);
            while (n <= d) dig[n++] = '0'; /* at least one integer digit */
            if (k < 0) *p++ = '-';
            for (int i = n - 1; i >= d; i--) *p++ = dig[i];
            int keep = 0; /* fraction digits up to the last non-zero one (dig[0]: the last digit) */
            for (int i = 0; i < d && !keep; i++)
                if (dig[i] != '0') keep = d - i;
            if (keep) *p++ = '.';
            for (int i = d - 1; i >= d - keep; i--) *p++ = dig[i];
            *p = 0;
            gr_seq_clear(&s);
            lit(c, &s, t);
            gr_alt(c->g, r, &s);
        }
        gr_seq_free(&s);
        return check(c, r);
    }
    if ((has_lo && kmin != 0 && kmin != 1) || (has_hi && kmax != 0 && kmax != -1))
        return fail(c, "json_schema: %s", "multipleOf with bounds other than a sign and more than 256 multiples between "
                                          "them is not supported");
    if (a > MAX_DIVISOR)
        return fail(c, "json_schema: %s", "multipleOf whose digits (trailing zeros aside) are above 1000 is not supported");
    mult m = {c, (int)a, d, z, 18 - z, NULL, NULL};
    m.gf = malloc((size_t)(d + 1) * a * sizeof *m.gf);
    m.gi = malloc((size_t)(m.len + 1) * a * sizeof *m.gi);
    if (!m.gf || !m.gi) {
        free(m.gf), free(m.gi);
        return fail(c, "json_schema: %s", "out of memory");
    }
    memset(m.gf, 0xff, (size_t)(d + 1) * a * sizeof *m.gf); /* -1: not made */
    memset(m.gi, 0xff, (size_t)(m.len + 1) * a * sizeof *m.gi);
    const int pos = positive_multiples(&m);
    free(m.gf), free(m.gi);
    if (pos < 0) return -1;
    int r = gr_rule(c->g);
    gr_seq s;
    gr_seq_init(&s);
    if (!has_lo) lit(c, &s, "-"), gr_seq_ref(&s, pos), gr_alt(c->g, r, &s); /* the negative ones */
    if (kmin <= 0 && kmax >= 0) gr_seq_clear(&s), lit(c, &s, "0"), gr_alt(c->g, r, &s);
    if (!has_hi) gr_seq_clear(&s), gr_seq_ref(&s, pos), gr_alt(c->g, r, &s);
    gr_seq_free(&s);
    return check(c, r);
}

static int number_schema(sc *c, const json_t *schema) {
    if (json_object_get(schema, "multipleOf")) return multiple_schema(c, schema, 0);
    double lo = 0, hi = 0;
    int gt = 0, lt = 0;
    const int has_lo = number_bound(c, schema, 0, &lo, &gt), has_hi = number_bound(c, schema, 1, &hi, &lt);
    if (c->failed) return -1;
    if (!has_lo && !has_hi) return number_rule(c, 0);
    if (has_lo && !has_hi && lo == 0 && !gt) return number_rule(c, 1); /* (exponents allowed, as before) */
    if (has_lo && has_hi && (lo > hi || (lo == hi && (gt || lt))))
        return fail(c, "json_schema: %s", "a number range holds no number");
    const int r = gr_rule(c->g);
    /* u >= 0: [max(lo, 0), hi]; u < 0: -u in (max(-hi, 0), -lo] (0 itself is the first part's) */
    if ((!has_hi || hi > 0 || (hi == 0 && !lt)) &&
        nonneg_range(c, r, "", has_lo && lo > 0 ? lo : 0, has_lo && lo >= 0 && gt, has_hi, hi, lt))
        return -1;
    if (!has_lo || lo < 0) {
        const double nlo = has_hi && hi < 0 ? -hi : 0;
        if (nonneg_range(c, r, "-", nlo, nlo == 0 || lt, has_lo, -lo, gt)) return -1;
    }
    return check(c, r);
}

/* ------------------------------------------------------------------ formats */

static int pattern_rule(sc *c, const char *pattern, size_t len);

/* The formats written as patterns (anchored regular expressions of the subset at pattern_rule), each a subset of
 * what its standard allows, so that every string the grammar takes is valid:
 *  - ipv4 (RFC 2673 dotted quad): four decimal octets 0-255 without leading zeros (Python's ipaddress refuses them);
 *  - ipv6 (RFC 4291 2.2): eight groups of 1-4 hex digits; or "::" standing for at least one group of zeros with
 *    at most seven groups around it; either with a dotted quad for the last two groups; no zone;
 *  - hostname (RFC 1123 2.1): labels of letters, digits and inner hyphens, at most 8 labels of at most 30
 *    characters (so at most 247 in all, below the 253 of RFC 1035);
 *  - email (RFC 5321 4.1.2 Dot-string "@" Domain): at most 4 atoms of at most 15 characters (a local part of at
 *    most 63 of the 64) at a hostname of at most 6 such labels (at most 249 characters of the 254 a path holds);
 *  - duration (RFC 3339 appendix A, as JSON Schema names it): P then a date part (D, M[D] or Y[M[D]]), a time
 *    part (T then H[M[S]], M[S] or S), both, or W; each number at most 9 digits. */
static int format_pattern(sc *c, const char *f) {
    static const char *const hex4 = "[0-9A-Fa-f]{1,4}";
    static const char *const quad = "(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)(?:\\.(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)){3}";
    static const char *const label = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,28}[A-Za-z0-9])?";
    static const char *const atom = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]{1,15}";
    g4_strbuf b = {0};
    char t[512];
    if (!strcmp(f, "ipv4")) {
        snprintf(t, sizeof t, "^%s$", quad);
        g4_strbuf_puts(&b, t);
    } else if (!strcmp(f, "ipv6")) {
        snprintf(t, sizeof t, "^(?:(?:%s:){7}%s|(?:%s:){6}%s", hex4, hex4, hex4, quad);
        g4_strbuf_puts(&b, t);
        for (int v4 = 0; v4 < 2; v4++)
            for (int k = 0; k <= (v4 ? 5 : 7); k++) { /* k groups before "::" */
                const int room = (v4 ? 5 : 7) - k;    /* groups after it */
                g4_strbuf_puts(&b, "|");
                if (k) snprintf(t, sizeof t, "%s(?::%s){%d}", hex4, hex4, k - 1), g4_strbuf_puts(&b, t);
                g4_strbuf_puts(&b, "::");
                if (v4) snprintf(t, sizeof t, "(?:%s:){0,%d}%s", hex4, room, quad), g4_strbuf_puts(&b, t);
                else if (room) snprintf(t, sizeof t, "(?:%s(?::%s){0,%d})?", hex4, hex4, room - 1), g4_strbuf_puts(&b, t);
            }
        g4_strbuf_puts(&b, ")$");
    } else if (!strcmp(f, "hostname")) {
        snprintf(t, sizeof t, "^%s(?:\\.%s){0,7}$", label, label);
        g4_strbuf_puts(&b, t);
    } else if (!strcmp(f, "email")) {
        snprintf(t, sizeof t, "^%s(?:\\.%s){0,3}@%s(?:\\.%s){0,5}$", atom, atom, label, label);
        g4_strbuf_puts(&b, t);
    } else if (!strcmp(f, "duration")) {
        static const char *const n = "\\d{1,9}";
        char date[256], time[256];
        snprintf(date, sizeof date, "%sD|%sM(?:%sD)?|%sY(?:%sM(?:%sD)?)?", n, n, n, n, n, n);
        snprintf(time, sizeof time, "T(?:%sH(?:%sM(?:%sS)?)?|%sM(?:%sS)?|%sS)", n, n, n, n, n, n);
        g4_strbuf_puts(&b, "^P(?:(?:");
        g4_strbuf_puts(&b, date);
        g4_strbuf_puts(&b, ")(?:");
        g4_strbuf_puts(&b, time);
        g4_strbuf_puts(&b, ")?|");
        g4_strbuf_puts(&b, time);
        snprintf(t, sizeof t, "|%sW)$", n);
        g4_strbuf_puts(&b, t);
    } else {
        return NO_FORMAT;
    }
    int r = b.failed ? fail(c, "json_schema: %s", "out of memory") : pattern_rule(c, g4_strbuf_str(&b), b.len);
    g4_strbuf_free(&b);
    return r;
}

static int format_rule(sc *c, const char *f) {
    const int by_pattern = format_pattern(c, f);
    if (by_pattern != NO_FORMAT) return by_pattern;
    g4_grammar *g = c->g;
    gr_seq s;
    gr_seq_init(&s);
    int date = -1, time = -1, r = -1;
    const int want_date = !strcmp(f, "date") || !strcmp(f, "date-time");
    const int want_time = !strcmp(f, "time") || !strcmp(f, "date-time");
    if (want_date) { /* YYYY-MM-DD */
        gr_seq_ref(&s, digits(c, 4, 4));
        lit(c, &s, "-");
        gr_seq_ref(&s, fixed_range(c, "01", "12", 2));
        lit(c, &s, "-");
        gr_seq_ref(&s, fixed_range(c, "01", "31", 2));
        date = gr_rule_of(g, &s);
        gr_seq_clear(&s);
    }
    if (want_time) { /* hh:mm:ss(.f)?(Z|+hh:mm) */
        int hh = fixed_range(c, "00", "23", 2), mm = fixed_range(c, "00", "59", 2);
        gr_seq_ref(&s, hh);
        lit(c, &s, ":");
        gr_seq_ref(&s, mm);
        lit(c, &s, ":");
        gr_seq_ref(&s, mm);
        int frac = gr_rule(g);
        gr_seq t;
        gr_seq_init(&t);
        gr_alt(g, frac, &t);
        lit(c, &t, ".");
        gr_seq_ref(&t, digits(c, 1, 9));
        gr_alt(g, frac, &t);
        int zone = gr_rule(g);
        gr_seq_clear(&t);
        lit(c, &t, "Z");
        gr_alt(g, zone, &t);
        gr_seq_clear(&t);
        gr_seq_set(g, &t, (const uint64_t[4]){(1ull << '+') | (1ull << '-'), 0, 0, 0});
        gr_seq_ref(&t, hh);
        lit(c, &t, ":");
        gr_seq_ref(&t, mm);
        gr_alt(g, zone, &t);
        gr_seq_free(&t);
        gr_seq_ref(&s, frac);
        gr_seq_ref(&s, zone);
        time = gr_rule_of(g, &s);
        gr_seq_clear(&s);
    }
    open_string(c, &s);
    if (!strcmp(f, "uuid")) {
        static const int groups[] = {8, 4, 4, 4, 12};
        for (int k = 0; k < 5; k++) {
            if (k) lit(c, &s, "-");
            for (int j = 0; j < groups[k]; j++) gr_seq_set(g, &s, hex_set);
        }
    } else if (want_date || want_time) {
        if (date >= 0) gr_seq_ref(&s, date);
        if (date >= 0 && time >= 0) lit(c, &s, "T");
        if (time >= 0) gr_seq_ref(&s, time);
    } else {
        gr_seq_free(&s);
        return fail(c, "json_schema: format \"%s\" is not supported (date, time, date-time, duration, uuid, ipv4, "
                    "ipv6, hostname, email)", f);
    }
    open_string(c, &s);
    r = gr_rule_of(g, &s);
    gr_seq_free(&s);
    return check(c, r);
}

/* ------------------------------------------------------------------ patterns */

/* A pattern (ECMA-262 regular expression, as JSON Schema reads it) anchored at both ends, ^...$: alternation,
 * groups ((...), (?:...)), classes ([...], [^...], \d \w \s and their negations, .: any code points),
 * quantifiers (* + ? {n} {n,} {n,m}, lazy ones alike), escapes (\n \t \r \f \v \0 \xHH \uHHHH, punctuation).
 * Its characters are the string's: JSON escapes '"', '\' and control characters in the output (both the short
 * escape and \u00XX are read). Lookaround, backreferences and word boundaries are errors. */
typedef struct rx {
    sc *c;
    const char *p, *end;
    int depth; /* groups open (at most MAX_GROUPS) */
} rx;
#define MAX_GROUPS 256

static int rx_fail(rx *r, const char *why) { return fail(r->c, r->c->raw ? "regex: %s" : "json_schema: pattern: %s", why); }

/* One code point of a string's content as the dialect writes it. */
static void put_char(sc *c, gr_seq *s, uint32_t cp) {
    if (!c->gemma && !c->raw && (cp == '"' || cp == '\\' || cp < 0x20)) {
        static const char shorts[] = "\b\f\n\r\t";
        static const char letters[] = "bfnrt";
        char alts[3][8];
        int n = 0;
        if (cp == '"' || cp == '\\') {
            snprintf(alts[n++], 8, "\\%c", (char)cp);
        } else {
            const char *k = cp ? strchr(shorts, (int)cp) : NULL;
            if (k) snprintf(alts[n++], 8, "\\%c", letters[k - shorts]);
            snprintf(alts[n++], 8, "\\u%04x", (unsigned)cp);
            snprintf(alts[n++], 8, "\\u%04X", (unsigned)cp);
        }
        const char *list[4] = {alts[0], n > 1 ? alts[1] : NULL, n > 2 ? alts[2] : NULL, NULL};
        gr_seq_ref(s, words_rule(c, list));
        return;
    }
    gr_seq_cp(c->g, s, cp);
}

/* The characters of a class as the dialect writes them (JSON: '"', '\' and controls escaped). */
static int class_rule(sc *c, const gr_class *cls) {
    g4_grammar *g = c->g;
    int r = gr_rule(g);
    if (c->gemma || c->raw) {
        gr_alt_class(g, r, cls);
        return check(c, r);
    }
    gr_class plain = {0};
    for (int i = 0; i < cls->n; i++) { /* the class without '"', '\' and U+0000..U+001F */
        uint32_t lo = cls->r[i][0] < 0x20 ? 0x20 : cls->r[i][0], hi = cls->r[i][1];
        for (uint32_t cut = '"';; cut = '\\') {
            if (lo <= cut && cut <= hi) {
                if (lo < cut) gr_class_add(&plain, lo, cut - 1);
                lo = cut + 1;
            }
            if (cut == '\\') break;
        }
        if (lo <= hi) gr_class_add(&plain, lo, hi);
    }
    gr_alt_class(g, r, &plain);
    gr_class_free(&plain);
    gr_seq s;
    gr_seq_init(&s);
    for (uint32_t cp = 0; cp <= '\\'; cp++)
        if ((cp < 0x20 || cp == '"' || cp == '\\') && gr_class_has(cls, cp)) {
            gr_seq_clear(&s);
            put_char(c, &s, cp);
            gr_alt(g, r, &s);
        }
    gr_seq_free(&s);
    return check(c, r);
}

/* \d \w \s (D W S: their complements) added to cls; 0 when k is none of them. */
static int class_escape(char k, gr_class *cls) {
    const char low = (char)(k | 0x20);
    if (low != 'd' && low != 'w' && low != 's') return 0;
    gr_class sub = {0};
    if (low == 'd' || low == 'w') gr_class_add(&sub, '0', '9');
    if (low == 'w') gr_class_add(&sub, 'a', 'z'), gr_class_add(&sub, 'A', 'Z'), gr_class_add(&sub, '_', '_');
    if (low == 's') { /* ECMA-262's white space and line terminators */
        static const uint32_t ws[][2] = {{9, 13}, {0x20, 0x20}, {0xa0, 0xa0}, {0x1680, 0x1680}, {0x2000, 0x200a},
                                         {0x2028, 0x2029}, {0x202f, 0x202f}, {0x205f, 0x205f}, {0x3000, 0x3000},
                                         {0xfeff, 0xfeff}};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) gr_class_add(&sub, ws[i][0], ws[i][1]);
    }
    if (k != low) gr_class_negate(&sub);
    for (int i = 0; i < sub.n; i++) gr_class_add(cls, sub.r[i][0], sub.r[i][1]);
    if (sub.failed) cls->failed = 1;
    gr_class_free(&sub);
    return 1;
}

static uint32_t rx_utf8(rx *r) { return gr_utf8_next(&r->p, r->end); }

static int rx_hex(rx *r, int digits, uint32_t *cp) {
    *cp = 0;
    for (int i = 0; i < digits; i++, r->p++) {
        if (r->p >= r->end) return rx_fail(r, "a short \\x or \\u escape");
        const char h = *r->p;
        const int v = h >= '0' && h <= '9' ? h - '0' : (h | 0x20) >= 'a' && (h | 0x20) <= 'f' ? (h | 0x20) - 'a' + 10 : -1;
        if (v < 0) return rx_fail(r, "a bad \\x or \\u escape");
        *cp = *cp << 4 | (uint32_t)v;
    }
    return 0;
}

/* An escape's character after the backslash (classes are handled by the caller). */
static int rx_escape_char(rx *r, uint32_t *cp) {
    const char k = *r->p++;
    switch (k) {
    case 'n': *cp = '\n'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'v': *cp = '\v'; return 0;
    case '0': *cp = 0; return 0;
    case 'x': return rx_hex(r, 2, cp);
    case 'u': return rx_hex(r, 4, cp);
    default:
        if ((k >= 'a' && k <= 'z') || (k >= 'A' && k <= 'Z') || (k >= '1' && k <= '9'))
            return rx_fail(r, "an escape that is not supported (\\b, backreferences, ...)");
        r->p--;
        *cp = rx_utf8(r);
        return 0;
    }
}

static int rx_class(rx *r) { /* after '[' */
    gr_class cls = {0};
    int negated = 0, rc = 0;
    if (r->p < r->end && *r->p == '^') negated = 1, r->p++;
    for (int first = 1; r->p < r->end && (*r->p != ']' || first) && !rc; first = 0) {
        uint32_t lo;
        if (*r->p == '\\') {
            r->p++;
            if (r->p >= r->end) break;
            if (class_escape(*r->p, &cls)) {
                r->p++;
                continue;
            }
            if ((rc = rx_escape_char(r, &lo))) break;
        } else {
            lo = rx_utf8(r);
        }
        uint32_t hi = lo;
        if (r->p + 1 < r->end && *r->p == '-' && r->p[1] != ']') {
            r->p++;
            if (*r->p == '\\') {
                r->p++;
                if (r->p >= r->end || (rc = rx_escape_char(r, &hi))) break;
            } else {
                hi = rx_utf8(r);
            }
        }
        if (hi < lo) rc = rx_fail(r, "a range out of order");
        else gr_class_add(&cls, lo, hi);
    }
    if (!rc && r->p >= r->end) rc = rx_fail(r, "an unclosed [");
    int rule = -1;
    if (!rc) {
        r->p++;
        if (negated) gr_class_negate(&cls);
        rule = class_rule(r->c, &cls);
    }
    gr_class_free(&cls);
    return rc ? -1 : rule;
}

static int rx_alt(rx *r);

static int rx_atom(rx *r) {
    const char k = *r->p++;
    gr_class cls = {0};
    int rule = -1;
    switch (k) {
    case '(': {
        if (++r->depth > MAX_GROUPS) return rx_fail(r, "groups nested deeper than 256");
        if (r->p < r->end && *r->p == '?') {
            if (r->p + 1 < r->end && r->p[1] == ':') r->p += 2;
            else return rx_fail(r, "lookaround and named groups are not supported");
        }
        int inner = rx_alt(r);
        if (inner < 0) return -1;
        if (r->p >= r->end || *r->p != ')') return rx_fail(r, "an unclosed (");
        r->p++;
        r->depth--;
        return inner;
    }
    case '[': return rx_class(r);
    case '.': /* anything but a line terminator */
        gr_class_add(&cls, '\n', '\n'), gr_class_add(&cls, '\r', '\r'), gr_class_add(&cls, 0x2028, 0x2029);
        gr_class_negate(&cls);
        rule = class_rule(r->c, &cls);
        gr_class_free(&cls);
        return rule;
    case '^':
    case '$': return rx_fail(r, "^ and $ only at the pattern's ends");
    case '*': case '+': case '?': case '{': return rx_fail(r, "a quantifier without anything before it");
    case '\\':
        if (r->p >= r->end) return rx_fail(r, "a trailing backslash");
        if (class_escape(*r->p, &cls)) {
            r->p++;
            rule = class_rule(r->c, &cls);
            gr_class_free(&cls);
            return rule;
        }
        {
            uint32_t cp;
            if (rx_escape_char(r, &cp)) return -1;
            gr_seq s;
            gr_seq_init(&s);
            put_char(r->c, &s, cp);
            rule = check(r->c, gr_rule_of(r->c->g, &s));
            gr_seq_free(&s);
            return rule;
        }
    default: {
        r->p--;
        gr_seq s;
        gr_seq_init(&s);
        put_char(r->c, &s, rx_utf8(r));
        rule = check(r->c, gr_rule_of(r->c->g, &s));
        gr_seq_free(&s);
        return rule;
    }
    }
}

/* A quantifier after an atom: 0 with none, 1 with min and max set (max -1: none). */
static int rx_quantifier(rx *r, int *min, int *max) {
    if (r->p >= r->end) return 0;
    const char k = *r->p;
    if (k == '*' || k == '+' || k == '?') {
        r->p++;
        *min = k == '+';
        *max = k == '?' ? 1 : -1;
    } else if (k == '{') {
        char *e;
        long a = strtol(r->p + 1, &e, 10), b;
        if (e == r->p + 1) return rx_fail(r, "a { that is not a quantifier");
        if (*e == ',') {
            const char *bs = e + 1;
            b = *bs == '}' ? -1 : strtol(bs, &e, 10);
            if (b >= 0 && e == bs) return rx_fail(r, "a bad {n,m}");
            if (b < 0) e = (char *)bs;
        } else {
            b = a;
        }
        if (*e != '}' || a < 0 || (b >= 0 && b < a) || a > MAX_REPEAT || b > MAX_REPEAT)
            return rx_fail(r, "a bad or too large {n,m}");
        r->p = e + 1;
        *min = (int)a;
        *max = (int)b;
    } else {
        return 0;
    }
    if (r->p < r->end && (*r->p == '?' || *r->p == '+')) r->p++; /* lazy or possessive: the same strings */
    return 1;
}

static int rx_alt(rx *r) {
    int rule = gr_rule(r->c->g);
    gr_seq s;
    gr_seq_init(&s);
    for (;;) {
        gr_seq_clear(&s);
        while (r->p < r->end && *r->p != '|' && *r->p != ')' && !r->c->failed) {
            int atom = rx_atom(r), min, max, q = atom < 0 ? 0 : rx_quantifier(r, &min, &max);
            if (atom < 0 || q < 0) break;
            if (q) atom = check(r->c, gr_repeat(r->c->g, atom, min, max));
            gr_seq_ref(&s, atom);
        }
        if (r->c->failed) break;
        gr_alt(r->c->g, rule, &s);
        if (r->p < r->end && *r->p == '|') {
            r->p++;
            continue;
        }
        break;
    }
    gr_seq_free(&s);
    return r->c->failed ? -1 : check(r->c, rule);
}

static int pattern_rule(sc *c, const char *pattern, size_t len) {
    if (len < 2 || pattern[0] != '^' || pattern[len - 1] != '$' || (len > 2 && pattern[len - 2] == '\\'))
        return fail(c, "json_schema: pattern \"%s\" must match the whole string: anchor it as ^...$", pattern);
    rx r = {c, pattern + 1, pattern + len - 1, 0};
    int body = rx_alt(&r);
    if (body < 0) return -1;
    if (r.p != r.end) return rx_fail(&r, "an unmatched )");
    gr_seq s;
    gr_seq_init(&s);
    open_string(c, &s);
    gr_seq_ref(&s, body);
    open_string(c, &s);
    int rule = check(c, gr_rule_of(c->g, &s));
    gr_seq_free(&s);
    return rule;
}

/* ------------------------------------------------------------------ literals */

static int cmp_keys(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* The keys of an object, sorted (Gemma: dictsort) or in their order; *keys is freed by the caller. */
static int object_keys(sc *c, const json_t *o, int sorted, const char ***keys) {
    size_t n = json_object_size(o), i = 0;
    *keys = malloc((n + 1) * sizeof **keys);
    if (!*keys) return fail(c, "json_schema: %s", "out of memory");
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)o, k, v) (*keys)[i++] = k;
    if (sorted) qsort(*keys, n, sizeof **keys, cmp_keys);
    return (int)n;
}

/* A JSON value written as the dialect writes it. */
static void put_literal(sc *c, gr_seq *s, const json_t *v) {
    if (!c->gemma) {
        char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
        if (!t) {
            fail(c, "json_schema: %s", "out of memory");
            return;
        }
        lit(c, s, t);
        free(t);
        return;
    }
    if (json_is_string(v)) {
        gr_seq_special(c->g, s, QUOTE);
        gr_seq_lit(c->g, s, json_string_value(v), json_string_length(v));
        gr_seq_special(c->g, s, QUOTE);
    } else if (json_is_null(v)) {
        lit(c, s, "None");
    } else if (json_is_object(v)) {
        const char **keys;
        int n = object_keys(c, v, 1, &keys);
        lit(c, s, "{");
        for (int i = 0; i < n; i++) {
            if (i) lit(c, s, ",");
            lit(c, s, keys[i]);
            lit(c, s, ":");
            put_literal(c, s, json_object_get(v, keys[i]));
        }
        lit(c, s, "}");
        if (n >= 0) free(keys);
    } else if (json_is_array(v)) {
        lit(c, s, "[");
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) lit(c, s, ",");
            put_literal(c, s, json_array_get(v, i));
        }
        lit(c, s, "]");
    } else {
        char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        if (t) lit(c, s, t);
        free(t);
    }
}

/* ------------------------------------------------------------------ values */

static int value(sc *c, const json_t *schema);

/* A key of any name: a string (JSON) or a bare word (Gemma: [A-Za-z_][A-Za-z0-9_-]{0,63}). */
static int key_rule(sc *c) {
    if (c->key >= 0) return c->key;
    if (!c->gemma) return c->key = string_rule(c, 0, -1);
    uint64_t first[4] = {0}, rest[4] = {0};
    for (unsigned b = 0; b < 128; b++) {
        const int alpha = (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || b == '_';
        if (alpha) first[b >> 6] |= 1ull << (b & 63);
        if (alpha || (b >= '0' && b <= '9') || b == '-') rest[b >> 6] |= 1ull << (b & 63);
    }
    gr_seq s;
    gr_seq_init(&s);
    gr_seq_set(c->g, &s, rest);
    const int more = check(c, gr_repeat(c->g, check(c, gr_rule_of(c->g, &s)), 0, 63));
    gr_seq_clear(&s);
    gr_seq_set(c->g, &s, first);
    gr_seq_ref(&s, more);
    c->key = check(c, gr_rule_of(c->g, &s));
    gr_seq_free(&s);
    return c->key;
}

/* Appends a member of any key: key rule, then the separator, then value rule. */
static void member_of(sc *c, gr_seq *s, int key, int value) {
    gr_seq_ref(s, key);
    put_ws(c, s);
    lit(c, s, ":");
    put_ws(c, s);
    gr_seq_ref(s, value);
}

/* The rules of a list of x (a sequence): item (x, then blanks) and more (("," blanks item)*). */
static void list_rules(sc *c, const gr_seq *x, int *item, int *more) {
    gr_seq s;
    gr_seq_init(&s);
    gr_seq_cat(&s, x);
    put_ws(c, &s);
    *item = check(c, gr_rule_of(c->g, &s));
    gr_seq_clear(&s);
    lit(c, &s, ",");
    put_ws(c, &s);
    gr_seq_ref(&s, *item);
    *more = check(c, gr_repeat(c->g, check(c, gr_rule_of(c->g, &s)), 0, -1));
    gr_seq_free(&s);
}

/* Any JSON value (or, Gemma, any value of its notation). */
static int any_rule(sc *c) {
    if (c->any >= 0) return c->any;
    g4_grammar *g = c->g;
    int r = c->any = gr_rule(g);
    gr_seq s;
    gr_seq_init(&s);
    const int str = string_rule(c, 0, -1), num = number_rule(c, 0);
    static const char *const json_words[] = {"true", "false", "null", NULL},
                             *const gemma_words[] = {"true", "false", "null", "None", NULL};
    const int words = words_rule(c, c->gemma ? gemma_words : json_words);
    const int alts[] = {str, num, words};
    for (int i = 0; i < 3; i++) {
        gr_seq_clear(&s);
        gr_seq_ref(&s, alts[i]);
        gr_alt(g, r, &s);
    }
    for (int k = 0; k < 2; k++) { /* {members} and [values]: a list or nothing between the brackets */
        int item, more, body = gr_rule(g);
        gr_seq_clear(&s);
        if (!k) member_of(c, &s, key_rule(c), r);
        else gr_seq_ref(&s, r);
        list_rules(c, &s, &item, &more);
        gr_alt_opt(g, body, item, more);
        gr_seq_clear(&s);
        lit(c, &s, k ? "[" : "{");
        put_ws(c, &s);
        gr_seq_ref(&s, body);
        lit(c, &s, k ? "]" : "}");
        gr_alt(g, r, &s);
    }
    gr_seq_free(&s);
    return check(c, r);
}

static int get_count(sc *c, const json_t *schema, const char *key, int64_t def, int64_t *out) {
    const json_t *v = json_object_get(schema, key);
    *out = def;
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return fail(c, "json_schema: %s must be a non-negative integer", key);
    *out = json_integer_value(v);
    return 0;
}

/* The key of a property as the dialect writes it, then the separator. */
static void put_key(sc *c, gr_seq *s, const char *k) {
    if (c->gemma) {
        lit(c, s, k);
    } else {
        json_t *j = json_string(k);
        char *t = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
        if (t) lit(c, s, t);
        else fail(c, "json_schema: %s", "out of memory");
        free(t);
        json_decref(j);
    }
    put_ws(c, s);
    lit(c, s, ":");
    put_ws(c, s);
}

static int object_schema(sc *c, const json_t *schema) {
    g4_grammar *g = c->g;
    const json_t *props = json_object_get(schema, "properties"), *req = json_object_get(schema, "required"),
                 *addl = json_object_get(schema, "additionalProperties");
    if (props && !json_is_object(props)) return fail(c, "json_schema: %s must be an object", "properties");
    if (req && !json_is_array(req)) return fail(c, "json_schema: %s must be an array", "required");
    if (addl && !json_is_boolean(addl) && !json_is_object(addl))
        return fail(c, "json_schema: %s must be a boolean or a schema", "additionalProperties");
    size_t i;
    const json_t *v;
    json_array_foreach(req, i, v) {
        if (!json_is_string(v)) return fail(c, "json_schema: %s holds a non-string", "required");
        if (!json_object_get(props, json_string_value(v)))
            return fail(c, "json_schema: required property \"%s\" is not in properties", json_string_value(v));
    }
    /* extra keys: additionalProperties true or a schema, or no properties listed and no word against them */
    int extra_value = -1;
    if (addl && json_is_object(addl)) extra_value = value(c, addl);
    else if (json_is_true(addl) || (!addl && !json_object_size(props))) extra_value = any_rule(c);
    if (c->failed) return -1;
    const char **keys = NULL;
    int n = props ? object_keys(c, props, c->gemma, &keys) : 0;
    if (n < 0) return -1;
    gr_seq s;
    gr_seq_init(&s);
    /* tail[k][comma]: the members from property k on, after something (comma 1) or nothing (0) */
    int tail[2];
    if (extra_value >= 0) { /* extra members: member (, member)* after nothing, (, member)* after something */
        int item;
        gr_seq_clear(&s);
        member_of(c, &s, key_rule(c), extra_value);
        list_rules(c, &s, &item, &tail[1]);
        tail[0] = gr_rule(g);
        gr_alt_opt(g, tail[0], item, tail[1]);
    } else {
        tail[0] = tail[1] = gr_rule(g);
        gr_seq_clear(&s);
        gr_alt(g, tail[0], &s);
    }
    for (int k = n - 1; k >= 0 && !c->failed; k--) {
        const json_t *ps = json_object_get(props, keys[k]);
        int required = 0;
        json_array_foreach(req, i, v) required |= !strcmp(json_string_value(v), keys[k]);
        int val = value(c, ps);
        if (val < 0) break;
        gr_seq_clear(&s);
        put_key(c, &s, keys[k]);
        gr_seq_ref(&s, val);
        put_ws(c, &s);
        int member = gr_rule_of(g, &s);
        int next[2];
        for (int comma = 0; comma < 2; comma++) {
            next[comma] = gr_rule(g);
            gr_seq_clear(&s);
            if (comma) {
                lit(c, &s, ",");
                put_ws(c, &s);
            }
            gr_seq_ref(&s, member);
            gr_seq_ref(&s, tail[1]);
            gr_alt(g, next[comma], &s);
            if (!required) { /* or the property is left out */
                gr_seq_clear(&s);
                gr_seq_ref(&s, tail[comma]);
                gr_alt(g, next[comma], &s);
            }
        }
        tail[0] = next[0];
        tail[1] = next[1];
    }
    free(keys);
    if (c->failed) {
        gr_seq_free(&s);
        return -1;
    }
    gr_seq_clear(&s);
    lit(c, &s, "{");
    put_ws(c, &s);
    gr_seq_ref(&s, tail[0]);
    lit(c, &s, "}");
    int r = gr_rule_of(g, &s);
    gr_seq_free(&s);
    return check(c, r);
}

static int array_schema(sc *c, const json_t *schema) {
    g4_grammar *g = c->g;
    const json_t *items = json_object_get(schema, "items"), *prefix = json_object_get(schema, "prefixItems");
    if (prefix && !json_is_array(prefix)) return fail(c, "json_schema: %s must be an array", "prefixItems");
    if (items && !json_is_object(items) && !json_is_boolean(items))
        return fail(c, "json_schema: %s must be a schema", "items");
    int64_t min, max;
    if (get_count(c, schema, "minItems", 0, &min) || get_count(c, schema, "maxItems", -1, &max)) return -1;
    const int np = (int)json_array_size(prefix);
    const int rest_ok = !json_is_false(items);
    if (!rest_ok && (max < 0 || max > np)) max = np;
    if (max >= 0 && min > max) return fail(c, "json_schema: %s", "minItems above maxItems");
    if (min > MAX_REPEAT || max > MAX_REPEAT) return fail(c, "json_schema: %s", "array bounds above 4096");
    const int item = rest_ok ? (items && !json_is_true(items) ? value(c, items) : any_rule(c)) : -1;
    if (c->failed) return -1;
    gr_seq s;
    gr_seq_init(&s);
    /* after[k]: the items from position k on, after k items (k >= 1) */
    int tail = -1;
    { /* the items past the prefix: ("," item){a,b} */
        int64_t lo = min > np ? min - np : 0, hi = max < 0 ? -1 : max - np;
        if (item >= 0 && (hi < 0 || hi > 0)) {
            gr_seq_clear(&s);
            lit(c, &s, ",");
            put_ws(c, &s);
            gr_seq_ref(&s, item);
            put_ws(c, &s);
            tail = check(c, gr_repeat(g, gr_rule_of(g, &s), (int)lo, (int)hi));
        } else {
            gr_seq_clear(&s);
            tail = gr_rule_of(g, &s);
        }
    }
    /* positions np-1 .. 0 of the prefix, each optional once past minItems */
    for (int k = np - 1; k >= 0 && !c->failed; k--) {
        int v = value(c, json_array_get(prefix, k));
        if (v < 0) break;
        int r = gr_rule(g);
        gr_seq_clear(&s);
        if (k) {
            lit(c, &s, ",");
            put_ws(c, &s);
        }
        gr_seq_ref(&s, v);
        put_ws(c, &s);
        gr_seq_ref(&s, tail);
        gr_alt(g, r, &s);
        if (k >= min) { /* the array may end before position k */
            gr_seq_clear(&s);
            gr_alt(g, r, &s);
        }
        tail = r;
    }
    if (c->failed) {
        gr_seq_free(&s);
        return -1;
    }
    int body;
    if (np) {
        body = tail;
    } else { /* item ("," item)... or nothing when minItems is 0 */
        body = gr_rule(g);
        if (item >= 0 && max != 0) {
            gr_seq_clear(&s);
            gr_seq_ref(&s, item);
            put_ws(c, &s);
            int64_t lo = min > 1 ? min - 1 : 0, hi = max < 0 ? -1 : max - 1;
            gr_seq_clear(&s);
            lit(c, &s, ",");
            put_ws(c, &s);
            gr_seq_ref(&s, item);
            put_ws(c, &s);
            int more = check(c, gr_repeat(g, gr_rule_of(g, &s), (int)lo, (int)hi));
            gr_seq_clear(&s);
            gr_seq_ref(&s, item);
            put_ws(c, &s);
            gr_seq_ref(&s, more);
            gr_alt(g, body, &s);
        }
        if (min == 0) {
            gr_seq_clear(&s);
            gr_alt(g, body, &s);
        }
    }
    gr_seq_clear(&s);
    lit(c, &s, "[");
    put_ws(c, &s);
    gr_seq_ref(&s, body);
    lit(c, &s, "]");
    int r = gr_rule_of(g, &s);
    gr_seq_free(&s);
    return check(c, r);
}

/* A JSON pointer into the root (#, #/a/b with ~0 ~1), or NULL. */
static const json_t *resolve(const json_t *root, const char *ref) {
    if (ref[0] != '#') return NULL;
    const json_t *at = root;
    const char *p = ref + 1;
    while (*p == '/' && at) {
        char part[256];
        size_t n = 0;
        for (p++; *p && *p != '/'; p++) {
            char ch = *p;
            if (ch == '~' && (p[1] == '0' || p[1] == '1')) ch = *++p == '0' ? '~' : '/';
            if (n + 1 < sizeof part) part[n++] = ch;
        }
        part[n] = 0;
        if (json_is_array(at)) {
            char *end;
            long k = strtol(part, &end, 10);
            at = *end || end == part ? NULL : json_array_get(at, (size_t)k);
        } else {
            at = json_object_get(at, part);
        }
    }
    return *p ? NULL : at;
}

static int ref_rule(sc *c, const char *ref) {
    const json_t *known = json_object_get(c->refs, ref);
    if (known) return (int)json_integer_value(known);
    const json_t *target = resolve(c->root, ref);
    if (!target) return fail(c, "json_schema: $ref \"%s\" does not name a schema of this document", ref);
    int r = gr_rule(c->g);
    if (r < 0 || json_object_set_new(c->refs, ref, json_integer(r))) return fail(c, "json_schema: %s", "out of memory");
    int v = value(c, target);
    if (v < 0) return -1;
    gr_seq s;
    gr_seq_init(&s);
    gr_seq_ref(&s, v);
    gr_alt(c->g, r, &s);
    gr_seq_free(&s);
    return check(c, r);
}

/* ------------------------------------------------------------------ allOf
 * allOf of several schemas, merged into one where that is exact: each part a schema without combinators (a $ref
 * alone is replaced by its target); types intersected (integer within number); properties united (a property in
 * several parts: allOf of its schemas), required united; additionalProperties false in a part drops the other
 * parts' properties it does not list (a required one of them: no document); lower bounds (minimum, minLength,
 * minItems, exclusiveMinimum) the greatest, upper bounds the least; items merged as properties are; any other
 * keyword in several parts must be equal in all. Anything else is an error naming it. */
static const char *const type_names[] = {"object", "array", "string", "integer", "number", "boolean", "null"};

/* The types a schema allows, as bits of type_names (all where it has no "type"); -1 on a bad "type". */
static int type_bits(const json_t *schema) {
    const json_t *t = json_object_get(schema, "type");
    if (!t) return 0x7f;
    int bits = 0;
    for (size_t i = 0; i < (json_is_array(t) ? json_array_size(t) : 1); i++) {
        const char *name = json_string_value(json_is_array(t) ? json_array_get(t, i) : t);
        int k = 0;
        while (k < 7 && (!name || strcmp(name, type_names[k]))) k++;
        if (k == 7) return -1;
        bits |= 1 << k | (k == 4 ? 1 << 3 : 0); /* (number takes integers) */
    }
    return bits;
}

/* 1 when key is one of the list's (NULL-terminated). */
static int listed(const char *const *list, const char *key) {
    for (; *list; list++)
        if (!strcmp(*list, key)) return 1;
    return 0;
}

/* Keywords that only annotate (skipped), and those that constrain (read; any other is an error). */
static const char *const annotation_keywords[] = {"title", "description", "default", "examples", "$schema", "$id",
                                                  "$comment", "deprecated", "readOnly", "writeOnly", NULL};
static const char *const known_keywords[] = {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems", "maxItems",
    "minLength", "maxLength", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions",
    "nullable", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "format", "pattern", NULL};

/* merged[key] = (a, b) as allOf wants them; 0, or -1 after an error. */
static int merge_keyword(sc *c, json_t *merged, const char *key, const json_t *b) {
    json_t *a = json_object_get(merged, key);
    if (!a) /* (a copy: required is appended to, and the schema's own document stays as it is) */
        return json_object_set_new(merged, key, json_deep_copy(b)) ? fail(c, "json_schema: %s", "out of memory") : 0;
    static const char *const lower[] = {"minimum", "exclusiveMinimum", "minLength", "minItems", NULL},
                             *const upper[] = {"maximum", "exclusiveMaximum", "maxLength", "maxItems", NULL};
    for (int u = 0; u < 2; u++)
        for (const char *const *k = u ? upper : lower; *k; k++)
            if (!strcmp(*k, key)) {
                if (!json_is_number(a) || !json_is_number(b)) return fail(c, "json_schema: %s must be a number", key);
                const double x = json_number_value(a), y = json_number_value(b);
                if (u ? y < x : y > x) json_object_set(merged, key, (json_t *)b);
                return 0;
            }
    if (!strcmp(key, "required")) {
        if (!json_is_array(a) || !json_is_array(b)) return fail(c, "json_schema: %s must be an array", key);
        for (size_t i = 0; i < json_array_size(b); i++) {
            int have = 0;
            for (size_t j = 0; j < json_array_size(a) && !have; j++)
                have = json_equal(json_array_get(a, j), json_array_get(b, i));
            if (!have) json_array_append(a, json_array_get(b, i));
        }
        return 0;
    }
    if (!strcmp(key, "properties") || !strcmp(key, "$items")) { /* (items: as one property) */
        if (!json_is_object(a) || !json_is_object(b)) return fail(c, "json_schema: %s must be an object", key);
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)b, k, v) {
            json_t *mine = json_object_get(a, k);
            if (!mine || json_equal(mine, v)) json_object_set(a, k, v);
            else json_object_set_new(a, k, json_pack("{s:[O,O]}", "allOf", mine, v));
        }
        return 0;
    }
    if (json_equal(a, b)) return 0;
    return fail(c, "json_schema: allOf: \"%s\" differs between its schemas (not supported)", key);
}

static int allof_rule(sc *c, const json_t *list) {
    json_t *merged = json_object(), *props = json_object(), *closed = json_array(); /* closed: key lists */
    int types = 0x7f, r = -1;
    if (!merged || !props || !closed) {
        fail(c, "json_schema: %s", "out of memory");
        goto done;
    }
    json_object_set(merged, "properties", props);
    for (size_t i = 0; i < json_array_size(list); i++) {
        const json_t *part = json_array_get(list, i);
        for (int hops = 0; json_is_object(part) && json_object_get(part, "$ref"); hops++) {
            const char *ref = json_string_value(json_object_get(part, "$ref"));
            const json_t *target = ref ? resolve(c->root, ref) : NULL;
            if (!target || hops > 16 || json_object_size(part) != 1) {
                fail(c, "json_schema: %s", "allOf: a $ref beside other keywords, or one that names nothing");
                goto done;
            }
            part = target;
        }
        if (json_is_true(part)) continue;
        if (!json_is_object(part)) {
            fail(c, "json_schema: %s", "allOf: a part is not a schema object");
            goto done;
        }
        const int bits = type_bits(part);
        if (bits < 0) {
            fail(c, "json_schema: %s", "allOf: a part's type is not a type name or a list of them");
            goto done;
        }
        types &= bits;
        const json_t *pp = json_object_get(part, "properties"), *ap = json_object_get(part, "additionalProperties");
        if (json_is_false(ap)) {
            json_t *keys = json_array();
            const char *k;
            const json_t *v;
            if (pp) json_object_foreach((json_t *)pp, k, v) json_array_append_new(keys, json_string(k));
            json_array_append_new(closed, keys);
        } else if (ap && !json_is_true(ap)) {
            fail(c, "json_schema: %s", "allOf: additionalProperties of a schema is not supported there");
            goto done;
        }
        const char *key;
        const json_t *v;
        json_object_foreach((json_t *)part, key, v) {
            static const char *const merged_above[] = {"type", "additionalProperties", "$defs", "definitions", NULL},
                                     *const refused[] = {"anyOf", "oneOf", "allOf", "enum", "const", "$ref",
                                                         "prefixItems", "nullable", NULL};
            if (listed(annotation_keywords, key) || listed(merged_above, key)) continue;
            if (listed(refused, key)) {
                fail(c, "json_schema: allOf: \"%s\" in a part of several is not supported", key);
                goto done;
            }
            if (!strcmp(key, "items")) { /* merged as a property "" of an object $items */
                json_t *one = json_pack("{s:O}", "", v);
                int bad = merge_keyword(c, merged, "$items", one);
                json_decref(one);
                if (bad) goto done;
                continue;
            }
            if (merge_keyword(c, merged, key, v)) goto done;
        }
    }
    if (!types) {
        fail(c, "json_schema: %s", "allOf: its schemas' types have no value in common");
        goto done;
    }
    /* the parts closed by additionalProperties false keep only the keys every one of them lists */
    if (json_array_size(closed)) {
        json_object_set_new(merged, "additionalProperties", json_false());
        const char *k;
        json_t *v, *tmp;
        json_object_foreach_safe(props, tmp, k, v) {
            for (size_t i = 0; i < json_array_size(closed); i++) {
                const json_t *keys = json_array_get(closed, i);
                int listed = 0;
                for (size_t j = 0; j < json_array_size(keys) && !listed; j++)
                    listed = !strcmp(json_string_value(json_array_get(keys, j)), k);
                if (!listed) {
                    json_object_del(props, k);
                    break;
                }
            }
        }
        const json_t *req = json_object_get(merged, "required");
        for (size_t i = 0; i < json_array_size(req); i++)
            if (!json_object_get(props, json_string_value(json_array_get(req, i)))) {
                fail(c, "json_schema: allOf: required \"%s\" is closed out by additionalProperties false (no document)",
                     json_string_value(json_array_get(req, i)));
                goto done;
            }
    }
    if (!json_object_size(props) && !json_array_size(closed)) json_object_del(merged, "properties");
    json_t *items = json_object_get(merged, "$items");
    if (items) json_object_set(merged, "items", json_object_get(items, "")), json_object_del(merged, "$items");
    json_t *tl = json_array();
    for (int k = 0; k < 7; k++)
        if (types >> k & 1 && !(k == 3 && types >> 4 & 1)) json_array_append_new(tl, json_string(type_names[k]));
    if (types != 0x7f) json_object_set_new(merged, "type", tl);
    else json_decref(tl);
    r = value(c, merged);
done:
    json_decref(merged);
    json_decref(props);
    json_decref(closed);
    return r;
}

/* The schema for one type name. */
static int typed(sc *c, const json_t *schema, const char *type) {
    if (!strcmp(type, "object")) return object_schema(c, schema);
    if (!strcmp(type, "array")) return array_schema(c, schema);
    if (!strcmp(type, "string")) {
        const json_t *f = json_object_get(schema, "format"), *pat = json_object_get(schema, "pattern");
        if (pat && (f || json_object_get(schema, "minLength") || json_object_get(schema, "maxLength")))
            return fail(c, "json_schema: %s", "pattern with format, minLength or maxLength is not supported");
        if (pat) {
            if (!json_is_string(pat)) return fail(c, "json_schema: %s must be a string", "pattern");
            return pattern_rule(c, json_string_value(pat), json_string_length(pat));
        }
        if (f) {
            if (!json_is_string(f)) return fail(c, "json_schema: %s must be a string", "format");
            return format_rule(c, json_string_value(f));
        }
        int64_t min, max;
        if (get_count(c, schema, "minLength", 0, &min) || get_count(c, schema, "maxLength", -1, &max)) return -1;
        if (max >= 0 && min > max) return fail(c, "json_schema: %s", "minLength above maxLength");
        return string_rule(c, min, max);
    }
    if (!strcmp(type, "integer")) return integer_schema(c, schema);
    if (!strcmp(type, "number")) return number_schema(c, schema);
    if (!strcmp(type, "boolean"))
        return c->boolean >= 0 ? c->boolean : (c->boolean = words_rule(c, (const char *const[]){"true", "false", NULL}));
    if (!strcmp(type, "null")) {
        static const char *const json_null[] = {"null", NULL}, *const gemma_null[] = {"None", "null", NULL};
        return c->null_ >= 0 ? c->null_ : (c->null_ = words_rule(c, c->gemma ? gemma_null : json_null));
    }
    return fail(c, "json_schema: type \"%s\" is not a JSON Schema type", type);
}

/* A rule of alternatives: each of the rules alts[0..n). */
static int alternatives(sc *c, const int *alts, int n) {
    int r = gr_rule(c->g);
    gr_seq s;
    gr_seq_init(&s);
    for (int i = 0; i < n; i++) {
        gr_seq_clear(&s);
        gr_seq_ref(&s, alts[i]);
        gr_alt(c->g, r, &s);
    }
    gr_seq_free(&s);
    return check(c, r);
}

static int value_inner(sc *c, const json_t *schema) {
    if (json_is_true(schema)) return any_rule(c);
    if (json_is_false(schema)) return fail(c, "json_schema: %s", "the schema false accepts nothing");
    if (!json_is_object(schema)) return fail(c, "json_schema: %s", "a schema must be an object or a boolean");
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)schema, key, v) {
        if (!listed(known_keywords, key) && !listed(annotation_keywords, key))
            return fail(c, "json_schema: keyword \"%s\" is not supported", key);
    }
    const json_t *ref = json_object_get(schema, "$ref");
    if (ref) {
        if (!json_is_string(ref)) return fail(c, "json_schema: %s must be a string", "$ref");
        return ref_rule(c, json_string_value(ref));
    }
    const json_t *nullable = json_object_get(schema, "nullable");
    if (json_is_true(nullable)) { /* OpenAPI: the schema or null */
        json_t *copy = json_copy((json_t *)schema);
        if (!copy || json_object_del(copy, "nullable")) {
            json_decref(copy);
            return fail(c, "json_schema: %s", "out of memory");
        }
        int alts[2] = {value(c, copy), typed(c, schema, "null")};
        json_decref(copy);
        return alts[0] < 0 || alts[1] < 0 ? -1 : alternatives(c, alts, 2);
    }
    const json_t *cnst = json_object_get(schema, "const"), *en = json_object_get(schema, "enum");
    if (cnst || en) {
        if (en && (!json_is_array(en) || !json_array_size(en)))
            return fail(c, "json_schema: %s must be a non-empty array", "enum");
        int r = gr_rule(c->g);
        gr_seq s;
        gr_seq_init(&s);
        for (size_t i = 0; i < (cnst ? 1 : json_array_size(en)); i++) {
            gr_seq_clear(&s);
            put_literal(c, &s, cnst ? cnst : json_array_get(en, i));
            gr_alt(c->g, r, &s);
        }
        gr_seq_free(&s);
        return check(c, r);
    }
    static const char *const combos[] = {"anyOf", "oneOf", "allOf"};
    for (int k = 0; k < 3; k++) {
        const json_t *list = json_object_get(schema, combos[k]);
        if (!list) continue;
        if (!json_is_array(list) || !json_array_size(list))
            return fail(c, "json_schema: %s must be a non-empty array", combos[k]);
        if (k == 2) return json_array_size(list) == 1 ? value(c, json_array_get(list, 0)) : allof_rule(c, list);
        const size_t n = json_array_size(list);
        int *alts = malloc(n * sizeof *alts);
        if (!alts) return fail(c, "json_schema: %s", "out of memory");
        for (size_t i = 0; i < n && !c->failed; i++) alts[i] = value(c, json_array_get(list, i));
        int r = c->failed ? -1 : alternatives(c, alts, (int)n);
        free(alts);
        return r;
    }
    const json_t *type = json_object_get(schema, "type");
    if (json_is_string(type)) return typed(c, schema, json_string_value(type));
    if (json_is_array(type) && json_array_size(type)) {
        const size_t n = json_array_size(type);
        int alts[8];
        if (n > 8) return fail(c, "json_schema: %s", "a type list of more than 8 names");
        for (size_t i = 0; i < n; i++) {
            const char *t = json_string_value(json_array_get(type, i));
            if (!t) return fail(c, "json_schema: %s", "a type list holds a non-string");
            if ((alts[i] = typed(c, schema, t)) < 0) return -1;
        }
        return alternatives(c, alts, (int)n);
    }
    if (type) return fail(c, "json_schema: %s must be a type name or a list of them", "type");
    /* no type: what the keywords say */
    if (json_object_get(schema, "properties") || json_object_get(schema, "additionalProperties") ||
        json_object_get(schema, "required"))
        return object_schema(c, schema);
    if (json_object_get(schema, "items") || json_object_get(schema, "prefixItems") ||
        json_object_get(schema, "minItems") || json_object_get(schema, "maxItems"))
        return array_schema(c, schema);
    /* a keyword of one type alone: a value of that type (JSON Schema would let other types pass; they are left out
       rather than the keyword dropped) */
    if (json_object_get(schema, "pattern") || json_object_get(schema, "format") ||
        json_object_get(schema, "minLength") || json_object_get(schema, "maxLength"))
        return typed(c, schema, "string");
    if (json_object_get(schema, "minimum") || json_object_get(schema, "maximum") ||
        json_object_get(schema, "exclusiveMinimum") || json_object_get(schema, "exclusiveMaximum") ||
        json_object_get(schema, "multipleOf"))
        return typed(c, schema, "number");
    return any_rule(c);
}

static int value(sc *c, const json_t *schema) {
    if (c->failed) return -1;
    if (++c->depth > MAX_NESTING) return fail(c, "json_schema: %s", "schemas nested deeper than 64");
    int r = value_inner(c, schema);
    c->depth--;
    return r;
}

static void sc_init(sc *c, g4_grammar *g, const json_t *root, int gemma, g4_error *err) {
    memset(c, 0, sizeof *c);
    c->g = g;
    c->root = root;
    c->gemma = gemma;
    c->err = err;
    c->refs = json_object();
    if (!c->refs) fail(c, "json_schema: %s", "out of memory");
    c->ws = c->any = c->string = c->number = c->integer = c->boolean = c->null_ = c->chr = c->digit = c->key = -1;
}

static json_t *parse(const char *text, const char *what, g4_error *err) {
    json_error_t je;
    json_t *j = json_loads(text, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    if (!j) g4_fail(err, "%s: not valid JSON (line %d: %s)", what, je.line, je.text);
    return j;
}

/* A compile's start: the spec parsed (text NULL: none) and a new grammar. */
static int sc_begin(sc *c, const char *text, const char *what, int gemma, json_t **root, g4_error *err) {
    *root = NULL;
    if (text && !(*root = parse(text, what, err))) return -1;
    g4_grammar *g = gr_new();
    if (!g) {
        json_decref(*root);
        return g4_fail(err, "out of memory");
    }
    sc_init(c, g, *root, gemma, err);
    return 0;
}

/* A compile's end: the grammar of start rule start, or -1 with the error said. */
static int sc_end(sc *c, json_t *root, int start, const char *what, g4_grammar **out) {
    json_decref(c->refs);
    json_decref(root);
    if (start < 0 || gr_finish(c->g, start, c->err)) {
        if (start < 0 && !c->failed) g4_fail(c->err, "%s: out of memory", what);
        g4_grammar_free(c->g);
        return -1;
    }
    *out = c->g;
    return 0;
}

G4_API int g4_grammar_json_schema(const char *schema, g4_grammar **out, g4_error *err) {
    *out = NULL;
    if (!schema) return g4_fail(err, "json_schema: no schema");
    sc c;
    json_t *root;
    if (sc_begin(&c, schema, "json_schema", 0, &root, err)) return -1;
    return sc_end(&c, root, value(&c, root), "json_schema", out);
}

G4_API int g4_grammar_tool_calls(const char *tools, const char *name, int max_calls, g4_grammar **out,
                                 g4_error *err) {
    *out = NULL;
    if (!tools) return g4_fail(err, "tool calls: no tools");
    sc c;
    json_t *root;
    if (sc_begin(&c, tools, "tools", 1, &root, err)) return -1;
    g4_grammar *g = c.g;
    int fns = gr_rule(g), n = 0, start = -1;
    gr_seq s;
    gr_seq_init(&s);
    size_t i;
    const json_t *t;
    if (!json_is_array(root)) fail(&c, "tools: %s", "not an array");
    json_array_foreach(root, i, t) {
        if (c.failed || fns < 0) break;
        const json_t *fn = json_object_get(t, "function");
        const char *fname = json_string_value(json_object_get(fn, "name"));
        if (!fname) {
            fail(&c, "tools: %s", "a tool without function.name");
            break;
        }
        if (name && strcmp(name, fname)) continue;
        const json_t *params = json_object_get(fn, "parameters");
        c.root = params ? params : root;
        json_object_clear(c.refs); /* $refs point into each function's own parameters */
        int args;
        if (!params || (json_is_object(params) && !json_object_size(params))) {
            gr_seq_clear(&s);
            lit(&c, &s, "{}");
            args = check(&c, gr_rule_of(g, &s));
        } else {
            args = value(&c, params);
        }
        if (args < 0) break;
        gr_seq_clear(&s);
        lit(&c, &s, fname);
        gr_seq_ref(&s, args);
        gr_alt(g, fns, &s);
        n++;
    }
    if (!c.failed && !n) {
        if (name) fail(&c, "tool_choice names function \"%s\", which tools do not hold", name);
        else fail(&c, "tools: %s", "no function to call");
    }
    if (!c.failed) {
        gr_seq_clear(&s);
        gr_seq_special(g, &s, "<|tool_call>");
        lit(&c, &s, "call:");
        gr_seq_ref(&s, fns);
        gr_seq_special(g, &s, "<tool_call|>");
        int call = check(&c, gr_rule_of(g, &s));
        start = call >= 0 ? check(&c, gr_repeat(g, call, 1, max_calls > 0 ? max_calls : -1)) : -1;
    }
    gr_seq_free(&s);
    return sc_end(&c, root, start, "tool calls", out);
}

G4_API int g4_grammar_regex(const char *regex, g4_grammar **out, g4_error *err) {
    *out = NULL;
    if (!regex) return g4_fail(err, "regex: none");
    sc c;
    json_t *root;
    if (sc_begin(&c, NULL, "regex", 0, &root, err)) return -1;
    c.raw = 1;
    size_t len = strlen(regex);
    const char *p = regex;
    if (len && p[0] == '^') p++, len--; /* the whole output matches: anchors say nothing more */
    if (len && p[len - 1] == '$' && !(len > 1 && p[len - 2] == '\\')) len--;
    rx r = {&c, p, p + len, 0};
    int body = c.failed ? -1 : rx_alt(&r);
    if (body >= 0 && r.p != r.end) body = rx_fail(&r, "an unmatched )");
    return sc_end(&c, root, body, "regex", out);
}
