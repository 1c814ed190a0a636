/* The paged KV cache's bookkeeping (src/engine/kv_cache.h) on a made-up layer layout, without a model: block
 * allocation and release, the "KV cache is full" check, sliding-window recycling with and without history,
 * copy on write, prefix hits and misses, LRU eviction, a rolled-back block leaving the cache, and the reuse of a
 * prefix longer than the sliding window whose early sliding blocks were recycled. What the cached rows contain
 * is checked end to end by test_scheduler (outputs equal with and without reuse). */
#include <string.h>

#include "check.h"
#include "core/error.h"
#include "engine/kv_cache.h"

enum { W = 8, B = 4, NSEQ = 3, NCTX = 64, NBATCH = 16 };

/* layers: 0 sliding, 1 full, 2 sliding reading layer 0's K/V */
static g4_text_config layout(void) {
    g4_text_config c;
    memset(&c, 0, sizeof c);
    c.n_layers = 3;
    c.sliding_window = W;
    const g4_layer_type types[3] = {G4_LAYER_SLIDING, G4_LAYER_FULL, G4_LAYER_SLIDING};
    for (int l = 0; l < 3; l++) {
        c.layer_type[l] = types[l];
        c.layer_head_dim[l] = 4;
        c.layer_kv_heads[l] = 1;
        c.layer_kv_source[l] = l == 2 ? 0 : l;
        c.layer_kv_shared[l] = l == 2;
    }
    return c;
}

static int32_t seqs[NBATCH], poss[NBATCH];

/* One step adding `add` positions to sequence s whose ids are tokens[0 .. len+add-1]: prepare, then commit. */
static int step(g4_kv_cache *kv, int s, const int32_t *tokens, int add) {
    int adds[NSEQ] = {0};
    adds[s] = add;
    for (int i = 0; i < add; i++) seqs[i] = s, poss[i] = kv->seq_len[s] + i;
    g4_error err;
    if (g4_kv_cache_prepare(kv, adds, add, seqs, poss, &err)) return -1;
    kv->seq_len[s] += add;
    g4_kv_cache_commit(kv, s, tokens, kv->seq_len[s]);
    return 0;
}

/* Runs sequence s through tokens[0..n-1] in steps of `chunk`. */
static int run(g4_kv_cache *kv, int s, const int32_t *tokens, int n, int chunk) {
    while (kv->seq_len[s] < n) {
        int k = n - kv->seq_len[s] < chunk ? n - kv->seq_len[s] : chunk;
        if (step(kv, s, tokens, k)) return -1;
    }
    return 0;
}

static void reset(g4_kv_cache *kv, int s) {
    g4_kv_cache_drop(kv, s, 0);
    kv->seq_len[s] = 0;
}

static int held(const g4_kv_cache *kv, int t, int s) {
    int n = 0;
    for (int b = 0; b < kv->max_blocks; b++) n += kv->pool[t].table[s * kv->max_blocks + b] >= 0;
    return n;
}

static int new_kv(g4_kv_cache *kv, int history, int n_full_blocks, g4_backend *be) {
    g4_text_config c = layout();
    g4_error err;
    int rc = g4_kv_cache_init(kv, &c, be, NSEQ, NCTX, NBATCH, history, G4_KV_F32, B, n_full_blocks, 0, &err);
    CHECKF(rc == 0, "init: %s", err.msg);
    return rc;
}

static void fill_ids(int32_t *ids, int n, int32_t base) {
    for (int i = 0; i < n; i++) ids[i] = base + i;
}

static void test_allocation(g4_backend *be) {
    g4_kv_cache kv;
    if (new_kv(&kv, 0, 6, be)) return;
    g4_kv_pool *full = &kv.pool[G4_LAYER_FULL], *sl = &kv.pool[G4_LAYER_SLIDING];
    /* shared layer 2 owns nothing: it reads layer 0's storage */
    CHECK(kv.layers[2].k == kv.layers[0].k && kv.layers[2].v == kv.layers[0].v);
    CHECK(kv.layers[1].k != kv.layers[0].k);
    CHECK(full->n_blocks == 6 && full->n_free == 6);
    /* sliding pool: every sequence's window (W - 1 rows + slack), one batch, a window each for the cache */
    CHECK(sl->n_blocks == NSEQ * (((W - 1 + B - 1) / B + 2) + ((W - 1 + B - 1) / B + 1)) + NBATCH / B);
    int32_t ids[64];
    fill_ids(ids, 64, 100);
    int cost[G4_LAYER_TYPES];
    g4_kv_cache_cost(&kv, 0, 10, cost);
    CHECK(cost[G4_LAYER_FULL] == 3 && cost[G4_LAYER_SLIDING] == 3);
    CHECK(step(&kv, 0, ids, 10) == 0);
    CHECK(full->n_free == 3 && held(&kv, G4_LAYER_FULL, 0) == 3);
    /* write slots: position p of sequence 0 in block table[p / B] */
    for (int i = 0; i < 10; i++)
        CHECK(full->slot[i] == full->table[i / B] * B + i % B && sl->slot[i] == sl->table[i / B] * B + i % B);
    /* the pool is too small for 16 more positions: a clear error, nothing taken */
    int adds[NSEQ] = {0, 16, 0};
    for (int i = 0; i < 16; i++) seqs[i] = 1, poss[i] = i;
    g4_error err;
    CHECK(g4_kv_cache_prepare(&kv, adds, 16, seqs, poss, &err) != 0 && strstr(err.msg, "KV cache is full"));
    CHECK(full->n_free == 3 && held(&kv, G4_LAYER_FULL, 1) == 0 && held(&kv, G4_LAYER_SLIDING, 1) == 0);
    /* sharing and copy on write: sequence 1 takes 0's first 6 positions (block 1 partial), then writes */
    CHECK(g4_kv_cache_share(&kv, 1, 0, 6, &err) == 0);
    CHECK(full->ref[full->table[0]] == 2 && full->ref[full->table[1]] == 2 && full->n_free == 3);
    int32_t other[64];
    memcpy(other, ids, sizeof other);
    other[6] = 7;
    g4_kv_cache_cost(&kv, 1, 1, cost);
    CHECK(cost[G4_LAYER_FULL] == 1); /* a copy of the shared partial block */
    CHECK(step(&kv, 1, other, 1) == 0);
    CHECK(full->table[kv.max_blocks + 1] != full->table[1] && full->ref[full->table[1]] == 1 && full->n_free == 2);
    CHECK(full->table[kv.max_blocks] == full->table[0] && full->ref[full->table[0]] == 2);
    reset(&kv, 0);
    reset(&kv, 1);
    CHECK(full->n_free == full->n_blocks && sl->n_free == sl->n_blocks);
    g4_kv_cache_free(&kv);
}

/* g4_kv_cache_bytes says what init allocates, for each pool size and type */
static void test_bytes(g4_backend *be) {
    g4_text_config c = layout();
    const g4_kv_type types[2] = {G4_KV_F32, G4_KV_BF16};
    for (int n_seq = 1; n_seq <= NSEQ; n_seq++)
        for (int t = 0; t < 2; t++)
            for (int history = 0; history <= NBATCH; history += NBATCH)
                for (int full = 0; full <= 6; full += 6)
                    for (int sliding = 0; sliding <= 9; sliding += 9) {
                        g4_kv_cache kv;
                        g4_error err;
                        const int rc = g4_kv_cache_init(&kv, &c, be, n_seq, NCTX, NBATCH, history, types[t], B, full,
                                                         sliding, &err);
                        CHECKF(rc == 0, "init: %s", err.msg);
                        if (rc) continue;
                        const size_t want = g4_kv_cache_bytes(&c, n_seq, NCTX, NBATCH, history, types[t], B, full,
                                                              sliding);
                        CHECKF(want == kv.bytes && want > 0,
                               "%d sequences, %s, history %d, blocks %d/%d: %zu bytes allocated, %zu said", n_seq,
                               t ? "bf16" : "f32", history, full, sliding, kv.bytes, want);
                        g4_kv_cache_free(&kv);
                    }
}

static void test_sliding_recycling(g4_backend *be) {
    for (int history = 0; history <= NBATCH; history += NBATCH) {
        g4_kv_cache kv;
        if (new_kv(&kv, history, 0, be)) return;
        g4_kv_pool *sl = &kv.pool[G4_LAYER_SLIDING];
        int32_t ids[64];
        fill_ids(ids, 64, 5);
        int most = 0;
        for (int p = 0; p < 60; p++) { /* decode one position at a time */
            CHECK(step(&kv, 0, ids, 1) == 0);
            int h = held(&kv, G4_LAYER_SLIDING, 0);
            if (h > most) most = h;
            /* it still holds what the next step reads, and `history` positions more */
            CHECK(g4_kv_cache_can_resume(&kv, 0, kv.seq_len[0]));
            CHECK(g4_kv_cache_can_resume(&kv, 0, kv.seq_len[0] - (history < kv.seq_len[0] ? history : kv.seq_len[0])));
        }
        /* at most the window (W - 1 rows before the new one) plus history, in whole blocks */
        CHECKF(most <= (W - 1 + history + B - 1) / B + 1, "history %d: %d sliding blocks held", history, most);
        CHECK(held(&kv, G4_LAYER_FULL, 0) == 15);
        CHECK(sl->n_free == sl->n_blocks - held(&kv, G4_LAYER_SLIDING, 0));
        if (history == 0) CHECK(!g4_kv_cache_can_resume(&kv, 0, 60 - W - B));
        g4_kv_cache_free(&kv);
    }
}

static void test_prefix_hits(g4_backend *be) {
    g4_kv_cache kv;
    if (new_kv(&kv, 0, 0, be)) return;
    g4_kv_pool *full = &kv.pool[G4_LAYER_FULL];
    int32_t a[64], b[64];
    fill_ids(a, 64, 1000);
    CHECK(g4_kv_cache_lookup(&kv, a, 30) == 0); /* empty cache: a miss */
    CHECK(run(&kv, 0, a, 30, 7) == 0);
    /* hits while the owner still runs: whole blocks only */
    CHECK(g4_kv_cache_lookup(&kv, a, 30) == 28);
    CHECK(g4_kv_cache_lookup(&kv, a, 13) == 12);
    CHECK(g4_kv_cache_lookup(&kv, a, 3) == 0);
    memcpy(b, a, sizeof b);
    b[9] = 1; /* differs in block 2 */
    CHECK(g4_kv_cache_lookup(&kv, b, 30) == 8);
    b[0] = 1; /* differs in block 0: the chained hash misses every later block too */
    CHECK(g4_kv_cache_lookup(&kv, b, 30) == 0);
    /* the owner goes away: its hashed blocks stay cached (free, still findable) */
    reset(&kv, 0);
    CHECK(full->n_free == full->n_blocks);
    CHECK(g4_kv_cache_lookup(&kv, a, 64) == 28);
    /* two sequences reuse it: references, and the cached blocks leave the free list */
    CHECK(g4_kv_cache_reuse(&kv, 1, a, 20) == 20 && kv.seq_len[1] == 20);
    CHECK(full->n_free == full->n_blocks - 5);
    CHECK(g4_kv_cache_reuse(&kv, 2, a, 64) == 28 && full->ref[full->table[2 * kv.max_blocks]] == 2);
    CHECK(full->n_free == full->n_blocks - 7);
    /* sliding layers: only the blocks the window before position 28 reads (21..27) */
    CHECK(held(&kv, G4_LAYER_SLIDING, 2) == 2);
    CHECK(g4_kv_cache_reuse(&kv, 2, a, 64) == 0); /* not empty */
    /* sequence 2 goes on from the reused prefix with ids of its own, sequence 1 as a */
    fill_ids(b, 64, 1000);
    b[30] = 3;
    CHECK(run(&kv, 2, b, 40, 5) == 0 && run(&kv, 1, a, 36, 3) == 0);
    CHECK(g4_kv_cache_lookup(&kv, b, 64) == 40 && g4_kv_cache_lookup(&kv, a, 64) == 36);
    /* soft tokens (-1: an image's rows) are never cached, nor anything after them */
    int32_t img[64];
    fill_ids(img, 64, 5000);
    img[9] = img[10] = -1;
    CHECK(run(&kv, 0, img, 24, 8) == 0);
    CHECK(g4_kv_cache_lookup(&kv, img, 24) == 8);
    reset(&kv, 0);
    /* a roll-back into a hashed block takes it out of the cache before it is written */
    g4_kv_cache_drop(&kv, 1, 34);
    kv.seq_len[1] = 34;
    memcpy(b, a, sizeof b);
    b[34] = 9;
    CHECK(step(&kv, 1, b, 2) == 0);
    CHECK(g4_kv_cache_lookup(&kv, a, 64) == 32 && g4_kv_cache_lookup(&kv, b, 64) == 36);
    reset(&kv, 1);
    reset(&kv, 2);
    CHECK(full->n_free == full->n_blocks);
    g4_kv_cache_free(&kv);
}

static void test_eviction(g4_backend *be) {
    g4_kv_cache kv;
    if (new_kv(&kv, 0, 12, be)) return;
    g4_kv_pool *full = &kv.pool[G4_LAYER_FULL];
    int32_t a[64], b[64], c[64];
    fill_ids(a, 64, 10);
    fill_ids(b, 64, 20000);
    fill_ids(c, 64, 40000);
    CHECK(run(&kv, 0, a, 20, 8) == 0);
    reset(&kv, 0); /* a's 5 blocks cached, freed first */
    CHECK(run(&kv, 0, b, 20, 8) == 0);
    reset(&kv, 0); /* b's 5 blocks cached after them; 2 plain blocks left */
    CHECK(full->n_free == 12 && full->n_plain == 2);
    CHECK(g4_kv_cache_lookup(&kv, a, 64) == 20 && g4_kv_cache_lookup(&kv, b, 64) == 20);
    /* reusing a makes it the most recently freed once it is free again */
    CHECK(g4_kv_cache_reuse(&kv, 1, a, 64) == 20);
    reset(&kv, 1);
    /* 4 new blocks: the 2 plain ones first, then the least recently freed cached ones (b's first blocks) */
    CHECK(run(&kv, 0, c, 16, 16) == 0);
    CHECK(g4_kv_cache_lookup(&kv, b, 64) == 0 && g4_kv_cache_lookup(&kv, a, 64) == 20);
    /* more: b's remaining blocks go before any of a's */
    CHECK(run(&kv, 0, c, 28, 12) == 0);
    CHECK(g4_kv_cache_lookup(&kv, a, 64) == 20 && full->n_free == 5);
    CHECK(run(&kv, 0, c, 32, 4) == 0);
    CHECK(g4_kv_cache_lookup(&kv, a, 64) == 0); /* a's block 0 was the next one out */
    CHECK(g4_kv_cache_lookup(&kv, c, 64) == 32);
    reset(&kv, 0);
    g4_kv_cache_free(&kv);
}

/* A prefix longer than the window stays reusable when its early sliding blocks were recycled: resuming at
 * position k*B needs only the sliding blocks of positions k*B - W + 1 .. k*B - 1. */
static void test_prefix_across_window(g4_backend *be) {
    g4_kv_cache kv;
    if (new_kv(&kv, 0, 0, be)) return;
    g4_kv_pool *sl = &kv.pool[G4_LAYER_SLIDING];
    int32_t a[64];
    fill_ids(a, 64, 777);
    CHECK(run(&kv, 0, a, 40, B) == 0); /* blocks 0..9; sliding blocks below the window released as it moved */
    CHECK(held(&kv, G4_LAYER_SLIDING, 0) == 3 && held(&kv, G4_LAYER_FULL, 0) == 10);
    reset(&kv, 0);
    CHECK(g4_kv_cache_lookup(&kv, a, 40) == 40);
    /* sequence 1 uses up the plain sliding blocks, then takes the least recently freed cached one: a's block 0
     * (its own released blocks join the cached ones behind a's) */
    int32_t z[64];
    fill_ids(z, 64, 90000);
    while (sl->n_plain > 0) CHECK(step(&kv, 1, z, 1) == 0);
    const int32_t oldest = sl->lru_head;
    CHECK(sl->tokens[oldest * B] == a[0]);
    while (sl->lru_head == oldest) CHECK(step(&kv, 1, z, 1) == 0);
    /* block 0 is gone: prefixes ending at 4 or 8 cannot resume (they need it), one ending at 12 can (it needs
     * blocks 1 and 2: positions 5..11), and so can the whole 40 (blocks 8 and 9) */
    CHECK(g4_kv_cache_lookup(&kv, a, 8) == 0);
    CHECK(g4_kv_cache_lookup(&kv, a, 12) == 12);
    CHECK(g4_kv_cache_lookup(&kv, a, 64) == 40);
    CHECK(g4_kv_cache_reuse(&kv, 2, a, 40) == 40);
    CHECK(held(&kv, G4_LAYER_SLIDING, 2) == 2 && held(&kv, G4_LAYER_FULL, 2) == 10);
    CHECK(g4_kv_cache_can_resume(&kv, 2, 40));
    g4_kv_cache_free(&kv);
}

int main(void) {
    g4_error err;
    g4_backend *be = g4_backend_new("cpu", 1, 0, &err);
    CHECKF(be != NULL, "cpu backend: %s", err.msg);
    if (!be) return g4t_done();
    test_allocation(be);
    test_bytes(be);
    test_sliding_recycling(be);
    test_prefix_hits(be);
    test_eviction(be);
    test_prefix_across_window(be);
    g4_backend_free(be);
    return g4t_done();
}
