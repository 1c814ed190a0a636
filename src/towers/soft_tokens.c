/* Placeholder expansion and soft-token numbering (docs/gemma4-towers.md §4); see soft_tokens.h. */
#include "towers/soft_tokens.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static int alloc(g4_soft_prompt *p, size_t n, g4_error *err) {
    memset(p, 0, sizeof *p);
    p->ids = malloc((n ? n : 1) * sizeof *p->ids);
    p->rows = malloc((n ? n : 1) * sizeof *p->rows);
    if (p->ids && p->rows) return 0;
    g4_soft_prompt_free(p);
    return g4_fail(err, "out of memory");
}

int g4_soft_prompt_expand(const int32_t *ids, int n, const g4_soft_items *it, g4_soft_prompt *out, g4_error *err) {
    int found = 0, blocks = 0;
    size_t len = 0;
    for (int i = 0; i < n; i++) found += ids[i] == it->placeholder;
    if (found != it->n_items)
        return g4_fail(err, "the prompt has %d placeholder%s for %d input%s", found, found == 1 ? "" : "s", it->n_items,
                       it->n_items == 1 ? "" : "s");
    for (int i = 0; i < it->n_items; i++)
        for (int b = 0; b < it->item_blocks[i]; b++) len += 2 + (size_t)it->block_tokens[blocks++];
    if (alloc(out, len + (size_t)n, err)) return -1;
    int item = 0, block = 0, row = 0;
    for (int i = 0; i < n; i++) {
        if (ids[i] != it->placeholder) {
            out->ids[out->n] = ids[i];
            out->rows[out->n++] = -1;
            continue;
        }
        for (int b = 0; b < it->item_blocks[item]; b++, block++) {
            out->ids[out->n] = it->begin;
            out->rows[out->n++] = -1;
            for (int k = 0; k < it->block_tokens[block]; k++) {
                out->ids[out->n] = it->placeholder;
                out->rows[out->n++] = row++;
            }
            out->ids[out->n] = it->end;
            out->rows[out->n++] = -1;
        }
        item++;
    }
    return 0;
}

int g4_soft_prompt_number(const int32_t *ids, int n, int32_t placeholder, int n_rows, g4_soft_prompt *out,
                          g4_error *err) {
    int found = 0;
    for (int i = 0; i < n; i++) found += ids[i] == placeholder;
    if (found != n_rows)
        return g4_fail(err, "the ids hold %d soft-token placeholders (id %d) for %d soft tokens", found, placeholder,
                       n_rows);
    if (alloc(out, (size_t)n, err)) return -1;
    for (int i = 0, row = 0; i < n; i++) {
        out->ids[i] = ids[i];
        out->rows[i] = ids[i] == placeholder ? row++ : -1;
    }
    out->n = n;
    return 0;
}

void g4_soft_prompt_free(g4_soft_prompt *p) {
    free(p->ids);
    free(p->rows);
    memset(p, 0, sizeof *p);
}
