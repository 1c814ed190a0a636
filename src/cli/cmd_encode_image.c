/* gemma4c encode-image -m DIR --image FILE [--image FILE] [--budget N] -o OUT.f32
 * The soft tokens of images as the decoder receives them (vision tower + embed_vision,
 * docs/gemma4-towers.md 2): little-endian float32 [n_tokens, hidden], images concatenated. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli_common.h"
#include "cli/cli_media.h"
#include "cli/commands.h"

static void usage(FILE *f) {
    fprintf(f, "usage: gemma4c encode-image -m DIR --image FILE [--image FILE ...] [--budget N] -o OUT.f32|- [-t THREADS]\n"
               "Writes float32 soft-token embeddings [n_tokens, hidden] (little-endian), images in order.\n"
               "  --budget N   soft tokens per image at most: 70, 140, 280, 560 or 1120 (default: the model's)\n");
}

int cmd_encode_image(int argc, char **argv) {
    enum { OPT_IMAGE = 2000, OPT_BUDGET };
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},   {"image", required_argument, 0, OPT_IMAGE},
                                         {"budget", required_argument, 0, OPT_BUDGET}, {"output", required_argument, 0, 'o'},
                                         {"threads", required_argument, 0, 't'}, {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *dir = NULL, *out = NULL, *images[CLI_MAX_MEDIA];
    int n_images = 0, c;
    long threads = 0, budget = 0;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "m:o:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': dir = optarg; break;
        case 'o': out = optarg; break;
        case OPT_IMAGE:
            if (n_images == CLI_MAX_MEDIA) return cli_error("encode-image: at most %d images", CLI_MAX_MEDIA);
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
    cli_media md = {0};
    int rc = 1;
    for (int i = 0; i < n_images; i++)
        if (cli_media_add_image(&md, m, images[i], (int)budget)) goto done;
    if (cli_media_write(&md, out)) goto done;
    for (int i = 0; i < md.n; i++) fprintf(stderr, "%s: %d soft tokens\n", images[i], md.items[i].n_tokens);
    rc = 0;
done:
    cli_media_truncate(&md, 0);
    g4_model_free(m);
    return rc;
}
