/* gemma4c chat -m DIR: an interactive multi-turn chat in the terminal.
 * Each turn renders the whole conversation with the model's chat template; the part of
 * the prompt the KV cache already holds is not processed again. Commands: /reset (new
 * conversation), /audio FILE (audio that goes with the next message), /exit. Ctrl-C stops the
 * current answer; at the prompt it quits. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli_audio.h"
#include "cli/cli_common.h"
#include "cli/cli_text.h"
#include "cli/commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: gemma4c chat -m DIR [options]\n"
            "  --system TEXT    a system prompt for the conversation\n"
            "  --think          let the model think before it answers (thinking shown dimmed)\n"
            CLI_SAMPLING_HELP
            "in the chat: /reset starts over, /audio FILE adds audio to your next message, /exit quits,\n"
            "Ctrl-C stops an answer\n");
}

/* Tokens the cache holds for sequence 0, in order. */
typedef struct {
    int32_t *ids;
    int n, cap;
} history;

static int history_set(history *h, const int32_t *a, int na, const int32_t *b, int nb, int keep) {
    int n = na + nb < keep ? na + nb : keep;
    if (n > h->cap) {
        int32_t *p = realloc(h->ids, (size_t)n * sizeof *p);
        if (!p) return -1;
        h->ids = p;
        h->cap = n;
    }
    for (int i = 0; i < n; i++) h->ids[i] = i < na ? a[i] : b[i - na];
    h->n = n;
    return 0;
}

int cmd_chat(int argc, char **argv) {
    enum { OPT_SYSTEM = 2000, OPT_THINK };
    static const struct option own[] = {{"system", required_argument, 0, OPT_SYSTEM}, {"think", no_argument, 0, OPT_THINK},
                                        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    struct option opts[40];
    cli_options_with_sampling(own, opts, 40);
    const char *system_prompt = NULL;
    int think = 0, c;
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
        case 'h': usage(stdout); return 0;
        default: return cli_bad_option("chat", argv);
        }
    }
    if (optind < argc) return cli_error("chat: unexpected argument '%s'", argv[optind]);
    cli_text_model tm;
    if (cli_text_open(&smp, CLI_NEED_TOKENIZER | CLI_NEED_TEMPLATE, &tm)) return 1;
    const int interactive = isatty(STDIN_FILENO);
    const int color = isatty(STDOUT_FILENO);
    cli_catch_sigint();
    if (interactive)
        fprintf(stderr, "gemma4c chat: %s (context %d). /reset starts over, /exit quits, Ctrl-C stops an answer.\n",
                smp.model_dir, g4_context_n_ctx(tm.ctx));
    json_t *messages = json_array();
    if (system_prompt) json_array_append_new(messages, json_pack("{s:s,s:s}", "role", "system", "content", system_prompt));
    history hist = {0};
    char *line = NULL;
    size_t line_cap = 0;
    g4_error err;
    int rc = 0;
    cli_audio audio = {0}; /* every audio file of the conversation, in order */
    int pending = 0;       /* of which the last `pending` go with the next message */
    for (;;) {
        if (interactive) {
            fputs(color ? "\033[1m> \033[0m" : "> ", stdout);
            fflush(stdout);
        }
        ssize_t got = getline(&line, &line_cap, stdin);
        if (got < 0) break;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        if (got == 0) continue;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            json_array_clear(messages);
            if (system_prompt)
                json_array_append_new(messages, json_pack("{s:s,s:s}", "role", "system", "content", system_prompt));
            g4_seq_reset(tm.ctx, 0);
            hist.n = 0;
            cli_audio_clear(&audio);
            pending = 0;
            fprintf(stderr, "(new conversation)\n");
            continue;
        }
        if (!strncmp(line, "/audio ", 7)) {
            const char *path = line + 7;
            while (*path == ' ') path++;
            int before = audio.n_rows;
            if (cli_audio_add(&audio, tm.model, path) == 0) {
                pending++;
                fprintf(stderr, "(%s: %d soft tokens; it goes with your next message)\n", path, audio.n_rows - before);
            }
            continue;
        }
        if (line[0] == '/' && strcmp(line, "/") != 0 && !strchr(line, ' ')) {
            fprintf(stderr, "commands: /reset, /audio FILE, /exit\n");
            continue;
        }
        json_array_append_new(messages, cli_audio_user_message(pending, line));
        char *prompt_text = NULL;
        size_t prompt_len;
        g4_tokens toks = {0};
        g4_soft_prompt soft = {0};
        g4_chat_options co = {.add_generation_prompt = 1, .enable_thinking = think ? 1 : -1};
        if (g4_chat_render(tm.tpl, messages, &co, &prompt_text, &prompt_len, &err) ||
            g4_tokenize(tm.tok, prompt_text, prompt_len, 0, &toks, &err)) {
            cli_error("%s", err.msg);
            json_array_remove(messages, json_array_size(messages) - 1);
            free(prompt_text);
            free(toks.ids);
            continue;
        }
        free(prompt_text);
        if (audio.n_items && cli_audio_expand(&audio, tm.model, toks.ids, (int)toks.n, &soft)) {
            json_array_remove(messages, json_array_size(messages) - 1);
            free(toks.ids);
            continue;
        }
        if (audio.n_items) { /* the prompt with its audio placeholders expanded */
            free(toks.ids);
            toks.ids = soft.ids;
            toks.n = (size_t)soft.n;
            soft.ids = NULL;
        }
        /* reuse what the cache holds: keep the common prefix, feed the rest (at least one token) */
        int same = 0;
        while (same < hist.n && same < (int)toks.n && hist.ids[same] == toks.ids[same]) same++;
        if (same == (int)toks.n) same--;
        if (g4_seq_truncate(tm.ctx, 0, same, &err)) {
            g4_seq_reset(tm.ctx, 0);
            same = 0;
        }
        cli_generation g;
        tm.soft_embeddings = audio.n_items ? audio.rows : NULL;
        tm.soft_rows = audio.n_items ? soft.rows + same : NULL;
        int grc = cli_generate_text(&tm, toks.ids + same, (int)toks.n - same, &smp, CLI_SHOW_CHAT, stdout,
                                    think ? stderr : NULL, &g);
        tm.soft_embeddings = NULL;
        tm.soft_rows = NULL;
        g4_soft_prompt_free(&soft);
        if (grc) {
            /* the turn failed (e.g. the context is full): forget it */
            json_array_remove(messages, json_array_size(messages) - 1);
            g4_seq_reset(tm.ctx, 0);
            hist.n = 0;
            free(toks.ids);
            fprintf(stderr, "(the turn was dropped; /reset starts a new conversation)\n");
            continue;
        }
        pending = 0;
        if (cli_cancel) fputs(color ? " \033[2m[stopped]\033[0m" : " [stopped]", stdout);
        fputs("\n", stdout);
        fflush(stdout);
        if (history_set(&hist, toks.ids, (int)toks.n, g.ids, g.n_ids, g4_seq_length(tm.ctx, 0))) {
            g4_seq_reset(tm.ctx, 0);
            hist.n = 0;
        }
        g4_chat_output parsed;
        const char *answer = "";
        int have_parsed = g.raw && g4_chat_parse_output(g.raw, strlen(g.raw), &parsed, &err) == 0;
        if (have_parsed) answer = parsed.content;
        json_t *msg = json_pack("{s:s,s:s}", "role", "assistant", "content", answer);
        if (have_parsed && json_array_size(parsed.tool_calls)) {
            json_t *calls = json_array();
            size_t i;
            json_t *call;
            json_array_foreach(parsed.tool_calls, i, call) {
                json_array_append_new(calls, json_pack("{s:s,s:O}", "type", "function", "function", call));
                char *s = json_dumps(call, JSON_COMPACT);
                if (s) printf("{\"tool_call\":%s}\n", s);
                free(s);
            }
            json_object_set_new(msg, "tool_calls", calls);
        }
        json_array_append_new(messages, msg);
        if (have_parsed) g4_chat_output_free(&parsed);
        cli_generation_free(&g);
        free(toks.ids);
    }
    free(line);
    free(hist.ids);
    cli_audio_clear(&audio);
    json_decref(messages);
    cli_text_close(&tm);
    return rc;
}
