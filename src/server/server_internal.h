/* What the server's HTTP layer (server.c) and its endpoints (endpoints.c) share. */
#ifndef G4_SERVER_SERVER_INTERNAL_H
#define G4_SERVER_SERVER_INTERNAL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "gemma4c.h"
#include "server/api.h"
#include "server/buf.h"
#include "server/engine.h"
#include "server/metrics.h"
#include "server/server.h"

/* A connection as the request deadline sees it (opt.request_timeout_s): from MHD's connection notification, in
 * srv_state's list under `socks_lock`. */
typedef struct srv_sock {
    int fd;
    double since;   /* when it began waiting for its current request */
    int serving;    /* a whole request is in (dispatched), until its reply is done */
    int cut;        /* shut down by the deadline */
    struct srv_sock *prev, *next;
} srv_sock;

typedef struct srv_state {
    srv_options opt;
    pthread_mutex_t socks_lock;
    srv_sock *socks;               /* the open connections */
    g4_model *model;
    g4_drafter *drafter; /* --draft, or NULL */
    const g4_tokenizer *tok;       /* NULL: ids only */
    const g4_chat_template *tpl;   /* NULL: no chat */
    char model_id[256];
    long long created;             /* when the model was loaded (unix seconds) */
    int tool_role;                 /* the template reads role "tool" messages */
    int32_t tool_call_token;       /* the token that starts a tool call (<|tool_call>), -1: none */
    srv_limits limits;
    srv_engine *engine;
    srv_metrics metrics;
    atomic_int draining;
    atomic_int in_flight;          /* requests between dispatch and completion */
    atomic_int stopping;           /* the drain is over: waiting requests give up */
} srv_state;

/* One HTTP request (MHD's per-request pointer). */
typedef struct srv_conn {
    srv_state *s;
    struct MHD_Connection *mc;
    int endpoint;                  /* SRV_EP_* */
    int method;                    /* 'G', 'P', 'H' (HEAD), other 0 */
    srv_buf body;
    size_t discarded;              /* bytes of an oversized body dropped */
    int too_big;
    double t_start;
    srv_sock *sock;                /* its connection's */
    int status;                    /* the status sent (for metrics and the log) */
    int dispatched;                /* counted in in_flight */
    /* a generation or embedding request */
    srv_group *group;
    srv_request *req;              /* in group->data */
    int n_prompts;
    int *n_prompt;                 /* [n_prompts] prompt tokens */
    char id[48];
    long long created;
    /* streaming */
    srv_buf out;
    size_t out_pos;
    int *taken;                    /* [n_jobs] events consumed */
    unsigned char *finished_sent;  /* [n_jobs] */
    int *n_tool_calls;             /* [n_jobs] */
    int stream_over;
    int gone;                      /* the client left */
} srv_conn;

/* Seconds on the monotonic clock. */
double srv_now(void);
/* 1 when the client of c has closed its connection (checked without blocking). */
int srv_client_gone(srv_conn *c);

/* Turns the connection's idle timeout (--timeout) off while the engine works on its request, and on again
 * (its clock restarted) once there is something to send: a slow client is one that does not read. */
void srv_idle_timeout(srv_conn *c, int on);
/* Queues a response: JSON text (taken), an error, or plain text. Return MHD_YES/MHD_NO. */
enum MHD_Result srv_reply_json(srv_conn *c, int status, char *json);
enum MHD_Result srv_reply_error(srv_conn *c, const srv_error *e);
enum MHD_Result srv_reply_text(srv_conn *c, int status, const char *content_type, char *text);

/* The endpoints (endpoints.c): called once the whole body is in. */
enum MHD_Result srv_handle_generate(srv_conn *c, srv_kind kind);
enum MHD_Result srv_handle_embeddings(srv_conn *c);
enum MHD_Result srv_handle_models(srv_conn *c, const char *id);
enum MHD_Result srv_handle_health(srv_conn *c);
enum MHD_Result srv_handle_metrics(srv_conn *c);
/* Frees what srv_handle_* left in c (the group, buffers). */
void srv_conn_release(srv_conn *c);

#endif
