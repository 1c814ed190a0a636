/* g4-tokenizer-bench: times loading a tokenizer and one g4_tokenize call over a whole file.
 *
 *   g4-tokenizer-bench (--tokenizer FILE | -m DIR) --text FILE [--repeat N] [--ids-out FILE]
 *
 * Prints one "key: value" line per measurement. --ids-out writes the ids (without BOS) as
 * one JSON array, for comparison with another implementation.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/mapped_file.h"
#include "tokenizer/tokenizer.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void usage(FILE *f) {
    fprintf(f, "usage: g4-tokenizer-bench (--tokenizer FILE | -m DIR) --text FILE [--repeat N] [--ids-out FILE]\n");
}

int main(int argc, char **argv) {
    const char *tok_path = NULL, *model_dir = NULL, *text_path = NULL, *ids_out = NULL;
    int repeat = 3;
    static const struct option opts[] = {{"tokenizer", required_argument, 0, 't'},
                                         {"model", required_argument, 0, 'm'},
                                         {"text", required_argument, 0, 'f'},
                                         {"repeat", required_argument, 0, 'r'},
                                         {"ids-out", required_argument, 0, 'o'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "t:m:f:r:o:h", opts, NULL)) != -1) {
        switch (c) {
        case 't': tok_path = optarg; break;
        case 'm': model_dir = optarg; break;
        case 'f': text_path = optarg; break;
        case 'r': repeat = atoi(optarg); break;
        case 'o': ids_out = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 1;
        }
    }
    if ((!tok_path && !model_dir) || !text_path || repeat < 1) {
        usage(stderr);
        return 1;
    }
    g4_error err;
    g4_tokenizer *tok;
    double t0 = now_s();
    int rc = tok_path ? g4_tokenizer_load(tok_path, &tok, &err) : g4_tokenizer_load_dir(model_dir, &tok, &err);
    double t_load = now_s() - t0;
    if (rc) {
        fprintf(stderr, "g4-tokenizer-bench: %s\n", err.msg);
        return 1;
    }
    printf("load_s: %.4f (%s)\n", t_load, g4_tokenizer_loaded_from_cache(tok) ? "from cache" : "parsed JSON");

    char *text;
    size_t len;
    if (g4_read_file(text_path, &text, &len, &err)) {
        fprintf(stderr, "g4-tokenizer-bench: %s\n", err.msg);
        g4_tokenizer_free(tok);
        return 1;
    }
    double best = 1e30, best_cpu = 1e30;
    g4_tokens ids = {0};
    for (int r = 0; r < repeat; r++) {
        ids.n = 0;
        t0 = now_s();
        double c0 = cpu_s();
        rc = g4_tokenize(tok, text, len, 0, &ids, &err);
        double dt = now_s() - t0, dc = cpu_s() - c0;
        if (dc < best_cpu) best_cpu = dc;
        if (rc) {
            fprintf(stderr, "g4-tokenizer-bench: %s\n", err.msg);
            break;
        }
        if (dt < best) best = dt;
    }
    if (!rc) {
        printf("bytes: %zu\ntokens: %zu\nencode_s: %.4f\nencode_MBps: %.2f\nencode_cpu_MBps: %.2f\n", len, ids.n,
               best, len / best / 1e6, len / best_cpu / 1e6);
        t0 = now_s();
        char *back;
        size_t blen;
        rc = g4_detokenize(tok, ids.ids, ids.n, 0, &back, &blen, &err);
        double dt = now_s() - t0;
        if (!rc) {
            printf("decode_MBps: %.2f\nround_trip: %s\n", blen / dt / 1e6,
                   blen == len && !memcmp(back, text, len) ? "identical" : "DIFFERENT");
            free(back);
        }
    }
    if (!rc && ids_out) {
        FILE *f = fopen(ids_out, "w");
        if (!f) {
            perror(ids_out);
            rc = 1;
        } else {
            fputc('[', f);
            for (size_t i = 0; i < ids.n; i++) fprintf(f, i ? ",%d" : "%d", ids.ids[i]);
            fputs("]\n", f);
            fclose(f);
        }
    }
    free(ids.ids);
    free(text);
    g4_tokenizer_free(tok);
    return rc ? 1 : 0;
}
