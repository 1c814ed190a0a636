/* Constrained decoding (src/engine/grammar.h, json_schema.c):
 * - json_object's grammar accepts every prefix of the objects RFC 8259 allows and refuses the first byte that
 *   breaks one (jansson, an independent parser, agrees on each document);
 * - JSON Schema grammars accept documents and refuse others, each case's verdict checked by Python's jsonschema
 *   (an independent validator) in tests/data/json_schema_check.py; bad schemas are one-line errors;
 * - the masks of the byte-ordered token walk (over interned sets, and over the sets themselves) equal each
 *   token's bytes fed alone, along a tokenized document (the masks kept by state included);
 * - on the example model, sampled generations under schemas and tool-call grammars give documents jsonschema
 *   accepts (or, cut by max_new_tokens, prefixes), tool calls the chat parser reads with valid arguments. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/grammar.h"
#include "gemma4c.h"
#include "tokenizer/tokenizer.h"

static g4_tokenizer *tok;
static g4_gr_tokens *tokens;
static FILE *cases; /* JSON lines for json_schema_check.py: {"schema", "doc", "valid"} */

/* Writes one JSON line and releases it. */
static void put_line(FILE *f, json_t *line) {
    char *t = json_dumps(line, JSON_COMPACT);
    if (t) fprintf(f, "%s\n", t);
    free(t);
    json_decref(line);
}

static g4_gr_match *match_think(const g4_grammar *g, int thinking) {
    g4_gr_match *m;
    g4_error err;
    const int32_t eos = 1;
    if (g4_gr_match_new(g, tokens, tok, &eos, 1, thinking, &m, &err)) {
        CHECKF(0, "%s", err.msg);
        return NULL;
    }
    return m;
}

static g4_gr_match *match_of(const g4_grammar *g) { return match_think(g, 0); }

/* How far the grammar reads s byte by byte: its length when every byte is accepted. */
static size_t accepted(const g4_grammar *g, const char *s, int *done) {
    *done = 0;
    g4_gr_match *m = match_of(g);
    if (!m) return (size_t)-1;
    size_t i = 0;
    while (s[i] && g4_gr_match_feed(m, s + i, 1) == 0) i++;
    *done = g4_gr_match_accepting(m);
    g4_gr_match_free(m);
    return i;
}

static g4_grammar *schema_grammar(const char *schema) {
    g4_grammar *g;
    g4_error err;
    if (g4_grammar_json_schema(schema, &g, &err)) {
        CHECKF(0, "schema %s: %s", schema, err.msg);
        return NULL;
    }
    return g;
}

static void test_json_object(void) {
    g4_grammar *g = schema_grammar("{\"type\": \"object\"}");
    if (!g) return;
    static const char *const valid[] = {
        "{}", "{\"a\":1}", "{ \"a\" : [1, -2.5e+3, 0, 0.0, 1E9, true, false, null, \"x\\n\\u00e9\\\"\", {}, []] }",
        "{\"k\":{\"n\":{\"m\":[[[]]]}},\"s\":\"\xc3\xa9\\/\"}", "{\"a\":-0.5,\"b\":[{\"c\":\"d\"}]}",
        "{\n\t\"z\": 1234567890, \"y\": 1.2345678901234567890}",
    };
    for (size_t i = 0; i < sizeof valid / sizeof valid[0]; i++) {
        int done;
        size_t n = accepted(g, valid[i], &done);
        json_t *j = json_loads(valid[i], 0, NULL);
        CHECKF(n == strlen(valid[i]) && done && json_is_object(j), "valid: %s (read %zu, done %d)", valid[i], n, done);
        json_decref(j);
    }
    static const struct {
        const char *doc;
        size_t at;
    } invalid[] = {
        {"[1]", 0},         {"{a:1}", 1},        {"{\"a\" 1}", 5},     {"{\"a\":01}", 6},
        {"{\"a\":1.}", 7}, {"{\"a\":-}", 6},   {"{\"a\":1e}", 7},   {"{\"a\":tru}", 8},   {"{\"a\":nul1}", 8},
        {"{\"a\":[1,]}", 8}, {"{\"a\":1,}", 7}, {"{\"a\":\"\\x\"}", 7}, {"{\"a\":\"\\u12g4\"}", 10},
        {"{\"a\":\"\n\"}", 6}, {"{\"a\":1]", 6}, {"{}{", 2},         {"{\"a\":[}", 6},
        {"{\"a\":+1}", 5},  {"{\"a\":\"\xff\"}", 6}, {"{\"a\":\"\xed\xa0\x80\"}", 7} /* a surrogate */,
        {"{\"a\":\"\xe0\x80\xaf\"}", 7} /* overlong */,
    };
    for (size_t i = 0; i < sizeof invalid / sizeof invalid[0]; i++) {
        int done;
        size_t n = accepted(g, invalid[i].doc, &done);
        CHECKF(n == invalid[i].at, "invalid: %s stops at %zu, want %zu", invalid[i].doc, n, invalid[i].at);
        json_t *j = json_loads(invalid[i].doc, 0, NULL); /* jansson refuses them too */
        CHECKF(!json_is_object(j), "jansson accepts %s", invalid[i].doc);
        json_decref(j);
    }
    /* no blanks before the object, nothing after it; blanks in a row and nesting are bounded */
    int d;
    CHECK(accepted(g, " {}", &d) == 0 && accepted(g, "{} ", &d) == 2 && d);
    /* a thinking channel first, where the generation allows one (a chat reply) */
    const int32_t open = g4_tokenizer_token_id(tok, "<|channel>"), close = g4_tokenizer_token_id(tok, "<channel|>");
    g4_gr_match *m = match_think(g, 1), *plain = match_of(g);
    CHECK(m && plain && g4_gr_match_accept(plain, open) == -1 && g4_gr_match_accept(m, open) == 0 &&
          g4_gr_match_feed(m, "thought\n{[ not JSON", 19) == 0 && g4_gr_match_accept(m, close) == 0 &&
          g4_gr_match_accept(m, close) == -1 && g4_gr_match_feed(m, "{}", 2) == 0 && g4_gr_match_done(m));
    g4_gr_match_free(m);
    g4_gr_match_free(plain);
    char blanks[64] = "{";
    memset(blanks + 1, ' ', 30);
    CHECK(accepted(g, blanks, &d) == 21);
    char deep[400] = "{\"a\":";
    for (int i = 0; i < 300; i++) strcat(deep, "[");
    const size_t depth = accepted(g, deep, &d);
    CHECKF(depth > 5 + 40 && depth < 5 + 300, "nesting stops after %zu bytes", depth);
    g4_grammar_free(g);
}

/* One schema: each document's verdict from the grammar (read whole and accepting), written for jsonschema: the
 * first n_valid documents are accepted, the next n_reordered refused though JSON Schema takes them (properties
 * out of the schema's order, a character escaped that JSON need not escape, a value of a type a typeless
 * schema's keyword does not constrain), the rest refused. */
static void schema_case(const char *schema, const char *const *docs, int n_docs, int n_valid, int n_reordered) {
    g4_grammar *g = schema_grammar(schema);
    if (!g) return;
    json_t *js = json_loads(schema, 0, NULL);
    for (int i = 0; i < n_docs; i++) {
        int done;
        const size_t n = accepted(g, docs[i], &done);
        const int ok = n == strlen(docs[i]) && done;
        CHECKF(ok == (i < n_valid), "schema %s: %s is %s (read %zu of %zu)", schema, docs[i],
               ok ? "accepted" : "refused", n, strlen(docs[i]));
        json_t *doc = json_loads(docs[i], JSON_DECODE_ANY, NULL);
        /* (the texts too: jansson writes reals in 17 digits, 3.14 as 3.1400000000000001) */
        json_t *line = json_pack("{s:O,s:o,s:b,s:s,s:s}", "schema", js, "doc", doc ? doc : json_string(docs[i]),
                                 "valid", i < n_valid, "schema_text", schema, "doc_text", docs[i]);
        if (!doc) json_object_set_new(line, "unparsable", json_true());
        if (i >= n_valid && i < n_valid + n_reordered) json_object_set_new(line, "reordered", json_true());
        put_line(cases, line);
    }
    json_decref(js);
    g4_grammar_free(g);
}

#define DOCS(...) (const char *const[]){__VA_ARGS__}, (int)(sizeof((const char *const[]){__VA_ARGS__}) / sizeof(char *))

static void test_schemas(void) {
    /* valid documents first (the count after the list), then refused ones */
    schema_case("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\","
                "\"minimum\":0,\"maximum\":150},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},"
                "\"maxItems\":2}},\"required\":[\"name\",\"age\"],\"additionalProperties\":false}",
                DOCS("{\"name\":\"Pierre\",\"age\":27}", "{ \"name\" : \"\xc3\xa9\" , \"age\" : 150 , \"tags\" : [ ] }",
                     "{\"name\":\"a\\\"b\",\"age\":0,\"tags\":[\"x\",\"y\"]}",
                     "{\"age\":27,\"name\":\"Pierre\"}", "{\"name\":\"P\"}", "{\"name\":\"P\",\"age\":151}",
                     "{\"name\":\"P\",\"age\":-1}", "{\"name\":\"P\",\"age\":1,\"x\":1}",
                     "{\"name\":\"P\",\"age\":1,\"tags\":[\"a\",\"b\",\"c\"]}", "{\"name\":1,\"age\":1}",
                     "{\"name\":\"P\",\"age\":01}"),
                3, 1);
    schema_case("{\"enum\":[\"red\",\"green\",null,42,{\"a\":[1]}]}",
                DOCS("\"red\"", "null", "42", "{\"a\":[1]}", "\"blue\"", "43", "\"Red\""), 4, 0);
    schema_case("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"boolean\"},{\"const\":\"x\"}],\"items\":false,"
                "\"minItems\":1}",
                DOCS("[true]", "[false,\"x\"]", "[]", "[true,\"y\"]", "[true,\"x\",1]", "[1]"), 2, 0);
    schema_case("{\"anyOf\":[{\"type\":\"integer\",\"minimum\":-20,\"exclusiveMaximum\":-3},{\"type\":\"string\","
                "\"minLength\":2,\"maxLength\":3}]}",
                DOCS("-20", "-4", "\"ab\"", "\"\xc3\xa9\xc3\xa9\xc3\xa9\"", "-3", "-21", "5", "\"a\"", "\"abcd\""), 4, 0);
    schema_case("{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"number\"},\"next\":"
                "{\"anyOf\":[{\"$ref\":\"#/$defs/node\"},{\"type\":\"null\"}]}},\"required\":[\"v\",\"next\"]}},"
                "\"$ref\":\"#/$defs/node\"}",
                DOCS("{\"v\":1.5,\"next\":{\"v\":-2e3,\"next\":null}}", "{\"v\":0,\"next\":null}",
                     "{\"v\":1,\"next\":{\"v\":2}}", "{\"v\":\"1\",\"next\":null}"),
                2, 0);
    schema_case("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":"
                "{\"type\":\"boolean\"}}",
                DOCS("{\"a\":1,\"b\":true,\"c\":false}", "{\"z\":true}", "{}", "{\"a\":1,\"b\":2}"), 3, 0);
    /* formats: jsonschema checks date and uuid here (date-time needs a package Debian does not pin) */
    schema_case("{\"type\":\"object\",\"properties\":{\"when\":{\"type\":\"string\",\"format\":\"date-time\"},"
                "\"day\":{\"type\":\"string\",\"format\":\"date\"},\"id\":{\"type\":\"string\",\"format\":\"uuid\"},"
                "\"p\":{\"type\":[\"number\",\"null\"],\"minimum\":0}},\"required\":[\"when\",\"day\",\"id\",\"p\"]}",
                DOCS("{\"when\":\"2026-12-06T04:05:06.5+01:00\",\"day\":\"2026-12-06\","
                     "\"id\":\"123e4567-e89b-12d3-a456-426614174000\",\"p\":0.25}",
                     "{\"when\":\"2026-12-06T23:59:59Z\",\"day\":\"1812-09-07\","
                     "\"id\":\"00000000-0000-0000-0000-00000000000A\",\"p\":null}",
                     "{\"when\":\"2026-12-06T04:05:06Z\",\"day\":\"2026-13-06\","
                     "\"id\":\"123e4567-e89b-12d3-a456-426614174000\",\"p\":1}",
                     "{\"when\":\"2026-12-06T04:05:06Z\",\"day\":\"2026-12-06\",\"id\":\"123e4567\",\"p\":1}",
                     "{\"when\":\"2026-12-06T04:05:06Z\",\"day\":\"2026-12-06\","
                     "\"id\":\"123e4567-e89b-12d3-a456-426614174000\",\"p\":-1}"),
                2, 0);
    /* formats written as patterns (json_schema.c format_pattern): ipv4 / ipv6 judged by jsonschema (Python's
       ipaddress), hostname / email / duration by the standards' rules in json_schema_check.py */
    schema_case("{\"type\":\"string\",\"format\":\"ipv4\"}",
                DOCS("\"192.168.0.1\"", "\"0.0.0.0\"", "\"255.255.255.255\"", "\"256.1.1.1\"", "\"01.2.3.4\"",
                     "\"1.2.3\"", "\"1.2.3.4.5\"", "\"1.2.3.-4\""),
                3, 0);
    schema_case("{\"type\":\"string\",\"format\":\"ipv6\"}",
                DOCS("\"::\"", "\"::1\"", "\"1::\"", "\"2001:db8::ff00:42:8329\"",
                     "\"2001:0DB8:0000:0000:0000:ff00:0042:8329\"", "\"::ffff:192.0.2.128\"", "\"1:2:3:4:5:6:7::\"",
                     "\"1:2:3:4:5:6:1.2.3.4\"", "\"fe80::1:2:3:4:5:6\"", "\"1::2:3:4:5:1.2.3.4\"",
                     "\"1:2:3:4:5:6:7:8:9\"", "\"1::2::3\"", "\"12345::\"", "\"1:2:3:4:5:6:7\"",
                     "\"::ffff:1.2.3.256\"", "\"fe80::1%eth0\"", "\"1::2:3:4:5:6:7:8\"", "\"1:2:3:4:5:6:7:1.2.3.4\"",
                     "\"1::2:3:4:5:6:1.2.3.4\"", "\":1::\""),
                10, 0);
    schema_case("{\"type\":\"string\",\"format\":\"hostname\"}",
                DOCS("\"example.com\"", "\"a\"", "\"a-b.c-d.e9\"", "\"xn--bcher-kva.example\"", "\"-a.com\"",
                     "\"a-.com\"", "\"a..b\"", "\"a_b.com\"", "\".a\"", "\"a.\"", "\"\""),
                4, 0);
    schema_case("{\"type\":\"object\",\"properties\":{\"to\":{\"type\":\"string\",\"format\":\"email\"},"
                "\"after\":{\"type\":\"string\",\"format\":\"duration\"}},\"required\":[\"to\",\"after\"]}",
                DOCS("{\"to\":\"pierre.bezukhov@moscow.ru\",\"after\":\"P1Y2M3DT4H5M6S\"}",
                     "{\"to\":\"a+b/c=d@x\",\"after\":\"PT36H\"}", "{\"to\":\"n@a.b\",\"after\":\"P3W\"}",
                     "{\"to\":\"n@a.b\",\"after\":\"P1MT5S\"}",
                     "{\"to\":\"a..b@x\",\"after\":\"P1D\"}", "{\"to\":\"a@\",\"after\":\"P1D\"}",
                     "{\"to\":\"@x\",\"after\":\"P1D\"}", "{\"to\":\"a@-x\",\"after\":\"P1D\"}",
                     "{\"to\":\"a b@x\",\"after\":\"P1D\"}", "{\"to\":\"a@x\",\"after\":\"P\"}",
                     "{\"to\":\"a@x\",\"after\":\"PT\"}", "{\"to\":\"a@x\",\"after\":\"P1Y2D\"}",
                     "{\"to\":\"a@x\",\"after\":\"PT1H1S\"}", "{\"to\":\"a@x\",\"after\":\"P1WT1H\"}",
                     "{\"to\":\"a@x\",\"after\":\"1D\"}", "{\"to\":\"a@x\",\"after\":\"P1.5D\"}"),
                4, 0);
    /* patterns (anchored): classes, quantifiers, groups, escapes; JSON escapes in the output */
    schema_case("{\"type\":\"string\",\"pattern\":\"^[A-Z]{3}-\\\\d{2,4}(x|yz)?$\"}",
                DOCS("\"ABC-12\"", "\"XYZ-1234yz\"", "\"QQQ-99x\"", "\"AB-12\"", "\"ABC-12345\"", "\"abc-12\"",
                     "\"ABC-12y\""),
                3, 0);
    schema_case("{\"type\":\"string\",\"pattern\":\"^a\\\"b\\\\\\\\c\\\\.d[^0-9]+$\"}",
                DOCS("\"a\\\"b\\\\c.d\xc3\xa9!\"", "\"a\\\"b\\\\c.d\\n\"", "\"a\\\"b\\\\c.d1\"",
                     "\"a\\\"b\\\\cxd!\"", "\"a\\\"b\\\\c.d\""),
                2, 0);
    schema_case("{\"type\":\"string\",\"pattern\":\"^.{2}$\"}",
                DOCS("\"a\\t\"", "\"\xc3\xa9\xe2\x82\xac\"", "\"\\u0041b\"", "\"a\\n\"", "\"abc\"", "\"a\""), 2, 1);
    /* classes beyond ASCII: ranges of code points in UTF-8, complements, \D */
    schema_case("{\"type\":\"string\",\"pattern\":\"^[\xce\xb1-\xcf\x89]{2}\\\\D[^\xe4\xb8\x80-\xe9\xbe\xa5" "a]$\"}",
                DOCS("\"\xce\xb1\xce\xb2!\xf0\x9f\x98\x80\"", "\"\xcf\x89\xcf\x89\xe4\xb8\x80" "b\"",
                     "\"\xce\xb1\xce\xb2" "1b\"", "\"ab!b\"", "\"\xce\xb1\xce\xb2!\xe5\xad\x97\"",
                     "\"\xce\xb1\xce\xb2!a\""),
                2, 0);
    /* number bounds (written without an exponent), integer bounds on one side only */
    schema_case("{\"type\":\"number\",\"minimum\":0,\"maximum\":1}",
                DOCS("0", "1", "0.5", "0.999", "1.0", "0.0000", "1e-3", "1.0001", "-0.1", "2", "01"), 6, 1);
    schema_case("{\"type\":\"number\",\"exclusiveMinimum\":-2.5,\"maximum\":3.25}",
                DOCS("-2.49", "-2", "0", "3.25", "3.2499", "-0.5", "-2.5", "-2.50", "3.251", "4", "-3"), 6, 0);
    schema_case("{\"type\":\"number\",\"maximum\":-0.5}",
                DOCS("-0.5", "-0.50", "-7", "-123456.75", "-0.49", "0", "-0", "1"), 4, 0);
    schema_case("{\"type\":\"number\",\"minimum\":0.001,\"exclusiveMaximum\":0.002}",
                DOCS("0.001", "0.0015", "0.00199999", "0.002", "0.0009", "0.01", "0"), 3, 0);
    schema_case("{\"type\":\"number\",\"exclusiveMinimum\":0}", DOCS("0.1", "7", "0.0001", "0", "0.000", "-1"), 3, 0);
    schema_case("{\"type\":\"number\",\"exclusiveMaximum\":0}", DOCS("-0.1", "-7", "0", "0.5"), 2, 0);
    schema_case("{\"type\":\"integer\",\"minimum\":1}", DOCS("1", "123456789012345678", "0", "-5"), 2, 0);
    /* multipleOf (exact decimals: json_schema_check.py reads numbers as Python decimals): an automaton of the
       remainder, numbers without an exponent and with at most the divisor's fraction digits (more: refused, though
       JSON Schema takes them); bounds that pick a sign; at most 256 multiples between two bounds as literals */
    schema_case("{\"type\":\"integer\",\"multipleOf\":5}",
                DOCS("0", "5", "-15", "1234567890123456785", "5.0", "1e1", "-0", "7", "-3", "51"), 4, 3);
    schema_case("{\"type\":\"number\",\"multipleOf\":0.01,\"minimum\":0}",
                DOCS("0", "0.01", "12.5", "3.14", "100", "0.07", "1.500", "1e2", "0.001", "-1", "3.145", "-0.01"), 6, 2);
    schema_case("{\"type\":\"number\",\"multipleOf\":0.25,\"minimum\":-1,\"maximum\":1}",
                DOCS("-1", "-0.75", "0", "0.5", "1", "0.50", "0.3", "1.25", "-1.25", "0.125"), 5, 1);
    schema_case("{\"type\":\"integer\",\"multipleOf\":1000,\"exclusiveMinimum\":0}",
                DOCS("1000", "25000", "1000000", "0", "500", "-1000", "1001", "10"), 3, 0);
    schema_case("{\"type\":\"number\",\"multipleOf\":0.3}",
                DOCS("0.3", "-0.6", "0.9", "3", "1.2", "0", "29.7", "0.30", "0.1", "1", "-0.2", "0.03"), 7, 1);
    schema_case("{\"type\":\"number\",\"multipleOf\":7,\"maximum\":0}",
                DOCS("0", "-7", "-14", "-700", "-7.0", "7", "-6", "-0.7"), 4, 1);
    schema_case("{\"type\":\"number\",\"multipleOf\":0.07,\"exclusiveMaximum\":0}",
                DOCS("-0.07", "-0.14", "-7", "-0.7", "0", "-0.1", "0.07"), 4, 0);
    schema_case("{\"type\":\"integer\",\"multipleOf\":0.5,\"minimum\":3,\"maximum\":5}",
                DOCS("3", "4", "5", "2", "6", "3.5"), 3, 0);
    schema_case("{\"multipleOf\":0.125}", DOCS("0.125", "-2.375", "8", "0.25", "\"x\"", "0.1", "0.1255"), 4, 1);
    /* allOf of several schemas, merged: objects (a $ref among them), bounds and types */
    schema_case("{\"$defs\":{\"base\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\",\"minimum\":0}},"
                "\"required\":[\"id\"]}},\"allOf\":[{\"$ref\":\"#/$defs/base\"},{\"type\":\"object\",\"properties\":"
                "{\"name\":{\"type\":\"string\",\"maxLength\":3},\"id\":{\"maximum\":9}},\"required\":[\"name\"]}]}",
                DOCS("{\"id\":0,\"name\":\"abc\"}", "{\"id\":9,\"name\":\"\"}", "{\"id\":1,\"name\":\"a\",\"x\":1}",
                     "{\"name\":\"a\",\"id\":1}", "{\"id\":1}", "{\"name\":\"a\"}", "{\"id\":-1,\"name\":\"a\"}",
                     "{\"id\":10,\"name\":\"a\"}", "{\"id\":1,\"name\":\"abcd\"}"),
                2, 2);
    schema_case("{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"},\"b\":{}},"
                "\"additionalProperties\":false},{\"properties\":{\"b\":{\"type\":\"integer\"},\"c\":{}}}]}",
                DOCS("{\"a\":true,\"b\":2}", "{}", "{\"b\":-1}", "{\"b\":\"x\"}", "{\"c\":1}", "{\"a\":1}"), 3, 0);
    schema_case("{\"allOf\":[{\"type\":\"number\",\"minimum\":0},{\"maximum\":10,\"exclusiveMinimum\":-5},"
                "{\"type\":[\"integer\",\"null\"]},{\"description\":\"a count\"}]}",
                DOCS("0", "10", "7", "11", "-1", "null", "2.5"), 3, 0);
    schema_case("{\"allOf\":[{\"type\":\"integer\",\"maximum\":10,\"minimum\":-3},{\"maximum\":5,\"minimum\":0}]}",
                DOCS("0", "5", "6", "-1", "10", "-3"), 2, 0);
    schema_case("{\"allOf\":[{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"maxItems\":3},"
                "{\"items\":{\"minimum\":1},\"minItems\":1}]}",
                DOCS("[1]", "[1,2,3]", "[]", "[0]", "[1,2,3,4]", "[1.5]"), 2, 0);
    /* a keyword of one type without "type": values of that type (JSON Schema lets others pass) */
    schema_case("{\"maxLength\":2}", DOCS("\"ab\"", "5", "\"abc\""), 1, 1);
    /* what is refused with a one-line error naming it */
    static const struct {
        const char *schema, *says;
    } bad[] = {
        {"{\"type\":\"string\",\"pattern\":\"a+\"}", "anchor"},
        {"{\"type\":\"string\",\"pattern\":\"^(?=a)a$\"}", "lookaround"},
        {"{\"type\":\"string\",\"pattern\":\"^(a$\"}", "unclosed"},
        {"{\"type\":\"number\",\"multipleOf\":0.01,\"minimum\":5,\"maximum\":100000}", "bounds other than a sign"},
        {"{\"type\":\"integer\",\"multipleOf\":1009}", "above 1000"},
        {"{\"type\":\"number\",\"multipleOf\":0}", "above 0"},
        {"{\"type\":\"number\",\"multipleOf\":0.5,\"minimum\":2.1,\"maximum\":2.4}", "no multiple"},
        {"{\"type\":\"number\",\"minimum\":2,\"exclusiveMaximum\":2}", "no number"},
        {"{\"type\":\"number\",\"maximum\":1e-30}", "20 fraction digits"},
        {"{\"type\":\"string\",\"format\":\"uri\"}", "uri"},
        {"{\"$ref\":\"#/$defs/missing\"}", "missing"},
        {"{\"type\":\"object\",\"properties\":{},\"required\":[\"x\"]}", "\"x\""},
        {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "no integer"},
        {"{\"type\":\"strng\"}", "strng"},
        {"{\"allOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}", "no value in common"},
        {"{\"allOf\":[{\"anyOf\":[{\"type\":\"string\"}]},{\"type\":\"string\"}]}", "\"anyOf\""},
        {"{\"allOf\":[{\"type\":\"string\",\"pattern\":\"^a$\"},{\"pattern\":\"^b$\"}]}", "\"pattern\" differs"},
        {"{\"allOf\":[{\"properties\":{\"a\":{}},\"required\":[\"a\"]},{\"properties\":{},\"additionalProperties\":false}]}",
         "closed out"},
        {"{\"type\":\"object\"", "not valid JSON"},
        {"false", "accepts nothing"},
        {"{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}", "left-recursive"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        g4_grammar *g;
        g4_error err = {0};
        int rc = g4_grammar_json_schema(bad[i].schema, &g, &err);
        CHECKF(rc && !g && strstr(err.msg, bad[i].says) && !strchr(err.msg, '\n'), "bad schema %s: rc %d, \"%s\"",
               bad[i].schema, rc, err.msg);
    }
}

/* How far g reads s (its length when it reads all), and whether it may end there. */
static void text_case(g4_grammar *g, const char *what, const char *doc, int want) {
    int done;
    const size_t n = accepted(g, doc, &done);
    const int ok = n == strlen(doc) && done;
    CHECKF(ok == want, "%s: \"%s\" is %s (read %zu of %zu)", what, doc, ok ? "accepted" : "refused", n, strlen(doc));
}

/* GBNF (llama.cpp's notation), whole-output regular expressions (verdicts checked by Python's re.fullmatch) and
 * choices; bad specs are one-line errors. */
static void test_text_grammars(void) {
    g4_grammar *g;
    g4_error err = {0};
    const char *gbnf = "# a greeting\n"
                       "root ::= greeting \", \" name \"!\" ws\n"
                       "greeting ::= \"Hello\" | \"Hi\" | \"\\u00c7a va\"   # \\u escapes\n"
                       "name ::= [A-Z\\xc0-\\u00dd] [a-z]{1,8} (\"-\" [A-Z] [a-z]+)?\n"
                       "ws ::= [ \\t\\n]{0,2}\n";
    CHECKF(g4_grammar_gbnf(gbnf, &g, &err) == 0, "%s", err.msg);
    if (!err.msg[0]) {
        static const struct {
            const char *doc;
            int ok;
        } docs[] = {{"Hello, Pierre!", 1}, {"Hi, Na!\n", 1}, {"\xc3\x87" "a va, \xc3\x89lo\xc3\xafse!", 0},
                    {"\xc3\x87" "a va, \xc3\x89lo-Ise! \t", 1}, {"Hey, Pierre!", 0}, {"Hello, pierre!", 0},
                    {"Hello, P!", 0}, {"Hello, Pierre!   ", 0}, {"Hello, Aaaaaaaaaa!", 0},
                    {"Hello, Anna-Pavlovna!", 1}};
        for (size_t i = 0; i < sizeof docs / sizeof docs[0]; i++) text_case(g, "gbnf", docs[i].doc, docs[i].ok);
        g4_grammar_free(g);
    }
    /* alternatives over lines inside parentheses and after |, special tokens by their text */
    CHECK(g4_grammar_gbnf("root ::= ( \"a\" |\n   \"b\" )+ \".\" |\n\n  \"c\"\n", &g, &err) == 0);
    if (!err.msg[0]) {
        text_case(g, "gbnf lines", "abba.", 1);
        text_case(g, "gbnf lines", "c", 1);
        text_case(g, "gbnf lines", ".", 0);
        g4_grammar_free(g);
    }
    CHECK(g4_grammar_gbnf("root ::= <|tool_call> \"call:\" [a-z]+ \"{}\" <tool_call|>", &g, &err) == 0);
    g4_gr_match *m = g ? match_of(g) : NULL;
    CHECK(m && g4_gr_match_accept(m, g4_tokenizer_token_id(tok, "<|tool_call>")) == 0 &&
          g4_gr_match_feed(m, "call:now{}", 10) == 0 &&
          g4_gr_match_accept(m, g4_tokenizer_token_id(tok, "<tool_call|>")) == 0 && g4_gr_match_done(m));
    g4_gr_match_free(m);
    g4_grammar_free(g);
    static const struct {
        const char *text, *says;
    } bad[] = {
        {"root ::= foo", "\"foo\" is used but not defined"}, {"a ::= \"x\"", "no rule named root"},
        {"root ::= (\"a\"", "unclosed ("}, {"root ::= root \"a\"", "left-recursive"},
        {"root ::= \"a\"{5000}", "{m,n}"}, {"root ::= \"a\" )", "unmatched )"}, {"root = \"a\"", "::="},
        {"root ::= [b-a]", "out of order"}, {"root ::= \"\\q\"", "unknown escape"},
        {"root ::= \"a\"\nroot ::= \"b\"", "defined twice"}, {"root ::= \"a\"\n  | \"b\"", "rule name"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        g = NULL;
        err.msg[0] = 0;
        const int rc = g4_grammar_gbnf(bad[i].text, &g, &err);
        CHECKF(rc && !g && strstr(err.msg, bad[i].says) && !strchr(err.msg, '\n'), "bad gbnf %s: \"%s\"", bad[i].text,
               err.msg);
    }
    /* hostile sizes: nesting is bounded (no stack runs out), a chain of 100000 rules compiles */
    char *deep = malloc(4000);
    strcpy(deep, "root ::= ");
    for (int i = 0; i < 1000; i++) strcat(deep, "(");
    err.msg[0] = 0;
    CHECK(g4_grammar_gbnf(deep, &g, &err) && strstr(err.msg, "nested deeper"));
    strcpy(deep, "^");
    for (int i = 0; i < 1000; i++) strcat(deep, "(");
    CHECK(g4_grammar_regex(deep, &g, &err) && strstr(err.msg, "nested deeper"));
    free(deep);
    size_t cap = 100000 * 40, len = 0;
    char *chain = malloc(cap);
    len += (size_t)snprintf(chain + len, cap - len, "root ::= r0\n");
    for (int i = 0; i < 100000; i++) len += (size_t)snprintf(chain + len, cap - len, "r%d ::= r%d \"x\"\n", i, i + 1);
    snprintf(chain + len, cap - len, "r100000 ::= \"y\"\n");
    CHECKF(g4_grammar_gbnf(chain, &g, &err) == 0, "a chain of rules: %s", err.msg);
    g4_grammar_free(g);
    free(chain);
    /* regular expressions over the whole output; each verdict goes to re.fullmatch too */
    static const struct {
        const char *regex, *docs[6];
    } rx[] = {
        {"^\\d{3}-[a-z]+$", {"123-abc", "12-abc", "123-", "1234-a", "123-abc!", NULL}},
        {"(yes|no)(, (please|thanks))?", {"yes", "no, thanks", "maybe", "yes,", "no, please!", NULL}},
        {"[^\\s\"]{2,3}\\.\\w*", {"ab.", "\xc3\xa9t\xc3\xa9.x_1", "a b.", "abcd.", "\"a.", NULL}},
        {"(?:a|b)*c+?\\u00e9", {"abbac\xc3\xa9", "c\xc3\xa9", "ab\xc3\xa9", "ccc\xc3\xa9", "abc", NULL}},
    };
    for (size_t i = 0; i < sizeof rx / sizeof rx[0]; i++) {
        err.msg[0] = 0;
        if (g4_grammar_regex(rx[i].regex, &g, &err)) {
            CHECKF(0, "regex %s: %s", rx[i].regex, err.msg);
            continue;
        }
        for (int k = 0; rx[i].docs[k]; k++) {
            int done;
            const size_t n = accepted(g, rx[i].docs[k], &done);
            json_t *line = json_pack("{s:s,s:s,s:b}", "regex", rx[i].regex, "doc", rx[i].docs[k], "valid",
                                     n == strlen(rx[i].docs[k]) && done);
            put_line(cases, line);
        }
        g4_grammar_free(g);
    }
    err.msg[0] = 0;
    CHECK(g4_grammar_regex("a(?<=b)", &g, &err) && strstr(err.msg, "lookaround"));
    /* choices */
    const char *const cities[] = {"Paris", "London", "Par"};
    CHECK(g4_grammar_choice(cities, 3, &g, &err) == 0);
    text_case(g, "choice", "Paris", 1);
    text_case(g, "choice", "Par", 1);
    text_case(g, "choice", "Rome", 0);
    m = match_of(g);
    CHECK(m && g4_gr_match_feed(m, "Par", 3) == 0 && g4_gr_match_accepting(m) && !g4_gr_match_done(m) &&
          g4_gr_match_feed(m, "is", 2) == 0 && g4_gr_match_done(m));
    g4_gr_match_free(m);
    g4_grammar_free(g);
    const char *const empty[] = {""};
    CHECK(g4_grammar_choice(empty, 1, &g, &err) && strstr(err.msg, "empty"));
}

/* The masks of the token walk (and those kept by state) against each token's bytes tried alone. */
static void test_masks(void) {
    g4_grammar *g = schema_grammar("{\"type\":\"object\",\"properties\":{\"who\":{\"type\":\"string\"},\"n\":{\"type\":"
                                   "\"array\",\"items\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":999}}},"
                                   "\"required\":[\"who\"]}");
    if (!g) return;
    const char *text = "{\"who\": \"Pierre B\\u00e9zukhov, \\\"the heir\\\"\", \"n\": [12, 7, 999, 100, 1]}";
    g4_tokens toks = {0};
    g4_error err;
    CHECK(g4_tokenize(tok, text, strlen(text), 0, &toks, &err) == 0);
    const int V = g4_tokenizer_vocab_size(tok);
    float *logits = malloc((size_t)V * sizeof *logits);
    g4_gr_match *m = match_of(g);
    const int every = getenv("G4_SANITIZE") ? 4 : 1; /* the sanitizer build checks every 4th step */
    int steps = 0, same_steps = 0;
    char buf[1100];
    for (size_t i = 0; m && logits && i < toks.n; i++) {
        memset(logits, 0, (size_t)V * sizeof *logits);
        g4_gr_match_mask(m, logits);
        if (i % (size_t)every == 0) {
            int same = 1;
            for (int id = 0; id < V && same; id++) {
                int n = g4_tokenizer_is_special(tok, id) ? -1 : g4_tokenizer_token_bytes(tok, id, buf, sizeof buf);
                const int may = (n > 0 && g4_gr_match_try(m, buf, (size_t)n)) || (id == 1 && g4_gr_match_accepting(m));
                if (may != (logits[id] == 0)) {
                    same = 0;
                    printf("step %zu: token %d (%.*s) mask %g, alone %d\n", i, id, n > 0 ? n : 0, buf, logits[id], may);
                }
            }
            /* the walk over the interned sets against the plain one (text tokens) */
            float *plain = calloc((size_t)V, sizeof *plain);
            if (plain) g4_gr_match_mask_sets(m, plain);
            for (int id = 0; plain && id < V && same; id++)
                if (!g4_tokenizer_is_special(tok, id) && id != 1 && plain[id] != logits[id]) {
                    same = 0;
                    printf("step %zu: token %d: interned walk %g, plain walk %g\n", i, id, logits[id], plain[id]);
                }
            free(plain);
            steps++;
            same_steps += same;
        }
        CHECKF(logits[toks.ids[i]] == 0 && g4_gr_match_accept(m, toks.ids[i]) == 0, "token %zu", i);
    }
    CHECKF(steps && same_steps == steps && m && g4_gr_match_done(m), "%d of %d masks equal the tokens' own verdicts",
           same_steps, steps);
    g4_gr_match_free(m);
    free(logits);
    free(toks.ids);
    g4_grammar_free(g);
}

static const char *tools_json =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather of a city\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":16},\"unit\":{\"enum\":"
    "[\"celsius\",\"fahrenheit\"]},\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":7}},"
    "\"required\":[\"city\",\"unit\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"now\",\"description\":\"The time\"}}]";

static void test_tool_grammar(void) {
    g4_grammar *g;
    g4_error err;
    CHECK(g4_grammar_tool_calls(tools_json, NULL, 0, &g, &err) == 0);
    g4_gr_match *m = match_of(g);
    const int32_t call = g4_tokenizer_token_id(tok, "<|tool_call>"), end = g4_tokenizer_token_id(tok, "<tool_call|>"),
                  quote = g4_tokenizer_token_id(tok, "<|\"|>");
    /* call:get_weather{city:<|"|>Moscow<|"|>,unit:<|"|>celsius<|"|>} (keys sorted: city, days, unit) */
    int ok = m && g4_gr_match_accept(m, call) == 0 && g4_gr_match_feed(m, "call:get_weather{city:", 22) == 0 &&
             g4_gr_match_accept(m, quote) == 0 && g4_gr_match_feed(m, "Moscow", 6) == 0 &&
             g4_gr_match_accept(m, quote) == 0 && g4_gr_match_try(m, ",days:8", 7) == 0 &&
             g4_gr_match_try(m, ",unit:", 6) == 1 && g4_gr_match_feed(m, ",days:7,unit:", 13) == 0 &&
             g4_gr_match_accept(m, quote) == 0 && g4_gr_match_try(m, "kelvin", 6) == 0 &&
             g4_gr_match_feed(m, "celsius", 7) == 0 && g4_gr_match_accept(m, quote) == 0 &&
             g4_gr_match_feed(m, "}", 1) == 0 && !g4_gr_match_accepting(m) && g4_gr_match_accept(m, end) == 0 &&
             g4_gr_match_accepting(m) && !g4_gr_match_done(m) && g4_gr_match_accept(m, call) == 0 &&
             g4_gr_match_feed(m, "call:now{}", 10) == 0 && g4_gr_match_accept(m, end) == 0;
    CHECKF(ok, "%s", "tool calls read token by token");
    g4_gr_match_free(m);
    g4_grammar_free(g);
    /* a named function, one call: done after it */
    CHECK(g4_grammar_tool_calls(tools_json, "now", 1, &g, &err) == 0);
    m = match_of(g);
    CHECK(m && g4_gr_match_accept(m, call) == 0 && g4_gr_match_try(m, "call:get", 8) == 0 &&
          g4_gr_match_feed(m, "call:now{}", 10) == 0 && g4_gr_match_accept(m, end) == 0 && g4_gr_match_done(m));
    g4_gr_match_free(m);
    g4_grammar_free(g);
    err.msg[0] = 0;
    CHECK(g4_grammar_tool_calls(tools_json, "later", 0, &g, &err) && strstr(err.msg, "later"));
}

/* A chat reply under grammar g (request_json: the chat's tools, or NULL), greedy for k 0 else sampled with seed:
 * 1 when it finished (STOP), 0 when cut, -1 on an error (checked here); *msg is the reply. */
static int reply(g4_model *model, g4_context *ctx, const char *request_json, const char *user, const g4_grammar *g,
                 int k, uint64_t seed, int max_new, g4_chat_message *msg) {
    g4_error err;
    g4_chat *chat;
    if (g4_chat_new(g4_model_chat_template(model), request_json, &chat, &err) ||
        g4_chat_add(chat, "user", user, &err)) {
        CHECKF(0, "%s", err.msg);
        return -1;
    }
    g4_sampler_params sp;
    g4_sampler_params_default(&sp);
    sp.temperature = k == 0 ? 0.0f : 1.0f;
    sp.seed = seed;
    g4_generation_params gp = {.max_new_tokens = max_new, .sampling = &sp, .grammar = g};
    g4_generation *gen = NULL;
    int rc = g4_chat_start(chat, ctx, 0, &gp, &gen, &err) || g4_generation_run(gen, NULL, NULL, &err) ||
             g4_generation_message(gen, msg, &err);
    CHECKF(!rc, "%s", err.msg);
    rc = rc ? -1 : g4_generation_finish(gen) == G4_FINISH_STOP;
    g4_generation_free(gen);
    g4_chat_free(chat);
    return rc;
}

/* Generations on the example model: each finished output is checked by jsonschema afterwards. */
static void test_generation(FILE *outs) {
    char dir[4096], cmd[9000];
    const char *src = getenv("G4_SOURCE_DIR"), *tmp = getenv("G4_TMP");
    snprintf(dir, sizeof dir, "%s/grammar", tmp ? tmp : "/tmp");
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s' && tar -xJf '%s/models/tolstoy-tiny.tar.xz' -C '%s'", dir,
             dir, src ? src : ".", dir);
    if (system(cmd) != 0) {
        CHECKF(0, "cannot unpack the example model: %s", cmd);
        return;
    }
    strcat(dir, "/tolstoy-tiny");
    g4_model *model;
    g4_error err;
    g4_load_params lp = {.n_threads = 2, .device = "cpu"};
    if (g4_model_load(dir, &lp, &model, &err)) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    g4_context *ctx;
    g4_context_params cp = {.n_ctx = 1024};
    CHECK(g4_context_new(model, &cp, &ctx, &err) == 0);
    static const char *const schemas[] = {
        "{\"type\":\"object\"}",
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},\"age\":{\"type\":"
        "\"integer\",\"minimum\":0,\"maximum\":120},\"friends\":{\"type\":\"array\",\"items\":{\"type\":\"string\","
        "\"maxLength\":8},\"maxItems\":3}},\"required\":[\"name\",\"age\",\"friends\"],\"additionalProperties\":false}",
        "{\"type\":\"array\",\"items\":{\"enum\":[\"war\",\"peace\",1812]},\"minItems\":2,\"maxItems\":4}",
        "{\"type\":\"object\",\"properties\":{\"price\":{\"type\":\"number\",\"multipleOf\":0.07,\"minimum\":0},"
        "\"host\":{\"type\":\"string\",\"format\":\"ipv6\"},\"wait\":{\"type\":\"string\",\"format\":\"duration\"}},"
        "\"required\":[\"price\",\"host\",\"wait\"],\"additionalProperties\":false}",
    };
    const int runs = getenv("G4_SANITIZE") ? 1 : 3, max_new = getenv("G4_SANITIZE") ? 40 : 96;
    int finished = 0, total = 0;
    for (size_t s = 0; s < sizeof schemas / sizeof schemas[0]; s++) {
        g4_grammar *g = schema_grammar(schemas[s]);
        for (int k = 0; g && k < runs; k++) {
            g4_chat_message msg;
            const int stopped = reply(model, ctx, NULL, "Describe Pierre in JSON.", g, k, (uint64_t)k, max_new, &msg);
            if (stopped < 0) continue;
            finished += stopped;
            total++;
            json_t *line = json_pack("{s:s,s:s,s:b}", "schema", schemas[s], "text", msg.content, "finished", stopped);
            put_line(outs, line);
            g4_chat_message_free(&msg);
        }
        g4_grammar_free(g);
    }
    /* tool_choice required (and, in the second run, the function get_weather): calls the chat parser reads, their
     * arguments checked against the parameters */
    json_t *tools = json_loads(tools_json, 0, NULL);
    for (int k = 0; k < runs + 1; k++) {
        g4_grammar *g;
        CHECK(g4_grammar_tool_calls(tools_json, k == 1 ? "get_weather" : NULL, k == 1 ? 1 : 2, &g, &err) == 0);
        char req[2048];
        snprintf(req, sizeof req, "{\"tools\": %s}", tools_json);
        g4_chat_message msg;
        const int stopped = reply(model, ctx, req, "What is the weather in Moscow?", g, k, (uint64_t)k + 10, max_new, &msg);
        g4_grammar_free(g);
        if (stopped < 0) continue;
        finished += stopped;
        total++;
        CHECKF(!stopped || msg.n_tool_calls >= 1, "a finished tool-call output holds %d calls", msg.n_tool_calls);
        json_t *calls = json_loads(msg.tool_calls, 0, NULL);
        for (int i = 0; i < msg.n_tool_calls; i++) {
            json_t *call = json_incref(json_array_get(calls, (size_t)i));
            const char *name = json_string_value(json_object_get(call, "name"));
            json_t *params = NULL;
            size_t j;
            json_t *t;
            json_array_foreach(tools, j, t) {
                json_t *fn = json_object_get(t, "function");
                if (name && !strcmp(name, json_string_value(json_object_get(fn, "name"))))
                    params = json_object_get(fn, "parameters");
            }
            CHECKF(name && json_is_object(json_object_get(call, "arguments")), "tool call %s", msg.tool_calls);
            json_t *none = json_pack("{s:s,s:b}", "type", "object", "additionalProperties", 0); /* no parameters */
            json_t *line = json_pack("{s:O,s:O,s:b}", "schema_json", params ? params : none, "doc",
                                     json_object_get(call, "arguments"), "finished", 1);
            json_decref(none);
            put_line(outs, line);
            json_decref(call);
        }
        json_decref(calls);
        g4_chat_message_free(&msg);
    }
    json_decref(tools);
    printf("grammar: %d of %d generations finished within %d tokens\n", finished, total, max_new);
    g4_context_free(ctx);
    g4_model_free(model);
}

int main(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s", g4t_shared("tokenizer/tokenizer.json"));
    g4_error err;
    if (g4_tokenizer_load(path, &tok, &err)) {
        printf("no tokenizer (%s): skipped\n", err.msg);
        return 77;
    }
    CHECK(g4_gr_tokens_new(tok, g4_tokenizer_vocab_size(tok), &tokens, &err) == 0);
    const char *tmp = getenv("G4_TMP") ? getenv("G4_TMP") : "/tmp";
    char cases_path[4096], outs_path[4096];
    snprintf(cases_path, sizeof cases_path, "%s/grammar_cases.jsonl", tmp);
    snprintf(outs_path, sizeof outs_path, "%s/grammar_outputs.jsonl", tmp);
    cases = fopen(cases_path, "w");
    FILE *outs = fopen(outs_path, "w");
    CHECK(cases && outs);
    test_json_object();
    test_schemas();
    test_text_grammars();
    test_masks();
    test_tool_grammar();
    test_generation(outs);
    fclose(cases);
    fclose(outs);
    /* the verdicts and outputs through Python's jsonschema */
    char cmd[9000];
    const char *src = getenv("G4_SOURCE_DIR") ? getenv("G4_SOURCE_DIR") : ".";
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s/tests/data/json_schema_check.py' '%s' '%s'", src, cases_path,
             outs_path);
    CHECKF(system(cmd) == 0, "jsonschema disagrees: %s", cmd);
    g4_gr_tokens_free(tokens);
    g4_tokenizer_free(tok);
    return g4t_done();
}
