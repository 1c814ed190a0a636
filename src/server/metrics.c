/* Prometheus text for the server (metrics.h). */
#include "server/metrics.h"

#include <stdlib.h>
#include <string.h>

#include "server/buf.h"

static const double bounds[SRV_HIST_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                1,     2.5,  5,     10,   30,  60,  120};
static const char *const endpoints[SRV_EP_COUNT] = {"/v1/chat/completions", "/v1/completions", "/v1/embeddings",
                                                    "/v1/models", "/health", "/metrics", "other"};

void srv_metrics_init(srv_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

void srv_metrics_destroy(srv_metrics *m) { pthread_mutex_destroy(&m->mu); }

static void observe(srv_histogram *h, double v) {
    int b = 0;
    while (b < SRV_HIST_BUCKETS && v > bounds[b]) b++;
    h->count[b]++;
    h->sum += v;
    h->n++;
}

void srv_metrics_request(srv_metrics *m, int endpoint, int status, double seconds) {
    int cls = status / 100;
    if (cls < 1 || cls > 5) cls = 5;
    pthread_mutex_lock(&m->mu);
    m->requests[endpoint][cls]++;
    if (endpoint <= SRV_EP_EMBEDDINGS) observe(&m->latency, seconds);
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_job(srv_metrics *m, const srv_job *j) {
    pthread_mutex_lock(&m->mu);
    if (j->finish == G4_FINISH_CANCELLED) m->cancelled++;
    if (!j->embed && j->n_generated > 0) {
        observe(&m->ttft, j->t_first - j->t_submit);
        if (j->n_generated > 1) observe(&m->tpot, (j->t_done - j->t_first) / (j->n_generated - 1));
    }
    pthread_mutex_unlock(&m->mu);
}

static void histogram(srv_buf *t, const char *name, const char *help, const srv_histogram *h) {
    srv_buf_printf(t, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    long long cum = 0;
    for (int b = 0; b < SRV_HIST_BUCKETS; b++) {
        cum += h->count[b];
        srv_buf_printf(t, "%s_bucket{le=\"%g\"} %lld\n", name, bounds[b], cum);
    }
    srv_buf_printf(t, "%s_bucket{le=\"+Inf\"} %lld\n%s_sum %.6f\n%s_count %lld\n", name, h->n, name, h->sum, name, h->n);
}

static void single(srv_buf *t, const char *name, const char *type, const char *help, long long v) {
    srv_buf_printf(t, "# HELP %s %s\n# TYPE %s %s\n%s %lld\n", name, help, name, type, name, v);
}

static void seconds(srv_buf *t, const char *name, const char *help, double v) {
    srv_buf_printf(t, "# HELP %s %s\n# TYPE %s counter\n%s %.6f\n", name, help, name, name, v);
}

char *srv_metrics_text(srv_metrics *m, const srv_engine_stats *st) {
    srv_buf t = {0};
    single(&t, "gemma4c_requests_queued", "gauge", "Generations and embeddings waiting for a sequence.", st->queued);
    single(&t, "gemma4c_requests_running", "gauge", "Generations and embeddings on a sequence.", st->running);
    single(&t, "gemma4c_kv_blocks_used", "gauge", "KV cache blocks in use (full-attention pool).", st->kv_blocks_used);
    single(&t, "gemma4c_kv_blocks_total", "gauge", "KV cache blocks (full-attention pool).", st->kv_blocks_total);
    single(&t, "gemma4c_prompt_tokens_total", "counter", "Prompt tokens of started requests.", st->prompt_tokens);
    single(&t, "gemma4c_prompt_tokens_cached_total", "counter", "Prompt tokens found in the KV cache.",
           st->cached_tokens);
    single(&t, "gemma4c_generated_tokens_total", "counter", "Tokens generated.", st->generated_tokens);
    single(&t, "gemma4c_batch_steps_total", "counter", "Batch steps run (each feeds every running request).",
           st->steps);
    single(&t, "gemma4c_draft_tokens_total", "counter", "Drafted tokens verified (serve --draft).", st->draft_tokens);
    single(&t, "gemma4c_draft_tokens_accepted_total", "counter", "Of the drafted tokens verified, those kept.",
           st->accepted_tokens);
    single(&t, "gemma4c_draft_steps_total", "counter",
           "Drafter steps run (the requests drafting after one batch step share them).", st->draft_steps);
    seconds(&t, "gemma4c_batch_step_seconds_total", "Wall time in batch steps.", st->step_seconds);
    seconds(&t, "gemma4c_draft_seconds_total", "Of the batch steps' time, the time in the drafter (serve --draft).",
            st->draft_seconds);
    seconds(&t, "gemma4c_model_seconds_total",
            "Of the batch steps' time, the time in the model's forward pass and on-device sampling.", st->model_seconds);
    seconds(&t, "gemma4c_worker_busy_seconds_total",
            "The engine thread's time with requests: batch steps and handing new requests to the scheduler.",
            st->busy_seconds);
    pthread_mutex_lock(&m->mu);
    single(&t, "gemma4c_generations_cancelled_total", "counter", "Generations cancelled (client gone, shutdown).",
           m->cancelled);
    srv_buf_printf(&t, "# HELP gemma4c_http_requests_total HTTP requests by endpoint and status class.\n"
            "# TYPE gemma4c_http_requests_total counter\n");
    for (int ep = 0; ep < SRV_EP_COUNT; ep++)
        for (int c = 1; c <= 5; c++)
            if (m->requests[ep][c])
                srv_buf_printf(&t, "gemma4c_http_requests_total{endpoint=\"%s\",status=\"%dxx\"} %lld\n", endpoints[ep], c,
                    m->requests[ep][c]);
    histogram(&t, "gemma4c_request_duration_seconds", "Time from a request's arrival to its last byte queued.",
              &m->latency);
    histogram(&t, "gemma4c_time_to_first_token_seconds", "Time from submission to the first generated token.",
              &m->ttft);
    histogram(&t, "gemma4c_time_per_output_token_seconds", "Time per generated token after the first.", &m->tpot);
    pthread_mutex_unlock(&m->mu);
    if (t.failed) {
        free(t.p);
        return NULL;
    }
    return t.p;
}
