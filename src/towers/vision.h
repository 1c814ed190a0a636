/* The Gemma 4 vision tower and embed_vision (docs/gemma4-towers.md 2.6 and 1), written once against the
 * backend op table: patch embedding (2p - 1, input_proj), learned x/y position tables, encoder layers
 * (RMSNorm, clipped q/k/v, q/k norms, 2-D RoPE, V norm, bidirectional attention with scale 1, clipped o,
 * GeGLU MLP, sandwich norms), 3x3 average pooling by position, sqrt(D) scale, optional standardize, then
 * embed_vision (scale-less RMSNorm and a projection to the text width).
 *
 * One image per call, its real patches only (padding patches never influence real ones, 2.6). Activations
 * are float32 in backend memory, sized for the largest image seen so far. Not thread-safe: one image at a
 * time per tower. */
#ifndef G4_TOWERS_VISION_H
#define G4_TOWERS_VISION_H

#include "model/model.h"
#include "towers/image_processor.h"

typedef struct g4_vision g4_vision;

/* Binds the tower (model.vision_tower.*, model.embed_vision.*) through the model's binder while the model
 * loads (model.c); *out is set (and freed with the model) even when binding then fails. */
int g4_vision_bind(g4_binder *b, g4_model *model, g4_vision **out, g4_error *err);
void g4_vision_free(g4_vision *v);

/* Soft tokens of one preprocessed image: out [n_tokens, text hidden] (host). When tower_out is non-NULL it
 * receives the tower's output before embed_vision, [n_tokens, vision hidden] (for tests). Callers hold the
 * model's backend_lock (g4_image_encode does). */
int g4_vision_encode(g4_vision *v, const g4_image_patches *pp, float *out, float *tower_out, g4_error *err);

/* The patch geometry the tower expects (from the vision config). */
int g4_vision_patch_size(const g4_vision *v);
int g4_vision_pooling_kernel(const g4_vision *v);

#endif
