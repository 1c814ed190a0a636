/* gemma4c run -m DIR [--image FILE ...] [--audio FILE ...] -p TEXT: one chat turn through the model's chat
 * template.
 * The answer streams to stdout; with --think the model thinks first and its thinking
 * streams to stderr; tool calls the model makes are printed at the end as one JSON line
 * {"tool_calls": [{"name": ..., "arguments": {...}}, ...]}. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_common.h"
#include "cli/cli_media.h"
#include "cli/cli_text.h"
#include "cli/commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: gemma4c run -m DIR -p TEXT [--image FILE ...] [--audio FILE ...] [options]\n"
            "  -p TEXT          the user's message\n"
            "  --image FILE     an image the message shows, before the text (repeatable; JPEG, PNG, WebP, GIF)\n"
            "  --budget N       soft tokens per image at most: 70, 140, 280, 560, 1120 (default: the model's)\n"
            "  --audio FILE     audio the message refers to, before the text (repeatable; WAV, FLAC, OGG, MP3, ...;\n"
            "                   longer than 30 s: split into 30 s clips)\n"
            "  --system TEXT    a system prompt\n"
            "  --think          let the model think first (its thinking goes to stderr)\n"
            CLI_SAMPLING_HELP);
}

int cmd_run(int argc, char **argv) {
    enum { OPT_SYSTEM = 2000, OPT_THINK, OPT_IMAGE, OPT_BUDGET, OPT_AUDIO };
    static const struct option own[] = {{"prompt", required_argument, 0, 'p'}, {"system", required_argument, 0, OPT_SYSTEM},
                                        {"think", no_argument, 0, OPT_THINK},    {"image", required_argument, 0, OPT_IMAGE},
                                        {"budget", required_argument, 0, OPT_BUDGET}, {"audio", required_argument, 0, OPT_AUDIO},
                                        {"help", no_argument, 0, 'h'},           {0, 0, 0, 0}};
    struct option opts[40];
    cli_options_with_sampling(own, opts, 40);
    const char *text = NULL, *system_prompt = NULL;
    int think = 0, c;
    long budget = 0;
    cli_sampling smp;
    cli_sampling_init(&smp);
    cli_media_files files = {0};
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
        case OPT_IMAGE:
        case OPT_AUDIO:
            if (cli_media_file(&files, "run", optarg, c == OPT_AUDIO)) return 1;
            break;
        case OPT_BUDGET:
            if (cli_parse_int(optarg, "--budget", 1, 1 << 20, &budget)) return 1;
            break;
        case 'h': usage(stdout); return 0;
        default: return cli_bad_option("run", argv);
        }
    }
    if (optind < argc) return cli_error("run: unexpected argument '%s'", argv[optind]);
    if (!text) return cli_error("run: -p TEXT is required");

    smp.image_budget = (int)budget;
    cli_text_model tm;
    if (cli_text_open(&smp, CLI_NEED_TOKENIZER | CLI_NEED_TEMPLATE, 0, &tm)) return 1;
    int rc = 1;
    g4_error err;
    g4_chat *chat = NULL;
    g4_generation *gen = NULL;
    g4_sampler_params sp;
    g4_generation_params gp;
    cli_generation_params(&smp, &tm, &sp, &gp);
    cli_media md = {0};
    char *user = NULL;
    if (cli_media_add_files(&md, tm.model, &files, (int)budget)) goto done;
    json_t *msg = cli_user_message(text, &md, 0, &err);
    user = msg ? json_dumps(msg, 0) : NULL;
    json_decref(msg);
    gp.media = md.items;
    gp.n_media = md.n;
    if (!user) {
        cli_error("%s", msg ? "out of memory" : err.msg);
        goto done;
    }
    if (g4_chat_new(g4_model_chat_template(tm.model), think ? "{\"enable_thinking\": true}" : NULL, &chat, &err) ||
        (system_prompt && g4_chat_add(chat, "system", system_prompt, &err)) || g4_chat_add_json(chat, user, &err) ||
        g4_chat_start(chat, tm.ctx, 0, &gp, &gen, &err)) {
        cli_error("%s", err.msg);
        goto done;
    }
    cli_catch_sigint();
    if (cli_stream(gen, stdout, think ? stderr : NULL)) goto done;
    cli_print_draft_stats(&smp, gen);
    printf("\n");
    cli_note_context_full(&smp, &tm, gen, "run");
    cli_print_tool_calls(gen);
    rc = g4_generation_finish(gen) == G4_FINISH_CANCELLED ? 130 : 0;
done:
    g4_generation_free(gen);
    g4_chat_free(chat);
    free(user);
    cli_media_truncate(&md, 0);
    cli_text_close(&tm);
    return rc;
}
