/* Images for the commands: files decoded, preprocessed at a soft-token budget and encoded by the model's
 * vision tower into soft-token rows, and the prompt-side expansion of the image placeholder
 * (docs/gemma4-towers.md 4: <|image|> becomes <|image> + N x <|image|> + <image|>). */
#ifndef G4_CLI_CLI_IMAGE_H
#define G4_CLI_CLI_IMAGE_H

#include <jansson.h>
#include <stdint.h>

#include "gemma4c.h"
#include "towers/vision.h"

#define CLI_MAX_IMAGES 64

typedef struct cli_images {
    int n;          /* images */
    int *n_tokens;  /* soft tokens of each */
    int total;      /* soft tokens in all */
    int hidden;     /* floats per row */
    float *embd;    /* [total, hidden] */
} cli_images;

/* Appends the soft tokens of image files, encoded with *vis (created on first use); budget 0 takes the
 * model's default. Prints the error and returns -1 on failure (nothing is appended then). */
int cli_images_add(g4_model *m, g4_vision **vis, const char *const *paths, int n, int budget, cli_images *im);
void cli_images_free(cli_images *im);

/* Copies ids with the i-th image placeholder replaced by <|image> + n_tokens[i] placeholders + <image|>.
 * The placeholders must number im->n. Returns -1 with a message otherwise. */
int cli_images_expand(const g4_model *m, const int32_t *ids, int n, const cli_images *im, int32_t **out,
                      int *n_out, g4_error *err);

/* A user chat message: {"role": "user", "content": TEXT}, or with images the content list
 * [{"type": "image"} x n_images, {"type": "text", "text": TEXT}] (images first, as HF's examples write it). */
json_t *cli_user_message(const char *text, int n_images);

/* Placeholder tokens (soft-token slots) among ids[0..n). */
int cli_count_soft_tokens(const g4_model *m, const int32_t *ids, int n);

/* The most soft tokens one image can have at a budget (0: the default of the model folder's processor
 * config): a batch step must hold them. */
int cli_image_max_tokens(const char *model_dir, int budget);

#endif
