/* gemma4c serve -m DIR: the OpenAI-compatible HTTP server (src/server/, docs/server.md). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "server/server.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: gemma4c serve -m DIR|FILE [options]\n"
            "  --host ADDR          address to listen on (default 127.0.0.1: this machine only)\n"
            "  --port N             port (default 8080; 0: any free port)\n"
            "  --api-key KEY        require \"Authorization: Bearer KEY\" (also $GEMMA4C_API_KEY)\n"
            "  --parallel N         requests served at once (default: 4 on the CPU; on a GPU as many as its free\n"
            "                       memory holds the KV cache of, at most 128)\n"
            "  --ctx N              positions per request (default: the model's, at most 4096)\n"
            "  --alias NAME         the model name requests use (default: the folder's name)\n"
            "  -t THREADS           CPU threads (default: all cores)\n"
            "  --max-tokens N       most tokens one choice may generate (default: up to the context)\n"
            "  --max-queue N        requests waiting at most, then 503 (default 256)\n"
            "  --max-body BYTES     largest request body, then 413 (default 8388608)\n"
            "  --max-media N        image and audio parts per request (default 8)\n"
            "  --timeout S          close connections idle this long (default 60)\n"
            "  --request-timeout S  close a connection whose request has not arrived whole this long after it\n"
            "                       could start (default 120)\n"
            "  --max-connections N  open connections at most (default 1000)\n"
            "  --max-connections-per-ip N  from one address at most (default: no limit)\n"
            "  --drain S            on SIGTERM, let running requests finish this long (default 30)\n"
            "  --no-remote-media    refuse http(s) URLs of images and audio (default: fetched; data URLs always work)\n"
            "  --allowed-media-domains LIST  fetch media only from these hosts (comma-separated, each compared with\n"
            "                       the URL's host whole, on every redirect too; default: any host)\n"
            "  --allow-private-media-hosts  fetch media from loopback, private and link-local addresses too (default:\n"
            "                       only public addresses are contacted)\n"
            "  --max-media-bytes BYTES  largest file fetched from a URL (default 16777216)\n"
            "  --media-fetch-timeout S  a fetch, redirects included, at most (default 15)\n"
            "  --media-max-redirects N  redirects a fetch follows (default 5; 0: none)\n"
            "  --draft DIR|FILE     a gemma4_assistant drafter of the model: speculative decoding (not for requests\n"
            "                       with logprobs or constrained output)\n"
            "  --draft-n N          drafts per round (default: the drafter's num_assistant_tokens)\n"
            "  --quiet              no request log\n");
}

int cmd_serve(int argc, char **argv) {
    enum { O_HOST = 3000, O_PORT, O_KEY, O_PAR, O_CTX, O_ALIAS, O_MAXTOK, O_QUEUE, O_BODY, O_MEDIA, O_TIMEOUT,
           O_DRAIN, O_REMOTE, O_NO_REMOTE, O_DOMAINS, O_MEDIA_BYTES, O_FETCH_TIMEOUT, O_REDIRECTS, O_QUIET,
           O_REQ_TIMEOUT, O_MAX_CONN, O_MAX_CONN_IP, O_PRIVATE, O_DRAFT, O_DRAFT_N };
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},        {"threads", required_argument, 0, 't'},
        {"host", required_argument, 0, O_HOST},      {"port", required_argument, 0, O_PORT},
        {"api-key", required_argument, 0, O_KEY},    {"parallel", required_argument, 0, O_PAR},
        {"ctx", required_argument, 0, O_CTX},        {"alias", required_argument, 0, O_ALIAS},
        {"max-tokens", required_argument, 0, O_MAXTOK}, {"max-queue", required_argument, 0, O_QUEUE},
        {"max-body", required_argument, 0, O_BODY},  {"max-media", required_argument, 0, O_MEDIA},
        {"timeout", required_argument, 0, O_TIMEOUT}, {"drain", required_argument, 0, O_DRAIN},
        {"allow-remote-media", no_argument, 0, O_REMOTE}, {"no-remote-media", no_argument, 0, O_NO_REMOTE},
        {"allowed-media-domains", required_argument, 0, O_DOMAINS},
        {"allow-private-media-hosts", no_argument, 0, O_PRIVATE},
        {"max-media-bytes", required_argument, 0, O_MEDIA_BYTES},
        {"media-fetch-timeout", required_argument, 0, O_FETCH_TIMEOUT},
        {"media-max-redirects", required_argument, 0, O_REDIRECTS}, {"quiet", no_argument, 0, O_QUIET},
        {"request-timeout", required_argument, 0, O_REQ_TIMEOUT},
        {"max-connections", required_argument, 0, O_MAX_CONN},
        {"max-connections-per-ip", required_argument, 0, O_MAX_CONN_IP},
        {"draft", required_argument, 0, O_DRAFT},    {"draft-n", required_argument, 0, O_DRAFT_N},
        {"help", no_argument, 0, 'h'},               {0, 0, 0, 0}};
    srv_options o;
    srv_options_default(&o);
    o.api_key = getenv("GEMMA4C_API_KEY");
    if (o.api_key && !*o.api_key) o.api_key = NULL;
    long v;
    int c;
    optind = 1;
    opterr = 0;
#define INT_OPT(name, lo, hi, field)                                  \
    do {                                                              \
        if (cli_parse_int(optarg, name, lo, hi, &v)) return 1;        \
        field = v;                                                    \
    } while (0)
    while ((c = getopt_long(argc, argv, "m:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': o.model_path = optarg; break;
        case 't': INT_OPT("-t", 1, 1024, o.n_threads); break;
        case O_HOST: o.host = optarg; break;
        case O_PORT: INT_OPT("--port", 0, 65535, o.port); break;
        case O_KEY: o.api_key = optarg; break;
        case O_PAR: INT_OPT("--parallel", 1, 256, o.parallel); break;
        case O_CTX: INT_OPT("--ctx", 16, 1 << 20, o.n_ctx); break;
        case O_ALIAS: o.model_id = optarg; break;
        case O_MAXTOK: INT_OPT("--max-tokens", 1, 1 << 20, o.max_tokens); break;
        case O_QUEUE: INT_OPT("--max-queue", 1, 1 << 20, o.max_queue); break;
        case O_BODY: INT_OPT("--max-body", 1024, 1L << 30, o.max_body); break;
        case O_MEDIA: INT_OPT("--max-media", 0, 1024, o.max_media); break;
        case O_TIMEOUT: INT_OPT("--timeout", 1, 86400, o.timeout_s); break;
        case O_DRAIN: INT_OPT("--drain", 0, 86400, o.drain_s); break;
        case O_REQ_TIMEOUT: INT_OPT("--request-timeout", 1, 86400, o.request_timeout_s); break;
        case O_MAX_CONN: INT_OPT("--max-connections", 1, 100000, o.max_connections); break;
        case O_MAX_CONN_IP: INT_OPT("--max-connections-per-ip", 0, 100000, o.max_connections_per_ip); break;
        case O_REMOTE: o.allow_remote_media = 1; break; /* (the default; kept for scripts that name it) */
        case O_NO_REMOTE: o.allow_remote_media = 0; break;
        case O_DOMAINS: o.allowed_media_domains = optarg; break;
        case O_PRIVATE: o.allow_private_media = 1; break;
        case O_MEDIA_BYTES: INT_OPT("--max-media-bytes", 1024, 1L << 30, o.max_media_bytes); break;
        case O_FETCH_TIMEOUT: INT_OPT("--media-fetch-timeout", 1, 3600, o.media_fetch_timeout_s); break;
        case O_REDIRECTS: INT_OPT("--media-max-redirects", 0, 20, o.media_max_redirects); break;
        case O_QUIET: o.quiet = 1; break;
        case O_DRAFT: o.draft = optarg; break;
        case O_DRAFT_N: INT_OPT("--draft-n", 1, 256, o.n_draft); break;
        case 'h': usage(stdout); return 0;
        default: return cli_bad_option("serve", argv);
        }
    }
#undef INT_OPT
    if (optind < argc) return cli_error("serve: unexpected argument '%s'", argv[optind]);
    if (!o.model_path) return cli_error("serve: -m DIR is required");
    if (o.api_key && !*o.api_key) return cli_error("serve: --api-key must not be empty");
    if (o.n_draft && !o.draft) return cli_error("serve: --draft-n needs --draft DIR");
    if (o.allowed_media_domains && !o.allowed_media_domains[strspn(o.allowed_media_domains, ", ")])
        return cli_error("serve: --allowed-media-domains names no host (--no-remote-media refuses every URL)");
    o.device = cli_device;
    o.bf16_activations = cli_bf16_act;
    o.mmproj = cli_mmproj;
    o.kv_type = cli_kv;
    return srv_main(&o);
}
