/* Reading the fixtures' reference.safetensors (float32 / int64 tensors) for tests. */
#ifndef G4_TESTS_REFERENCE_H
#define G4_TESTS_REFERENCE_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "formats/safetensors.h"

/* Copies a reference tensor out as float32 (F32) or int32 (I64); NULL if absent. */
static inline float *ref_f32(const g4_tensor_set *set, const char *name, size_t *n) {
    const g4_tensor *t = g4_tensor_set_find(set, name);
    if (!t || t->dtype != G4_F32) return NULL;
    size_t cnt = (size_t)g4_tensor_numel(t);
    float *v = malloc(cnt * sizeof(float) + 1);
    memcpy(v, t->data, cnt * sizeof(float));
    if (n) *n = cnt;
    return v;
}

static inline int32_t *ref_ids(const g4_tensor_set *set, const char *name, size_t *n) {
    const g4_tensor *t = g4_tensor_set_find(set, name);
    if (!t || t->dtype != G4_I64) return NULL;
    size_t cnt = (size_t)g4_tensor_numel(t);
    int32_t *v = malloc(cnt * sizeof(int32_t) + 1);
    for (size_t i = 0; i < cnt; i++) {
        int64_t x;
        memcpy(&x, (const char *)t->data + 8 * i, 8);
        v[i] = (int32_t)x;
    }
    if (n) *n = cnt;
    return v;
}

static inline float max_abs_diff(const float *a, const float *b, size_t n) {
    float m = 0;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m)) m = d; /* NaN propagates as a failure */
    }
    return m;
}

static inline float max_abs(const float *a, size_t n) {
    float m = 0;
    for (size_t i = 0; i < n; i++)
        if (fabsf(a[i]) > m) m = fabsf(a[i]);
    return m;
}

static inline int argmax_f32(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

#endif
