#include "cli/commands.h"

int cmd_logits(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return cli_error("logits: not implemented yet");
}
