/* Helpers the subcommands share: option values, model loading with a progress line. */
#ifndef G4_CLI_CLI_COMMON_H
#define G4_CLI_CLI_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "gemma4c.h"

/* Parses "2,17,99" into a heap array; returns -1 with a message on bad input. */
int cli_parse_ids(const char *s, int32_t **ids, int *n, g4_error *err);
/* Parses a whole decimal integer / float option value. */
int cli_parse_int(const char *s, const char *opt, long min, long max, long *out);
int cli_parse_float(const char *s, const char *opt, double min, double max, double *out);

/* After getopt_long returned '?' or ':' (with opterr = 0): one line naming the bad option. Returns 1. */
int cli_bad_option(const char *cmd, char **argv);

/* Loads a model, showing a progress line on stderr when it is a terminal and the
 * weights are large; prints load warnings. Returns NULL after printing the error. */
g4_model *cli_load_model(const char *dir, int n_threads);

#endif
