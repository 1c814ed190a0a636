/* JSON-lines commands that run every line through the scheduler at once (generate -f, embed -f):
 * lines are read as requests finish, so that at most `window` are in flight (queued in the
 * scheduler or running), and each output line is printed in input order once its request and
 * every earlier one have finished. */
#ifndef G4_CLI_CLI_BATCH_H
#define G4_CLI_CLI_BATCH_H

#include <jansson.h>

#include "gemma4c.h"

/* Submits the request of input line `index` (0-based over non-blank lines); -1 with a message. *grammar (NULL when
 * called): a grammar of the line's own that the request reads, freed by the batch after the request (also on
 * failure). */
typedef int (*cli_batch_submit_fn)(const json_t *line, long index, g4_scheduler *s, void *user, g4_generation **out,
                                   g4_grammar **grammar, g4_error *err);
/* The output line of a finished request, or NULL with a message (printed as {"error": ...}). */
typedef json_t *(*cli_batch_result_fn)(const g4_generation *g, void *user, g4_error *err);

/* Runs the file (path "-" or NULL: standard input); returns the exit status (1 when a line failed
 * or the model step failed). */
int cli_batch_run(const char *cmd, const char *path, g4_scheduler *s, int window, cli_batch_submit_fn submit,
                  cli_batch_result_fn result, void *user);

/* The ids of "ids" (an array of integers) or the tokens of "text_key" (a string; BOS added when
 * add_bos) of a line; NULL with a message when neither is there, or both, or one is malformed. */
int32_t *cli_batch_line_ids(const json_t *line, const char *text_key, int add_bos, const g4_model *model, int *n,
                            g4_error *err);

#endif
