/* gemma4c encode-audio -m DIR --audio FILE -o out.f32
 * Writes the soft tokens of an audio file: little-endian float32 [n, hidden], the rows that
 * replace its <|audio|> placeholders (audio tower + embed_audio, docs/gemma4-towers.md §3; the 12B's raw
 * 640-sample frames, docs/gemma4-unified.md 5). Prints "N soft tokens x HIDDEN (C block(s))" on stdout (on
 * stderr with -o -): a block is a clip of at most 30 s for the audio tower, the whole audio for the 12B. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_common.h"
#include "cli/cli_media.h"
#include "cli/commands.h"

static void usage(FILE *f) {
    fprintf(f, "usage: gemma4c encode-audio -m DIR --audio FILE -o OUT.f32|- [-t THREADS]\n"
               "Writes the audio's soft tokens, float32 [n, hidden] (little-endian); for an audio tower, audio\n"
               "longer than 30 s is split into 30 s clips whose tokens follow one another (blocks).\n");
}

int cmd_encode_audio(int argc, char **argv) {
    static const struct option opts[] = {{"model", required_argument, 0, 'm'}, {"audio", required_argument, 0, 'a'},
                                         {"output", required_argument, 0, 'o'}, {"threads", required_argument, 0, 't'},
                                         {"help", no_argument, 0, 'h'},        {0, 0, 0, 0}};
    const char *dir = NULL, *audio = NULL, *out = NULL;
    long threads = 0;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "m:a:o:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': dir = optarg; break;
        case 'a':
            if (audio) return cli_error("encode-audio: one --audio FILE (given twice: '%s', '%s')", audio, optarg);
            audio = optarg;
            break;
        case 'o': out = optarg; break;
        case 't':
            if (cli_parse_int(optarg, "--threads", 0, 1024, &threads)) return 1;
            break;
        case 'h': usage(stdout); return 0;
        default: return cli_bad_option("encode-audio", argv);
        }
    }
    if (optind < argc) return cli_error("encode-audio: unexpected argument '%s'", argv[optind]);
    if (!audio) return cli_error("encode-audio: --audio FILE is required");
    if (!out) return cli_error("encode-audio: -o OUT.f32 is required");
    g4_model *m = cli_load_model(dir, (int)threads);
    if (!m) return 1;
    cli_media md = {0};
    int rc = 1;
    if (cli_media_add_audio(&md, m, audio)) {
        g4_model_free(m);
        return 1;
    }
    const g4_soft_tokens *e = &md.items[0];
    if (cli_media_write(&md, out) == 0) {
        /* (on stderr when the soft tokens themselves go to stdout) */
        fprintf(strcmp(out, "-") ? stdout : stderr, "%d soft tokens x %d (%d block%s)\n", e->n_tokens, e->hidden,
                e->n_blocks, e->n_blocks == 1 ? "" : "s");
        rc = 0;
    }
    cli_media_truncate(&md, 0);
    g4_model_free(m);
    return rc;
}
