/* gemma4c logits -m DIR --ids 2,17,99 [--audio FILE]... -o out.f32
 * One full forward of the ids; writes little-endian float32 logits [n_ids, vocab]. With
 * --audio the ids hold the expanded <|audio|> placeholders as transformers' processor writes
 * input_ids, and the audio files' soft tokens take their places in order. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_audio.h"
#include "cli/cli_common.h"
#include "cli/commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: gemma4c logits -m DIR --ids 2,17,99 -o OUT.f32 [-t THREADS] [--audio FILE]...\n"
            "Writes float32 logits [n_ids, vocab] (little-endian) for every position of one forward pass.\n"
            "--audio: the files' soft tokens fill the <|audio|> ids in order (the ids hold one per soft token,\n"
            "as transformers' processor expands them).\n");
}

int cmd_logits(int argc, char **argv) {
    static const struct option opts[] = {{"model", required_argument, 0, 'm'}, {"ids", required_argument, 0, 'i'},
                                         {"output", required_argument, 0, 'o'}, {"threads", required_argument, 0, 't'},
                                         {"audio", required_argument, 0, 'a'}, {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *dir = NULL, *ids_s = NULL, *out = NULL, *audio_files[16];
    int n_audio = 0;
    long threads = 0;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "m:o:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': dir = optarg; break;
        case 'i': ids_s = optarg; break;
        case 'o': out = optarg; break;
        case 't':
            if (cli_parse_int(optarg, "--threads", 0, 1024, &threads)) return 1;
            break;
        case 'a':
            if (n_audio == 16) return cli_error("logits: at most 16 --audio files");
            audio_files[n_audio++] = optarg;
            break;
        case 'h': usage(stdout); return 0;
        default: return cli_bad_option("logits", argv);
        }
    }
    if (optind < argc) return cli_error("logits: unexpected argument '%s'", argv[optind]);
    if (!ids_s) return cli_error("logits: --ids is required");
    if (!out) return cli_error("logits: -o OUT.f32 is required");
    g4_error err;
    int32_t *ids;
    int n;
    if (cli_parse_ids(ids_s, &ids, &n, &err)) return cli_error("%s", err.msg);
    g4_model *m = cli_load_model(dir, (int)threads);
    if (!m) {
        free(ids);
        return 1;
    }
    int rc = 1;
    const int V = g4_model_vocab_size(m);
    cli_audio audio = {0};
    g4_soft_prompt soft = {0};
    g4_context *ctx = NULL;
    float *logits = NULL;
    FILE *f = NULL;
    for (int i = 0; i < n_audio; i++)
        if (cli_audio_add(&audio, m, audio_files[i])) goto done;
    if (n_audio && g4_soft_prompt_number(ids, n, m->cfg.audio_token_id, audio.n_rows, &soft, &err)) {
        cli_error("%s", err.msg);
        goto done;
    }
    int batch = n < 512 ? n : 512;
    g4_context_params cp = {.n_seq_max = 1, .n_ctx = n, .n_batch = batch};
    if (g4_context_new(m, &cp, &ctx, &err)) {
        cli_error("%s", err.msg);
        goto done;
    }
    logits = malloc((size_t)batch * V * sizeof(float));
    f = fopen(out, "wb");
    if (!logits || !f) {
        cli_error("%s: %s", out, logits ? "cannot open for writing" : "out of memory");
        goto done;
    }
    for (int i = 0; i < n; i += batch) {
        int k = n - i < batch ? n - i : batch;
        g4_batch b = {.n_tokens = k, .token = ids + i, .embeddings = audio.rows,
                      .embedding_row = soft.rows ? soft.rows + i : NULL};
        if (g4_decode(ctx, &b, logits, &err)) {
            cli_error("%s", err.msg);
            goto done;
        }
        if (fwrite(logits, sizeof(float), (size_t)k * V, f) != (size_t)k * V) {
            cli_error("%s: write failed", out);
            goto done;
        }
    }
    if (fclose(f) != 0) {
        f = NULL;
        cli_error("%s: write failed", out);
        goto done;
    }
    f = NULL;
    rc = 0;
done:
    if (f) fclose(f);
    if (rc && out) remove(out);
    free(logits);
    free(ids);
    g4_soft_prompt_free(&soft);
    cli_audio_clear(&audio);
    g4_context_free(ctx);
    g4_model_free(m);
    return rc;
}
