/* Constrained decoding: the output follows a context-free grammar (the public g4_grammar of gemma4c.h).
 *
 * A grammar is a list of rules; a rule is alternatives, an alternative a sequence of items: a byte from a set,
 * a special token named by its text (`<|tool_call>`: a terminal of its own, as the model emits it), or another
 * rule. Rules may be recursive but not left-recursive (the compilers of json_schema.c write none). Grammars are
 * made by json_schema.c (JSON Schema, OpenAI's tool calls in Gemma 4's notation) through the builder below.
 *
 * Matching follows llama.cpp's grammar engine in shape (llama-grammar.cpp: a set of stacks of positions, each
 * stack's top a terminal): the state after a prefix of output is the set of stacks, which reads the next byte
 * or special token into the next set (an empty set: the prefix is impossible). A stack that is empty means the
 * grammar has read a whole sentence: the generation may end there (its stop ids are allowed), and where nothing
 * else can follow it ends (g4_gr_match_done).
 *
 * The mask of a step (every token whose bytes cannot come next gets -infinity) walks the model's tokens in byte
 * order (g4_gr_tokens, made once a model), so a prefix shared by tokens is read once and a refused prefix
 * refuses all the tokens that start with it; masks are kept by state (a string's characters, say, leave the same
 * state behind), so a step in a state met before reads a bitmap. */
#ifndef G4_ENGINE_GRAMMAR_H
#define G4_ENGINE_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "gemma4c.h"

/* ------------------------------------------------------------------ building */

/* One alternative under construction: items appended in order (gr_seq_*), then added to a rule. */
typedef struct gr_seq {
    uint32_t *items; /* encoded items (grammar.c) */
    int n, cap;
    int failed;      /* out of memory: the grammar's build fails */
} gr_seq;

void gr_seq_init(gr_seq *s);
void gr_seq_free(gr_seq *s);
void gr_seq_clear(gr_seq *s);
/* Appends the bytes of text as themselves. */
void gr_seq_lit(g4_grammar *g, gr_seq *s, const char *text, size_t len);
/* Appends one byte out of a set of 256 bits (bit b of set[b / 64]). */
void gr_seq_set(g4_grammar *g, gr_seq *s, const uint64_t set[4]);
/* Appends a byte in [lo, hi] (inclusive). */
void gr_seq_range(g4_grammar *g, gr_seq *s, unsigned lo, unsigned hi);
/* Appends rule r. */
void gr_seq_ref(gr_seq *s, int r);
/* Appends the special token whose text is text (resolved against the tokenizer when a generation starts). */
void gr_seq_special(g4_grammar *g, gr_seq *s, const char *text);
/* Appends the items of another sequence. */
void gr_seq_cat(gr_seq *s, const gr_seq *t);

/* A set of characters (code points) as ranges, for classes ([a-z], [^"], \d, .). */
typedef struct gr_class {
    uint32_t (*r)[2]; /* [lo, hi] inclusive */
    int n, cap;
    int failed;
} gr_class;
void gr_class_add(gr_class *c, uint32_t lo, uint32_t hi);
/* Every character (U+0000..U+10FFFF but surrogates) outside the class. */
void gr_class_negate(gr_class *c);
int gr_class_has(const gr_class *c, uint32_t cp);
void gr_class_free(gr_class *c);
/* Adds to rule r one alternative per run of the class's characters written in UTF-8. */
void gr_alt_class(g4_grammar *g, int r, const gr_class *c);
/* The code point at *p (UTF-8; a broken sequence gives its first byte), *p moved past it. */
uint32_t gr_utf8_next(const char **p, const char *end);
/* Appends code point cp in UTF-8. */
void gr_seq_cp(g4_grammar *g, gr_seq *s, uint32_t cp);

g4_grammar *gr_new(void);
/* A new rule without alternatives yet (a rule may be named before it is defined: recursion). -1: out of memory. */
int gr_rule(g4_grammar *g);
/* Adds alternative s to rule r (an empty s: the rule may match nothing). */
void gr_alt(g4_grammar *g, int r, const gr_seq *s);
/* Adds to rule r the alternatives `a b` (two rules) and nothing. */
void gr_alt_opt(g4_grammar *g, int r, int a, int b);
/* A new rule of alternative s alone. */
int gr_rule_of(g4_grammar *g, const gr_seq *s);
/* x repeated min..max times (max < 0: no bound); x a rule. */
int gr_repeat(g4_grammar *g, int x, int min, int max);
/* Why building failed ("out of memory", "too large ..."), or NULL. */
const char *gr_failed(const g4_grammar *g);
/* Finishes the grammar with its start rule: checks every rule is defined and none is left-recursive. */
int gr_finish(g4_grammar *g, int start, g4_error *err);

/* ------------------------------------------------------------------ matching */

/* The tokens of a model in byte order (one per model, shared by its generations). */
typedef struct g4_gr_tokens g4_gr_tokens;
int g4_gr_tokens_new(const g4_tokenizer *tok, int vocab_size, g4_gr_tokens **out, g4_error *err);
void g4_gr_tokens_free(g4_gr_tokens *t);

/* A generation's walk through a grammar: its state, the ids of its special tokens, its masks. end_ids: the
 * tokens that end the generation (allowed where the grammar has read a whole sentence). thinking: the output may
 * start with Gemma 4's thinking channel, `<|channel>` any text `<channel|>` (every grammar has that way in; it
 * is left closed without this flag or where the vocabulary lacks those tokens). */
typedef struct g4_gr_match g4_gr_match;
int g4_gr_match_new(const g4_grammar *g, const g4_gr_tokens *t, const g4_tokenizer *tok, const int32_t *end_ids,
                    int n_end_ids, int thinking, g4_gr_match **out, g4_error *err);
void g4_gr_match_free(g4_gr_match *m);
/* Sets logits[id] = -INFINITY for every token that cannot come next. */
void g4_gr_match_mask(g4_gr_match *m, float *logits);
/* The same mask by the plain walk over the sets, without the interned sets or the masks kept (for tests; the
 * special tokens and end ids are left to g4_gr_match_mask). */
void g4_gr_match_mask_sets(g4_gr_match *m, float *logits);
/* Advances by token id: 0, or -1 when it cannot come next (the state is then unchanged). An end id is
 * taken where the grammar has read a whole sentence. */
int g4_gr_match_accept(g4_gr_match *m, int32_t id);
/* Reads bytes (no special token): 0 while they keep a prefix of a sentence, -1 otherwise (state unchanged). */
int g4_gr_match_feed(g4_gr_match *m, const char *bytes, size_t n);
/* 1 when bytes could come next (the state is unchanged). */
int g4_gr_match_try(g4_gr_match *m, const char *bytes, size_t n);
/* 1 where a whole sentence has been read and nothing more can follow. */
int g4_gr_match_done(const g4_gr_match *m);
/* 1 where a whole sentence has been read (more may follow). */
int g4_gr_match_accepting(const g4_gr_match *m);

#endif
