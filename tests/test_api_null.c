/* Every public call (gemma4c.h) given NULL handles or pointers, negative or missing counts, or called in an order
 * it does not allow returns its error value (-1 with a one-line message, or the getter's 0 / -1 / NULL) instead of
 * crashing. Each call runs in a child process, so that one crash is reported and the rest still run. */
#include <limits.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "gemma4c.h"

static const char *FIXTURE = "fixtures/dense-ple";

static g4_error E;

/* Runs `expr` in a child; the check passes when the child exits normally and `ok` (which may read rc and E) holds. */
#define ISOLATED(expr, ok)                                                                                        \
    do {                                                                                                          \
        g4t_checks++;                                                                                             \
        fflush(stdout);                                                                                           \
        fflush(stderr);                                                                                           \
        pid_t pid_ = fork();                                                                                       \
        if (pid_ == 0) {                                                                                         \
            memset(&E, 0, sizeof E);                                                                              \
            long long rc = (long long)(expr);                                                                     \
            (void)rc;                                                                                             \
            _exit((ok) ? 0 : 1);                                                                                  \
        }                                                                                                         \
        int wst_ = 0;                                                                                              \
        waitpid(pid_, &wst_, 0);                                                                                     \
        if (!WIFEXITED(wst_) || WEXITSTATUS(wst_)) {                                                                  \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,                                         \
                    WIFSIGNALED(wst_) ? strsignal(WTERMSIG(wst_)) : "not the error value with a one-line message");   \
            g4t_failures++;                                                                                       \
        }                                                                                                         \
    } while (0)

#define ONE_LINE (E.msg[0] && !strchr(E.msg, '\n'))
static int one_line(const g4_error *err) { return err->msg[0] && !strchr(err->msg, '\n'); }
/* a call that can fail: -1 and a message */
#define FAILS(expr) ISOLATED(expr, rc == -1 && ONE_LINE)
/* a getter or a void call: the given value, or just no crash */
#define GIVES(expr, want) ISOLATED(expr, rc == (long long)(want))
#define SURVIVES(expr) ISOLATED(((expr), 0), 1)

static int test_nulls(g4_model *m, g4_context *ctx) {
    int32_t ids[4] = {2, 10, 11, 12};
    float out[64];
    int n;
    size_t len;
    char *s;
    const char *txt;
    const int32_t *cids;
    g4_model *mo;
    g4_context *co;
    g4_tokenizer *tk;
    g4_chat_template *ct;
    g4_chat *chat;
    g4_chat_message msg;
    g4_tokens toks = {0};
    g4_event ev;
    g4_image img = {0};
    g4_soft_tokens st;
    float *pcm, *embd;
    int32_t *oids;
    int no, ne;
    g4_sampler *smp;
    g4_sampler_params sp;
    g4_sampler_params_default(&sp);
    g4_generation *g;
    g4_scheduler *sch;
    g4_drafter *dr;
    g4_spec *spc;
    g4_batch b = {.n_tokens = 4, .token = ids};

    /* model */
    FAILS(g4_model_load(NULL, NULL, &mo, &E));
    FAILS(g4_model_load(g4t_shared(FIXTURE), NULL, NULL, &E));
    GIVES(g4_model_vocab_size(NULL), 0);
    GIVES(g4_model_n_layers(NULL), 0);
    GIVES(g4_model_hidden_size(NULL), 0);
    GIVES(g4_model_n_ctx_train(NULL), 0);
    GIVES(g4_model_device(NULL) != NULL, 0);
    GIVES(g4_model_warnings(NULL) != NULL, 0);
    GIVES(g4_model_chat_template_error(NULL) != NULL, 0);
    GIVES(g4_model_tokenizer(NULL) != NULL, 0);
    GIVES(g4_model_chat_template(NULL) != NULL, 0);
    SURVIVES(g4_model_kv_type_preferred(NULL));
    GIVES(g4_model_decode_bytes(NULL, 0, G4_KV_F32), 0);
    GIVES(g4_model_copy_bandwidth(NULL), 0);
    GIVES(g4_model_eos_ids(NULL, &cids), 0);
    SURVIVES(g4_model_eos_ids(m, NULL));
    SURVIVES(g4_model_sampler_params(NULL, &sp));
    SURVIVES(g4_model_sampler_params(m, NULL));
    FAILS(g4_quantize(NULL, &E));
    /* context */
    FAILS(g4_context_new(NULL, NULL, &co, &E));
    FAILS(g4_context_new(m, NULL, NULL, &E));
    GIVES(g4_context_model(NULL) != NULL, 0);
    GIVES(g4_context_n_ctx(NULL), 0);
    SURVIVES(g4_seq_reset(NULL, 0));
    FAILS(g4_seq_truncate(NULL, 0, 0, &E));
    GIVES(g4_seq_length(NULL, 0), -1);
    GIVES(g4_seq_tokens(NULL, 0, &n) != NULL, 0);
    GIVES(g4_seq_tokens(ctx, 0, NULL) != NULL, 1);
    GIVES(g4_seq_reuse_prefix(NULL, 0, ids, 4), 0);
    GIVES(g4_seq_reuse_prefix(ctx, 0, NULL, 4), 0);
    GIVES(g4_kv_free_blocks(NULL), 0);
    GIVES(g4_kv_bytes(NULL), 0);
    GIVES(g4_kv_bytes_needed(NULL, NULL, &E), 0);
    GIVES(g4_context_fit_sequences(NULL, NULL, 4, NULL, &E), -1);
    FAILS(g4_model_memory(NULL, NULL, NULL, &E));
    SURVIVES(g4_context_capture(NULL, NULL, NULL));
    FAILS(g4_decode(NULL, &b, out, &E));
    FAILS(g4_decode(ctx, NULL, out, &E));
    FAILS(g4_decode(ctx, &(g4_batch){.n_tokens = 4}, out, &E));
    FAILS(g4_decode_greedy(NULL, &b, ids, &E));
    FAILS(g4_decode_greedy(ctx, NULL, ids, &E));
    FAILS(g4_embed(NULL, 0, ids, 4, out, &E));
    FAILS(g4_embed(ctx, 0, NULL, 4, out, &E));
    FAILS(g4_embed(ctx, 0, ids, 4, NULL, &E));
    GIVES(g4_count_soft_tokens(NULL, ids, 4), 0);
    GIVES(g4_count_soft_tokens(m, NULL, 4), 0);
    FAILS(g4_step_length(NULL, ids, 4, 2, &E));
    /* images and audio */
    FAILS(g4_image_decode(NULL, 10, NULL, &img, &E));
    FAILS(g4_image_decode("abcd", 4, NULL, NULL, &E));
    FAILS(g4_image_load(NULL, NULL, &img, &E));
    FAILS(g4_image_encode(NULL, &img, 0, &st, &E));
    FAILS(g4_image_encode(m, NULL, 0, &st, &E));
    GIVES(g4_image_max_tokens(NULL, 0), 0);
    FAILS(g4_audio_load(NULL, 16000, &pcm, &len, &E));
    FAILS(g4_audio_decode(NULL, 10, "x", 16000, &pcm, &len, &E));
    FAILS(g4_audio_decode("abcdefgh", 8, "x", 16000, NULL, NULL, &E));
    GIVES(g4_audio_rate(NULL), 0);
    FAILS(g4_audio_encode(NULL, out, 16, &st, &E));
    FAILS(g4_audio_encode(m, NULL, 16, &st, &E));
    FAILS(g4_prompt_expand(NULL, ids, 4, NULL, 0, &oids, &no, &embd, &ne, &E));
    FAILS(g4_prompt_expand(m, ids, 4, NULL, 3, &oids, &no, &embd, &ne, &E));
    FAILS(g4_prompt_expand(m, ids, 4, NULL, 0, NULL, NULL, NULL, NULL, &E));
    FAILS(g4_soft_tokens_gather(NULL, ids, 4, NULL, 0, &embd, &ne, &E));
    FAILS(g4_soft_tokens_gather(m, NULL, 4, NULL, 0, &embd, &ne, &E));
    /* tokenizer */
    FAILS(g4_tokenizer_load(NULL, &tk, &E));
    FAILS(g4_tokenizer_load("/nonexistent/tokenizer.json", NULL, &E));
    FAILS(g4_tokenizer_load_dir(NULL, &tk, &E));
    GIVES(g4_tokenizer_vocab_size(NULL), 0);
    GIVES(g4_tokenizer_bos_id(NULL), -1);
    GIVES(g4_tokenizer_eos_id(NULL), -1);
    GIVES(g4_tokenizer_token_id(NULL, "a"), -1);
    GIVES(g4_tokenizer_piece(NULL, 0) != NULL, 0);
    GIVES(g4_tokenizer_is_special(NULL, 0), 0);
    FAILS(g4_tokenize(NULL, "a", 1, 0, &toks, &E));
    FAILS(g4_detokenize(NULL, ids, 4, 0, &s, &len, &E));
    FAILS(g4_detokenize(NULL, ids, 4, 0, NULL, &len, &E));
    GIVES(g4_detok_stream_new(NULL, 0) != NULL, 0);
    FAILS(g4_detok_stream_push(NULL, 2, &txt, &len, &E));
    GIVES(g4_detok_stream_flush(NULL, &txt, &len), -1);
    /* chat */
    FAILS(g4_chat_template_load_dir(NULL, &ct, &E));
    FAILS(g4_chat_template_load_dir(g4t_shared(FIXTURE), NULL, &E));
    FAILS(g4_chat_template_load_file(NULL, NULL, NULL, &ct, &E));
    FAILS(g4_chat_template_load_file_config(NULL, NULL, &ct, &E));
    FAILS(g4_chat_new(NULL, NULL, NULL, &E));
    FAILS(g4_chat_add(NULL, "user", "x", &E));
    FAILS(g4_chat_add_json(NULL, "{}", &E));
    SURVIVES(g4_chat_pop(NULL));
    SURVIVES(g4_chat_clear(NULL));
    GIVES(g4_chat_n_messages(NULL), 0);
    FAILS(g4_chat_render(NULL, &s, &len, &E));
    FAILS(g4_chat_parse(NULL, 5, &msg, &E));
    FAILS(g4_chat_parse("a", 1, NULL, &E));
    /* sampler */
    SURVIVES(g4_sampler_params_default(NULL));
    FAILS(g4_sampler_new(&sp, 100, NULL, &E));
    GIVES(g4_sampler_sample(NULL, out), -1);
    SURVIVES(g4_sampler_seed(NULL, 1));
    SURVIVES(g4_sampler_accept_many(NULL, ids, 4));
    if (g4_sampler_new(&sp, 100, &smp, &E) == 0) {
        GIVES(g4_sampler_sample(smp, NULL), -1);
        SURVIVES(g4_sampler_accept_many(smp, NULL, 4));
        g4_sampler_free(smp);
    }
    /* speculative decoding */
    FAILS(g4_drafter_load(NULL, m, &dr, &E));
    FAILS(g4_drafter_load(g4t_shared(FIXTURE), NULL, &dr, &E));
    FAILS(g4_drafter_load(g4t_shared(FIXTURE), m, NULL, &E));
    GIVES(g4_drafter_n_draft(NULL), 0);
    FAILS(g4_spec_new(NULL, 0, NULL, NULL, &spc, &E));
    FAILS(g4_spec_new(ctx, 0, NULL, NULL, &spc, &E));
    FAILS(g4_spec_prefill(NULL, ids, 4, out, &E));
    FAILS(g4_spec_round(NULL, 1, 4, NULL, ids, &n, &E));
    FAILS(g4_spec_draft(NULL, 1, 4, ids, &E));
    SURVIVES(g4_spec_rounds(NULL, NULL, NULL, &n));
    /* generation */
    FAILS(g4_generation_start(NULL, 0, ids, 4, NULL, &g, &E));
    FAILS(g4_generation_start(ctx, 0, ids, 4, NULL, NULL, &E));
    FAILS(g4_generation_start(ctx, 0, ids, 4, &(g4_generation_params){.n_stop_ids = 3}, &g, &E));
    FAILS(g4_generation_start(ctx, 0, ids, 4, &(g4_generation_params){.n_media = 2}, &g, &E));
    FAILS(g4_chat_start(NULL, ctx, 0, NULL, &g, &E));
    FAILS(g4_generation_next(NULL, &ev, &E));
    FAILS(g4_generation_run(NULL, NULL, NULL, &E));
    FAILS(g4_generation_step(NULL, NULL, NULL, &E));
    SURVIVES(g4_generation_cancel(NULL));
    GIVES(g4_generation_finish(NULL), G4_FINISH_NONE);
    GIVES(g4_generation_tokens(NULL, &n) != NULL, 0);
    GIVES(g4_generation_logprobs(NULL, NULL, NULL, NULL), -1);
    SURVIVES(g4_generation_rounds(NULL, NULL, NULL, &n));
    GIVES(g4_generation_n_cached(NULL), 0);
    FAILS(g4_generation_message(NULL, &msg, &E));
    FAILS(g4_chat_add_reply(NULL, NULL, &E));
    GIVES(g4_generation_error(NULL) != NULL, 0);
    GIVES(g4_generation_embedding(NULL) != NULL, 0);
    if (g4_generation_start(ctx, 0, ids, 4, NULL, &g, &E) == 0) {
        FAILS(g4_generation_next(g, NULL, &E));
        FAILS(g4_generation_message(g, NULL, &E));
        SURVIVES(g4_generation_tokens(g, NULL));
        SURVIVES(g4_generation_rounds(g, NULL, NULL, NULL));
        g4_generation_free(g);
    }
    /* scheduler */
    FAILS(g4_scheduler_new(NULL, &sch, &E));
    FAILS(g4_scheduler_new(ctx, NULL, &E));
    FAILS(g4_scheduler_submit(NULL, ids, 4, NULL, NULL, NULL, &g, &E));
    FAILS(g4_scheduler_submit_chat(NULL, NULL, NULL, NULL, NULL, &g, &E));
    FAILS(g4_scheduler_submit_embed(NULL, ids, 4, NULL, NULL, &g, &E));
    FAILS(g4_scheduler_step(NULL, &E));
    SURVIVES(g4_scheduler_get_stats(NULL, &(g4_scheduler_stats){0}));
    if (g4_scheduler_new(ctx, &sch, &E) == 0) {
        FAILS(g4_scheduler_submit(sch, ids, 4, NULL, NULL, NULL, NULL, &E));
        FAILS(g4_scheduler_submit_chat(sch, NULL, NULL, NULL, NULL, &g, &E));
        SURVIVES(g4_scheduler_get_stats(sch, NULL));
        g4_scheduler_free(sch);
    }
    (void)chat;
    return 0;
}

/* Calls in an order the API does not allow, and sizes it does not take. */
static void test_misuse(g4_model *m) {
    g4_error err;
    g4_context *ctx = NULL;
    /* negative sizes are errors (0 takes the default; they were taken as 0) */
    g4_context_params bad[] = {{.n_seq_max = -1}, {.n_ctx = -5}, {.n_batch = -2}, {.kv_block_size = -5}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ctx = NULL;
        CHECKF(g4_context_new(m, &bad[i], &ctx, &err) == -1 && !ctx && one_line(&err), "context params %zu", i);
        g4_context_free(ctx);
    }
    /* a scheduler takes every sequence of its context: no second scheduler, no generation or embedding beside it */
    g4_context_params cp = {.n_seq_max = 2, .n_ctx = 64, .n_batch = 16, .kv_history = -1};
    g4_scheduler *s = NULL, *s2 = NULL;
    if (g4_context_new(m, &cp, &ctx, &err) || g4_scheduler_new(ctx, &s, &err)) {
        CHECKF(0, "%s", err.msg);
        g4_context_free(ctx);
        return;
    }
    int32_t ids[4] = {2, 10, 11, 12};
    float *emb = malloc((size_t)g4_model_hidden_size(m) * sizeof *emb);
    g4_generation *g = NULL;
    CHECK(g4_scheduler_new(ctx, &s2, &err) == -1 && !s2 && one_line(&err));
    CHECK(g4_generation_start(ctx, 0, ids, 4, NULL, &g, &err) == -1 && !g && one_line(&err));
    CHECK(g4_embed(ctx, 0, ids, 4, emb, &err) == -1 && one_line(&err));
    g4_scheduler_free(s);
    /* once it is freed the context is free for them again */
    CHECKF(g4_embed(ctx, 0, ids, 4, emb, &err) == 0, "%s", err.msg);
    CHECKF(g4_generation_start(ctx, 0, ids, 4, NULL, &g, &err) == 0, "%s", err.msg);
    g4_generation_free(g);
    CHECKF(g4_scheduler_new(ctx, &s, &err) == 0, "%s", err.msg);
    g4_scheduler_free(s);
    free(emb);
    g4_context_free(ctx);
}

int main(void) {
    g4_error err;
    g4_model *m;
    g4_context *ctx;
    g4_load_params lp = {.n_threads = 1, .device = "cpu"};
    if (g4_model_load(g4t_shared(FIXTURE), &lp, &m, &err)) {
        printf("no %s: skipped (%s)\n", FIXTURE, err.msg);
        return 77;
    }
    g4_context_params cp = {.n_seq_max = 2, .n_ctx = 64, .n_batch = 16};
    if (g4_context_new(m, &cp, &ctx, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    test_nulls(m, ctx);
    test_misuse(m);
    g4_context_free(ctx);
    g4_model_free(m);
    return g4t_done();
}
