/* gemma4c encode-image -m DIR --image FILE [--image FILE] [--budget N] -o OUT.f32
 * The soft tokens of images as the decoder receives them (vision tower + embed_vision,
 * docs/gemma4-towers.md 2): little-endian float32 [n_tokens, hidden], images concatenated. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli_common.h"
#include "cli/cli_image.h"
#include "cli/commands.h"

static void usage(FILE *f) {
    fprintf(f, "usage: gemma4c encode-image -m DIR --image FILE [--image FILE ...] [--budget N] -o OUT.f32 [-t THREADS]\n"
               "Writes float32 soft-token embeddings [n_tokens, hidden] (little-endian), images in order.\n"
               "  --budget N   soft tokens per image at most: 70, 140, 280, 560 or 1120 (default: the model's)\n");
}

int cmd_encode_image(int argc, char **argv) {
    enum { OPT_IMAGE = 2000, OPT_BUDGET };
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},   {"image", required_argument, 0, OPT_IMAGE},
                                         {"budget", required_argument, 0, OPT_BUDGET}, {"output", required_argument, 0, 'o'},
                                         {"threads", required_argument, 0, 't'}, {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *dir = NULL, *out = NULL, *images[CLI_MAX_IMAGES];
    int n_images = 0, c;
    long threads = 0, budget = 0;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "m:o:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': dir = optarg; break;
        case 'o': out = optarg; break;
        case OPT_IMAGE:
            if (n_images == CLI_MAX_IMAGES) return cli_error("encode-image: at most %d images", CLI_MAX_IMAGES);
            images[n_images++] = optarg;
            break;
        case OPT_BUDGET:
            if (cli_parse_int(optarg, "--budget", 1, 1 << 20, &budget)) return 1;
            break;
        case 't':
            if (cli_parse_int(optarg, "--threads", 0, 1024, &threads)) return 1;
            break;
        case 'h': usage(stdout); return 0;
        default: return cli_bad_option("encode-image", argv);
        }
    }
    if (optind < argc) return cli_error("encode-image: unexpected argument '%s'", argv[optind]);
    if (!n_images) return cli_error("encode-image: --image FILE is required");
    if (!out) return cli_error("encode-image: -o OUT.f32 is required");
    g4_model *m = cli_load_model(dir, (int)threads);
    if (!m) return 1;
    g4_vision *vis = NULL;
    cli_images im = {0};
    int rc = 1;
    FILE *f = NULL;
    if (cli_images_add(m, &vis, images, n_images, (int)budget, &im)) goto done;
    const size_t count = (size_t)im.total * (size_t)im.hidden;
    if (!(f = fopen(out, "wb"))) {
        cli_error("%s: cannot open for writing", out);
        goto done;
    }
    if (fwrite(im.embd, sizeof(float), count, f) != count || fclose(f) != 0) {
        f = NULL;
        cli_error("%s: write failed", out);
        goto done;
    }
    f = NULL;
    for (int i = 0; i < im.n; i++) fprintf(stderr, "%s: %d soft tokens\n", images[i], im.n_tokens[i]);
    rc = 0;
done:
    if (f) fclose(f);
    if (rc && out) remove(out);
    cli_images_free(&im);
    g4_vision_free(vis);
    g4_model_free(m);
    return rc;
}
