/* What the text commands (generate, run, chat) share: the sampling options, a model folder
 * opened with a context, and a generation streamed to the terminal. */
#ifndef G4_CLI_CLI_TEXT_H
#define G4_CLI_CLI_TEXT_H

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>

#include "gemma4c.h"

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
    int have_ctx; /* --ctx given: above the model's max_position_embeddings it is an error, not capped */
    int ignore_eos;
    const char *stops[CLI_MAX_STOPS];
    int n_stops;
    int32_t bias_ids[CLI_MAX_BIAS];
    float bias_values[CLI_MAX_BIAS];
    int n_bias;
    int image_budget; /* set by a command that takes images (--budget, 0: the model's): a batch step holds one */
    const char *draft_dir; /* --draft: a gemma4_assistant drafter for speculative decoding */
    long draft_n;          /* --draft-n: drafts per round (0: the drafter's default) */
    int draft_stats;       /* --draft-stats: one JSON line of rounds on stderr after each generation */
    const char *constraint; /* --json-schema, --grammar or --grammar-file: its argument */
    char constraint_kind;   /* 'j', 'g', 'f' */
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
    "  --draft-stats (accepted and drafted tokens per round, one JSON line on stderr)\n" \
    "constrained output: --json-schema SCHEMA|FILE (a JSON document of that JSON Schema)  --grammar GBNF\n" \
    "  --grammar-file FILE (llama.cpp's GBNF notation)\n"
void cli_sampling_init(cli_sampling *s);
/* Copies a command's own options (up to their zero entry), then the sampling options and the
 * terminating zero entry, into out (room for `cap` entries). */
void cli_options_with_sampling(const struct option *own, struct option *out, int cap);
/* Handles one option of cli_sampling_options; returns 1 if it was one, 0 if not, -1 on a bad value. */
int cli_sampling_parse(cli_sampling *s, int opt, const char *arg);

typedef struct cli_text_model {
    g4_model *model; /* with the folder's tokenizer, chat template and generation defaults */
    g4_context *ctx;
    g4_drafter *drafter; /* with --draft */
    g4_grammar *grammar; /* with --json-schema, --grammar or --grammar-file */
    int n_seq;           /* the context's sequences */
} cli_text_model;

/* cli_text_open's parallel for "as many as fit": CLI_PARALLEL_CPU on the CPU, on a GPU as many sequences as its
 * free memory holds the KV cache of (g4_context_fit_sequences), at most CLI_PARALLEL_GPU_MAX */
enum { CLI_PARALLEL_AUTO = -1, CLI_PARALLEL_CPU = 8, CLI_PARALLEL_GPU_MAX = 128 };

/* Loads what a text command needs; prints the error and returns -1 on failure. The needs say
 * which files beside the weights must be there. parallel > 0 (or CLI_PARALLEL_AUTO): a context of that many
 * sequences for a scheduler (cli_batch.h; tm->n_seq says how many), else one sequence. */
enum { CLI_NEED_TOKENIZER = 1, CLI_NEED_TEMPLATE = 2 };
int cli_text_open(const cli_sampling *opt, int needs, int parallel, cli_text_model *tm);
void cli_text_close(cli_text_model *tm);

/* The generation the options ask for: sampling over the model's defaults (a seed from the clock
 * unless --seed), the length limit, stop strings, --ignore-eos, the drafter. gp points at sp and at
 * opt's strings: both must outlive the generation. */
void cli_generation_params(const cli_sampling *opt, const cli_text_model *tm, g4_sampler_params *sp,
                           g4_generation_params *gp);

/* Ctrl-C: while cli_stream runs it cancels the generation, otherwise it ends the program with
 * status 130. */
void cli_catch_sigint(void);

/* Runs the generation to its end: answer (or plain) text to `out`, thinking to `thinking_out`
 * (either may be NULL: not shown). Returns 0 or -1 (the error is printed). */
int cli_stream(g4_generation *g, FILE *out, FILE *thinking_out);

/* Prints the reply's tool calls as one line {"tool_calls": [...]} when it made any. */
void cli_print_tool_calls(const g4_generation *g);

/* --draft-stats: {"accepted_per_round": [...], "drafts_per_round": [...]} on stderr when opt asks. */
void cli_print_draft_stats(const cli_sampling *opt, const g4_generation *g);

/* A note on stderr when the context, not -n, ended the generation (G4_FINISH_LENGTH before the -n tokens asked for). */
void cli_note_context_full(const cli_sampling *opt, const cli_text_model *tm, const g4_generation *g, const char *cmd);

#endif
