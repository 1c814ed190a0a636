/* gemma4c embed: embeddings of JSON lines, all at once through the scheduler.
 *   gemma4c embed -m DIR -f FILE.jsonl     {"text": ...} (BOS added) or {"ids": [...]} per line;
 *                                          prints {"embedding": [...]} per line, in input order
 * The embedding is the mean over the line's positions of the final hidden state (after the final
 * norm: transformers' last_hidden_state), hidden_size floats. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_batch.h"
#include "cli/cli_common.h"
#include "cli/cli_text.h"
#include "cli/commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: gemma4c embed -m DIR -f FILE [options]\n"
            "  -f FILE        JSON lines ('-': standard input): {\"text\": TEXT} (BOS added) or {\"ids\": [...]};\n"
            "                 prints {\"embedding\": [...]} (the mean of the final hidden states, hidden_size\n"
            "                 floats) or {\"error\": ...} per line, in input order\n"
            "  --parallel P   lines computed at once (default 8)\n"
            "  --no-bos       do not add the BOS token to TEXT\n"
            "  -m DIR (model folder)  -t THREADS  --ctx N (longest line in tokens)\n");
}

typedef struct {
    const g4_model *model;
    int add_bos;
} embed_job;

static int embed_submit(const json_t *line, long index, g4_scheduler *s, void *user, g4_generation **out,
                        g4_grammar **grammar, g4_error *err) {
    (void)grammar;
    const embed_job *job = user;
    int n;
    int32_t *ids = cli_batch_line_ids(line, "text", job->add_bos, job->model, &n, err);
    if (!ids) return -1;
    int rc = g4_scheduler_submit_embed(s, ids, n, NULL, NULL, out, err);
    free(ids);
    return rc;
}

static json_t *embed_result(const g4_generation *g, void *user, g4_error *err) {
    const embed_job *job = user;
    const float *e = g4_generation_embedding(g);
    if (!e) return g4_fail(err, "no embedding (the request was cancelled)"), NULL;
    json_t *arr = json_array();
    for (int h = 0; arr && h < g4_model_hidden_size(job->model); h++) json_array_append_new(arr, json_real(e[h]));
    return json_pack("{s:o}", "embedding", arr);
}

int cmd_embed(int argc, char **argv) {
    enum { OPT_CTX = 2000, OPT_PARALLEL, OPT_NO_BOS };
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"file", required_argument, 0, 'f'},
                                         {"threads", required_argument, 0, 't'},
                                         {"ctx", required_argument, 0, OPT_CTX},
                                         {"parallel", required_argument, 0, OPT_PARALLEL},
                                         {"no-bos", no_argument, 0, OPT_NO_BOS},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    cli_sampling smp;
    cli_sampling_init(&smp);
    const char *file = NULL;
    long parallel = 8;
    int no_bos = 0, c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "m:f:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': smp.model_dir = optarg; break;
        case 'f': file = optarg; break;
        case 't':
            if (cli_parse_int(optarg, "--threads", 0, 1024, &smp.threads)) return 1;
            break;
        case OPT_CTX:
            smp.have_ctx = 1;
            if (cli_parse_int(optarg, "--ctx", 16, 1 << 24, &smp.n_ctx)) return 1;
            break;
        case OPT_PARALLEL:
            if (cli_parse_int(optarg, "--parallel", 1, 65536, &parallel)) return 1;
            break;
        case OPT_NO_BOS: no_bos = 1; break;
        case 'h': usage(stdout); return 0;
        default: return cli_bad_option("embed", argv);
        }
    }
    if (optind < argc) return cli_error("embed: unexpected argument '%s' (see --help)", argv[optind]);
    if (!smp.model_dir || !file) return cli_error("embed: give -m DIR and -f FILE (see --help)");
    cli_text_model tm;
    if (cli_text_open(&smp, 0, (int)parallel, &tm)) return 1;
    embed_job job = {tm.model, !no_bos};
    g4_scheduler *s;
    g4_error err;
    int rc = 1;
    if (g4_scheduler_new(tm.ctx, &s, &err) == 0) {
        rc = cli_batch_run("embed", file, s, 2 * (int)parallel, embed_submit, embed_result, &job);
        g4_scheduler_free(s);
    } else {
        cli_error("%s", err.msg);
    }
    cli_text_close(&tm);
    return rc;
}
