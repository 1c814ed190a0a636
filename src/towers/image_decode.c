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

/* What exif_transpose reads besides the pixels: the EXIF block (TIFF, with or without "Exif\0\0") and the XMP
 * packet, each owned (malloc) or NULL. */
typedef struct image_meta {
    uint8_t *exif, *xmp;
    size_t exif_len, xmp_len;
} image_meta;

static void meta_set(uint8_t **dst, size_t *dst_len, const void *src, size_t n) {
    free(*dst);
    *dst = NULL;
    *dst_len = 0;
    if (n && (*dst = malloc(n))) {
        memcpy(*dst, src, n);
        *dst_len = n;
    }
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

/* PIL's JPEG header parse: the first APP1 segment that holds EXIF ("Exif\0\0" + TIFF; later ones only extend it)
 * and the last one that holds XMP ("http://ns.adobe.com/xap/1.0/\0" + packet), up to the start of scan. */
static void jpeg_meta(const uint8_t *d, size_t n, image_meta *m) {
    static const char xmp_id[] = "http://ns.adobe.com/xap/1.0/"; /* and its terminating zero */
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
        const uint8_t *p = d + i + 4;
        const size_t len = seg - 2;
        if (marker == 0xE1 && len >= 6 && !memcmp(p, "Exif\0\0", 6) && !m->exif)
            meta_set(&m->exif, &m->exif_len, p, len);
        else if (marker == 0xE1 && len >= sizeof xmp_id && !memcmp(p, xmp_id, sizeof xmp_id))
            meta_set(&m->xmp, &m->xmp_len, p + sizeof xmp_id, len - sizeof xmp_id);
        i += 2 + seg;
    }
}

/* The bytes of ImageMagick's legacy PNG text "Raw profile type exif" ("\nexif\n   LEN\nHEX..."): PIL reads the hex
 * after the third line break when the file has no eXIf chunk. 0 when it is not valid hex. */
static int raw_profile_exif(const char *t, size_t n, image_meta *m) {
    size_t i = 0;
    for (int lines = 0; lines < 3 && i < n; i++) lines += t[i] == '\n';
    uint8_t *b = malloc(n / 2 + 1);
    if (!b) return 0;
    size_t k = 0;
    int hi = -1;
    for (; i < n; i++) {
        int c = (unsigned char)t[i], v;
        if (c == '\n') continue; /* the lines are joined */
        if (c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f') {
            if (hi >= 0) break; /* whitespace only between the bytes */
            continue;
        }
        if (c >= '0' && c <= '9') v = c - '0';
        else if ((c | 32) >= 'a' && (c | 32) <= 'f') v = (c | 32) - 'a' + 10;
        else break;
        if (hi < 0) {
            hi = v;
        } else {
            b[k++] = (uint8_t)(hi << 4 | v);
            hi = -1;
        }
    }
    int ok = i == n && hi < 0 && k > 0;
    if (ok) meta_set(&m->exif, &m->exif_len, b, k);
    free(b);
    return ok;
}

/* -------------------------------------------------------------------- PNG */
static int decode_png(const uint8_t *data, size_t size, int64_t max_pixels, g4_image *out, image_meta *m,
                      g4_error *err) {
    spng_ctx *ctx = spng_ctx_new(0);
    if (!ctx) return g4_fail(err, "out of memory");
    int rc = -1, e;
    uint8_t *raw = NULL;
    struct spng_ihdr ihdr;
    struct spng_plte *plte = malloc(sizeof *plte);
    if (!plte) {
        spng_ctx_free(ctx);
        return g4_fail(err, "out of memory");
    }
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
    } else if (ihdr.color_type == SPNG_COLOR_TYPE_INDEXED && spng_get_plte(ctx, plte) == 0 &&
               plte->n_entries < (1u << ihdr.bit_depth)) {
        /* indices past the palette (the spec calls them an error; libspng gives black): PIL's palette starts as
         * the gray ramp (i, i, i) and PLTE overwrites only its first entries, so index i past them reads as gray i */
        size_t len;
        const size_t stride = ((size_t)W * ihdr.bit_depth + 7) / 8;
        /* zeroed: libspng deinterlaces rows of 1, 2 and 4 bits by OR-ing the pixels into this buffer */
        if ((e = spng_decoded_image_size(ctx, SPNG_FMT_PNG, &len)) || len != stride * H || !(raw = calloc(1, len))) {
            g4_fail(err, e ? "corrupt PNG: %s" : "out of memory", spng_strerror(e));
            goto done;
        }
        if ((e = spng_decode_image(ctx, raw, len, SPNG_FMT_PNG, 0))) {
            g4_fail(err, "corrupt PNG: %s", spng_strerror(e));
            goto done;
        }
        const int bits = ihdr.bit_depth, mask = (1 << bits) - 1;
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++) {
                const size_t bit = (size_t)x * bits;
                const int v = raw[(size_t)y * stride + bit / 8] >> (8 - bits - (int)(bit % 8)) & mask;
                uint8_t *o = out->rgb + ((size_t)y * W + x) * 3;
                if ((uint32_t)v < plte->n_entries) {
                    o[0] = plte->entries[v].red;
                    o[1] = plte->entries[v].green;
                    o[2] = plte->entries[v].blue;
                } else {
                    o[0] = o[1] = o[2] = (uint8_t)v;
                }
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
    if (spng_get_exif(ctx, &ex) == 0 && ex.length > 0) meta_set(&m->exif, &m->exif_len, ex.data, ex.length);
    /* text chunks (tEXt, zTXt, iTXt, also those after the image data, which PIL reads on load): the XMP packet
     * of the last "XML:com.adobe.xmp" and, without eXIf, ImageMagick's "Raw profile type exif" */
    uint32_t n_text = 0;
    struct spng_text *text = NULL;
    if (spng_get_text(ctx, NULL, &n_text) == 0 && n_text && (text = calloc(n_text, sizeof *text)) &&
        spng_get_text(ctx, text, &n_text) == 0) {
        int raw_exif = 0;
        for (uint32_t i = 0; i < n_text; i++) {
            if (!strcmp(text[i].keyword, "XML:com.adobe.xmp") && text[i].text)
                meta_set(&m->xmp, &m->xmp_len, text[i].text, text[i].length);
            else if (!m->exif && !raw_exif && !strcmp(text[i].keyword, "Raw profile type exif") && text[i].text)
                raw_exif = raw_profile_exif(text[i].text, text[i].length, m);
        }
    }
    free(text);
    rc = 0;
done:
    if (rc) g4_image_free(out);
    free(raw);
    free(plte);
    spng_ctx_free(ctx);
    return rc;
}

/* ------------------------------------------------------------------- WebP */
static int decode_webp(const uint8_t *data, size_t size, int64_t max_pixels, g4_image *out, image_meta *m,
                       g4_error *err) {
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
        meta_set(&m->exif, &m->exif_len, it.chunk.bytes, it.chunk.size);
        WebPDemuxReleaseChunkIterator(&it);
    }
    if (dmx && WebPDemuxGetChunk(dmx, "XMP ", 1, &it)) {
        meta_set(&m->xmp, &m->xmp_len, it.chunk.bytes, it.chunk.size);
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

/* giflib's message for an error code (it has none for some: NULL) */
static const char *gif_error(int code) {
    const char *m = GifErrorString(code);
    return m ? m : "malformed data";
}

static int decode_gif(const uint8_t *data, size_t size, int64_t max_pixels, g4_image *out, g4_error *err) {
    mem_reader r = {data, size, 0};
    int e = 0;
    GifFileType *g = DGifOpen(&r, gif_read, &e);
    if (!g) return g4_fail(err, "corrupt GIF: %s", gif_error(e));
    int rc = -1, transparent = -1;
    uint8_t *idx = NULL;
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
    if (d->Width <= 0 || d->Height <= 0 || d->Width > 65535 || d->Height > 65535 || d->Left < 0 || d->Top < 0) {
        g4_fail(err, "corrupt GIF: its first frame is %dx%d pixels at (%d, %d)", d->Width, d->Height, d->Left, d->Top);
        goto done;
    }
    /* PIL grows the image to hold the first frame where it reaches past the logical screen (a 0x0 screen too).
     * Held to the pixel limit before any line is decompressed: a 1x1 screen with a frame of 65535x65535 is a 3 MB
     * file that took a minute. */
    const int W = g->SWidth > d->Left + d->Width ? g->SWidth : d->Left + d->Width;
    const int H = g->SHeight > d->Top + d->Height ? g->SHeight : d->Top + d->Height;
    if (check_size(W, H, max_pixels, err)) goto done;
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
                g4_fail(err, "truncated or corrupt GIF: %s", gif_error(g->Error));
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
        if (cm && v < cm->ColorCount) {
            o[0] = cm->Colors[v].Red;
            o[1] = cm->Colors[v].Green;
            o[2] = cm->Colors[v].Blue;
        } else { /* no palette, or an index past it: PIL's palette starts as the gray ramp (i, i, i) */
            o[0] = o[1] = o[2] = (uint8_t)v;
        }
    }
    rc = 0;
    goto done;
corrupt:
    g4_fail(err, "truncated or corrupt GIF: %s", gif_error(g->Error));
done:
    free(idx);
    DGifCloseFile(g, &e);
    return rc;
}

/* ------------------------------------------------------------ orientation */
/* Pillow's getexif()[0x0112]: the orientation tag of IFD0 of a TIFF block with or without the "Exif\0\0" prefix,
 * -1 when there is no such tag. PIL reads it whatever its integer type (SHORT as the standard says, also LONG,
 * SBYTE, SSHORT, SLONG; a RATIONAL, FLOAT or DOUBLE equal to an integer compares equal to it), the first value when
 * there are several; BYTE and UNDEFINED come back as bytes and ASCII as text, which select no transposition (0). */
static int exif_orientation(const uint8_t *p, size_t n) {
    if (!p || n < 8) return -1;
    uint8_t *buf = malloc(n + 6);
    if (!buf) return -1;
    size_t len = n;
    if (memcmp(p, "Exif\0\0", 6)) { /* libexif wants the APP1 prefix */
        memcpy(buf, "Exif\0\0", 6);
        memcpy(buf + 6, p, n);
        len += 6;
    } else {
        memcpy(buf, p, n);
    }
    int o = -1;
    ExifData *ed = exif_data_new();
    if (ed) {
        exif_data_unset_option(ed, EXIF_DATA_OPTION_FOLLOW_SPECIFICATION); /* read, do not "repair" */
        exif_data_load_data(ed, buf, (unsigned int)len);
        ExifEntry *e = exif_content_get_entry(ed->ifd[EXIF_IFD_0], EXIF_TAG_ORIENTATION);
        if (e) {
            const ExifByteOrder bo = exif_data_get_byte_order(ed);
            const size_t unit = exif_format_get_size(e->format);
            double v = 0; /* no transposition unless a value below says otherwise */
            if (e->components >= 1 && unit && e->size >= unit && e->data) {
                switch (e->format) {
                case EXIF_FORMAT_SHORT: v = exif_get_short(e->data, bo); break;
                case EXIF_FORMAT_SSHORT: v = exif_get_sshort(e->data, bo); break;
                case EXIF_FORMAT_LONG: v = exif_get_long(e->data, bo); break;
                case EXIF_FORMAT_SLONG: v = exif_get_slong(e->data, bo); break;
                case EXIF_FORMAT_SBYTE: v = (int8_t)e->data[0]; break;
                case EXIF_FORMAT_RATIONAL: {
                    ExifRational r = exif_get_rational(e->data, bo);
                    v = r.denominator ? (double)r.numerator / r.denominator : 0;
                    break;
                }
                case EXIF_FORMAT_SRATIONAL: {
                    ExifSRational r = exif_get_srational(e->data, bo);
                    v = r.denominator ? (double)r.numerator / r.denominator : 0;
                    break;
                }
                case EXIF_FORMAT_FLOAT:
                case EXIF_FORMAT_DOUBLE: {
                    uint8_t raw[8];
                    const int swap = bo == EXIF_BYTE_ORDER_MOTOROLA;
                    for (size_t k = 0; k < unit; k++) raw[k] = e->data[swap ? unit - 1 - k : k];
                    if (unit == 4) {
                        float f;
                        memcpy(&f, raw, 4);
                        v = f;
                    } else {
                        memcpy(&v, raw, 8);
                    }
                    break;
                }
                default: break; /* BYTE, ASCII, UNDEFINED */
                }
            }
            o = v >= 2 && v <= 8 && v == (int)v ? (int)v : 0;
        }
        exif_data_unref(ed);
    }
    free(buf);
    return o;
}

/* Pillow's fallback when the EXIF has no orientation tag: the digit of the first `tiff:Orientation="D` or
 * `tiff:Orientation>D` in the XMP packet (its regex tiff:Orientation(="|>)([0-9])); -1 if none. */
static int xmp_orientation(const uint8_t *p, size_t n) {
    static const char key[] = "tiff:Orientation";
    const size_t k = sizeof key - 1;
    for (size_t i = 0; p && i + k + 1 < n; i++) {
        if (p[i] != 't' || memcmp(p + i, key, k)) continue;
        const uint8_t *q = p + i + k;
        const size_t left = n - i - k;
        if (left >= 3 && q[0] == '=' && q[1] == '"' && q[2] >= '0' && q[2] <= '9') return q[2] - '0';
        if (left >= 2 && q[0] == '>' && q[1] >= '0' && q[1] <= '9') return q[1] - '0';
    }
    return -1;
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
    G4_ARG(out, err);
    memset(out, 0, sizeof *out);
    if (!data && size) return g4_fail(err, "g4_image_decode: data is NULL (%zu bytes)", size);
    const uint8_t *d = data;
    size_t max_bytes = limits && limits->max_file_bytes ? limits->max_file_bytes : G4_IMAGE_MAX_FILE_BYTES;
    int64_t max_px = limits && limits->max_pixels > 0 ? limits->max_pixels : G4_IMAGE_MAX_PIXELS;
    if (size == 0) return g4_fail(err, "empty file (not an image)");
    if (size > max_bytes)
        return g4_fail(err, "the file has %zu bytes, more than the limit of %zu for an image", size, max_bytes);
    image_meta meta = {0};
    int rc;
    if (size >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF) {
        rc = decode_jpeg(d, size, max_px, out, err);
        if (rc == 0) jpeg_meta(d, size, &meta);
    } else if (size >= 8 && !memcmp(d, "\x89PNG\r\n\x1a\n", 8)) {
        rc = decode_png(d, size, max_px, out, &meta, err);
    } else if (size >= 12 && !memcmp(d, "RIFF", 4) && !memcmp(d + 8, "WEBP", 4)) {
        rc = decode_webp(d, size, max_px, out, &meta, err);
    } else if (size >= 6 && (!memcmp(d, "GIF87a", 6) || !memcmp(d, "GIF89a", 6))) {
        rc = decode_gif(d, size, max_px, out, err);
    } else if (size >= 2 && !memcmp(d, "BM", 2)) {
        return g4_fail(err, "BMP images are not supported (JPEG, PNG, WebP and GIF are)");
    } else if (size >= 4 && (!memcmp(d, "II*\0", 4) || !memcmp(d, "MM\0*", 4))) {
        return g4_fail(err, "TIFF images are not supported (JPEG, PNG, WebP and GIF are)");
    } else {
        return g4_fail(err, "not an image (the format is not recognised; JPEG, PNG, WebP and GIF are read)");
    }
    if (rc == 0) { /* ImageOps.exif_transpose: the EXIF tag, else the XMP's */
        int o = exif_orientation(meta.exif, meta.exif_len);
        if (o < 0) o = xmp_orientation(meta.xmp, meta.xmp_len);
        if (o >= 2 && o <= 8) rc = apply_orientation(out, o, err);
    }
    free(meta.exif);
    free(meta.xmp);
    if (rc) g4_image_free(out);
    return rc;
}

int g4_image_load(const char *path, const g4_image_limits *limits, g4_image *out, g4_error *err) {
    G4_ARG(out, err);
    memset(out, 0, sizeof *out);
    G4_ARG(path, err);
    g4_mapped_file f;
    if (g4_map_file(path, &f, err)) return -1;
    int rc = g4_image_decode(f.data, f.size, limits, out, err);
    g4_unmap_file(&f);
    if (rc) g4_fail_prefix(err, "%s", path);
    return rc;
}
