/* gemma4c chat -m DIR: an interactive multi-turn chat in the terminal.
 * Each turn renders the whole conversation with the model's chat template; the part of
 * the prompt the KV cache already holds is not processed again (up to the first image: soft
 * tokens never count as held). Commands: /image FILE and /audio FILE (an input for the next
 * message), /reset (new conversation), /exit. Ctrl-C stops the current answer; at the prompt it quits. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli_common.h"
#include "cli/cli_media.h"
#include "cli/cli_text.h"
#include "cli/commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: gemma4c chat -m DIR [options]\n"
            "  --system TEXT    a system prompt for the conversation\n"
            "  --think          let the model think before it answers (thinking shown dimmed)\n"
            "  --budget N       soft tokens per image at most: 70, 140, 280, 560, 1120 (default: the model's)\n"
            CLI_SAMPLING_HELP
            "in the chat: /image FILE and /audio FILE add an image or audio to your next message, /reset starts\n"
            "over, /exit quits, Ctrl-C stops an answer\n");
}

int cmd_chat(int argc, char **argv) {
    enum { OPT_SYSTEM = 2000, OPT_THINK, OPT_BUDGET };
    static const struct option own[] = {{"system", required_argument, 0, OPT_SYSTEM}, {"think", no_argument, 0, OPT_THINK},
                                        {"budget", required_argument, 0, OPT_BUDGET}, {"help", no_argument, 0, 'h'},
                                        {0, 0, 0, 0}};
    struct option opts[40];
    cli_options_with_sampling(own, opts, 40);
    const char *system_prompt = NULL;
    int think = 0, c;
    long budget = 0;
    cli_sampling smp;
    cli_sampling_init(&smp);
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "m:n:t:h", opts, NULL)) != -1) {
        int r = cli_sampling_parse(&smp, c, optarg);
        if (r < 0) return 1;
        if (r > 0) continue;
        switch (c) {
        case OPT_SYSTEM: system_prompt = optarg; break;
        case OPT_THINK: think = 1; break;
        case OPT_BUDGET:
            if (cli_parse_int(optarg, "--budget", 1, 1 << 20, &budget)) return 1;
            break;
        case 'h': usage(stdout); return 0;
        default: return cli_bad_option("chat", argv);
        }
    }
    if (optind < argc) return cli_error("chat: unexpected argument '%s'", argv[optind]);
    smp.image_budget = (int)budget;
    cli_text_model tm;
    if (cli_text_open(&smp, CLI_NEED_TOKENIZER | CLI_NEED_TEMPLATE, 0, &tm)) return 1;
    const int interactive = isatty(STDIN_FILENO);
    const int color = isatty(STDOUT_FILENO);
    g4_error err;
    g4_chat *chat = NULL;
    if (g4_chat_new(g4_model_chat_template(tm.model), think ? "{\"enable_thinking\": true}" : NULL, &chat, &err) ||
        (system_prompt && g4_chat_add(chat, "system", system_prompt, &err))) {
        cli_error("%s", err.msg);
        g4_chat_free(chat);
        cli_text_close(&tm);
        return 1;
    }
    cli_catch_sigint();
    if (interactive)
        fprintf(stderr, "gemma4c chat: %s (context %d). /image FILE or /audio FILE goes with your next message, "
                        "/reset starts over, /exit quits, Ctrl-C stops an answer.\n",
                smp.model_dir, g4_context_n_ctx(tm.ctx));
    g4_sampler_params sp;
    g4_generation_params gp;
    cli_generation_params(&smp, &tm, &sp, &gp);
    cli_media md = {0}; /* every image and audio of the conversation, in order (the generation's media) */
    int pending = 0;    /* the inputs from index `pending` on go with the next message */
    int rc = 0;
    char *line = NULL;
    size_t line_cap = 0;
    for (;;) {
        if (interactive) {
            fputs(color ? "\033[1m> \033[0m" : "> ", stdout);
            fflush(stdout);
        }
        ssize_t got = cli_read_line(stdin, &line, &line_cap, CLI_MAX_LINE);
        if (got < -1) {
            rc = cli_error("chat: %s", got == -2 ? "a message longer than 64 MiB (the input is not text?)" : "out of memory");
            break;
        }
        if (got < 0) break;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        if (line[strspn(line, " \t")] == 0) continue; /* nothing said: no turn */
        if (line[0] == '/') /* a command typed with a space after it ("/reset ") is still the command */
            while (line[got - 1] == ' ' || line[got - 1] == '\t') line[--got] = 0;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            g4_chat_clear(chat);
            if (system_prompt) g4_chat_add(chat, "system", system_prompt, NULL);
            cli_media_truncate(&md, 0);
            pending = 0;
            fprintf(stderr, "(new conversation)\n");
            continue;
        }
        const int image = !strncmp(line, "/image ", 7), audio = !strncmp(line, "/audio ", 7);
        if (image || audio) {
            const char *path = line + 7;
            while (*path == ' ') path++;
            if (!*path)
                fprintf(stderr, "usage: %.6s FILE\n", line);
            else if ((audio ? cli_media_add_audio(&md, tm.model, path)
                            : cli_media_add_image(&md, tm.model, path, (int)budget)) == 0)
                fprintf(stderr, "(%s: %d soft tokens; it goes with your next message)\n", path,
                        md.items[md.n - 1].n_tokens);
            continue;
        }
        if (line[0] == '/' && strcmp(line, "/") != 0 && !strchr(line, ' ')) {
            fprintf(stderr, "commands: /image FILE, /audio FILE, /reset, /exit\n");
            continue;
        }
        /* the whole conversation is rendered each turn; the part the cache holds is not run again */
        json_t *msg = cli_user_message(line, &md, pending, &err);
        char *user = msg ? json_dumps(msg, 0) : NULL;
        json_decref(msg);
        if (msg && !user) g4_fail(&err, "out of memory");
        int added = user && g4_chat_add_json(chat, user, &err) == 0;
        free(user);
        if (!added) {
            cli_error("%s", err.msg);
            continue;
        }
        gp.media = md.items;
        gp.n_media = md.n;
        g4_generation *gen = NULL;
        int bad = g4_chat_start(chat, tm.ctx, 0, &gp, &gen, &err);
        if (bad) cli_error("%s", err.msg);
        else bad = cli_stream(gen, stdout, think ? stderr : NULL);
        if (!bad) cli_print_draft_stats(&smp, gen);
        if (!bad && g4_chat_add_reply(chat, gen, &err)) bad = cli_error("%s", err.msg);
        if (bad) { /* the turn failed (e.g. the context is full): forget it (its inputs wait for the next one) */
            g4_chat_pop(chat);
            g4_generation_free(gen);
            fprintf(stderr, "(the turn was dropped; /reset starts a new conversation)\n");
            continue;
        }
        pending = md.n;
        if (g4_generation_finish(gen) == G4_FINISH_CANCELLED)
            fputs(color ? " \033[2m[stopped]\033[0m" : " [stopped]", stdout);
        fputs("\n", stdout);
        cli_print_tool_calls(gen);
        fflush(stdout);
        g4_generation_free(gen);
    }
    free(line);
    cli_media_truncate(&md, 0);
    g4_chat_free(chat);
    cli_text_close(&tm);
    return rc;
}
