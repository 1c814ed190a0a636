/* Audio inputs of the commands (--audio FILE, /audio FILE): encoded soft tokens kept in
 * prompt order, and the prompt expansion of their <|audio|> placeholders
 * (src/towers/audio.h, src/towers/soft_tokens.h). */
#ifndef G4_CLI_CLI_AUDIO_H
#define G4_CLI_CLI_AUDIO_H

#include <jansson.h>

#include "model/model.h"
#include "towers/soft_tokens.h"

typedef struct cli_audio {
    int n_items;         /* files */
    int *item_blocks;    /* [n_items] 30 s clips of each file */
    int n_blocks;
    int *block_tokens;   /* [n_blocks] soft tokens of each clip */
    int n_rows, hidden;
    float *rows;         /* [n_rows, hidden] every clip's soft tokens, in order */
} cli_audio;

/* Encodes a file and appends it; prints the error and returns -1 on failure. */
int cli_audio_add(cli_audio *a, g4_model *m, const char *path);
/* Expands the <|audio|> placeholders of a rendered chat prompt, one per file. */
int cli_audio_expand(const cli_audio *a, const g4_model *m, const int32_t *ids, int n, g4_soft_prompt *out);
void cli_audio_clear(cli_audio *a);
/* A user message of n_audio audio parts followed by the text (plain text when n_audio is 0). */
json_t *cli_audio_user_message(int n_audio, const char *text);

#endif
