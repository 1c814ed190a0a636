/* Exercises a tokenizer the harnesses loaded from hostile files: encoding and decoding (batch and
 * streamed) must work or fail with a one-line message, and streaming must agree with batch. */
#ifndef G4_TESTS_FUZZ_TOK_H
#define G4_TESTS_FUZZ_TOK_H

#include "fuzz.h"
#include "tokenizer/tokenizer.h"

/* Decodes ids in batch and streamed; when both work they must give the same text. */
static inline void fuzz_decode(const g4_tokenizer *tok, const int32_t *ids, size_t n, int skip) {
    char *text = NULL;
    size_t len = 0;
    g4_error err = {{0}};
    int rc = g4_detokenize(tok, ids, n, skip, &text, &len, &err);
    fuzz_expect_error(rc, &err);
    g4_detok_stream *s = g4_detok_stream_new(tok, skip);
    fuzz_expect(s != NULL);
    size_t cap = 256, sn = 0;
    char *streamed = malloc(cap);
    int srs = 0;
    for (size_t i = 0; i <= n && !srs; i++) { /* every id, then the flush */
        const char *piece;
        size_t pl;
        if (i < n) {
            srs = g4_detok_stream_push(s, ids[i], &piece, &pl, &err);
            fuzz_expect_error(srs, &err);
        } else {
            srs = g4_detok_stream_flush(s, &piece, &pl);
        }
        if (srs) break;
        if (sn + pl > cap) {
            while (sn + pl > cap) cap *= 2;
            streamed = realloc(streamed, cap);
        }
        memcpy(streamed + sn, piece, pl);
        sn += pl;
        if (i == n && rc == 0) fuzz_expect(sn == len && memcmp(streamed, text, len) == 0);
    }
    g4_detok_stream_free(s);
    free(streamed);
    free(text);
}

/* Encodes text (then decodes the ids) and decodes a few ids of every kind. */
static inline void fuzz_tokenizer(const g4_tokenizer *tok, const char *text, size_t len, int add_bos) {
    g4_tokens ids = {0};
    g4_error err = {{0}};
    int rc = g4_tokenize(tok, text, len, add_bos, &ids, &err);
    fuzz_expect_error(rc, &err);
    int n_ids = g4_tokenizer_vocab_size(tok);
    if (rc == 0) {
        for (size_t i = 0; i < ids.n; i++) fuzz_expect(ids.ids[i] >= 0 && ids.ids[i] < n_ids);
        fuzz_decode(tok, ids.ids, ids.n, 0);
        fuzz_decode(tok, ids.ids, ids.n, 1);
    }
    free(ids.ids);
    int32_t some[12] = {0, 1, 2, 3, n_ids - 1, n_ids / 2, n_ids, -1, 256, 259, 106, 2};
    fuzz_decode(tok, some, 12, 0);
    for (int32_t id = 0; id < n_ids && id < 300; id++) {
        const char *piece = g4_tokenizer_piece(tok, id); /* (a normalized added token's piece is its
                                                            normalized form: no round trip) */
        if (piece) g4_tokenizer_token_id(tok, piece);
        g4_tokenizer_is_special(tok, id);
    }
}

#endif
