/* GGUF v3 reader and writer (docs/formats.md 3.1). The reader checks every length and
 * offset against the file before using it; strings are limited to 1 GiB, arrays to
 * 2^30 elements, tensors to 4 dimensions, and tensor data must lie inside the file at
 * the declared alignment. */
#include "formats/gguf.h"

#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

#define MAX_STR (1u << 30)
#define MAX_ARR (1u << 30)

static const struct {
    int ggml;
    g4_dtype t;
} type_map[] = {
    {0, G4_F32},   {1, G4_F16},   {2, G4_Q4_0},  {3, G4_Q4_1},  {6, G4_Q5_0}, {7, G4_Q5_1},
    {8, G4_Q8_0},  {10, G4_Q2_K}, {11, G4_Q3_K}, {12, G4_Q4_K}, {13, G4_Q5_K}, {14, G4_Q6_K},
    {20, G4_IQ4_NL}, {23, G4_IQ4_XS}, {30, G4_BF16}, {16, G4_IQ2_XXS}, {17, G4_IQ2_XS}, {18, G4_IQ3_XXS},
    {19, G4_IQ1_S}, {21, G4_IQ3_S}, {22, G4_IQ2_S}, {29, G4_IQ1_M}, {34, G4_TQ1_0}, {35, G4_TQ2_0}, {39, G4_MXFP4},
    {40, G4_NVFP4},
};

int g4_gguf_type_of(g4_dtype t) {
    for (size_t i = 0; i < sizeof type_map / sizeof type_map[0]; i++)
        if (type_map[i].t == t) return type_map[i].ggml;
    return -1;
}

g4_dtype g4_gguf_dtype(int ggml_type) {
    for (size_t i = 0; i < sizeof type_map / sizeof type_map[0]; i++)
        if (type_map[i].ggml == ggml_type) return type_map[i].t;
    return G4_DTYPE_UNKNOWN;
}

/* ---------------------------------------------------------------- reader */
typedef struct {
    const unsigned char *p, *end;
    const char *path;
    g4_error *err;
    int failed;
} cursor;

static int need(cursor *c, uint64_t n) {
    if (c->failed) return 0;
    if ((uint64_t)(c->end - c->p) < n) {
        c->failed = 1;
        g4_fail(c->err, "%s: truncated GGUF file", c->path);
        return 0;
    }
    return 1;
}

static uint64_t rd(cursor *c, int bytes) {
    uint64_t v = 0;
    if (!need(c, (uint64_t)bytes)) return 0;
    memcpy(&v, c->p, (size_t)bytes); /* little-endian host */
    c->p += bytes;
    return v;
}

/* A string as a pointer into the file and its length. */
static const char *rd_str(cursor *c, uint64_t *len) {
    *len = rd(c, 8);
    if (c->failed) return NULL;
    if (*len > MAX_STR) {
        c->failed = 1;
        g4_fail(c->err, "%s: a GGUF string of %llu bytes is too long", c->path, (unsigned long long)*len);
        return NULL;
    }
    if (!need(c, *len)) return NULL;
    const char *s = (const char *)c->p;
    c->p += *len;
    return s;
}

static int elem_size(int type) {
    switch (type) {
    case G4_GGUF_U8: case G4_GGUF_I8: case G4_GGUF_BOOL: return 1;
    case G4_GGUF_U16: case G4_GGUF_I16: return 2;
    case G4_GGUF_U32: case G4_GGUF_I32: case G4_GGUF_F32: return 4;
    case G4_GGUF_U64: case G4_GGUF_I64: case G4_GGUF_F64: return 8;
    default: return 0;
    }
}

/* A float value: JSON (jansson) holds no NaN or infinity, and json_real gives NULL for one; that NULL ended the
 * reading of the metadata silently, and the tensor infos were then read from the middle of the key/value pairs
 * (a "bad name or N dimensions" error, or worse). A non-finite number is an error naming it. */
static json_t *real_value(cursor *c, double d) {
    if (isfinite(d)) return json_real(d);
    c->failed = 1;
    g4_fail(c->err, "%s: a GGUF number is not finite (%g)", c->path, d);
    return NULL;
}

static json_t *rd_scalar(cursor *c, int type) {
    uint64_t len;
    switch (type) {
    case G4_GGUF_U8: return json_integer((json_int_t)(uint8_t)rd(c, 1));
    case G4_GGUF_I8: return json_integer((json_int_t)(int8_t)rd(c, 1));
    case G4_GGUF_U16: return json_integer((json_int_t)(uint16_t)rd(c, 2));
    case G4_GGUF_I16: return json_integer((json_int_t)(int16_t)rd(c, 2));
    case G4_GGUF_U32: return json_integer((json_int_t)(uint32_t)rd(c, 4));
    case G4_GGUF_I32: return json_integer((json_int_t)(int32_t)rd(c, 4));
    case G4_GGUF_U64: return json_integer((json_int_t)rd(c, 8));
    case G4_GGUF_I64: return json_integer((json_int_t)(int64_t)rd(c, 8));
    case G4_GGUF_BOOL: return json_boolean(rd(c, 1) != 0);
    case G4_GGUF_F32: {
        uint32_t u = (uint32_t)rd(c, 4);
        float f;
        memcpy(&f, &u, 4);
        return c->failed ? NULL : real_value(c, (double)f);
    }
    case G4_GGUF_F64: {
        uint64_t u = rd(c, 8);
        double d;
        memcpy(&d, &u, 8);
        return c->failed ? NULL : real_value(c, d);
    }
    case G4_GGUF_STR: {
        const char *s = rd_str(c, &len);
        return s ? json_stringn_nocheck(s, (size_t)len) : NULL;
    }
    default:
        c->failed = 1;
        g4_fail(c->err, "%s: unknown GGUF value type %d", c->path, type);
        return NULL;
    }
}

/* An array's element type and count, checked (no nested arrays; fixed-size elements inside the file): 0, or -1. */
static int rd_array_head(cursor *c, int *et, uint64_t *n) {
    *et = (int)rd(c, 4);
    *n = rd(c, 8);
    if (c->failed) return -1;
    if (*et == G4_GGUF_ARR || *n > MAX_ARR || (*et != G4_GGUF_STR && !elem_size(*et)) ||
        (elem_size(*et) && !need(c, *n * (uint64_t)elem_size(*et)))) {
        if (!c->failed) g4_fail(c->err, "%s: bad GGUF array (type %d, %llu elements)", c->path, *et, (unsigned long long)*n);
        c->failed = 1;
        return -1;
    }
    return 0;
}

static json_t *rd_value(cursor *c, int type) {
    if (type != G4_GGUF_ARR) return rd_scalar(c, type);
    int et;
    uint64_t n;
    if (rd_array_head(c, &et, &n)) return NULL;
    json_t *a = json_array();
    for (uint64_t i = 0; a && i < n && !c->failed; i++) {
        json_t *v = rd_scalar(c, et);
        if (!v || json_array_append_new(a, v)) {
            json_decref(a);
            if (!c->failed) g4_fail(c->err, "out of memory");
            c->failed = 1;
            return NULL;
        }
    }
    if (c->failed) {
        json_decref(a);
        return NULL;
    }
    return a;
}

/* The vocabulary's arrays stay in the file (gguf.h): the elements are checked as rd_value checks them (every string
 * inside the file and not too long) but no JSON value is made; the placeholder names where they are. */
static int vocabulary_key(const char *key) {
    return !strcmp(key, "tokenizer.ggml.tokens") || !strcmp(key, "tokenizer.ggml.merges") ||
           !strcmp(key, "tokenizer.ggml.scores") || !strcmp(key, "tokenizer.ggml.token_type");
}

static json_t *rd_deferred(cursor *c) {
    int et;
    uint64_t n;
    if (rd_array_head(c, &et, &n)) return NULL;
    const unsigned char *start = c->p;
    if (et == G4_GGUF_STR) {
        uint64_t len;
        for (uint64_t i = 0; i < n && !c->failed; i++) rd_str(c, &len);
    } else {
        c->p += n * (uint64_t)elem_size(et);
    }
    if (et == G4_GGUF_F32 || et == G4_GGUF_F64) /* (JSON holds no NaN or infinity: real_value's rule) */
        for (uint64_t i = 0; i < n && !c->failed; i++) {
            double d;
            if (et == G4_GGUF_F32) {
                float f;
                memcpy(&f, start + 4 * i, 4);
                d = f;
            } else {
                memcpy(&d, start + 8 * i, 8);
            }
            if (!isfinite(d)) real_value(c, d);
        }
    if (c->failed) return NULL;
    return json_pack("{s:[I,I,I,I]}", "gguf_array", (json_int_t)et, (json_int_t)n, (json_int_t)(intptr_t)start,
                     (json_int_t)(c->p - start));
}

int g4_gguf_array_of(const json_t *meta, const char *key, g4_gguf_array *out) {
    memset(out, 0, sizeof *out);
    const json_t *v = json_object_get(json_object_get(meta, key), "gguf_array");
    if (json_array_size(v) != 4) return 0;
    out->type = (int)json_integer_value(json_array_get(v, 0));
    out->n = (uint64_t)json_integer_value(json_array_get(v, 1));
    out->data = (const unsigned char *)(intptr_t)json_integer_value(json_array_get(v, 2));
    out->size = (size_t)json_integer_value(json_array_get(v, 3));
    return 1;
}

const char *g4_gguf_array_str(const g4_gguf_array *a, size_t *at, size_t *len) {
    if (a->type != G4_GGUF_STR || *at + 8 > a->size) return NULL;
    uint64_t l;
    memcpy(&l, a->data + *at, 8);
    const char *s = (const char *)a->data + *at + 8;
    *at += 8 + (size_t)l; /* (checked when the file was read: inside the array) */
    *len = (size_t)l;
    return s;
}

double g4_gguf_array_num(const g4_gguf_array *a, uint64_t i) {
    if (i >= a->n) return 0;
    const unsigned char *p = a->data + i * (uint64_t)elem_size(a->type);
    union {
        uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32; float f32; uint64_t u64;
        int64_t i64; double f64;
    } v;
    memcpy(&v, p, (size_t)elem_size(a->type));
    switch (a->type) {
    case G4_GGUF_U8: case G4_GGUF_BOOL: return v.u8;
    case G4_GGUF_I8: return v.i8;
    case G4_GGUF_U16: return v.u16;
    case G4_GGUF_I16: return v.i16;
    case G4_GGUF_U32: return v.u32;
    case G4_GGUF_I32: return v.i32;
    case G4_GGUF_F32: return v.f32;
    case G4_GGUF_U64: return (double)v.u64;
    case G4_GGUF_I64: return (double)v.i64;
    case G4_GGUF_F64: return v.f64;
    default: return 0;
    }
}

void g4_gguf_free(g4_gguf *g) {
    if (!g) return;
    json_decref(g->meta);
    g4_tensor_set_free(&g->set);
    memset(g, 0, sizeof *g);
}

int g4_gguf_is_file(const char *path) {
    /* a regular file only: a FIFO is not opened (it would wait for a writer); g4_map_file says why */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return 0;
    struct stat st;
    char m[4] = {0};
    ssize_t n = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? read(fd, m, 4) : 0;
    close(fd);
    return n == 4 && !memcmp(m, "GGUF", 4);
}

typedef struct {
    uint64_t off;
    int i;
} placed;

static int by_offset(const void *a, const void *b) {
    const placed *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off ? 1 : x->i - y->i;
}

/* The tensors' data of one file (tensors t0 .. of the set), in offset order, must be packed as llama.cpp writes and reads it: the first at 0, each
 * next one right after the previous one's bytes padded to the alignment. A tensor whose declared type or shape
 * does not match the bytes given to it overlaps the next one or leaves a gap before it. (A tensor of a type this
 * engine does not read has no known size: the one after it is not checked, and the tensor itself is an error
 * only where the model uses it.) */
static int check_packed(g4_gguf *g, int t0, const uint64_t *offs, const char *path, g4_error *err) {
    const int n = g->set.n_tensors - t0;
    if (n <= 0) return 0;
    placed *p = malloc((size_t)n * sizeof *p);
    if (!p) return g4_fail(err, "out of memory");
    for (int i = 0; i < n; i++) p[i] = (placed){offs[i], t0 + i};
    qsort(p, (size_t)n, sizeof *p, by_offset);
    int rc = 0;
    uint64_t want = 0;
    const g4_tensor *prev = NULL;
    for (int k = 0; k < n && !rc; k++) {
        const g4_tensor *t = &g->set.tensors[p[k].i];
        if (p[k].off != want && !(prev && prev->dtype == G4_DTYPE_UNKNOWN)) {
            if (!prev)
                rc = g4_fail(err, "%s: the first tensor data ('%s') starts at offset %llu, not 0", path, t->name,
                             (unsigned long long)p[k].off);
            else
                rc = g4_fail(err,
                             "%s: tensor '%s' (%s, %zu bytes at offset %llu) %s tensor '%s' at offset %llu: its type "
                             "or shape does not match its data",
                             path, prev->name, g4_dtype_name(prev->dtype), prev->nbytes,
                             (unsigned long long)p[k - 1].off, p[k].off < want ? "overlaps" : "leaves a gap before",
                             t->name, (unsigned long long)p[k].off);
        }
        want = p[k].off + (t->nbytes + g->alignment - 1) / g->alignment * g->alignment;
        prev = t;
    }
    free(p);
    return rc;
}

/* One file of a GGUF (the whole model, or one shard of a split one): its keys into *meta (a new object), its
 * tensors into g->set (their data in this file). */
static int read_file(const char *path, g4_gguf *g, json_t **meta, g4_error *err) {
    *meta = NULL;
    g4_mapped_file mf;
    if (g4_map_file(path, &mf, err)) return -1;
    int fi = g4_tensor_set_add_file(&g->set, mf, path, err);
    if (fi < 0) return -1;
    if (mf.size < 24 || memcmp(mf.data, "GGUF", 4)) return g4_fail(err, "%s: not a GGUF file", path);
    cursor c = {mf.data, mf.data + mf.size, path, err, 0}; /* (after the size check: an empty file maps no data) */
    c.p += 4;
    uint32_t version = (uint32_t)rd(&c, 4);
    if (version != 2 && version != 3) {
        if (!(version & 0xffff)) return g4_fail(err, "%s: a big-endian GGUF file is not supported", path);
        return g4_fail(err, "%s: GGUF version %u is not supported (2 or 3)", path, version);
    }
    g->version = (int)version;
    int64_t n_tensors = (int64_t)rd(&c, 8), n_kv = (int64_t)rd(&c, 8);
    if (n_tensors < 0 || n_kv < 0 || n_tensors > (int64_t)(mf.size / 16) || n_kv > (int64_t)(mf.size / 12))
        return g4_fail(err, "%s: GGUF header counts %lld tensors and %lld keys, more than the file holds", path,
                       (long long)n_tensors, (long long)n_kv);
    json_t *m = *meta = json_object();
    if (!m) goto oom;
    for (int64_t i = 0; i < n_kv && !c.failed; i++) {
        uint64_t kl;
        const char *k = rd_str(&c, &kl);
        int type = (int)rd(&c, 4);
        if (c.failed) break;
        char key[256];
        if (kl == 0 || kl >= sizeof key || memchr(k, 0, kl)) {
            g4_fail(err, "%s: GGUF key %lld is empty, too long or holds a NUL", path, (long long)i);
            goto fail;
        }
        memcpy(key, k, kl);
        key[kl] = 0;
        if (json_object_get(m, key)) {
            g4_fail(err, "%s: GGUF key '%s' appears twice", path, key);
            goto fail;
        }
        json_t *v = type == G4_GGUF_ARR && vocabulary_key(key) ? rd_deferred(&c) : rd_value(&c, type);
        if (!v) {
            if (!c.failed) goto oom;
            /* a path is the message's start: "PATH: GGUF key 'K': ..." */
            char msg[sizeof err->msg];
            const size_t pl = strlen(path);
            snprintf(msg, sizeof msg, "%s", !strncmp(err->msg, path, pl) && !strncmp(err->msg + pl, ": ", 2)
                                                 ? err->msg + pl + 2 : err->msg);
            g4_fail(err, "%s: GGUF key '%s': %s", path, key, msg);
            goto fail;
        }
        if (json_object_set_new(m, key, v)) goto oom;
    }
    if (c.failed) goto fail;
    g->alignment = 32;
    const json_t *al = json_object_get(m, "general.alignment");
    if (al) {
        json_int_t a = json_is_integer(al) ? json_integer_value(al) : 0;
        if (a <= 0 || a > (1 << 20) || (a & (a - 1))) {
            g4_fail(err, "%s: general.alignment must be a power of two", path);
            goto fail;
        }
        g->alignment = (size_t)a;
    }
    /* tensor infos: data offsets are checked once the data start is known */
    const int t0 = g->set.n_tensors; /* this file's tensors are t0 .. */
    uint64_t *offs = calloc((size_t)n_tensors + 1, sizeof *offs);
    if (!offs) goto oom;
    for (int64_t i = 0; i < n_tensors && !c.failed; i++) {
        uint64_t nl;
        const char *nm = rd_str(&c, &nl);
        uint32_t nd = (uint32_t)rd(&c, 4);
        if (c.failed) break;
        char name[256];
        if (nl == 0 || nl >= sizeof name || memchr(nm, 0, nl) || nd < 1 || nd > 4) {
            g4_fail(err, "%s: tensor info %lld has a bad name or %u dimensions", path, (long long)i, nd);
            c.failed = 1;
            break;
        }
        memcpy(name, nm, nl);
        name[nl] = 0;
        g4_tensor t = {.name = name, .ndim = (int)nd};
        uint64_t numel = 1;
        for (uint32_t d = 0; d < nd; d++) {
            int64_t ne = (int64_t)rd(&c, 8);
            if (ne < 0 || ne > ((int64_t)1 << 40) || (ne && numel > (UINT64_MAX >> 24) / (uint64_t)ne)) {
                g4_fail(err, "%s: tensor '%s' has a bad dimension", path, name);
                c.failed = 1;
                break;
            }
            t.shape[nd - 1 - d] = ne;
            numel *= (uint64_t)ne;
        }
        int gt = (int)rd(&c, 4);
        offs[i] = rd(&c, 8);
        if (c.failed) break;
        t.dtype = g4_gguf_dtype(gt);
        if (t.dtype) {
            t.nbytes = g4_dtype_row_bytes(t.dtype, t.shape[nd - 1]) * (size_t)(numel / (uint64_t)(t.shape[nd - 1] ? t.shape[nd - 1] : 1));
            if (t.shape[nd - 1] && !g4_dtype_row_bytes(t.dtype, t.shape[nd - 1])) {
                g4_fail(err, "%s: tensor '%s' rows of %lld are not whole %s blocks", path, name,
                        (long long)t.shape[nd - 1], g4_dtype_name(t.dtype));
                c.failed = 1;
                break;
            }
        }
        if (g4_tensor_set_add(&g->set, &t, fi, err)) c.failed = 1;
    }
    if (!c.failed) {
        size_t hdr = (size_t)(c.p - mf.data);
        g->data_start = (hdr + g->alignment - 1) / g->alignment * g->alignment;
        for (int i = t0; i < g->set.n_tensors; i++) {
            g4_tensor *t = &g->set.tensors[i];
            uint64_t o = offs[i - t0];
            if (o % g->alignment || g->data_start > mf.size || o > mf.size - g->data_start ||
                t->nbytes > mf.size - g->data_start - o) {
                g4_fail(err, "%s: tensor '%s' data (offset %llu, %zu bytes) is misaligned or outside the file", path,
                        t->name, (unsigned long long)o, t->nbytes);
                c.failed = 1;
                break;
            }
            t->data = mf.data + g->data_start + o;
        }
    }
    if (!c.failed && check_packed(g, t0, offs, path, err)) c.failed = 1;
    free(offs);
    return c.failed ? -1 : 0;
oom:
    g4_fail(err, "out of memory");
fail:
    return -1;
}

/* The path of shard `no` (from 0) of `count` beside the first one's, llama.cpp's PREFIX-%05d-of-%05d.gguf
 * (llama_split_path); -1 when the first one's name is not of that form. */
static int shard_path(const char *first, int no, int count, char *out, size_t cap) {
    const size_t n = strlen(first), tail = strlen("-00001-of-00000.gguf");
    char want[32];
    snprintf(want, sizeof want, "-00001-of-%05d.gguf", count);
    if (n < tail || strcmp(first + n - strlen(want), want) || n + 8 >= cap) return -1;
    const size_t base = n - strlen(want);
    snprintf(out, cap, "%.*s-%05d-of-%05d.gguf", (int)base, first, no + 1, count);
    return 0;
}

static json_int_t meta_int(const json_t *meta, const char *key, json_int_t def) {
    const json_t *v = json_object_get(meta, key);
    return json_is_integer(v) ? json_integer_value(v) : def;
}

int g4_gguf_open(const char *path, g4_gguf *g, g4_error *err) {
    memset(g, 0, sizeof *g);
    if (read_file(path, g, &g->meta, err)) goto fail;
    /* a split GGUF (llama-gguf-split, llama.cpp's convention): the first shard holds every key, each shard its
     * tensors and their data; split.tensors.count counts them all */
    const json_int_t count = meta_int(g->meta, "split.count", 1), no = meta_int(g->meta, "split.no", 0);
    if (count > 1) {
        if (no != 0) {
            g4_fail(err, "%s: shard %lld of a GGUF split into %lld files: give the first one (its -00001-of-%05lld.gguf)",
                    path, (long long)no + 1, (long long)count, (long long)count);
            goto fail;
        }
        const size_t alignment = g->alignment;
        for (int k = 1; k < count; k++) {
            char sp[4096];
            if (count > 99999 || shard_path(path, k, (int)count, sp, sizeof sp)) {
                g4_fail(err, "%s: the first shard of a GGUF split into %lld files is not named PREFIX-00001-of-%05lld.gguf "
                             "(the others are found by that name)", path, (long long)count, (long long)count);
                goto fail;
            }
            json_t *sm = NULL;
            int rc = read_file(sp, g, &sm, err);
            const json_int_t sno = meta_int(sm, "split.no", -1), scount = meta_int(sm, "split.count", -1);
            json_decref(sm);
            if (rc) goto fail;
            if (sno != k || scount != count) {
                g4_fail(err, "%s: split.no %lld of %lld, where shard %d of %lld belongs", sp, (long long)sno,
                        (long long)scount, k + 1, (long long)count);
                goto fail;
            }
        }
        g->alignment = alignment;
        const json_int_t total = meta_int(g->meta, "split.tensors.count", g->set.n_tensors);
        if (total != g->set.n_tensors) {
            g4_fail(err, "%s: the %lld shards hold %d tensors, split.tensors.count says %lld", path, (long long)count,
                    g->set.n_tensors, (long long)total);
            goto fail;
        }
    }
    if (g4_tensor_set_finish(&g->set, err)) goto fail;
    return 0;
fail:
    g4_gguf_free(g);
    return -1;
}

/* ---------------------------------------------------------------- writer */
static void grow(g4_gguf_writer *w, unsigned char **buf, size_t *len, size_t *cap, const void *src, size_t n) {
    if (w->failed) return;
    if (*len + n > *cap) {
        size_t nc = *cap ? *cap * 2 : 4096;
        while (nc < *len + n) nc *= 2;
        unsigned char *nb = realloc(*buf, nc);
        if (!nb) {
            w->failed = 1;
            return;
        }
        *buf = nb;
        *cap = nc;
    }
    memcpy(*buf + *len, src, n);
    *len += n;
}

#define KV(src, n) grow(w, &w->kv, &w->kv_len, &w->kv_cap, (src), (n))
#define TI(src, n) grow(w, &w->ti, &w->ti_len, &w->ti_cap, (src), (n))

static void kv_str(g4_gguf_writer *w, const char *s) {
    uint64_t n = strlen(s);
    KV(&n, 8);
    KV(s, (size_t)n);
}

static void kv_head(g4_gguf_writer *w, const char *key, uint32_t type) {
    kv_str(w, key);
    KV(&type, 4);
    w->n_kv++;
}

void g4_gguf_writer_free(g4_gguf_writer *w) {
    free(w->kv);
    free(w->ti);
    memset(w, 0, sizeof *w);
}

void g4_gguf_add_u32(g4_gguf_writer *w, const char *key, uint32_t v) {
    kv_head(w, key, G4_GGUF_U32);
    KV(&v, 4);
}
void g4_gguf_add_i32(g4_gguf_writer *w, const char *key, int32_t v) {
    kv_head(w, key, G4_GGUF_I32);
    KV(&v, 4);
}
void g4_gguf_add_f32(g4_gguf_writer *w, const char *key, float v) {
    kv_head(w, key, G4_GGUF_F32);
    KV(&v, 4);
}
void g4_gguf_add_bool(g4_gguf_writer *w, const char *key, int v) {
    unsigned char b = v != 0;
    kv_head(w, key, G4_GGUF_BOOL);
    KV(&b, 1);
}
void g4_gguf_add_str(g4_gguf_writer *w, const char *key, const char *v) {
    kv_head(w, key, G4_GGUF_STR);
    kv_str(w, v);
}

/* values: int32_t[] for I32/U32, float[] for F32, int[] for BOOL */
void g4_gguf_add_arr(g4_gguf_writer *w, const char *key, int elem_type, const void *values, size_t n) {
    kv_head(w, key, G4_GGUF_ARR);
    uint32_t et = (uint32_t)elem_type;
    uint64_t cnt = n;
    KV(&et, 4);
    KV(&cnt, 8);
    for (size_t i = 0; i < n; i++) {
        if (elem_type == G4_GGUF_BOOL) {
            unsigned char b = ((const int *)values)[i] != 0;
            KV(&b, 1);
        } else {
            KV((const unsigned char *)values + 4 * i, 4);
        }
    }
}

void g4_gguf_add_str_arr(g4_gguf_writer *w, const char *key, const char *const *values, size_t n) {
    kv_head(w, key, G4_GGUF_ARR);
    uint32_t et = G4_GGUF_STR;
    uint64_t cnt = n;
    KV(&et, 4);
    KV(&cnt, 8);
    for (size_t i = 0; i < n; i++) kv_str(w, values[i]);
}

void g4_gguf_add_array(g4_gguf_writer *w, const char *key, const g4_gguf_array *a) {
    kv_head(w, key, G4_GGUF_ARR);
    uint32_t et = (uint32_t)a->type;
    uint64_t cnt = a->n;
    KV(&et, 4);
    KV(&cnt, 8);
    KV(a->data, a->size);
}

static size_t pad_to(size_t n) { return (n + G4_GGUF_ALIGN - 1) / G4_GGUF_ALIGN * G4_GGUF_ALIGN; }

size_t g4_gguf_add_tensor(g4_gguf_writer *w, const char *name, g4_dtype t, int ndim, const int64_t *shape) {
    uint64_t nl = strlen(name);
    uint32_t nd = (uint32_t)ndim, type = (uint32_t)g4_gguf_type_of(t);
    TI(&nl, 8);
    TI(name, (size_t)nl);
    TI(&nd, 4);
    int64_t rows = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        TI(&shape[d], 8);
        if (d < ndim - 1) rows *= shape[d];
    }
    TI(&type, 4);
    uint64_t off = w->data_size;
    TI(&off, 8);
    size_t bytes = g4_dtype_row_bytes(t, shape[ndim - 1]) * (size_t)rows;
    w->data_size += pad_to(bytes);
    w->n_tensors++;
    return bytes;
}

int g4_gguf_write_header(g4_gguf_writer *w, FILE *f, g4_error *err) {
    if (w->failed) return g4_fail(err, "out of memory");
    uint32_t version = 3;
    size_t hdr = 4 + 4 + 8 + 8 + w->kv_len + w->ti_len;
    static const unsigned char zeros[G4_GGUF_ALIGN];
    if (fwrite("GGUF", 1, 4, f) != 4 || fwrite(&version, 4, 1, f) != 1 || fwrite(&w->n_tensors, 8, 1, f) != 1 ||
        fwrite(&w->n_kv, 8, 1, f) != 1 || fwrite(w->kv, 1, w->kv_len, f) != w->kv_len ||
        fwrite(w->ti, 1, w->ti_len, f) != w->ti_len || fwrite(zeros, 1, pad_to(hdr) - hdr, f) != pad_to(hdr) - hdr)
        return g4_fail(err, "cannot write the GGUF header");
    return 0;
}

int g4_gguf_write_data(FILE *f, const void *data, size_t n, g4_error *err) {
    if (n && fwrite(data, 1, n, f) != n) return g4_fail(err, "cannot write tensor data");
    return 0;
}

int g4_gguf_write_pad(FILE *f, size_t size, g4_error *err) {
    static const unsigned char zeros[G4_GGUF_ALIGN];
    size_t p = pad_to(size) - size;
    if (p && fwrite(zeros, 1, p, f) != p) return g4_fail(err, "cannot write tensor data");
    return 0;
}
