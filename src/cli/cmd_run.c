/* gemma4c run -m DIR -p TEXT: one chat turn through the model's chat template.
 * The answer streams to stdout; with --think the model thinks first and its thinking
 * streams to stderr; tool calls the model makes are printed as JSON lines at the end. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_audio.h"
#include "cli/cli_common.h"
#include "cli/cli_text.h"
#include "cli/commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: gemma4c run -m DIR -p TEXT [options]\n"
            "  -p TEXT          the user's message\n"
            "  --system TEXT    a system prompt\n"
            "  --think          let the model think first (its thinking goes to stderr)\n"
            "  --audio FILE     audio the message refers to (repeatable; WAV, FLAC, OGG, MP3, ...;\n"
            "                   longer than 30 s: split into 30 s clips)\n"
            CLI_SAMPLING_HELP);
}

int cmd_run(int argc, char **argv) {
    enum { OPT_SYSTEM = 2000, OPT_THINK, OPT_AUDIO };
    static const struct option own[] = {{"prompt", required_argument, 0, 'p'}, {"system", required_argument, 0, OPT_SYSTEM},
                                        {"think", no_argument, 0, OPT_THINK}, {"audio", required_argument, 0, OPT_AUDIO},
                                        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *audio_files[16];
    int n_audio = 0;
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
        case OPT_AUDIO:
            if (n_audio == 16) return cli_error("run: at most 16 --audio files");
            audio_files[n_audio++] = optarg;
            break;
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
    cli_audio audio = {0};
    g4_soft_prompt soft = {0};
    json_t *messages = json_array();
    if (system_prompt) json_array_append_new(messages, json_pack("{s:s,s:s}", "role", "system", "content", system_prompt));
    json_array_append_new(messages, cli_audio_user_message(n_audio, text));
    char *prompt_text = NULL;
    size_t prompt_len;
    g4_tokens toks = {0};
    for (int i = 0; i < n_audio; i++)
        if (cli_audio_add(&audio, tm.model, audio_files[i])) goto done;
    g4_chat_options co = {.tools = NULL, .add_generation_prompt = 1, .enable_thinking = think ? 1 : -1};
    if (g4_chat_render(tm.tpl, messages, &co, &prompt_text, &prompt_len, &err) ||
        g4_tokenize(tm.tok, prompt_text, prompt_len, 0, &toks, &err)) {
        cli_error("%s", err.msg);
        goto done;
    }
    const int32_t *prompt = toks.ids;
    int n_prompt = (int)toks.n;
    if (n_audio) {
        if (cli_audio_expand(&audio, tm.model, toks.ids, (int)toks.n, &soft)) goto done;
        prompt = soft.ids;
        n_prompt = soft.n;
        tm.soft_embeddings = audio.rows;
        tm.soft_rows = soft.rows;
    }
    cli_catch_sigint();
    cli_generation g;
    int grc = cli_generate_text(&tm, prompt, n_prompt, &smp, CLI_SHOW_CHAT, stdout, think ? stderr : NULL, &g);
    if (grc) goto done;
    printf("\n");
    g4_chat_output parsed;
    if (g.raw && g4_chat_parse_output(g.raw, strlen(g.raw), &parsed, &err) == 0) {
        size_t i;
        json_t *call;
        json_array_foreach(parsed.tool_calls, i, call) {
            char *s = json_dumps(call, JSON_COMPACT);
            if (s) printf("{\"tool_call\":%s}\n", s);
            free(s);
        }
        g4_chat_output_free(&parsed);
    }
    cli_generation_free(&g);
    rc = cli_cancel ? 130 : 0;
done:
    g4_soft_prompt_free(&soft);
    cli_audio_clear(&audio);
    free(toks.ids);
    free(prompt_text);
    json_decref(messages);
    cli_text_close(&tm);
    return rc;
}
