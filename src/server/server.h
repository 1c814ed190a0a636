/* gemma4c serve: an OpenAI-compatible HTTP server (docs/server.md) on libmicrohttpd and jansson, built on
 * the public library API (gemma4c.h) alone. */
#ifndef G4_SERVER_SERVER_H
#define G4_SERVER_SERVER_H

#include <stddef.h>

typedef struct srv_options {
    const char *model_path;   /* -m DIR|FILE */
    const char *model_id;     /* the "model" requests name (default: the folder's name) */
    const char *host;         /* default 127.0.0.1 (loopback) */
    int port;                 /* default 8080; 0: any free port (printed) */
    const char *api_key;      /* NULL: no key */
    const char *device;       /* NULL: automatic */
    int bf16_activations;     /* g4_load_params.bf16_activations (--bf16-act) */
    const char *mmproj;       /* g4_load_params.mmproj (--mmproj FILE) */
    const char *draft;        /* a drafter (--draft DIR|FILE): speculative decoding; NULL: none */
    int n_draft;              /* drafts per round (--draft-n; 0: the drafter's default) */
    int kv_type;              /* a g4_kv_type (--kv); -1: g4_model_kv_type_preferred */
    int n_threads;            /* 0: all cores */
    int parallel;             /* sequences served at once (0: sized by the memory, srv_engine_auto_parallel) */
    int n_ctx;                /* positions per sequence (default: the model's, at most 4096) */
    int max_tokens;           /* per choice; 0: until the context is full */
    int max_queue;            /* jobs waiting at most (default 256): then 503 */
    size_t max_body;          /* bytes (default 8 MiB): then 413 */
    int max_media;            /* image/audio parts per request (default 8) */
    int timeout_s;            /* an idle connection is closed after it (default 60) */
    int request_timeout_s;    /* a request must have arrived whole this long after its connection was ready for
                               * it (connected, or the previous reply sent), else the connection is closed (default
                               * 120): a client that sends a byte a second is never idle */
    int max_connections;      /* open connections at most (default 1000) */
    int max_connections_per_ip; /* from one address at most (default 0: no limit) */
    int drain_s;              /* on SIGTERM, in-flight requests get this long to finish (default 30) */
    int allow_remote_media;   /* fetch http(s) URLs of images and audio (default 1; --no-remote-media: 0) */
    const char *allowed_media_domains; /* NULL: any host; else the hosts media may be fetched from, comma-separated
                                        * (--allowed-media-domains) */
    int allow_private_media;  /* fetch from addresses that are not public: loopback, private, link-local (default 0;
                               * --allow-private-media-hosts: 1) */
    size_t max_media_bytes;   /* a fetched file's size at most (default 16 MiB) */
    int media_fetch_timeout_s; /* a fetch, redirects included, at most (default 15) */
    int media_max_redirects;  /* redirects a fetch follows at most (default 5) */
    int quiet;                /* no request log on stderr */
} srv_options;

void srv_options_default(srv_options *o);
/* Loads the model, serves until SIGTERM or SIGINT (then drains in-flight requests), frees everything.
 * Returns the process exit status (errors are printed as one line). */
int srv_main(const srv_options *o);

#endif
