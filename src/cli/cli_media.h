/* Images and audio for the commands (--image FILE, --audio FILE, /image, /audio): files encoded into soft
 * tokens through the public API, kept in the order the prompt's placeholders take them (gemma4c.h, "images
 * and audio"), and the chat message that shows them. */
#ifndef G4_CLI_CLI_MEDIA_H
#define G4_CLI_CLI_MEDIA_H

#include <jansson.h>

#include "gemma4c.h"

#define CLI_MAX_MEDIA 64

typedef struct cli_media {
    g4_soft_tokens items[CLI_MAX_MEDIA]; /* every input so far, in order */
    int n;
} cli_media;

/* The --image FILE / --audio FILE options of a command, in the order given. */
typedef struct cli_media_files {
    const char *path[CLI_MAX_MEDIA];
    int is_audio[CLI_MAX_MEDIA];
    int n;
} cli_media_files;

/* Records one option; prints the error and returns 1 when there are too many. */
int cli_media_file(cli_media_files *f, const char *cmd, const char *path, int is_audio);
/* Encodes every recorded file (images at `budget`) and appends them; -1 (error printed) when one fails. */
int cli_media_add_files(cli_media *md, g4_model *m, const cli_media_files *f, int budget);
/* Encodes an image file (budget 0: the model's default) and appends it. Prints the error and returns -1 on
 * failure (nothing is appended then). */
int cli_media_add_image(cli_media *md, g4_model *m, const char *path, int budget);
/* Decodes an audio file at the model's rate, encodes it (clips of 30 s) and appends it; like the above. */
int cli_media_add_audio(cli_media *md, g4_model *m, const char *path);
/* Writes the soft tokens of all inputs to `path`, float32 [n, hidden] little-endian, inputs concatenated; -1
 * (error printed, the file removed) on failure. */
int cli_media_write(const cli_media *md, const char *path);
/* Drops the inputs from index `from` on. */
void cli_media_truncate(cli_media *md, int from);
/* Soft tokens of all inputs. */
int cli_media_tokens(const cli_media *md);

/* A user chat message: {"role": "user", "content": TEXT}, or with inputs md->items[first..n) the content list
 * [{"type": "image"} / {"type": "audio"}..., {"type": "text", "text": TEXT}] (the inputs first, in order, as
 * HF's examples write it). NULL with a message in err when TEXT is not valid UTF-8 (or memory runs out). */
json_t *cli_user_message(const char *text, const cli_media *md, int first, g4_error *err);

#endif
