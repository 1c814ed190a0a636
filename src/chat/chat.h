/* Chat prompts and model output for Gemma 4 (the public part is in gemma4c.h: templates,
 * g4_chat conversations, g4_chat_parse).
 *
 * Rendering (chat.c) interprets the checkpoint's own Jinja chat template (jinja.h) with the
 * variables that Hugging Face transformers' apply_chat_template passes: messages, tools (None
 * when absent), documents (None), add_generation_prompt, every special token of
 * tokenizer_config.json (bos_token, eos_token, ...), enable_thinking only when the caller gives
 * it, and any extra variables. A template folder is searched as DIR/chat_template.jinja, else
 * "chat_template" in DIR/tokenizer_config.json (a string, or a list of {name, template}: the
 * "default" one), else DIR/chat_template.json.
 *
 * Conversations (chat_conversation.c) hold messages and options and render through a template.
 *
 * Output (chat_output.c) is parsed as it streams: g4_chat_parser takes text in any pieces and
 * hands out pieces of answer, thinking and whole tool calls, the same for any split of the
 * text. Tool calls `<|tool_call>call:NAME{key:value,...}<tool_call|>` carry values in Gemma's
 * notation: strings between <|"|> marks, numbers, true/false/None, {..} objects with bare or
 * quoted keys, [..] lists; arguments written as a JSON object are read too.
 */
#ifndef G4_CHAT_CHAT_H
#define G4_CHAT_CHAT_H

#include <jansson.h>
#include <stddef.h>

#include "core/strbuf.h"
#include "gemma4c.h"
#include "jinja/jinja.h"

/* A template given as text (source need not be NUL-terminated). */
int g4_chat_template_load_string(const char *source, size_t len, const char *bos_token,
                                 const char *eos_token, g4_chat_template **out, g4_error *err);

/* The template of a GGUF file's metadata (tokenizer.chat_template; tok: the file's tokenizer, for the bos / eos
 * strings, or NULL): 0 with *out NULL when the file has none. path names the file in errors. */
int g4_chat_template_from_gguf(const json_t *meta, const g4_tokenizer *tok, const char *path, g4_chat_template **out,
                               g4_error *err);

/* Like g4_chat_template_load_dir, but a folder without any template gives 0 and *out NULL, and so does one whose
 * template cannot be used (a Jinja error, a named list without "default"): then *why (free it) says why. */
int g4_chat_template_find(const char *model_dir, g4_chat_template **out, char **why, g4_error *err);

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
int g4_chat_template_render(const g4_chat_template *t, const json_t *messages, const g4_chat_options *opt,
                            char **out, size_t *len, g4_error *err);

/* The conversation's prompt with a generation prompt, whatever its request said (for a reply). */
int g4_chat_render_for_reply(const g4_chat *c, char **out, size_t *len, g4_error *err);
/* g4_chat_render with the render's limits (a server's, the fuzz harness's); NULL: the defaults. */
int g4_chat_render_limited(const g4_chat *c, const g4_jinja_limits *limits, char **out, size_t *len, g4_error *err);
/* Appends a message object (the conversation takes the reference). */
int g4_chat_add_object(g4_chat *c, json_t *message, g4_error *err);

/* ------------------------------------------------------------------ output */

/* Gets each piece: G4_EVENT_TEXT (answer), G4_EVENT_THINKING, or G4_EVENT_TOOL_CALL (one whole
 * call as compact JSON {"name", "arguments"}). Non-zero: out of memory (the parser fails). */
typedef int (*g4_chat_piece_fn)(g4_event_kind kind, const char *text, size_t len, void *user);

typedef struct g4_chat_parser g4_chat_parser;
g4_chat_parser *g4_chat_parser_new(g4_chat_piece_fn fn, void *user); /* NULL: no memory */
/* Feeds text (decoded with special tokens kept). Text after the end of the turn is ignored. */
int g4_chat_parser_push(g4_chat_parser *p, const char *text, size_t len, g4_error *err);
/* The output is complete: held text is released, an open tool call is parsed. */
int g4_chat_parser_finish(g4_chat_parser *p, g4_error *err);
/* The turn ended (<turn|>, <eos> or <|tool_response> was read). */
int g4_chat_parser_ended(const g4_chat_parser *p);
void g4_chat_parser_free(g4_chat_parser *p);

/* 1 when a special token with this piece is part of what the parser reads (its markers and
 * Gemma's string quote <|"|>); other special tokens are not shown. */
int g4_chat_reads_token(const char *piece);

/* A message built from pieces. */
typedef struct g4_chat_accum {
    g4_strbuf content, thinking, calls;
    int n_calls;
} g4_chat_accum;
int g4_chat_accum_add(g4_chat_accum *a, g4_event_kind kind, const char *text, size_t len); /* -1: no memory */
int g4_chat_accum_message(const g4_chat_accum *a, g4_chat_message *out, g4_error *err);
void g4_chat_accum_free(g4_chat_accum *a);

/* Parses one value in Gemma's tool notation at s[0..n); *used gets the bytes consumed.
 * Returns NULL when it does not parse. */
json_t *g4_chat_parse_gemma_value(const char *s, size_t n, size_t *used);

#endif
