/* Vision-tower speed: one synthetic photo-like image, preprocessed at a budget, encoded `reps` times
 * (after one warm-up). Prints the patch count and the mean milliseconds per image of the tower + embed_vision.
 * The image is the one bench/vision_peer.py makes: channel c of pixel (x, y) = (uint8)(128 + 100 sin(x / (7 + c) + y / 11)).
 * With OUT.f32, the soft tokens [n_tokens, text hidden] are written there (for comparison with the peer).
 *   g4-vision-bench MODEL_DIR [WIDTH HEIGHT] [BUDGET] [REPS] [THREADS] [OUT.f32] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "gemma4c.h"
#include "towers/vision.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: g4-vision-bench MODEL_DIR [WIDTH HEIGHT] [BUDGET] [REPS] [THREADS] [OUT.f32]\n");
        return 1;
    }
    const int W = argc > 3 ? atoi(argv[2]) : 1024, H = argc > 3 ? atoi(argv[3]) : 768;
    const int budget = argc > 4 ? atoi(argv[4]) : 280, reps = argc > 5 && atoi(argv[5]) > 0 ? atoi(argv[5]) : 3;
    const int threads = argc > 6 ? atoi(argv[6]) : 0;
    g4_error err;
    g4_model *m;
    g4_load_params lp = {.n_threads = threads};
    g4_vision *v = NULL;
    g4_image_processor proc;
    g4_image img;
    g4_image_patches pp;
    if (g4_model_load(argv[1], &lp, &m, &err) || g4_image_alloc(&img, W, H, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    if (!(v = m->vision)) {
        fprintf(stderr, "%s: no vision tower\n", argv[1]);
        return 1;
    }
    g4_image_processor_defaults(&proc);
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            for (int c = 0; c < 3; c++)
                img.rgb[((size_t)y * W + x) * 3 + c] = (unsigned char)(128 + 100 * sin(x / (7.0 + c) + y / 11.0));
    if (g4_image_preprocess(&proc, &img, budget, &pp, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    float *out = malloc((size_t)pp.n_tokens * g4_model_hidden_size(m) * sizeof(float));
    double best = 1e30, sum = 0;
    for (int r = -1; r < reps; r++) {
        double t0 = now();
        if (g4_vision_encode(v, &pp, out, NULL, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        double dt = now() - t0;
        if (r < 0) continue; /* warm-up: first touch of the weights and buffers */
        sum += dt;
        if (dt < best) best = dt;
    }
    printf("patches %d tokens %d mean_ms %.1f best_ms %.1f\n", pp.n_patches, pp.n_tokens, 1e3 * sum / reps, 1e3 * best);
    if (argc > 7) {
        FILE *f = fopen(argv[7], "wb");
        size_t cnt = (size_t)pp.n_tokens * g4_model_hidden_size(m);
        if (!f || fwrite(out, sizeof(float), cnt, f) != cnt) {
            fprintf(stderr, "%s: write failed\n", argv[7]);
            return 1;
        }
        fclose(f);
    }
    free(out);
    g4_image_patches_free(&pp);
    g4_image_free(&img);
    g4_model_free(m);
    return 0;
}
