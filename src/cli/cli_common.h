/* Helpers the subcommands share: option values, model loading with a progress line. */
#ifndef G4_CLI_CLI_COMMON_H
#define G4_CLI_CLI_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include <jansson.h>

#include "gemma4c.h"

/* Parses "2,17,99" into a heap array; returns -1 with a message on bad input. */
int cli_parse_ids(const char *s, int32_t **ids, int *n, g4_error *err);
/* Parses a whole decimal integer / float option value. */
int cli_parse_int(const char *s, const char *opt, long min, long max, long *out);
int cli_parse_float(const char *s, const char *opt, double min, double max, double *out);

/* After getopt_long returned '?' or ':' (with opterr = 0): one line naming the bad option. Returns 1. */
int cli_bad_option(const char *cmd, char **argv);

/* JSON-lines batch commands (tokenize -f, detokenize -f, template -f): reads `path` ("-" or
 * NULL: standard input) line by line, skipping blank lines; each line is parsed and handed
 * to fn, which returns the value to print (the caller takes it) or NULL with a message in
 * err. Writes one compact JSON line per input line, in order: the value, or
 * {"error": "..."}. Returns the exit status: 0 when every line succeeded, else 1. */
typedef json_t *(*cli_jsonl_fn)(const json_t *in, void *user, g4_error *err);
int cli_jsonl_map(const char *cmd, const char *path, cli_jsonl_fn fn, void *user);
/* The pieces of cli_jsonl_map, for commands that answer lines out of order (cli_batch.h):
 * open (NULL after printing the error), the next non-blank line as an object (1; *obj NULL with
 * a message in err for a malformed line, also for a text line longer than CLI_MAX_LINE: it is read
 * past), 0 at the end, or -1 with a message in err when the input cannot be read as lines (one longer
 * than CLI_MAX_LINE with a zero byte or no newline within 1 GiB: /dev/zero, a binary file) and so
 * ends there, and close (the exit status). */
#define CLI_MAX_LINE (64 << 20)
FILE *cli_jsonl_open(const char *cmd, const char *path);
int cli_jsonl_next(FILE *in, char **line, size_t *cap, json_t **obj, g4_error *err);
int cli_jsonl_close(const char *cmd, const char *path, FILE *in, int failed);
/* One line of `in`, its newline kept, into *line (grown as getline does): its length; -1 at the end
 * of the input; -2 when it is longer than `max` bytes (*line holds its first *cap - 1 bytes, not
 * zero-terminated; the rest of the line is not read); -3 out of memory. Bounded memory on endless input without a newline (/dev/zero). */
ssize_t cli_read_line(FILE *in, char **line, size_t *cap, size_t max);
/* One compact JSON line on stdout; {"error": msg} as one. */
void cli_print_json_line(json_t *v);
void cli_print_error_line(const char *msg);

/* Removes a partly written output file after a failure: only a regular file (-o /dev/stdout, a
 * device or a FIFO is left where it is). */
void cli_remove_output(const char *path);
/* A binary output by its path, "-" for standard output (NULL when it cannot be opened); closing it (standard output
 * flushed, not closed) returns nonzero when a write failed. */
FILE *cli_open_output(const char *path);
int cli_close_output(FILE *f);

/* Loads DIR/tokenizer.json (model_dir) or a tokenizer.json (file); prints the error and
 * returns NULL on failure. */
g4_tokenizer *cli_load_tokenizer(const char *model_dir, const char *file);

/* The --device value of the command line (NULL: automatic) and --bf16-act (g4_load_params.bf16_activations);
 * main() takes them out of argv. */
extern const char *cli_device;
extern int cli_bf16_act;
extern const char *cli_mmproj; /* --mmproj FILE (g4_load_params.mmproj) */
/* --kv as a g4_kv_type, -1 when not given; cli_kv_type: the type a context of model m gets (--kv, else
 * g4_model_kv_type_preferred: bf16 on a GPU, f32 on the CPU). */
extern int cli_kv;
g4_kv_type cli_kv_type(const g4_model *m);

/* Loads a model, showing a progress line on stderr when it is a terminal and the
 * weights are large; prints load warnings. Returns NULL after printing the error. */
g4_model *cli_load_model(const char *dir, int n_threads);

#endif
