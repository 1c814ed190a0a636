#include "cli/commands.h"

int cmd_generate(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return cli_error("generate: not implemented yet");
}
