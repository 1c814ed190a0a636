/* The Jinja interpreter.
 *
 * 1. Reference cases: tests/data/jinja_cases.jsonl holds templates rendered by jinja2 itself
 *    with Hugging Face's chat-template environment (tests/data/make_jinja_cases.py writes it):
 *    every "expected" text must come out byte for byte, every "error" case must fail cleanly.
 * 2. Errors name the template line; runaway templates (recursion, loops, huge output) stop with
 *    an error; malformed and mutated templates never crash; a parsed template can be rendered
 *    from several threads at once; reference cycles do not leak (checked by the ASan build). */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/mapped_file.h"
#include "jinja/jinja.h"

/* Renders src with the context (JSON text, may be NULL); returns the output or NULL with err. */
static char *render(const char *src, const char *ctx_json, g4_error *err) {
    g4_jinja *t = NULL;
    err->msg[0] = 0;
    if (g4_jinja_parse(src, strlen(src), &t, err)) return NULL;
    json_t *ctx = ctx_json ? json_loads(ctx_json, 0, NULL) : NULL;
    char *out = NULL;
    size_t len = 0;
    if (g4_jinja_render(t, ctx, &out, &len, err)) out = NULL;
    json_decref(ctx);
    g4_jinja_free(t);
    return out;
}

static void expect_render(const char *src, const char *ctx, const char *want) {
    g4_error err;
    char *got = render(src, ctx, &err);
    CHECKF(got && !strcmp(got, want), "%.300s\n  want: [%s]\n  got:  [%s]", src, want,
           got ? got : err.msg);
    free(got);
}

/* The render or parse fails with a one-line message containing `needle`. */
static void expect_error(const char *src, const char *ctx, const char *needle) {
    g4_error err;
    char *got = render(src, ctx, &err);
    CHECKF(!got, "%.200s: expected an error, got [%.200s]", src, got ? got : "");
    CHECKF(!got && strstr(err.msg, needle) && !strchr(err.msg, '\n'),
           "%.200s: message [%s] lacks [%s]", src, err.msg, needle);
    free(got);
}

static void test_reference_cases(void) {
    const char *root = getenv("G4_SOURCE_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/data/jinja_cases.jsonl", root ? root : "..");
    FILE *f = fopen(path, "r");
    CHECKF(f != NULL, "cannot open %s", path);
    if (!f) return;
    char *line = NULL;
    size_t cap = 0;
    int n = 0, ok = 0, n_err = 0;
    while (getline(&line, &cap, f) > 0) {
        json_error_t je;
        json_t *c = json_loads(line, 0, &je);
        CHECKF(c != NULL, "case %d: %s", n + 1, je.text);
        if (!c) continue;
        n++;
        const json_t *tj = json_object_get(c, "template");
        const char *src = json_string_value(tj);
        const json_t *want = json_object_get(c, "expected");
        g4_jinja *t = NULL;
        g4_error err = {{0}};
        char *out = NULL;
        size_t len = 0;
        int rc = g4_jinja_parse(src, json_string_length(tj), &t, &err);
        if (rc == 0) rc = g4_jinja_render(t, json_object_get(c, "context"), &out, &len, &err);
        if (want) {
            int same = rc == 0 && len == json_string_length(want) &&
                       memcmp(out, json_string_value(want), len) == 0;
            CHECKF(same, "case %d %s\n  want: [%s]\n  got:  [%s]", n, src, json_string_value(want),
                   rc == 0 ? out : err.msg);
            ok += same;
        } else {
            n_err++;
            int failed = rc != 0 && !strncmp(err.msg, "template line ", 14);
            CHECKF(failed, "case %d %s: jinja2 fails (%s) but got [%s]", n, src,
                   json_string_value(json_object_get(c, "error")), rc == 0 ? out : err.msg);
            ok += failed;
        }
        free(out);
        g4_jinja_free(t);
        json_decref(c);
    }
    free(line);
    fclose(f);
    fprintf(stderr, "jinja2 reference cases: %d of %d agree (%d are errors)\n", ok, n, n_err);
    CHECK(n >= 300);
}

static void test_error_lines(void) {
    /* syntax errors */
    expect_error("a\nb\n{{ 1 + }}\n", NULL, "template line 3:");
    expect_error("line1\n{% for x in y %}\n\n{% endif %}", NULL, "template line 4:");
    expect_error("{% if x %}\n\nno end", NULL, "close the 'if' block of line 1");
    expect_error("\n\n{{ 'unterminated }}", NULL, "template line 3: unterminated string");
    expect_error("\n{# never closed", NULL, "template line 2: missing end of comment");
    expect_error("x\n{% frobnicate %}", NULL, "template line 2: unknown tag 'frobnicate'");
    expect_error("{% call m() %}{% endcall %}", NULL, "'call' tag is not supported");
    expect_error("{% for x in y recursive %}{% endfor %}", NULL, "recursive");
    expect_error("{{ x ! y }}", NULL, "unexpected character");
    /* runtime errors point at the line that failed, also inside a macro */
    expect_error("{% macro m(v) %}\nok\n{{ v + 1 }}\n{% endmacro %}\n{{ m('s') }}", NULL,
                 "template line 3: can only concatenate str");
    expect_error("\n\n\n{{ raise_exception('Conversation roles must alternate') }}", NULL,
                 "template line 4: Conversation roles must alternate");
    expect_error("{{ 1 }}\n{{ x|nosuch }}", NULL, "template line 2: no filter named 'nosuch'");
    expect_error("{{ messages[0]['content'] }}", "{\"messages\": []}", "has no element 0");
    expect_error("{% set x = 1 %}{% set x.y = 2 %}", NULL, "non-namespace");
}

static void test_semantics(void) {
    /* context values: JSON -> Python-like values */
    expect_render("{{ a }} {{ b }} {{ c }} {{ d }} {{ e }} {{ f }}",
                  "{\"a\": null, \"b\": true, \"c\": 3, \"d\": 2.0, \"e\": [1, \"x\"], \"f\": {\"k\": false}}",
                  "None True 3 2.0 [1, 'x'] {'k': False}");
    /* key order of JSON objects is kept (dict insertion order) */
    expect_render("{% for k in o %}{{ k }}{% endfor %}|{{ o|dictsort|map('first')|join }}",
                  "{\"o\": {\"z\": 1, \"a\": 2, \"m\": 3}}", "zam|amz");
    /* no context at all */
    expect_render("[{{ x }}]{{ x is defined }}", NULL, "[]False");
    /* whitespace control as transformers configures jinja2 (trim_blocks, lstrip_blocks) */
    expect_render("<ul>\n  {% for i in [1, 2] %}\n  <li>{{ i }}</li>\n  {% endfor %}\n</ul>\n", NULL,
                  "<ul>\n  <li>1</li>\n  <li>2</li>\n</ul>");
    expect_render("a {{- ' b ' -}} c\n{%- if true %} d{% endif %}", NULL, "a b c d");
    /* a parsed template renders the same every time */
    g4_jinja *t = NULL;
    g4_error err;
    const char *src = "{% set ns = namespace(n=0) %}{% for i in range(10) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}";
    CHECK(g4_jinja_parse(src, strlen(src), &t, &err) == 0);
    for (int k = 0; k < 3 && t; k++) {
        char *out = NULL;
        CHECK(g4_jinja_render(t, NULL, &out, NULL, &err) == 0 && out && !strcmp(out, "45"));
        free(out);
    }
    g4_jinja_free(t);
    /* the context must be an object */
    json_t *arr = json_array();
    CHECK(g4_jinja_parse("x", 1, &t, &err) == 0);
    char *out = NULL;
    CHECK(g4_jinja_render(t, arr, &out, NULL, &err) == -1 && out == NULL);
    g4_jinja_free(t);
    json_decref(arr);
    /* the source need not be NUL-terminated */
    CHECK(g4_jinja_parse("{{ 1 }}{{ garbage", 7, &t, &err) == 0);
    CHECK(g4_jinja_render(t, NULL, &out, NULL, &err) == 0 && !strcmp(out, "1"));
    free(out);
    g4_jinja_free(t);
}

static void test_limits(void) {
    /* endless recursion stops at the macro depth limit */
    expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, "nested deeper than");
    /* a loop that runs too long stops at the step limit */
    const char *src = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
    g4_jinja *t = NULL;
    g4_error err;
    CHECK(g4_jinja_parse(src, strlen(src), &t, &err) == 0);
    g4_jinja_limits lim = {.max_steps = 200000};
    char *out = NULL;
    CHECK(g4_jinja_render_ex(t, NULL, &lim, &out, NULL, &err) == -1 && out == NULL);
    CHECKF(strstr(err.msg, "steps"), "message: %s", err.msg);
    g4_jinja_free(t);
    /* output and string sizes are bounded */
    src = "{% for i in range(100000) %}0123456789{% endfor %}";
    CHECK(g4_jinja_parse(src, strlen(src), &t, &err) == 0);
    g4_jinja_limits lim2 = {.max_output = 4096};
    CHECK(g4_jinja_render_ex(t, NULL, &lim2, &out, NULL, &err) == -1 && out == NULL);
    CHECKF(strstr(err.msg, "limit"), "message: %s", err.msg);
    g4_jinja_free(t);
    expect_error("{{ 'x' * 10000000000 }}", NULL, "limit");
    expect_error("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}"
                 "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                 NULL, "limit");
    expect_error("{{ 9223372036854775807 + 1 }}", NULL, "overflow");
    /* an empty list or string repeated a huge number of times is empty at once (it looped 2^63 times) */
    expect_render("{{ (9223372036854775807 * [])|length }}-{{ ([] * 9223372036854775807)|length }}-"
                  "{{ ('' * 9223372036854775807)|length }}",
                  NULL, "0-0-0");
    /* deep nesting in the source is an error, not a stack overflow */
    char *deep = malloc(200010);
    for (int parens = 250; parens <= 100000; parens += 99750) { /* parser limit, lexer limit */
        char *p = deep;
        p += sprintf(p, "{{ ");
        memset(p, '(', (size_t)parens);
        p += parens;
        *p++ = '1';
        memset(p, ')', (size_t)parens);
        p += parens;
        strcpy(p, " }}");
        expect_error(deep, NULL, "nest");
    }
    for (int i = 0; i < 19999; i++) memcpy(deep + 10 * i, "{% if x %}", 10);
    deep[199990] = 0;
    expect_error(deep, NULL, "template line 1");
    free(deep);
    char *notnot = malloc(40010);
    for (int i = 0; i < 10000; i++) memcpy(notnot + 4 * i, "not ", 4);
    strcpy(notnot + 40000, "x");
    char *wrapped = malloc(40020);
    snprintf(wrapped, 40020, "{{ %s }}", notnot);
    expect_error(wrapped, NULL, "nest");
    free(notnot);
    free(wrapped);
    /* a deeply nested context value prints without recursing forever */
    json_t *v = json_array();
    json_t *cur = v;
    for (int i = 0; i < 1000; i++) {
        json_t *inner = json_array();
        json_array_append_new(cur, inner);
        cur = inner;
    }
    json_t *ctx = json_pack("{s:o}", "v", v);
    CHECK(g4_jinja_parse("{{ v }}{{ v|tojson|length > 0 }}", 32, &t, &err) == 0);
    int rc = g4_jinja_render(t, ctx, &out, NULL, &err);
    CHECK(rc == 0 || strstr(err.msg, "deep") != NULL);
    free(out);
    g4_jinja_free(t);
    json_decref(ctx);
}

/* A template made of `head`, `mid` repeated n times and `tail`. */
static char *repeated(const char *head, const char *mid, int n, const char *tail) {
    size_t hl = strlen(head), ml = strlen(mid), tl = strlen(tail);
    char *s = malloc(hl + ml * (size_t)n + tl + 1);
    memcpy(s, head, hl);
    for (int i = 0; i < n; i++) memcpy(s + hl + ml * (size_t)i, mid, ml);
    memcpy(s + hl + ml * (size_t)n, tail, tl + 1);
    return s;
}

static void expect_error_limits(const char *src, const char *ctx_json, g4_jinja_limits lim,
                                const char *needle) {
    g4_jinja *t = NULL;
    g4_error err = {{0}};
    char *out = NULL;
    int rc = g4_jinja_parse(src, strlen(src), &t, &err);
    json_t *ctx = ctx_json ? json_loads(ctx_json, 0, NULL) : NULL;
    if (rc == 0) rc = g4_jinja_render_ex(t, ctx, &lim, &out, NULL, &err);
    CHECKF(rc != 0 && strstr(err.msg, needle) && !strchr(err.msg, '\n'), "%.120s: [%s] lacks [%s]",
           src, rc ? err.msg : out, needle);
    free(out);
    json_decref(ctx);
    g4_jinja_free(t);
}

/* Hostile templates (what fuzzing found, issue 16): each is a one-line error, never a crash, a
 * hang or gigabytes of memory. */
static void test_hostile(void) {
    /* a long flat chain is shallow to parse but deep to evaluate: sums, attributes, filters,
     * tests, calls, and map() applying map() applying map()... */
    static const char *const chains[][3] = {
        {"{{ 1", "+1", " }}"},
        {"{{ x", ".a", " }}"},
        {"{{ x", "[0]", " }}"},
        {"{{ 1", "|string", " }}"},
        {"{{ 1", " if 1 else 2", " }}"},
        {"{{ 1", " and 1", " }}"},
        {"{{ 'a'|map(", "'map',", "'upper')|list }}"},
    };
    for (size_t k = 0; k < sizeof chains / sizeof chains[0]; k++) {
        char *src = repeated(chains[k][0], chains[k][1], 50000, chains[k][2]);
        expect_error(src, "{\"x\": {}}", "deeper than");
        free(src);
    }
    /* values nested 100,000 deep: comparing, printing and freeing them would recurse as deep */
    expect_error("{% set ns = namespace(x=[], y=[]) %}{% for i in range(100000) %}"
                 "{% set ns.x = [ns.x] %}{% set ns.y = [ns.y] %}{% endfor %}{{ ns.x == ns.y }}",
                 NULL, "nested deeper than");
    expect_error("{% set ns = namespace(x={}) %}{% for i in range(100000) %}"
                 "{% set ns.x = {'k': ns.x} %}{% endfor %}{{ ns.x }}",
                 NULL, "nested deeper than");
    expect_error("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}"
                 "{% set ns.x = [ns.x.count] %}{% endfor %}",
                 NULL, "nested deeper than");
    /* shared values: a list of two references to the previous one, 64 times, is small in
     * memory but 2^64 items to compare or print */
    g4_jinja_limits few = {.max_steps = 1000000}, short_output = {.max_output = 1 << 20};
    expect_error_limits("{% set ns = namespace(x=[1], y=[1]) %}{% for i in range(64) %}"
                        "{% set ns.x = [ns.x, ns.x] %}{% set ns.y = [ns.y, ns.y] %}{% endfor %}"
                        "{{ ns.x == ns.y }}",
                        NULL, few, "steps");
    expect_error_limits("{% set ns = namespace(x=[1]) %}{% for i in range(64) %}"
                        "{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x|string|length }}",
                        NULL, short_output, "limit");
    /* memory: a list doubled in a loop, strings kept in a list, output kept in macro frames */
    expect_error("{% set ns = namespace(x=[1]) %}{% for i in range(64) %}"
                 "{% set ns.x = ns.x + ns.x %}{% endfor %}",
                 NULL, "memory");
    expect_error("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}"
                 "{% set ns.l = ns.l + ['x' * 1000000 ~ i] %}{% endfor %}",
                 NULL, "memory");
    /* work inside builtins counts as steps */
    expect_error_limits("{{ range(30000)|unique|list|length }}", NULL, few, "steps");
    expect_error_limits("{% set s = 'ab' * 10000000 %}{% for i in range(1000) %}{{ s|length }}"
                        "{% endfor %}", NULL, few, "steps");
    expect_error_limits("{% set s = 'a' * 20000000 %}{% for i in range(1000) %}{{ s[-1] }}"
                        "{% endfor %}", NULL, few, "steps");
    expect_error_limits("{% set s = 'a' * 20000000 %}{% for i in range(1000) %}"
                        "{{ s.find('b') }}{% endfor %}", NULL, few, "steps");
}

/* Reference cycles through namespaces and macros are broken at the end of a render (the ASan
 * build's leak checker fails this test otherwise). */
static void test_cycles(void) {
    expect_render("{% set ns = namespace() %}{% set ns.self = ns %}{{ ns.self.self is defined }}",
                  NULL, "True");
    expect_render("{% macro m() %}M{% endmacro %}{% set ns = namespace(f=m) %}{% set ns.n = ns %}"
                  "{{ ns.f() }}{% for i in [1] %}{% macro inner() %}{{ i }}{% endmacro %}"
                  "{% set ns.g = inner %}{% endfor %}{{ ns.g is defined }}",
                  NULL, "MTrue");
}

/* Every prefix and many mutations of a real chat template: parse, and render what parses; none
 * may crash or leak. */
static void test_malformed(void) {
    char *src = NULL;
    size_t len = 0;
    g4_error err;
    if (g4_read_file(g4t_shared("chat_templates/gemma-4-31b-it.jinja"), &src, &len, &err)) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    json_t *ctx = json_loads(
        "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", "
        "\"content\": \"hi\"}, {\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"a\", "
        "\"function\": {\"name\": \"f\", \"arguments\": {\"x\": [1, {\"y\": null}]}}}]}, "
        "{\"role\": \"tool\", \"tool_call_id\": \"a\", \"content\": \"ok\"}], \"tools\": "
        "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d\", "
        "\"parameters\": {\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"array\", "
        "\"items\": {\"type\": \"object\"}}}}}}], \"bos_token\": \"<bos>\", "
        "\"add_generation_prompt\": true, \"enable_thinking\": true}",
        0, NULL);
    CHECK(ctx != NULL);
    int parsed = 0, rendered = 0, total = 0;
    g4_jinja_limits lim = {.max_output = 1 << 20, .max_steps = 2000000, .max_depth = 50};
    for (size_t cut = 0; cut <= len; cut += 7) {
        g4_jinja *t = NULL;
        total++;
        if (g4_jinja_parse(src, cut, &t, &err) == 0) {
            parsed++;
            char *out = NULL;
            if (g4_jinja_render_ex(t, ctx, &lim, &out, NULL, &err) == 0) rendered++;
            free(out);
            g4_jinja_free(t);
        } else {
            CHECKF(!strncmp(err.msg, "template line ", 14), "prefix %zu: %s", cut, err.msg);
        }
    }
    /* random byte mutations */
    unsigned seed = 12345;
    const char alphabet[] = "{}%#-+()[]'\"|.,:=~ \n\tabcifnotrse0123456789_*/<>!";
    char *m = malloc(len + 1);
    for (int round = 0; round < 400; round++) {
        memcpy(m, src, len);
        for (int k = 0; k < 1 + round % 5; k++) {
            seed = seed * 1103515245u + 12345u;
            size_t at = (seed >> 8) % len;
            seed = seed * 1103515245u + 12345u;
            m[at] = alphabet[(seed >> 8) % (sizeof alphabet - 1)];
        }
        g4_jinja *t = NULL;
        total++;
        if (g4_jinja_parse(m, len, &t, &err) == 0) {
            parsed++;
            char *out = NULL;
            if (g4_jinja_render_ex(t, ctx, &lim, &out, NULL, &err) == 0) rendered++;
            free(out);
            g4_jinja_free(t);
        }
    }
    /* binary garbage */
    for (int round = 0; round < 200; round++) {
        size_t n = 1 + round * 3;
        for (size_t i = 0; i < n && i < len; i++) {
            seed = seed * 1103515245u + 12345u;
            m[i] = (char)(seed >> 16);
        }
        g4_jinja *t = NULL;
        total++;
        if (g4_jinja_parse(m, n < len ? n : len, &t, &err) == 0) {
            char *out = NULL;
            g4_jinja_render_ex(t, ctx, &lim, &out, NULL, &err);
            free(out);
            g4_jinja_free(t);
        }
    }
    fprintf(stderr, "malformed templates: %d tried, %d parsed, %d rendered\n", total, parsed, rendered);
    free(m);
    free(src);
    json_decref(ctx);
}

typedef struct {
    const g4_jinja *t;
    const json_t *ctx;
    const char *want;
    int ok;
} thread_job;

static void *render_thread(void *arg) {
    thread_job *j = arg;
    j->ok = 1;
    for (int i = 0; i < 200; i++) {
        char *out = NULL;
        g4_error err;
        if (g4_jinja_render(j->t, j->ctx, &out, NULL, &err) || strcmp(out, j->want)) j->ok = 0;
        free(out);
    }
    return NULL;
}

/* One parsed template, rendered from several threads at once. */
static void test_threads(void) {
    const char *src = "{% macro f(x) %}[{{ x|upper }}]{% endmacro %}{% for m in msgs %}"
                      "{{ f(m ~ 'a') }}{{ 'k' in {'k': 1} }}{% endfor %}";
    g4_jinja *t = NULL;
    g4_error err;
    CHECK(g4_jinja_parse(src, strlen(src), &t, &err) == 0);
    json_t *ctx = json_pack("{s:[s,s]}", "msgs", "x", "y");
    thread_job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (thread_job){t, ctx, "[XA]True[YA]True", 0};
        pthread_create(&th[i], NULL, render_thread, &jobs[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(jobs[i].ok);
    }
    json_decref(ctx);
    g4_jinja_free(t);
}

int main(void) {
    test_reference_cases();
    test_error_lines();
    test_semantics();
    test_limits();
    test_hostile();
    test_cycles();
    test_malformed();
    test_threads();
    return g4t_done();
}
