/* The OpenAI API's requests and responses as gemma4c serves them (platform.openai.com/docs/api-reference:
 * chat/create, completions/create, embeddings/create; errors as {"error": {message, type, param, code}}).
 *
 * Parsing (api_request.c) checks a request body completely before any work starts: JSON syntax, the types
 * and ranges of every field the server reads, and the server's limits. Fields the server does not know are
 * ignored, as OpenAI ignores them; a field it knows but cannot honour is a 400 naming it, never a silent drop.
 * A parsed request holds what the engine needs: for chat, the conversation as the chat template reads it
 * ({"messages", "tools", "enable_thinking", "chat_template_kwargs"}: content parts flattened to the
 * template's shape, tool-call arguments as objects, role "tool" messages as the template expects them);
 * for completions and embeddings, the prompts as text or token ids. Responses are built in api_response.c.
 * Everything here is plain data in, plain data out (no model, no network): tests/fuzz/ feeds it bodies. */
#ifndef G4_SERVER_API_H
#define G4_SERVER_API_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "gemma4c.h"

typedef enum { SRV_CHAT = 0, SRV_COMPLETION = 1, SRV_EMBEDDING = 2 } srv_kind;

/* An error as OpenAI reports it: the HTTP status and {"error": {message, type, param, code}}. */
typedef struct srv_error {
    int status;       /* 400, 401, 404, 413, 500, 503, ... */
    const char *type; /* "invalid_request_error", "authentication_error", "server_error", ... */
    char param[64];   /* the field at fault ("" when none) */
    char code[48];    /* "" or e.g. "context_length_exceeded", "model_not_found", "invalid_api_key" */
    char msg[512];    /* one line */
} srv_error;

/* Fills e and returns -1. The type follows the status as OpenAI's does: 4xx invalid_request_error, 5xx
 * server_error. param and code may be NULL. */
int srv_fail(srv_error *e, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* {"error": {...}} as compact JSON (malloc'ed). */
char *srv_error_json(const srv_error *e);

/* What a request may ask at most (the server's options). */
typedef struct srv_limits {
    int max_tokens;         /* per choice; 0: no limit but the context */
    int max_n;              /* choices per request */
    int max_prompts;        /* prompts / inputs per completions or embeddings request */
    int max_media;          /* image and audio parts per request */
    int allow_remote_media; /* http(s) URLs of images and audio are fetched (else a 400) */
    int have_vision;        /* the model reads images (else an image part is a 400) */
    int have_audio;         /* the model reads audio (else an audio part is a 400) */
    int vocab_size;         /* token ids (prompts, logit_bias) must be below it */
    int hidden_size;        /* embeddings' "dimensions" must equal it */
} srv_limits;

/* One prompt (completions) or input (embeddings): text or token ids. */
typedef struct srv_prompt {
    char *text; /* NULL when given as ids */
    int32_t *ids;
    int n_ids;
} srv_prompt;

typedef enum { SRV_FORMAT_TEXT = 0, SRV_FORMAT_JSON_OBJECT = 1 } srv_format;

/* An image or audio part of a chat request: its file's bytes (from a base64 data URL or input_audio), or the
 * http(s) URL they are to be fetched from (fetch.h; the endpoint fetches it on the request's own thread). */
typedef struct srv_media {
    int audio; /* 0: an image, 1: audio */
    unsigned char *data;
    size_t len;
    char *url; /* NULL: data holds the bytes */
} srv_media;

typedef struct srv_request {
    srv_kind kind;
    char *model;
    int stream, include_usage;
    int n;                 /* choices per prompt */
    int max_tokens;        /* 0: until the context is full (chat) */
    /* sampling: a field given in the request (have_*) overrides the model's default */
    int have_temperature, have_top_p, have_top_k, have_min_p, have_seed, have_repetition;
    float temperature, top_p, min_p, presence_penalty, frequency_penalty, repetition_penalty;
    int top_k;
    uint64_t seed;
    int32_t *bias_ids;     /* logit_bias */
    float *bias_values;
    int n_bias;
    char **stops;
    int n_stops;
    int logprobs;          /* chat: logprobs true; completions: logprobs >= 0 given */
    int top_logprobs;      /* chat: top_logprobs; completions: logprobs N */
    int echo;              /* completions */
    int ignore_eos;        /* extension (vLLM's name) */
    srv_format format;     /* response_format */
    g4_grammar *grammar;   /* response_format json_schema, or tool_choice "required" / a named function: the
                              output's grammar (NULL: free) */
    json_t *chat;          /* chat: {"messages", "tools", "enable_thinking", "chat_template_kwargs"} */
    srv_prompt *prompts;   /* completions, embeddings */
    int n_prompts;
    int base64;            /* embeddings: encoding_format "base64" */
    srv_media *media;      /* chat: the image and audio parts in message order (their placeholders' order) */
    int n_media;
    g4_soft_tokens *soft;  /* [n_media] their soft tokens, made and freed by the endpoint (endpoints.c) */
} srv_request;

/* Parses and checks a request body. tool_role: the chat template reads role "tool" messages itself (else
 * they become "tool_responses" on the assistant message before them, as Gemma's release templates read
 * them). Returns 0, or -1 with e filled (a 4xx). */
int srv_parse_request(srv_kind kind, const char *body, size_t len, const srv_limits *lim, int tool_role,
                      srv_request *out, srv_error *e);
void srv_request_free(srv_request *r);

/* Constant-time comparison of an Authorization header ("Bearer KEY") with the key: 1 when equal. */
int srv_check_api_key(const char *header, const char *key);

#endif
