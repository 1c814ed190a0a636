/* GGUF v3 files (docs/formats.md 3.1, 3.3) and MLX folders (2): the writer's layout read
 * back by the reader (metadata of every written type, tensor shapes reversed, offsets
 * aligned), corrupt and hostile files rejected with one-line errors, Gemma 4 tensor names
 * both ways, MLX weight/scales/biases adopted as one tensor with checks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/quant.h"
#include "formats/gguf_gemma4.h"
#include "formats/mlx.h"
#include "model/config.h"

static size_t file_size(const char *p) {
    FILE *f = fopen(p, "rb");
    fseek(f, 0, SEEK_END);
    size_t n = (size_t)ftell(f);
    fclose(f);
    return n;
}

static void write_sample(const char *path) {
    g4_gguf_writer w = {0};
    g4_gguf_add_str(&w, "general.architecture", "gemma4");
    g4_gguf_add_u32(&w, "k.u32", 7);
    g4_gguf_add_i32(&w, "k.i32", -3);
    g4_gguf_add_f32(&w, "k.f32", 0.5f);
    g4_gguf_add_bool(&w, "k.bool", 1);
    int32_t arr[3] = {1, -2, 3};
    g4_gguf_add_arr(&w, "k.arr", G4_GGUF_I32, arr, 3);
    const char *strs[2] = {"a b", "\xe2\x96\x81x"};
    g4_gguf_add_str_arr(&w, "k.strs", strs, 2);
    int64_t s1[2] = {3, 64}, s2[1] = {5};
    float v1[3 * 64], v2[5] = {1, 2, 3, 4, 5};
    for (int i = 0; i < 3 * 64; i++) v1[i] = (float)i / 10.0f;
    unsigned char q[3 * 68];
    size_t b1 = g4_gguf_add_tensor(&w, "t.q8", G4_Q8_0, 2, s1);
    size_t b2 = g4_gguf_add_tensor(&w, "t.f32", G4_F32, 1, s2);
    CHECK(b1 == 3 * 68 && b2 == 20);
    for (int r = 0; r < 3; r++) g4_quant(G4_Q8_0, v1 + 64 * r, q + 68 * r, 64);
    FILE *f = fopen(path, "wb");
    g4_error err;
    CHECK(g4_gguf_write_header(&w, f, &err) == 0);
    CHECK(g4_gguf_write_data(f, q, b1, &err) == 0 && g4_gguf_write_pad(f, b1, &err) == 0);
    CHECK(g4_gguf_write_data(f, v2, b2, &err) == 0 && g4_gguf_write_pad(f, b2, &err) == 0);
    fclose(f);
    g4_gguf_writer_free(&w);
}

static void test_round_trip(const char *path) {
    g4_gguf g;
    g4_error err;
    CHECKF(g4_gguf_open(path, &g, &err) == 0, "%s", err.msg);
    CHECK(g4_gguf_is_file(path));
    CHECK(json_integer_value(json_object_get(g.meta, "k.u32")) == 7);
    CHECK(json_integer_value(json_object_get(g.meta, "k.i32")) == -3);
    CHECK(json_real_value(json_object_get(g.meta, "k.f32")) == 0.5);
    CHECK(json_is_true(json_object_get(g.meta, "k.bool")));
    CHECK(json_integer_value(json_array_get(json_object_get(g.meta, "k.arr"), 1)) == -2);
    CHECK(!strcmp(json_string_value(json_array_get(json_object_get(g.meta, "k.strs"), 0)), "a b"));
    const g4_tensor *t = g4_tensor_set_find(&g.set, "t.q8");
    CHECK(t && t->dtype == G4_Q8_0 && t->ndim == 2 && t->shape[0] == 3 && t->shape[1] == 64);
    if (t) {
        CHECK(((size_t)((const unsigned char *)t->data - g.set.files[0].data)) % 32 == 0);
        float row[64];
        g4_dequant_row(t, 2, row);
        CHECK(row[0] > 12.7f && row[0] < 12.9f); /* 128/10 */
    }
    const g4_tensor *f = g4_tensor_set_find(&g.set, "t.f32");
    CHECK(f && f->dtype == G4_F32 && ((const float *)f->data)[4] == 5.0f);
    g4_gguf_free(&g);
}

/* Corrupt copies of the sample: each fails with a message, none crashes. */
static void test_corrupt(const char *path) {
    size_t n = file_size(path);
    unsigned char *b = malloc(n);
    FILE *f = fopen(path, "rb");
    CHECK(fread(b, 1, n, f) == n);
    fclose(f);
    const char *bad = g4t_tmp("bad.gguf");
    struct {
        const char *what;
        size_t at;
        unsigned char val;
        size_t len; /* truncate to this length when nonzero */
    } cases[] = {
        {"magic", 0, 'X', 0},          {"version", 4, 9, 0},          {"big-endian", 4, 0, 0},
        {"tensor count", 15, 0x7f, 0}, {"kv count", 23, 0x7f, 0},     {"key length", 31, 0x7f, 0},
        {"truncated header", 0, 0, 40}, {"truncated data", 0, 0, n - 16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unsigned char *c = malloc(n);
        memcpy(c, b, n);
        size_t len = cases[i].len ? cases[i].len : n;
        if (!cases[i].len) {
            if (!strcmp(cases[i].what, "big-endian")) c[4] = 0, c[5] = 0, c[6] = 0, c[7] = 3;
            else c[cases[i].at] = cases[i].val;
        }
        f = fopen(bad, "wb");
        fwrite(c, 1, len, f);
        fclose(f);
        g4_gguf g;
        g4_error err = {{0}};
        CHECKF(g4_gguf_open(bad, &g, &err) != 0 && err.msg[0] && !strchr(err.msg, '\n'), "%s accepted", cases[i].what);
        free(c);
    }
    /* every single-byte flip of the header: clean success or clean failure */
    size_t hdr = n < 600 ? n : 600;
    for (size_t i = 0; i < hdr; i++) {
        unsigned char *c = malloc(n);
        memcpy(c, b, n);
        c[i] ^= 0xA5;
        f = fopen(bad, "wb");
        fwrite(c, 1, n, f);
        fclose(f);
        g4_gguf g;
        g4_error err = {{0}};
        if (g4_gguf_open(bad, &g, &err) == 0) g4_gguf_free(&g);
        else CHECKF(err.msg[0] != 0, "flip at %zu: no message", i);
        free(c);
    }
    free(b);
}

static void test_names(void) {
    char out[256], back[256];
    static const char *hf[] = {"embed_tokens.weight", "layers.3.self_attn.q_proj.weight", "layers.0.layer_scalar",
                               "layers.12.experts.gate_up_proj", "layers.1.router.per_expert_scale",
                               "lm_head.weight", "layers.7.per_layer_projection.weight"};
    for (size_t i = 0; i < sizeof hf / sizeof hf[0]; i++) {
        CHECKF(g4_gemma4_gguf_name(hf[i], out, sizeof out) == 0, "%s", hf[i]);
        CHECKF(g4_gemma4_hf_name(out, back, sizeof back) == 0 && !strcmp(back, hf[i]), "%s -> %s -> %s", hf[i], out, back);
    }
    CHECK(g4_gemma4_gguf_name("layers.3.self_attn.q_proj.weight", out, sizeof out) == 0 &&
          !strcmp(out, "blk.3.attn_q.weight"));
    CHECK(g4_gemma4_hf_name("rope_freqs.weight", out, sizeof out) != 0);
    CHECK(g4_gemma4_hf_name("blk.x.attn_q.weight", out, sizeof out) != 0);
}

/* MLX: a 4-bit [2, 64] weight (group 32) with its scales and biases becomes one tensor. */
static void test_mlx(void) {
    g4_tensor_set set = {0};
    g4_error err;
    uint32_t w[2 * 8];
    uint16_t sc[4], bi[4];
    float x[64], y[64];
    for (int i = 0; i < 64; i++) x[i] = (float)i / 8.0f - 4.0f;
    g4_mlx_quant_row(4, 32, x, 64, w, sc, bi, G4_BF16);
    g4_mlx_quant_row(4, 32, x, 64, w + 8, sc + 2, bi + 2, G4_BF16);
    g4_tensor tw = {.name = "language_model.model.layers.0.mlp.up_proj.weight", .dtype = G4_U32, .ndim = 2,
                    .shape = {2, 8}, .data = w};
    g4_tensor ts = {.name = "language_model.model.layers.0.mlp.up_proj.scales", .dtype = G4_BF16, .ndim = 2,
                    .shape = {2, 2}, .data = sc};
    g4_tensor tb = {.name = "language_model.model.layers.0.mlp.up_proj.biases", .dtype = G4_BF16, .ndim = 2,
                    .shape = {2, 2}, .data = bi};
    CHECK(g4_tensor_set_add(&set, &tw, 0, &err) == 0 && g4_tensor_set_add(&set, &ts, 0, &err) == 0 &&
          g4_tensor_set_add(&set, &tb, 0, &err) == 0 && g4_tensor_set_finish(&set, &err) == 0);
    CHECK(g4_mlx_detect(&set));
    json_t *q = json_pack("{s:i,s:i}", "group_size", 32, "bits", 4);
    CHECKF(g4_mlx_adopt(&set, q, &err) == 0, "%s", err.msg);
    const g4_tensor *t = g4_tensor_set_find(&set, "model.language_model.layers.0.mlp.up_proj.weight");
    CHECK(set.n_tensors == 1 && t && t->dtype == G4_MLX4 && t->shape[1] == 64 && t->group == 32);
    if (t) {
        g4_dequant_row(t, 1, y);
        float e = 0;
        for (int i = 0; i < 64; i++) e = e > (y[i] - x[i]) * (y[i] - x[i]) ? e : (y[i] - x[i]) * (y[i] - x[i]);
        CHECK(e < 0.02f);
    }
    g4_tensor_set_free(&set);
    /* the same tensors read as 8-bit do not fit: a clear error */
    set = (g4_tensor_set){0};
    g4_tensor_set_add(&set, &tw, 0, &err);
    g4_tensor_set_add(&set, &ts, 0, &err);
    g4_tensor_set_add(&set, &tb, 0, &err);
    g4_tensor_set_finish(&set, &err);
    json_t *q8 = json_pack("{s:i,s:i}", "group_size", 32, "bits", 8);
    CHECK(g4_mlx_adopt(&set, q8, &err) != 0 && strstr(err.msg, "do not fit"));
    g4_tensor_set_free(&set);
    /* ... and without a quantization block (mlx-lm reads no bits or group then): a clear error, not 4-bit guessed */
    set = (g4_tensor_set){0};
    g4_tensor_set_add(&set, &tw, 0, &err);
    g4_tensor_set_add(&set, &ts, 0, &err);
    g4_tensor_set_add(&set, &tb, 0, &err);
    g4_tensor_set_finish(&set, &err);
    CHECK(g4_mlx_adopt(&set, NULL, &err) != 0 && strstr(err.msg, "no \"quantization\" block"));
    g4_tensor_set_free(&set);
    json_decref(q);
    json_decref(q8);
}

/* A Gemma 4 GGUF whose final_logit_softcapping is written as `cap_type` (-1: absent): the metadata of a small
 * config and a token_embd; returns what g4_gemma4_gguf_open says. */
static int open_with_softcap(const char *path, int cap_type, json_t **cfg, g4_error *err,
                             void (*extra)(g4_gguf_writer *)) {
    static const char *text = "{\"model_type\": \"gemma4_text\", \"vocab_size\": 8, \"hidden_size\": 4, "
                              "\"num_hidden_layers\": 2, \"num_attention_heads\": 1, \"num_key_value_heads\": 1, "
                              "\"head_dim\": 2, \"global_head_dim\": 4, \"hidden_size_per_layer_input\": 0, "
                              "\"intermediate_size\": 8}";
    json_error_t je;
    json_t *root = json_loads(text, 0, &je);
    g4_model_config c;
    CHECK(root && g4_config_parse(root, "test", &c, err) == 0);
    json_decref(root);
    g4_gguf_writer w = {0};
    g4_gemma4_gguf_write_meta(&w, &c.text, NULL);
    if (cap_type == G4_GGUF_F32) g4_gguf_add_f32(&w, "gemma4.final_logit_softcapping", 30.0f);
    if (cap_type == G4_GGUF_STR) g4_gguf_add_str(&w, "gemma4.final_logit_softcapping", "30.0");
    if (extra) extra(&w);
    const int64_t shape[2] = {8, 4};
    float zeros[32] = {0};
    size_t bytes = g4_gguf_add_tensor(&w, "token_embd.weight", G4_F32, 2, shape);
    FILE *f = fopen(path, "wb");
    CHECK(f && g4_gguf_write_header(&w, f, err) == 0 && g4_gguf_write_data(f, zeros, bytes, err) == 0 &&
          g4_gguf_write_pad(f, bytes, err) == 0);
    if (f) fclose(f);
    g4_gguf_writer_free(&w);
    g4_gguf g;
    *cfg = NULL;
    int rc = g4_gemma4_gguf_open(path, &g, cfg, err);
    if (rc == 0) g4_gguf_free(&g);
    return rc;
}

/* The soft-cap key is optional, but one that is there must be a number: a string is an error, not "no soft-cap"
 * (that would be a silent wrong answer). */
static void test_softcap_key(void) {
    const char *path = g4t_tmp("softcap.gguf");
    json_t *cfg;
    g4_error err = {{0}};
    CHECKF(open_with_softcap(path, G4_GGUF_F32, &cfg, &err, NULL) == 0, "%s", err.msg);
    CHECK(json_real_value(json_object_get(cfg, "final_logit_softcapping")) == 30.0);
    json_decref(cfg);
    CHECKF(open_with_softcap(path, -1, &cfg, &err, NULL) == 0, "%s", err.msg);
    CHECK(cfg && !json_object_get(cfg, "final_logit_softcapping"));
    json_decref(cfg);
    CHECK(open_with_softcap(path, G4_GGUF_STR, &cfg, &err, NULL) != 0);
    CHECKF(strstr(err.msg, "final_logit_softcapping must be a number") != NULL, "%s", err.msg);
}

/* Metadata numbers no config holds. A NaN or infinity: jansson's json_real gives NULL for one, which ended the
 * metadata silently and the tensor infos were read from the middle of the key/value pairs ("tensor info 0 has a
 * bad name or 9 dimensions"); it is an error naming the key. A size no int holds (1e30) was cast to int
 * (undefined; "hidden_size = -9223372036854775808 is out of range"); it is refused as a size. */
static void add_nan_cap(g4_gguf_writer *w) { g4_gguf_add_f32(w, "gemma4.final_logit_softcapping", NAN); }
static void add_inf(g4_gguf_writer *w) { g4_gguf_add_f32(w, "general.some_number", INFINITY); }
static void add_huge_experts(g4_gguf_writer *w) { g4_gguf_add_f32(w, "gemma4.expert_count", 1e30f); }
static void add_nan_array(g4_gguf_writer *w) {
    const float v[3] = {1.0f, NAN, 2.0f};
    g4_gguf_add_arr(w, "gemma4.some_floats", G4_GGUF_F32, v, 3);
}

static void test_bad_numbers(void) {
    const char *path = g4t_tmp("numbers.gguf");
    static const struct {
        void (*extra)(g4_gguf_writer *);
        const char *want;
    } cases[] = {
        {add_nan_cap, "GGUF key 'gemma4.final_logit_softcapping': a GGUF number is not finite (nan)"},
        {add_inf, "GGUF key 'general.some_number': a GGUF number is not finite (inf)"},
        {add_nan_array, "GGUF key 'gemma4.some_floats': a GGUF number is not finite (nan)"},
        {add_huge_experts, "are not valid sizes"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *cfg = NULL;
        g4_error err = {{0}};
        int rc = open_with_softcap(path, -1, &cfg, &err, cases[i].extra);
        CHECKF(rc != 0 && strstr(err.msg, cases[i].want) && !strchr(err.msg, '\n'), "case %zu: rc %d '%s'", i, rc,
               err.msg);
        json_decref(cfg);
    }
    /* gemma4.context_length (a u32 the writer gives) turned into the f32 1e30 in place: same size */
    json_t *cfg = NULL;
    g4_error err = {{0}};
    CHECKF(open_with_softcap(path, -1, &cfg, &err, NULL) == 0, "%s", err.msg);
    json_decref(cfg);
    FILE *f = fopen(path, "r+b");
    static unsigned char buf[1 << 16];
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    const char *k = "gemma4.context_length";
    unsigned char *hit = NULL;
    for (size_t i = 0; i + strlen(k) + 8 <= n && !hit; i++)
        if (!memcmp(buf + i, k, strlen(k))) hit = buf + i + strlen(k);
    CHECK(hit && hit[0] == G4_GGUF_U32);
    if (f && hit) {
        const float big = 1e30f;
        hit[0] = G4_GGUF_F32;
        memcpy(hit + 4, &big, 4);
        fseek(f, 0, SEEK_SET);
        CHECK(fwrite(buf, 1, n, f) == n);
    }
    if (f) fclose(f);
    g4_gguf g;
    int rc = g4_gemma4_gguf_open(path, &g, &cfg, &err);
    CHECKF(rc != 0 && strstr(err.msg, "gemma4.context_length = 1e+30 is not a valid size"), "context_length: rc %d '%s'",
           rc, err.msg);
    if (rc == 0) {
        g4_gguf_free(&g);
        json_decref(cfg);
    }
}

/* A tensor whose declared type does not match the bytes the file gives it (the next tensor's data starts
 * elsewhere than right after its own, padded) is refused with one line, as llama.cpp refuses it: a larger type
 * would read the next tensor's bytes as its own, a smaller one leave part of its data unread. */
static void test_type_mismatch(void) {
    const char *path = g4t_tmp("mismatch.gguf");
    g4_gguf_writer w = {0};
    g4_gguf_add_str(&w, "general.architecture", "gemma4");
    int64_t sa[2] = {2, 64}, sb[1] = {64}, sc[1] = {5};
    size_t ba = g4_gguf_add_tensor(&w, "t.a", G4_Q8_0, 2, sa);
    size_t bb = g4_gguf_add_tensor(&w, "t.b", G4_F32, 1, sb);
    size_t bc = g4_gguf_add_tensor(&w, "t.c", G4_F32, 1, sc);
    static unsigned char zeros[512];
    FILE *f = fopen(path, "wb");
    g4_error err;
    CHECK(g4_gguf_write_header(&w, f, &err) == 0);
    size_t sizes[3] = {ba, bb, bc};
    for (int i = 0; i < 3; i++) CHECK(g4_gguf_write_data(f, zeros, sizes[i], &err) == 0 && g4_gguf_write_pad(f, sizes[i], &err) == 0);
    fclose(f);
    g4_gguf_writer_free(&w);
    size_t n = file_size(path);
    unsigned char *b = malloc(n);
    f = fopen(path, "rb");
    CHECK(fread(b, 1, n, f) == n);
    fclose(f);
    g4_gguf g;
    CHECKF(g4_gguf_open(path, &g, &err) == 0, "%s", err.msg);
    if (!err.msg[0]) g4_gguf_free(&g);
    /* the type field of t.a: after its name, u32 ndim and two u64 dimensions */
    size_t at = 0;
    for (size_t i = 0; i + 3 <= n; i++)
        if (!memcmp(b + i, "t.a", 3)) {
            at = i + 3 + 4 + 16;
            break;
        }
    CHECK(at > 0);
    const uint32_t types[2] = {1 /* F16: 256 bytes, over t.b's data */, 2 /* Q4_0: 72 bytes, a gap */};
    for (int k = 0; k < 2 && at; k++) {
        const char *bad = g4t_tmp("mismatch-bad.gguf");
        memcpy(b + at, &types[k], 4);
        f = fopen(bad, "wb");
        fwrite(b, 1, n, f);
        fclose(f);
        err.msg[0] = 0;
        int rc = g4_gguf_open(bad, &g, &err);
        if (!rc) g4_gguf_free(&g);
        CHECKF(rc != 0 && strstr(err.msg, "'t.a'") && !strchr(err.msg, '\n'), "type %u on Q8_0 data: %s", types[k],
               rc ? err.msg : "accepted");
    }
    /* a type this engine does not read (Q1_0, ggml type 41) has no size to check: the file opens (the model
     * refuses the tensor where it uses it, naming its type) */
    if (at) {
        const char *odd = g4t_tmp("mismatch-q1_0.gguf");
        const uint32_t q1_0 = 41;
        memcpy(b + at, &q1_0, 4);
        f = fopen(odd, "wb");
        fwrite(b, 1, n, f);
        fclose(f);
        err.msg[0] = 0;
        int rc = g4_gguf_open(odd, &g, &err);
        CHECKF(rc == 0, "an unread type before other tensors: %s", err.msg);
        if (!rc) g4_gguf_free(&g);
    }
    free(b);
}

/* A shard of llama-gguf-split (split.count > 1) holds part of the tensors: refused with a line that says so and
 * how to merge (not "N tensors are missing"); split.count 1 is an ordinary file. */
/* One shard of a split GGUF as llama-gguf-split writes it: the first holds the keys, each its tensors (shard k:
 * tensor "t<k>" of 8 floats k*8 ..). */
static void write_shard(const char *path, int no, int count, int total, int first_keys) {
    g4_gguf_writer w = {0};
    if (first_keys) g4_gguf_add_str(&w, "general.architecture", "gemma4");
    g4_gguf_add_u32(&w, "split.no", (uint32_t)no);
    g4_gguf_add_u32(&w, "split.count", (uint32_t)count);
    g4_gguf_add_i32(&w, "split.tensors.count", total);
    int64_t sh[1] = {8};
    char name[16];
    snprintf(name, sizeof name, "t%d", no);
    size_t bytes = g4_gguf_add_tensor(&w, name, G4_F32, 1, sh);
    float v[8];
    for (int i = 0; i < 8; i++) v[i] = (float)(no * 8 + i);
    FILE *f = fopen(path, "wb");
    g4_error err = {{0}};
    CHECK(f && g4_gguf_write_header(&w, f, &err) == 0 && g4_gguf_write_data(f, v, bytes, &err) == 0 &&
          g4_gguf_write_pad(f, bytes, &err) == 0);
    if (f) fclose(f);
    g4_gguf_writer_free(&w);
}

static const char *shard_name(const char *prefix, int no, int count) {
    static char buf[16][4096];
    static int k;
    char *b = buf[k++ & 15];
    snprintf(b, sizeof buf[0], "%s-%05d-of-%05d.gguf", g4t_tmp(prefix), no + 1, count);
    return b;
}

/* A GGUF split in 3 (llama.cpp's PREFIX-0000k-of-00003.gguf): the first shard's path opens all three, every
 * tensor's data from its own file; a later shard given, a first shard not named so, a missing shard, a shard of
 * another split or a wrong tensor count are one-line errors. */
static void test_split(void) {
    for (int no = 0; no < 3; no++) write_shard(shard_name("split", no, 3), no, 3, 3, no == 0);
    g4_gguf g;
    g4_error err = {{0}};
    int rc = g4_gguf_open(shard_name("split", 0, 3), &g, &err);
    CHECKF(rc == 0, "a GGUF split in 3: %s", err.msg);
    if (!rc) {
        int ok = g.set.n_tensors == 3;
        for (int no = 0; ok && no < 3; no++) {
            char name[16];
            snprintf(name, sizeof name, "t%d", no);
            const g4_tensor *t = g4_tensor_set_find(&g.set, name);
            ok = t && t->dtype == G4_F32 && t->nbytes == 32;
            for (int i = 0; ok && i < 8; i++) ok = ((const float *)t->data)[i] == (float)(no * 8 + i);
        }
        CHECKF(ok, "a GGUF split in 3: %d tensors, not each shard's data", g.set.n_tensors);
        CHECK(json_is_string(json_object_get(g.meta, "general.architecture")));
        g4_gguf_free(&g);
    }
    struct {
        const char *path, *needle;
    } bad[5];
    bad[0].path = shard_name("split", 1, 3), bad[0].needle = "give the first one";
    char plain[4096]; /* (g4t_tmp's buffer is reused) */
    snprintf(plain, sizeof plain, "%s", g4t_tmp("split-plain.gguf"));
    write_shard(plain, 0, 3, 3, 1);
    bad[1].path = plain, bad[1].needle = "not named PREFIX-00001-of-00003.gguf";
    write_shard(shard_name("gap", 0, 3), 0, 3, 3, 1);
    write_shard(shard_name("gap", 1, 3), 1, 3, 3, 0);
    bad[2].path = shard_name("gap", 0, 3), bad[2].needle = "gap-00003-of-00003.gguf";
    write_shard(shard_name("other", 0, 2), 0, 2, 2, 1);
    write_shard(shard_name("other", 1, 2), 0, 2, 2, 0); /* split.no 0 where shard 2 belongs */
    bad[3].path = shard_name("other", 0, 2), bad[3].needle = "where shard 2 of 2 belongs";
    write_shard(shard_name("count", 0, 2), 0, 2, 5, 1);
    write_shard(shard_name("count", 1, 2), 1, 2, 5, 0);
    bad[4].path = shard_name("count", 0, 2), bad[4].needle = "split.tensors.count says 5";
    for (int k = 0; k < 5; k++) {
        err.msg[0] = 0;
        rc = g4_gguf_open(bad[k].path, &g, &err);
        if (!rc) g4_gguf_free(&g);
        CHECKF(rc != 0 && strstr(err.msg, bad[k].needle) && !strchr(err.msg, '\n'), "split case %d: %s", k,
               rc ? err.msg : "accepted");
    }
    /* split.count 1 is a plain file */
    write_shard(plain, 0, 1, 1, 1);
    rc = g4_gguf_open(plain, &g, &err);
    CHECKF(rc == 0, "split.count 1: %s", err.msg);
    if (!rc) g4_gguf_free(&g);
}

int main(void) {
    const char *path = g4t_tmp("sample.gguf");
    write_sample(path);
    test_round_trip(path);
    test_corrupt(path);
    test_type_mismatch();
    test_split();
    test_names();
    test_mlx();
    test_softcap_key();
    test_bad_numbers();
    return g4t_done();
}
