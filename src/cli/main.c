/* gemma4c: the command-line tool on top of libgemma4c. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "gemma4c.h"

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} command;

static const command commands[] = {
    {"run", cmd_run, "one chat turn: gemma4c run -m DIR -p TEXT"},
    {"chat", cmd_chat, "interactive chat in the terminal: gemma4c chat -m DIR"},
    {"generate", cmd_generate, "complete text or ids: gemma4c generate -m DIR (-p TEXT | --ids 2,17 | -f FILE.jsonl)"},
    {"embed", cmd_embed, "embeddings (mean final hidden state): gemma4c embed -m DIR -f FILE.jsonl"},
    {"logits", cmd_logits, "full-forward logits: gemma4c logits -m DIR --ids 2,17,99 -o out.f32"},
    {"encode-image", cmd_encode_image, "image soft tokens: gemma4c encode-image -m DIR --image FILE -o out.f32"},
    {"encode-audio", cmd_encode_audio, "audio soft tokens: gemma4c encode-audio -m DIR --audio FILE -o out.f32"},
    {"tokenize", cmd_tokenize, "text to ids: gemma4c tokenize -m DIR (-p TEXT | -f FILE.jsonl)"},
    {"detokenize", cmd_detokenize, "ids to text: gemma4c detokenize -m DIR -f FILE.jsonl"},
    {"bench", cmd_bench, "prefill/decode speed: gemma4c bench -m DIR [-p 128] [-n 64]"},
    {"quantize", cmd_quantize, "write MLX / GGUF weights: gemma4c quantize IN OUT --type q4_0|q8_0|mlx4|..."},
    {"template", cmd_template, "render chat messages: gemma4c template -m DIR -f FILE.jsonl"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server: gemma4c serve -m DIR [--port 8080]"},
};

int cli_error(const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    for (char *p = buf; *p; p++)
        if (*p == '\n') *p = ' ';
    fprintf(stderr, "gemma4c: %s\n", buf);
    return 1;
}

static void usage(FILE *f) {
    fprintf(f, "gemma4c %s - inference for Gemma 4 models\n\nusage: gemma4c COMMAND [options]\n\n",
            G4_VERSION);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-13s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\nEvery command that runs a model takes --device cpu|cuda (default: cuda when built in and a GPU\n"
               "is present; this build has: %s), --kv f32|bf16|f16 (the KV cache: default bf16 on a GPU, f32 on\n"
               "the CPU) and --bf16-act (products with BF16 weights round the activations to bf16, as llama.cpp\n"
               "does: faster, less exact; g4_load_params.bf16_activations) and --mmproj FILE (with -m MODEL.gguf:\n"
               "llama.cpp's projector file with the vision/audio towers; default: the one mmproj*.gguf beside the model).\n"
               "'gemma4c COMMAND --help' shows the options of a command.\n",
            g4_backends());
}

const char *cli_device; /* --device, taken out of argv before the command parses its options */
int cli_bf16_act;       /* --bf16-act, likewise */
const char *cli_mmproj; /* --mmproj FILE, likewise */
int cli_kv = -1;        /* --kv as a g4_kv_type, -1: the model's preferred type */

g4_kv_type cli_kv_type(const g4_model *m) { return cli_kv >= 0 ? (g4_kv_type)cli_kv : g4_model_kv_type_preferred(m); }

/* Removes "--device X" / "--device=X", "--kv X" / "--kv=X", "--bf16-act" and "--mmproj FILE" from argv; returns the new argc, or -1 after an error
 * line. */
static int take_device_option(int argc, char **argv) {
    int out = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--")) { /* the rest is not options */
            while (i < argc) argv[out++] = argv[i++];
            break;
        }
        if (!strcmp(argv[i], "--device")) {
            if (i + 1 >= argc) return cli_error("--device needs a value (cpu or cuda)"), -1;
            cli_device = argv[++i];
        } else if (!strncmp(argv[i], "--device=", 9)) {
            cli_device = argv[i] + 9;
        } else if (!strcmp(argv[i], "--kv") || !strncmp(argv[i], "--kv=", 5)) {
            const char *v = argv[i][4] == '=' ? argv[i] + 5 : i + 1 < argc ? argv[++i] : NULL;
            if (!v) return cli_error("--kv needs a value (f32, bf16 or f16)"), -1;
            if (!strcmp(v, "f32")) cli_kv = G4_KV_F32;
            else if (!strcmp(v, "bf16")) cli_kv = G4_KV_BF16;
            else if (!strcmp(v, "f16")) cli_kv = G4_KV_F16;
            else return cli_error("--kv: expected f32, bf16 or f16, got '%s'", v), -1;
        } else if (!strcmp(argv[i], "--bf16-act")) {
            cli_bf16_act = 1;
        } else if (!strcmp(argv[i], "--mmproj") || !strncmp(argv[i], "--mmproj=", 9)) {
            const char *v = argv[i][8] == '=' ? argv[i] + 9 : i + 1 < argc ? argv[++i] : NULL;
            if (!v || !*v) return cli_error("--mmproj needs a file (llama.cpp's mmproj-*.gguf)"), -1;
            cli_mmproj = v;
        } else {
            argv[out++] = argv[i];
        }
    }
    argv[out] = NULL;
    return out;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 1;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("gemma4c %s (backends: %s)\n", G4_VERSION, g4_backends());
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) {
            int n = take_device_option(argc - 1, argv + 1);
            int rc = n < 0 ? 1 : commands[i].fn(n, argv + 1);
            /* output that could not all be written (a full disk, a closed pipe) is a failure, not exit 0 */
            if (rc == 0 && (fflush(stdout) != 0 || ferror(stdout)))
                rc = cli_error("%s: cannot write the output (standard output)", argv[1]);
            return rc;
        }
    return cli_error("unknown command '%s' (try 'gemma4c --help')", argv[1]);
}
