/* Helpers shared by the tokenize and detokenize commands. */
#ifndef G4_CLI_CLI_TOKENIZER_H
#define G4_CLI_CLI_TOKENIZER_H

#include <stdio.h>

#include "tokenizer/tokenizer.h"

/* Loads DIR/tokenizer.json (model_dir) or a tokenizer.json (file); prints a one-line error
 * and returns NULL on failure. */
g4_tokenizer *cli_load_tokenizer(const char *model_dir, const char *file);

/* Opens FILE for reading JSON lines ("-" = stdin); prints an error and returns NULL. */
FILE *cli_open_input(const char *path);

/* Prints {"error": msg} as one line on stdout. */
void cli_print_error_line(const char *msg);

#endif
