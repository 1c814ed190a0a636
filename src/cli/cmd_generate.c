/* gemma4c generate -m DIR --ids 2,17,99 -n 24 --temp 0
 * Prefills the ids, then generates through the KV cache; prints the generated ids
 * on one line, comma-separated. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "engine/generate.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: gemma4c generate -m DIR --ids 2,17,99 [-n N] [--temp 0] [--ignore-eos] [-t THREADS]\n"
            "Prints the generated token ids, comma-separated, on one line.\n");
}

int cmd_generate(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},   {"ids", required_argument, 0, 'i'},
        {"n-predict", required_argument, 0, 'n'}, {"temp", required_argument, 0, 'T'},
        {"threads", required_argument, 0, 't'}, {"ignore-eos", no_argument, 0, 'E'},
        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0}};
    const char *dir = NULL, *ids_s = NULL;
    long n_new = 128, threads = 0;
    double temp = 0.0;
    int ignore_eos = 0, c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "m:n:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': dir = optarg; break;
        case 'i': ids_s = optarg; break;
        case 'n':
            if (cli_parse_int(optarg, "-n", 1, 1 << 20, &n_new)) return 1;
            break;
        case 'T':
            if (cli_parse_float(optarg, "--temp", 0.0, 100.0, &temp)) return 1;
            break;
        case 't':
            if (cli_parse_int(optarg, "--threads", 0, 1024, &threads)) return 1;
            break;
        case 'E': ignore_eos = 1; break;
        case 'h': usage(stdout); return 0;
        default: return cli_bad_option("generate", argv);
        }
    }
    if (optind < argc) return cli_error("generate: unexpected argument '%s'", argv[optind]);
    if (!ids_s) return cli_error("generate: --ids is required");
    if (temp != 0.0) return cli_error("generate: sampling (--temp > 0) is not available yet; use --temp 0");
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
    g4_context *ctx = NULL;
    int32_t *out = malloc((size_t)n_new * sizeof *out);
    g4_context_params cp = {.n_seq_max = 1, .n_ctx = n + (int)n_new, .n_batch = n < 512 ? n : 512};
    if (!out) {
        cli_error("out of memory");
        goto done;
    }
    if (g4_context_new(m, &cp, &ctx, &err)) {
        cli_error("%s", err.msg);
        goto done;
    }
    int32_t eos = 1;
    g4_generate_params gp = {.max_new_tokens = (int)n_new, .stop_ids = &eos, .n_stop = ignore_eos ? 0 : 1};
    int n_out, why;
    if (g4_generate(ctx, 0, ids, n, &gp, out, &n_out, &why, &err)) {
        cli_error("%s", err.msg);
        goto done;
    }
    for (int i = 0; i < n_out; i++) printf(i ? ",%d" : "%d", out[i]);
    printf("\n");
    rc = 0;
done:
    free(out);
    free(ids);
    g4_context_free(ctx);
    g4_model_free(m);
    return rc;
}
