/* g4_chat: a conversation (messages and the options its template sees), rendered through a
 * chat template (chat.h). A request object is what `gemma4c template` takes per line. */
#include <stdlib.h>
#include <string.h>

#include "chat/chat.h"
#include "core/error.h"

struct g4_chat {
    const g4_chat_template *t;
    json_t *messages;          /* array */
    json_t *tools;             /* array, or NULL */
    json_t *kwargs;            /* object, or NULL */
    int enable_thinking;       /* -1: not passed */
    int add_generation_prompt; /* as the request says (g4_chat_render) */
};

/* {"messages", "tools", "enable_thinking", "add_generation_prompt", "chat_template_kwargs"} */
static int read_request(g4_chat *c, const json_t *in, g4_error *err) {
    if (!json_is_object(in)) return g4_fail(err, "a chat request must be a JSON object");
    const json_t *messages = json_object_get(in, "messages");
    const json_t *tools = json_object_get(in, "tools");
    const json_t *et = json_object_get(in, "enable_thinking");
    const json_t *agp = json_object_get(in, "add_generation_prompt");
    const json_t *kwargs = json_object_get(in, "chat_template_kwargs");
    if (messages && !json_is_array(messages)) return g4_fail(err, "\"messages\" must be a list of messages");
    if (tools && !json_is_null(tools) && !json_is_array(tools)) return g4_fail(err, "\"tools\" must be a list or null");
    if (et && !json_is_null(et) && !json_is_boolean(et))
        return g4_fail(err, "\"enable_thinking\" must be true, false or null");
    if (agp && !json_is_null(agp) && !json_is_boolean(agp))
        return g4_fail(err, "\"add_generation_prompt\" must be true or false");
    if (kwargs && !json_is_null(kwargs) && !json_is_object(kwargs))
        return g4_fail(err, "\"chat_template_kwargs\" must be an object");
    /* the variables the render itself sets (transformers: a TypeError, "got multiple values for keyword argument") */
    static const char *const own[] = {"messages", "tools", "documents", "add_generation_prompt"};
    for (size_t k = 0; json_is_object(kwargs) && k < sizeof own / sizeof own[0]; k++)
        if (json_object_get(kwargs, own[k]))
            return g4_fail(err, "\"chat_template_kwargs\" cannot set \"%s\" (the request's own field)", own[k]);
    size_t i;
    const json_t *m;
    json_array_foreach(messages, i, m) {
        if (!json_is_object(m)) return g4_fail(err, "\"messages\"[%zu] must be an object", i);
    }
    if (messages && json_array_extend(c->messages, (json_t *)messages)) return g4_fail(err, "out of memory");
    if (json_is_array(tools)) c->tools = json_incref((json_t *)tools);
    if (json_is_object(kwargs)) c->kwargs = json_incref((json_t *)kwargs);
    c->enable_thinking = json_is_boolean(et) ? json_is_true(et) : -1;
    c->add_generation_prompt = json_is_true(agp);
    return 0;
}

int g4_chat_new(const g4_chat_template *t, const char *request_json, g4_chat **out, g4_error *err) {
    G4_ARG(out, err);
    *out = NULL;
    if (!t) return g4_fail(err, "no chat template (the model folder has none)");
    g4_chat *c = calloc(1, sizeof *c);
    if (!c || !(c->messages = json_array())) {
        free(c);
        return g4_fail(err, "out of memory");
    }
    c->t = t;
    c->enable_thinking = -1;
    if (request_json) {
        json_error_t je;
        json_t *in = json_loads(request_json, JSON_ALLOW_NUL, &je);
        int rc = in ? read_request(c, in, err) : g4_fail(err, "invalid JSON: %s (column %d)", je.text, je.column);
        json_decref(in);
        if (rc) {
            g4_chat_free(c);
            return -1;
        }
    }
    *out = c;
    return 0;
}

void g4_chat_free(g4_chat *c) {
    if (!c) return;
    json_decref(c->messages);
    json_decref(c->tools);
    json_decref(c->kwargs);
    free(c);
}

int g4_chat_add_object(g4_chat *c, json_t *message, g4_error *err) {
    if (!message) return g4_fail(err, "out of memory");
    if (!json_is_object(message)) {
        json_decref(message);
        return g4_fail(err, "a message must be a JSON object");
    }
    return json_array_append_new(c->messages, message) ? g4_fail(err, "out of memory") : 0;
}

int g4_chat_add(g4_chat *c, const char *role, const char *content, g4_error *err) {
    G4_ARG(c, err);
    if (!role || !content) return g4_fail(err, "a message needs a role and a content");
    json_t *m = json_pack("{s:s,s:s}", "role", role, "content", content);
    if (!m) return g4_fail(err, "the message is not valid UTF-8");
    return g4_chat_add_object(c, m, err);
}

int g4_chat_add_json(g4_chat *c, const char *message_json, g4_error *err) {
    G4_ARG(c, err);
    json_error_t je;
    json_t *m = message_json ? json_loads(message_json, JSON_ALLOW_NUL, &je) : NULL;
    if (!m) return g4_fail(err, "message: invalid JSON: %s", message_json ? je.text : "NULL");
    return g4_chat_add_object(c, m, err);
}

void g4_chat_pop(g4_chat *c) {
    if (!c) return;
    size_t n = json_array_size(c->messages);
    if (n) json_array_remove(c->messages, n - 1);
}

void g4_chat_clear(g4_chat *c) {
    if (c) json_array_clear(c->messages);
}

int g4_chat_n_messages(const g4_chat *c) { return c ? (int)json_array_size(c->messages) : 0; }

static int render(const g4_chat *c, int add_generation_prompt, const g4_jinja_limits *limits, char **out, size_t *len,
                  g4_error *err) {
    if (!out) return g4_fail(err, "g4_chat_render: out is NULL");
    *out = NULL;
    if (len) *len = 0;
    if (!c) return g4_fail(err, "g4_chat_render: c is NULL");
    g4_chat_options opt = {c->tools, add_generation_prompt, c->enable_thinking, c->kwargs, limits};
    return g4_chat_template_render(c->t, c->messages, &opt, out, len, err);
}

int g4_chat_render(const g4_chat *c, char **out, size_t *len, g4_error *err) {
    return render(c, c && c->add_generation_prompt, NULL, out, len, err);
}

int g4_chat_render_limited(const g4_chat *c, const g4_jinja_limits *limits, char **out, size_t *len, g4_error *err) {
    return render(c, c->add_generation_prompt, limits, out, len, err);
}

int g4_chat_render_for_reply(const g4_chat *c, char **out, size_t *len, g4_error *err) {
    return render(c, 1, NULL, out, len, err);
}
