/* Audio files to mono float PCM at the model's rate (docs/gemma4-towers.md §3.1, "files are
 * decoded/resampled by transformers load_audio"). Decoding is libsndfile's (16-bit PCM
 * becomes int16 / 32768, as the reference); channels are averaged (librosa's to_mono);
 * other rates go through libsoxr at HQ quality, librosa's default resampler, and the
 * result has ceil(n * rate / rate_in) samples (librosa's fix_length). */
#include <sndfile.h>
#include <soxr.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/mapped_file.h"
#include "towers/audio.h"

/* libsndfile reads from memory through these callbacks. */
typedef struct {
    const unsigned char *data;
    sf_count_t size, pos;
} memory_file;

static sf_count_t mf_length(void *user) { return ((memory_file *)user)->size; }
static sf_count_t mf_tell(void *user) { return ((memory_file *)user)->pos; }
static sf_count_t mf_seek(sf_count_t off, int whence, void *user) {
    memory_file *f = user;
    sf_count_t base = whence == SEEK_CUR ? f->pos : whence == SEEK_END ? f->size : 0;
    sf_count_t p = base + off;
    if (p < 0 || p > f->size) return -1;
    return f->pos = p;
}
static sf_count_t mf_read(void *ptr, sf_count_t count, void *user) {
    memory_file *f = user;
    sf_count_t k = f->size - f->pos < count ? f->size - f->pos : count;
    if (k <= 0) return 0;
    memcpy(ptr, f->data + f->pos, (size_t)k);
    f->pos += k;
    return k;
}
static sf_count_t mf_write(const void *ptr, sf_count_t count, void *user) { return 0; }

/* Reads every frame (the header's count may be an estimate for compressed formats) and
 * averages the channels. */
static int read_mono(SNDFILE *sf, const SF_INFO *info, const char *name, float **out, size_t *n, g4_error *err) {
    const int ch = info->channels;
    const size_t limit = (size_t)G4_AUDIO_MAX_SECONDS * (size_t)info->samplerate;
    size_t cap = info->frames > 0 && (size_t)info->frames <= limit ? (size_t)info->frames : 65536, len = 0;
    float *mono = malloc(cap * sizeof *mono), *buf = malloc((size_t)4096 * ch * sizeof *buf);
    if (!mono || !buf) goto oom;
    for (;;) {
        sf_count_t got = sf_readf_float(sf, buf, 4096);
        if (got <= 0) break;
        if (len + (size_t)got > limit) {
            free(mono);
            free(buf);
            return g4_fail(err, "%s: the audio is longer than %d s", name, G4_AUDIO_MAX_SECONDS);
        }
        if (len + (size_t)got > cap) {
            while (len + (size_t)got > cap) cap *= 2;
            float *p = realloc(mono, cap * sizeof *p);
            if (!p) goto oom;
            mono = p;
        }
        for (sf_count_t i = 0; i < got; i++) {
            float s = 0;
            for (int c = 0; c < ch; c++) s += buf[i * ch + c];
            mono[len + (size_t)i] = ch == 1 ? s : s / (float)ch;
        }
        len += (size_t)got;
    }
    free(buf);
    if (sf_error(sf) != SF_ERR_NO_ERROR) {
        free(mono);
        return g4_fail(err, "%s: cannot decode the audio: %s", name, sf_strerror(sf));
    }
    if (!len) {
        free(mono);
        return g4_fail(err, "%s: the audio holds no samples", name);
    }
    for (size_t i = 0; i < len; i++)
        if (!(mono[i] == mono[i]) || mono[i] > 1e30f || mono[i] < -1e30f) {
            free(mono);
            return g4_fail(err, "%s: the audio holds samples that are not finite numbers", name);
        }
    *out = mono;
    *n = len;
    return 0;
oom:
    free(mono);
    free(buf);
    return g4_fail(err, "%s: out of memory", name);
}

static int resample(const float *in, size_t n, int rate_in, int rate, const char *name, float **out, size_t *n_out,
                    g4_error *err) {
    size_t want = (size_t)(((unsigned long long)n * (unsigned)rate + (unsigned)rate_in - 1) / (unsigned)rate_in);
    float *y = calloc(want ? want : 1, sizeof *y);
    if (!y) return g4_fail(err, "%s: out of memory", name);
    soxr_io_spec_t io = soxr_io_spec(SOXR_FLOAT32_I, SOXR_FLOAT32_I);
    soxr_quality_spec_t q = soxr_quality_spec(SOXR_HQ, 0);
    size_t done = 0;
    soxr_error_t e = soxr_oneshot((double)rate_in, (double)rate, 1, in, n, NULL, y, want, &done, &io, &q, NULL);
    if (e) {
        free(y);
        return g4_fail(err, "%s: resampling from %d Hz failed: %s", name, rate_in, e);
    }
    /* fewer samples than librosa's length: the rest stays zero, as its fix_length pads */
    *out = y;
    *n_out = want;
    return 0;
}

int g4_audio_decode(const void *data, size_t size, const char *name, int rate, float **out, size_t *n, g4_error *err) {
    *out = NULL;
    *n = 0;
    if (!name) name = "audio";
    if (rate < 1000 || rate > 1536000) return g4_fail(err, "%s: cannot decode to %d Hz", name, rate);
    memory_file mf = {data, (sf_count_t)size, 0};
    SF_VIRTUAL_IO vio = {mf_length, mf_seek, mf_read, mf_write, mf_tell};
    SF_INFO info;
    memset(&info, 0, sizeof info);
    SNDFILE *sf = sf_open_virtual(&vio, SFM_READ, &info, &mf);
    if (!sf) return g4_fail(err, "%s: not an audio file this build can read (%s)", name, sf_strerror(NULL));
    if (info.channels < 1 || info.channels > 256 || info.samplerate < 1000 || info.samplerate > 1536000) {
        sf_close(sf);
        return g4_fail(err, "%s: unsupported audio layout (%d channels at %d Hz)", name, info.channels, info.samplerate);
    }
    float *mono = NULL;
    size_t len = 0;
    int rc = read_mono(sf, &info, name, &mono, &len, err);
    sf_close(sf);
    if (rc) return -1;
    if (info.samplerate == rate) {
        *out = mono;
        *n = len;
        return 0;
    }
    rc = resample(mono, len, info.samplerate, rate, name, out, n, err);
    free(mono);
    return rc;
}

int g4_audio_load(const char *path, int rate, float **out, size_t *n, g4_error *err) {
    g4_mapped_file f;
    if (g4_map_file(path, &f, err)) return -1;
    int rc = g4_audio_decode(f.data, f.size, path, rate, out, n, err);
    g4_unmap_file(&f);
    return rc;
}
