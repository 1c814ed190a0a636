#include "cli/commands.h"

int cmd_chat(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return cli_error("chat: not implemented yet");
}
