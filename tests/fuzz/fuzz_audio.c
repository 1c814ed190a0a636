/* An audio file of any format libsndfile reads, decoded to mono 16 kHz float PCM
 * (src/towers/audio_decode.c): one line of error, or finite samples. */
#include <math.h>

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    float *pcm = NULL;
    size_t n = 0;
    g4_error err = {{0}};
    int rc = g4_audio_decode(data, size, "input", 16000, &pcm, &n, &err);
    fuzz_expect_error(rc, &err);
    if (rc == 0)
        for (size_t i = 0; i < n; i++) fuzz_expect(isfinite(pcm[i]));
    g4_free(pcm);
    return 0;
}
