/* An image file of any format (src/towers/image_decode.c: JPEG, PNG, WebP, GIF, EXIF orientation)
 * under small limits: one line of error, or an RGB image within them. */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    g4_image_limits lim = {.max_file_bytes = 1 << 20, .max_pixels = 1 << 20};
    g4_image img = {0};
    g4_error err = {{0}};
    int rc = g4_image_decode(data, size, &lim, &img, &err);
    fuzz_expect_error(rc, &err);
    if (rc == 0) {
        fuzz_expect(img.width > 0 && img.height > 0 && (int64_t)img.width * img.height <= lim.max_pixels);
        unsigned sum = 0; /* every byte readable (ASan) */
        for (size_t i = 0; i < (size_t)img.width * (size_t)img.height * 3; i++) sum += img.rgb[i];
        (void)sum;
        g4_image_free(&img);
    }
    return 0;
}
