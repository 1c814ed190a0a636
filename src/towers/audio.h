/* Audio input of Gemma 4 E2B/E4B (docs/gemma4-towers.md §3): decoding and resampling to
 * 16 kHz mono, the log-mel feature extractor of transformers' Gemma4AudioFeatureExtractor,
 * and the conformer audio tower with embed_audio, which turns features into soft tokens
 * (rows of the decoder's embedding width) that replace the <|audio|> placeholders (§4).
 *
 * Length limit: the model takes at most 30 s per clip (max_length 480000 samples at
 * 16 kHz; transformers truncates longer input). Here longer input is SPLIT into
 * consecutive clips of 30 s, each encoded on its own and placed as its own
 * <|audio> ... <audio|> block; input up to 30 s is exactly what transformers computes.
 * Decoded audio longer than G4_AUDIO_MAX_SECONDS is refused.
 *
 * Public: g4_audio_load, g4_audio_decode, g4_audio_rate and g4_audio_encode (gemma4c.h); the rest is
 * internal (src/towers/). */
#ifndef G4_TOWERS_AUDIO_H
#define G4_TOWERS_AUDIO_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

#define G4_AUDIO_MAX_SECONDS 600

/* Decoding: g4_audio_load / g4_audio_decode (gemma4c.h, audio_decode.c). */

/* ------------------------------------------------------------ features */

/* The feature extractor's settings (preprocessor_config.json; transformers' defaults). */
typedef struct g4_audio_features_config {
    int sampling_rate, n_mels, frame_length, hop_length, fft_length;
    int max_samples;                  /* samples per clip (max_length, 480000 = 30 s) */
    double min_frequency, max_frequency, mel_floor, preemphasis, input_scale_factor;
    int preemphasis_htk_flavor;
    double *per_bin_mean, *per_bin_stddev; /* [n_mels] or NULL */
} g4_audio_features_config;

/* Reads DIR/preprocessor_config.json (or the "feature_extractor" entry of
 * DIR/processor_config.json); transformers' defaults when neither exists. */
int g4_audio_features_config_load(const char *dir, g4_audio_features_config *cfg, g4_error *err);
void g4_audio_features_config_free(g4_audio_features_config *cfg);

/* Valid feature frames of a clip of n samples (frames whose window ends inside the clip). */
int g4_audio_n_frames(const g4_audio_features_config *cfg, size_t n);

/* Log-mel features of the valid frames of one clip (n <= max_samples):
 * out [g4_audio_n_frames(n), n_mels], exactly the rows transformers marks valid. */
int g4_audio_features(const g4_audio_features_config *cfg, const float *pcm, size_t n, float *out, g4_error *err);

/* --------------------------------------------------------------- tower */

typedef struct g4_audio_tower g4_audio_tower;

/* Binds the audio tower and embed_audio (config "audio_config", the folder's feature extractor settings)
 * through the model's binder while the model loads (model.c); *out is set (and freed with the model) even
 * when binding then fails. */
int g4_audio_tower_bind(g4_binder *b, g4_model *m, g4_audio_tower **out, g4_error *err);
void g4_audio_tower_free(g4_audio_tower *t);

/* The feature extractor settings the tower was loaded with. */
const g4_audio_features_config *g4_audio_tower_features(const g4_audio_tower *t);

/* Soft tokens of a clip with `frames` valid feature frames: ceil(frames / 4). */
int g4_audio_tower_n_tokens(const g4_audio_tower *t, int frames);

/* Runs the tower on features [frames, n_mels] (host) and writes the soft tokens
 * [g4_audio_tower_n_tokens(frames), text hidden] to `embeddings` (host). When
 * `tower_out` is non-NULL the output_proj rows [n, output_proj_dims] go there too.
 * Callers hold the model's backend_lock (g4_audio_encode does). */
int g4_audio_tower_encode(g4_audio_tower *t, const float *features, int frames, float *embeddings, float *tower_out,
                          g4_error *err);

#endif
