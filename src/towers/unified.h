/* The encoder-free embedders of Gemma 4 12B (gemma4_unified, docs/gemma4-unified.md 3-5): raw 48x48 pixel
 * blocks and raw 640-sample waveform frames become soft tokens through a few ops, without a tower.
 *
 * Image: the image processor's resize (shared with the other models) to a multiple of 48 pixels, rescale to
 * [0, 1], then one block per 48x48 square in row-major block order, each a (row, col, channel) raster of
 * 6912 values, at block position (bx, by) (3). Embedder (4): LayerNorm, Dense, LayerNorm, + the factorized
 * position table P[bx, 0] + P[by, 1], LayerNorm (eps 1e-5, weight and bias), scale-less RMSNorm, Linear.
 * Only real blocks are embedded (transformers pads to max_soft_tokens rows and drops them again).
 *
 * Audio (5): 16 kHz mono samples, zero-padded to a multiple of 640, one frame per 640 samples (the
 * partially filled last frame counts), each frame a scale-less RMSNorm then a Linear. */
#ifndef G4_TOWERS_UNIFIED_H
#define G4_TOWERS_UNIFIED_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "towers/image_processor.h"

/* Binds the embedders' weights (m->uni) through the model's binder while the model loads (model.c): the
 * checkpoint file's names (model.vision_embedder.*, model.embed_vision.embedding_projection) or the module
 * names other exporters write (docs/gemma4-unified.md 9). */
int g4_unified_bind(g4_binder *b, g4_model *m, g4_error *err);

/* Soft tokens of n image blocks: blocks [n, 3 * block^2] in [0, 1], pos [n, 2] (bx, by) block coordinates,
 * out [n, hidden] (all host memory). */
int g4_unified_embed_image(g4_model *m, const float *blocks, const int32_t *pos, int n, float *out, g4_error *err);

/* Soft tokens of n waveform frames: frames [n, audio_samples], out [n, hidden] (host). */
int g4_unified_embed_audio(g4_model *m, const float *frames, int n, float *out, g4_error *err);

/* Audio tokens of a clip of n samples: ceil(n / audio_samples). */
int g4_unified_audio_tokens(const g4_model *m, size_t n);

/* The frames of a clip of n samples: out [g4_unified_audio_tokens(n), audio_samples], the last one zero-padded. */
void g4_unified_audio_frames(const g4_model *m, const float *pcm, size_t n, float *out);

/* g4_image_encode, g4_image_max_tokens, g4_audio_rate and g4_audio_encode (gemma4c.h) of a gemma4_unified
 * model: the image processor (its patch size times pooling kernel is the block) makes 48-px blocks, the
 * whole clip is one block of ceil(n / 640) tokens (no 30 s clips). */
/* The blocks of an image as the unified processor makes them: out->pixels [n_patches, 3 * block^2],
 * out->pos [n_patches, 2] (bx, by) (g4_image_patches_free). */
int g4_unified_image_blocks(const g4_model *m, const g4_image *img, int budget, g4_image_patches *out, g4_error *err);
int g4_unified_image_encode(g4_model *m, const g4_image *img, int budget, g4_soft_tokens *out, g4_error *err);
int g4_unified_image_max_tokens(const g4_model *m, int budget);
int g4_unified_audio_encode(g4_model *m, const float *pcm, size_t n, g4_soft_tokens *out, g4_error *err);

#endif
