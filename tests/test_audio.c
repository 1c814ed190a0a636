/* Audio input (docs/gemma4-towers.md §3, §4) against ../shared/fixtures/audio (transformers
 * 5.17): input_features from audio0.wav, audio tower output and embed_audio, full-prompt
 * logits and 24 greedy ids with the soft tokens merged. Then inputs made here with
 * libsndfile: silence, a 0.1 s clip, a clip over the 30 s limit (split), stereo, 44.1 kHz
 * and 8 kHz input (features compared with the same band-limited signal sampled at 16 kHz
 * directly, the ideal resampler), FLAC/OGG/MP3, a corrupt file, a non-audio file, an empty
 * file: each gives a clear result or a clear error, and every number is finite. First, an audio
 * bomb (a small FLAC at a huge rate) decodes without holding its input's samples. */
#include <math.h>
#include <sndfile.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "check.h"
#include "engine/context.h"
#include "formats/safetensors.h"
#include "gemma4c.h"
#include "model/model.h"
#include "reference.h"
#include "towers/audio.h"

#define FEATURE_TOL 1e-4f
#define TOWER_REL_TOL 1e-3f
#define LOGIT_TOL 2e-3f
#define RESAMPLE_TOL 1e-2f /* measured 3.0e-3 (44.1 kHz) and 3.1e-3 (8 kHz) */

static float rel_err(const float *a, const float *b, size_t n) { return max_abs_diff(a, b, n) / max_abs(b, n); }

static int all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

static void fixture(g4_model *m) {
    g4_error err;
    g4_tensor_set ref = {0};
    if (g4_safetensors_add_file(&ref, g4t_shared("fixtures/audio/reference.safetensors"), &err) ||
        g4_tensor_set_finish(&ref, &err)) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    const g4_tensor *mask_t = g4_tensor_set_find(&ref, "input_features_mask");
    const g4_tensor *feat_t = g4_tensor_set_find(&ref, "input_features");
    float *ref_feat = ref_f32(&ref, "input_features", NULL), *ref_tower = ref_f32(&ref, "audio_tower_output", NULL);
    float *ref_emb = ref_f32(&ref, "audio_embeddings", NULL), *ref_logits = ref_f32(&ref, "logits", NULL);
    size_t n_ids, n_greedy;
    int32_t *ids = ref_ids(&ref, "input_ids", &n_ids), *greedy = ref_ids(&ref, "greedy_ids", &n_greedy);
    CHECK(mask_t && feat_t && ref_feat && ref_tower && ref_emb && ref_logits && ids && greedy);
    if (!mask_t || !feat_t || !ref_feat || !ref_tower || !ref_emb || !ref_logits || !ids || !greedy) goto done;
    const g4_audio_tower *t = m->audio;
    const int M = (int)feat_t->shape[2], H = g4_model_hidden_size(m), V = g4_model_vocab_size(m);
    int ref_valid = 0;
    for (int64_t i = 0; i < mask_t->shape[1]; i++) ref_valid += ((const uint8_t *)mask_t->data)[i] != 0;

    /* 1. features of audio0.wav */
    float *pcm;
    size_t n;
    CHECKF(g4_audio_load(g4t_shared("fixtures/audio/audio0.wav"), 16000, &pcm, &n, &err) == 0, "%s", err.msg);
    g4_audio_features_config fx;
    CHECKF(g4_audio_features_config_load(g4t_shared("fixtures/audio"), &fx, &err) == 0, "%s", err.msg);
    const int frames = g4_audio_n_frames(&fx, n);
    CHECKF(frames == ref_valid, "%d valid frames, the reference has %d", frames, ref_valid);
    float *feat = malloc((size_t)frames * M * sizeof *feat);
    CHECKF(g4_audio_features(&fx, pcm, n, feat, &err) == 0, "%s", err.msg);
    float e_feat = max_abs_diff(feat, ref_feat, (size_t)frames * M);
    fprintf(stderr, "input_features: %d frames, max abs error %.3g\n", frames, e_feat);
    CHECKF(e_feat <= FEATURE_TOL, "input_features differ by %g", e_feat);

    /* 2. tower and embed_audio, from the reference features and from ours */
    const int N = g4_audio_tower_n_tokens(t, frames), P = (int)g4_tensor_set_find(&ref, "audio_tower_output")->shape[1];
    CHECKF(N == (int)g4_tensor_set_find(&ref, "audio_embeddings")->shape[0], "%d soft tokens", N);
    float *emb = malloc((size_t)N * H * sizeof *emb), *tow = malloc((size_t)N * P * sizeof *tow);
    for (int own = 0; own < 2; own++) {
        CHECKF(g4_audio_tower_encode(m->audio, own ? feat : ref_feat, frames, emb, tow, &err) == 0, "%s", err.msg);
        float e_tower = rel_err(tow, ref_tower, (size_t)N * P), e_emb = rel_err(emb, ref_emb, (size_t)N * H);
        fprintf(stderr, "%s features: audio_tower_output rel error %.3g, audio_embeddings rel error %.3g\n",
                own ? "own" : "reference", e_tower, e_emb);
        CHECKF(e_tower <= TOWER_REL_TOL, "tower output differs by %g relative", e_tower);
        CHECKF(e_emb <= TOWER_REL_TOL, "embeddings differ by %g relative", e_emb);
    }

    /* 3. the whole prompt with the soft tokens (ours) merged: logits of every position, then greedy */
    const int T = (int)n_ids;
    CHECKF(g4_count_soft_tokens(m, ids, T) == N, "%d placeholders for %d soft tokens", g4_count_soft_tokens(m, ids, T), N);
    g4_context *ctx = NULL;
    g4_context_params cp = {.n_seq_max = 1, .n_ctx = 160, .n_batch = 40};
    CHECKF(g4_context_new(m, &cp, &ctx, &err) == 0, "%s", err.msg);
    float *logits = malloc((size_t)T * V * sizeof *logits);
    float e_logits = 0;
    for (int i = 0, used = 0; i < T && ctx; i += 40) { /* chunks of 40 split the run of soft tokens */
        int c = T - i < 40 ? T - i : 40, k = g4_count_soft_tokens(m, ids + i, c);
        g4_batch b = {.n_tokens = c, .token = ids + i, .embd = emb + (size_t)used * H, .n_embd = k};
        CHECKF(g4_decode(ctx, &b, logits + (size_t)i * V, &err) == 0, "%s", err.msg);
        used += k;
    }
    e_logits = max_abs_diff(logits, ref_logits, (size_t)T * V);
    fprintf(stderr, "logits: max abs error %.3g\n", e_logits);
    CHECKF(e_logits <= LOGIT_TOL, "logits differ by %g", e_logits);
    /* greedy through a generation: the prompt as the chat template writes it (one <|audio|>), expanded by the
     * generation from the soft tokens */
    int32_t *rows = malloc((size_t)T * sizeof *rows), got[24];
    int n_un = 0, n_got = 0;
    for (int i = 0; i < T; i++)
        if (ids[i] == m->cfg.boa_token_id) rows[n_un++] = m->cfg.audio_token_id;
        else if (ids[i] != m->cfg.audio_token_id && ids[i] != m->cfg.eoa_token_id) rows[n_un++] = ids[i];
    g4_soft_tokens media = {.kind = G4_MEDIA_AUDIO, .n_blocks = 1, .block_tokens = (int[]){N}, .n_tokens = N,
                            .hidden = H, .rows = emb};
    g4_sampler_params sp;
    g4_sampler_params_default(&sp);
    sp.temperature = 0;
    g4_generation_params gp = {.max_new_tokens = 24, .sampling = &sp, .ignore_eos = 1, .media = &media, .n_media = 1};
    g4_generation *gen;
    g4_seq_reset(ctx, 0);
    if (g4_generation_start(ctx, 0, rows, n_un, &gp, &gen, &err) == 0) {
        CHECKF(g4_generation_run(gen, NULL, NULL, &err) == 0, "%s", err.msg);
        const int32_t *o = g4_generation_tokens(gen, &n_got);
        memcpy(got, o, (size_t)(n_got < 24 ? n_got : 24) * sizeof *got);
        g4_generation_free(gen);
    } else {
        CHECKF(0, "%s", err.msg);
    }
    CHECK(n_got == 24 && n_greedy == 24);
    int same = n_got == 24;
    for (int i = 0; i < n_got && i < 24; i++) same &= got[i] == greedy[i];
    fprintf(stderr, "greedy ids %s\n", same ? "identical" : "DIFFER");
    CHECK(same);
    free(logits);
    free(rows);
    g4_context_free(ctx);
    free(emb);
    free(tow);
    free(feat);
    g4_free(pcm);
    g4_audio_features_config_free(&fx);
done:
    free(ref_feat);
    free(ref_tower);
    free(ref_emb);
    free(ref_logits);
    free(ids);
    free(greedy);
    g4_tensor_set_free(&ref);
}

/* ------------------------------------------------------------ made inputs */
static int write_sound(const char *path, int format, int rate, int channels, const float *x, size_t frames) {
    SF_INFO info = {.samplerate = rate, .channels = channels, .format = format};
    if (!sf_format_check(&info)) return -1;
    SNDFILE *f = sf_open(path, SFM_WRITE, &info);
    if (!f) return -1;
    sf_count_t w = sf_writef_float(f, x, (sf_count_t)frames);
    sf_close(f);
    return w == (sf_count_t)frames ? 0 : -1;
}

static int write_shorts(const char *path, int format, const short *x, size_t frames) {
    SF_INFO info = {.samplerate = 16000, .channels = 1, .format = format};
    SNDFILE *f = sf_open(path, SFM_WRITE, &info);
    if (!f) return -1;
    sf_count_t w = sf_writef_short(f, x, (sf_count_t)frames);
    sf_close(f);
    return w == (sf_count_t)frames ? 0 : -1;
}

/* A band-limited test signal (tones at 440, 1250 and 3100 Hz, 50 ms raised-cosine fades) at time s. */
static float tone(double s, double dur) {
    const double pi = 3.14159265358979323846, fade = 0.05;
    double env = s < fade ? 0.5 - 0.5 * cos(pi * s / fade) : s > dur - fade ? 0.5 - 0.5 * cos(pi * (dur - s) / fade) : 1;
    if (s < 0 || s > dur) env = 0;
    return (float)(env * (0.3 * sin(2 * pi * 440 * s) + 0.2 * sin(2 * pi * 1250 * s) + 0.1 * sin(2 * pi * 3100 * s)));
}

static float *sampled(int rate, double dur, size_t *n) {
    *n = (size_t)(dur * rate + 0.5);
    float *x = malloc(*n * sizeof *x);
    for (size_t i = 0; i < *n; i++) x[i] = tone((double)i / rate, dur);
    return x;
}

/* features of a file against the features of `want` (16 kHz samples): max abs difference */
static float feature_diff(const g4_audio_tower *t, const char *path, const float *want, size_t n_want) {
    const g4_audio_features_config *fx = g4_audio_tower_features(t);
    g4_error err;
    float *pcm = NULL;
    size_t n = 0;
    if (g4_audio_load(path, 16000, &pcm, &n, &err)) {
        CHECKF(0, "%s", err.msg);
        return INFINITY;
    }
    CHECKF(n == n_want, "%s: %zu samples, %zu expected", path, n, n_want);
    int fr = g4_audio_n_frames(fx, n);
    float *a = malloc((size_t)fr * fx->n_mels * sizeof *a + 1), *b = malloc((size_t)fr * fx->n_mels * sizeof *b + 1);
    float d = INFINITY;
    if (n == n_want && !g4_audio_features(fx, pcm, n, a, &err) && !g4_audio_features(fx, want, n, b, &err))
        d = max_abs_diff(a, b, (size_t)fr * fx->n_mels);
    free(a);
    free(b);
    free(pcm);
    return d;
}

/* encodes a file; returns its soft-token count (-1 with the message in err) and checks every row is finite */
static int encode(g4_model *m, const char *path, g4_soft_tokens *e, g4_error *err) {
    float *pcm;
    size_t n;
    memset(e, 0, sizeof *e);
    if (g4_audio_load(path, g4_audio_rate(m), &pcm, &n, err)) return -1;
    int rc = g4_audio_encode(m, pcm, n, e, err);
    g4_free(pcm);
    if (rc) return -1;
    CHECKF(all_finite(e->rows, (size_t)e->n_tokens * e->hidden), "%s: embeddings are not finite", path);
    return e->n_tokens;
}

static void made_inputs(g4_model *m) {
    g4_error err;
    g4_soft_tokens e;
    const g4_audio_tower *t = m->audio;
    const g4_audio_features_config *fx = g4_audio_tower_features(t);
    const int WAV16 = SF_FORMAT_WAV | SF_FORMAT_PCM_16, WAVF = SF_FORMAT_WAV | SF_FORMAT_FLOAT;

    /* silence, 1 s: 99 frames -> 25 soft tokens, features all ln(0.001) */
    float *zeros = calloc(16000 * 31, sizeof *zeros);
    CHECK(write_sound(g4t_tmp("audio_silence.wav"), WAV16, 16000, 1, zeros, 16000) == 0);
    CHECKF(encode(m, g4t_tmp("audio_silence.wav"), &e, &err) == 25, "silence: %s", err.msg);
    g4_soft_tokens_free(&e);
    float feat[128];
    CHECK(g4_audio_n_frames(fx, 161) == 1 && g4_audio_n_frames(fx, 160) == 0);
    CHECK(g4_audio_features(fx, zeros, 161, feat, &err) == 0 && fabsf(feat[5] - logf(0.001f)) < 1e-6f);

    /* 0.1 s: 9 frames -> 3 soft tokens; 10 ms (160 samples) has no frame: a clear error */
    size_t n;
    float *x = sampled(16000, 0.1, &n);
    CHECK(write_sound(g4t_tmp("audio_short.wav"), WAV16, 16000, 1, x, n) == 0);
    CHECKF(encode(m, g4t_tmp("audio_short.wav"), &e, &err) == 3, "0.1 s: %s", err.msg);
    g4_soft_tokens_free(&e);
    CHECK(write_sound(g4t_tmp("audio_tiny.wav"), WAV16, 16000, 1, x, 160) == 0);
    CHECK(encode(m, g4t_tmp("audio_tiny.wav"), &e, &err) < 0 && strstr(err.msg, "too short"));
    fprintf(stderr, "10 ms clip: %s\n", err.msg);
    free(x);

    /* 31 s: split into 30 s (750 tokens) and 1 s (25 tokens) */
    CHECK(write_sound(g4t_tmp("audio_long.wav"), WAV16, 16000, 1, zeros, 16000 * 31) == 0);
    CHECKF(encode(m, g4t_tmp("audio_long.wav"), &e, &err) == 775, "31 s: %s", err.msg);
    CHECK(e.n_blocks == 2 && e.block_tokens[0] == 750 && e.block_tokens[1] == 25);
    g4_soft_tokens_free(&e);
    free(zeros);

    /* stereo: the channels are averaged */
    float *st = malloc(2 * 8000 * sizeof *st), *mono;
    for (int i = 0; i < 8000; i++) {
        st[2 * i] = tone(i / 16000.0, 0.5);
        st[2 * i + 1] = 0.5f * tone(i / 16000.0 + 0.001, 0.5);
    }
    CHECK(write_sound(g4t_tmp("audio_stereo.wav"), WAVF, 16000, 2, st, 8000) == 0);
    CHECKF(g4_audio_load(g4t_tmp("audio_stereo.wav"), 16000, &mono, &n, &err) == 0, "%s", err.msg);
    int same = n == 8000;
    for (size_t i = 0; same && i < n; i++) same = mono[i] == (st[2 * i] + st[2 * i + 1]) / 2.0f;
    CHECK(same);
    free(mono);
    free(st);

    /* 44.1 kHz and 8 kHz: features after resampling against the 16 kHz sampling of the same signal */
    float *x16 = sampled(16000, 1.0, &n);
    const int rates[2] = {44100, 8000};
    for (int r = 0; r < 2; r++) {
        size_t nr;
        float *xr = sampled(rates[r], 1.0, &nr);
        char name[64];
        snprintf(name, sizeof name, "audio_%d.wav", rates[r]);
        CHECK(write_sound(g4t_tmp(name), WAVF, rates[r], 1, xr, nr) == 0);
        float d = feature_diff(t, g4t_tmp(name), x16, n);
        fprintf(stderr, "%d Hz: features after resampling differ from direct 16 kHz sampling by %.3g\n", rates[r], d);
        CHECKF(d <= RESAMPLE_TOL, "%d Hz: features differ by %g", rates[r], d);
        free(xr);
    }

    /* other containers and codecs libsndfile writes and reads: the same length (lossless FLAC: the
     * same samples as the 16-bit WAV) */
    static const struct {
        const char *name;
        int format;
    } kinds[] = {{"audio.flac", SF_FORMAT_FLAC | SF_FORMAT_PCM_16}, {"audio.ogg", SF_FORMAT_OGG | SF_FORMAT_VORBIS},
                 {"audio.opus", SF_FORMAT_OGG | SF_FORMAT_OPUS}, {"audio.mp3", SF_FORMAT_MPEG | SF_FORMAT_MPEG_LAYER_III}};
    CHECK(write_sound(g4t_tmp("audio16.wav"), WAV16, 16000, 1, x16, n) == 0);
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        SF_INFO probe = {.samplerate = 16000, .channels = 1, .format = kinds[k].format};
        if (!sf_format_check(&probe)) {
            fprintf(stderr, "%s: this libsndfile cannot write it, not tested\n", kinds[k].name);
            continue;
        }
        CHECK(write_sound(g4t_tmp(kinds[k].name), kinds[k].format, 16000, 1, x16, n) == 0);
        g4_soft_tokens_free(&e);
        int tokens = encode(m, g4t_tmp(kinds[k].name), &e, &err);
        CHECKF(tokens == 25, "%s: %d tokens (%s)", kinds[k].name, tokens, tokens < 0 ? err.msg : "");
        g4_soft_tokens_free(&e);
    }
    /* lossless FLAC decodes to the very samples of a 16-bit WAV */
    short *pcm16 = malloc(n * sizeof *pcm16);
    for (size_t i = 0; i < n; i++) pcm16[i] = (short)lrintf(x16[i] * 32767.0f);
    float *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    const char *w16 = g4t_tmp("audio_i16.wav"), *fl = g4t_tmp("audio_i16.flac");
    CHECK(write_shorts(w16, WAV16, pcm16, n) == 0 && write_shorts(fl, SF_FORMAT_FLAC | SF_FORMAT_PCM_16, pcm16, n) == 0);
    CHECK(g4_audio_load(w16, 16000, &a, &na, &err) == 0 && g4_audio_load(fl, 16000, &b, &nb, &err) == 0);
    CHECK(na == n && nb == n && a && b && memcmp(a, b, n * sizeof *a) == 0 && a[100] == pcm16[100] / 32768.0f);
    free(a);
    free(b);
    free(pcm16);

    /* bad files: clear errors */
    FILE *f = fopen(g4t_tmp("audio_corrupt.wav"), "wb");
    static const char corrupt[] = "RIFF\x24\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x07\x00\x09\x00garbage-garbage-";
    fwrite(corrupt, 1, sizeof corrupt - 1, f);
    fclose(f);
    f = fopen(g4t_tmp("audio_empty.wav"), "wb");
    fclose(f);
    const char *bad[] = {g4t_tmp("audio_corrupt.wav"), g4t_shared("fixtures/audio/config.json"),
                         g4t_tmp("audio_empty.wav"), g4t_tmp("audio_missing.wav")};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        err.msg[0] = 0;
        CHECKF(encode(m, bad[k], &e, &err) < 0 && err.msg[0] && !strchr(err.msg, '\n'), "%s was accepted", bad[k]);
        fprintf(stderr, "%s\n", err.msg);
    }
    /* float samples that are NaN, infinite, or finite but too large for the spectrum: an error that says which */
    static const struct {
        float v;
        const char *says;
    } odd[] = {{NAN, "not a finite number"}, {-INFINITY, "not a finite number"}, {3e38f, "beyond"}, {-2e30f, "beyond"}};
    for (size_t k = 0; k < sizeof odd / sizeof odd[0]; k++) {
        float *y = malloc(n * sizeof *y);
        memcpy(y, x16, n * sizeof *y);
        y[n / 2] = odd[k].v;
        CHECK(write_sound(g4t_tmp("audio_odd.wav"), WAVF, 16000, 1, y, n) == 0);
        err.msg[0] = 0;
        CHECKF(encode(m, g4t_tmp("audio_odd.wav"), &e, &err) < 0 && strstr(err.msg, odd[k].says), "%g: %s", odd[k].v,
               err.msg);
        free(y);
    }
    /* a WAV cut short in its data (the header still says 1 s): the samples that are there */
    CHECK(truncate(g4t_tmp("audio16.wav"), 44 + 2 * 8000) == 0);
    CHECKF(g4_audio_load(g4t_tmp("audio16.wav"), 16000, &mono, &n, &err) == 0 && n == 8000, "cut WAV: %s", err.msg);
    free(mono);
    free(x16);
}

/* placeholder expansion (g4_prompt_expand): two audio files, the second split into two clips, and an image
 * between them; each kind's placeholders take that kind's inputs in order */
static void expansion(const g4_model *m) {
    g4_error err;
    const g4_model_config *c = &m->cfg;
    const int32_t A = c->audio_token_id, I = c->image_token_id, H = c->text.hidden_size;
    const int32_t ids[] = {2, 10, A, 11, I, 12, A};
    float *rows = malloc(8 * (size_t)H * sizeof *rows);
    for (int r = 0; r < 8; r++)
        for (int j = 0; j < H; j++) rows[(size_t)r * H + j] = (float)(100 * r + j % 7);
    int blocks_a[] = {3}, blocks_i[] = {2}, blocks_b[] = {2, 1};
    const g4_soft_tokens in[3] = {{G4_MEDIA_AUDIO, 1, blocks_a, 3, H, rows},
                                  {G4_MEDIA_IMAGE, 1, blocks_i, 2, H, rows + 3 * (size_t)H},
                                  {G4_MEDIA_AUDIO, 2, blocks_b, 3, H, rows + 5 * (size_t)H}};
    int32_t *out;
    float *embd;
    int n_out, n_embd;
    CHECKF(g4_prompt_expand(m, ids, 7, in, 3, &out, &n_out, &embd, &n_embd, &err) == 0, "%s", err.msg);
    const int32_t BA = c->boa_token_id, EA = c->eoa_token_id, BI = c->boi_token_id, EI = c->eoi_token_id;
    const int32_t want[] = {2, 10, BA, A, A, A, EA, 11, BI, I, I, EI, 12, BA, A, A, EA, BA, A, EA};
    CHECK(n_out == 20 && !memcmp(out, want, sizeof want) && n_embd == 8);
    int in_order = n_embd == 8;
    for (int r = 0; in_order && r < 8; r++) in_order = !memcmp(embd + (size_t)r * H, rows + (size_t)r * H, H * sizeof *rows);
    CHECK(in_order);
    /* the same rows for the expanded ids (g4_soft_tokens_gather), and the counts must agree */
    float *again;
    CHECK(g4_soft_tokens_gather(m, out, n_out, in, 3, &again, &n_embd, &err) == 0 && n_embd == 8 &&
          !memcmp(again, embd, 8 * (size_t)H * sizeof *again));
    g4_free(again);
    CHECK(g4_soft_tokens_gather(m, out, n_out - 3, in, 3, &again, &n_embd, &err) < 0 && strstr(err.msg, "soft token"));
    g4_free(out);
    g4_free(embd);
    CHECK(g4_prompt_expand(m, ids, 7, in, 2, &out, &n_out, &embd, &n_embd, &err) < 0 &&
          strstr(err.msg, "2 audio placeholders for 1 audio"));
    fprintf(stderr, "expansion: a missing input -> %s\n", err.msg);
    free(rows);
}

/* An audio bomb: two minutes of FLAC silence at 655350 Hz (FLAC's highest rate) is a file of a few hundred
 * kilobytes that holds 78.6 million samples. Decoding it to 16 kHz must cost memory in proportion to the
 * 16 kHz result (1.9 million samples, 7.7 MB), not to the input's samples (315 MB as float). Run before
 * the model loads, so the process's peak resident size measures the decode alone. */
static long peak_rss_kb(void) {
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : -1;
}

static void bomb(void) {
    const int rate = 655350, secs = 120;
    SF_INFO info = {.samplerate = rate, .channels = 1, .format = SF_FORMAT_FLAC | SF_FORMAT_PCM_16};
    if (!sf_format_check(&info)) {
        fprintf(stderr, "bomb: this libsndfile does not write FLAC at %d Hz; skipped\n", rate);
        return;
    }
    const char *path = g4t_tmp("audio_bomb.flac");
    SNDFILE *f = sf_open(path, SFM_WRITE, &info);
    CHECK(f != NULL);
    if (!f) return;
    short *z = calloc(rate, sizeof *z);
    for (int s = 0; s < secs; s++) CHECK(sf_writef_short(f, z, rate) == rate);
    sf_close(f);
    free(z);
    long before = peak_rss_kb();
    float *pcm = NULL;
    size_t n = 0;
    g4_error err;
    CHECKF(g4_audio_load(path, 16000, &pcm, &n, &err) == 0, "%s", err.msg);
    long grew = peak_rss_kb() - before;
    const size_t frames = (size_t)rate * secs, want = (frames * 16000 + rate - 1) / rate; /* librosa's length */
    CHECKF(n == want, "%zu samples, not %zu", n, want);
    int zero = 1;
    for (size_t i = 0; i < n && pcm; i++) zero &= pcm[i] == 0;
    CHECK(zero);
    /* the result is 7.7 MB; the input's samples as float would be 315 MB */
    CHECKF(grew >= 0 && grew < 100 * 1024, "decoding %zu samples at %d Hz raised the peak resident size by %ld MB",
           frames, rate, grew / 1024);
    fprintf(stderr, "bomb: %zu samples at %d Hz -> %zu at 16 kHz, peak resident size +%ld MB\n", frames, rate, n,
            grew / 1024);
    g4_free(pcm);
    unlink(path);
}

int main(void) {
    g4_error err;
    g4_model *m;
    g4_load_params lp = {.n_threads = 2};
    bomb();
    if (g4_model_load(g4t_shared("fixtures/audio"), &lp, &m, &err)) {
        fprintf(stderr, "load: %s\n", err.msg);
        return 1;
    }
    CHECKF(g4_model_warnings(m) == NULL, "warnings: %s", g4_model_warnings(m));
    expansion(m);
    fixture(m);
    made_inputs(m);
    g4_model_free(m);
    return g4t_done();
}
