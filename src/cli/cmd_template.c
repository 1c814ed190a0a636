/* gemma4c template: renders chat messages with a model's chat template, as transformers'
 * apply_chat_template does.  Input: JSON lines {"messages", "tools", "enable_thinking",
 * "add_generation_prompt", "chat_template_kwargs"}; output: one JSON string per line. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "tokenizer/chat.h"

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

static void print_error_line(const char *msg) {
    json_t *o = json_pack("{s:s}", "error", msg);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    printf("%s\n", s ? s : "{\"error\": \"out of memory\"}");
    free(s);
    json_decref(o);
}

/* Renders one input line; 0 / -1 with msg filled. */
static int render_line(const g4_chat_template *t, const char *line, size_t len, char *msg,
                       size_t cap) {
    json_error_t je;
    json_t *in = json_loadb(line, len, 0, &je);
    if (!in) {
        snprintf(msg, cap, "invalid JSON: %s (column %d)", je.text, je.column);
        return -1;
    }
    int rc = -1;
    if (!json_is_object(in)) {
        snprintf(msg, cap, "a line must be a JSON object");
        goto done;
    }
    const json_t *messages = json_object_get(in, "messages");
    const json_t *tools = json_object_get(in, "tools");
    const json_t *et = json_object_get(in, "enable_thinking");
    const json_t *agp = json_object_get(in, "add_generation_prompt");
    const json_t *kwargs = json_object_get(in, "chat_template_kwargs");
    if (!json_is_array(messages)) {
        snprintf(msg, cap, "\"messages\" must be a list of messages");
        goto done;
    }
    if (tools && !json_is_null(tools) && !json_is_array(tools)) {
        snprintf(msg, cap, "\"tools\" must be a list or null");
        goto done;
    }
    if (et && !json_is_null(et) && !json_is_boolean(et)) {
        snprintf(msg, cap, "\"enable_thinking\" must be true, false or null");
        goto done;
    }
    if (agp && !json_is_null(agp) && !json_is_boolean(agp)) {
        snprintf(msg, cap, "\"add_generation_prompt\" must be true or false");
        goto done;
    }
    if (kwargs && !json_is_null(kwargs) && !json_is_object(kwargs)) {
        snprintf(msg, cap, "\"chat_template_kwargs\" must be an object");
        goto done;
    }
    g4_chat_options opt = {
        .tools = json_is_array(tools) ? tools : NULL,
        .add_generation_prompt = json_is_true(agp),
        .enable_thinking = json_is_boolean(et) ? json_is_true(et) : -1,
        .extra_vars = json_is_object(kwargs) ? kwargs : NULL,
    };
    char *text = NULL;
    size_t text_len = 0;
    g4_error err = {{0}};
    if (g4_chat_render(t, messages, &opt, &text, &text_len, &err)) {
        snprintf(msg, cap, "%s", err.msg);
        goto done;
    }
    json_t *s = json_stringn(text, text_len);
    free(text);
    char *dumped = s ? json_dumps(s, JSON_ENCODE_ANY) : NULL;
    json_decref(s);
    if (!dumped) {
        snprintf(msg, cap, "the rendered text is not valid UTF-8");
        goto done;
    }
    printf("%s\n", dumped);
    free(dumped);
    rc = 0;
done:
    json_decref(in);
    return rc;
}

int cmd_template(int argc, char **argv) {
    const char *model = NULL, *tpl_path = NULL, *config = NULL, *file = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        const char **slot = NULL;
        if (!strcmp(a, "-m") || !strcmp(a, "--model"))
            slot = &model;
        else if (!strcmp(a, "--template"))
            slot = &tpl_path;
        else if (!strcmp(a, "--tokenizer-config"))
            slot = &config;
        else if (!strcmp(a, "-f") || !strcmp(a, "--file"))
            slot = &file;
        else
            return cli_error("template: unknown option '%s' (see gemma4c template --help)", a);
        if (i + 1 >= argc) return cli_error("template: %s needs a value", a);
        *slot = argv[++i];
    }
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

    FILE *in = stdin;
    if (file && strcmp(file, "-")) {
        in = fopen(file, "r");
        if (!in) {
            g4_chat_template_free(t);
            return cli_error("template: cannot open %s", file);
        }
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int failures = 0;
    while ((n = getline(&line, &cap, in)) > 0) {
        size_t len = (size_t)n;
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
        size_t k = 0;
        while (k < len && (line[k] == ' ' || line[k] == '\t')) k++;
        if (k == len) continue; /* blank line */
        char msg[600];
        if (render_line(t, line, len, msg, sizeof msg)) {
            print_error_line(msg);
            failures++;
        }
        fflush(stdout);
    }
    free(line);
    if (in != stdin) fclose(in);
    g4_chat_template_free(t);
    if (failures) {
        fprintf(stderr, "gemma4c: template: %d line(s) could not be rendered\n", failures);
        return 1;
    }
    return 0;
}
