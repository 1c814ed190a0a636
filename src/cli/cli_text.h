/* What the text commands (generate -p, run, chat) share: a model folder opened with
 * its tokenizer, generation config and chat template; sampling options; and a
 * streaming generation that prints text as it comes. */
#ifndef G4_CLI_CLI_TEXT_H
#define G4_CLI_CLI_TEXT_H

#include <getopt.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/generation_config.h"
#include "gemma4c.h"
#include "chat/chat.h"
#include "tokenizer/tokenizer.h"

#define CLI_MAX_STOPS 16
#define CLI_MAX_BIAS 64

/* Options every text command takes: the model folder, threads, context size, sampling and
 * length; sampling fields stay "unset" unless given on the command line. */
typedef struct cli_sampling {
    const char *model_dir;
    long threads, n_ctx;
    double temp, top_p, min_p, repeat_penalty, presence_penalty, frequency_penalty;
    long top_k, seed, n_predict, repeat_last_n;
    int have_temp, have_top_p, have_min_p, have_repeat, have_presence, have_frequency, have_top_k, have_seed;
    int ignore_eos;
    const char *stops[CLI_MAX_STOPS];
    int n_stops;
    int32_t bias_ids[CLI_MAX_BIAS];
    float bias_values[CLI_MAX_BIAS];
    int n_bias;
    const char *draft_dir; /* --draft: a gemma4_assistant drafter for speculative decoding */
    long draft_n;          /* --draft-n: drafts per round (0: the drafter's default) */
    int draft_stats;       /* --draft-stats: one JSON line of rounds on stderr after each generation */
} cli_sampling;

/* getopt_long entries for those options (-m, -t, -n and values >= 1000); ends with a zero entry. */
extern const struct option cli_sampling_options[];
#define CLI_SAMPLING_HELP                                                                              \
    "  -m DIR (model folder)  -t THREADS  --ctx N (context size)\n"                                     \
    "sampling (defaults from the model's generation_config.json):\n"                                     \
    "  --temp T  --top-k K  --top-p P  --min-p P  --seed N  --repeat-penalty R  --repeat-last-n N\n"   \
    "  --presence-penalty P  --frequency-penalty F  -n N (max new tokens)  --stop TEXT (repeatable)\n" \
    "  --logit-bias ID=BIAS (repeatable; BIAS may be -inf)  --ignore-eos\n"                               \
    "speculative decoding: --draft DIR (a gemma4_assistant checkpoint)  --draft-n N (drafts per round)\n" \
    "  --draft-stats (accepted and drafted tokens per round, one JSON line on stderr)\n"
void cli_sampling_init(cli_sampling *s);
/* Copies a command's own options (up to their zero entry), then the sampling options and the
 * terminating zero entry, into out (room for `cap` entries). */
void cli_options_with_sampling(const struct option *own, struct option *out, int cap);
/* Handles one option of cli_sampling_options; returns 1 if it was one, 0 if not, -1 on a bad value. */
int cli_sampling_parse(cli_sampling *s, int opt, const char *arg);

typedef struct cli_text_model {
    g4_model *model;
    g4_tokenizer *tok;
    g4_chat_template *tpl; /* NULL unless asked for */
    g4_generation_config gc;
    g4_context *ctx;
    g4_drafter *drafter;   /* with --draft */
    g4_spec *spec;
    int32_t channel_open, channel_close, tool_call_open, tool_call_close; /* -1 when the vocabulary lacks them */
} cli_text_model;

/* Loads what a text command needs; prints the error and returns -1 on failure. Without
 * CLI_NEED_TOKENIZER no tokenizer is loaded (generation then reports ids only). */
enum { CLI_NEED_TOKENIZER = 1, CLI_NEED_TEMPLATE = 2 };
int cli_text_open(const cli_sampling *opt, int needs, cli_text_model *tm);
void cli_text_close(cli_text_model *tm);

/* How generated text is shown. */
typedef enum {
    CLI_SHOW_PLAIN, /* everything (special tokens skipped) to `out` */
    CLI_SHOW_CHAT,  /* the answer to `out`; thinking to `thinking_out` if non-NULL, else hidden;
                       tool calls are not streamed (the caller prints the parsed calls) */
} cli_show;

typedef struct cli_generation {
    int32_t *ids;     /* generated ids */
    int n_ids;
    char *raw;        /* decoded with special tokens kept (for parsing), NUL-terminated; NULL without a tokenizer */
    const char *finish; /* "stop" (eos or stop string), "length", "cancelled" */
} cli_generation;

/* Ctrl-C: while cli_generating is set it stops the answer (cli_cancel becomes 1), otherwise it
 * ends the program with status 130. */
extern volatile int cli_cancel, cli_generating;
void cli_catch_sigint(void);

/* Runs the prompt through sequence 0 (continuing from its length) and generates, streaming
 * text as configured; Ctrl-C (see cli_catch_sigint) stops it with finish "cancelled".
 * Returns 0 or -1 (the error is printed). */
int cli_generate_text(cli_text_model *tm, const int32_t *prompt, int n_prompt, const cli_sampling *opt,
                      cli_show show, FILE *out, FILE *thinking_out, cli_generation *g);
void cli_generation_free(cli_generation *g);

#endif
