/* Constrained decoding to one JSON object (json_object.h; the grammar is RFC 8259 section 2-7). */
#include "engine/json_object.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

enum {
    J_START,     /* nothing yet: only '{' */
    J_VALUE,     /* a value comes (after ':' or ',' in an array) */
    J_OBJ_FIRST, /* after '{': a key or '}' */
    J_KEY,       /* after ',' in an object: a key */
    J_COLON,     /* after a key */
    J_AFTER,     /* after a value inside a container: ',' or the container's end */
    J_ARR_FIRST, /* after '[': a value or ']' */
    J_STRING,
    J_ESCAPE,    /* after '\' */
    J_HEX,       /* in \uXXXX, sub hex digits read */
    J_NUMBER,    /* sub: N_* below */
    J_LITERAL,   /* lit, sub characters matched */
    J_DONE,
};
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP }; /* a number can end after ZERO, INT, FRAC, EXP */

#define MAX_DEPTH 64
#define MAX_WS 20 /* blanks in a row between tokens of the grammar (llama.cpp's JSON grammar allows about as many) */
static const char *const literals[3] = {"true", "false", "null"};

void g4_json_start(g4_json_state *s) { memset(s, 0, sizeof *s); }

int g4_json_done(const g4_json_state *s) { return s->mode == J_DONE; }

static int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Whitespace between tokens of the grammar, at most MAX_WS in a row (a model cannot loop on blanks). */
static int blank(g4_json_state *s) { return ++s->ws > MAX_WS ? -1 : 0; }

static int push(g4_json_state *s, int array) {
    if (s->depth == MAX_DEPTH) return -1;
    s->arrays = array ? s->arrays | (1ull << s->depth) : s->arrays & ~(1ull << s->depth);
    s->depth++;
    s->mode = array ? J_ARR_FIRST : J_OBJ_FIRST;
    return 0;
}

static int top_is_array(const g4_json_state *s) { return (s->arrays >> (s->depth - 1)) & 1; }

/* A value ended: the container goes on, or the object is whole. */
static void value_done(g4_json_state *s) { s->mode = s->depth ? J_AFTER : J_DONE; }

static int start_value(g4_json_state *s, unsigned char c) {
    switch (c) {
    case '{': return push(s, 0);
    case '[': return push(s, 1);
    case '"': s->mode = J_STRING, s->key = 0; return 0;
    case '-': s->mode = J_NUMBER, s->sub = N_MINUS; return 0;
    case '0': s->mode = J_NUMBER, s->sub = N_ZERO; return 0;
    case 't': case 'f': case 'n':
        s->mode = J_LITERAL, s->lit = c == 't' ? 0 : c == 'f' ? 1 : 2, s->sub = 1;
        return 0;
    default:
        if (c >= '1' && c <= '9') {
            s->mode = J_NUMBER, s->sub = N_INT;
            return 0;
        }
        return -1;
    }
}

static int byte(g4_json_state *s, unsigned char c) {
    if (!is_ws(c)) s->ws = 0;
    switch (s->mode) {
    case J_START: return c == '{' ? push(s, 0) : -1;
    case J_VALUE: return is_ws(c) ? blank(s) : start_value(s, c);
    case J_ARR_FIRST:
        if (is_ws(c)) return blank(s);
        if (c == ']') {
            s->depth--;
            value_done(s);
            return 0;
        }
        return start_value(s, c);
    case J_OBJ_FIRST:
    case J_KEY:
        if (is_ws(c)) return blank(s);
        if (c == '"') {
            s->mode = J_STRING, s->key = 1;
            return 0;
        }
        if (c == '}' && s->mode == J_OBJ_FIRST) {
            s->depth--;
            value_done(s);
            return 0;
        }
        return -1;
    case J_COLON:
        if (is_ws(c)) return blank(s);
        return c == ':' ? (s->mode = J_VALUE, 0) : -1;
    case J_AFTER:
        if (is_ws(c)) return blank(s);
        if (c == ',') {
            s->mode = top_is_array(s) ? J_VALUE : J_KEY;
            return 0;
        }
        if (c == (top_is_array(s) ? ']' : '}')) {
            s->depth--;
            value_done(s);
            return 0;
        }
        return -1;
    case J_STRING:
        if (c == '"') {
            if (s->key) s->mode = J_COLON;
            else value_done(s);
            return 0;
        }
        if (c == '\\') s->mode = J_ESCAPE;
        return c < 0x20 ? -1 : 0;
    case J_ESCAPE:
        if (c == 'u') {
            s->mode = J_HEX, s->sub = 0;
            return 0;
        }
        if (!strchr("\"\\/bfnrt", c) || !c) return -1;
        s->mode = J_STRING;
        return 0;
    case J_HEX:
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return -1;
        if (++s->sub == 4) s->mode = J_STRING;
        return 0;
    case J_NUMBER: {
        const int digit = c >= '0' && c <= '9';
        switch (s->sub) {
        case N_MINUS: return digit ? (s->sub = c == '0' ? N_ZERO : N_INT, 0) : -1;
        case N_ZERO:
        case N_INT:
            if (digit && s->sub == N_INT) return 0;
            if (c == '.') return s->sub = N_DOT, 0;
            if (c == 'e' || c == 'E') return s->sub = N_E, 0;
            break;
        case N_DOT: return digit ? (s->sub = N_FRAC, 0) : -1;
        case N_FRAC:
            if (digit) return 0;
            if (c == 'e' || c == 'E') return s->sub = N_E, 0;
            break;
        case N_E:
            if (c == '+' || c == '-') return s->sub = N_ESIGN, 0;
            return digit ? (s->sub = N_EXP, 0) : -1;
        case N_ESIGN: return digit ? (s->sub = N_EXP, 0) : -1;
        case N_EXP:
            if (digit) return 0;
            break;
        }
        value_done(s); /* the number ended at c, which belongs to what follows */
        return s->mode == J_DONE ? -1 : byte(s, c);
    }
    case J_LITERAL:
        if (c != (unsigned char)literals[s->lit][s->sub]) return -1;
        if (!literals[s->lit][++s->sub]) value_done(s);
        return 0;
    default: return -1; /* J_DONE: nothing more */
    }
}

int g4_json_feed(g4_json_state *s, const char *bytes, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (byte(s, (unsigned char)bytes[i])) return -1;
    return 0;
}

/* ------------------------------------------------------------------ tokens */

/* The masks of the last JSON_MASKS states are kept as bits (a step's mask depends on the automaton's state
 * alone, and a generation meets few states: inside a string, one for every token): a step in a cached state
 * reads V bits instead of feeding every token's bytes to the automaton. */
#define JSON_MASKS 16

struct g4_json_tokens {
    int V;
    uint32_t *off; /* [V + 1] into bytes; a token without text (special, empty) has off[id] == off[id + 1] */
    char *bytes;
    size_t words;                 /* 64-bit words of a mask */
    uint64_t *bits;               /* [JSON_MASKS][words]: bit id set where the token may come */
    g4_json_state state[JSON_MASKS];
    uint64_t used[JSON_MASKS];    /* when each mask was last used (0: empty) */
    uint64_t clock;
    pthread_mutex_t mu;           /* the masks (generations on several threads share a table) */
};

void g4_json_tokens_free(g4_json_tokens *t) {
    if (!t) return;
    free(t->off);
    free(t->bytes);
    free(t->bits);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

static int same_state(const g4_json_state *a, const g4_json_state *b) {
    return a->arrays == b->arrays && a->depth == b->depth && a->mode == b->mode && a->sub == b->sub &&
           a->key == b->key && a->lit == b->lit && a->ws == b->ws;
}

int g4_json_tokens_new(const g4_tokenizer *tok, int vocab_size, g4_json_tokens **out, g4_error *err) {
    *out = NULL;
    g4_json_tokens *t = calloc(1, sizeof *t);
    size_t cap = (size_t)vocab_size * 8, len = 0;
    if (t) pthread_mutex_init(&t->mu, NULL);
    if (!t || !(t->off = malloc(((size_t)vocab_size + 1) * sizeof *t->off)) || !(t->bytes = malloc(cap))) {
        g4_json_tokens_free(t);
        return g4_fail(err, "out of memory");
    }
    t->V = vocab_size;
    t->words = ((size_t)vocab_size + 63) / 64;
    if (!(t->bits = malloc(JSON_MASKS * t->words * sizeof *t->bits))) {
        g4_json_tokens_free(t);
        return g4_fail(err, "out of memory");
    }
    char buf[1024];
    for (int id = 0; id < vocab_size; id++) {
        t->off[id] = (uint32_t)len;
        int n = g4_tokenizer_is_special(tok, id) ? -1 : g4_tokenizer_token_bytes(tok, id, buf, sizeof buf);
        if (n <= 0) continue; /* special tokens and tokens without text are never drawn */
        if (len + (size_t)n > cap) {
            char *b = realloc(t->bytes, cap *= 2);
            if (!b) {
                g4_json_tokens_free(t);
                return g4_fail(err, "out of memory");
            }
            t->bytes = b;
        }
        memcpy(t->bytes + len, buf, (size_t)n);
        len += (size_t)n;
    }
    t->off[vocab_size] = (uint32_t)len;
    *out = t;
    return 0;
}

void g4_json_mask(g4_json_tokens *t, const g4_json_state *s, float *logits) {
    pthread_mutex_lock(&t->mu);
    int slot = -1, oldest = 0;
    for (int i = 0; i < JSON_MASKS && slot < 0; i++) {
        if (t->used[i] && same_state(&t->state[i], s)) slot = i;
        if (t->used[i] < t->used[oldest]) oldest = i;
    }
    if (slot < 0) { /* the least recently used mask gives way to this state's */
        slot = oldest;
        uint64_t *bits = t->bits + (size_t)slot * t->words;
        memset(bits, 0, t->words * sizeof *bits);
        for (int id = 0; id < t->V; id++) {
            const uint32_t a = t->off[id], b = t->off[id + 1];
            g4_json_state probe = *s;
            if (a != b && g4_json_feed(&probe, t->bytes + a, b - a) == 0) bits[id >> 6] |= 1ull << (id & 63);
        }
        t->state[slot] = *s;
    }
    t->used[slot] = ++t->clock;
    const uint64_t *bits = t->bits + (size_t)slot * t->words;
    for (int id = 0; id < t->V; id++)
        if (!(bits[id >> 6] >> (id & 63) & 1)) logits[id] = -INFINITY;
    pthread_mutex_unlock(&t->mu);
}

int g4_json_accept(const g4_json_tokens *t, g4_json_state *s, int32_t id) {
    if (id < 0 || id >= t->V || t->off[id] == t->off[id + 1]) return -1;
    return g4_json_feed(s, t->bytes + t->off[id], t->off[id + 1] - t->off[id]);
}
