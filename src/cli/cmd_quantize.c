/* gemma4c quantize IN OUT --type T [--group G]
 * gemma4c quantize --random CONFIG OUT --type T [--seed S]
 * Writes a model in another weight format (model/quantize.h; docs/formats.md 2-3):
 * mlx2 to mlx6 and mlx8 (a folder), q8_0 q4_0 q4_1 q5_0 q5_1 q2_k q3_k q4_k q5_k q6_k iq4_nl iq4_xs (a .gguf
 * file), bf16 f16 f32 (a .gguf file, or a safetensors folder). --random draws weights for a config.json instead. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "gemma4c.h"

static void usage(FILE *f) {
    fprintf(f, "usage: gemma4c quantize IN OUT --type T [--group 64] [-v]\n"
               "       gemma4c quantize --random CONFIG.json OUT --type T [--seed N]\n"
               "  T: mlx2 mlx3 mlx4 mlx5 mlx6 mlx8 (OUT a folder),\n"
               "     q8_0 q4_0 q4_1 q5_0 q5_1 q2_k q3_k q4_k q5_k q6_k iq4_nl iq4_xs (OUT.gguf),\n"
               "     bf16 f16 f32 (OUT.gguf, or OUT a safetensors folder)\n");
}

int cmd_quantize(int argc, char **argv) {
    static const struct option opts[] = {{"type", required_argument, 0, 'T'}, {"group", required_argument, 0, 'g'},
                                         {"random", required_argument, 0, 'R'}, {"seed", required_argument, 0, 's'},
                                         {"verbose", no_argument, 0, 'v'}, {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    g4_quantize_params p = {.seed = 1};
    long group = 64, seed = 1;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "T:g:R:s:vh", opts, NULL)) != -1) {
        switch (c) {
        case 'T': p.type = optarg; break;
        case 'g': if (cli_parse_int(optarg, "--group", 32, 128, &group)) return 1; break;
        case 'R': p.random_config = optarg; break;
        case 's': if (cli_parse_int(optarg, "--seed", 0, 1L << 62, &seed)) return 1; break;
        case 'v': p.verbose = 1; break;
        case 'h': usage(stdout); return 0;
        default: return cli_bad_option("quantize", argv);
        }
    }
    int npos = argc - optind, want = p.random_config ? 1 : 2;
    if (npos != want || !p.type) {
        usage(stderr);
        return cli_error("quantize: expected %s OUT and --type", p.random_config ? "--random CONFIG" : "IN");
    }
    if (!p.random_config) p.in = argv[optind++];
    p.out = argv[optind];
    p.group = (int)group;
    p.seed = (uint64_t)seed;
    g4_error err;
    if (g4_quantize(&p, &err)) return cli_error("quantize: %s", err.msg);
    return 0;
}
