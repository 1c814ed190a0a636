/* gemma4c serve: the HTTP layer (libmicrohttpd, www.gnu.org/software/libmicrohttpd/manual) and the
 * server's life: load, serve, drain, exit.
 *
 * Threads: libmicrohttpd runs one thread per connection (MHD_USE_THREAD_PER_CONNECTION), so an endpoint
 * may block while the engine works: a plain request waits for its jobs, a streaming one's content reader
 * waits for the next events. Both wake every 100 ms to see whether the client is still there (a peer that
 * closed its socket reads as end of file): a client that leaves has its jobs cancelled at once, and
 * their sequences and KV blocks go back to the engine.
 * Limits: the body size (413 before the body is read when Content-Length says so), header size
 * (libmicrohttpd's 431), an idle-connection timeout (clients that stop sending), a deadline for a request to
 * arrive whole (clients that send a byte a second: a watchdog thread shuts their socket down), a connection
 * limit, in all and per address, the engine's queue (503 when full); per request, tokens and media (api.h), and
 * for media fetched from http(s) URLs their size, time, redirects and hosts (fetch.h).
 * Shutdown: SIGTERM or SIGINT stops accepting connections, answers new requests on open connections with
 * 503, lets in-flight requests finish (at most --drain seconds; a second signal cancels them), then
 * exits 0. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/fetch.h"
#include "server/server_internal.h"

void srv_options_default(srv_options *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->parallel = 0; /* sized by the memory (srv_engine_auto_parallel) */
    o->max_queue = 256;
    o->max_body = 8u << 20;
    o->max_media = 8;
    o->allow_remote_media = 1;
    o->max_media_bytes = 16u << 20;
    o->media_fetch_timeout_s = 15;
    o->media_max_redirects = 5;
    o->timeout_s = 60;
    o->request_timeout_s = 120;
    o->max_connections = 1000;
    o->drain_s = 30;
    o->kv_type = -1;
}

double srv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int srv_client_gone(srv_conn *c) {
    if (c->gone) return 1;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c->mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLERR | POLLHUP | POLLRDHUP | POLLNVAL)) return c->gone = 1;
    char b;
    ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) c->gone = 1;
    return c->gone; /* data waiting (a pipelined request) is not a departure */
}

void srv_idle_timeout(srv_conn *c, int on) {
    /* setting a timeout after none restarts its clock (libmicrohttpd's MHD_CONNECTION_OPTION_TIMEOUT) */
    MHD_set_connection_option(c->mc, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    if (on) MHD_set_connection_option(c->mc, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)c->s->opt.timeout_s);
}

/* ----------------------------------------------------------------- replies */

static enum MHD_Result reply(srv_conn *c, int status, const char *content_type, char *data, size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, data, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(data);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    if (atomic_load(&c->s->draining)) MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    c->status = status;
    srv_idle_timeout(c, 1); /* the time the engine took is not the client's idleness */
    enum MHD_Result ok = MHD_queue_response(c->mc, (unsigned)status, r);
    MHD_destroy_response(r);
    return ok;
}

enum MHD_Result srv_reply_json(srv_conn *c, int status, char *json) {
    if (!json) {
        srv_error e;
        srv_fail(&e, 500, NULL, NULL, "out of memory");
        return srv_reply_error(c, &e);
    }
    return reply(c, status, "application/json", json, strlen(json));
}

enum MHD_Result srv_reply_error(srv_conn *c, const srv_error *e) {
    char *json = srv_error_json(e);
    if (!json) return MHD_NO;
    return reply(c, e->status, "application/json", json, strlen(json));
}

enum MHD_Result srv_reply_text(srv_conn *c, int status, const char *content_type, char *text) {
    if (!text) return MHD_NO;
    return reply(c, status, content_type, text, strlen(text));
}

/* ----------------------------------------------------------------- routing */

static int route(const char *url, const char **model_id) {
    *model_id = NULL;
    if (!strcmp(url, "/v1/chat/completions")) return SRV_EP_CHAT;
    if (!strcmp(url, "/v1/completions")) return SRV_EP_COMPLETIONS;
    if (!strcmp(url, "/v1/embeddings")) return SRV_EP_EMBEDDINGS;
    if (!strcmp(url, "/v1/models")) return SRV_EP_MODELS;
    if (!strncmp(url, "/v1/models/", 11)) {
        *model_id = url + 11;
        return SRV_EP_MODELS;
    }
    if (!strcmp(url, "/health")) return SRV_EP_HEALTH;
    if (!strcmp(url, "/metrics")) return SRV_EP_METRICS;
    return SRV_EP_OTHER;
}

/* ------------------------------------------------------ request deadline */

/* A connection is born or dies (MHD_OPTION_NOTIFY_CONNECTION; libmicrohttpd calls the "closed" one before it
 * closes the socket, so a listed fd is the connection's own). */
static void on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    srv_state *s = cls;
    srv_sock *k = *socket_context;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!ci || !(k = calloc(1, sizeof *k))) return; /* (out of memory: that connection has no deadline) */
        k->fd = ci->connect_fd;
        k->since = srv_now();
        pthread_mutex_lock(&s->socks_lock);
        if ((k->next = s->socks)) k->next->prev = k;
        s->socks = k;
        pthread_mutex_unlock(&s->socks_lock);
        *socket_context = k;
    } else if (k) {
        pthread_mutex_lock(&s->socks_lock);
        if (k->prev) k->prev->next = k->next;
        else s->socks = k->next;
        if (k->next) k->next->prev = k->prev;
        pthread_mutex_unlock(&s->socks_lock);
        free(k);
        *socket_context = NULL;
    }
}

static void sock_serving(srv_state *s, srv_sock *k, int on) {
    if (!k) return;
    pthread_mutex_lock(&s->socks_lock);
    k->serving = on;
    k->since = srv_now();
    pthread_mutex_unlock(&s->socks_lock);
}

/* Every 250 ms: connections whose request has not arrived whole within the deadline are shut down (libmicrohttpd
 * then sees the socket end and closes the connection; its request, never dispatched, had nothing running). */
static void *deadline_watch(void *arg) {
    srv_state *s = arg;
    const struct timespec tick = {0, 250 * 1000 * 1000};
    while (!atomic_load(&s->stopping)) {
        nanosleep(&tick, NULL);
        const double now = srv_now();
        int n = 0;
        pthread_mutex_lock(&s->socks_lock);
        for (srv_sock *k = s->socks; k; k = k->next)
            if (!k->serving && !k->cut && now - k->since > s->opt.request_timeout_s) {
                shutdown(k->fd, SHUT_RDWR);
                k->cut = 1, n++;
            }
        pthread_mutex_unlock(&s->socks_lock);
        if (n && !s->opt.quiet)
            fprintf(stderr, "gemma4c serve: closed %d connection(s) whose request did not arrive within %d s\n", n,
                    s->opt.request_timeout_s);
    }
    return NULL;
}

static enum MHD_Result dispatch(srv_conn *c, const char *url) {
    srv_state *s = c->s;
    srv_error e;
    const char *model_id;
    route(url, &model_id);
    /* in flight from here: a request whose body is still coming has nothing to lose, so the drain on SIGTERM does
     * not wait for it (a client sending one byte a second would hold the exit for --drain seconds) */
    if (!c->dispatched) c->dispatched = 1, atomic_fetch_add(&s->in_flight, 1);
    if (c->too_big)
        return srv_fail(&e, 413, NULL, "request_too_large", "The request body is larger than %zu bytes.",
                        s->opt.max_body),
               srv_reply_error(c, &e);
    if (c->endpoint == SRV_EP_HEALTH && c->method != 'G' && c->method != 'H')
        return srv_fail(&e, 405, NULL, "method_not_allowed", "/health takes GET (or HEAD) requests."),
               srv_reply_error(c, &e);
    if (c->endpoint == SRV_EP_HEALTH) return srv_handle_health(c);
    if (s->opt.api_key && !srv_check_api_key(MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "Authorization"),
                                             s->opt.api_key))
        return srv_fail(&e, 401, NULL, "invalid_api_key", "Incorrect API key provided."), srv_reply_error(c, &e);
    if (c->endpoint == SRV_EP_OTHER)
        return srv_fail(&e, 404, NULL, "unknown_url", "Unknown request URL: %.200s.", url), srv_reply_error(c, &e);
    const int want_post = c->endpoint <= SRV_EP_EMBEDDINGS;
    if (c->method != (want_post ? 'P' : 'G') && (want_post || c->method != 'H'))
        return srv_fail(&e, 405, NULL, "method_not_allowed", "%.200s takes %s requests.", url, want_post ? "POST" : "GET (or HEAD)"),
               srv_reply_error(c, &e);
    if (want_post && atomic_load(&s->draining))
        return srv_fail(&e, 503, NULL, "shutting_down", "The server is shutting down."), srv_reply_error(c, &e);
    switch (c->endpoint) {
    case SRV_EP_CHAT: return srv_handle_generate(c, SRV_CHAT);
    case SRV_EP_COMPLETIONS: return srv_handle_generate(c, SRV_COMPLETION);
    case SRV_EP_EMBEDDINGS: return srv_handle_embeddings(c);
    case SRV_EP_MODELS: return srv_handle_models(c, model_id);
    default: return srv_handle_metrics(c);
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    srv_state *s = cls;
    srv_conn *c = *con_cls;
    if (!c) { /* the headers are in */
        if (!(c = calloc(1, sizeof *c))) return MHD_NO;
        c->s = s;
        c->mc = mc;
        c->t_start = srv_now();
        const union MHD_ConnectionInfo *si = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        c->sock = si ? si->socket_context : NULL;
        c->method = !strcmp(method, "GET") ? 'G' : !strcmp(method, "POST") ? 'P' : !strcmp(method, "HEAD") ? 'H' : 0;
        const char *unused;
        c->endpoint = route(url, &unused);
        *con_cls = c;
        const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->opt.max_body) { /* refused before the body is read */
            c->too_big = 1;
            return dispatch(c, url);
        }
        /* so is a large body (or one of unknown length) without the key: a client that has not got it cannot make
         * the server hold --max-body bytes per connection. A small one is read first, so that the client, still
         * sending it, is not reset before it reads its 401. */
        if (s->opt.api_key && c->endpoint != SRV_EP_HEALTH && (!cl || strtoull(cl, NULL, 10) > 65536) &&
            !srv_check_api_key(MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Authorization"), s->opt.api_key))
            return dispatch(c, url);
        return MHD_YES;
    }
    if (*upload_size) {
        if (c->body.len + *upload_size > s->opt.max_body) c->too_big = 1;
        if (c->too_big) {
            c->discarded += *upload_size;
            if (c->discarded > 4 * s->opt.max_body) return MHD_NO; /* an endless upload: drop the connection */
        } else {
            srv_buf_put(&c->body, upload, *upload_size);
        }
        *upload_size = 0;
        return MHD_YES;
    }
    sock_serving(s, c->sock, 1); /* the request is in whole: no deadline while it is served */
    if (c->body.failed) {
        srv_error e;
        return srv_fail(&e, 500, NULL, NULL, "out of memory"), srv_reply_error(c, &e);
    }
    (void)version;
    return dispatch(c, url);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls, enum MHD_RequestTerminationCode why) {
    srv_state *s = cls;
    srv_conn *c = *con_cls;
    (void)mc;
    if (!c) return;
    if (why != MHD_REQUEST_TERMINATED_COMPLETED_OK) {
        c->gone = 1;
        if (!c->status) c->status = 499; /* the client left first (nginx's code) */
    }
    if (c->group) srv_group_cancel(c->group); /* a no-op for jobs that are done */
    sock_serving(s, c->sock, 0);              /* the next request's deadline starts now */
    srv_metrics_request(&s->metrics, c->endpoint, c->status ? c->status : 500, srv_now() - c->t_start);
    if (!s->opt.quiet && c->endpoint <= SRV_EP_EMBEDDINGS)
        fprintf(stderr, "gemma4c serve: %s %d %.3fs%s\n",
                c->endpoint == SRV_EP_CHAT ? "chat" : c->endpoint == SRV_EP_COMPLETIONS ? "completions" : "embeddings",
                c->status, srv_now() - c->t_start, c->gone ? " (client gone)" : "");
    srv_conn_release(c);
    srv_buf_free(&c->body);
    if (c->dispatched) atomic_fetch_sub(&s->in_flight, 1);
    free(c);
    *con_cls = NULL;
}

/* -------------------------------------------------------------- life cycle */

static void on_job_finished(const srv_job *j, void *user) {
    srv_state *s = user;
    srv_metrics_job(&s->metrics, j);
}

static void log_mhd(void *cls, const char *fmt, va_list ap) {
    const srv_state *s = cls;
    if (s->opt.quiet) return;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    line[strcspn(line, "\n")] = 0;
    fprintf(stderr, "gemma4c serve: %s\n", line);
}

/* Whether the chat template reads role "tool" messages: a probe conversation rendered both ways. */
static int template_reads_tool_role(const g4_chat_template *t) {
    static const char probe[] =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"tool_calls\": "
        "[{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {}}}]}, "
        "{\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"G4PROBE\"}]}";
    g4_chat *chat = NULL;
    char *out = NULL;
    size_t len;
    int yes = 0;
    if (t && g4_chat_new(t, probe, &chat, NULL) == 0 && g4_chat_render(chat, &out, &len, NULL) == 0)
        yes = strstr(out, "<|tool_response>") && strstr(out, "G4PROBE") && !strstr(out, "<|turn>tool");
    g4_free(out);
    g4_chat_free(chat);
    return yes;
}

/* The id of the token that starts a tool call in Gemma's format, -1 where the vocabulary has none. */
static int32_t tool_call_token(const g4_tokenizer *tok) {
    static const char text[] = "<|tool_call>";
    g4_tokens t = {0};
    char *back = NULL;
    size_t len = 0;
    int32_t id = -1;
    if (tok && g4_tokenize(tok, text, sizeof text - 1, 0, &t, NULL) == 0 && t.n == 1 &&
        g4_detokenize(tok, t.ids, 1, 0, &back, &len, NULL) == 0 && len == sizeof text - 1 && !memcmp(back, text, len))
        id = t.ids[0];
    g4_free(back);
    g4_free(t.ids);
    return id;
}

static int resolve_host(const char *host, int port, struct sockaddr_storage *ss, socklen_t *len, int *ipv6) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    if (getaddrinfo(host, ps, &hints, &res) || !res) return -1;
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    *ipv6 = res->ai_family == AF_INET6;
    freeaddrinfo(res);
    return 0;
}

static int bound_port(struct MHD_Daemon *d) {
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    return di ? di->port : -1;
}

static void model_name(const char *path, char *out, size_t cap) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/') b--;
    snprintf(out, cap, "%.*s", (int)(n - b), path + b);
}

int srv_main(const srv_options *o) {
    srv_state *s = calloc(1, sizeof *s);
    if (!s) return fprintf(stderr, "gemma4c: out of memory\n"), 1;
    s->opt = *o;
    atomic_init(&s->draining, 0);
    atomic_init(&s->in_flight, 0);
    atomic_init(&s->stopping, 0);
    srv_metrics_init(&s->metrics);
    pthread_mutex_init(&s->socks_lock, NULL);
    pthread_t watch;
    int watching = 0, fetching = 0;
    int rc = 1;
    g4_error err;
    struct MHD_Daemon *d = NULL;

    /* signals: every thread started from here on blocks them; this one waits for them */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (srv_fetch_global_init()) { /* (before any thread: libcurl's global state) */
        fprintf(stderr, "gemma4c: serve: libcurl cannot start\n");
        goto done;
    }
    fetching = 1;
    g4_load_params lp = {.n_threads = o->n_threads, .device = o->device, .bf16_activations = o->bf16_activations,
                         .mmproj = o->mmproj};
    if (g4_model_load(o->model_path, &lp, &s->model, &err)) {
        fprintf(stderr, "gemma4c: %s\n", err.msg);
        goto done;
    }
    if (g4_model_warnings(s->model)) fprintf(stderr, "%s", g4_model_warnings(s->model));
    s->tok = g4_model_tokenizer(s->model);
    s->tpl = g4_model_chat_template(s->model);
    s->tool_role = template_reads_tool_role(s->tpl);
    s->tool_call_token = s->tpl ? tool_call_token(s->tok) : -1;
    s->created = (long long)time(NULL);
    if (o->model_id) snprintf(s->model_id, sizeof s->model_id, "%s", o->model_id);
    else model_name(o->model_path, s->model_id, sizeof s->model_id);
    int n_ctx = o->n_ctx ? o->n_ctx : g4_model_n_ctx_train(s->model);
    if (!o->n_ctx && n_ctx > 4096) n_ctx = 4096;
    if (n_ctx > g4_model_n_ctx_train(s->model)) { /* as the other commands say it */
        fprintf(stderr, "gemma4c: --ctx %d exceeds the model's max_position_embeddings %d\n", n_ctx,
                g4_model_n_ctx_train(s->model));
        goto done;
    }
    const g4_kv_type kv = o->kv_type >= 0 ? (g4_kv_type)o->kv_type : g4_model_kv_type_preferred(s->model);
    char sized[256] = "";
    if (o->draft && g4_drafter_load(o->draft, s->model, &s->drafter, &err)) {
        fprintf(stderr, "gemma4c: %s\n", err.msg);
        goto done;
    }
    const int parallel =
        o->parallel ? o->parallel : srv_engine_auto_parallel(s->model, s->drafter, n_ctx, kv, sized, sizeof sized);
    if (srv_engine_new(s->model, s->drafter, o->n_draft, parallel, n_ctx, kv, o->max_queue, on_job_finished, s,
                       &s->engine, &err)) {
        fprintf(stderr, "gemma4c: %s\n", err.msg);
        goto done;
    }
    s->limits = (srv_limits){.max_tokens = o->max_tokens, .max_n = 16, .max_prompts = 64, .max_media = o->max_media,
                             .allow_remote_media = o->allow_remote_media, .vocab_size = g4_model_vocab_size(s->model),
                             .hidden_size = g4_model_hidden_size(s->model),
                             .have_vision = g4_image_max_tokens(s->model, 0) > 0,
                             .have_audio = g4_audio_rate(s->model) > 0};

    struct sockaddr_storage addr;
    socklen_t addr_len;
    int ipv6;
    if (resolve_host(o->host, o->port, &addr, &addr_len, &ipv6)) {
        fprintf(stderr, "gemma4c: serve: cannot resolve --host %s\n", o->host);
        goto done;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG | (ipv6 ? MHD_USE_IPv6 : 0);
    d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, log_mhd, s,
                         MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                         MHD_OPTION_NOTIFY_CONNECTION, on_connection, s, MHD_OPTION_CONNECTION_TIMEOUT,
                         (unsigned)o->timeout_s, MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_connections,
                         MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)o->max_connections_per_ip,
                         MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1, MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "gemma4c: serve: cannot listen on %s port %d: %s\n", o->host, o->port, strerror(errno));
        goto done;
    }
    fprintf(stderr, "gemma4c serve: %s on http://%s%s%s:%d (parallel %d%s%s%s, context %d%s%s)\n", s->model_id,
            ipv6 ? "[" : "", o->host, ipv6 ? "]" : "", bound_port(d), parallel, *sized ? ": " : "", sized,
            *sized ? "; --parallel sets it" : "", srv_engine_n_ctx(s->engine), s->drafter ? ", drafter " : "",
            s->drafter ? o->draft : "");
    watching = pthread_create(&watch, NULL, deadline_watch, s) == 0;
    if (!watching) fprintf(stderr, "gemma4c serve: no request deadline (cannot start its thread)\n");

    int sig = 0;
    while (sigwait(&sigs, &sig) != 0) {
    }
    fprintf(stderr, "gemma4c serve: %s: draining %d request(s)\n", sig == SIGTERM ? "SIGTERM" : "SIGINT",
            atomic_load(&s->in_flight));
    atomic_store(&s->draining, 1);
    MHD_socket listener = MHD_quiesce_daemon(d);
    if (listener != MHD_INVALID_SOCKET) shutdown(listener, SHUT_RDWR); /* refuse new connections now */
    const double until = srv_now() + o->drain_s;
    struct timespec tick = {0, 50 * 1000 * 1000};
    while (atomic_load(&s->in_flight) > 0) {
        siginfo_t si;
        if (srv_now() > until || sigtimedwait(&sigs, &si, &tick) > 0) { /* out of time, or asked again */
            fprintf(stderr, "gemma4c serve: cancelling %d request(s)\n", atomic_load(&s->in_flight));
            break;
        }
    }
    atomic_store(&s->stopping, 1);
    MHD_stop_daemon(d); /* closes the connections left; their requests are cancelled */
    d = NULL;
    if (listener != MHD_INVALID_SOCKET) close(listener);
    rc = 0;
done:
    atomic_store(&s->stopping, 1);
    if (watching) pthread_join(watch, NULL);
    if (d) MHD_stop_daemon(d);
    srv_engine_free(s->engine);
    g4_drafter_free(s->drafter);
    g4_model_free(s->model);
    srv_metrics_destroy(&s->metrics);
    pthread_mutex_destroy(&s->socks_lock);
    if (fetching) srv_fetch_global_cleanup();
    free(s);
    return rc;
}
