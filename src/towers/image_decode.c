/* Image decoding (contract in image.h; docs/gemma4-towers.md 2.1): the format is recognised by its
 * first bytes, each format is decoded by its Debian library, and the EXIF orientation is applied. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <jpeglib.h>
#include <jerror.h>
#include <spng.h>
#include <webp/decode.h>
#include <webp/demux.h>
#include <gif_lib.h>
#include <libexif/exif-data.h>

#include "core/error.h"
#include "core/mapped_file.h"
#include "towers/image.h"

#define JPEG_MAX_SCANS 100 /* progressive JPEGs with more scans are refused (a known DoS: each scan is a pass over the
                              * image; 694 scans of a 256 KB 9000x9000 file took 13 s); encoders write about 10 */
#define PNG_CHUNK_LIMIT ((size_t)64 << 20) /* ancillary chunk bytes libspng may hold (text bombs) */

int g4_image_alloc(g4_image *img, int width, int height, g4_error *err) {
    img->width = width;
    img->height = height;
    img->rgb = NULL;
    if (width <= 0 || height <= 0) return g4_fail(err, "image of %dx%d pixels", width, height);
    img->rgb = malloc((size_t)width * (size_t)height * 3);
    if (!img->rgb) return g4_fail(err, "out of memory for a %dx%d image", width, height);
    return 0;
}

void g4_image_free(g4_image *img) {
    if (!img) return;
    free(img->rgb);
    memset(img, 0, sizeof *img);
}

static int check_size(int64_t w, int64_t h, int64_t max_pixels, g4_error *err) {
    if (w <= 0 || h <= 0) return g4_fail(err, "the image has no pixels (%lldx%lld)", (long long)w, (long long)h);
    if (w > 1 << 30 || h > 1 << 30 || w * h > max_pixels)
        return g4_fail(err, "the image has %lldx%lld = %lld pixels, more than the limit of %lld (a decompression "
                            "bomb?)", (long long)w, (long long)h, (long long)(w * h), (long long)max_pixels);
    return 0;
}

/* ------------------------------------------------------------------- JPEG */
typedef struct jpeg_fail {
    struct jpeg_error_mgr mgr;
    struct jpeg_progress_mgr progress;
    jmp_buf jump;
    char msg[JMSG_LENGTH_MAX + 64];
} jpeg_fail;

static void jpeg_error_exit(j_common_ptr cinfo) {
    jpeg_fail *f = (jpeg_fail *)cinfo->err;
    char m[JMSG_LENGTH_MAX];
    cinfo->err->format_message(cinfo, m);
    snprintf(f->msg, sizeof f->msg, "corrupt JPEG: %s", m);
    longjmp(f->jump, 1);
}

/* Warnings about damaged entropy data or a premature end become errors; the rest are harmless. */
static void jpeg_emit_message(j_common_ptr cinfo, int level) {
    jpeg_fail *f = (jpeg_fail *)cinfo->err;
    if (level != -1) return;
    int code = cinfo->err->msg_code;
    if (code == JWRN_JPEG_EOF) {
        snprintf(f->msg, sizeof f->msg, "truncated or corrupt JPEG (the image data ends early)");
        longjmp(f->jump, 1);
    }
    if (code == JWRN_HIT_MARKER || code == JWRN_HUFF_BAD_CODE || code == JWRN_MUST_RESYNC ||
        code == JWRN_BOGUS_PROGRESSION || code == JWRN_NOT_SEQUENTIAL) {
        char m[JMSG_LENGTH_MAX];
        cinfo->err->format_message(cinfo, m);
        snprintf(f->msg, sizeof f->msg, "corrupt JPEG data: %s", m);
        longjmp(f->jump, 1);
    }
}

static void jpeg_progress(j_common_ptr cinfo) {
    j_decompress_ptr d = (j_decompress_ptr)cinfo;
    if (d->input_scan_number > JPEG_MAX_SCANS) {
        jpeg_fail *f = (jpeg_fail *)cinfo->err;
        snprintf(f->msg, sizeof f->msg, "the JPEG has more than %d scans (refused)", JPEG_MAX_SCANS);
        longjmp(f->jump, 1);
    }
}

/* PIL's CMYK -> RGB: nk = 255 - k; channel = nk - round(c * nk / 255) (MULDIV255). */
static inline uint8_t cmyk_channel(int c, int k) {
    int nk = 255 - k, t = c * nk + 128;
    int v = nk - (((t >> 8) + t) >> 8);
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

static int decode_jpeg(const uint8_t *data, size_t size, int64_t max_pixels, g4_image *out, g4_error *err) {
    struct jpeg_decompress_struct ci;
    jpeg_fail f;
    memset(&ci, 0, sizeof ci);
    memset(&f, 0, sizeof f);
    /* volatile: modified between setjmp and longjmp */
    uint8_t *volatile row = NULL;
    volatile int created = 0;
    ci.err = jpeg_std_error(&f.mgr);
    f.mgr.error_exit = jpeg_error_exit;
    f.mgr.emit_message = jpeg_emit_message;
    if (setjmp(f.jump)) {
        if (created) jpeg_destroy_decompress(&ci);
        free(row);
        g4_image_free(out);
        return g4_fail(err, "%s", f.msg);
    }
    jpeg_create_decompress(&ci);
    created = 1;
    f.progress.progress_monitor = jpeg_progress;
    ci.progress = &f.progress;
    jpeg_mem_src(&ci, data, (unsigned long)size);
    jpeg_read_header(&ci, TRUE);
    if (check_size(ci.image_width, ci.image_height, max_pixels, err)) {
        jpeg_destroy_decompress(&ci);
        return -1;
    }
    int cmyk = 0;
    switch (ci.jpeg_color_space) {
    case JCS_GRAYSCALE: ci.out_color_space = JCS_RGB; break; /* gray replicated into R, G and B */
    case JCS_YCbCr:
    case JCS_RGB: ci.out_color_space = JCS_RGB; break;
    case JCS_CMYK:
    case JCS_YCCK:
        ci.out_color_space = JCS_CMYK;
        cmyk = 1;
        break;
    default:
        jpeg_destroy_decompress(&ci);
        return g4_fail(err, "JPEG with %d color components is not supported", ci.num_components);
    }
    jpeg_start_decompress(&ci);
    const int W = (int)ci.output_width, H = (int)ci.output_height;
    if (g4_image_alloc(out, W, H, err)) {
        jpeg_destroy_decompress(&ci);
        return -1;
    }
    if (cmyk && !(row = malloc((size_t)W * 4))) {
        snprintf(f.msg, sizeof f.msg, "out of memory");
        longjmp(f.jump, 1);
    }
    while (ci.output_scanline < ci.output_height) {
        int y = (int)ci.output_scanline;
        uint8_t *dst = out->rgb + (size_t)y * (size_t)W * 3;
        JSAMPROW r = cmyk ? row : dst;
        jpeg_read_scanlines(&ci, &r, 1);
        if (cmyk) /* PIL reads CMYK JPEGs with Adobe polarity (inverted), then converts */
            for (int x = 0; x < W; x++) {
                int k = 255 - row[4 * x + 3];
                for (int c = 0; c < 3; c++) dst[3 * x + c] = cmyk_channel(255 - row[4 * x + c], k);
            }
    }
    jpeg_finish_decompress(&ci);
    jpeg_destroy_decompress(&ci);
    free(row);
    return 0;
}

/* The first APP1 segment that holds EXIF ("Exif\0\0" + TIFF), or NULL. */
static const uint8_t *jpeg_exif(const uint8_t *d, size_t n, size_t *len) {
    size_t i = 2;
    while (i + 4 <= n && d[i] == 0xFF) {
        int marker = d[i + 1];
        if (marker == 0xD8 || (marker >= 0xD0 && marker <= 0xD7) || marker == 0x01) {
            i += 2;
            continue;
        }
        if (marker == 0xDA || marker == 0xD9) break; /* start of scan: no more headers */
        size_t seg = (size_t)d[i + 2] << 8 | d[i + 3];
        if (seg < 2 || i + 2 + seg > n) break;
        if (marker == 0xE1 && seg >= 8 && !memcmp(d + i + 4, "Exif\0\0", 6)) {
            *len = seg - 2;
            return d + i + 4;
        }
        i += 2 + seg;
    }
    return NULL;
}

/* -------------------------------------------------------------------- PNG */
static int decode_png(const uint8_t *data, size_t size, int64_t max_pixels, g4_image *out, uint8_t **exif,
                      size_t *exif_len, g4_error *err) {
    spng_ctx *ctx = spng_ctx_new(0);
    if (!ctx) return g4_fail(err, "out of memory");
    int rc = -1, e;
    uint8_t *raw = NULL;
    struct spng_ihdr ihdr;
    spng_set_chunk_limits(ctx, PNG_CHUNK_LIMIT, PNG_CHUNK_LIMIT);
    if ((e = spng_set_png_buffer(ctx, data, size)) || (e = spng_get_ihdr(ctx, &ihdr))) {
        g4_fail(err, "corrupt PNG: %s", spng_strerror(e));
        goto done;
    }
    if (check_size(ihdr.width, ihdr.height, max_pixels, err)) goto done;
    const int W = (int)ihdr.width, H = (int)ihdr.height;
    if (g4_image_alloc(out, W, H, err)) goto done;
    const size_t npx = (size_t)W * (size_t)H;
    if (ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE && ihdr.bit_depth == 16) {
        /* PIL opens this as 32-bit integers ("I"); convert("RGB") clips them to 0..255 */
        size_t len;
        if ((e = spng_decoded_image_size(ctx, SPNG_FMT_PNG, &len)) || len != npx * 2 || !(raw = malloc(len))) {
            g4_fail(err, e ? "corrupt PNG: %s" : "out of memory", spng_strerror(e));
            goto done;
        }
        if ((e = spng_decode_image(ctx, raw, len, SPNG_FMT_PNG, 0))) {
            g4_fail(err, "corrupt PNG: %s", spng_strerror(e));
            goto done;
        }
        for (size_t i = 0; i < npx; i++) {
            uint16_t v;
            memcpy(&v, raw + 2 * i, 2); /* SPNG_FMT_PNG is host-endian for 16-bit samples */
            uint8_t g = v > 255 ? 255 : (uint8_t)v;
            out->rgb[3 * i] = out->rgb[3 * i + 1] = out->rgb[3 * i + 2] = g;
        }
    } else {
        size_t len;
        if ((e = spng_decoded_image_size(ctx, SPNG_FMT_RGB8, &len)) || len != npx * 3) {
            g4_fail(err, "corrupt PNG: %s", e ? spng_strerror(e) : "unexpected decoded size");
            goto done;
        }
        if ((e = spng_decode_image(ctx, out->rgb, len, SPNG_FMT_RGB8, 0))) {
            g4_fail(err, "corrupt PNG: %s", spng_strerror(e));
            goto done;
        }
    }
    struct spng_exif ex;
    if (spng_get_exif(ctx, &ex) == 0 && ex.length > 0 && (*exif = malloc(ex.length))) {
        memcpy(*exif, ex.data, ex.length);
        *exif_len = ex.length;
    }
    rc = 0;
done:
    if (rc) g4_image_free(out);
    free(raw);
    spng_ctx_free(ctx);
    return rc;
}

/* ------------------------------------------------------------------- WebP */
static int decode_webp(const uint8_t *data, size_t size, int64_t max_pixels, g4_image *out, uint8_t **exif,
                       size_t *exif_len, g4_error *err) {
    WebPBitstreamFeatures feat;
    if (WebPGetFeatures(data, size, &feat) != VP8_STATUS_OK) return g4_fail(err, "corrupt or truncated WebP");
    /* the canvas size (VP8X's for an animation), checked before WebPAnimDecoderNew allocates two RGBA canvases */
    if (check_size(feat.width, feat.height, max_pixels, err)) return -1;
    WebPData wd = {data, size};
    WebPAnimDecoderOptions opt;
    if (!WebPAnimDecoderOptionsInit(&opt)) return g4_fail(err, "libwebp version mismatch");
    opt.color_mode = MODE_RGBA;
    opt.use_threads = 0;
    WebPAnimDecoder *dec = WebPAnimDecoderNew(&wd, &opt);
    if (!dec) return g4_fail(err, "corrupt or truncated WebP");
    int rc = -1;
    WebPAnimInfo info;
    uint8_t *canvas;
    int ts;
    if (!WebPAnimDecoderGetInfo(dec, &info)) {
        g4_fail(err, "corrupt WebP");
        goto done;
    }
    if (check_size(info.canvas_width, info.canvas_height, max_pixels, err)) goto done;
    if (!WebPAnimDecoderGetNext(dec, &canvas, &ts)) {
        g4_fail(err, "corrupt or truncated WebP");
        goto done;
    }
    if (g4_image_alloc(out, (int)info.canvas_width, (int)info.canvas_height, err)) goto done;
    const size_t npx = (size_t)info.canvas_width * info.canvas_height;
    for (size_t i = 0; i < npx; i++) memcpy(out->rgb + 3 * i, canvas + 4 * i, 3);
    WebPChunkIterator it;
    const WebPDemuxer *dmx = WebPAnimDecoderGetDemuxer(dec);
    if (dmx && WebPDemuxGetChunk(dmx, "EXIF", 1, &it)) {
        if (it.chunk.size && (*exif = malloc(it.chunk.size))) {
            memcpy(*exif, it.chunk.bytes, it.chunk.size);
            *exif_len = it.chunk.size;
        }
        WebPDemuxReleaseChunkIterator(&it);
    }
    rc = 0;
done:
    WebPAnimDecoderDelete(dec);
    return rc;
}

/* -------------------------------------------------------------------- GIF */
typedef struct mem_reader {
    const uint8_t *p;
    size_t n, off;
} mem_reader;

static int gif_read(GifFileType *g, GifByteType *buf, int len) {
    mem_reader *r = g->UserData;
    size_t k = r->n - r->off < (size_t)len ? r->n - r->off : (size_t)len;
    memcpy(buf, r->p + r->off, k);
    r->off += k;
    return (int)k;
}

static int decode_gif(const uint8_t *data, size_t size, int64_t max_pixels, g4_image *out, g4_error *err) {
    mem_reader r = {data, size, 0};
    int e = 0;
    GifFileType *g = DGifOpen(&r, gif_read, &e);
    if (!g) return g4_fail(err, "corrupt GIF: %s", GifErrorString(e));
    int rc = -1, transparent = -1;
    uint8_t *idx = NULL;
    if (check_size(g->SWidth, g->SHeight, max_pixels, err)) goto done;
    const int W = g->SWidth, H = g->SHeight;
    for (;;) {
        GifRecordType t;
        if (DGifGetRecordType(g, &t) == GIF_ERROR) goto corrupt;
        if (t == TERMINATE_RECORD_TYPE) {
            g4_fail(err, "the GIF has no image");
            goto done;
        }
        if (t == EXTENSION_RECORD_TYPE) {
            int code;
            GifByteType *ext;
            if (DGifGetExtension(g, &code, &ext) == GIF_ERROR) goto corrupt;
            if (code == GRAPHICS_EXT_FUNC_CODE && ext && ext[0] >= 4) transparent = (ext[1] & 1) ? ext[4] : -1;
            while (ext)
                if (DGifGetExtensionNext(g, &ext) == GIF_ERROR) goto corrupt;
            continue;
        }
        if (t != IMAGE_DESC_RECORD_TYPE) continue;
        if (DGifGetImageDesc(g) == GIF_ERROR) goto corrupt;
        break;
    }
    const GifImageDesc *d = &g->Image;
    if (d->Width <= 0 || d->Height <= 0 || d->Width > 65535 || d->Height > 65535) goto corrupt;
    /* every line of the frame is decompressed, also those outside the canvas: a 1x1 canvas with a frame of
     * 65535x65535 is a 3 MB file that took a minute */
    if (check_size(d->Width, d->Height, max_pixels, err)) goto done;
    /* the canvas starts as the transparent index (else 0), the first frame is drawn into it */
    if (!(idx = malloc((size_t)W * (size_t)H))) {
        g4_fail(err, "out of memory");
        goto done;
    }
    memset(idx, transparent >= 0 ? transparent : 0, (size_t)W * (size_t)H);
    GifPixelType *line = malloc((size_t)d->Width);
    if (!line) {
        g4_fail(err, "out of memory");
        goto done;
    }
    static const int start[4] = {0, 4, 2, 1}, step[4] = {8, 8, 4, 2};
    int passes = d->Interlace ? 4 : 1;
    for (int p = 0; p < passes; p++)
        for (int y = d->Interlace ? start[p] : 0; y < d->Height; y += d->Interlace ? step[p] : 1) {
            if (DGifGetLine(g, line, d->Width) == GIF_ERROR) {
                free(line);
                g4_fail(err, "truncated or corrupt GIF: %s", GifErrorString(g->Error));
                goto done;
            }
            int cy = d->Top + y;
            if (cy < 0 || cy >= H) continue;
            for (int x = 0; x < d->Width; x++) {
                int cx = d->Left + x;
                if (cx >= 0 && cx < W) idx[(size_t)cy * W + cx] = line[x];
            }
        }
    free(line);
    const ColorMapObject *cm = d->ColorMap ? d->ColorMap : g->SColorMap;
    if (g4_image_alloc(out, W, H, err)) goto done;
    for (size_t i = 0; i < (size_t)W * H; i++) {
        uint8_t *o = out->rgb + 3 * i;
        int v = idx[i];
        if (!cm) { /* no palette: PIL reads the indices as gray levels */
            o[0] = o[1] = o[2] = (uint8_t)v;
        } else if (v < cm->ColorCount) {
            o[0] = cm->Colors[v].Red;
            o[1] = cm->Colors[v].Green;
            o[2] = cm->Colors[v].Blue;
        } else {
            o[0] = o[1] = o[2] = 0;
        }
    }
    rc = 0;
    goto done;
corrupt:
    g4_fail(err, "truncated or corrupt GIF: %s", GifErrorString(g->Error));
done:
    free(idx);
    DGifCloseFile(g, &e);
    return rc;
}

/* ------------------------------------------------------------ orientation */
/* EXIF orientation (tag 0x0112 of IFD0) of a TIFF block with or without the "Exif\0\0" prefix; 1 if none. */
static int exif_orientation(const uint8_t *p, size_t n) {
    if (!p || n < 8) return 1;
    uint8_t *buf = malloc(n + 6);
    if (!buf) return 1;
    size_t len = n;
    if (memcmp(p, "Exif\0\0", 6)) { /* libexif wants the APP1 prefix */
        memcpy(buf, "Exif\0\0", 6);
        memcpy(buf + 6, p, n);
        len += 6;
    } else {
        memcpy(buf, p, n);
    }
    int o = 1;
    ExifData *ed = exif_data_new();
    if (ed) {
        exif_data_unset_option(ed, EXIF_DATA_OPTION_FOLLOW_SPECIFICATION); /* read, do not "repair" */
        exif_data_load_data(ed, buf, (unsigned int)len);
        ExifEntry *e = exif_content_get_entry(ed->ifd[EXIF_IFD_0], EXIF_TAG_ORIENTATION);
        if (e && e->format == EXIF_FORMAT_SHORT && e->components >= 1 && e->size >= 2)
            o = exif_get_short(e->data, exif_data_get_byte_order(ed));
        exif_data_unref(ed);
    }
    free(buf);
    return o >= 2 && o <= 8 ? o : 1;
}

/* PIL's exif_transpose: 2 mirror, 3 rotate 180, 4 flip, 5 transpose, 6 rotate 270 (clockwise 90),
 * 7 transverse, 8 rotate 90 (counter-clockwise). out(x, y) = in(sx, sy). */
static int apply_orientation(g4_image *img, int o, g4_error *err) {
    if (o == 1) return 0;
    const int W = img->width, H = img->height, swap = o >= 5;
    g4_image t;
    if (g4_image_alloc(&t, swap ? H : W, swap ? W : H, err)) return -1;
    for (int y = 0; y < t.height; y++)
        for (int x = 0; x < t.width; x++) {
            int sx, sy;
            switch (o) {
            case 2: sx = W - 1 - x; sy = y; break;
            case 3: sx = W - 1 - x; sy = H - 1 - y; break;
            case 4: sx = x; sy = H - 1 - y; break;
            case 5: sx = y; sy = x; break;
            case 6: sx = y; sy = H - 1 - x; break;
            case 7: sx = W - 1 - y; sy = H - 1 - x; break;
            default: sx = W - 1 - y; sy = x; break; /* 8 */
            }
            memcpy(t.rgb + ((size_t)y * t.width + x) * 3, img->rgb + ((size_t)sy * W + sx) * 3, 3);
        }
    g4_image_free(img);
    *img = t;
    return 0;
}

/* ------------------------------------------------------------------ entry */
int g4_image_decode(const void *data, size_t size, const g4_image_limits *limits, g4_image *out, g4_error *err) {
    memset(out, 0, sizeof *out);
    const uint8_t *d = data;
    size_t max_bytes = limits && limits->max_file_bytes ? limits->max_file_bytes : G4_IMAGE_MAX_FILE_BYTES;
    int64_t max_px = limits && limits->max_pixels > 0 ? limits->max_pixels : G4_IMAGE_MAX_PIXELS;
    if (size == 0) return g4_fail(err, "empty file (not an image)");
    if (size > max_bytes)
        return g4_fail(err, "the file has %zu bytes, more than the limit of %zu for an image", size, max_bytes);
    uint8_t *exif = NULL;
    size_t exif_len = 0;
    int rc;
    if (size >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF) {
        rc = decode_jpeg(d, size, max_px, out, err);
        const uint8_t *e = rc ? NULL : jpeg_exif(d, size, &exif_len);
        if (e && (exif = malloc(exif_len))) memcpy(exif, e, exif_len);
    } else if (size >= 8 && !memcmp(d, "\x89PNG\r\n\x1a\n", 8)) {
        rc = decode_png(d, size, max_px, out, &exif, &exif_len, err);
    } else if (size >= 12 && !memcmp(d, "RIFF", 4) && !memcmp(d + 8, "WEBP", 4)) {
        rc = decode_webp(d, size, max_px, out, &exif, &exif_len, err);
    } else if (size >= 6 && (!memcmp(d, "GIF87a", 6) || !memcmp(d, "GIF89a", 6))) {
        rc = decode_gif(d, size, max_px, out, err);
    } else if (size >= 2 && !memcmp(d, "BM", 2)) {
        return g4_fail(err, "BMP images are not supported (JPEG, PNG, WebP and GIF are)");
    } else if (size >= 4 && (!memcmp(d, "II*\0", 4) || !memcmp(d, "MM\0*", 4))) {
        return g4_fail(err, "TIFF images are not supported (JPEG, PNG, WebP and GIF are)");
    } else {
        return g4_fail(err, "not an image (the format is not recognised; JPEG, PNG, WebP and GIF are read)");
    }
    if (rc == 0 && exif) rc = apply_orientation(out, exif_orientation(exif, exif_len), err);
    free(exif);
    if (rc) g4_image_free(out);
    return rc;
}

int g4_image_load(const char *path, const g4_image_limits *limits, g4_image *out, g4_error *err) {
    memset(out, 0, sizeof *out);
    g4_mapped_file f;
    if (g4_map_file(path, &f, err)) return -1;
    int rc = g4_image_decode(f.data, f.size, limits, out, err);
    g4_unmap_file(&f);
    if (rc) g4_fail_prefix(err, "%s", path);
    return rc;
}
