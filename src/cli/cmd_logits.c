/* gemma4c logits -m DIR --ids 2,17,99 [--image FILE ...] [--audio FILE ...] -o out.f32
 * One full forward of the ids; writes little-endian float32 logits [n_ids, vocab]. With images or audio,
 * the ids hold the expanded soft-token placeholders (as transformers' processor writes input_ids) and each
 * kind's placeholders take its files' soft tokens in order (their counts must match). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_common.h"
#include "cli/cli_media.h"
#include "cli/commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: gemma4c logits -m DIR --ids 2,17,99 -o OUT.f32|- [--image FILE ...] [--budget N] [--audio FILE ...]\n"
            "                [-t THREADS]\n"
            "Writes float32 logits [n_ids, vocab] (little-endian) for every position of one forward pass.\n"
            "  --image FILE   fills the ids' image placeholders, in order (repeatable)\n"
            "  --audio FILE   fills the ids' audio placeholders, in order (repeatable)\n"
            "  --budget N     soft tokens per image at most: 70, 140, 280, 560 or 1120 (default: the model's)\n");
}

int cmd_logits(int argc, char **argv) {
    enum { OPT_IMAGE = 2000, OPT_BUDGET, OPT_AUDIO };
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},   {"ids", required_argument, 0, 'i'},
                                         {"output", required_argument, 0, 'o'},  {"threads", required_argument, 0, 't'},
                                         {"image", required_argument, 0, OPT_IMAGE}, {"budget", required_argument, 0, OPT_BUDGET},
                                         {"audio", required_argument, 0, OPT_AUDIO}, {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *dir = NULL, *ids_s = NULL, *out = NULL;
    long threads = 0, budget = 0;
    int c;
    cli_media_files files = {0};
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "m:o:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': dir = optarg; break;
        case 'i': ids_s = optarg; break;
        case 'o': out = optarg; break;
        case 't':
            if (cli_parse_int(optarg, "--threads", 0, 1024, &threads)) return 1;
            break;
        case OPT_IMAGE:
        case OPT_AUDIO:
            if (cli_media_file(&files, "logits", optarg, c == OPT_AUDIO)) return 1;
            break;
        case OPT_BUDGET:
            if (cli_parse_int(optarg, "--budget", 1, 1 << 20, &budget)) return 1;
            break;
        case 'h': usage(stdout); return 0;
        default: return cli_bad_option("logits", argv);
        }
    }
    if (optind < argc) return cli_error("logits: unexpected argument '%s'", argv[optind]);
    if (!ids_s) return cli_error("logits: --ids is required");
    if (!out) return cli_error("logits: -o OUT.f32 is required");
    g4_error err;
    int32_t *ids;
    int n;
    if (cli_parse_ids(ids_s, &ids, &n, &err)) return cli_error("%s", err.msg);
    g4_model *m = cli_load_model(dir, (int)threads);
    if (!m) {
        free(ids);
        return 1;
    }
    int rc = 1;
    const int V = g4_model_vocab_size(m);
    g4_context *ctx = NULL;
    float *logits = NULL, *embd = NULL;
    FILE *f = NULL;
    cli_media md = {0};
    int n_embd = 0;
    if (cli_media_add_files(&md, m, &files, (int)budget)) goto done;
    if (md.n && g4_soft_tokens_gather(m, ids, n, md.items, md.n, &embd, &n_embd, &err)) {
        cli_error("logits: %s", err.msg);
        goto done;
    }
    /* a step holds at least one whole image */
    int batch = n < 512 ? n : 512;
    for (int i = 0; i < md.n; i++)
        if (md.items[i].kind == G4_MEDIA_IMAGE && md.items[i].n_tokens > batch)
            batch = md.items[i].n_tokens < n ? md.items[i].n_tokens : n;
    g4_context_params cp = {.n_seq_max = 1, .n_ctx = n, .n_batch = batch, .kv_type = cli_kv_type(m)};
    if (g4_context_new(m, &cp, &ctx, &err)) {
        cli_error("%s", err.msg);
        goto done;
    }
    logits = malloc((size_t)batch * V * sizeof(float));
    f = cli_open_output(out);
    if (!logits || !f) {
        cli_error("%s: %s", out, logits ? "cannot open for writing" : "out of memory");
        goto done;
    }
    for (int i = 0, k, used = 0; i < n; i += k) {
        if ((k = g4_step_length(m, ids + i, n - i, batch, &err)) < 0) {
            cli_error("%s", err.msg);
            goto done;
        }
        g4_batch b = {.n_tokens = k, .token = ids + i};
        if (embd) { /* this step's placeholders take the next rows */
            b.embd = embd + (size_t)used * g4_model_hidden_size(m);
            b.n_embd = g4_count_soft_tokens(m, ids + i, k);
        }
        used += b.n_embd;
        if (g4_decode(ctx, &b, logits, &err)) {
            cli_error("%s", err.msg);
            goto done;
        }
        if (fwrite(logits, sizeof(float), (size_t)k * V, f) != (size_t)k * V) {
            cli_error("%s: write failed", out);
            goto done;
        }
    }
    if (cli_close_output(f) != 0) {
        f = NULL;
        cli_error("%s: write failed", out);
        goto done;
    }
    f = NULL;
    rc = 0;
done:
    if (f) cli_close_output(f);
    if (rc) cli_remove_output(out);
    free(logits);
    free(ids);
    g4_free(embd);
    cli_media_truncate(&md, 0);
    g4_context_free(ctx);
    g4_model_free(m);
    return rc;
}
