/* The text decoder against the transformers references of ../shared/fixtures:
 * full-forward logits and per-layer hidden states, teacher-forced decode through
 * the KV cache, 24 greedy tokens, chunked prefill, two sequences in one batch;
 * on the checkpoints as shipped, re-saved as sharded safetensors, as float32 and as a
 * BF16 GGUF file, with every instruction set of this CPU; and quantized (GGUF Q8_0,
 * MLX 8-bit, on the default device, see check_quantized for the tolerances and why). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "core/mapped_file.h"
#include "engine/context.h"
#include "formats/safetensors.h"
#include "gemma4c.h"
#include "backend/cpu/cpu.h"
#include "model/quantize.h"
#include "model_files.h"
#include "reference.h"

/* Tolerances of the CPU (f32 arithmetic). A backend of its own memory (CUDA) multiplies prefill products on
 * tensor cores with bf16 operands, the activations split in two bf16 parts (cuda_blas.cu), and sums in
 * other orders: logits within 4e-3 there (measured in the emulator: at most 1.1e-3); hidden states as on the
 * CPU. With activations rounded to bf16 once (G4_CUDA_GEMM=bf16) these random fixtures, whose peaked
 * attention and routing amplify rounding, differ by 0.6 to 2.9 in the logits (not tested). */
static int on_gpu; /* the model under test runs on a backend with its own memory */
#define LOGIT_TOL (on_gpu ? 4e-3f : 2e-3f)
#define HIDDEN_REL_TOL 1e-3f

/* 2, or G4_TEST_THREADS (scripts/test-aarch64 runs one thread under qemu-user) */
static int test_threads(void) { return getenv("G4_TEST_THREADS") ? atoi(getenv("G4_TEST_THREADS")) : 2; }

typedef struct {
    g4_tensor_set ref;
    int32_t *ids, *greedy, *decode_ids;
    size_t n_ids, n_greedy, n_decode;
    float *logits, *hidden, *final_norm, *decode_logits;
} reference;

static int load_reference(const char *fixture, reference *r) {
    g4_error err;
    memset(r, 0, sizeof *r);
    char path[4096];
    snprintf(path, sizeof path, "%s/reference.safetensors", fixture);
    if (g4_safetensors_add_file(&r->ref, path, &err) || g4_tensor_set_finish(&r->ref, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    r->ids = ref_ids(&r->ref, "input_ids", &r->n_ids);
    r->greedy = ref_ids(&r->ref, "greedy_ids", &r->n_greedy);
    r->decode_ids = ref_ids(&r->ref, "decode_ids", &r->n_decode);
    r->logits = ref_f32(&r->ref, "logits", NULL);
    r->hidden = ref_f32(&r->ref, "hidden_states", NULL);
    r->final_norm = ref_f32(&r->ref, "final_norm", NULL);
    r->decode_logits = ref_f32(&r->ref, "decode_logits", NULL);
    return (r->ids && r->greedy && r->decode_ids && r->logits && r->hidden && r->final_norm && r->decode_logits) ? 0 : -1;
}

static void free_reference(reference *r) {
    free(r->ids);
    free(r->greedy);
    free(r->decode_ids);
    free(r->logits);
    free(r->hidden);
    free(r->final_norm);
    free(r->decode_logits);
    g4_tensor_set_free(&r->ref);
}

/* Runs ids through sequence `seq` in chunks of `chunk`; returns logits of the last row in last_logits. */
static int prefill(g4_context *ctx, const int32_t *ids, int n, int seq, int chunk, float *last_logits) {
    g4_error err;
    int32_t seqs[512];
    uint8_t want[512];
    for (int i = 0; i < n; i += chunk) {
        int m = n - i < chunk ? n - i : chunk;
        for (int j = 0; j < m; j++) {
            seqs[j] = seq;
            want[j] = (i + j == n - 1);
        }
        g4_batch b = {.n_tokens = m, .token = ids + i, .seq = seqs, .want_logits = want};
        if (g4_decode(ctx, &b, last_logits, &err)) {
            fprintf(stderr, "decode: %s\n", err.msg);
            return -1;
        }
    }
    return 0;
}

static void check_model(const char *label, const char *model_dir, const reference *r) {
    g4_error err;
    g4_model *model;
    g4_load_params lp = {.n_threads = test_threads()};
    if (g4_model_load(model_dir, &lp, &model, &err)) {
        CHECKF(0, "%s: load failed: %s", label, err.msg);
        return;
    }
    CHECKF(g4_model_warnings(model) == NULL, "%s: unexpected warnings: %s", label, g4_model_warnings(model));
    on_gpu = strcmp(g4_model_device(model), "cpu") != 0;
    const int V = g4_model_vocab_size(model), L = g4_model_n_layers(model), H = g4_model_hidden_size(model);
    const int T = (int)r->n_ids;
    g4_context *ctx;
    g4_context_params cp = {.n_seq_max = 2, .n_ctx = 128, .n_batch = 64};
    if (g4_context_new(model, &cp, &ctx, &err)) {
        CHECKF(0, "%s: context: %s", label, err.msg);
        g4_model_free(model);
        return;
    }
    float *logits = malloc((size_t)T * V * sizeof(float));
    float *hidden = malloc((size_t)L * T * H * sizeof(float));
    float *fnorm = malloc((size_t)T * H * sizeof(float));
    float *row = malloc((size_t)V * sizeof(float));

    /* 1. one full forward of the prompt: logits of every position, every layer's output */
    g4_context_capture(ctx, hidden, fnorm);
    g4_batch b = {.n_tokens = T, .token = r->ids};
    CHECKF(g4_decode(ctx, &b, logits, &err) == 0, "%s: %s", label, err.msg);
    g4_context_capture(ctx, NULL, NULL);
    float e_logits = max_abs_diff(logits, r->logits, (size_t)T * V);
    CHECKF(e_logits <= LOGIT_TOL, "%s: full-forward logits differ by %g", label, e_logits);
    float worst_hidden = 0;
    for (int l = 0; l < L; l++) {
        const float *ref = r->hidden + (size_t)l * T * H;
        float rel = max_abs_diff(hidden + (size_t)l * T * H, ref, (size_t)T * H) / max_abs(ref, (size_t)T * H);
        if (!(rel <= worst_hidden)) worst_hidden = rel;
        CHECKF(rel <= HIDDEN_REL_TOL, "%s: hidden state of layer %d differs by %g relative", label, l, rel);
    }
    float rel_final = max_abs_diff(fnorm, r->final_norm, (size_t)T * H) / max_abs(r->final_norm, (size_t)T * H);
    CHECKF(rel_final <= HIDDEN_REL_TOL, "%s: final norm differs by %g relative", label, rel_final);

    /* 2. teacher-forced decode through the cache, position by position. This context allows
     * batches of 5 and has blocks of 4 positions, so its sliding layers hold at most
     * ceil((W - 1 + 5) / 4) + 1 blocks (the window, 5 positions of history, one slack block), and its
     * sliding pool has just that many: fewer rows than the prompt, recycled several times during the
     * prefill (chunks of 5) and the decode. */
    g4_context *small;
    const int W = model->cfg.text.sliding_window;
    g4_context_params sp = {.n_seq_max = 1, .n_ctx = 128, .n_batch = 5, .kv_block_size = 4,
                            .n_kv_sliding_blocks = (W - 1 + 5 + 3) / 4 + 1};
    if (g4_context_new(model, &sp, &small, &err)) {
        CHECKF(0, "%s: context: %s", label, err.msg);
        return;
    }
    const g4_kv_pool *sliding = &small->kv.pool[G4_LAYER_SLIDING];
    CHECKF(!sliding->used || sliding->n_blocks * 4 < T,
           "%s: the sliding pool (%d blocks of 4) must hold fewer rows than the prompt", label, sliding->n_blocks);
    CHECK(prefill(small, r->ids, T, 0, 5, row) == 0);
    float e_prefill_last = max_abs_diff(row, r->logits + (size_t)(T - 1) * V, (size_t)V);
    CHECKF(e_prefill_last <= LOGIT_TOL, "%s: prefill last-row logits differ by %g", label, e_prefill_last);
    float e_decode = 0;
    for (size_t i = 0; i < r->n_decode; i++) {
        g4_batch d = {.n_tokens = 1, .token = &r->decode_ids[i]};
        if (g4_decode(small, &d, row, &err)) {
            CHECKF(0, "%s: decode step %zu: %s", label, i, err.msg);
            break;
        }
        float e = max_abs_diff(row, r->decode_logits + i * (size_t)V, (size_t)V);
        if (!(e <= e_decode)) e_decode = e;
    }
    CHECKF(e_decode <= LOGIT_TOL, "%s: teacher-forced decode logits differ by %g", label, e_decode);
    CHECK(g4_seq_length(small, 0) == T + (int)r->n_decode);
    /* roll back 3 positions (within the ring) and replay them: same logits as before */
    CHECK(g4_seq_truncate(small, 0, T + (int)r->n_decode - 3, &err) == 0);
    for (size_t i = r->n_decode - 3; i < r->n_decode; i++) {
        g4_batch d = {.n_tokens = 1, .token = &r->decode_ids[i]};
        CHECK(g4_decode(small, &d, row, &err) == 0);
    }
    float e_replay = max_abs_diff(row, r->decode_logits + (r->n_decode - 1) * (size_t)V, (size_t)V);
    CHECKF(e_replay <= LOGIT_TOL, "%s: decode after a roll-back differs by %g", label, e_replay);
    /* a roll-back past the sliding blocks still held is refused, and the sequence stays usable */
    CHECK(g4_seq_truncate(small, 0, 10, &err) != 0 && strstr(err.msg, "released"));
    CHECK(g4_seq_length(small, 0) == T + (int)r->n_decode);
    CHECK(g4_seq_truncate(small, 0, T + 100, &err) != 0);

    /* 3. greedy: the whole prompt in one batch, then one token at a time (large context), and
     * the same through the small context's ring */
    g4_seq_reset(ctx, 0);
    g4_seq_reset(small, 0);
    CHECK(prefill(ctx, r->ids, T, 0, T, row) == 0);
    float *row_small = malloc((size_t)V * sizeof(float));
    CHECK(prefill(small, r->ids, T, 0, 3, row_small) == 0);
    int n_same_small = 0;
    int32_t got[64];
    int n_same = 0;
    for (size_t i = 0; i < r->n_greedy; i++) {
        got[i] = argmax_f32(row, V);
        n_same += got[i] == r->greedy[i];
        int32_t small_id = argmax_f32(row_small, V);
        n_same_small += small_id == r->greedy[i];
        g4_batch d = {.n_tokens = 1, .token = &got[i]};
        g4_batch ds = {.n_tokens = 1, .token = &small_id};
        if (g4_decode(ctx, &d, row, &err) || g4_decode(small, &ds, row_small, &err)) {
            CHECKF(0, "%s: greedy step %zu: %s", label, i, err.msg);
            break;
        }
    }
    CHECKF(n_same == (int)r->n_greedy, "%s: %d of %zu greedy tokens identical", label, n_same, r->n_greedy);
    CHECKF(n_same_small == (int)r->n_greedy, "%s: %d of %zu greedy tokens identical through recycled sliding blocks", label,
           n_same_small, r->n_greedy);
    free(row_small);
    g4_context_free(small);

    /* 4. two sequences of different lengths in one batch: sequence 1 prefills the prompt in
     * chunks of 7 while sequence 0 decodes the teacher-forced ids after a short prompt of 20
     * tokens (a prefix of the prompt); sequence 1's last logits must equal the full forward,
     * sequence 0's its own single-sequence run. */
    g4_seq_reset(ctx, 0);
    g4_seq_reset(ctx, 1);
    CHECK(prefill(ctx, r->ids, 20, 0, 20, row) == 0);
    float *solo = malloc((size_t)8 * V * sizeof(float));
    {
        /* single-sequence reference for seq 0: after the 20-token prompt, feed ids[20..27] */
        g4_context *ctx2;
        g4_context_params cp2 = {.n_seq_max = 1, .n_ctx = 64, .n_batch = 32};
        CHECK(g4_context_new(model, &cp2, &ctx2, &err) == 0);
        CHECK(prefill(ctx2, r->ids, 20, 0, 20, row) == 0);
        for (int i = 0; i < 8; i++) {
            g4_batch d = {.n_tokens = 1, .token = &r->ids[20 + i]};
            CHECK(g4_decode(ctx2, &d, solo + (size_t)i * V, &err) == 0);
        }
        g4_context_free(ctx2);
    }
    float e_mixed0 = 0, e_mixed1 = 0;
    float *mixed = malloc((size_t)2 * V * sizeof(float));
    int done1 = 0;
    for (int step = 0; step < 8; step++) {
        int32_t ids[16], seqs[16];
        uint8_t want[16];
        int n = 0, row1 = -1;
        ids[n] = r->ids[20 + step];
        seqs[n] = 0;
        want[n] = 1;
        n++;
        int take = T - done1 < 7 ? T - done1 : 7;
        for (int j = 0; j < take; j++) {
            ids[n] = r->ids[done1 + j];
            seqs[n] = 1;
            want[n] = (done1 + j == T - 1);
            if (want[n]) row1 = n;
            n++;
        }
        done1 += take;
        g4_batch mb = {.n_tokens = n, .token = ids, .seq = seqs, .want_logits = want};
        if (g4_decode(ctx, &mb, mixed, &err)) {
            CHECKF(0, "%s: mixed batch: %s", label, err.msg);
            break;
        }
        float e0 = max_abs_diff(mixed, solo + (size_t)step * V, (size_t)V);
        if (!(e0 <= e_mixed0)) e_mixed0 = e0;
        if (row1 >= 0) e_mixed1 = max_abs_diff(mixed + (size_t)V, r->logits + (size_t)(T - 1) * V, (size_t)V);
    }
    CHECKF(done1 == T, "%s: sequence 1 prefilled %d of %d", label, done1, T);
    CHECKF(e_mixed0 <= LOGIT_TOL, "%s: decode inside a mixed batch differs by %g", label, e_mixed0);
    CHECKF(e_mixed1 <= LOGIT_TOL, "%s: prefill inside a mixed batch differs by %g", label, e_mixed1);

    /* the context refuses to run past its size, and the error leaves it usable */
    g4_seq_reset(ctx, 0);
    int32_t many[64];
    for (int i = 0; i < 64; i++) many[i] = r->ids[i % T];
    CHECK(prefill(ctx, many, 64, 0, 64, row) == 0);
    CHECK(prefill(ctx, many, 64, 0, 64, row) == 0);
    g4_batch over = {.n_tokens = 1, .token = many};
    CHECK(g4_decode(ctx, &over, row, &err) != 0 && strstr(err.msg, "full"));
    int32_t bad = V;
    g4_batch badb = {.n_tokens = 1, .token = &bad};
    CHECK(g4_decode(ctx, &badb, row, &err) != 0 && strstr(err.msg, "vocabulary"));

    printf("%-28s logits %.2e  hidden(rel) %.2e  final(rel) %.2e  decode %.2e  greedy %d+%d/%zu  mixed %.2e/%.2e\n",
           label, e_logits, worst_hidden, rel_final, e_decode, n_same, n_same_small, r->n_greedy, e_mixed0, e_mixed1);
    free(mixed);
    free(solo);
    free(logits);
    free(hidden);
    free(fnorm);
    free(row);
    g4_context_free(ctx);
    g4_model_free(model);
}

/* Full-forward logits [T, V] of a model file or folder on the default device (the GPU where there is one), or as
 * params say (NULL: defaults); NULL on failure. */
static float *full_logits_with(const char *model, const reference *r, int *V, const g4_load_params *params) {
    g4_error err;
    g4_model *m;
    g4_load_params lp = params ? *params : (g4_load_params){.n_threads = test_threads()};
    if (g4_model_load(model, &lp, &m, &err)) {
        CHECKF(0, "%s: %s", model, err.msg);
        return NULL;
    }
    on_gpu = strcmp(g4_model_device(m), "cpu") != 0;
    *V = g4_model_vocab_size(m);
    g4_context *ctx;
    g4_context_params cp = {.n_seq_max = 1, .n_ctx = 64, .n_batch = 64};
    float *lg = malloc(r->n_ids * (size_t)*V * sizeof(float));
    g4_batch b = {.n_tokens = (int)r->n_ids, .token = r->ids};
    if (g4_context_new(m, &cp, &ctx, &err) || g4_decode(ctx, &b, lg, &err)) {
        CHECKF(0, "%s: %s", model, err.msg);
        free(lg);
        lg = NULL;
    }
    g4_context_free(ctx);
    g4_model_free(m);
    return lg;
}
static float *full_logits(const char *model, const reference *r, int *V) { return full_logits_with(model, r, V, NULL); }

static int quantize(const char *in, const char *out, const char *type) {
    g4_quantize_params p = {.in = in, .out = out, .type = type};
    g4_error err;
    if (g4_quantize(&p, &err)) {
        CHECKF(0, "quantize %s -> %s: %s", in, out, err.msg);
        return -1;
    }
    return 0;
}

/* Quantized weights. These fixtures are random, deep for their width and chaotic: rounding
 * ONE early matrix to 8 bits moves some logits by more than 1 (measured while writing this
 * test), and the error grows along the sequence through attention, so a tight bound against
 * reference.safetensors cannot hold for any correct 8-bit engine. The test therefore checks
 *  1. exactness: the quantized file run with float activations gives the logits of its own
 *     weights decoded to f32 by the reference decoder (a separate F32 file) within QUANT_EXACT_TOL;
 *  2. closeness to transformers, with the default int8 activations of Q8_0 and MLX: position 0 (no
 *     attention mixing yet) within 0.35, and the RMS error over all positions below 0.6 of the
 *     RMS of the reference logits (a 4-bit file, or an engine error, comes out near 1.0x;
 *     8-bit files measure 0.05 to 0.22 at position 0 and 0.2x to 0.49x RMS: the moe fixture's
 *     MLX8 file 0.43x with float activations, 0.49x with int8 ones on AVX-512 and AVX2).
 * (Float activations: G4_NO_INT8_ACT, honored by the CPU and the CUDA backend.)
 * On the GPU (the default device where there is one) the same checks run there: the quantized weights are
 * decoded in the GEMV (int8 activations of Q8_0 and MLX as the CPU's, float ones under G4_NO_INT8_ACT) and,
 * for the prompt's products, into bf16 tiles (cuda_blas.cu: rounded once, with the activations; hi + lo parts
 * under G4_NO_INT8_ACT), while the f32-decoded file runs f32 products; check 1 then allows QUANT_EXACT_TOL = 1e-2
 * (measured in the emulator on the 37-token prompts: 0.9e-3 to 2.9e-3 for Q8_0 and MLX8; an engine error, like
 * one matrix rounded once more to 8 bits, moves these chaotic fixtures' logits by more than 1). */
#define QUANT_EXACT_TOL (on_gpu ? 1e-2f : LOGIT_TOL)
static void check_quantized(const char *fixture, const char *name, const reference *r, const char *type) {
    char q[4096], dq[4096], rel[256];
    int gguf = type[0] == 'q';
    snprintf(rel, sizeof rel, "%s-%s%s", name, type, gguf ? ".gguf" : "");
    snprintf(q, sizeof q, "%s", g4t_tmp(rel));
    snprintf(rel, sizeof rel, "%s-%s-f32%s", name, type, gguf ? ".gguf" : "");
    snprintf(dq, sizeof dq, "%s", g4t_tmp(rel));
    if (quantize(fixture, q, type) || quantize(q, dq, "f32")) return;
    int V = 0, V2 = 0;
    if (!r->logits) return;
    setenv("G4_NO_INT8_ACT", "1", 1);
    float *exact = full_logits(q, r, &V), *deq = full_logits(dq, r, &V2);
    unsetenv("G4_NO_INT8_ACT");
    float *lg = full_logits(q, r, &V);
    const size_t T = r->n_ids;
    if (exact && deq && lg && V == V2) {
        float e = max_abs_diff(exact, deq, T * (size_t)V);
        CHECKF(e <= QUANT_EXACT_TOL, "%s %s: logits differ from its f32-decoded weights by %g", name, type, e);
        float e0 = max_abs_diff(lg, r->logits, (size_t)V);
        double se = 0, sr = 0;
        for (size_t i = 0; i < T * (size_t)V; i++) {
            se += ((double)lg[i] - r->logits[i]) * ((double)lg[i] - r->logits[i]);
            sr += (double)r->logits[i] * r->logits[i];
        }
        double rel_rms = sqrt(se / sr);
        CHECKF(e0 <= 0.35f, "%s %s: position-0 logits differ from transformers by %g", name, type, e0);
        CHECKF(rel_rms <= 0.6, "%s %s: RMS logit error %.3f of the reference RMS", name, type, rel_rms);
        printf("%-28s exact %.2e  position 0 %.3f  rms %.3f of the reference\n", type, e, e0, rel_rms);
    }
    free(exact);
    free(deq);
    free(lg);
}

/* bf16 activations (g4_load_params.bf16_activations) on the CPU, with every instruction set this CPU has
 * (AVX512_BF16: vdpbf16ps; the others: the rounded inputs through the f32 kernels): full-forward logits against
 * the numpy reference with the same rounding (tests/data/bf16act_reference.py: every product's input rounded to
 * bf16). Our f32 sums and numpy's differ in the last bits, so now and then an activation rounds to the other
 * bf16 neighbour (a step of 2^-8 relative), and these chaotic fixtures amplify that as they do for the bf16 KV
 * cache. Measured on the three fixtures, every instruction set: max |diff| 0.043 to 0.21 and RMS error 0.0045 to
 * 0.017 of the reference RMS (position 0 mostly within 1e-6); the same logits against the float32 reference:
 * 0.51 to 2.95 and 0.051 to 0.153. The bounds, max <= 0.35 and RMS <= 0.03, hold with margin and fail on every
 * fixture for an engine that ignores the mode (or rounds another way: one flip per product is as far).
 * The mixture of experts is the exception: its reference itself moves with numpy's summation order (its BLAS and
 * CPU): our logits were bit-identical on this machine and on the H200 host's CPU, the reference's were not, and
 * there the same engine measured 1.49 max / 0.068 RMS on `moe` (a routing flip), against 0.055-0.104 / 0.007-0.009
 * here. For a model with experts only position 0 is bounded (no attention mixing yet; measured 9.5e-7 on both
 * machines, while the float32 logits differ there by 2.3e-2), and the rest is printed. */
#define BF16ACT_MAX_TOL 0.35f
#define BF16ACT_RMS_TOL 0.03
#define BF16ACT_POS0_TOL 1e-3f
/* Runs tests/data/SCRIPT FIXTURE_DIR OUT with a python3 that has numpy (G4_PYTHON; the system one by default);
 * its exit status. */
static int numpy_reference(const char *script, const char *fixture_dir, const char *out) {
    char cmd[16384];
    const char *src = getenv("G4_SOURCE_DIR");
    const char *py = getenv("G4_PYTHON");
    snprintf(cmd, sizeof cmd, "'%s' '%s/tests/data/%s' '%s' '%s'", py ? py : "/usr/bin/python3", src ? src : ".",
             script, fixture_dir, out);
    return system(cmd);
}

/* n floats of a file, or NULL */
static float *read_f32(const char *path, size_t n) {
    FILE *f = fopen(path, "rb");
    float *x = malloc(n * sizeof(float));
    size_t got = f && x ? fread(x, sizeof(float), n, f) : 0;
    if (f) fclose(f);
    if (got != n) {
        free(x);
        return NULL;
    }
    return x;
}

static float *bf16act_reference(const char *fixture_dir, const char *label, size_t n) {
    char out[4096];
    snprintf(out, sizeof out, "%s.bf16act.f32", g4t_tmp(label));
    return numpy_reference("bf16act_reference.py", fixture_dir, out) == 0 ? read_f32(out, n) : NULL;
}

static void check_bf16_activations(const char *name, const char *fixture_dir, const reference *r) {
    g4_model *probe;
    g4_error err;
    g4_load_params lp = {.n_threads = test_threads(), .device = "cpu", .bf16_activations = 1};
    if (g4_model_load(fixture_dir, &lp, &probe, &err)) {
        CHECKF(0, "%s: %s", fixture_dir, err.msg);
        return;
    }
    const size_t V = (size_t)g4_model_vocab_size(probe), T = r->n_ids;
    const int experts = probe->cfg.text.enable_moe_block;
    g4_model_free(probe);
    float *want = bf16act_reference(fixture_dir, name, T * V);
    CHECKF(want != NULL, "%s: bf16act_reference.py did not run (a python3 with numpy: G4_PYTHON)", name);
    if (!want) return;
    const g4_cpu_kernels *best = g4_cpu_kernels_get();
    for (const char *const *isa = g4_cpu_isas; *isa; isa++) {
        const g4_cpu_kernels *k = g4_cpu_kernels_for(*isa);
        if (!k) continue;
        g4_cpu_kernels_use(k);
        int v = 0;
        float *lg = full_logits_with(fixture_dir, r, &v, &lp);
        if (lg && (size_t)v == V) {
            float e = max_abs_diff(lg, want, T * V), e32 = max_abs_diff(lg, r->logits, T * V);
            double se = 0, s32 = 0, sr = 0;
            for (size_t i = 0; i < T * V; i++) {
                se += ((double)lg[i] - want[i]) * ((double)lg[i] - want[i]);
                s32 += ((double)lg[i] - r->logits[i]) * ((double)lg[i] - r->logits[i]);
                sr += (double)want[i] * want[i];
            }
            if (experts)
                CHECKF(max_abs_diff(lg, want, V) <= BF16ACT_POS0_TOL,
                       "%s (%s, bf16 activations): position-0 logits differ from the bf16-activation reference by %g",
                       name, *isa, max_abs_diff(lg, want, V));
            else
                CHECKF(e <= BF16ACT_MAX_TOL && sqrt(se / sr) <= BF16ACT_RMS_TOL,
                       "%s (%s, bf16 activations): logits differ from the bf16-activation reference by %g (RMS %.3g "
                       "of the reference's)", name, *isa, e, sqrt(se / sr));
            printf("%-28s bf16 activations (%s%s): %.2e from the same-rounding reference (position 0 %.2e, rms %.2e), "
                   "%.3f from float32 (position 0 %.2e, rms %.2e)\n",
                   name, *isa, k->bf16x_tile ? ", vdpbf16ps" : "", e, max_abs_diff(lg, want, V), sqrt(se / sr), e32,
                   max_abs_diff(lg, r->logits, V), sqrt(s32 / sr));
        }
        free(lg);
    }
    g4_cpu_kernels_use(best);
    free(want);
}

/* Full-forward logits of the fixture's prompt with K/V rounded to bf16 / f16, from the numpy reference
 * (tests/data/kv16_reference.py); NULL when it cannot run. */
static float *kv16_reference(const char *fixture_dir, const char *label, const char *type, size_t n) {
    char prefix[4096], path[4200];
    snprintf(prefix, sizeof prefix, "%s", g4t_tmp(label));
    for (char *p = prefix + strlen(g4t_tmp("")); *p; p++)
        if (*p == ' ' || *p == '(' || *p == ')') *p = '_';
    snprintf(path, sizeof path, "%s.%s.f32", prefix, type);
    /* one run writes both */
    if (strcmp(type, "bf16") == 0 && numpy_reference("kv16_reference.py", fixture_dir, prefix) != 0) return NULL;
    return read_f32(path, n);
}

/* KV cache types and shared prefixes, on the shipped checkpoint:
 * - bf16 and f16 caches: full-forward logits within KV16_TOL of the numpy reference run with the same rounding
 *   of K and V (kv16_reference); against the float32 reference they differ far more on these random-weight
 *   fixtures (printed), since peaked attention amplifies the rounding; greedy tokens as the float32 reference
 *   when the rounding keeps them (printed, not required);
 * - sequence 1 takes sequence 0's first T-3 positions (g4_kv_cache_share: shared blocks, the last one partial)
 *   and replays the last 3 prompt tokens, while sequence 0 decodes on: both must match the reference, so a write
 *   into a shared block must have copied it first; and every block returns to its pool after a reset. */
/* Our K/V and the reference's differ in the last f32 bits, so a few elements round to the other bf16/f16
 * neighbour; these fixtures' peaked attention amplifies that to about 1e-2 (measured: at most 2.1e-2, against
 * 0.03 to 4.1 from the float32 reference) */
/* on the GPU: measured 6.6e-2 in the emulator (dense-keqv, bf16) */
#define KV16_TOL (on_gpu ? 1.5e-1f : 5e-2f)
static void check_kv_types_and_sharing(const char *label, const char *model_dir, const reference *r) {
    g4_error err;
    g4_model *model;
    g4_load_params lp = {.n_threads = test_threads()};
    if (g4_model_load(model_dir, &lp, &model, &err)) {
        CHECKF(0, "%s: load failed: %s", label, err.msg);
        return;
    }
    const int V = g4_model_vocab_size(model), T = (int)r->n_ids;
    on_gpu = strcmp(g4_model_device(model), "cpu") != 0;
    float *logits = malloc((size_t)T * V * sizeof(float)), *row = malloc((size_t)V * sizeof(float));
    const g4_kv_type types[2] = {G4_KV_BF16, G4_KV_F16};
    const char *type_names[2] = {"bf16", "f16"};
    float e16[2] = {0, 0}, e16_f32[2] = {0, 0};
    int same16[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        g4_context *ctx;
        g4_context_params cp = {.n_seq_max = 1, .n_ctx = 128, .n_batch = 64, .kv_type = types[k]};
        if (g4_context_new(model, &cp, &ctx, &err)) {
            CHECKF(0, "%s: context: %s", label, err.msg);
            continue;
        }
        g4_batch b = {.n_tokens = T, .token = r->ids};
        CHECK(g4_decode(ctx, &b, logits, &err) == 0);
        float *ref16 = kv16_reference(model_dir, label, type_names[k], (size_t)T * V);
        CHECKF(ref16 != NULL, "%s: no %s reference (needs /usr/bin/python3 or $G4_PYTHON with numpy)", label, type_names[k]);
        e16[k] = ref16 ? max_abs_diff(logits, ref16, (size_t)T * V) : 1e30f;
        e16_f32[k] = max_abs_diff(logits, r->logits, (size_t)T * V);
        free(ref16);
        CHECKF(e16[k] <= KV16_TOL, "%s: logits with a %s KV cache differ by %g", label, type_names[k], e16[k]);
        int32_t id = argmax_f32(logits + (size_t)(T - 1) * V, V);
        for (size_t i = 0; i < r->n_greedy; i++) {
            same16[k] += id == r->greedy[i];
            g4_batch d = {.n_tokens = 1, .token = &id};
            if (g4_decode_greedy(ctx, &d, &id, &err)) break;
        }
        g4_context_free(ctx);
    }

    g4_context *ctx;
    g4_context_params cp = {.n_seq_max = 2, .n_ctx = 128, .n_batch = 8, .kv_block_size = 4};
    CHECK(g4_context_new(model, &cp, &ctx, &err) == 0);
    const int free0 = g4_kv_free_blocks(ctx);
    CHECK(prefill(ctx, r->ids, T, 0, 8, row) == 0);
    CHECK(g4_kv_cache_share(&ctx->kv, 1, 0, T - 3, &err) == 0);
    CHECK(g4_kv_cache_share(&ctx->kv, 1, 0, T - 3, &err) != 0); /* sequence 1 is no longer empty */
    float e_shared = 0, e_owner = 0;
    CHECK(prefill(ctx, r->ids + T - 3, 3, 1, 3, row) == 0);
    e_shared = max_abs_diff(row, r->logits + (size_t)(T - 1) * V, (size_t)V);
    g4_batch d = {.n_tokens = 1, .token = &r->decode_ids[0]};
    CHECK(g4_decode(ctx, &d, row, &err) == 0);
    e_owner = max_abs_diff(row, r->decode_logits, (size_t)V);
    CHECKF(e_shared <= LOGIT_TOL, "%s: a sequence on a shared prefix differs by %g", label, e_shared);
    CHECKF(e_owner <= LOGIT_TOL, "%s: the prefix's owner differs by %g after the sharer wrote", label, e_owner);
    g4_seq_reset(ctx, 0);
    g4_seq_reset(ctx, 1);
    CHECKF(g4_kv_free_blocks(ctx) == free0, "%s: %d of %d blocks free after resets", label, g4_kv_free_blocks(ctx), free0);
    for (int t = 0; t < G4_LAYER_TYPES; t++)
        CHECK(!ctx->kv.pool[t].used || ctx->kv.pool[t].n_free == ctx->kv.pool[t].n_blocks);
    /* a pool too small for the step: a clear error, nothing taken */
    g4_context *tiny;
    g4_context_params tp = {.n_seq_max = 1, .n_ctx = 128, .n_batch = 64, .kv_block_size = 4, .n_kv_blocks = 2};
    CHECK(g4_context_new(model, &tp, &tiny, &err) == 0);
    g4_batch big = {.n_tokens = T, .token = r->ids};
    CHECK(g4_decode(tiny, &big, logits, &err) != 0 && strstr(err.msg, "KV cache is full"));
    CHECK(g4_seq_length(tiny, 0) == 0 && g4_kv_free_blocks(tiny) == 2);
    g4_context_free(tiny);
    printf("%-28s KV bf16 %.2e (vs f32 ref %.2e, greedy %d/%zu)  f16 %.2e (%.2e, %d/%zu)  shared prefix %.2e/%.2e\n",
           label, e16[0], e16_f32[0], same16[0], r->n_greedy, e16[1], e16_f32[1], same16[1], r->n_greedy, e_shared,
           e_owner);
    g4_context_free(ctx);
    free(logits);
    free(row);
    g4_model_free(model);
}

int main(void) {
    const char *fixtures[] = {"dense-ple", "dense-keqv", "moe"};
    for (size_t f = 0; f < sizeof fixtures / sizeof fixtures[0]; f++) {
        char dir[4096], rel[256];
        snprintf(rel, sizeof rel, "fixtures/%s", fixtures[f]);
        snprintf(dir, sizeof dir, "%s", g4t_shared(rel));
        reference r;
        if (load_reference(dir, &r)) {
            CHECKF(0, "%s: cannot read reference.safetensors", dir);
            continue;
        }
        check_model(fixtures[f], dir, &r);
        check_kv_types_and_sharing(fixtures[f], dir, &r);
        check_bf16_activations(fixtures[f], dir, &r);
        char label[128];
        const g4_cpu_kernels *best = g4_cpu_kernels_get();
        for (const char *const *isa = g4_cpu_isas; *isa; isa++) { /* the other instruction sets this CPU has */
            const g4_cpu_kernels *k = g4_cpu_kernels_for(*isa);
            if (!k || k == best) continue;
            g4_cpu_kernels_use(k);
            snprintf(label, sizeof label, "%s (%s)", fixtures[f], *isa);
            check_model(label, dir, &r);
        }
        g4_cpu_kernels_use(best);
        if (getenv("G4_DECODER_QUICK")) { /* emulated and sanitizer runs: the fixtures as shipped */
            free_reference(&r);
            continue;
        }

        char sharded[4096], f32[4096];
        snprintf(rel, sizeof rel, "%s-sharded", fixtures[f]);
        snprintf(sharded, sizeof sharded, "%s", g4t_tmp(rel));
        CHECKF(resave(dir, sharded, 3, 0, NULL) == 0, "re-saving %s as 3 shards", fixtures[f]);
        snprintf(label, sizeof label, "%s (3 shards)", fixtures[f]);
        check_model(label, sharded, &r);

        snprintf(rel, sizeof rel, "%s-f32", fixtures[f]);
        snprintf(f32, sizeof f32, "%s", g4t_tmp(rel));
        CHECKF(resave(dir, f32, 1, G4_F32, NULL) == 0, "re-saving %s as float32", fixtures[f]);
        snprintf(label, sizeof label, "%s (float32)", fixtures[f]);
        check_model(label, f32, &r);

        char gguf[4096];
        snprintf(rel, sizeof rel, "%s-bf16.gguf", fixtures[f]);
        snprintf(gguf, sizeof gguf, "%s", g4t_tmp(rel));
        if (quantize(dir, gguf, "bf16") == 0) {
            snprintf(label, sizeof label, "%s (GGUF BF16)", fixtures[f]);
            check_model(label, gguf, &r);
        }
        check_quantized(dir, fixtures[f], &r, "q8_0");
        check_quantized(dir, fixtures[f], &r, "mlx8");

        if (f == 0) { /* float16 weights (bf16 values of this size convert exactly, tiny ones round) */
            char f16[4096];
            snprintf(rel, sizeof rel, "%s-f16", fixtures[f]);
            snprintf(f16, sizeof f16, "%s", g4t_tmp(rel));
            CHECKF(resave(dir, f16, 1, G4_F16, NULL) == 0, "re-saving %s as float16", fixtures[f]);
            snprintf(label, sizeof label, "%s (float16)", fixtures[f]);
            check_model(label, f16, &r);
        }
        free_reference(&r);
    }
    return g4t_done();
}
