/* Times the audio path on a synthetic signal: the feature extractor and the audio tower with
 * embed_audio (src/towers/), run by bench/audio_tower_speed.sh.
 *   g4-audio-bench DIR [SECONDS] [THREADS] [REPEAT]
 * Prints one line: seconds, soft tokens, features ms, tower ms (best of REPEAT). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "gemma4c.h"
#include "model/model.h"
#include "towers/audio.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: g4-audio-bench DIR [SECONDS] [THREADS] [REPEAT]\n");
        return 1;
    }
    double seconds = argc > 2 ? atof(argv[2]) : 30.0;
    int threads = argc > 3 ? atoi(argv[3]) : 0, repeat = argc > 4 ? atoi(argv[4]) : 2;
    g4_error err;
    g4_model *m;
    g4_load_params lp = {.n_threads = threads};
    if (g4_model_load(argv[1], &lp, &m, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const g4_audio_features_config *fx = g4_audio_tower_features(m->audio);
    size_t n = (size_t)(seconds * fx->sampling_rate);
    if (n > (size_t)fx->max_samples) n = (size_t)fx->max_samples;
    float *pcm = malloc(n * sizeof *pcm);
    unsigned s = 1;
    for (size_t i = 0; i < n; i++) { /* tones and a little noise */
        s = s * 1103515245u + 12345u;
        double t = (double)i / fx->sampling_rate;
        pcm[i] = (float)(0.3 * sin(2 * M_PI * 220 * t) + 0.1 * sin(2 * M_PI * 1700 * t) + 0.01 * ((s >> 8) / 16777216.0 - 0.5));
    }
    const int frames = g4_audio_n_frames(fx, n), tokens = g4_audio_tower_n_tokens(m->audio, frames);
    float *feat = malloc((size_t)frames * fx->n_mels * sizeof *feat);
    float *emb = malloc((size_t)tokens * g4_model_hidden_size(m) * sizeof *emb);
    double best_f = 1e30, best_t = 1e30;
    for (int r = 0; r < repeat; r++) {
        double t0 = now_ms();
        if (g4_audio_features(fx, pcm, n, feat, &err)) break;
        double t1 = now_ms();
        if (g4_audio_tower_encode(m->audio, feat, frames, emb, NULL, &err)) break;
        double t2 = now_ms();
        if (t1 - t0 < best_f) best_f = t1 - t0;
        if (t2 - t1 < best_t) best_t = t2 - t1;
    }
    printf("%.1f s audio, %d soft tokens, features %.1f ms, tower %.1f ms\n", (double)n / fx->sampling_rate, tokens,
           best_f, best_t);
    free(pcm);
    free(feat);
    free(emb);
    g4_model_free(m);
    return 0;
}
