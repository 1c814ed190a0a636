/* The Gemma 4 image processor (docs/gemma4-towers.md 2.1-2.5, transformers' Gemma4ImageProcessor with its
 * default torchvision backend on the CPU): an aspect-preserving target size for a soft-token budget, torch's
 * antialiased bicubic uint8 resize, rescale to [0, 1] in fp32, patchify with (x, y) position ids.
 *
 * Padding: transformers pads every image to budget * k^2 patches (zeros, position (-1, -1)); padded patches
 * never influence real ones (2.6), so the patches here are the real ones only and the tower runs on them. */
#ifndef G4_TOWERS_IMAGE_PROCESSOR_H
#define G4_TOWERS_IMAGE_PROCESSOR_H

#include <stdint.h>

#include "towers/image.h"

typedef struct g4_image_processor {
    int patch_size;       /* 16 */
    int pooling_kernel;   /* k = 3: one soft token per k x k patches */
    int max_soft_tokens;  /* the default budget (280 released) */
    float rescale[256];   /* fl32(v) * fl32(rescale_factor) (2.4) */
} g4_image_processor;

/* The budgets transformers accepts. */
int g4_image_budget_ok(int budget);

/* Reads the image processor settings of a model folder: processor_config.json ("image_processor") or
 * preprocessor_config.json; without either, transformers' class defaults (16, 3, 280). Settings this
 * processor does not implement (do_normalize with a non-identity mean/std, a resample other than bicubic,
 * do_resize false) are errors. */
int g4_image_processor_load(const char *dir, g4_image_processor *p, g4_error *err);
/* transformers' class defaults. */
void g4_image_processor_defaults(g4_image_processor *p);

/* Target height and width for an h x w image and a budget (2.2): multiples of patch * k, at most
 * budget * k^2 patches. */
int g4_image_target_size(const g4_image_processor *p, int h, int w, int budget, int *th, int *tw, g4_error *err);

/* torch's antialiased bicubic resize of uint8 RGB (2.3): width pass, uint8, height pass. */
int g4_image_resize(const g4_image *src, int th, int tw, g4_image *dst, g4_error *err);

typedef struct g4_image_patches {
    int grid_w, grid_h;    /* patches per row and column */
    int n_patches;         /* grid_w * grid_h */
    int n_tokens;          /* soft tokens: n_patches / k^2 */
    int patch_dim;         /* patch * patch * 3 */
    float *pixels;         /* [n_patches, patch_dim] in [0, 1], (row, col, channel) inside a patch */
    int32_t *pos;          /* [n_patches, 2]: (x, y) = (column, row) */
} g4_image_patches;

/* Resize (when the size changes), rescale and patchify one image for a budget (0: the default). */
int g4_image_preprocess(const g4_image_processor *p, const g4_image *img, int budget, g4_image_patches *out,
                        g4_error *err);
void g4_image_patches_free(g4_image_patches *pp);

#endif
