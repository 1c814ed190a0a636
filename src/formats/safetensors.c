#include "formats/safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/json.h"

static const struct {
    const char *name;
    g4_dtype type;
} st_dtypes[] = {
    {"F32", G4_F32}, {"F16", G4_F16}, {"BF16", G4_BF16}, {"F64", G4_F64}, {"I8", G4_I8},
    {"U8", G4_U8},   {"I16", G4_I16}, {"U16", G4_U16},   {"I32", G4_I32}, {"U32", G4_U32},
    {"I64", G4_I64}, {"U64", G4_U64}, {"BOOL", G4_BOOL},
};

/* dtypes that are valid safetensors but that this engine does not read: accepted by
 * the validator (so the file opens), refused when a weight of that type is bound. */
static int st_known_unsupported_bits(const char *name) {
    static const struct {
        const char *name;
        int bits;
    } other[] = {{"F8_E4M3", 8}, {"F8_E5M2", 8}, {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8},
                 {"F8_E5M2FNUZ", 8}, {"C64", 64}, {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"F4", 4}};
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++)
        if (!strcmp(name, other[i].name)) return other[i].bits;
    return 0;
}

g4_dtype g4_safetensors_dtype(const char *name) {
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (!strcmp(name, st_dtypes[i].name)) return st_dtypes[i].type;
    return G4_DTYPE_UNKNOWN;
}

const char *g4_safetensors_dtype_name(g4_dtype t) {
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (st_dtypes[i].type == t) return st_dtypes[i].name;
    return NULL;
}

typedef struct {
    const char *name;
    uint64_t begin, end;
    g4_tensor t;
} st_entry;

static int cmp_begin(const void *a, const void *b) {
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int parse_u64(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v)) return -1;
    json_int_t i = json_integer_value(v);
    if (i < 0) return -1;
    *out = (uint64_t)i;
    return 0;
}

int g4_safetensors_add_file(g4_tensor_set *set, const char *path, g4_error *err) {
    g4_mapped_file map;
    if (g4_map_file(path, &map, err)) return -1;
    json_t *hdr = NULL;
    st_entry *entries = NULL;
    int rc = -1;

    if (map.size < 8) {
        g4_fail(err, "%s: not a safetensors file (%zu bytes, shorter than the 8-byte header length)",
                path, map.size);
        goto done;
    }
    uint64_t n;
    memcpy(&n, map.data, 8);
    if (n > G4_SAFETENSORS_MAX_HEADER) {
        g4_fail(err, "%s: not a safetensors file (header length %llu is over the 100 MB limit)", path,
                (unsigned long long)n);
        goto done;
    }
    if (n > map.size - 8) {
        g4_fail(err, "%s: truncated: header of %llu bytes, file of %zu", path, (unsigned long long)n,
                map.size);
        goto done;
    }
    json_error_t je;
    hdr = json_loadb((const char *)map.data + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    if (!hdr) {
        g4_fail(err, "%s: corrupt safetensors header: %s (at byte %d)", path, je.text, je.position);
        goto done;
    }
    if (!json_is_object(hdr)) {
        g4_fail(err, "%s: corrupt safetensors header: not a JSON object", path);
        goto done;
    }
    size_t count = json_object_size(hdr);
    entries = calloc(count ? count : 1, sizeof *entries);
    if (!entries) {
        g4_fail(err, "out of memory");
        goto done;
    }
    int ne = 0;
    const char *key;
    json_t *val;
    json_object_foreach(hdr, key, val) {
        if (!strcmp(key, "__metadata__")) {
            const char *mk;
            json_t *mv;
            if (!json_is_object(val)) {
                g4_fail(err, "%s: __metadata__ must be an object", path);
                goto done;
            }
            json_object_foreach(val, mk, mv) {
                if (!json_is_string(mv)) {
                    g4_fail(err, "%s: __metadata__ value of '%s' is not a string", path, mk);
                    goto done;
                }
            }
            continue;
        }
        if (!json_is_object(val)) {
            g4_fail(err, "%s: tensor '%s': entry is not an object", path, key);
            goto done;
        }
        const json_t *jd = json_object_get(val, "dtype");
        const json_t *js = json_object_get(val, "shape");
        const json_t *jo = json_object_get(val, "data_offsets");
        if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) || json_array_size(jo) != 2) {
            g4_fail(err, "%s: tensor '%s': needs \"dtype\", \"shape\" and two \"data_offsets\"", path, key);
            goto done;
        }
        st_entry *e = &entries[ne];
        e->name = key;
        const char *dname = json_string_value(jd);
        g4_dtype dt = g4_safetensors_dtype(dname);
        int bits = dt ? g4_dtype_bits(dt) : st_known_unsupported_bits(dname);
        if (!bits) {
            g4_fail(err, "%s: tensor '%s': unknown dtype '%s'", path, key, dname);
            goto done;
        }
        size_t ndim = json_array_size(js);
        if (ndim > G4_MAX_DIMS) {
            g4_fail(err, "%s: tensor '%s': %zu dimensions (at most %d supported)", path, key, ndim,
                    G4_MAX_DIMS);
            goto done;
        }
        size_t numel = 1;
        for (size_t d = 0; d < ndim; d++) {
            uint64_t dim;
            if (parse_u64(json_array_get(js, d), &dim) || dim > INT64_MAX ||
                !g4_mul_ok(numel, (size_t)dim, &numel)) {
                g4_fail(err, "%s: tensor '%s': invalid shape", path, key);
                goto done;
            }
            e->t.shape[d] = (int64_t)dim;
        }
        e->t.ndim = (int)ndim;
        size_t total_bits;
        if (!g4_mul_ok(numel, (size_t)bits, &total_bits) || total_bits % 8) {
            g4_fail(err, "%s: tensor '%s': size is not a whole number of bytes", path, key);
            goto done;
        }
        if (parse_u64(json_array_get(jo, 0), &e->begin) || parse_u64(json_array_get(jo, 1), &e->end) ||
            e->end < e->begin) {
            g4_fail(err, "%s: tensor '%s': invalid data_offsets", path, key);
            goto done;
        }
        if (e->end - e->begin != total_bits / 8) {
            char sb[128];
            g4_fail(err, "%s: tensor '%s': %llu data bytes do not match %s %s (%zu bytes)", path, key,
                    (unsigned long long)(e->end - e->begin), dname,
                    g4_shape_str(e->t.shape, e->t.ndim, sb, sizeof sb), total_bits / 8);
            goto done;
        }
        e->t.dtype = dt; /* G4_DTYPE_UNKNOWN for valid-but-unsupported types */
        e->t.nbytes = (size_t)(e->end - e->begin);
        ne++;
    }
    qsort(entries, (size_t)ne, sizeof *entries, cmp_begin);
    uint64_t expect = 0;
    for (int i = 0; i < ne; i++) {
        if (entries[i].begin != expect) {
            g4_fail(err, "%s: corrupt: tensor '%s' starts at %llu, expected %llu (%s)", path,
                    entries[i].name, (unsigned long long)entries[i].begin, (unsigned long long)expect,
                    entries[i].begin < expect ? "overlap" : "gap");
            goto done;
        }
        expect = entries[i].end;
    }
    size_t data_start = 8 + (size_t)n;
    if (expect != map.size - data_start) {
        if (expect > map.size - data_start)
            g4_fail(err, "%s: truncated: tensor data needs %llu bytes, the file has %zu", path,
                    (unsigned long long)expect, map.size - data_start);
        else
            g4_fail(err, "%s: corrupt: %zu unexpected bytes after the tensor data", path,
                    map.size - data_start - (size_t)expect);
        goto done;
    }
    int fi = g4_tensor_set_add_file(set, map, path, err);
    map.data = NULL; /* owned by the set now (even on failure) */
    if (fi < 0) goto done;
    for (int i = 0; i < ne; i++) {
        entries[i].t.name = entries[i].name;
        entries[i].t.data = set->files[fi].data + data_start + entries[i].begin;
        if (g4_tensor_set_add(set, &entries[i].t, fi, err)) goto done;
    }
    rc = 0;
done:
    free(entries);
    json_decref(hdr);
    if (map.data) g4_unmap_file(&map);
    return rc;
}

static int shard_name_ok(const char *s) {
    if (!*s || strchr(s, '/') || strchr(s, '\\') || !strcmp(s, ".") || !strcmp(s, "..")) return 0;
    return 1;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int g4_safetensors_open_dir(const char *dir, g4_tensor_set *set, g4_error *err) {
    char path[4096];
    memset(set, 0, sizeof *set);
    /* model.safetensors first, the index only without it: transformers' from_pretrained takes the single file when a
     * folder holds both (modeling_utils.py _get_resolved_checkpoint_files: SAFE_WEIGHTS_NAME, then
     * SAFE_WEIGHTS_INDEX_NAME), so an index left beside it (its shards gone or stale) does not matter */
    if (g4_path_join(path, sizeof path, dir, "model.safetensors", err)) return -1;
    if (g4_file_exists(path)) {
        if (g4_safetensors_add_file(set, path, err) || g4_tensor_set_finish(set, err)) {
            g4_tensor_set_free(set);
            return -1;
        }
        return 0;
    }
    if (g4_path_join(path, sizeof path, dir, "model.safetensors.index.json", err)) return -1;
    if (!g4_file_exists(path)) return g4_fail(err, "%s: no model.safetensors or model.safetensors.index.json", dir);
    json_t *idx;
    if (g4_json_load_file(path, &idx, err)) return -1;
    const json_t *wm = json_object_get(idx, "weight_map");
    const char **shards = NULL;
    const char **names = NULL;
    int rc = -1;
    if (!json_is_object(wm)) {
        g4_fail(err, "%s: no \"weight_map\" object", path);
        goto done;
    }
    size_t nw = json_object_size(wm);
    shards = calloc(nw + 1, sizeof *shards);
    names = calloc(nw + 1, sizeof *names);
    if (!shards || !names) {
        g4_fail(err, "out of memory");
        goto done;
    }
    size_t nshards = 0, nn = 0;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)wm, key, val) {
        if (!json_is_string(val) || !shard_name_ok(json_string_value(val))) {
            g4_fail(err, "%s: weight_map entry '%s' is not a shard file name", path, key);
            goto done;
        }
        names[nn] = key;
        shards[nn++] = json_string_value(val);
    }
    /* the distinct shard names, sorted (a map of many entries is not compared pair by pair) */
    qsort(shards, nn, sizeof *shards, cmp_str);
    for (size_t k = 0; k < nn; k++)
        if (!nshards || strcmp(shards[nshards - 1], shards[k])) shards[nshards++] = shards[k];
    for (size_t k = 0; k < nshards; k++) {
        char sp[4096];
        if (g4_path_join(sp, sizeof sp, dir, shards[k], err)) goto done;
        if (!g4_file_exists(sp)) {
            g4_fail(err, "%s: shard '%s' listed in the index is missing", dir, shards[k]);
            goto done;
        }
        if (g4_safetensors_add_file(set, sp, err)) goto done;
    }
    if (g4_tensor_set_finish(set, err)) goto done;
    /* the index and the shards must name the same tensors, each in the file the index says */
    qsort(names, nn, sizeof *names, cmp_str);
    if ((size_t)set->n_tensors != nn) {
        for (int i = 0; i < set->n_tensors; i++)
            if (!json_object_get(wm, set->tensors[i].name)) {
                g4_fail(err, "%s: tensor '%s' is in shard %s but not in the index", dir,
                        set->tensors[i].name, g4_tensor_set_file_of(set, &set->tensors[i]));
                goto done;
            }
        for (size_t i = 0; i < nn; i++)
            if (!g4_tensor_set_find(set, names[i])) {
                g4_fail(err, "%s: tensor '%s' is listed in the index but missing from shard %s", dir,
                        names[i], json_string_value(json_object_get(wm, names[i])));
                goto done;
            }
    }
    for (int i = 0; i < set->n_tensors; i++) {
        const json_t *f = json_object_get(wm, set->tensors[i].name);
        const char *file = g4_tensor_set_file_of(set, &set->tensors[i]);
        const char *base = strrchr(file, '/');
        base = base ? base + 1 : file;
        if (!f) {
            g4_fail(err, "%s: tensor '%s' is in shard %s but not in the index", dir, set->tensors[i].name,
                    base);
            goto done;
        }
        if (strcmp(json_string_value(f), base)) {
            g4_fail(err, "%s: tensor '%s' is in %s, the index says %s", dir, set->tensors[i].name, base,
                    json_string_value(f));
            goto done;
        }
    }
    rc = 0;
done:
    free(shards);
    free(names);
    json_decref(idx);
    if (rc) g4_tensor_set_free(set);
    return rc;
}

char *g4_safetensors_header(const g4_tensor *tensors, int n, size_t *len, g4_error *err) {
    json_t *hdr = json_object();
    json_t *meta = json_pack("{s:s}", "format", "pt");
    json_object_set_new(hdr, "__metadata__", meta);
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const char *dn = g4_safetensors_dtype_name(tensors[i].dtype);
        if (!dn) {
            json_decref(hdr);
            g4_fail(err, "cannot write dtype of tensor '%s'", tensors[i].name);
            return NULL;
        }
        json_t *shape = json_array();
        for (int d = 0; d < tensors[i].ndim; d++) json_array_append_new(shape, json_integer(tensors[i].shape[d]));
        json_t *e = json_pack("{s:s,s:o,s:[I,I]}", "dtype", dn, "shape", shape, "data_offsets",
                              (json_int_t)off, (json_int_t)(off + tensors[i].nbytes));
        json_object_set_new(hdr, tensors[i].name, e);
        off += tensors[i].nbytes;
    }
    char *text = json_dumps(hdr, JSON_COMPACT);
    json_decref(hdr);
    if (!text) {
        g4_fail(err, "out of memory");
        return NULL;
    }
    size_t l = strlen(text), padded = (l + 7) & ~(size_t)7;
    char *out = malloc(8 + padded);
    if (!out) {
        free(text);
        g4_fail(err, "out of memory");
        return NULL;
    }
    uint64_t hl = padded;
    memcpy(out, &hl, 8);
    memcpy(out + 8, text, l);
    memset(out + 8 + l, ' ', padded - l);
    free(text);
    *len = 8 + padded;
    return out;
}

int g4_safetensors_write(const char *path, const g4_tensor *tensors, int n, g4_error *err) {
    size_t len;
    char *hdr = g4_safetensors_header(tensors, n, &len, err);
    if (!hdr) return g4_fail_prefix(err, "%s", path);
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(hdr);
        return g4_fail(err, "%s: %s", path, strerror(errno));
    }
    int ok = fwrite(hdr, 1, len, f) == len;
    for (int i = 0; ok && i < n; i++)
        ok = tensors[i].nbytes == 0 || fwrite(tensors[i].data, 1, tensors[i].nbytes, f) == tensors[i].nbytes;
    free(hdr);
    if (fclose(f) != 0) ok = 0;
    if (!ok) return g4_fail(err, "%s: write failed", path);
    return 0;
}
