/* safetensors reader: valid files, and every kind of corrupt or truncated file
 * gives a clear error (never a crash); sharded folders are checked against their index. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "core/mapped_file.h"
#include "formats/safetensors.h"

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (n) fwrite(data, 1, n, f);
    fclose(f);
}

/* A file with a given JSON header (padded to 8) followed by data_len bytes. */
static void write_st(const char *path, const char *json, size_t data_len) {
    size_t jl = strlen(json), padded = (jl + 7) & ~(size_t)7;
    size_t total = 8 + padded + data_len;
    unsigned char *buf = calloc(1, total);
    uint64_t n = padded;
    memcpy(buf, &n, 8);
    memcpy(buf + 8, json, jl);
    memset(buf + 8 + jl, ' ', padded - jl);
    for (size_t i = 0; i < data_len; i++) buf[8 + padded + i] = (unsigned char)i;
    write_bytes(path, buf, total);
    free(buf);
}

/* Expects opening `path` to fail with a message containing `want`. */
static void expect_error(const char *what, const char *path, const char *want) {
    g4_tensor_set set = {0};
    g4_error err = {{0}};
    int rc = g4_safetensors_add_file(&set, path, &err);
    if (rc == 0) rc = g4_tensor_set_finish(&set, &err);
    CHECKF(rc != 0, "%s: opened without error", what);
    CHECKF(rc == 0 || strstr(err.msg, want) != NULL, "%s: message '%s' lacks '%s'", what, err.msg, want);
    CHECKF(strchr(err.msg, '\n') == NULL, "%s: message is not one line", what);
    g4_tensor_set_free(&set);
}

static void test_valid(void) {
    const char *p = g4t_tmp("ok.safetensors");
    write_st(p,
             "{\"__metadata__\":{\"format\":\"pt\"},\"b\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[8,20]},"
             "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"s\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[20,28]},"
             "\"z\":{\"dtype\":\"F16\",\"shape\":[0,4],\"data_offsets\":[28,28]}}",
             28);
    g4_tensor_set set = {0};
    g4_error err;
    CHECKF(g4_safetensors_add_file(&set, p, &err) == 0 && g4_tensor_set_finish(&set, &err) == 0, "%s", err.msg);
    CHECK(set.n_tensors == 4);
    const g4_tensor *b = g4_tensor_set_find(&set, "b");
    CHECK(b && b->dtype == G4_BF16 && b->ndim == 2 && b->shape[0] == 2 && b->shape[1] == 3 && b->nbytes == 12);
    const g4_tensor *a = g4_tensor_set_find(&set, "a");
    CHECK(a && a->data && ((const unsigned char *)a->data)[0] == 0 && ((const unsigned char *)b->data)[0] == 8);
    const g4_tensor *s = g4_tensor_set_find(&set, "s");
    CHECK(s && s->ndim == 0 && g4_tensor_numel(s) == 1);
    const g4_tensor *z = g4_tensor_set_find(&set, "z");
    CHECK(z && z->nbytes == 0);
    CHECK(g4_tensor_set_find(&set, "missing") == NULL);
    g4_tensor_set_free(&set);

    /* round trip through the writer */
    g4_tensor t[2];
    float fv[3] = {1.5f, -2.0f, 3.25f};
    uint16_t hv[2] = {0x3f80, 0xc000};
    t[0] = (g4_tensor){.name = "x.weight", .dtype = G4_F32, .ndim = 1, .shape = {3}, .data = fv, .nbytes = 12};
    t[1] = (g4_tensor){.name = "y", .dtype = G4_BF16, .ndim = 2, .shape = {1, 2}, .data = hv, .nbytes = 4};
    const char *w = g4t_tmp("written.safetensors");
    CHECK(g4_safetensors_write(w, t, 2, &err) == 0);
    memset(&set, 0, sizeof set);
    CHECKF(g4_safetensors_add_file(&set, w, &err) == 0 && g4_tensor_set_finish(&set, &err) == 0, "%s", err.msg);
    const g4_tensor *x = g4_tensor_set_find(&set, "x.weight");
    float back[3];
    if (x) memcpy(back, x->data, 12);
    CHECK(x && x->dtype == G4_F32 && back[0] == 1.5f && back[2] == 3.25f);
    const g4_tensor *y = g4_tensor_set_find(&set, "y");
    CHECK(y && y->dtype == G4_BF16 && y->shape[1] == 2);
    g4_tensor_set_free(&set);
}

static void test_corrupt(void) {
    const char *p = g4t_tmp("bad.safetensors");
    write_bytes(p, "", 0);
    expect_error("empty file", p, "not a safetensors file");
    write_bytes(p, "abc", 3);
    expect_error("3-byte file", p, "not a safetensors file");
    unsigned char huge[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
    write_bytes(p, huge, 16);
    expect_error("absurd header length", p, "100 MB");
    unsigned char longer[16] = {200, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    write_bytes(p, longer, 16);
    expect_error("header longer than the file", p, "truncated");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]", 8);
    expect_error("unterminated JSON", p, "corrupt safetensors header");
    write_st(p, "[1,2,3]", 0);
    expect_error("header not an object", p, "not a JSON object");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4);
    expect_error("data cut short", p, "truncated");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12);
    expect_error("trailing bytes", p, "unexpected bytes");
    write_st(p,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
             12);
    expect_error("overlapping tensors", p, "overlap");
    write_st(p,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[12,16]}}",
             16);
    expect_error("gap between tensors", p, "gap");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8);
    expect_error("size does not match the shape", p, "do not match");
    write_st(p, "{\"a\":{\"dtype\":\"Q9\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    expect_error("unknown dtype", p, "unknown dtype");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8);
    expect_error("negative dimension", p, "invalid shape");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8);
    expect_error("reversed offsets", p, "invalid data_offsets");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8);
    expect_error("no offsets", p, "data_offsets");
    write_st(p,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
             16);
    expect_error("duplicate names", p, "corrupt safetensors header");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,8]}}", 8);
    expect_error("size overflow", p, "invalid shape");
    write_st(p, "{\"__metadata__\":{\"n\":3},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    expect_error("metadata not strings", p, "__metadata__");
    expect_error("no such file", g4t_tmp("does-not-exist.safetensors"), "No such file");
}

/* Flip bytes of a real fixture file at many places: every result is an error or a
 * valid set, never a crash (the sanitizer build checks the memory accesses). */
static void test_mutations(void) {
    char *buf;
    size_t len;
    g4_error err;
    if (g4_read_file(g4t_shared("fixtures/moe/reference.safetensors"), &buf, &len, &err)) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    uint64_t hl;
    memcpy(&hl, buf, 8);
    const char *p = g4t_tmp("mutated.safetensors");
    int opened = 0, refused = 0;
    unsigned seed = 12345;
    for (int iter = 0; iter < 300; iter++) {
        char *copy = malloc(len);
        memcpy(copy, buf, len);
        size_t cut = len;
        for (int k = 0; k < 3; k++) {
            seed = seed * 1103515245u + 12345u;
            size_t at = 8 + (seed >> 8) % (size_t)hl; /* inside the header */
            seed = seed * 1103515245u + 12345u;
            if (iter % 2 == 0) {
                copy[at] = (char)(seed >> 16); /* any byte: mostly breaks the JSON */
            } else {                           /* a digit for a digit: valid JSON, wrong numbers */
                while (at < 8 + hl && (copy[at] < '0' || copy[at] > '9')) at++;
                if (at < 8 + hl) copy[at] = (char)('0' + (seed >> 16) % 10);
            }
        }
        if (iter % 5 == 0) cut = (size_t)((seed >> 4) % len);
        write_bytes(p, copy, cut);
        g4_tensor_set set = {0};
        int rc = g4_safetensors_add_file(&set, p, &err);
        if (rc == 0) rc = g4_tensor_set_finish(&set, &err);
        if (rc == 0) {
            opened++;
            for (int i = 0; i < set.n_tensors; i++) { /* every view must lie inside the mapping */
                const unsigned char *d = set.tensors[i].data;
                const g4_mapped_file *f = &set.files[0];
                CHECK(d >= f->data && d + set.tensors[i].nbytes <= f->data + f->size);
            }
        } else {
            refused++;
            CHECK(err.msg[0] != 0 && strchr(err.msg, '\n') == NULL);
        }
        g4_tensor_set_free(&set);
        free(copy);
    }
    CHECK(refused > 0);
    printf("mutated headers: %d opened, %d refused with an error\n", opened, refused);
    free(buf);
}

static void test_sharded(void) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", g4t_tmp("shards"));
    mkdir(dir, 0755);
    char p[4200];
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    write_st(p, "{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    snprintf(p, sizeof p, "%s/model-extra.safetensors", dir);
    write_st(p,
             "{\"c\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
             "\"d\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
             8);
    char idx[4200];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    g4_tensor_set set;
    g4_error err;

    const char *good = "{\"metadata\":{},\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                       "\"b\":\"model-00002-of-00002.safetensors\"}}";
    write_bytes(idx, good, strlen(good));
    CHECKF(g4_safetensors_open_dir(dir, &set, &err) == 0, "%s", err.msg);
    CHECK(set.n_files == 2 && g4_tensor_set_find(&set, "a") && g4_tensor_set_find(&set, "b"));
    g4_tensor_set_free(&set);

    struct {
        const char *index, *want;
    } bad[] = {
        {"{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\",\"b\":\"model-00003-of-00003.safetensors\"}}",
         "missing"},
        {"{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\",\"b\":\"model-00002-of-00002.safetensors\","
         "\"c\":\"model-00002-of-00002.safetensors\"}}",
         "listed in the index but missing"},
        {"{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\",\"c\":\"model-extra.safetensors\"}}",
         "not in the index"},
        {"{\"weight_map\":{\"a\":\"model-00002-of-00002.safetensors\",\"b\":\"model-00001-of-00002.safetensors\"}}",
         "the index says"},
        {"{\"weight_map\":{\"a\":\"../x.safetensors\"}}", "not a shard file name"},
        {"{\"weight_map\":[]}", "weight_map"},
        {"{\"weight_map\":", "invalid JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_bytes(idx, bad[i].index, strlen(bad[i].index));
        int rc = g4_safetensors_open_dir(dir, &set, &err);
        CHECKF(rc != 0 && strstr(err.msg, bad[i].want), "index case %zu: rc %d, '%s' lacks '%s'", i, rc,
               rc ? err.msg : "", bad[i].want);
        if (rc == 0) g4_tensor_set_free(&set);
    }
    CHECK(g4_safetensors_open_dir(g4t_tmp("no-such-dir"), &set, &err) != 0 && strstr(err.msg, "model.safetensors"));

    /* model.safetensors beside an index (here a broken one): transformers loads the single file and never reads the
     * index (modeling_utils.py _get_resolved_checkpoint_files checks SAFE_WEIGHTS_NAME before
     * SAFE_WEIGHTS_INDEX_NAME); the index was read first and its missing shard refused the folder */
    write_bytes(idx, bad[0].index, strlen(bad[0].index));
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    write_st(p, "{\"single\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    CHECKF(g4_safetensors_open_dir(dir, &set, &err) == 0, "single file beside an index: %s", err.msg);
    CHECK(set.n_files == 1 && set.n_tensors == 1 && g4_tensor_set_find(&set, "single"));
    g4_tensor_set_free(&set);
    remove(p);
}

int main(void) {
    test_valid();
    test_corrupt();
    test_mutations();
    test_sharded();
    return g4t_done();
}
