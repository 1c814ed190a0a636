#include "cli/commands.h"

int cmd_template(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return cli_error("template: not implemented yet");
}
