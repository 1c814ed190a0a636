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
 * Internal API (src/towers/); shaped to join include/gemma4c.h later. */
#ifndef G4_TOWERS_AUDIO_H
#define G4_TOWERS_AUDIO_H

#include <stddef.h>
#include <stdint.h>

#include "gemma4c.h"

#define G4_AUDIO_MAX_SECONDS 600

/* ---------------------------------------------------------------- decoding */

/* Decodes an audio file held in memory (any format libsndfile reads: WAV, FLAC, OGG/Vorbis,
 * Opus, MP3, ...) to mono float PCM at `rate` Hz: channels are averaged, other sample rates
 * are converted with libsoxr at its HQ quality (what librosa.load, transformers' audio loader
 * without torchcodec, does), and the length is ceil(n * rate / rate_in) like librosa's.
 * `name` labels errors. *out is malloc'd. */
int g4_audio_decode(const void *data, size_t size, const char *name, int rate, float **out, size_t *n,
                    g4_error *err);
/* The same for a file. */
int g4_audio_decode_file(const char *path, int rate, float **out, size_t *n, g4_error *err);

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

struct g4_model;
typedef struct g4_audio_tower g4_audio_tower;

/* Binds the audio tower and embed_audio of a loaded model (config "audio_config"). */
int g4_audio_tower_load(struct g4_model *m, g4_audio_tower **out, g4_error *err);
void g4_audio_tower_free(g4_audio_tower *t);

/* The feature extractor settings the tower was loaded with. */
const g4_audio_features_config *g4_audio_tower_features(const g4_audio_tower *t);

/* Soft tokens of a clip with `frames` valid feature frames: ceil(frames / 4). */
int g4_audio_tower_n_tokens(const g4_audio_tower *t, int frames);

/* Runs the tower on features [frames, n_mels] (host) and writes the soft tokens
 * [g4_audio_tower_n_tokens(frames), text hidden] to `embeddings` (host). When
 * `tower_out` is non-NULL the output_proj rows [n, output_proj_dims] go there too. */
int g4_audio_tower_encode(g4_audio_tower *t, const float *features, int frames, float *embeddings, float *tower_out,
                          g4_error *err);

/* ------------------------------------------------------------ one file */

/* Everything a prompt needs from one audio input: decoded, split into clips of at most
 * max_samples, each clip's soft tokens. */
typedef struct g4_audio_embeddings {
    int n_clips;
    int *clip_tokens;  /* [n_clips] soft tokens of each clip */
    int n_tokens;      /* their sum */
    int hidden;
    float *rows;       /* [n_tokens, hidden], the clips' tokens one after the other */
} g4_audio_embeddings;

/* PCM (16 kHz mono) -> soft tokens, clip by clip. */
int g4_audio_embed_pcm(struct g4_model *m, const float *pcm, size_t n, g4_audio_embeddings *out, g4_error *err);
/* A file -> soft tokens. */
int g4_audio_embed_file(struct g4_model *m, const char *path, g4_audio_embeddings *out, g4_error *err);
void g4_audio_embeddings_free(g4_audio_embeddings *e);

#endif
