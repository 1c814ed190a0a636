/* gemma4c generate: text completion.
 *   gemma4c generate -m DIR -p TEXT          streams the continuation of TEXT (BOS added)
 *   gemma4c generate -m DIR --ids 2,17,99    prints the generated ids, comma-separated, on one line
 * Sampling defaults come from the model's generation_config.json; --temp 0 is greedy. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_common.h"
#include "cli/cli_text.h"
#include "cli/commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: gemma4c generate -m DIR (-p TEXT | --ids 2,17,99) [options]\n"
            "  -p TEXT        text to continue (the continuation is streamed to stdout)\n"
            "  --ids LIST     token ids to continue; prints the generated ids on one line\n"
            "  --no-bos       do not add the BOS token to TEXT\n"
            CLI_SAMPLING_HELP);
}

int cmd_generate(int argc, char **argv) {
    enum { OPT_IDS = 2000, OPT_NO_BOS };
    static const struct option own[] = {{"prompt", required_argument, 0, 'p'}, {"ids", required_argument, 0, OPT_IDS},
                                        {"no-bos", no_argument, 0, OPT_NO_BOS}, {"help", no_argument, 0, 'h'},
                                        {0, 0, 0, 0}};
    struct option opts[40];
    cli_options_with_sampling(own, opts, 40);
    const char *text = NULL, *ids_s = NULL;
    int no_bos = 0, c;
    cli_sampling smp;
    cli_sampling_init(&smp);
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "m:p:n:t:h", opts, NULL)) != -1) {
        int r = cli_sampling_parse(&smp, c, optarg);
        if (r < 0) return 1;
        if (r > 0) continue;
        switch (c) {
        case 'p': text = optarg; break;
        case OPT_IDS: ids_s = optarg; break;
        case OPT_NO_BOS: no_bos = 1; break;
        case 'h': usage(stdout); return 0;
        default: return cli_bad_option("generate", argv);
        }
    }
    if (optind < argc) return cli_error("generate: unexpected argument '%s'", argv[optind]);
    if (!!text == !!ids_s) return cli_error("generate: give exactly one of -p TEXT and --ids LIST");

    g4_error err;
    int32_t *prompt = NULL;
    int n_prompt = 0;
    if (ids_s && cli_parse_ids(ids_s, &prompt, &n_prompt, &err)) return cli_error("%s", err.msg);

    cli_text_model tm;
    long n_new = smp.n_predict > 0 ? smp.n_predict : 128;
    if (smp.n_predict <= 0) smp.n_predict = n_new;
    if (ids_s && smp.n_ctx <= 0) smp.n_ctx = n_prompt + n_new;
    if (cli_text_open(&smp, text ? CLI_NEED_TOKENIZER : 0, &tm)) {
        free(prompt);
        return 1;
    }
    int rc = 1;
    g4_generation *gen = NULL;
    if (text) {
        g4_tokens toks = {0};
        if (g4_tokenize(g4_model_tokenizer(tm.model), text, strlen(text), !no_bos, &toks, &err)) {
            cli_error("%s", err.msg);
            goto done;
        }
        prompt = toks.ids;
        n_prompt = (int)toks.n;
        if (n_prompt == 0) {
            cli_error("generate: the prompt is empty");
            goto done;
        }
    }
    g4_sampler_params sp;
    g4_generation_params gp;
    cli_generation_params(&smp, &tm, &sp, &gp);
    if (g4_generation_start(tm.ctx, 0, prompt, n_prompt, &gp, &gen, &err)) {
        cli_error("%s", err.msg);
        goto done;
    }
    cli_catch_sigint();
    if (cli_stream(gen, ids_s ? NULL : stdout, NULL)) goto done;
    cli_print_draft_stats(&smp, gen);
    if (ids_s) {
        int n;
        const int32_t *ids = g4_generation_tokens(gen, &n);
        for (int i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
    }
    printf("\n");
    rc = g4_generation_finish(gen) == G4_FINISH_CANCELLED ? 130 : 0;
done:
    g4_generation_free(gen);
    free(prompt);
    cli_text_close(&tm);
    return rc;
}
