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

/* Grows *buf to hold at least `need` floats (doubling); 0 or -1 when out of memory. */
static int reserve(float **buf, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 65536;
    while (c < need) c *= 2;
    float *p = realloc(*buf, c * sizeof *p);
    if (!p) return -1;
    *buf = p;
    *cap = c;
    return 0;
}

/* Reads every frame (the header's count may be an estimate for compressed formats), averages the
 * channels and, at another rate than `rate`, resamples as it reads: only the output is held, so a
 * small compressed file that declares a huge rate (a FLAC of silence at 655 kHz) costs memory in
 * proportion to its duration at `rate`, not at its own rate. libsoxr's stream is the one
 * soxr_oneshot computes (the same filter state, input fed in pieces); librosa's fix_length then
 * gives ceil(n * rate / rate_in) samples, the rest zero. */
static int read_mono(SNDFILE *sf, const SF_INFO *info, int rate, const char *name, float **out, size_t *n,
                     g4_error *err) {
    const int ch = info->channels, rate_in = info->samplerate;
    const size_t limit = (size_t)G4_AUDIO_MAX_SECONDS * (size_t)rate_in, chunk = 4096;
    const double ratio = (double)rate / (double)rate_in;
    soxr_t sx = NULL;
    if (rate_in != rate) {
        soxr_error_t e = NULL;
        soxr_io_spec_t io = soxr_io_spec(SOXR_FLOAT32_I, SOXR_FLOAT32_I);
        soxr_quality_spec_t q = soxr_quality_spec(SOXR_HQ, 0);
        sx = soxr_create((double)rate_in, (double)rate, 1, &e, &io, &q, NULL);
        if (e || !sx) {
            soxr_delete(sx);
            return g4_fail(err, "%s: resampling from %d Hz failed: %s", name, rate_in, e ? e : "out of memory");
        }
    }
    size_t len = 0, olen = 0, cap = 0;
    if (info->frames > 0 && (size_t)info->frames <= limit) /* the declared length, as a first guess */
        cap = (size_t)((double)info->frames * (sx ? ratio : 1.0)) + chunk;
    float *res = NULL, *buf = malloc(chunk * (size_t)ch * sizeof *buf), *mono = sx ? malloc(chunk * sizeof *mono) : NULL;
    if (!buf || (sx && !mono) || (cap && !(res = malloc(cap * sizeof *res)))) goto oom;
    for (;;) {
        sf_count_t got = sf_readf_float(sf, buf, (sf_count_t)chunk);
        if (got <= 0) break;
        if (len + (size_t)got > limit) {
            g4_fail(err, "%s: the audio is longer than %d s", name, G4_AUDIO_MAX_SECONDS);
            goto fail;
        }
        if (!sx && reserve(&res, &cap, len + (size_t)got)) goto oom;
        float *m = sx ? mono : res + len;
        for (sf_count_t i = 0; i < got; i++) {
            float s = 0;
            for (int c = 0; c < ch; c++) s += buf[i * ch + c];
            m[i] = ch == 1 ? s : s / (float)ch;
            if (!(m[i] == m[i]) || m[i] > 1e30f || m[i] < -1e30f) {
                /* NaN and Inf, and finite values so large that the spectrum overflows (transformers would give
                 * NaN soft tokens for them) */
                const int finite = m[i] == m[i] && m[i] > -3.4e38f && m[i] < 3.4e38f;
                g4_fail(err, "%s: the audio holds a sample that is %s", name,
                        finite ? "beyond +-1e30 (the spectrum would overflow)" : "not a finite number (NaN or Inf)");
                goto fail;
            }
        }
        len += (size_t)got;
        /* soxr takes as much input as the output room allows: room for all of it, again until it is taken */
        for (size_t used = 0; sx && used < (size_t)got;) {
            size_t took = 0, done = 0;
            if (reserve(&res, &cap, olen + (size_t)((double)((size_t)got - used) * ratio) + 64)) goto oom;
            soxr_error_t e = soxr_process(sx, mono + used, (size_t)got - used, &took, res + olen, cap - olen, &done);
            if (e) {
                g4_fail(err, "%s: resampling from %d Hz failed: %s", name, rate_in, e);
                goto fail;
            }
            if (!took) {
                g4_fail(err, "%s: resampling from %d Hz took no input", name, rate_in);
                goto fail;
            }
            used += took;
            olen += done;
        }
    }
    if (sf_error(sf) != SF_ERR_NO_ERROR) {
        g4_fail(err, "%s: cannot decode the audio: %s", name, sf_strerror(sf));
        goto fail;
    }
    if (!len) {
        g4_fail(err, "%s: the audio holds no samples", name);
        goto fail;
    }
    size_t want = len;
    if (sx) {
        want = (size_t)(((unsigned long long)len * (unsigned)rate + (unsigned)rate_in - 1) / (unsigned)rate_in);
        while (olen < want) { /* the end of the input: the filter's tail, up to librosa's length */
            size_t done = 0;
            if (reserve(&res, &cap, want)) goto oom;
            soxr_error_t e = soxr_process(sx, NULL, 0, NULL, res + olen, want - olen, &done);
            if (e) {
                g4_fail(err, "%s: resampling from %d Hz failed: %s", name, rate_in, e);
                goto fail;
            }
            if (!done) break;
            olen += done;
        }
        /* fewer samples than librosa's length: the rest is zero, as its fix_length pads */
        if (olen < want) memset(res + olen, 0, (want - olen) * sizeof *res);
    }
    soxr_delete(sx);
    free(buf);
    free(mono);
    *out = res;
    *n = want;
    return 0;
oom:
    g4_fail(err, "%s: out of memory", name);
fail:
    soxr_delete(sx);
    free(buf);
    free(mono);
    free(res);
    return -1;
}

int g4_audio_decode(const void *data, size_t size, const char *name, int rate, float **out, size_t *n, g4_error *err) {
    G4_ARG(out, err);
    G4_ARG(n, err);
    *out = NULL;
    *n = 0;
    if (!name) name = "audio";
    if (!data && size) return g4_fail(err, "%s: data is NULL (%zu bytes)", name, size);
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
    int rc = read_mono(sf, &info, rate, name, out, n, err);
    sf_close(sf);
    return rc;
}

int g4_audio_load(const char *path, int rate, float **out, size_t *n, g4_error *err) {
    G4_ARG(out, err);
    G4_ARG(n, err);
    *out = NULL;
    *n = 0;
    G4_ARG(path, err);
    g4_mapped_file f;
    if (g4_map_file(path, &f, err)) return -1;
    int rc = g4_audio_decode(f.data, f.size, path, rate, out, n, err);
    g4_unmap_file(&f);
    return rc;
}
