/* Constrained decoding to one JSON object (RFC 8259; OpenAI's response_format {"type": "json_object"}).
 *
 * A pushdown automaton reads the output byte by byte: the text must start with '{' (no whitespace before
 * it, so a model cannot loop on blanks there), and every prefix must stay a prefix of a JSON object;
 * strings may hold any byte from 0x20 up (the detokenizer keeps UTF-8 valid), nesting is limited to 64
 * levels and blanks between the grammar's tokens to 20 in a row. At each step the tokens whose bytes (g4_tokenizer_token_bytes) would break the prefix, special
 * tokens and tokens without text get -infinity; the generation ends once the object is closed. */
#ifndef G4_ENGINE_JSON_OBJECT_H
#define G4_ENGINE_JSON_OBJECT_H

#include <stddef.h>
#include <stdint.h>

#include "gemma4c.h"

typedef struct g4_json_state {
    uint64_t arrays; /* bit d: the container at depth d is an array */
    uint8_t depth;
    uint8_t mode;    /* where the automaton is (json_object.c) */
    uint8_t sub;     /* inside a number, literal or \u escape: how far */
    uint8_t key;     /* the string being read is an object key */
    uint8_t lit;     /* which literal: true, false, null */
    uint8_t ws;      /* blanks in a row */
} g4_json_state;

/* The state before any output. */
void g4_json_start(g4_json_state *s);
/* Reads bytes; 0 while they keep a prefix of a JSON object, -1 (s unchanged is not promised) otherwise. */
int g4_json_feed(g4_json_state *s, const char *bytes, size_t n);
/* 1 once the object is closed. */
int g4_json_done(const g4_json_state *s);

/* The tokens' bytes of a tokenizer and the masks of the states met last (a model keeps one for its generations:
 * g4_json_mask may be called from several threads). */
typedef struct g4_json_tokens g4_json_tokens;
int g4_json_tokens_new(const g4_tokenizer *tok, int vocab_size, g4_json_tokens **out, g4_error *err);
void g4_json_tokens_free(g4_json_tokens *t);
/* Sets logits[id] = -INFINITY for every token that cannot come next in state s. */
void g4_json_mask(g4_json_tokens *t, const g4_json_state *s, float *logits);
/* Advances s by token id (0, or -1 when it does not fit). */
int g4_json_accept(const g4_json_tokens *t, g4_json_state *s, int32_t id);

#endif
