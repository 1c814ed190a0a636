#!/usr/bin/env python3
"""Writes image files of many kinds into OUTDIR, with what transformers' load_image (PIL open, EXIF
transpose, convert("RGB")) and the shared numpy reference of the Gemma 4 image processor
(../shared/reference/numpy/imgproc.py: target size, torch's antialiased bicubic uint8 resize) make of them.
tests/test_image.c decodes and resizes the same files and compares.

usage: make_image_cases.py SHARED_DIR OUTDIR
OUTDIR/cases.json: [{"file", "rgb": "x.rgb" (H*W*3 bytes), "width", "height",
                     "resized": [{"budget", "th", "tw", "rgb"}]}, ...]
"""
import io
import json
import os
import re
import struct
import sys
import warnings
import zlib

import numpy as np
from PIL import Image, ImageOps, PngImagePlugin

sys.path.insert(0, os.path.join(sys.argv[1], "reference", "numpy"))
import imgproc  # noqa: E402

OUT = sys.argv[2]
rng = np.random.default_rng(1234)
warnings.filterwarnings("ignore", "Metadata Warning")  # the orientation written twice (exif_short_x2.jpg)


def smooth(h, w, c=3):
    """A photo-like image: smooth gradients plus noise (exercises every resize tap)."""
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 255.0 / max(w - 1, 1)), (y * 255.0 / max(h - 1, 1)),
                     128 + 100 * np.sin(x / 7.0 + y / 11.0), 255.0 - x * 100.0 / max(w, 1)], -1)[..., :c]
    noise = rng.normal(0, 25, size=(h, w, c))
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def raw_png(samples, color_type, depth, width=None, plte=None):
    """A PNG written by hand, for what PIL cannot write (16-bit RGB, 16-bit gray + alpha, 2-bit gray, a palette
    shorter than its indices); samples [h, ...] are the rows (already packed below 8 bits, then `width` gives the
    pixels per row); plte: the PLTE chunk's bytes."""
    h, w = samples.shape[0], width or samples.shape[1]
    big = samples.astype(">u2") if depth == 16 else samples.astype(np.uint8)
    rows = b"".join(b"\0" + big[r].tobytes() for r in range(h))
    ihdr = struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + (png_chunk(b"PLTE", plte) if plte else b"") +
            png_chunk(b"IDAT", zlib.compress(rows)) + png_chunk(b"IEND", b""))


def pack_row(values, depth):
    """One row of samples packed MSB first at 1, 2 or 4 bits (8: as bytes)."""
    if depth == 8:
        return values.astype(np.uint8).tobytes()
    per = 8 // depth
    v = np.zeros(-(-len(values) // per) * per, np.uint8)
    v[:len(values)] = values
    v = v.reshape(-1, per)
    return bytes(sum((v[:, k].astype(np.uint32) << (8 - depth * (k + 1))) for k in range(per)).astype(np.uint8))


def adam7_png(samples, color_type, depth, plte=None):
    """An interlaced (Adam7) PNG of samples [h, w] (unpacked, 8 bits or less), for what PIL cannot write."""
    h, w = samples.shape
    rows = b""
    for x0, y0, dx, dy in ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
                           (0, 1, 1, 2)):
        sub = samples[y0::dy, x0::dx]
        if sub.size:
            rows += b"".join(b"\0" + pack_row(r, depth) for r in sub)
    ihdr = struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0, 1)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + (png_chunk(b"PLTE", plte) if plte else b"") +
            png_chunk(b"IDAT", zlib.compress(rows)) + png_chunk(b"IEND", b""))


def gif_frame(cw, ch, left, top, fw, fh, transparent=None, colors=4):
    """A GIF whose logical screen is cw x ch and whose one frame is fw x fh at (left, top), for what PIL cannot
    write (a frame beyond the screen, a colour table shorter than the indices); a palette of `colors` (2 or 4),
    pixels 1, 2, 3, ... each coded after a clear code (LZW that never grows its table)."""
    pal = bytes(v for i in range(colors) for v in (i * 70 % 256, i * 37 % 256, 255 - i * 60))
    gce = b"" if transparent is None else b"\x21\xf9\x04\x01\x00\x00" + bytes([transparent]) + b"\x00"
    codes = [c for i in range(fw * fh) for c in (4, 1 + i % 3)] + [5]
    acc = nbits = 0
    lzw = bytearray()
    for c in codes:  # 3-bit codes, least significant bit first
        acc |= c << nbits
        nbits += 3
        while nbits >= 8:
            lzw.append(acc & 255)
            acc >>= 8
            nbits -= 8
    if nbits:
        lzw.append(acc)
    blocks = b"".join(bytes([len(lzw[i:i + 255])]) + lzw[i:i + 255] for i in range(0, len(lzw), 255)) + b"\0"
    return (b"GIF89a" + struct.pack("<HHBBB", cw, ch, 0x80 | (colors.bit_length() - 2), 0, 0) + pal + gce + b"\x2c" +
            struct.pack("<HHHHB", left, top, fw, fh, 0) + b"\x02" + blocks + b"\x3b")


def exif_bytes(orientation):
    ex = Image.Exif()
    ex[0x0112] = orientation
    return ex.tobytes()


cases = []


def add(name, data, budgets=(70,), xmp=None):
    """xmp: the XMP packet a JPEG or WebP file carries. Pillow >= 11 keeps it as info["xmp"], and its getexif()
    takes the orientation from it (the first match of tiff:Orientation(="|>)([0-9])) when the EXIF has none, as it
    already does for a PNG's "XML:com.adobe.xmp" text; an older PIL does not, so that rule is applied here."""
    path = os.path.join(OUT, name)
    with open(path, "wb") as f:
        f.write(data)
    im = Image.open(path)
    ex = im.getexif()
    if xmp is not None and 0x0112 not in ex:
        m = re.search(rb'tiff:Orientation(="|>)([0-9])', xmp)
        if m:
            ex[0x0112] = int(m[2])  # the cached Exif that exif_transpose reads
    im = ImageOps.exif_transpose(im)
    rgb = np.asarray(im.convert("RGB"), dtype=np.uint8)
    h, w = rgb.shape[:2]
    rgb.tofile(path + ".rgb")
    entry = {"file": name, "rgb": name + ".rgb", "width": w, "height": h, "resized": []}
    chw = rgb.transpose(2, 0, 1)
    for b in budgets:
        th, tw = imgproc.target_size(h, w, b)
        out = imgproc.resize_uint8(chw, th, tw) if (th, tw) != (h, w) else chw
        fn = "%s.%d.rgb" % (name, b)
        np.ascontiguousarray(out.transpose(1, 2, 0)).tofile(os.path.join(OUT, fn))
        entry["resized"].append({"budget": b, "th": th, "tw": tw, "rgb": fn})
    cases.append(entry)


def pil_bytes(im, fmt, **kw):
    b = io.BytesIO()
    im.save(b, fmt, **kw)
    return b.getvalue()


# PNG: every color type and depth PIL distinguishes
add("rgb.png", pil_bytes(Image.fromarray(smooth(300, 451)), "PNG"), (70, 140, 280, 560, 1120))
add("rgba.png", pil_bytes(Image.fromarray(smooth(97, 133, 4)), "PNG"), (70, 280))
add("gray.png", pil_bytes(Image.fromarray(smooth(120, 80, 1)[..., 0]), "PNG"))
add("gray_alpha.png", pil_bytes(Image.fromarray(smooth(64, 200, 2), "LA"), "PNG"))
add("bilevel.png", pil_bytes(Image.fromarray(smooth(50, 61, 1)[..., 0] > 128), "PNG"))
pal = Image.fromarray(smooth(90, 70)).quantize(16)
add("palette4.png", pil_bytes(pal, "PNG", bits=4))
add("palette_trns.png", pil_bytes(Image.fromarray(smooth(90, 70)).quantize(200), "PNG", transparency=3))
add("gray16.png", raw_png((smooth(40, 52, 1)[..., 0].astype(np.uint16) * 3), 0, 16))      # values > 255 clip
add("rgb16.png", raw_png(smooth(33, 47).astype(np.uint16) * 257 + 3, 2, 16))
add("gray_alpha16.png", raw_png(smooth(33, 47, 2).astype(np.uint16) * 250, 4, 16))
v2 = smooth(20, 24, 1)[..., 0] >> 6                                                       # 2-bit gray
add("gray2.png", raw_png((v2[:, 0::4] << 6) | (v2[:, 1::4] << 4) | (v2[:, 2::4] << 2) | v2[:, 3::4], 0, 2, 24))
add("exif6.png", pil_bytes(Image.fromarray(smooth(60, 100)), "PNG", exif=exif_bytes(6)))
# extreme shapes and sizes
add("tiny.png", pil_bytes(Image.fromarray(smooth(1, 1)), "PNG"), (70, 140))
add("wide.png", pil_bytes(Image.fromarray(smooth(3, 2000)), "PNG"), (70, 280))
add("tall.png", pil_bytes(Image.fromarray(smooth(900, 7)), "PNG"), (140,))
add("exact.png", pil_bytes(Image.fromarray(smooth(384, 384)), "PNG"), (70,))                 # no resize
# widened (2 -> 48) then narrowed in height by 6 (20000 -> 3360): the height pass's window of rows moves down a ring
add("tall_thin.png", pil_bytes(Image.fromarray(smooth(20000, 2)), "PNG"), (70,))
add("photo.png", pil_bytes(Image.fromarray(smooth(768, 1024)), "PNG"), (280,))
# JPEG: subsamplings, grayscale, progressive, CMYK, EXIF orientations
photo = Image.fromarray(smooth(241, 317))
add("q90_420.jpg", pil_bytes(photo, "JPEG", quality=90), (70, 280))
add("q95_444.jpg", pil_bytes(photo, "JPEG", quality=95, subsampling=0))
add("q75_422.jpg", pil_bytes(photo, "JPEG", quality=75, subsampling=1))
add("gray.jpg", pil_bytes(photo.convert("L"), "JPEG", quality=85))
add("progressive.jpg", pil_bytes(photo, "JPEG", quality=80, progressive=True))
add("cmyk.jpg", pil_bytes(photo.convert("CMYK"), "JPEG", quality=90))
for o in range(2, 9):
    add("exif%d.jpg" % o, pil_bytes(Image.fromarray(smooth(37, 53)), "JPEG", quality=90, exif=exif_bytes(o)))
# WebP: lossy, lossless, lossy with alpha
add("lossy.webp", pil_bytes(photo, "WEBP", quality=80))
add("lossless.webp", pil_bytes(photo, "WEBP", lossless=True))
add("alpha.webp", pil_bytes(Image.fromarray(smooth(80, 90, 4)), "WEBP", quality=70))
# GIF: palette, with a transparent index
add("palette.gif", pil_bytes(Image.fromarray(smooth(70, 90)).quantize(64), "GIF"))
add("transparent.gif", pil_bytes(Image.fromarray(smooth(40, 30)).quantize(32), "GIF", transparency=5))

# orientation from elsewhere than a SHORT in the EXIF (ImageOps.exif_transpose reads Image.getexif())
def xmp_packet(orientation, element=False):
    o = ("<tiff:Orientation>%d</tiff:Orientation>" % orientation) if element else ""
    a = "" if element else ' tiff:Orientation="%d"' % orientation
    return ('<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
            '<rdf:Description xmlns:tiff="http://ns.adobe.com/tiff/1.0/"%s>%s</rdf:Description></rdf:RDF></x:xmpmeta>'
            % (a, o)).encode()


def png_text(kind, keyword, text):
    """PIL's PngInfo with one text chunk (iTXt, compressed tEXt = zTXt)."""
    info = PngImagePlugin.PngInfo()
    if kind == "itxt":
        info.add_itxt(keyword, text)
    else:
        info.add_text(keyword, text, zip=True)
    return info


def tiff_orientation(kind, count, value):
    """An EXIF block whose IFD0 holds only the orientation, of TIFF type `kind` (little-endian)."""
    inline = len(value) <= 4
    entry = struct.pack("<HHI", 0x0112, kind, count) + (value.ljust(4, b"\0") if inline else struct.pack("<I", 26))
    return b"Exif\0\0II*\0" + struct.pack("<IH", 8, 1) + entry + struct.pack("<I", 0) + (b"" if inline else value)


def jpeg_with_app1(jpeg, payload):
    return jpeg[:2] + b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload + jpeg[2:]


small = Image.fromarray(smooth(29, 41))
add("xmp6.png", pil_bytes(small, "PNG", pnginfo=png_text("itxt", "XML:com.adobe.xmp", xmp_packet(6).decode())))
add("xmp8_ztxt.png", pil_bytes(small, "PNG",
                               pnginfo=png_text("ztxt", "XML:com.adobe.xmp", xmp_packet(8, True).decode())))
add("xmp6_exif1.png", pil_bytes(small, "PNG", exif=exif_bytes(1),          # the EXIF's tag wins, even 1
                                pnginfo=png_text("itxt", "XML:com.adobe.xmp", xmp_packet(6).decode())))
raw_hex = exif_bytes(5).hex()
raw_text = "\nexif\n%8d\n%s\n" % (len(raw_hex) // 2, "\n".join(raw_hex[i:i + 72] for i in range(0, len(raw_hex), 72)))
# ImageMagick's old way to keep EXIF in a PNG
add("raw_profile5.png", pil_bytes(small, "PNG", pnginfo=png_text("ztxt", "Raw profile type exif", raw_text)))
plain = pil_bytes(small, "JPEG", quality=90)
for o, element in ((8, True), (5, False)):
    packet = xmp_packet(o, element)
    add("xmp%d.jpg" % o, jpeg_with_app1(plain, b"http://ns.adobe.com/xap/1.0/\0" + packet), xmp=packet)
add("xmp7.webp", pil_bytes(small, "WEBP", lossless=True, xmp=xmp_packet(7)), xmp=xmp_packet(7))
for name, kind, count, value in (("long6", 4, 1, struct.pack("<I", 6)), ("sshort8", 8, 1, struct.pack("<h", 8)),
                                 ("rational3", 5, 1, struct.pack("<II", 6, 2)),
                                 ("double5", 12, 1, struct.pack("<d", 5)),
                                 ("short_x2", 3, 2, struct.pack("<HH", 7, 1)), ("byte6", 1, 1, b"\6")):
    add("exif_%s.jpg" % name, jpeg_with_app1(plain, tiff_orientation(kind, count, value)))
# palette indices past the PLTE entries (PIL reads index i there as gray i)
idx = (np.arange(23 * 37).reshape(23, 37) * 7 % 256).astype(np.uint8)
few = b"".join(bytes(c) for c in smooth(1, 5)[0])
add("palette_short.png", raw_png(idx, 3, 8, plte=few))
idx4 = idx % 16
add("palette4_short.png", raw_png((idx4[:, 0:36:2] << 4) | idx4[:, 1:37:2], 3, 4, 36, plte=few))

# GIF frames beyond the logical screen: PIL grows the image to hold the first frame (a 0x0 screen too), the rest
# filled with the transparent index, else 0
add("gif_frame_right.gif", gif_frame(10, 8, 6, 2, 7, 3))
add("gif_frame_beyond_transparent.gif", gif_frame(10, 8, 8, 6, 5, 5, transparent=3))
add("gif_screen_0x0.gif", gif_frame(0, 0, 0, 0, 5, 4))
# indices past a 2-colour table: PIL's palette starts as the gray ramp, so index i reads as gray i (as for PNG)
add("gif_short_table.gif", gif_frame(9, 7, 0, 0, 9, 7, colors=2))
# the same, interlaced at 1, 2 and 4 bits (libspng deinterlaces such rows by OR-ing into its output buffer)
for depth in (1, 2, 4):
    add("palette%d_short_interlaced.png" % depth, adam7_png(idx % (1 << depth), 3, depth, plte=few[:3]))

with open(os.path.join(OUT, "cases.json"), "w") as f:
    json.dump(cases, f, indent=1)
