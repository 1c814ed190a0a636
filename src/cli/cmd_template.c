/* gemma4c template: renders chat messages with a model's chat template, as transformers'
 * apply_chat_template does.  Input: JSON lines {"messages", "tools", "enable_thinking",
 * "add_generation_prompt", "chat_template_kwargs"}; output: one JSON string per line. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <getopt.h>

#include "cli/cli_common.h"
#include "cli/commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: gemma4c template (-m DIR | --template FILE.jinja [--tokenizer-config FILE])\n"
            "                        [-f FILE.jsonl]\n"
            "\n"
            "Renders chat prompts exactly as transformers' apply_chat_template does.\n"
            "  -m, --model DIR           model folder (chat_template.jinja or tokenizer_config.json)\n"
            "  --template FILE           a Jinja chat template file instead of a model folder\n"
            "  --tokenizer-config FILE   special tokens for --template (default: <bos>, <eos>)\n"
            "  -f, --file FILE           JSON lines to render ('-' or none: standard input)\n"
            "\n"
            "Each input line is {\"messages\": [...], \"tools\": [...] | null,\n"
            "\"enable_thinking\": bool (left undefined when absent), \"add_generation_prompt\": bool\n"
            "(default false), \"chat_template_kwargs\": {...} (more template variables)}.\n"
            "Each output line is the rendered prompt as a JSON string, or {\"error\": \"...\"}\n"
            "for a line that cannot be rendered (the exit status is then 1).\n");
}

/* {"messages", "tools", "enable_thinking", "add_generation_prompt", "chat_template_kwargs"} -> "prompt" */
static json_t *render_line(const json_t *in, void *user, g4_error *err) {
    const g4_chat_template *t = user;
    if (!json_is_array(json_object_get(in, "messages")))
        return g4_fail(err, "\"messages\" must be a list of messages"), NULL;
    char *request = json_dumps(in, JSON_COMPACT), *text = NULL;
    size_t text_len = 0;
    g4_chat *chat = NULL;
    int rc = request ? g4_chat_new(t, request, &chat, err) : g4_fail(err, "out of memory");
    if (rc == 0) rc = g4_chat_render(chat, &text, &text_len, err);
    g4_chat_free(chat);
    free(request);
    json_t *s = rc ? NULL : json_stringn(text, text_len);
    g4_free(text);
    if (!rc && !s) g4_fail(err, "the rendered text is not valid UTF-8");
    return s;
}

int cmd_template(int argc, char **argv) {
    enum { OPT_TEMPLATE = 1000, OPT_CONFIG };
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"template", required_argument, 0, OPT_TEMPLATE},
                                         {"tokenizer-config", required_argument, 0, OPT_CONFIG},
                                         {"file", required_argument, 0, 'f'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *model = NULL, *tpl_path = NULL, *config = NULL, *file = NULL;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "m:f:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case OPT_TEMPLATE: tpl_path = optarg; break;
        case OPT_CONFIG: config = optarg; break;
        case 'f': file = optarg; break;
        case 'h': usage(stdout); return 0;
        default: return cli_bad_option("template", argv);
        }
    }
    if (optind < argc) return cli_error("template: unexpected argument '%s' (see --help)", argv[optind]);
    if (!model == !tpl_path) return cli_error("template: give either -m DIR or --template FILE");
    if (config && !tpl_path) return cli_error("template: --tokenizer-config goes with --template");

    g4_error err = {{0}};
    g4_chat_template *t = NULL;
    int rc;
    if (model)
        rc = g4_chat_template_load_dir(model, &t, &err);
    else if (config)
        rc = g4_chat_template_load_file_config(tpl_path, config, &t, &err);
    else
        rc = g4_chat_template_load_file(tpl_path, "<bos>", "<eos>", &t, &err);
    if (rc) return cli_error("template: %s", err.msg);
    int status = cli_jsonl_map("template", file, render_line, t);
    g4_chat_template_free(t);
    return status;
}
