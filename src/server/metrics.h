/* Server metrics in Prometheus' text exposition format (prometheus.io/docs/instrumenting/exposition_formats):
 * requests by endpoint and status, request latency, time to first token and time per output token as
 * histograms; the engine's gauges (queued, running, KV blocks) and token counters are read at scrape time. */
#ifndef G4_SERVER_METRICS_H
#define G4_SERVER_METRICS_H

#include <pthread.h>

#include "server/engine.h"

#define SRV_HIST_BUCKETS 14

typedef struct srv_histogram {
    long long count[SRV_HIST_BUCKETS + 1]; /* per bucket (not cumulative); the last: above every bound */
    double sum;
    long long n;
} srv_histogram;

enum { SRV_EP_CHAT, SRV_EP_COMPLETIONS, SRV_EP_EMBEDDINGS, SRV_EP_MODELS, SRV_EP_HEALTH, SRV_EP_METRICS, SRV_EP_OTHER,
       SRV_EP_COUNT };

typedef struct srv_metrics {
    pthread_mutex_t mu;
    long long requests[SRV_EP_COUNT][6]; /* by status class: 1xx..5xx, [0] unused */
    long long cancelled;                 /* generations cancelled (client gone, shutdown) */
    srv_histogram latency, ttft, tpot;   /* seconds: whole request, to the first token, per later token */
} srv_metrics;

void srv_metrics_init(srv_metrics *m);
void srv_metrics_destroy(srv_metrics *m);
void srv_metrics_request(srv_metrics *m, int endpoint, int status, double seconds);
/* A finished generation job (from the engine's worker). */
void srv_metrics_job(srv_metrics *m, const srv_job *j);
/* The whole exposition (malloc'ed). */
char *srv_metrics_text(srv_metrics *m, const srv_engine_stats *st);

#endif
