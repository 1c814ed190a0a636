#include "cli/commands.h"

int cmd_detokenize(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return cli_error("detokenize: not implemented yet");
}
