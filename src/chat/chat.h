/* Chat prompts and model output for Gemma 4.
 *
 * Rendering interprets the checkpoint's own Jinja chat template (jinja.h) with the variables that
 * Hugging Face transformers' apply_chat_template passes: messages, tools (None when absent),
 * documents (None), add_generation_prompt, every special token of tokenizer_config.json
 * (bos_token, eos_token, ...), enable_thinking only when the caller gives it, and any extra
 * variables.  Parsing splits a model answer into thinking, visible content and tool calls.
 */
#ifndef G4_TOKENIZER_CHAT_H
#define G4_TOKENIZER_CHAT_H

#include <jansson.h>
#include <stddef.h>

#include "gemma4c.h"
#include "jinja/jinja.h"

typedef struct g4_chat_template g4_chat_template; /* parsed template + special token strings */

/* Finds the template of a model folder: DIR/chat_template.jinja, else "chat_template" in
 * DIR/tokenizer_config.json (a string, or a list of {name, template}: the "default" one), else
 * DIR/chat_template.json.  Special tokens (bos/eos/...) come from DIR/tokenizer_config.json. */
int g4_chat_template_load_dir(const char *model_dir, g4_chat_template **out, g4_error *err);

/* A template file with explicit token strings (NULL: the variable is left undefined). */
int g4_chat_template_load_file(const char *jinja_path, const char *bos_token,
                               const char *eos_token, g4_chat_template **out, g4_error *err);

/* A template file with the special tokens of a tokenizer_config.json. */
int g4_chat_template_load_file_config(const char *jinja_path, const char *tokenizer_config,
                                      g4_chat_template **out, g4_error *err);

/* A template given as text (source need not be NUL-terminated). */
int g4_chat_template_load_string(const char *source, size_t len, const char *bos_token,
                                 const char *eos_token, g4_chat_template **out, g4_error *err);

void g4_chat_template_free(g4_chat_template *t);

/* The template's bos / eos strings (NULL when unknown). */
const char *g4_chat_template_bos(const g4_chat_template *t);
const char *g4_chat_template_eos(const g4_chat_template *t);

typedef struct g4_chat_options {
    const json_t *tools;       /* JSON array or NULL (the template sees None) */
    int add_generation_prompt; /* 0 / 1 */
    int enable_thinking;       /* -1: not passed (undefined in the template), 0 / 1 */
    const json_t *extra_vars;  /* JSON object of more variables (like HF's **kwargs), or NULL */
    const g4_jinja_limits *limits; /* the render's limits (jinja.h), NULL: the defaults */
} g4_chat_options;

/* messages: a JSON array of {role, content, ...}.  opt may be NULL (no tools, no generation
 * prompt, enable_thinking not passed).  *out is NUL-terminated (free()). */
int g4_chat_render(const g4_chat_template *t, const json_t *messages, const g4_chat_options *opt,
                   char **out, size_t *len, g4_error *err);

/* A chat request as `gemma4c template` reads it (and a server would): a JSON object
 * {"messages": [...], "tools": [...] | null, "enable_thinking": bool | null (undefined when absent),
 * "add_generation_prompt": bool (false), "chat_template_kwargs": {...} (more variables)},
 * rendered with g4_chat_render.  Members of the wrong type are a one-line error. */
int g4_chat_render_request(const g4_chat_template *t, const json_t *request, const g4_jinja_limits *limits,
                           char **out, size_t *len, g4_error *err);

/* Model output: thinking `<|channel>thought\n...<channel|>` is split from the answer, and tool
 * calls `<|tool_call>call:NAME{key:value,...}<tool_call|>` (values in Gemma's notation: strings
 * between <|"|> marks, numbers, true/false/None, {..} objects with bare or quoted keys, [..]
 * lists) become {"name": NAME, "arguments": {...}}.  Text stops at <turn|>, <eos> or
 * <|tool_response>.  A tool call that does not parse stays in content as text; an unterminated
 * thinking block is thinking up to the end.  Both strings are trimmed. */
typedef struct g4_chat_output {
    char *thinking;     /* "" when none */
    char *content;
    json_t *tool_calls; /* JSON array, maybe empty */
} g4_chat_output;

int g4_chat_parse_output(const char *text, size_t len, g4_chat_output *out, g4_error *err);
void g4_chat_output_free(g4_chat_output *o);

/* Parses one value in Gemma's tool notation at s[0..n); *used gets the bytes consumed.
 * Returns NULL when it does not parse. */
json_t *g4_chat_parse_gemma_value(const char *s, size_t n, size_t *used);

#endif
