/* Grammars for constrained decoding: the builder, the matcher and the token masks (grammar.h). */
#include "engine/grammar.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

/* An item or marker of a rule: its kind in the top 3 bits, a set, rule or special index below. */
enum { I_SET = 0u, I_REF = 1u, I_SPECIAL = 2u, I_ALT_END = 3u, I_RULE_END = 4u };
#define KIND(e) ((e) >> 29)
#define VAL(e) ((e) & 0x1fffffffu)
#define ITEM(k, v) (((uint32_t)(k) << 29) | (uint32_t)(v))

#define MAX_STACK 256      /* positions a stack holds (deeper nesting is refused) */
#define MAX_RULES (1 << 20) /* a grammar's size (a hostile schema cannot take the machine's memory) */
#define MAX_ITEMS (1 << 24)
#define MAX_EXPANSION 4096 /* stacks one expansion may visit (an ambiguous grammar is cut there) */

typedef struct rule_items {
    uint32_t *v; /* alternatives, each ended by I_ALT_END */
    int n, cap;
    int defined;
} rule_items;

struct g4_grammar {
    rule_items *rules;
    int n_rules, cap_rules;
    uint64_t (*sets)[4];
    int n_sets, cap_sets;
    int byte_set[256]; /* 1 + the set of each single byte made so far (0: none yet) */
    char **specials;
    int n_specials;
    int failed;        /* 1: out of memory, 2: too large */
    size_t n_items;
    /* gr_finish: the rules flattened, each rule's alternatives then I_RULE_END */
    uint32_t *elems;
    uint32_t *rule_start;
    uint32_t root;     /* a position past the rules: the start rule, then the end of an alternative */
    uint32_t think_root; /* another: a thinking channel, then the start rule (g4_gr_match_new's thinking) */
    int think_open, think_close; /* the specials <|channel> and <channel|> */
    int start;
    int finished;
};

static int grow(void **p, int *cap, int need, size_t size) {
    if (need <= *cap) return 0;
    int c = *cap ? *cap : 8;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * size);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

/* ------------------------------------------------------------------ building */

void gr_seq_init(gr_seq *s) { memset(s, 0, sizeof *s); }
void gr_seq_free(gr_seq *s) {
    free(s->items);
    gr_seq_init(s);
}
void gr_seq_clear(gr_seq *s) { s->n = 0; }

static void seq_put(gr_seq *s, uint32_t item) {
    if (grow((void **)&s->items, &s->cap, s->n + 1, sizeof *s->items)) {
        s->failed = 1;
        return;
    }
    s->items[s->n++] = item;
}

static void seq_new_set(g4_grammar *g, gr_seq *s, const uint64_t set[4]) {
    if (grow((void **)&g->sets, &g->cap_sets, g->n_sets + 1, sizeof *g->sets)) {
        g->failed = 1;
        return;
    }
    memcpy(g->sets[g->n_sets], set, sizeof g->sets[0]);
    seq_put(s, ITEM(I_SET, g->n_sets++));
}

void gr_seq_set(g4_grammar *g, gr_seq *s, const uint64_t set[4]) {
    int bits = 0, c = 0;
    for (int w = 0; w < 4; w++) bits += __builtin_popcountll(set[w]);
    if (bits == 1) { /* a single byte: its one set */
        while (!(set[c >> 6] >> (c & 63) & 1)) c++;
        if (g->byte_set[c]) {
            seq_put(s, ITEM(I_SET, g->byte_set[c] - 1));
            return;
        }
        g->byte_set[c] = g->n_sets + 1;
    }
    seq_new_set(g, s, set);
}

void gr_seq_range(g4_grammar *g, gr_seq *s, unsigned lo, unsigned hi) {
    uint64_t set[4] = {0};
    for (unsigned c = lo; c <= hi && c < 256; c++) set[c >> 6] |= 1ull << (c & 63);
    gr_seq_set(g, s, set);
}

void gr_seq_lit(g4_grammar *g, gr_seq *s, const char *text, size_t len) {
    for (size_t i = 0; i < len; i++) gr_seq_range(g, s, (unsigned char)text[i], (unsigned char)text[i]);
}

void gr_seq_ref(gr_seq *s, int r) { seq_put(s, ITEM(I_REF, (uint32_t)r)); }

void gr_seq_special(g4_grammar *g, gr_seq *s, const char *text) {
    int k = 0;
    while (k < g->n_specials && strcmp(g->specials[k], text)) k++;
    if (k == g->n_specials) {
        char **sp = realloc(g->specials, (size_t)(k + 1) * sizeof *sp);
        char *dup = sp ? strdup(text) : NULL;
        if (sp) g->specials = sp;
        if (!dup) {
            g->failed = 1;
            return;
        }
        g->specials[g->n_specials++] = dup;
    }
    seq_put(s, ITEM(I_SPECIAL, (uint32_t)k));
}

void gr_seq_cat(gr_seq *s, const gr_seq *t) {
    for (int i = 0; i < t->n; i++) seq_put(s, t->items[i]);
    if (t->failed) s->failed = 1;
}

/* ------------------------------------------------------------------ characters */

void gr_class_add(gr_class *c, uint32_t lo, uint32_t hi) {
    if (lo > hi || lo > 0x10ffff) return;
    if (hi > 0x10ffff) hi = 0x10ffff;
    if (grow((void **)&c->r, &c->cap, c->n + 1, sizeof *c->r)) {
        c->failed = 1;
        return;
    }
    c->r[c->n][0] = lo;
    c->r[c->n][1] = hi;
    c->n++;
}

int gr_class_has(const gr_class *c, uint32_t cp) {
    for (int i = 0; i < c->n; i++)
        if (cp >= c->r[i][0] && cp <= c->r[i][1]) return 1;
    return 0;
}

static int cmp_range(const void *a, const void *b) {
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

void gr_class_negate(gr_class *c) {
    if (c->n) qsort(c->r, (size_t)c->n, sizeof *c->r, cmp_range);
    gr_class out = {0};
    uint32_t next = 0; /* the first code point not yet covered */
    for (int i = 0; i < c->n; i++) {
        if (c->r[i][0] > next) gr_class_add(&out, next, c->r[i][0] - 1);
        if (c->r[i][1] + 1 > next) next = c->r[i][1] + 1;
    }
    gr_class_add(&out, next, 0x10ffff);
    out.failed |= c->failed;
    free(c->r);
    *c = out;
}

void gr_class_free(gr_class *c) {
    free(c->r);
    memset(c, 0, sizeof *c);
}

uint32_t gr_utf8_next(const char **p, const char *end) {
    const unsigned char *u = (const unsigned char *)*p;
    uint32_t cp = u[0];
    int n = cp < 0x80 ? 1 : cp < 0xe0 ? 2 : cp < 0xf0 ? 3 : 4;
    if (*p + n > end) n = 1;
    if (n > 1) cp &= 0x3f >> (n - 1);
    for (int i = 1; i < n; i++) cp = cp << 6 | (u[i] & 63);
    *p += n;
    return cp;
}

void gr_seq_cp(g4_grammar *g, gr_seq *s, uint32_t cp) {
    char u[4];
    int n = 0;
    if (cp < 0x80) u[n++] = (char)cp;
    else if (cp < 0x800) u[n++] = (char)(0xc0 | cp >> 6), u[n++] = (char)(0x80 | (cp & 63));
    else if (cp < 0x10000)
        u[n++] = (char)(0xe0 | cp >> 12), u[n++] = (char)(0x80 | (cp >> 6 & 63)), u[n++] = (char)(0x80 | (cp & 63));
    else
        u[n++] = (char)(0xf0 | cp >> 18), u[n++] = (char)(0x80 | (cp >> 12 & 63)),
        u[n++] = (char)(0x80 | (cp >> 6 & 63)), u[n++] = (char)(0x80 | (cp & 63));
    gr_seq_lit(g, s, u, (size_t)n);
}

/* The UTF-8 sequences of the code points [a, b], all of one length: `digits` 6-bit digits after a lead byte
 * that holds the top bits (lead: its marker bits); each alternative goes to rule r after prefix. */
static void utf8_range(g4_grammar *g, int r, gr_seq *prefix, uint32_t a, uint32_t b, int digits, unsigned lead) {
    const int m = 6 * digits;
    const uint32_t ha = a >> m, hb = b >> m, low = m ? (1u << m) - 1 : 0;
    const unsigned mark = lead ? lead : 0x80;
    const int n0 = prefix->n;
    if (!digits) {
        gr_seq_range(g, prefix, mark | ha, mark | hb);
        gr_alt(g, r, prefix);
        prefix->n = n0;
        return;
    }
    if (ha == hb) {
        gr_seq_range(g, prefix, mark | ha, mark | ha);
        utf8_range(g, r, prefix, a & low, b & low, digits - 1, 0);
        prefix->n = n0;
        return;
    }
    uint32_t lo = ha, hi = hb;
    if ((a & low) != 0) { /* the first lead's part */
        gr_seq_range(g, prefix, mark | ha, mark | ha);
        utf8_range(g, r, prefix, a & low, low, digits - 1, 0);
        prefix->n = n0;
        lo++;
    }
    const int last_part = (b & low) != low;
    if (last_part) hi--;
    if (lo <= hi) { /* whole blocks: any continuation bytes after */
        gr_seq_range(g, prefix, mark | lo, mark | hi);
        for (int k = 0; k < digits; k++) gr_seq_range(g, prefix, 0x80, 0xbf);
        gr_alt(g, r, prefix);
        prefix->n = n0;
    }
    if (last_part) {
        gr_seq_range(g, prefix, mark | hb, mark | hb);
        utf8_range(g, r, prefix, 0, b & low, digits - 1, 0);
        prefix->n = n0;
    }
}

void gr_alt_class(g4_grammar *g, int r, const gr_class *c) {
    static const struct {
        uint32_t lo, hi;
        int digits;
        unsigned lead;
    } lens[] = {{0, 0x7f, 0, 0}, {0x80, 0x7ff, 1, 0xc0}, {0x800, 0xd7ff, 2, 0xe0}, {0xe000, 0xffff, 2, 0xe0},
                {0x10000, 0x10ffff, 3, 0xf0}};
    gr_seq s;
    gr_seq_init(&s);
    uint64_t ascii[4] = {0};
    for (int i = 0; i < c->n; i++)
        for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
            const uint32_t lo = c->r[i][0] > lens[k].lo ? c->r[i][0] : lens[k].lo;
            const uint32_t hi = c->r[i][1] < lens[k].hi ? c->r[i][1] : lens[k].hi;
            if (lo > hi) continue;
            if (!lens[k].digits) { /* ASCII: one set for all of it */
                for (uint32_t b = lo; b <= hi; b++) ascii[b >> 6] |= 1ull << (b & 63);
                continue;
            }
            gr_seq_clear(&s);
            utf8_range(g, r, &s, lo, hi, lens[k].digits, lens[k].lead);
        }
    if (ascii[0] | ascii[1]) {
        gr_seq_clear(&s);
        gr_seq_set(g, &s, ascii);
        gr_alt(g, r, &s);
    }
    if (s.failed || c->failed) g->failed = 1;
    gr_seq_free(&s);
}

g4_grammar *gr_new(void) { return calloc(1, sizeof(g4_grammar)); }

int gr_rule(g4_grammar *g) {
    if (g->n_rules >= MAX_RULES) {
        g->failed = 2;
        return -1;
    }
    if (grow((void **)&g->rules, &g->cap_rules, g->n_rules + 1, sizeof *g->rules)) {
        g->failed = 1;
        return -1;
    }
    memset(&g->rules[g->n_rules], 0, sizeof g->rules[0]);
    return g->n_rules++;
}

void gr_alt(g4_grammar *g, int r, const gr_seq *s) {
    if (r < 0 || r >= g->n_rules || s->failed) {
        g->failed = 1;
        return;
    }
    if ((g->n_items += (size_t)s->n + 1) > MAX_ITEMS) {
        g->failed = 2;
        return;
    }
    rule_items *ri = &g->rules[r];
    if (grow((void **)&ri->v, &ri->cap, ri->n + s->n + 1, sizeof *ri->v)) {
        g->failed = 1;
        return;
    }
    if (s->n) memcpy(ri->v + ri->n, s->items, (size_t)s->n * sizeof *s->items);
    ri->n += s->n;
    ri->v[ri->n++] = ITEM(I_ALT_END, 0);
    ri->defined = 1;
}

int gr_rule_of(g4_grammar *g, const gr_seq *s) {
    int r = gr_rule(g);
    if (r >= 0) gr_alt(g, r, s);
    return r;
}

void gr_alt_opt(g4_grammar *g, int r, int a, int b) {
    gr_seq s;
    gr_seq_init(&s);
    gr_seq_ref(&s, a);
    gr_seq_ref(&s, b);
    gr_alt(g, r, &s);
    gr_seq_clear(&s);
    gr_alt(g, r, &s);
    gr_seq_free(&s);
}

int gr_repeat(g4_grammar *g, int x, int min, int max) {
    gr_seq s;
    gr_seq_init(&s);
    int tail = gr_rule(g); /* the part after the min required copies */
    if (max < 0) { /* tail ::= x tail | "" */
        gr_alt_opt(g, tail, x, tail);
    } else { /* opt_k ::= x opt_{k-1} | "" , opt_0 ::= "" */
        gr_alt(g, tail, &s);
        for (int k = 1; k <= max - min; k++) {
            const int r = gr_rule(g);
            gr_alt_opt(g, r, x, tail);
            tail = r;
        }
    }
    gr_seq_clear(&s);
    for (int k = 0; k < min; k++) gr_seq_ref(&s, x);
    gr_seq_ref(&s, tail);
    int r = gr_rule_of(g, &s);
    gr_seq_free(&s);
    return r;
}

/* Rules that can match nothing (a fixed point over the alternatives). */
static void find_nullable(const g4_grammar *g, uint8_t *nullable) {
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < g->n_rules; r++) {
            if (nullable[r]) continue;
            const rule_items *ri = &g->rules[r];
            int all = 1, empty_alt = 0; /* an alternative of nullable items alone */
            for (int i = 0; i < ri->n && !empty_alt; i++) {
                uint32_t e = ri->v[i];
                if (KIND(e) == I_ALT_END) {
                    empty_alt = all;
                    all = 1;
                } else if (KIND(e) != I_REF || !nullable[VAL(e)]) {
                    all = 0;
                }
            }
            if (empty_alt) nullable[r] = changed = 1;
        }
    }
}

/* Left recursion: a rule reachable from itself with nothing read (the refs at an alternative's start and after
 * nullable rules), found by a depth-first walk with a stack of its own (chains of rules can be long). color: 0 new,
 * 1 on the walk's path, 2 done. 1 when a cycle is found, -1 out of memory. */
static int left_cycle(const g4_grammar *g, const uint8_t *nullable, int root, uint8_t *color) {
    if (color[root]) return 0;
    typedef struct {
        int r, i, at_start;
    } frame;
    int cap = 64, n = 0;
    frame *st = malloc((size_t)cap * sizeof *st);
    if (!st) return -1;
    st[n++] = (frame){root, 0, 1};
    color[root] = 1;
    int found = 0;
    while (n && !found) {
        frame *f = &st[n - 1];
        const rule_items *ri = &g->rules[f->r];
        int next = -1;
        for (; f->i < ri->n && next < 0; f->i++) {
            const uint32_t e = ri->v[f->i];
            if (KIND(e) == I_ALT_END) {
                f->at_start = 1;
            } else if (f->at_start && KIND(e) == I_REF) {
                if (!nullable[VAL(e)]) f->at_start = 0;
                if (color[VAL(e)] == 1) found = 1;
                else if (!color[VAL(e)]) next = (int)VAL(e);
                if (found) break;
            } else {
                f->at_start = 0;
            }
        }
        if (found) break;
        if (next < 0) { /* every alternative walked */
            color[f->r] = 2;
            n--;
            continue;
        }
        if (n == cap) {
            frame *bigger = realloc(st, (size_t)(cap *= 2) * sizeof *st);
            if (!bigger) {
                free(st);
                return -1;
            }
            st = bigger;
        }
        color[next] = 1;
        st[n++] = (frame){next, 0, 1};
    }
    free(st);
    return found;
}

const char *gr_failed(const g4_grammar *g) {
    return g->failed == 2 ? "too large (over a million rules or 16 million items)" : g->failed ? "out of memory" : NULL;
}

int gr_finish(g4_grammar *g, int start, g4_error *err) {
    if (start < 0 || start >= g->n_rules) return g4_fail(err, "grammar: no start rule");
    /* think ::= <|channel> byte* <channel|> (Gemma 4's thinking, chat_output.c), tried before the start rule */
    gr_seq s;
    gr_seq_init(&s);
    gr_seq_range(g, &s, 0, 255);
    const int body = gr_repeat(g, gr_rule_of(g, &s), 0, -1), think = gr_rule(g);
    gr_seq_clear(&s);
    gr_seq_special(g, &s, "<|channel>");
    g->think_open = g->n_specials - 1;
    gr_seq_ref(&s, body);
    gr_seq_special(g, &s, "<channel|>");
    g->think_close = g->n_specials - 1;
    gr_alt(g, think, &s);
    gr_seq_free(&s);
    if (g->failed) return g4_fail(err, "grammar: %s", gr_failed(g));
    size_t total = 0;
    for (int r = 0; r < g->n_rules; r++) {
        if (!g->rules[r].defined) return g4_fail(err, "grammar: rule %d is used but never defined", r);
        for (int i = 0; i < g->rules[r].n; i++)
            if (KIND(g->rules[r].v[i]) == I_REF && VAL(g->rules[r].v[i]) >= (uint32_t)g->n_rules)
                return g4_fail(err, "grammar: rule %d refers to a rule that does not exist", r);
        total += (size_t)g->rules[r].n + 1;
    }
    total += 7; /* the roots: [think,] the start rule, the end of the alternative, the end of the rule */
    if (total >= (1u << 28)) return g4_fail(err, "grammar: too large");
    uint8_t *nullable = calloc((size_t)(unsigned)g->n_rules, 2);
    if (!nullable) return g4_fail(err, "grammar: out of memory");
    find_nullable(g, nullable);
    int cyc = 0;
    for (int r = 0; r < g->n_rules && !cyc; r++) cyc = left_cycle(g, nullable, r, nullable + g->n_rules);
    free(nullable);
    if (cyc < 0) return g4_fail(err, "grammar: out of memory");
    if (cyc) return g4_fail(err, "grammar: a rule is left-recursive");
    g->elems = malloc(total * sizeof *g->elems);
    g->rule_start = malloc((size_t)g->n_rules * sizeof *g->rule_start);
    if (!g->elems || !g->rule_start) return g4_fail(err, "grammar: out of memory");
    uint32_t at = 0;
    for (int r = 0; r < g->n_rules; r++) {
        g->rule_start[r] = at;
        memcpy(g->elems + at, g->rules[r].v, (size_t)g->rules[r].n * sizeof *g->elems);
        at += (uint32_t)g->rules[r].n;
        g->elems[at++] = ITEM(I_RULE_END, 0);
    }
    g->root = at;
    g->elems[at++] = ITEM(I_REF, (uint32_t)start);
    g->elems[at++] = ITEM(I_ALT_END, 0);
    g->elems[at++] = ITEM(I_RULE_END, 0);
    g->think_root = at;
    g->elems[at++] = ITEM(I_REF, (uint32_t)think);
    g->elems[at++] = ITEM(I_REF, (uint32_t)start);
    g->elems[at++] = ITEM(I_ALT_END, 0);
    g->elems[at++] = ITEM(I_RULE_END, 0);
    g->start = start;
    g->finished = 1;
    return 0;
}

G4_API void g4_grammar_free(g4_grammar *g) {
    if (!g) return;
    for (int r = 0; r < g->n_rules; r++) free(g->rules[r].v);
    free(g->rules);
    free(g->sets);
    for (int k = 0; k < g->n_specials; k++) free(g->specials[k]);
    free(g->specials);
    free(g->elems);
    free(g->rule_start);
    free(g);
}

/* ------------------------------------------------------------------ stack sets */

/* A set of stacks, flat: for each stack its length then its positions (top last); every top a terminal. */
typedef struct gr_state {
    uint32_t *w;
    int n, cap;  /* words */
    int count;   /* stacks */
    int failed;
} gr_state;

static void state_free(gr_state *s) { free(s->w); }

static void state_reset(gr_state *s) { s->n = s->count = 0; }

/* Adds stack stk[0..len) unless the set holds it. */
static void state_add(gr_state *s, const uint32_t *stk, int len) {
    for (int at = 0; at < s->n; at += (int)s->w[at] + 1)
        if ((int)s->w[at] == len && !memcmp(s->w + at + 1, stk, (size_t)len * sizeof *stk)) return;
    if (grow((void **)&s->w, &s->cap, s->n + len + 1, sizeof *s->w)) {
        s->failed = 1;
        return;
    }
    s->w[s->n] = (uint32_t)len;
    memcpy(s->w + s->n + 1, stk, (size_t)len * sizeof *stk);
    s->n += len + 1;
    s->count++;
}

/* Work space of expansions: stacks waiting to be expanded, last in first out. */
typedef struct gr_work {
    uint32_t *w;
    int n, cap;
    uint32_t top[MAX_STACK]; /* the stack being expanded */
} gr_work;

/* Adds to out every stack with a terminal (or nothing) on top that stk[0..len) stands for: a rule on top is
 * replaced by each of its alternatives. */
static void expand(const g4_grammar *g, gr_work *wk, const uint32_t *stk, int len, gr_state *out) {
    wk->n = 0;
    if (grow((void **)&wk->w, &wk->cap, len + 1, sizeof *wk->w)) {
        out->failed = 1;
        return;
    }
    memcpy(wk->w, stk, (size_t)len * sizeof *stk);
    wk->w[len] = (uint32_t)len;
    wk->n = len + 1;
    for (int visits = 0; wk->n > 0; visits++) {
        if (visits == MAX_EXPANSION) return;
        const int n = (int)wk->w[wk->n - 1];
        wk->n -= n + 1;
        memcpy(wk->top, wk->w + wk->n, (size_t)n * sizeof *wk->top);
        if (n == 0 || KIND(g->elems[wk->top[n - 1]]) != I_REF) {
            state_add(out, wk->top, n);
            continue;
        }
        const uint32_t pos = wk->top[n - 1];
        int base = n - 1; /* the rule's position gives way to what follows it */
        if (KIND(g->elems[pos + 1]) != I_ALT_END) wk->top[base++] = pos + 1;
        uint32_t a = g->rule_start[VAL(g->elems[pos])];
        while (KIND(g->elems[a]) != I_RULE_END) {
            const int first = KIND(g->elems[a]) != I_ALT_END;
            const int m = base + first;
            if (m <= MAX_STACK &&
                !grow((void **)&wk->w, &wk->cap, wk->n + m + 1, sizeof *wk->w)) {
                memcpy(wk->w + wk->n, wk->top, (size_t)base * sizeof *wk->top);
                if (first) wk->w[wk->n + base] = a;
                wk->w[wk->n + m] = (uint32_t)m;
                wk->n += m + 1;
            }
            while (KIND(g->elems[a]) != I_ALT_END) a++;
            a++;
        }
    }
}

/* The stacks of in after reading symbol c: a byte (0..255) or special token k as 256 + k. */
static void state_read(const g4_grammar *g, gr_work *wk, const gr_state *in, unsigned c, gr_state *out) {
    state_reset(out);
    for (int at = 0; at < in->n; at += (int)in->w[at] + 1) {
        const int len = (int)in->w[at];
        if (!len) continue;
        const uint32_t *stk = in->w + at + 1;
        const uint32_t pos = stk[len - 1], e = g->elems[pos];
        const int hit = c < 256 ? KIND(e) == I_SET && (g->sets[VAL(e)][c >> 6] >> (c & 63) & 1)
                                : KIND(e) == I_SPECIAL && VAL(e) == c - 256;
        if (!hit) continue;
        uint32_t next[MAX_STACK];
        memcpy(next, stk, (size_t)len * sizeof *stk);
        int n = len - 1;
        if (KIND(g->elems[pos + 1]) != I_ALT_END) next[n++] = pos + 1;
        expand(g, wk, next, n, out);
    }
}

static int state_copy(gr_state *dst, const gr_state *src) {
    if (grow((void **)&dst->w, &dst->cap, src->n, sizeof *dst->w)) return -1;
    memcpy(dst->w, src->w, (size_t)src->n * sizeof *src->w);
    dst->n = src->n;
    dst->count = src->count;
    dst->failed = 0;
    return 0;
}

static int state_has_empty(const gr_state *s) {
    for (int at = 0; at < s->n; at += (int)s->w[at] + 1)
        if (!s->w[at]) return 1;
    return 0;
}

static int cmp_stack(const uint32_t *x, const uint32_t *y) {
    if (x[0] != y[0]) return x[0] < y[0] ? -1 : 1;
    for (uint32_t i = 1; i <= x[0]; i++)
        if (x[i] != y[i]) return x[i] < y[i] ? -1 : 1;
    return 0;
}

/* The set in one order whatever the path to it (masks are kept by state); sets are small: insertion sort. */
static int state_canonical(gr_state *s, gr_state *tmp) {
    int stack_idx[64], *idx = s->count <= 64 ? stack_idx : malloc((size_t)s->count * sizeof *idx);
    if (!idx) return -1;
    int k = 0;
    for (int at = 0; at < s->n; at += (int)s->w[at] + 1) {
        int j = k++;
        while (j > 0 && cmp_stack(s->w + idx[j - 1], s->w + at) > 0) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = at;
    }
    state_reset(tmp);
    for (int i = 0; i < k; i++) state_add(tmp, s->w + idx[i] + 1, (int)s->w[idx[i]]);
    if (idx != stack_idx) free(idx);
    if (tmp->failed) return -1;
    return state_copy(s, tmp);
}

/* ------------------------------------------------------------------ tokens */

struct g4_gr_tokens {
    int V;
    int n;          /* tokens with text (special tokens and empty ones are left out) */
    int32_t *order; /* [n] ids by their bytes (memcmp order) */
    uint16_t *lcp;  /* [n] bytes order[i] shares with order[i - 1] */
    uint32_t *off;  /* [V + 1] into bytes */
    char *bytes;
    int max_len;
};

void g4_gr_tokens_free(g4_gr_tokens *t) {
    if (!t) return;
    free(t->order);
    free(t->lcp);
    free(t->off);
    free(t->bytes);
    free(t);
}

typedef struct tok_key {
    const char *p;
    uint32_t len;
    int32_t id;
} tok_key;

static int cmp_token(const void *a, const void *b) {
    const tok_key *x = a, *y = b;
    int c = memcmp(x->p, y->p, x->len < y->len ? x->len : y->len);
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

int g4_gr_tokens_new(const g4_tokenizer *tok, int vocab_size, g4_gr_tokens **out, g4_error *err) {
    *out = NULL;
    g4_gr_tokens *t = calloc(1, sizeof *t);
    size_t cap = (size_t)vocab_size * 8 + 64, len = 0;
    if (!t || !(t->off = malloc(((size_t)vocab_size + 1) * sizeof *t->off)) || !(t->bytes = malloc(cap)) ||
        !(t->order = malloc((size_t)vocab_size * sizeof *t->order)) ||
        !(t->lcp = malloc((size_t)vocab_size * sizeof *t->lcp))) {
        g4_gr_tokens_free(t);
        return g4_fail(err, "out of memory");
    }
    t->V = vocab_size;
    char buf[1024];
    for (int id = 0; id < vocab_size; id++) {
        t->off[id] = (uint32_t)len;
        int n = g4_tokenizer_is_special(tok, id) ? -1 : g4_tokenizer_token_bytes(tok, id, buf, sizeof buf);
        if (n <= 0) continue; /* special tokens and tokens without text are never drawn as text */
        if (n > 65535) n = 65535;
        if (len + (size_t)n > cap) {
            char *b = realloc(t->bytes, cap *= 2);
            if (!b) {
                g4_gr_tokens_free(t);
                return g4_fail(err, "out of memory");
            }
            t->bytes = b;
        }
        memcpy(t->bytes + len, buf, (size_t)n);
        len += (size_t)n;
        t->order[t->n++] = id;
        if (n > t->max_len) t->max_len = n;
    }
    t->off[vocab_size] = (uint32_t)len;
    tok_key *keys = malloc(((size_t)t->n + 1) * sizeof *keys);
    if (!keys) {
        g4_gr_tokens_free(t);
        return g4_fail(err, "out of memory");
    }
    for (int i = 0; i < t->n; i++) {
        const int32_t id = t->order[i];
        keys[i] = (tok_key){t->bytes + t->off[id], t->off[id + 1] - t->off[id], id};
    }
    qsort(keys, (size_t)t->n, sizeof *keys, cmp_token);
    for (int i = 0; i < t->n; i++) t->order[i] = keys[i].id;
    free(keys);
    for (int i = 0; i < t->n; i++) {
        uint32_t l = 0;
        if (i) {
            const int32_t a = t->order[i - 1], b = t->order[i];
            const uint32_t la = t->off[a + 1] - t->off[a], lb = t->off[b + 1] - t->off[b];
            while (l < la && l < lb && t->bytes[t->off[a] + l] == t->bytes[t->off[b] + l]) l++;
        }
        t->lcp[i] = (uint16_t)l;
    }
    *out = t;
    return 0;
}

/* ------------------------------------------------------------------ matching */

#define GR_MASKS 32 /* masks kept by state, least recently used out */
#define GR_STATES 4096 /* sets a match interns for its mask walks (then it starts over) */

/* The sets the mask walks meet, interned, with their transitions by byte: a walk reads a million bytes of tokens
 * but meets few sets (a string's characters lead back to the set they left), so most of its steps are a lookup. */
typedef struct gr_states {
    uint32_t *words;      /* the sets' words, one after another */
    size_t n_words, cap_words;
    size_t *off;          /* [n + 1] where each set starts in words */
    int32_t (**next)[256]; /* [n] each set's transitions: a set, GR_UNKNOWN or GR_DEAD */
    int n, cap;
    int *slot;            /* [GR_STATES * 2] open addressing: 1 + a set, 0 empty */
} gr_states;
enum { GR_UNKNOWN = -1, GR_DEAD = -2 };

struct g4_gr_match {
    const g4_grammar *g;
    const g4_gr_tokens *t;
    int32_t *special_ids; /* [n_specials] */
    int32_t *end_ids;
    int n_end;
    gr_state cur, next, tmp;
    gr_state *level; /* [max_len + 1]: the sets after each byte of the token being read */
    gr_work wk;
    size_t words;    /* 64-bit words of a mask */
    uint64_t *bits;  /* [GR_MASKS][words] */
    gr_state key[GR_MASKS];
    uint64_t used[GR_MASKS], clock;
    gr_states st;
    int32_t *lv;     /* [max_len + 1] the interned sets after each byte of the token being read */
};

void g4_gr_match_free(g4_gr_match *m) {
    if (!m) return;
    free(m->special_ids);
    free(m->end_ids);
    state_free(&m->cur);
    state_free(&m->next);
    state_free(&m->tmp);
    if (m->level)
        for (int i = 0; i <= m->t->max_len; i++) state_free(&m->level[i]);
    free(m->level);
    free(m->wk.w);
    free(m->bits);
    for (int i = 0; i < GR_MASKS; i++) state_free(&m->key[i]);
    for (int i = 0; i < m->st.n; i++) free(m->st.next[i]);
    free(m->st.next);
    free(m->st.words);
    free(m->st.off);
    free(m->st.slot);
    free(m->lv);
    free(m);
}

int g4_gr_match_new(const g4_grammar *g, const g4_gr_tokens *t, const g4_tokenizer *tok, const int32_t *end_ids,
                    int n_end_ids, int thinking, g4_gr_match **out, g4_error *err) {
    *out = NULL;
    if (!g->finished) return g4_fail(err, "grammar: not finished");
    g4_gr_match *m = calloc(1, sizeof *m);
    if (!m) return g4_fail(err, "out of memory");
    m->g = g;
    m->t = t;
    m->words = ((size_t)t->V + 63) / 64;
    m->special_ids = malloc((size_t)(g->n_specials + 1) * sizeof *m->special_ids);
    m->end_ids = malloc((size_t)(n_end_ids + 1) * sizeof *m->end_ids);
    m->level = calloc((size_t)t->max_len + 1, sizeof *m->level);
    m->lv = malloc(((size_t)t->max_len + 1) * sizeof *m->lv);
    m->bits = malloc(GR_MASKS * m->words * sizeof *m->bits);
    m->st.slot = calloc(2 * GR_STATES, sizeof *m->st.slot);
    m->st.off = malloc((GR_STATES + 1) * sizeof *m->st.off);
    m->st.next = calloc(GR_STATES, sizeof *m->st.next);
    if (!m->special_ids || !m->end_ids || !m->level || !m->lv || !m->bits || !m->st.slot || !m->st.off || !m->st.next) {
        g4_gr_match_free(m);
        return g4_fail(err, "out of memory");
    }
    for (int k = 0; k < g->n_specials; k++) {
        m->special_ids[k] = tok ? g4_tokenizer_token_id(tok, g->specials[k]) : -1;
        if (m->special_ids[k] < 0 || m->special_ids[k] >= t->V || !g4_tokenizer_is_special(tok, m->special_ids[k])) {
            m->special_ids[k] = -1;
            if (k == g->think_open || k == g->think_close) { /* no thinking channel in this vocabulary */
                thinking = 0;
                continue;
            }
            int rc = g4_fail(err, "grammar: the model's tokenizer has no special token %s", g->specials[k]);
            g4_gr_match_free(m);
            return rc;
        }
    }
    for (int i = 0; i < n_end_ids; i++)
        if (end_ids[i] >= 0 && end_ids[i] < t->V) m->end_ids[m->n_end++] = end_ids[i];
    expand(g, &m->wk, &g->root, 1, &m->cur);
    if (thinking) expand(g, &m->wk, &g->think_root, 1, &m->cur);
    if (m->cur.failed || state_canonical(&m->cur, &m->tmp)) {
        g4_gr_match_free(m);
        return g4_fail(err, "out of memory");
    }
    *out = m;
    return 0;
}

int g4_gr_match_done(const g4_gr_match *m) { return m->cur.count == 1 && m->cur.w[0] == 0; }

int g4_gr_match_accepting(const g4_gr_match *m) { return state_has_empty(&m->cur); }

static int is_end_id(const g4_gr_match *m, int32_t id) {
    for (int i = 0; i < m->n_end; i++)
        if (m->end_ids[i] == id) return 1;
    return 0;
}

/* Reads symbols into m->next from m->cur; 0 when every one keeps the set non-empty. */
static int read_symbols(g4_gr_match *m, const unsigned char *b, size_t n, int special) {
    if (state_copy(&m->next, &m->cur)) return -1;
    for (size_t i = 0; i < (special ? 1 : n); i++) {
        state_read(m->g, &m->wk, &m->next, special ? 256u + (unsigned)special - 1 : b[i], &m->tmp);
        if (m->tmp.failed || !m->tmp.count) return -1;
        gr_state x = m->next;
        m->next = m->tmp;
        m->tmp = x;
    }
    return 0;
}

static int commit(g4_gr_match *m) {
    gr_state x = m->cur;
    m->cur = m->next;
    m->next = x;
    return state_canonical(&m->cur, &m->tmp);
}

int g4_gr_match_try(g4_gr_match *m, const char *bytes, size_t n) {
    return read_symbols(m, (const unsigned char *)bytes, n, 0) ? 0 : 1;
}

int g4_gr_match_feed(g4_gr_match *m, const char *bytes, size_t n) {
    if (read_symbols(m, (const unsigned char *)bytes, n, 0)) return -1;
    return commit(m);
}

int g4_gr_match_accept(g4_gr_match *m, int32_t id) {
    const g4_gr_tokens *t = m->t;
    if (id < 0 || id >= t->V) return -1;
    for (int k = 0; k < m->g->n_specials && id >= 0; k++)
        if (m->special_ids[k] == id) {
            if (read_symbols(m, NULL, 1, k + 1) == 0) return commit(m);
            break;
        }
    if (is_end_id(m, id)) return g4_gr_match_accepting(m) ? 0 : -1;
    if (t->off[id] == t->off[id + 1]) return -1;
    return g4_gr_match_feed(m, t->bytes + t->off[id], t->off[id + 1] - t->off[id]);
}

static int same_state(const gr_state *a, const gr_state *b) {
    return a->n == b->n && !memcmp(a->w, b->w, (size_t)a->n * sizeof *a->w);
}

static uint64_t hash_words(const uint32_t *w, int n) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++) h = (h ^ w[i]) * 1099511628211ull;
    return h;
}

static void states_clear(gr_states *st) {
    for (int i = 0; i < st->n; i++) free(st->next[i]);
    st->n = 0;
    st->n_words = 0;
    memset(st->slot, 0, 2 * GR_STATES * sizeof *st->slot);
}

/* The interned id of canonical set s (added when new); -1 when the table is full or memory is out. */
static int states_id(gr_states *st, const gr_state *s) {
    const uint64_t h = hash_words(s->w, s->n);
    size_t k = (size_t)(h % (2 * GR_STATES));
    for (;; k = (k + 1) % (2 * GR_STATES)) {
        const int id = st->slot[k] - 1;
        if (id < 0) break;
        const size_t n = st->off[id + 1] - st->off[id];
        if (n == (size_t)s->n && !memcmp(st->words + st->off[id], s->w, n * sizeof *s->w)) return id;
    }
    if (st->n == GR_STATES) return -1;
    if (st->n_words + (size_t)s->n > st->cap_words) {
        size_t cap = st->cap_words ? st->cap_words * 2 : 4096;
        while (cap < st->n_words + (size_t)s->n) cap *= 2;
        uint32_t *w = realloc(st->words, cap * sizeof *w);
        if (!w) return -1;
        st->words = w;
        st->cap_words = cap;
    }
    if (!(st->next[st->n] = malloc(sizeof *st->next[st->n]))) return -1;
    for (int b = 0; b < 256; b++) (*st->next[st->n])[b] = GR_UNKNOWN;
    st->off[st->n] = st->n_words;
    memcpy(st->words + st->n_words, s->w, (size_t)s->n * sizeof *s->w);
    st->n_words += (size_t)s->n;
    st->off[st->n + 1] = st->n_words;
    st->slot[k] = st->n + 1;
    return st->n++;
}

/* The set after reading byte b in interned set id: GR_DEAD, a set, or -1 when the table is full. */
static int32_t states_next(g4_gr_match *m, int32_t id, unsigned b) {
    gr_states *st = &m->st;
    int32_t nx = (*st->next[id])[b];
    if (nx != GR_UNKNOWN) return nx;
    gr_state from = {st->words + st->off[id], (int)(st->off[id + 1] - st->off[id]), 0, 0, 0};
    for (int at = 0; at < from.n; at += (int)from.w[at] + 1) from.count++;
    state_read(m->g, &m->wk, &from, b, &m->next);
    if (m->next.failed) return -1;
    if (!m->next.count) {
        nx = GR_DEAD;
    } else {
        if (state_canonical(&m->next, &m->tmp)) return -1;
        nx = states_id(st, &m->next); /* (st->words may move: from is not read again) */
        if (nx < 0) return -1;
    }
    (*st->next[id])[b] = nx;
    return nx;
}

/* One byte of the walk: level d to d + 1. 1, 0 when the byte is refused, -1 when the interned table is full. */
typedef int (*walk_step)(g4_gr_match *m, int d, unsigned b);

static int step_interned(g4_gr_match *m, int d, unsigned b) {
    const int32_t nx = states_next(m, m->lv[d], b);
    if (nx == -1 || nx == GR_DEAD) return nx == -1 ? -1 : 0;
    m->lv[d + 1] = nx;
    return 1;
}

static int step_sets(g4_gr_match *m, int d, unsigned b) {
    state_read(m->g, &m->wk, &m->level[d], b, &m->level[d + 1]);
    return m->level[d + 1].count > 0;
}

/* The walk over the tokens in byte order from level 0 (m->cur): a prefix shared by tokens is read once, and a
 * refused prefix refuses every token that starts with it. -1 when a step says so. */
static int walk(g4_gr_match *m, uint64_t *bits, walk_step step) {
    const g4_gr_tokens *t = m->t;
    int valid = 0; /* levels 0..valid belong to the prefix being read */
    int dead = -1; /* the last token failed at this byte: the ones sharing its bytes up to there fail too */
    for (int i = 0; i < t->n; i++) {
        const int32_t id = t->order[i];
        const int l = t->lcp[i];
        if (dead >= 0 && l > dead) continue;
        dead = -1;
        if (valid > l) valid = l;
        const unsigned char *b = (const unsigned char *)t->bytes + t->off[id];
        const int len = (int)(t->off[id + 1] - t->off[id]);
        int d = valid, r = 1;
        for (; d < len && (r = step(m, d, b[d])) == 1; d++) {}
        if (r < 0) return -1;
        if (d < len) {
            dead = valid = d;
            continue;
        }
        valid = len;
        bits[id >> 6] |= 1ull << (id & 63);
    }
    return 0;
}

static void walk_sets(g4_gr_match *m, uint64_t *bits) {
    state_copy(&m->level[0], &m->cur);
    walk(m, bits, step_sets);
}

/* Bit id of bits: the token may come next in state m->cur. */
static void compute_mask(g4_gr_match *m, uint64_t *bits) {
    memset(bits, 0, m->words * sizeof *bits);
    if (m->st.n > GR_STATES / 2) states_clear(&m->st); /* room for this walk */
    if ((m->lv[0] = states_id(&m->st, &m->cur)) < 0 || walk(m, bits, step_interned)) {
        states_clear(&m->st);
        memset(bits, 0, m->words * sizeof *bits);
        walk_sets(m, bits);
    }
    for (int at = 0; at < m->cur.n; at += (int)m->cur.w[at] + 1) {
        const int len = (int)m->cur.w[at];
        if (!len) continue;
        const uint32_t e = m->g->elems[m->cur.w[at + len]];
        const int32_t id = KIND(e) == I_SPECIAL ? m->special_ids[VAL(e)] : -1;
        if (id >= 0) bits[id >> 6] |= 1ull << (id & 63);
    }
    if (g4_gr_match_accepting(m))
        for (int i = 0; i < m->n_end; i++) bits[m->end_ids[i] >> 6] |= 1ull << (m->end_ids[i] & 63);
}

void g4_gr_match_mask(g4_gr_match *m, float *logits) {
    int slot = -1, oldest = 0;
    for (int i = 0; i < GR_MASKS && slot < 0; i++) {
        if (m->used[i] && same_state(&m->key[i], &m->cur)) slot = i;
        if (m->used[i] < m->used[oldest]) oldest = i;
    }
    uint64_t *bits;
    if (slot < 0) {
        slot = oldest;
        bits = m->bits + (size_t)slot * m->words;
        compute_mask(m, bits);
        if (state_copy(&m->key[slot], &m->cur)) {
            m->used[slot] = 0; /* out of memory: the mask is used once, not kept */
            for (int id = 0; id < m->t->V; id++)
                if (!(bits[id >> 6] >> (id & 63) & 1)) logits[id] = -INFINITY;
            return;
        }
    }
    bits = m->bits + (size_t)slot * m->words;
    m->used[slot] = ++m->clock;
    for (int id = 0; id < m->t->V; id++)
        if (!(bits[id >> 6] >> (id & 63) & 1)) logits[id] = -INFINITY;
}

void g4_gr_match_mask_sets(g4_gr_match *m, float *logits) {
    uint64_t *bits = calloc(m->words, sizeof *bits);
    if (!bits) return;
    walk_sets(m, bits);
    for (int id = 0; id < m->t->V; id++)
        if (!(bits[id >> 6] >> (id & 63) & 1)) logits[id] = -INFINITY;
    free(bits);
}
