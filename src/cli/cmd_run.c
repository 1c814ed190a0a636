/* gemma4c run -m DIR -p TEXT: one chat turn through the model's chat template.
 * The answer streams to stdout; with --think the model thinks first and its thinking
 * streams to stderr; tool calls the model makes are printed at the end as one JSON line
 * {"tool_calls": [{"name": ..., "arguments": {...}}, ...]}. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_common.h"
#include "cli/cli_text.h"
#include "cli/commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: gemma4c run -m DIR -p TEXT [options]\n"
            "  -p TEXT          the user's message\n"
            "  --system TEXT    a system prompt\n"
            "  --think          let the model think first (its thinking goes to stderr)\n"
            CLI_SAMPLING_HELP);
}

int cmd_run(int argc, char **argv) {
    enum { OPT_SYSTEM = 2000, OPT_THINK };
    static const struct option own[] = {{"prompt", required_argument, 0, 'p'}, {"system", required_argument, 0, OPT_SYSTEM},
                                        {"think", no_argument, 0, OPT_THINK}, {"help", no_argument, 0, 'h'},
                                        {0, 0, 0, 0}};
    struct option opts[40];
    cli_options_with_sampling(own, opts, 40);
    const char *text = NULL, *system_prompt = NULL;
    int think = 0, c;
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
        case OPT_SYSTEM: system_prompt = optarg; break;
        case OPT_THINK: think = 1; break;
        case 'h': usage(stdout); return 0;
        default: return cli_bad_option("run", argv);
        }
    }
    if (optind < argc) return cli_error("run: unexpected argument '%s'", argv[optind]);
    if (!text) return cli_error("run: -p TEXT is required");

    cli_text_model tm;
    if (cli_text_open(&smp, CLI_NEED_TOKENIZER | CLI_NEED_TEMPLATE, &tm)) return 1;
    int rc = 1;
    g4_error err;
    g4_chat *chat = NULL;
    g4_generation *gen = NULL;
    g4_sampler_params sp;
    g4_generation_params gp;
    cli_generation_params(&smp, &tm, &sp, &gp);
    if (g4_chat_new(g4_model_chat_template(tm.model), think ? "{\"enable_thinking\": true}" : NULL, &chat, &err) ||
        (system_prompt && g4_chat_add(chat, "system", system_prompt, &err)) || g4_chat_add(chat, "user", text, &err) ||
        g4_chat_start(chat, tm.ctx, 0, &gp, &gen, &err)) {
        cli_error("%s", err.msg);
        goto done;
    }
    cli_catch_sigint();
    if (cli_stream(gen, stdout, think ? stderr : NULL)) goto done;
    cli_print_draft_stats(&smp, gen);
    printf("\n");
    cli_print_tool_calls(gen);
    rc = g4_generation_finish(gen) == G4_FINISH_CANCELLED ? 130 : 0;
done:
    g4_generation_free(gen);
    g4_chat_free(chat);
    cli_text_close(&tm);
    return rc;
}
