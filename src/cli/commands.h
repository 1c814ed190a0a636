/* The gemma4c subcommands, one file each (cmd_<name>.c). Each returns the process exit code. */
#ifndef G4_CLI_COMMANDS_H
#define G4_CLI_COMMANDS_H

int cmd_logits(int argc, char **argv);
int cmd_encode_image(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_embed(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_encode_audio(int argc, char **argv);
int cmd_serve(int argc, char **argv);

/* Prints "gemma4c: <msg>" to stderr as one line; returns 1. */
int cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
