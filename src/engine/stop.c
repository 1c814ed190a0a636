#include "engine/stop.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/strbuf.h"

struct g4_stop_matcher {
    char **stops;
    size_t *lens;
    int n;
    char *buf;      /* held bytes, then the bytes returned by the last call */
    size_t len;     /* bytes in buf */
    size_t cap;
    size_t emitted; /* leading bytes of buf returned by the last call, dropped on the next */
    int stopped;
    int which;
};

void g4_stop_free(g4_stop_matcher *m) {
    if (!m) return;
    for (int i = 0; i < m->n; i++) free(m->stops[i]);
    free(m->stops);
    free(m->lens);
    free(m->buf);
    free(m);
}

int g4_stop_new(const char *const *stops, int n, g4_stop_matcher **out, g4_error *err) {
    *out = NULL;
    if (n < 0 || (n > 0 && !stops)) return g4_fail(err, "stop strings: bad list");
    g4_stop_matcher *m = calloc(1, sizeof *m);
    if (!m) return g4_fail(err, "stop strings: out of memory");
    m->which = -1;
    if (n > 0) {
        m->stops = calloc((size_t)n, sizeof *m->stops);
        m->lens = calloc((size_t)n, sizeof *m->lens);
        if (!m->stops || !m->lens) {
            g4_stop_free(m);
            return g4_fail(err, "stop strings: out of memory");
        }
    }
    for (int i = 0; i < n; i++) {
        if (!stops[i] || !stops[i][0]) {
            m->n = i;
            g4_stop_free(m);
            return g4_fail(err, "stop strings: string %d is empty", i);
        }
        m->lens[i] = strlen(stops[i]);
        m->stops[i] = malloc(m->lens[i] + 1);
        if (!m->stops[i]) {
            m->n = i;
            g4_stop_free(m);
            return g4_fail(err, "stop strings: out of memory");
        }
        memcpy(m->stops[i], stops[i], m->lens[i] + 1);
    }
    m->n = n;
    *out = m;
    return 0;
}

void g4_stop_reset(g4_stop_matcher *m) {
    m->len = 0;
    m->emitted = 0;
    m->stopped = 0;
    m->which = -1;
}

size_t g4_stop_held(const g4_stop_matcher *m) { return m->stopped ? 0 : m->len - m->emitted; }

/* Drops the bytes handed out by the previous call. */
static void drop_emitted(g4_stop_matcher *m) {
    if (m->emitted == 0) return;
    memmove(m->buf, m->buf + m->emitted, m->len - m->emitted);
    m->len -= m->emitted;
    m->emitted = 0;
}

static void result_stopped(const g4_stop_matcher *m, g4_stop_result *res) {
    res->text = "";
    res->len = 0;
    res->stopped = 1;
    res->which = m->which;
}

int g4_stop_push(g4_stop_matcher *m, const char *text, size_t len, g4_stop_result *res,
                 g4_error *err) {
    if (m->stopped) {
        result_stopped(m, res);
        return 0;
    }
    drop_emitted(m);
    if (m->len + len + 1 > m->cap) {
        size_t cap = m->cap ? m->cap : 64;
        while (cap < m->len + len + 1) cap *= 2;
        char *b = realloc(m->buf, cap);
        if (!b) return g4_fail(err, "stop strings: out of memory");
        m->buf = b;
        m->cap = cap;
    }
    if (len) memcpy(m->buf + m->len, text, len);
    m->len += len;
    m->buf[m->len] = '\0';

    /* The held bytes contained no complete stop string, so any match ends in the new bytes.
     * memmem finds each string's earliest (= first completed) occurrence. */
    size_t best_end = (size_t)-1, best_start = 0;
    int best = -1;
    for (int i = 0; i < m->n; i++) {
        const char *p = memmem(m->buf, m->len, m->stops[i], m->lens[i]);
        if (!p) continue;
        size_t start = (size_t)(p - m->buf), end = start + m->lens[i];
        if (end < best_end || (end == best_end && start < best_start)) {
            best_end = end;
            best_start = start;
            best = i;
        }
    }
    if (best >= 0) {
        m->stopped = 1;
        m->which = best;
        res->text = m->buf;
        res->len = best_start;
        res->stopped = 1;
        res->which = best;
        return 0;
    }

    /* Hold the longest tail that is a proper prefix of some stop string. */
    size_t hold = g4_tail_prefix_len(m->buf, m->len, (const char *const *)m->stops, m->lens, m->n);
    m->emitted = m->len - hold;
    res->text = m->buf;
    res->len = m->emitted;
    res->stopped = 0;
    res->which = -1;
    return 0;
}

void g4_stop_flush(g4_stop_matcher *m, g4_stop_result *res) {
    if (m->stopped) {
        result_stopped(m, res);
        return;
    }
    drop_emitted(m);
    res->text = m->buf ? m->buf : "";
    res->len = m->len;
    res->stopped = 0;
    res->which = -1;
    m->emitted = m->len;
}
