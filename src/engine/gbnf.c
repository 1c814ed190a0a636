/* Grammars written in GBNF, llama.cpp's grammar notation (its grammars/README.md), and lists of choices.
 *
 *   root   ::= greeting ws name        # the rule named root is the output
 *   name   ::= [A-Z] [a-z]+ | "Anon"
 *   ws     ::= [ \t\n]*
 *
 * Rules are `name ::= alternatives` (names of letters, digits, '-' and '_'); a rule ends at a newline unless
 * inside parentheses or after '|'. Items: "literal" (escapes \n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH), a
 * class [a-z0-9_] or [^...] of code points, `.` (any character), a rule's name, ( alternatives ), and a special
 * token by its text, <|tool_call>; each may take * + ? {m} {m,} {m,n}. Comments run from # to the line's end.
 * Characters are UTF-8. Left recursion (a ::= a "x") is an error, as in llama.cpp. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "engine/grammar.h"

#define MAX_REPEAT 4096
#define MAX_NESTING 256

typedef struct gb {
    g4_grammar *g;
    const char *p, *end;
    json_t *names; /* name -> {"rule": id, "defined": bool} */
    g4_error *err;
    int failed;
    int line;
    int depth; /* parentheses open (at most MAX_NESTING: a hostile text cannot run the stack out) */
} gb;

static int gb_fail(gb *b, const char *why) {
    if (!b->failed) g4_fail(b->err, "grammar: line %d: %s", b->line, why);
    b->failed = 1;
    return -1;
}

/* Blanks and comments; newlines too where newline_ok. */
static void gb_space(gb *b, int newline_ok) {
    while (b->p < b->end) {
        const char c = *b->p;
        if (c == ' ' || c == '\t' || c == '\r') b->p++;
        else if (c == '#')
            while (b->p < b->end && *b->p != '\n') b->p++;
        else if (c == '\n' && newline_ok) b->p++, b->line++;
        else break;
    }
}

static int word_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* The rule of a name, made at its first mention. */
static int gb_rule(gb *b, const char *name, size_t len, int define) {
    json_t *e = json_object_getn(b->names, name, len);
    if (!e) {
        int r = gr_rule(b->g);
        if (r < 0 || !(e = json_pack("{s:i,s:b}", "rule", r, "defined", 0)) ||
            json_object_setn_new_nocheck(b->names, name, len, e))
            return gb_fail(b, "out of memory or too many rules");
    }
    if (define) {
        if (json_is_true(json_object_get(e, "defined"))) return gb_fail(b, "a rule is defined twice");
        json_object_set_new(e, "defined", json_true());
    }
    return (int)json_integer_value(json_object_get(e, "rule"));
}

static uint32_t gb_utf8(gb *b) { return gr_utf8_next(&b->p, b->end); }

/* A character of a literal or class, escapes read. */
static int gb_char(gb *b, uint32_t *cp) {
    if (b->p >= b->end) return gb_fail(b, "a literal or class runs to the end");
    if (*b->p != '\\') {
        if (*b->p == '\n') b->line++;
        *cp = gb_utf8(b);
        return 0;
    }
    b->p++;
    if (b->p >= b->end) return gb_fail(b, "a trailing backslash");
    const char k = *b->p++;
    int digits = 0;
    switch (k) {
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'x': digits = 2; break;
    case 'u': digits = 4; break;
    case 'U': digits = 8; break;
    case '\\': case '"': case '[': case ']': case '-': case '^': *cp = (uint32_t)(unsigned char)k; return 0;
    default: return gb_fail(b, "an unknown escape");
    }
    *cp = 0;
    for (int i = 0; i < digits; i++, b->p++) {
        const char h = b->p < b->end ? *b->p : 0;
        const int v = h >= '0' && h <= '9' ? h - '0' : (h | 0x20) >= 'a' && (h | 0x20) <= 'f' ? (h | 0x20) - 'a' + 10 : -1;
        if (v < 0) return gb_fail(b, "a bad \\x, \\u or \\U escape");
        *cp = *cp << 4 | (uint32_t)v;
    }
    if (*cp > 0x10ffff) return gb_fail(b, "a code point beyond U+10FFFF");
    return 0;
}

static int gb_alternatives(gb *b, int rule, int nested);

/* One item (before its repetition) appended to s as a rule or terminals. */
static int gb_item(gb *b, gr_seq *s, int nested) {
    const char c = *b->p;
    if (c == '"') {
        b->p++;
        while (b->p < b->end && *b->p != '"') {
            uint32_t cp;
            if (gb_char(b, &cp)) return -1;
            gr_seq_cp(b->g, s, cp);
        }
        if (b->p >= b->end) return gb_fail(b, "an unclosed \"");
        b->p++;
        return 0;
    }
    if (c == '[' || c == '.') {
        gr_class cls = {0};
        if (c == '.') {
            b->p++;
            gr_class_add(&cls, 0, 0x10ffff); /* (gr_alt_class leaves the surrogates out) */
        } else {
            b->p++;
            const int negated = b->p < b->end && *b->p == '^';
            if (negated) b->p++;
            while (b->p < b->end && *b->p != ']' && !b->failed) {
                uint32_t lo, hi;
                if (gb_char(b, &lo)) break;
                hi = lo;
                if (b->p + 1 < b->end && *b->p == '-' && b->p[1] != ']') {
                    b->p++;
                    if (gb_char(b, &hi)) break;
                }
                if (hi < lo) gb_fail(b, "a range out of order");
                gr_class_add(&cls, lo, hi);
            }
            if (!b->failed && b->p >= b->end) gb_fail(b, "an unclosed [");
            b->p++;
            if (negated) gr_class_negate(&cls);
        }
        int r = b->failed ? -1 : gr_rule(b->g);
        if (r >= 0) gr_alt_class(b->g, r, &cls);
        gr_class_free(&cls);
        if (r < 0) return b->failed ? -1 : gb_fail(b, "out of memory or too many rules");
        gr_seq_ref(s, r);
        return 0;
    }
    if (c == '<') { /* a special token by its text */
        const char *e = memchr(b->p, '>', (size_t)(b->end - b->p));
        if (!e || e - b->p > 64) return gb_fail(b, "a <token> without its > (or over 64 bytes)");
        char text[72];
        memcpy(text, b->p, (size_t)(e - b->p) + 1);
        text[e - b->p + 1] = 0;
        gr_seq_special(b->g, s, text);
        b->p = e + 1;
        return 0;
    }
    if (c == '(') {
        if (++b->depth > MAX_NESTING) return gb_fail(b, "parentheses nested deeper than 256");
        b->p++;
        gb_space(b, 1);
        int r = gr_rule(b->g);
        if (r < 0) return gb_fail(b, "too many rules");
        if (gb_alternatives(b, r, 1)) return -1;
        gb_space(b, 1);
        if (b->p >= b->end || *b->p != ')') return gb_fail(b, "an unclosed (");
        b->p++;
        b->depth--;
        gr_seq_ref(s, r);
        return 0;
    }
    if (word_char(c)) {
        const char *n0 = b->p;
        while (b->p < b->end && word_char(*b->p)) b->p++;
        int r = gb_rule(b, n0, (size_t)(b->p - n0), 0);
        if (r < 0) return -1;
        gr_seq_ref(s, r);
        return 0;
    }
    (void)nested;
    return gb_fail(b, "expected a literal, class, rule name, ( or <token>");
}

/* A repetition after an item: 1 with min/max set, 0 with none. */
static int gb_repeat(gb *b, int *min, int *max) {
    if (b->p >= b->end) return 0;
    const char c = *b->p;
    if (c == '*' || c == '+' || c == '?') {
        b->p++;
        *min = c == '+';
        *max = c == '?' ? 1 : -1;
        return 1;
    }
    if (c != '{') return 0;
    char *e;
    long lo = strtol(b->p + 1, &e, 10), hi = lo;
    if (e == b->p + 1) return gb_fail(b, "a { that is not {m}, {m,} or {m,n}");
    if (*e == ',') {
        const char *h = e + 1;
        while (h < b->end && *h == ' ') h++;
        if (*h == '}') {
            hi = -1;
            e = (char *)h;
        } else {
            hi = strtol(h, &e, 10);
            if (e == h) return gb_fail(b, "a bad {m,n}");
        }
    }
    while (e < b->end && *e == ' ') e++;
    if (*e != '}' || lo < 0 || lo > MAX_REPEAT || hi > MAX_REPEAT || (hi >= 0 && hi < lo))
        return gb_fail(b, "a bad or too large {m,n} (at most 4096)");
    b->p = e + 1;
    *min = (int)lo;
    *max = (int)hi;
    return 1;
}

/* A sequence of items, up to '|', ')', or (not nested) the line's end. */
static int gb_sequence(gb *b, gr_seq *s, int nested) {
    gr_seq item;
    gr_seq_init(&item);
    int rc = 0;
    for (;;) {
        gb_space(b, nested);
        if (b->p >= b->end || *b->p == '|' || *b->p == ')' || *b->p == '\n') break;
        gr_seq_clear(&item);
        if ((rc = gb_item(b, &item, nested))) break;
        int min, max, q = gb_repeat(b, &min, &max);
        if (q < 0) {
            rc = -1;
            break;
        }
        if (q) {
            int x = gr_rule_of(b->g, &item), r = x < 0 ? -1 : gr_repeat(b->g, x, min, max);
            if (r < 0) {
                rc = gb_fail(b, "out of memory or too many rules");
                break;
            }
            gr_seq_ref(s, r);
        } else {
            gr_seq_cat(s, &item);
        }
    }
    gr_seq_free(&item);
    return rc;
}

static int gb_alternatives(gb *b, int rule, int nested) {
    gr_seq s;
    gr_seq_init(&s);
    int rc = 0;
    for (;;) {
        gr_seq_clear(&s);
        if ((rc = gb_sequence(b, &s, nested))) break;
        gr_alt(b->g, rule, &s);
        if (b->p < b->end && *b->p == '|') {
            b->p++;
            gb_space(b, 1);
            continue;
        }
        break;
    }
    gr_seq_free(&s);
    return rc;
}

G4_API int g4_grammar_gbnf(const char *text, g4_grammar **out, g4_error *err) {
    *out = NULL;
    if (!text) return g4_fail(err, "grammar: no text");
    gb b = {gr_new(), text, text + strlen(text), json_object(), err, 0, 1, 0};
    if (!b.g || !b.names) {
        g4_grammar_free(b.g);
        json_decref(b.names);
        return g4_fail(err, "out of memory");
    }
    for (;;) {
        gb_space(&b, 1);
        if (b.p >= b.end || b.failed) break;
        const char *n0 = b.p;
        while (b.p < b.end && word_char(*b.p)) b.p++;
        if (b.p == n0) {
            gb_fail(&b, "expected a rule name");
            break;
        }
        int r = gb_rule(&b, n0, (size_t)(b.p - n0), 1);
        gb_space(&b, 0);
        if (r < 0 || b.end - b.p < 3 || memcmp(b.p, "::=", 3)) {
            gb_fail(&b, "expected ::= after the rule's name");
            break;
        }
        b.p += 3;
        gb_space(&b, 1);
        if (gb_alternatives(&b, r, 0)) break;
        if (b.p < b.end && *b.p != '\n') {
            gb_fail(&b, *b.p == ')' ? "an unmatched )" : "expected the end of the line");
            break;
        }
    }
    const char *key;
    json_t *v;
    json_object_foreach(b.names, key, v) {
        if (b.failed) break;
        if (!json_is_true(json_object_get(v, "defined"))) {
            g4_fail(err, "grammar: rule \"%.64s\" is used but not defined", key);
            b.failed = 1;
        }
    }
    const json_t *root = json_object_get(b.names, "root");
    if (!b.failed && !root) g4_fail(err, "grammar: no rule named root"), b.failed = 1;
    int rc = b.failed ? -1 : gr_finish(b.g, (int)json_integer_value(json_object_get(root, "rule")), err);
    json_decref(b.names);
    if (rc) {
        g4_grammar_free(b.g);
        return -1;
    }
    *out = b.g;
    return 0;
}

G4_API int g4_grammar_choice(const char *const *choices, int n, g4_grammar **out, g4_error *err) {
    *out = NULL;
    if (n <= 0 || !choices) return g4_fail(err, "grammar: no choices");
    g4_grammar *g = gr_new();
    int r = g ? gr_rule(g) : -1;
    gr_seq s;
    gr_seq_init(&s);
    for (int i = 0; i < n && r >= 0; i++) {
        if (!choices[i] || !choices[i][0]) {
            gr_seq_free(&s);
            g4_grammar_free(g);
            return g4_fail(err, "grammar: choice %d is empty", i);
        }
        gr_seq_clear(&s);
        gr_seq_lit(g, &s, choices[i], strlen(choices[i]));
        gr_alt(g, r, &s);
    }
    gr_seq_free(&s);
    if (r < 0 || gr_finish(g, r, err)) {
        if (r < 0) g4_fail(err, "out of memory");
        g4_grammar_free(g);
        return -1;
    }
    *out = g;
    return 0;
}
