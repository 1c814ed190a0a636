/* The request bodies of gemma4c serve (src/server/api_request.c: srv_parse_request), as a client sends
 * them to /v1/chat/completions, /v1/completions or /v1/embeddings: byte 0 picks the endpoint and whether
 * the chat template reads role "tool" messages, the rest is the body.  A body is parsed into a request or
 * refused with a 4xx whose message is one line and whose error JSON is OpenAI's shape; a parsed chat
 * request's conversation serializes (the server hands it to the chat template as JSON), and each of its image
 * and audio parts holds bytes or an http(s) URL. */
#include <jansson.h>
#include <strings.h>

#include "fuzz.h"
#include "server/api.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static const srv_limits lim = {.max_tokens = 4096, .max_n = 16, .max_prompts = 64, .max_media = 8,
                                   .allow_remote_media = 1, .have_vision = 1, .have_audio = 1,
                                   .vocab_size = 262144, .hidden_size = 128};
    srv_request r;
    srv_error e;
    memset(&e, 0, sizeof e);
    const srv_kind kind = (srv_kind)(data[0] % 3);
    if (srv_parse_request(kind, (const char *)data + 1, size - 1, &lim, (data[0] >> 2) & 1, &r, &e) == 0) {
        fuzz_expect(r.model && r.n >= 1 && r.n <= lim.max_n && r.n_stops >= 0 && r.n_bias >= 0);
        fuzz_expect(kind == SRV_CHAT ? json_is_array(json_object_get(r.chat, "messages")) : r.n_prompts >= 1);
        for (int i = 0; i < r.n_prompts; i++) fuzz_expect(r.prompts[i].text || r.prompts[i].n_ids > 0);
        for (int i = 0; i < r.n_media; i++) /* bytes, or an http(s) URL to fetch (the parser never fetches) */
            fuzz_expect(!r.media[i].data != !r.media[i].url && (r.media[i].url ? !strncasecmp(r.media[i].url, "http", 4)
                                                                               : r.media[i].len > 0));
        char *js = kind == SRV_CHAT ? json_dumps(r.chat, JSON_COMPACT) : NULL;
        fuzz_expect(kind != SRV_CHAT || js);
        free(js);
        srv_request_free(&r);
    } else {
        fuzz_expect(e.status >= 400 && e.status < 600 && e.msg[0] && !strchr(e.msg, '\n'));
        char *js = srv_error_json(&e);
        json_t *o = js ? json_loads(js, 0, NULL) : NULL;
        fuzz_expect(json_is_string(json_object_get(json_object_get(o, "error"), "message")));
        json_decref(o);
        free(js);
    }
    return 0;
}
