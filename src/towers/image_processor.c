/* The Gemma 4 image processor (contract in image_processor.h; docs/gemma4-towers.md 2.1-2.5). */
#include "towers/image_processor.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/json.h"
#include "core/mapped_file.h"

int g4_image_budget_ok(int budget) {
    return budget == 70 || budget == 140 || budget == 280 || budget == 560 || budget == 1120;
}

static void set_rescale(g4_image_processor *p, double factor) {
    const float f = (float)factor;
    for (int v = 0; v < 256; v++) p->rescale[v] = (float)v * f; /* fp32 product, as torch computes it */
}

void g4_image_processor_defaults(g4_image_processor *p) {
    p->patch_size = 16;
    p->pooling_kernel = 3;
    p->max_soft_tokens = 280;
    set_rescale(p, 1.0 / 255.0);
}

static int parse(const json_t *o, const char *what, g4_image_processor *p, g4_error *err) {
    int64_t patch, k, budget, resample;
    int do_resize, do_rescale, do_normalize;
    double factor;
    if (g4_json_int(o, "patch_size", 16, &patch, what, err) ||
        g4_json_int(o, "pooling_kernel_size", 3, &k, what, err) ||
        g4_json_int(o, "max_soft_tokens", 280, &budget, what, err) ||
        g4_json_int(o, "resample", 3, &resample, what, err) ||
        g4_json_bool(o, "do_resize", 1, &do_resize, what, err) ||
        g4_json_bool(o, "do_rescale", 1, &do_rescale, what, err) ||
        g4_json_bool(o, "do_normalize", 0, &do_normalize, what, err) ||
        g4_json_num(o, "rescale_factor", 1.0 / 255.0, &factor, what, err))
        return -1;
    if (patch < 1 || patch > 64 || k < 1 || k > 8) return g4_fail(err, "%s: patch_size %lld / pooling_kernel_size %lld out of range", what, (long long)patch, (long long)k);
    if (!g4_image_budget_ok((int)budget))
        return g4_fail(err, "%s: max_soft_tokens %lld is not one of 70, 140, 280, 560, 1120", what, (long long)budget);
    if (resample != 3) return g4_fail(err, "%s: resample %lld is not supported (3, bicubic)", what, (long long)resample);
    if (!do_resize) return g4_fail(err, "%s: do_resize false is not supported", what);
    if (!(factor > 0 && factor < 1e3)) return g4_fail(err, "%s: invalid rescale_factor", what);
    if (do_normalize) {
        /* an identity normalization (mean 0, std 1) may be listed; anything else is not implemented */
        const char *keys[2] = {"image_mean", "image_std"};
        for (int i = 0; i < 2; i++) {
            const json_t *a = json_object_get(o, keys[i]);
            size_t j;
            const json_t *v;
            if (!json_is_array(a)) return g4_fail(err, "%s: do_normalize is not supported", what);
            json_array_foreach(a, j, v) if (!json_is_number(v) || json_number_value(v) != (double)i)
                return g4_fail(err, "%s: do_normalize with %s other than %d is not supported", what, keys[i], i);
        }
        return g4_fail(err, "%s: do_normalize true (fused with the rescale) is not supported", what);
    }
    p->patch_size = (int)patch;
    p->pooling_kernel = (int)k;
    p->max_soft_tokens = (int)budget;
    set_rescale(p, do_rescale ? factor : 1.0);
    return 0;
}

/* Parses the image processor settings of one file; *found = 0 when the file does not hold them. */
static int load_file(const char *dir, const char *name, int nested, g4_image_processor *p, int *found,
                     g4_error *err) {
    char path[4096];
    *found = 0;
    if (g4_path_join(path, sizeof path, dir, name, err)) return -1;
    if (!g4_file_exists(path)) return 0;
    json_t *root;
    if (g4_json_load_file(path, &root, err)) return -1;
    const json_t *o = nested ? json_object_get(root, "image_processor") : root;
    int rc = 0;
    if (o) {
        *found = 1;
        rc = json_is_object(o) ? parse(o, path, p, err) : g4_fail(err, "%s: image processor settings must be an object", path);
    }
    json_decref(root);
    return rc;
}

int g4_image_processor_load(const char *dir, g4_image_processor *p, g4_error *err) {
    g4_image_processor_defaults(p);
    int found;
    if (load_file(dir, "processor_config.json", 1, p, &found, err)) return -1;
    if (found) return 0;
    return load_file(dir, "preprocessor_config.json", 0, p, &found, err);
}

int g4_image_target_size(const g4_image_processor *p, int h, int w, int budget, int *th, int *tw, g4_error *err) {
    const int k = p->pooling_kernel, side = p->patch_size * k;
    const int64_t max_patches = (int64_t)budget * k * k, target_px = max_patches * p->patch_size * p->patch_size;
    const double f = sqrt((double)target_px / ((double)h * (double)w));
    int64_t H = (int64_t)floor(f * h / side) * side, W = (int64_t)floor(f * w / side) * side;
    if (H == 0 && W == 0) return g4_fail(err, "a %dx%d image cannot be resized to a multiple of %d pixels", w, h, side);
    const int64_t max_side = (max_patches / (k * k)) * side;
    if (H == 0) {
        H = side;
        W = (int64_t)floor((double)w / h) * side;
        if (W > max_side) W = max_side;
    } else if (W == 0) {
        W = side;
        H = (int64_t)floor((double)h / w) * side;
        if (H > max_side) H = max_side;
    }
    if (H * W > target_px)
        return g4_fail(err, "resizing a %dx%d image to %lldx%lld exceeds %lld patches", w, h, (long long)W,
                       (long long)H, (long long)max_patches);
    *th = (int)H;
    *tw = (int)W;
    return 0;
}

/* ----------------------------------------------------------------- resize */
/* Per-axis integer weights of torch's antialiased bicubic (a = -0.5) uint8 kernel. */
typedef struct axis_weights {
    int n_out, kmax, prec;
    int *xmin, *n;  /* [n_out] */
    int16_t *w;     /* [n_out, kmax] */
} axis_weights;

static double cubic(double x) {
    const double a = -0.5;
    x = fabs(x);
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    if (x < 2.0) return ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
    return 0.0;
}

static int axis_weights_make(int n_in, int n_out, axis_weights *aw) {
    const double scale = (double)n_in / n_out, support = scale >= 1.0 ? 2.0 * scale : 2.0;
    const double inv = scale >= 1.0 ? 1.0 / scale : 1.0;
    const int kmax = 2 * (int)ceil(support) + 1;
    memset(aw, 0, sizeof *aw);
    aw->n_out = n_out;
    aw->kmax = kmax;
    double *wd = malloc((size_t)kmax * sizeof(double)); /* one output's weights at a time */
    aw->xmin = malloc((size_t)n_out * sizeof(int));
    aw->n = malloc((size_t)n_out * sizeof(int));
    aw->w = calloc((size_t)n_out * kmax, sizeof(int16_t));
    if (!wd || !aw->xmin || !aw->n || !aw->w) {
        free(wd);
        return -1;
    }
    /* two passes over the outputs: the largest normalized weight (it sets the precision), then the weights
     * again, rounded at that precision (each pass computes them the same way, so the values are the same) */
    double wmax = 0;
    int p = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < n_out; i++) {
            const double c = scale * (i + 0.5);
            int64_t xmin = (int64_t)(c - support + 0.5); /* C truncation, as torch */
            if (xmin < 0) xmin = 0;
            int64_t xmax = (int64_t)(c + support + 0.5);
            if (xmax > n_in) xmax = n_in;
            int64_t n = xmax - xmin;
            n = n < 0 ? 0 : n > kmax ? kmax : n;
            double sum = 0;
            for (int j = 0; j < n; j++) sum += (wd[j] = cubic((j + xmin - c + 0.5) * inv));
            for (int j = 0; j < n; j++) {
                if (sum != 0.0) wd[j] /= sum;
                if (pass == 0) {
                    if (wd[j] > wmax) wmax = wd[j];
                } else {
                    const double v = wd[j] * (double)(1 << p);
                    aw->w[(size_t)i * kmax + j] = (int16_t)(v >= 0 ? (int)(v + 0.5) : (int)(v - 0.5));
                }
            }
            aw->xmin[i] = (int)xmin;
            aw->n[i] = (int)n;
        }
        while (pass == 0 && p < 22 && (int)(0.5 + wmax * (double)(1 << (p + 1))) < 32768) p++;
    }
    aw->prec = p;
    free(wd);
    return 0;
}

static void axis_weights_free(axis_weights *aw) {
    free(aw->xmin);
    free(aw->n);
    free(aw->w);
}

static inline uint8_t clip_shift(int32_t acc, int prec) {
    int32_t v = acc >> prec;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* The width pass of one row of pixels (stride 3). */
static void resample_row(const uint8_t *s, uint8_t *d, int width, const axis_weights *aw) {
    const int32_t half = 1 << (aw->prec - 1);
    for (int x = 0; x < width; x++) {
        const int16_t *w = aw->w + (size_t)x * aw->kmax;
        const uint8_t *px = s + (size_t)aw->xmin[x] * 3;
        int32_t a0 = half, a1 = half, a2 = half;
        for (int j = 0; j < aw->n[x]; j++) {
            a0 += px[3 * j] * w[j];
            a1 += px[3 * j + 1] * w[j];
            a2 += px[3 * j + 2] * w[j];
        }
        d[3 * x] = clip_shift(a0, aw->prec);
        d[3 * x + 1] = clip_shift(a1, aw->prec);
        d[3 * x + 2] = clip_shift(a2, aw->prec);
    }
}

/* Width pass, then height pass, as torch computes them (uint8 between the passes), without holding the whole
 * intermediate image: output row y of the height pass reads intermediate rows xmin[y] .. xmin[y] + n[y] - 1, a
 * window that only moves down, so the width pass makes each row once, when a window first reaches it, into a
 * ring of kmax rows (a 1x20,000,000 image widened to 48 columns was a 2.9 GB intermediate). The height pass
 * sums whole rows into an int32 row (the same integer sums, read in order). */
int g4_image_resize(const g4_image *src, int th, int tw, g4_image *dst, g4_error *err) {
    memset(dst, 0, sizeof *dst);
    const int do_w = tw != src->width, do_h = th != src->height;
    axis_weights ax = {0}, ay = {0};
    uint8_t *ring = NULL;
    int32_t *acc = NULL;
    const size_t row = (size_t)tw * 3;
    int ok = (!do_w || axis_weights_make(src->width, tw, &ax) == 0) &&
             (!do_h || axis_weights_make(src->height, th, &ay) == 0);
    if (ok && do_h) {
        acc = malloc(row * sizeof *acc);
        ring = do_w ? malloc((size_t)ay.kmax * row) : NULL;
        ok = acc && (ring || !do_w);
    }
    if (!ok || g4_image_alloc(dst, tw, th, err)) {
        axis_weights_free(&ax);
        axis_weights_free(&ay);
        free(ring);
        free(acc);
        g4_image_free(dst);
        return g4_fail(err, "out of memory resizing a %dx%d image", src->width, src->height);
    }
    const size_t src_row = (size_t)src->width * 3;
    if (!do_h) { /* the width pass alone (or a copy) */
        for (int y = 0; y < th; y++) {
            if (do_w)
                resample_row(src->rgb + (size_t)y * src_row, dst->rgb + (size_t)y * row, tw, &ax);
            else
                memcpy(dst->rgb + (size_t)y * row, src->rgb + (size_t)y * src_row, row);
        }
    } else {
        const int32_t half = 1 << (ay.prec - 1);
        int next = 0; /* the next intermediate row the width pass makes */
        for (int y = 0; y < th; y++) {
            const int lo = ay.xmin[y], n = ay.n[y];
            for (; do_w && next < lo + n; next++)
                resample_row(src->rgb + (size_t)next * src_row, ring + (size_t)(next % ay.kmax) * row, tw, &ax);
            const int16_t *w = ay.w + (size_t)y * ay.kmax;
            for (size_t i = 0; i < row; i++) acc[i] = half;
            for (int j = 0; j < n; j++) {
                const uint8_t *s = do_w ? ring + (size_t)((lo + j) % ay.kmax) * row : src->rgb + (size_t)(lo + j) * row;
                const int32_t wj = w[j];
                for (size_t i = 0; i < row; i++) acc[i] += s[i] * wj;
            }
            uint8_t *d = dst->rgb + (size_t)y * row;
            for (size_t i = 0; i < row; i++) d[i] = clip_shift(acc[i], ay.prec);
        }
    }
    axis_weights_free(&ax);
    axis_weights_free(&ay);
    free(ring);
    free(acc);
    return 0;
}

/* --------------------------------------------------------------- patchify */
int g4_image_preprocess(const g4_image_processor *p, const g4_image *img, int budget, g4_image_patches *out,
                        g4_error *err) {
    memset(out, 0, sizeof *out);
    if (budget == 0) budget = p->max_soft_tokens;
    if (!g4_image_budget_ok(budget))
        return g4_fail(err, "image budget %d is not one of 70, 140, 280, 560, 1120 soft tokens", budget);
    int th, tw;
    if (g4_image_target_size(p, img->height, img->width, budget, &th, &tw, err)) return -1;
    g4_image resized = {0};
    const g4_image *src = img;
    if (th != img->height || tw != img->width) {
        if (g4_image_resize(img, th, tw, &resized, err)) return -1;
        src = &resized;
    }
    const int P = p->patch_size, k = p->pooling_kernel;
    out->grid_w = tw / P;
    out->grid_h = th / P;
    out->n_patches = out->grid_w * out->grid_h;
    out->n_tokens = out->n_patches / (k * k);
    out->patch_dim = P * P * 3;
    out->pixels = malloc((size_t)out->n_patches * out->patch_dim * sizeof(float));
    out->pos = malloc((size_t)out->n_patches * 2 * sizeof(int32_t));
    if (!out->pixels || !out->pos) {
        g4_image_free(&resized);
        g4_image_patches_free(out);
        return g4_fail(err, "out of memory for %d image patches", th / P * (tw / P));
    }
    for (int r = 0; r < out->grid_h; r++)
        for (int c = 0; c < out->grid_w; c++) {
            const int n = r * out->grid_w + c;
            float *dst = out->pixels + (size_t)n * out->patch_dim;
            for (int y = 0; y < P; y++) {
                const uint8_t *row = src->rgb + ((size_t)(r * P + y) * tw + (size_t)c * P) * 3;
                for (int i = 0; i < P * 3; i++) dst[y * P * 3 + i] = p->rescale[row[i]];
            }
            out->pos[2 * n] = c;
            out->pos[2 * n + 1] = r;
        }
    g4_image_free(&resized);
    return 0;
}

void g4_image_patches_free(g4_image_patches *pp) {
    free(pp->pixels);
    free(pp->pos);
    memset(pp, 0, sizeof *pp);
}
