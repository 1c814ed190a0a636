/* Prompts with soft tokens (docs/gemma4-towers.md §4): each placeholder the chat template
 * writes (<|audio|>, <|image|>) becomes begin + placeholder x N + end for every block of
 * its item (an image, or a 30 s clip of an audio file), and each expanded placeholder
 * takes the next row of the items' embeddings, in order (transformers' masked_scatter).
 * The result feeds g4_batch.embeddings / embedding_row. For audio and images alike. */
#ifndef G4_TOWERS_SOFT_TOKENS_H
#define G4_TOWERS_SOFT_TOKENS_H

#include <stdint.h>

#include "gemma4c.h"

typedef struct g4_soft_prompt {
    int32_t *ids;  /* [n] */
    int32_t *rows; /* [n]: row of the embeddings for a soft token, -1 otherwise */
    int n;
} g4_soft_prompt;

/* The soft-token blocks of the items, in prompt order: item i has item_blocks[i] blocks,
 * block b has block_tokens[b] soft tokens (blocks numbered across items). */
typedef struct g4_soft_items {
    int32_t placeholder, begin, end;
    int n_items;
    const int *item_blocks;
    const int *block_tokens;
} g4_soft_items;

/* Expands every placeholder of ids[0..n) (their count must equal n_items). */
int g4_soft_prompt_expand(const int32_t *ids, int n, const g4_soft_items *items, g4_soft_prompt *out, g4_error *err);
/* Numbers the soft tokens of ids that already hold the expanded placeholders (as transformers'
 * processor writes input_ids): their count must equal n_rows. */
int g4_soft_prompt_number(const int32_t *ids, int n, int32_t placeholder, int n_rows, g4_soft_prompt *out,
                          g4_error *err);
void g4_soft_prompt_free(g4_soft_prompt *p);

#endif
