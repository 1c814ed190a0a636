/* Image decoding and the image processor (src/towers/image*.c, docs/gemma4-towers.md 2.1-2.5):
 * - the vision fixture's pixel_values and position ids from image0.png / image1.png;
 * - files of many kinds (PNG color types and depths, short palettes, JPEG subsamplings, progressive, CMYK,
 *   orientations from EXIF of any numeric type, XMP and PNG text, WebP, GIF) against PIL and the shared numpy
 *   reference of the resize, at several budgets
 *   (tests/data/make_image_cases.py writes them with the system's python3, PIL and numpy);
 * - PNGs with alpha, grayscale and a palette and a JPEG, each encoded here with libspng / libjpeg;
 * - empty, truncated, corrupt, huge, oversized and non-image files: a clear one-line error each; an
 *   animated WebP whose canvas is a bomb is refused before libwebp allocates its canvases, a GIF whose first
 *   frame is (its lines outside the canvas are decompressed too) before its lines are. */
#include <gif_lib.h>
#include <jansson.h>
#include <jpeglib.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <spng.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <webp/encode.h>

#include "check.h"
#include "core/mapped_file.h"
#include "formats/safetensors.h"
#include "reference.h"
#include "towers/image.h"
#include "towers/image_processor.h"

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    if (n) fwrite(data, 1, n, f);
    fclose(f);
}

static unsigned char *read_all(const char *path, size_t *n) {
    g4_error err;
    char *d;
    if (g4_read_file(path, &d, n, &err)) return NULL;
    return (unsigned char *)d;
}

/* ------------------------------------------------------------ the fixture */
static void check_fixture(void) {
    const char *dir = g4t_shared("fixtures/vision");
    g4_error err;
    g4_image_processor proc;
    CHECKF(g4_image_processor_load(dir, &proc, &err) == 0, "%s", err.msg);
    CHECK(proc.max_soft_tokens == 70 && proc.patch_size == 16 && proc.pooling_kernel == 3);
    g4_tensor_set ref = {0};
    char path[4096];
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    if (g4_safetensors_add_file(&ref, path, &err) || g4_tensor_set_finish(&ref, &err)) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    size_t npv = 0, npos = 0;
    float *pv = ref_f32(&ref, "pixel_values", &npv);
    int32_t *pos = ref_ids(&ref, "image_position_ids", &npos);
    const int max_patches = 70 * 9, dim = 768;
    CHECK(pv && pos && npv == 2 * (size_t)max_patches * dim && npos == 2 * (size_t)max_patches * 2);
    const int want_tokens[2] = {60, 66};
    for (int i = 0; i < 2 && pv && pos; i++) {
        g4_image img;
        char name[64];
        snprintf(name, sizeof name, "fixtures/vision/image%d.png", i);
        if (g4_image_load(g4t_shared(name), NULL, &img, &err)) {
            CHECKF(0, "%s", err.msg);
            continue;
        }
        g4_image_patches pp;
        CHECKF(g4_image_preprocess(&proc, &img, 0, &pp, &err) == 0, "%s", err.msg);
        CHECKF(pp.n_tokens == want_tokens[i], "image%d: %d soft tokens, the reference has %d", i, pp.n_tokens,
               want_tokens[i]);
        const float *rp = pv + (size_t)i * max_patches * dim;
        const int32_t *rpos = pos + (size_t)i * max_patches * 2;
        size_t off = 0, off1 = 0, bad_pad = 0, bad_pos = 0;
        for (size_t k = 0; k < (size_t)pp.n_patches * dim; k++)
            if (pp.pixels[k] != rp[k]) {
                off++;
                if (fabsf(pp.pixels[k] - rp[k]) <= 1.0f / 255.0f + 1e-7f) off1++;
            }
        for (int n = 0; n < pp.n_patches; n++) bad_pos += pp.pos[2 * n] != rpos[2 * n] || pp.pos[2 * n + 1] != rpos[2 * n + 1];
        for (size_t k = (size_t)pp.n_patches * dim; k < (size_t)max_patches * dim; k++) bad_pad += rp[k] != 0.0f;
        for (int n = pp.n_patches; n < max_patches; n++) bad_pad += rpos[2 * n] != -1 || rpos[2 * n + 1] != -1;
        fprintf(stderr, "image%d: %dx%d -> %dx%d patches, %d soft tokens; pixel_values differing: %zu of %zu (within 1/255: %zu)\n",
                i, img.width, img.height, pp.grid_w, pp.grid_h, pp.n_tokens, off, (size_t)pp.n_patches * dim, off1);
        CHECKF(off == 0, "image%d: %zu pixel values differ from the reference", i, off);
        CHECKF(bad_pos == 0, "image%d: %zu position ids differ", i, bad_pos);
        CHECKF(bad_pad == 0, "image%d: the reference's padding is not zeros at (-1, -1)", i);
        g4_image_patches_free(&pp);
        g4_image_free(&img);
    }
    free(pv);
    free(pos);
    g4_tensor_set_free(&ref);
}

/* ------------------------------------------------------- against PIL/numpy */
static void check_pil_cases(void) {
    const char *dir = g4t_tmp("image_cases");
    char cmd[8192];
    const char *py = g4_file_exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s' && %s '%s/tests/data/make_image_cases.py' '%s' '%s'", dir,
             dir, py, getenv("G4_SOURCE_DIR") ? getenv("G4_SOURCE_DIR") : ".", g4t_shared(""), dir);
    int rc = system(cmd);
    CHECKF(rc == 0, "the case generator failed (it needs python3 with numpy and PIL: python3-numpy, python3-pil)");
    if (rc) return;
    char path[4096];
    snprintf(path, sizeof path, "%s/cases.json", dir);
    json_error_t je;
    json_t *cases = json_load_file(path, 0, &je);
    CHECKF(json_is_array(cases), "%s: %s", path, je.text);
    g4_image_processor proc;
    g4_image_processor_defaults(&proc);
    size_t i;
    json_t *c;
    int n_cases = 0, n_resized = 0;
    json_array_foreach(cases, i, c) {
        const char *file = json_string_value(json_object_get(c, "file"));
        const int W = (int)json_integer_value(json_object_get(c, "width")), H = (int)json_integer_value(json_object_get(c, "height"));
        g4_error err;
        g4_image img;
        snprintf(path, sizeof path, "%s/%s", dir, file);
        if (g4_image_load(path, NULL, &img, &err)) {
            CHECKF(0, "%s: %s", file, err.msg);
            continue;
        }
        n_cases++;
        size_t n;
        /* the same file cut in half: a clear error, whatever the format */
        unsigned char *whole = read_all(path, &n);
        g4_image cut;
        int rc_cut = whole ? g4_image_decode(whole, n / 2, NULL, &cut, &err) : 0;
        CHECKF(rc_cut == -1 && !cut.rgb, "%s cut to %zu bytes: decoded without an error", file, n / 2);
        if (rc_cut == -1 && i % 6 == 0) fprintf(stderr, "  %s cut in half -> %s\n", file, err.msg);
        /* random damage (flipped bytes, kept length): decoded or refused, never a crash (the sanitizer build
         * checks the memory accesses) */
        for (int t = 0; whole && t < 12; t++) {
            unsigned char *bad = malloc(n);
            memcpy(bad, whole, n);
            unsigned long r = 2166136261ul ^ (i * 131 + (unsigned long)t);
            for (int f = 0; f < 1 + t % 4; f++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                bad[(r >> 17) % n] ^= (unsigned char)(1 + (r >> 40) % 255);
            }
            g4_image dmg;
            int rc_d = g4_image_decode(bad, n, NULL, &dmg, &err);
            CHECK(rc_d == 0 ? dmg.rgb != NULL && dmg.width > 0 : dmg.rgb == NULL && strlen(err.msg) > 0);
            g4_image_free(&dmg);
            free(bad);
        }
        free(whole);
        snprintf(path, sizeof path, "%s/%s", dir, json_string_value(json_object_get(c, "rgb")));
        unsigned char *want = read_all(path, &n);
        CHECKF(img.width == W && img.height == H, "%s: %dx%d, PIL %dx%d", file, img.width, img.height, W, H);
        if (want && img.width == W && img.height == H && n == (size_t)W * H * 3) {
            size_t off = 0;
            int mx = 0;
            for (size_t k = 0; k < n; k++)
                if (img.rgb[k] != want[k]) {
                    off++;
                    int d = abs(img.rgb[k] - want[k]);
                    if (d > mx) mx = d;
                }
            CHECKF(off == 0, "%s: %zu of %zu decoded values differ from PIL's (max %d)", file, off, n, mx);
        }
        free(want);
        size_t j;
        json_t *r;
        json_array_foreach(json_object_get(c, "resized"), j, r) {
            const int budget = (int)json_integer_value(json_object_get(r, "budget"));
            const int th = (int)json_integer_value(json_object_get(r, "th")), tw = (int)json_integer_value(json_object_get(r, "tw"));
            int gh = 0, gw = 0;
            CHECKF(g4_image_target_size(&proc, img.height, img.width, budget, &gh, &gw, &err) == 0, "%s", err.msg);
            CHECKF(gh == th && gw == tw, "%s, budget %d: target %dx%d, the reference %dx%d", file, budget, gw, gh, tw, th);
            if (gh != th || gw != tw) continue;
            g4_image out;
            if (g4_image_resize(&img, th, tw, &out, &err)) {
                CHECKF(0, "%s", err.msg);
                continue;
            }
            snprintf(path, sizeof path, "%s/%s", dir, json_string_value(json_object_get(r, "rgb")));
            unsigned char *ref = read_all(path, &n);
            size_t off = 0;
            for (size_t k = 0; ref && k < n && n == (size_t)th * tw * 3; k++) off += out.rgb[k] != ref[k];
            CHECKF(ref && n == (size_t)th * tw * 3 && off == 0, "%s, budget %d (%dx%d): %zu resized values differ",
                   file, budget, tw, th, off);
            n_resized++;
            free(ref);
            g4_image_free(&out);
        }
        g4_image_free(&img);
    }
    fprintf(stderr, "%d files decoded and %d resizes compared with PIL and the numpy reference\n", n_cases, n_resized);
    json_decref(cases);
}

/* -------------------------------------------- files encoded in this test */
/* CRC-32 of PNG chunks (to patch a header) */
static unsigned long crc32_of(const unsigned char *p, size_t n) {
    unsigned long c = 0xFFFFFFFFul;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320ul & (0ul - (c & 1)));
    }
    return c ^ 0xFFFFFFFFul;
}

static unsigned char pattern(int x, int y, int c) { return (unsigned char)(20 + x * 2 + y * 3 + c * 25 + (x * y) % 5); }

static void *encode_png(int w, int h, int color_type, int depth, const void *px, size_t len,
                        const struct spng_plte *plte, size_t *out_len) {
    spng_ctx *e = spng_ctx_new(SPNG_CTX_ENCODER);
    spng_set_option(e, SPNG_ENCODE_TO_BUFFER, 1);
    struct spng_ihdr ih = {(uint32_t)w, (uint32_t)h, (uint8_t)depth, (uint8_t)color_type, 0, 0, 0};
    spng_set_ihdr(e, &ih);
    if (plte) spng_set_plte(e, (struct spng_plte *)plte);
    int rc = spng_encode_image(e, px, len, SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE), er;
    void *buf = rc ? NULL : spng_get_png_buffer(e, out_len, &er);
    spng_ctx_free(e);
    return buf;
}

/* A JPEG of rgb at a quality; with bands > 0 progressive, of 1 + 3 x bands scans: the DC of all components, then each
 * component's 63 AC coefficients in `bands` spectral bands (spectral selection only). */
static void *encode_jpeg(int w, int h, const unsigned char *rgb, int quality, int bands, size_t *out_len) {
    struct jpeg_compress_struct ci;
    struct jpeg_error_mgr jerr;
    ci.err = jpeg_std_error(&jerr);
    jpeg_create_compress(&ci);
    unsigned char *buf = NULL;
    unsigned long n = 0;
    jpeg_mem_dest(&ci, &buf, &n);
    ci.image_width = (JDIMENSION)w;
    ci.image_height = (JDIMENSION)h;
    ci.input_components = 3;
    ci.in_color_space = JCS_RGB;
    jpeg_set_defaults(&ci);
    jpeg_set_quality(&ci, quality, TRUE);
    jpeg_scan_info *sc = bands > 0 ? calloc((size_t)(1 + 3 * bands), sizeof *sc) : NULL;
    if (sc) {
        sc[0].comps_in_scan = 3, sc[0].component_index[1] = 1, sc[0].component_index[2] = 2; /* DC, all components */
        for (int c = 0, i = 1; c < 3; c++)
            for (int b = 0; b < bands; b++, i++) { /* coefficients 1..63 in `bands` contiguous bands */
                sc[i].comps_in_scan = 1, sc[i].component_index[0] = c;
                sc[i].Ss = 1 + 63 * b / bands, sc[i].Se = 63 * (b + 1) / bands;
            }
        ci.scan_info = sc, ci.num_scans = 1 + 3 * bands;
    }
    jpeg_start_compress(&ci, TRUE);
    while (ci.next_scanline < ci.image_height) {
        JSAMPROW row = (JSAMPROW)(rgb + (size_t)ci.next_scanline * w * 3);
        jpeg_write_scanlines(&ci, &row, 1);
    }
    jpeg_finish_compress(&ci);
    jpeg_destroy_compress(&ci);
    free(sc);
    *out_len = n;
    return buf;
}

/* Progressive JPEGs of at most 100 scans decode, more are refused before they are decoded (a small file of many scans
 * costs seconds a scan pass: 694 scans of a 9000x9000 image, 256 KB, took 13 s); encoders write about 10. */
static void check_jpeg_scans(void) {
    enum { W = 24, H = 16 };
    static unsigned char rgb[H][W][3];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) rgb[y][x][0] = (unsigned char)(x * 10), rgb[y][x][1] = (unsigned char)(y * 15), rgb[y][x][2] = 90;
    const int bands[2] = {33, 34}; /* 100 and 103 scans */
    for (int i = 0; i < 2; i++) {
        size_t n = 0;
        void *jpg = encode_jpeg(W, H, &rgb[0][0][0], 95, bands[i], &n);
        g4_image img;
        g4_error err;
        const int rc = g4_image_decode(jpg, n, NULL, &img, &err);
        if (i == 0)
            CHECKF(rc == 0 && img.width == W && img.height == H, "progressive JPEG of 100 scans: %s", rc ? err.msg : "");
        else
            CHECKF(rc == -1 && strstr(err.msg, "scans"), "progressive JPEG of 103 scans: rc %d '%s'", rc, rc ? err.msg : "");
        if (rc == 0) g4_image_free(&img);
        free(jpg);
    }
}

/* Decodes bytes written to a file; NULL with the message in err on failure. */
static int load_bytes(const char *name, const void *data, size_t n, const g4_image_limits *lim, g4_image *img,
                      g4_error *err) {
    const char *path = g4t_tmp(name);
    write_file(path, data, n);
    return g4_image_load(path, lim, img, err);
}

static void check_encoded(void) {
    enum { W = 37, H = 23 };
    static unsigned char rgba[H][W][4], rgb[H][W][3], gray[H][W], idx[H][W];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            for (int c = 0; c < 4; c++) rgba[y][x][c] = pattern(x, y, c);
            for (int c = 0; c < 3; c++) rgb[y][x][c] = pattern(x, y, c);
            gray[y][x] = pattern(x, y, 1);
            idx[y][x] = (unsigned char)((x + y) % 5);
        }
    g4_error err;
    g4_image img;
    size_t n;
    /* alpha: dropped, the colour channels stay as they are (PIL's convert("RGB")) */
    void *png = encode_png(W, H, SPNG_COLOR_TYPE_TRUECOLOR_ALPHA, 8, rgba, sizeof rgba, NULL, &n);
    CHECK(png && load_bytes("alpha.png", png, n, NULL, &img, &err) == 0);
    int bad = 0;
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            for (int c = 0; c < 3; c++) bad += img.rgb[(y * W + x) * 3 + c] != rgba[y][x][c];
    CHECKF(img.width == W && img.height == H && bad == 0, "RGBA PNG: %d values differ", bad);
    g4_image_free(&img);
    free(png);
    /* grayscale: replicated */
    png = encode_png(W, H, SPNG_COLOR_TYPE_GRAYSCALE, 8, gray, sizeof gray, NULL, &n);
    CHECK(png && load_bytes("gray.png", png, n, NULL, &img, &err) == 0);
    bad = 0;
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            for (int c = 0; c < 3; c++) bad += img.rgb[(y * W + x) * 3 + c] != gray[y][x];
    CHECKF(bad == 0, "gray PNG: %d values differ", bad);
    g4_image_free(&img);
    free(png);
    /* palette: expanded */
    struct spng_plte plte = {.n_entries = 5};
    for (int i = 0; i < 5; i++) plte.entries[i] = (struct spng_plte_entry){(uint8_t)(i * 50), (uint8_t)(255 - i * 40), (uint8_t)(i * i * 9), 255};
    png = encode_png(W, H, SPNG_COLOR_TYPE_INDEXED, 8, idx, sizeof idx, &plte, &n);
    CHECK(png && load_bytes("palette.png", png, n, NULL, &img, &err) == 0);
    bad = 0;
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            const struct spng_plte_entry *e = &plte.entries[idx[y][x]];
            const unsigned char *o = img.rgb + (y * W + x) * 3;
            bad += o[0] != e->red || o[1] != e->green || o[2] != e->blue;
        }
    CHECKF(bad == 0, "palette PNG: %d pixels differ", bad);
    g4_image_free(&img);
    free(png);
    /* a JPEG from libjpeg: the decode is close to what was encoded (lossy), and exact to itself */
    void *jpg = encode_jpeg(W, H, &rgb[0][0][0], 95, 0, &n);
    CHECK(jpg && load_bytes("q95.jpg", jpg, n, NULL, &img, &err) == 0);
    double se = 0;
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            for (int c = 0; c < 3; c++) {
                double d = (double)img.rgb[(y * W + x) * 3 + c] - rgb[y][x][c];
                se += d * d;
            }
    double rmse = sqrt(se / (W * H * 3));
    fprintf(stderr, "JPEG (quality 95) of a %dx%d pattern: decoded with RMSE %.2f\n", W, H, rmse);
    CHECKF(img.width == W && img.height == H && rmse < 3.0, "JPEG decode: RMSE %.2f", rmse);
    g4_image_free(&img);

    /* ---- errors: one line each, nothing allocated */
    struct {
        const char *name, *expect;
        const void *data;
        size_t n;
    } bad_files[] = {
        {"empty.png", "empty", "", 0},
        {"text.png", "not an image", "hello, I am a text file\n", 24},
        {"pic.bmp", "BMP", "BM\x36\0\0\0\0\0\0\0\x36\0\0\0", 14},
        {"truncated.jpg", "truncated", jpg, n / 2},
        {"header_only.jpg", "JPEG", jpg, 40},
    };
    for (size_t i = 0; i < sizeof bad_files / sizeof bad_files[0]; i++) {
        int rc = load_bytes(bad_files[i].name, bad_files[i].data, bad_files[i].n, NULL, &img, &err);
        CHECKF(rc == -1 && strstr(err.msg, bad_files[i].expect) && !strchr(err.msg, '\n') && !img.rgb,
               "%s: rc %d, message '%s'", bad_files[i].name, rc, err.msg);
        fprintf(stderr, "  %s -> %s\n", bad_files[i].name, err.msg);
    }
    /* corrupt entropy data: garbage bytes inside the scan */
    unsigned char *cj = malloc(n);
    memcpy(cj, jpg, n);
    for (size_t k = n / 2; k < n / 2 + 64 && k + 2 < n; k += 2) {
        cj[k] = 0xFF;
        cj[k + 1] = 0xE3; /* a marker inside the entropy-coded data */
    }
    int rc = load_bytes("corrupt.jpg", cj, n, NULL, &img, &err);
    CHECKF(rc == -1 && strstr(err.msg, "JPEG"), "corrupt JPEG: rc %d '%s'", rc, err.msg);
    fprintf(stderr, "  corrupt.jpg -> %s\n", err.msg);
    free(cj);
    /* PNGs: truncated, a flipped byte (CRC), and a header claiming 100000 x 100000 pixels */
    png = encode_png(W, H, SPNG_COLOR_TYPE_TRUECOLOR_ALPHA, 8, rgba, sizeof rgba, NULL, &n);
    rc = load_bytes("truncated.png", png, n - 20, NULL, &img, &err);
    CHECKF(rc == -1 && strstr(err.msg, "PNG"), "truncated PNG: rc %d '%s'", rc, err.msg);
    fprintf(stderr, "  truncated.png -> %s\n", err.msg);
    unsigned char *cp = malloc(n);
    memcpy(cp, png, n);
    cp[n / 2] ^= 0x55;
    rc = load_bytes("corrupt.png", cp, n, NULL, &img, &err);
    CHECKF(rc == -1 && strstr(err.msg, "PNG"), "corrupt PNG: rc %d '%s'", rc, err.msg);
    fprintf(stderr, "  corrupt.png -> %s\n", err.msg);
    /* patch the IHDR (width at byte 16, height at 20) and its CRC */
    memcpy(cp, png, n);
    const unsigned char big[8] = {0, 1, 0x86, 0xA0, 0, 1, 0x86, 0xA0};
    memcpy(cp + 16, big, 8);
    unsigned long crc = crc32_of(cp + 12, 17);
    for (int b = 0; b < 4; b++) cp[29 + b] = (unsigned char)(crc >> (24 - 8 * b));
    rc = load_bytes("bomb.png", cp, n, NULL, &img, &err);
    CHECKF(rc == -1 && strstr(err.msg, "pixels"), "100000x100000 PNG: rc %d '%s'", rc, err.msg);
    fprintf(stderr, "  bomb.png -> %s\n", err.msg);
    /* limits given by the caller: pixels and file size */
    g4_image_limits lim = {.max_pixels = W * H - 1};
    rc = load_bytes("limit.png", png, n, &lim, &img, &err);
    CHECKF(rc == -1 && strstr(err.msg, "limit"), "pixel limit: rc %d '%s'", rc, err.msg);
    lim = (g4_image_limits){.max_file_bytes = n - 1};
    rc = load_bytes("limit.png", png, n, &lim, &img, &err);
    CHECKF(rc == -1 && strstr(err.msg, "bytes"), "file-size limit: rc %d '%s'", rc, err.msg);
    fprintf(stderr, "  limit.png -> %s\n", err.msg);
    /* a directory and a missing file */
    rc = g4_image_load(g4t_tmp(""), NULL, &img, &err);
    CHECKF(rc == -1, "a directory: rc %d", rc);
    rc = g4_image_load(g4t_tmp("no-such-image.png"), NULL, &img, &err);
    CHECKF(rc == -1 && strstr(err.msg, "no-such-image.png"), "a missing file: '%s'", err.msg);
    free(cp);
    free(png);
    free(jpg);
}

/* ------------------------------------------------------ processor limits */
static void check_processor(void) {
    g4_image_processor p;
    g4_image_processor_defaults(&p);
    g4_error err;
    int th, tw;
    /* the table of docs/gemma4-towers.md 2.2 */
    static const int cases[][5] = {{768, 1024, 280, 672, 912}, {720, 1280, 70, 288, 528}, {720, 1280, 1120, 1200, 2112},
                                   {224, 224, 140, 528, 528},  {512, 512, 560, 1104, 1104}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK(g4_image_target_size(&p, cases[i][0], cases[i][1], cases[i][2], &th, &tw, &err) == 0);
        CHECKF(th == cases[i][3] && tw == cases[i][4], "%dx%d at %d: %dx%d", cases[i][0], cases[i][1], cases[i][2], th, tw);
    }
    g4_image img;
    CHECK(g4_image_alloc(&img, 8, 8, &err) == 0);
    memset(img.rgb, 7, 8 * 8 * 3);
    g4_image_patches pp;
    CHECK(g4_image_preprocess(&p, &img, 100, &pp, &err) == -1 && strstr(err.msg, "100"));
    g4_image_free(&img);
}

/* ------------------------------------------------------- WebP canvas bomb */
static void le24(unsigned char *p, unsigned v) {
    p[0] = (unsigned char)v, p[1] = (unsigned char)(v >> 8), p[2] = (unsigned char)(v >> 16);
}

/* An animated WebP (VP8X + ANIM + one ANMF frame of 1x1, encoded here by libwebp) whose canvas is W x H. */
static size_t animated_webp(unsigned W, unsigned H, unsigned char *out, size_t cap) {
    const unsigned char px[4] = {10, 20, 30, 255};
    unsigned char *one;
    size_t n = WebPEncodeLosslessRGBA(px, 1, 1, 4, &one), frame = n - 12; /* its VP8L chunk follows "RIFF" n "WEBP" */
    size_t o = 12, total = 12 + 18 + 14 + 24 + frame + (frame & 1);
    if (!n || total > cap) {
        WebPFree(one);
        return 0;
    }
    memset(out, 0, total);
    memcpy(out + o, "VP8X", 4), le24(out + o + 4, 10), out[o + 8] = 0x02; /* the animation flag */
    le24(out + o + 12, W - 1), le24(out + o + 15, H - 1), o += 18;
    memcpy(out + o, "ANIM", 4), le24(out + o + 4, 6), o += 14;
    memcpy(out + o, "ANMF", 4), le24(out + o + 4, (unsigned)(16 + frame)), le24(out + o + 20, 100), o += 24;
    memcpy(out + o, one + 12, frame);
    memcpy(out, "RIFF", 4), le24(out + 4, (unsigned)(total - 8)), memcpy(out + 8, "WEBP", 4);
    WebPFree(one);
    return total;
}

static void check_webp_canvas(void) {
    unsigned char buf[512];
    g4_image img;
    g4_error err;
    size_t n = animated_webp(64, 48, buf, sizeof buf);
    CHECK(n > 0);
    int rc = g4_image_decode(buf, n, NULL, &img, &err);
    CHECKF(rc == 0 && img.width == 64 && img.height == 48 && img.rgb[0] == 10 && img.rgb[2] == 30, "64x48 animated WebP: %s",
           rc ? err.msg : "wrong pixels");
    g4_image_free(&img);
    /* 16384 x 16384 (268 M pixels, 3x the limit): libwebp's animation decoder callocs two RGBA canvases of 1 GiB
     * each. With the address space 768 MiB above what is mapped now, a check after that allocation sees it fail
     * ("corrupt WebP"); the check before it names the size. (AddressSanitizer maps terabytes of shadow: there
     * only the message is checked.) */
    n = animated_webp(16384, 16384, buf, sizeof buf);
    CHECK(n > 0);
    struct rlimit old;
    int limited = 0;
#if defined(__SANITIZE_ADDRESS__) /* gcc */
#define G4T_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) /* clang */
#define G4T_ASAN 1
#endif
#endif
#if !defined(G4T_ASAN)
    long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f && fscanf(f, "%ld", &pages) == 1 && getrlimit(RLIMIT_AS, &old) == 0) {
        struct rlimit lim = old;
        rlim_t want = (rlim_t)pages * 4096 + ((rlim_t)768 << 20);
        if (old.rlim_cur == RLIM_INFINITY || old.rlim_cur > want) lim.rlim_cur = want;
        limited = setrlimit(RLIMIT_AS, &lim) == 0;
    }
    if (f) fclose(f);
#endif
    rc = g4_image_decode(buf, n, NULL, &img, &err);
    if (limited) setrlimit(RLIMIT_AS, &old);
    CHECKF(rc == -1 && strstr(err.msg, "16384x16384") && strstr(err.msg, "limit"), "16384x16384 WebP canvas: rc %d '%s'%s",
           rc, rc ? err.msg : "", limited ? " (address space limited)" : "");
    fprintf(stderr, "  16384x16384 animated WebP%s -> %s\n", limited ? " (address space limited)" : "", err.msg);
    if (!rc) g4_image_free(&img);
}

/* ------------------------------------------------------- GIF frame bomb */
typedef struct mem_out {
    unsigned char *p;
    size_t n, cap;
} mem_out;

static int gif_write(GifFileType *g, const GifByteType *b, int len) {
    mem_out *m = g->UserData;
    if (m->n + (size_t)len > m->cap) return 0;
    memcpy(m->p + m->n, b, (size_t)len);
    m->n += (size_t)len;
    return len;
}

/* A GIF (giflib's encoder) with a canvas of cw x ch and one frame of fw x fh at (0, 0), all index 1 (white). */
static size_t gif_with_frame(int cw, int ch, int fw, int fh, unsigned char *out, size_t cap) {
    mem_out m = {out, 0, cap};
    int e;
    GifFileType *g = EGifOpen(&m, gif_write, &e);
    if (!g) return 0;
    GifColorType colors[2] = {{0, 0, 0}, {255, 255, 255}};
    ColorMapObject *cm = GifMakeMapObject(2, colors);
    GifPixelType *line = malloc((size_t)fw);
    int ok = cm && line && EGifPutScreenDesc(g, cw, ch, 1, 0, cm) == GIF_OK &&
             EGifPutImageDesc(g, 0, 0, fw, fh, false, NULL) == GIF_OK;
    if (line) memset(line, 1, (size_t)fw);
    for (int y = 0; ok && y < fh; y++) ok = EGifPutLine(g, line, fw) == GIF_OK;
    ok = EGifCloseFile(g, &e) == GIF_OK && ok;
    GifFreeMapObject(cm);
    free(line);
    return ok ? m.n : 0;
}

static void check_gif_frame(void) {
    static unsigned char buf[1 << 16];
    g4_image img;
    g4_error err;
    /* a frame as large as the canvas decodes (white) */
    size_t n = gif_with_frame(20, 10, 20, 10, buf, sizeof buf);
    CHECK(n > 0);
    int rc = g4_image_decode(buf, n, NULL, &img, &err);
    CHECKF(rc == 0 && img.width == 20 && img.height == 10 && img.rgb[0] == 255, "20x10 GIF: %s", rc ? err.msg : "wrong");
    g4_image_free(&img);
    /* a 1x1 canvas with a 300x200 frame under a limit of 1000 pixels: the canvas passes, the frame (60000 pixels,
     * each decompressed) does not. The same at the default limit: 65535x65535 in 3 MB took a minute. */
    n = gif_with_frame(1, 1, 300, 200, buf, sizeof buf);
    CHECK(n > 0);
    g4_image_limits lim = {.max_pixels = 1000};
    rc = g4_image_decode(buf, n, &lim, &img, &err);
    CHECKF(rc == -1 && strstr(err.msg, "300x200") && strstr(err.msg, "limit"), "1x1 GIF with a 300x200 frame: rc %d '%s'",
           rc, rc ? err.msg : "");
    fprintf(stderr, "  1x1 GIF with a 300x200 frame, limit 1000 pixels -> %s\n", rc ? err.msg : "decoded");
    if (!rc) g4_image_free(&img);
    /* a frame of 0x0 pixels: an error that says so (it printed giflib's NULL message as "(null)") */
    static const unsigned char empty[] = {'G', 'I', 'F', '8', '9', 'a', 10, 0, 10, 0, 0x80, 0, 0, 0, 0, 0, 255, 255, 255,
                                          0x2c, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 0x44, 1, 0, 0x3b};
    rc = g4_image_decode(empty, sizeof empty, NULL, &img, &err);
    CHECKF(rc == -1 && !strstr(err.msg, "(null)") && strstr(err.msg, "0x0"), "a GIF frame of 0x0 pixels: rc %d '%s'", rc,
           rc ? err.msg : "");
    if (!rc) g4_image_free(&img);
}

/* A 1x4,000,000 image (a small PNG; 89 M pixels pass the limit) resized as the processor sizes it, 48x3360: the width
 * pass widens every row to 48 pixels before the height pass narrows them, and the whole widened image (576 MB here,
 * 2.9 GB for 20 M rows, 12.9 GB at the pixel limit) was held between the passes. Run first, while the process's
 * peak resident size is low. (The resize's values are checked against the numpy reference with the PIL cases.) */
static void check_resize_memory(void) {
    g4_image img, out;
    g4_error err;
    const int H = 4000000;
    if (g4_image_alloc(&img, 1, H, &err)) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    for (int y = 0; y < H; y++)
        for (int c = 0; c < 3; c++) img.rgb[3 * (size_t)y + c] = (unsigned char)((y >> (4 + c)) * 37 + c * 80);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    const long before = ru.ru_maxrss;
    int rc = g4_image_resize(&img, 3360, 48, &out, &err);
    getrusage(RUSAGE_SELF, &ru);
    const long grown_mb = (ru.ru_maxrss - before) / 1024;
    CHECKF(rc == 0 && out.width == 48 && out.height == 3360, "1x%d resized to 48x3360: %s", H, rc ? err.msg : "wrong size");
    CHECKF(grown_mb < 200, "1x%d resized to 48x3360: the peak resident size grew by %ld MB", H, grown_mb);
    fprintf(stderr, "1x%d resized to 48x3360: peak resident size +%ld MB\n", H, grown_mb);
    if (!rc) g4_image_free(&out);
    g4_image_free(&img);
}

int main(void) {
#ifdef __GLIBC__
    mallopt(M_PERTURB, 0x5a); /* fresh heap memory is not zero: a decoder that reads what it did not write shows */
#endif
    check_resize_memory();
    check_processor();
    check_fixture();
    check_encoded();
    check_webp_canvas();
    check_gif_frame();
    check_jpeg_scans();
    check_pil_cases();
    return g4t_done();
}
