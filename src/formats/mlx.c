/* MLX affine-quantized folders (docs/formats.md 2.1, 2.5, 2.8): merging weight/scales/
 * biases into one tensor, per-module bits and group size, MLX Gemma 4 names. */
#include "formats/mlx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

int g4_mlx_detect(const g4_tensor_set *set) {
    for (int i = 0; i < set->n_tensors; i++) {
        const char *n = set->tensors[i].name;
        /* mlx-lm's names, a quantized module, or its experts' SwitchGLU (a folder of a text-only model whose
         * matrices are all too narrow to quantize has only the last) */
        if (!strncmp(n, "language_model.", 15) || ends_with(n, ".scales") || strstr(n, ".experts.switch_glu."))
            return 1;
    }
    return 0;
}

/* bits and group of module `mod` (tensor name without ".weight") */
static int module_params(const json_t *quant, const char *mod, int *bits, int *group, g4_error *err) {
    json_int_t b = 4, g = 64;
    if (!quant) /* (mlx-lm then reads the packed words as plain weights, and fails on their shapes) */
        return g4_fail(err, "%s: the weights are MLX-quantized (scales and biases) but config.json has no "
                            "\"quantization\" block saying their bits and group size", mod);
    {
        const json_t *v = json_object_get(quant, "bits"), *gs = json_object_get(quant, "group_size");
        if (json_is_integer(v)) b = json_integer_value(v);
        if (json_is_integer(gs)) g = json_integer_value(gs);
        const json_t *mode = json_object_get(quant, "mode");
        if (json_is_string(mode) && strcmp(json_string_value(mode), "affine"))
            return g4_fail(err, "MLX quantization mode '%s' is not supported (affine)", json_string_value(mode));
        const json_t *ov = json_object_get(quant, mod);
        if (json_is_object(ov)) {
            v = json_object_get(ov, "bits");
            gs = json_object_get(ov, "group_size");
            if (json_is_integer(v)) b = json_integer_value(v);
            if (json_is_integer(gs)) g = json_integer_value(gs);
        }
    }
    if (!g4_mlx_dtype((int)b) || (g != 32 && g != 64 && g != 128))
        return g4_fail(err, "%s: MLX bits %lld / group %lld are not supported (bits 2,3,4,5,6,8; group 32,64,128)",
                       mod, (long long)b, (long long)g);
    *bits = (int)b;
    *group = (int)g;
    return 0;
}

static char *rename_mlx(const char *n) {
    char buf[512];
    const char *rest = n;
    const char *pre = "";
    if (!strncmp(n, "language_model.model.", 21)) {
        pre = "model.language_model.";
        rest = n + 21;
    } else if (!strncmp(n, "language_model.lm_head.", 23)) {
        pre = "lm_head.";
        rest = n + 23;
    } else if (!strncmp(n, "vision_tower.", 13) || !strncmp(n, "embed_vision.", 13)) {
        pre = "model."; /* mlx-vlm drops the outer "model." of the towers; its vision tower keeps HF's layout (its
                         * audio tower does not: conv weights channels-last, so it is left unread) */
    }
    snprintf(buf, sizeof buf, "%s%s", pre, rest);
    static const char *sw[][2] = {{"experts.switch_glu.gate_proj.weight", "experts.gate_proj"},
                                  {"experts.switch_glu.up_proj.weight", "experts.up_proj"},
                                  {"experts.switch_glu.down_proj.weight", "experts.down_proj"}};
    for (size_t i = 0; i < 3; i++) {
        char *p = strstr(buf, sw[i][0]);
        if (p && !p[strlen(sw[i][0])]) snprintf(p, sizeof buf - (size_t)(p - buf), "%s", sw[i][1]);
    }
    return strdup(buf);
}

int g4_mlx_adopt(g4_tensor_set *set, const json_t *quant, g4_error *err) {
    char name[512];
    unsigned char *drop = calloc((size_t)set->n_tensors + 1, 1);
    if (!drop) return g4_fail(err, "out of memory");
    for (int i = 0; i < set->n_tensors; i++) {
        g4_tensor *w = &set->tensors[i];
        if (!ends_with(w->name, ".weight")) continue;
        size_t base = strlen(w->name) - 7;
        snprintf(name, sizeof name, "%.*s.scales", (int)base, w->name);
        const g4_tensor *s = g4_tensor_set_find(set, name);
        if (!s) continue;
        snprintf(name, sizeof name, "%.*s.biases", (int)base, w->name);
        const g4_tensor *b = g4_tensor_set_find(set, name);
        char mod[512];
        snprintf(mod, sizeof mod, "%.*s", (int)base, w->name);
        int bits = 4, group = 64;
        if (!b) {
            free(drop);
            return g4_fail(err, "%s: MLX weight has scales but no biases", mod);
        }
        if (module_params(quant, mod, &bits, &group, err)) {
            free(drop);
            return -1;
        }
        int nd = w->ndim;
        int same = w->dtype == G4_U32 && s->ndim == nd && b->ndim == nd && nd >= 2 &&
                   (s->dtype == G4_BF16 || s->dtype == G4_F16 || s->dtype == G4_F32) && b->dtype == s->dtype;
        for (int d = 0; same && d < nd - 1; d++) same = s->shape[d] == w->shape[d] && b->shape[d] == w->shape[d];
        int64_t in = w->shape[nd - 1] * 32 / bits;
        if (!same || s->shape[nd - 1] != b->shape[nd - 1] || s->shape[nd - 1] * group != in ||
            (w->shape[nd - 1] * 32) % bits) {
            free(drop);
            return g4_fail(err, "%s: MLX weight/scales/biases shapes do not fit %d-bit, group %d", mod, bits, group);
        }
        w->dtype = g4_mlx_dtype(bits);
        w->shape[nd - 1] = in;
        w->scales = s->data;
        w->biases = b->data;
        w->scale_dtype = s->dtype;
        w->group = group;
        drop[s - set->tensors] = drop[b - set->tensors] = 1;
    }
    int k = 0;
    for (int i = 0; i < set->n_tensors; i++) {
        if (drop[i]) {
            free((char *)set->tensors[i].name);
            continue;
        }
        char *nn = rename_mlx(set->tensors[i].name);
        if (!nn) {
            free(drop);
            return g4_fail(err, "out of memory");
        }
        free((char *)set->tensors[i].name);
        set->tensors[k] = set->tensors[i];
        set->tensors[k].name = nn;
        set->file_of[k] = set->file_of[i];
        k++;
    }
    set->n_tensors = k;
    free(drop);
    return g4_tensor_set_finish(set, err);
}
