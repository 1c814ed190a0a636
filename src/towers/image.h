/* Images: decoding JPEG, PNG, WebP and GIF files into 8-bit RGB with Debian's libraries
 * (libjpeg-turbo, libspng, libwebp, giflib; EXIF orientation through libexif), the way
 * transformers' load_image sees them (docs/gemma4-towers.md 2.1): PIL open, EXIF transpose,
 * convert("RGB").
 *
 * What "the way PIL sees them" means, per format:
 * - JPEG: libjpeg's default decode (islow IDCT, fancy upsampling); grayscale replicated; CMYK/YCCK read
 *   with Adobe polarity and converted as PIL converts CMYK to RGB. Truncated or corrupt entropy data is an
 *   error (PIL raises "image file is truncated").
 * - PNG: palette and grayscale expanded, alpha dropped (not blended), no gamma; 16-bit samples keep their
 *   high byte, except 16-bit grayscale without alpha, which PIL opens as 32-bit integers and clips to 255
 *   (so values above 255 read as white, as transformers sees them).
 * - WebP: the first frame of the (possibly animated) canvas, alpha dropped.
 * - GIF: the first frame; outside its rectangle the transparent index (else index 0); colours from the
 *   frame's palette (else the global one; without any palette the indices are gray levels).
 * - PNG palette indices past the PLTE entries read as gray (index i -> (i, i, i)): PIL's palette starts as the gray
 *   ramp and PLTE overwrites only its first entries.
 * - The orientation 2..8 is applied as ImageOps.exif_transpose applies what Image.getexif() gives: tag 0x0112 of
 *   the EXIF (JPEG APP1, PNG eXIf or, without it, ImageMagick's "Raw profile type exif" text, WebP EXIF) in any
 *   numeric type PIL compares equal to 2..8; when the EXIF has no such tag, the first tiff:Orientation="D" or
 *   tiff:Orientation>D of the XMP packet (PNG "XML:com.adobe.xmp" text, JPEG APP1 XMP, WebP XMP; Pillow >= 11
 *   for the last two). Not read: XMP in a GIF.
 * Other formats (BMP, TIFF, ...) and anything that is not an image are clear errors. */
#ifndef G4_TOWERS_IMAGE_H
#define G4_TOWERS_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "gemma4c.h"

/* g4_image, g4_image_limits, g4_image_decode, g4_image_load and g4_image_free are public (gemma4c.h). */

#define G4_IMAGE_MAX_FILE_BYTES ((size_t)256 << 20)
#define G4_IMAGE_MAX_PIXELS ((int64_t)89478485)

/* An empty image of the given size (pixels uninitialised); for the processor and tests. */
int g4_image_alloc(g4_image *img, int width, int height, g4_error *err);

#endif
