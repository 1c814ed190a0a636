/* The log-mel feature extractor of transformers' Gemma4AudioFeatureExtractor
 * (docs/gemma4-towers.md §3.1, pitfall 10): semicausal framing (160 zeros on the left,
 * 321-sample unfold of which 320 are used), periodic Hann window in fp32, a float64 real
 * FFT (FFTW3) of the fp32 windowed frame zero-padded to fft_length, magnitude, HTK mel
 * filterbank (no norm) in float64, ln(mel + mel_floor), optional per-bin normalisation.
 * Only valid frames are produced: frame i is valid when sample hop*i + frame_length/2 is
 * inside the clip; the invalid rows transformers pads with are zeros the tower ignores. */
#include <fftw3.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/json.h"
#include "core/mapped_file.h"
#include "towers/audio.h"

static pthread_mutex_t fftw_planner = PTHREAD_MUTEX_INITIALIZER; /* FFTW's planner is not thread-safe */

static void set_defaults(g4_audio_features_config *c) {
    memset(c, 0, sizeof *c);
    c->sampling_rate = 16000;
    c->n_mels = 128;
    c->min_frequency = 0.0;
    c->max_frequency = 8000.0;
    c->mel_floor = 1e-3;
    c->input_scale_factor = 1.0;
    c->preemphasis_htk_flavor = 1;
    c->max_samples = 480000;
}

/* frame and hop lengths from milliseconds, fft_length the next power of two (x2 with overdrive) */
static void derive_lengths(g4_audio_features_config *c, double frame_ms, double hop_ms, int overdrive) {
    c->frame_length = (int)lround(c->sampling_rate * frame_ms / 1000.0);
    c->hop_length = (int)lround(c->sampling_rate * hop_ms / 1000.0);
    int f = 1;
    while (f < c->frame_length) f *= 2;
    c->fft_length = overdrive ? 2 * f : f;
}

static int read_bins(const json_t *o, const char *key, int n, double **out, const char *what, g4_error *err) {
    const json_t *a = json_object_get(o, key);
    if (!a || json_is_null(a)) return 0;
    if (!json_is_array(a) || (int)json_array_size(a) != n)
        return g4_fail(err, "%s: \"%s\" must be a list of %d numbers", what, key, n);
    *out = malloc((size_t)n * sizeof **out);
    if (!*out) return g4_fail(err, "out of memory");
    for (int i = 0; i < n; i++) {
        const json_t *v = json_array_get(a, (size_t)i);
        if (!json_is_number(v)) return g4_fail(err, "%s: \"%s\" must be a list of %d numbers", what, key, n);
        (*out)[i] = json_number_value(v);
    }
    return 0;
}

static int parse(const json_t *o, const char *what, g4_audio_features_config *c, g4_error *err) {
    int64_t rate, mels, maxlen;
    double frame_ms, hop_ms;
    int overdrive;
    if (g4_json_int(o, "sampling_rate", 16000, &rate, what, err) || g4_json_int(o, "feature_size", 128, &mels, what, err) ||
        g4_json_num(o, "frame_length_ms", 20.0, &frame_ms, what, err) ||
        g4_json_num(o, "hop_length_ms", 10.0, &hop_ms, what, err) ||
        g4_json_num(o, "min_frequency", 0.0, &c->min_frequency, what, err) ||
        g4_json_num(o, "max_frequency", 8000.0, &c->max_frequency, what, err) ||
        g4_json_num(o, "mel_floor", 1e-3, &c->mel_floor, what, err) ||
        g4_json_num(o, "preemphasis", 0.0, &c->preemphasis, what, err) ||
        g4_json_bool(o, "preemphasis_htk_flavor", 1, &c->preemphasis_htk_flavor, what, err) ||
        g4_json_bool(o, "fft_overdrive", 0, &overdrive, what, err) ||
        g4_json_num(o, "input_scale_factor", 1.0, &c->input_scale_factor, what, err) ||
        g4_json_int(o, "max_length", 480000, &maxlen, what, err))
        return -1;
    if (rate < 1000 || rate > 192000 || mels < 1 || mels > 1024 || !(frame_ms >= 1 && frame_ms <= 1000) ||
        !(hop_ms >= 0.1 && hop_ms <= frame_ms) || maxlen < 16 || maxlen > 100000000 ||
        !(c->min_frequency >= 0 && c->min_frequency < c->max_frequency && c->max_frequency <= rate / 2) ||
        !(c->mel_floor > 0))
        return g4_fail(err, "%s: invalid audio feature settings", what);
    c->sampling_rate = (int)rate;
    c->n_mels = (int)mels;
    c->max_samples = (int)maxlen;
    derive_lengths(c, frame_ms, hop_ms, overdrive);
    return read_bins(o, "per_bin_mean", c->n_mels, &c->per_bin_mean, what, err) ||
           read_bins(o, "per_bin_stddev", c->n_mels, &c->per_bin_stddev, what, err);
}

int g4_audio_features_config_load(const char *dir, g4_audio_features_config *c, g4_error *err) {
    set_defaults(c);
    char path[4096];
    json_t *root = NULL;
    const json_t *o = NULL;
    if (g4_path_join(path, sizeof path, dir, "preprocessor_config.json", err)) return -1;
    if (g4_file_exists(path)) {
        if (g4_json_load_file(path, &root, err)) return -1;
        o = root;
    } else {
        if (g4_path_join(path, sizeof path, dir, "processor_config.json", err)) return -1;
        if (g4_file_exists(path)) {
            if (g4_json_load_file(path, &root, err)) return -1;
            o = json_object_get(root, "feature_extractor");
        }
    }
    if (!o) {
        json_decref(root);
        derive_lengths(c, 20.0, 10.0, 0);
        return 0;
    }
    if (!json_is_object(o)) {
        json_decref(root);
        return g4_fail(err, "%s: the feature extractor settings are not an object", path);
    }
    int rc = parse(o, path, c, err);
    json_decref(root);
    if (rc) g4_audio_features_config_free(c);
    return rc;
}

void g4_audio_features_config_free(g4_audio_features_config *c) {
    free(c->per_bin_mean);
    free(c->per_bin_stddev);
    c->per_bin_mean = c->per_bin_stddev = NULL;
}

int g4_audio_n_frames(const g4_audio_features_config *c, size_t n) {
    const size_t half = (size_t)(c->frame_length / 2);
    return n > half ? (int)((n - half - 1) / (size_t)c->hop_length + 1) : 0;
}

/* numpy.linspace(a, b, num)[i]: a + i*step, the last one exactly b */
static double linspace(double a, double b, int num, int i) {
    return i == num - 1 ? b : a + (double)i * ((b - a) / (double)(num - 1));
}
static double hz_to_mel(double f) { return 2595.0 * log10(1.0 + f / 700.0); }
static double mel_to_hz(double m) { return 700.0 * (pow(10.0, m / 2595.0) - 1.0); }

/* audio_utils.mel_filter_bank(norm=None, mel_scale="htk") transposed: fb [n_mels, n_freq];
 * filter m is nonzero on bins lo[m] .. hi[m]-1 only */
static int mel_bank(const g4_audio_features_config *c, int n_freq, double *fb, int *lo, int *hi) {
    const int M = c->n_mels;
    double *edges = malloc((size_t)(M + 2) * sizeof *edges);
    if (!edges) return -1;
    const double m0 = hz_to_mel(c->min_frequency), m1 = hz_to_mel(c->max_frequency);
    for (int i = 0; i < M + 2; i++) edges[i] = mel_to_hz(linspace(m0, m1, M + 2, i));
    for (int k = 0; k < n_freq; k++) {
        double f = linspace(0.0, (double)(c->sampling_rate / 2), n_freq, k);
        for (int m = 0; m < M; m++) {
            double down = -(edges[m] - f) / (edges[m + 1] - edges[m]);
            double up = (edges[m + 2] - f) / (edges[m + 2] - edges[m + 1]);
            double v = down < up ? down : up;
            fb[(size_t)m * n_freq + k] = v > 0 ? v : 0;
        }
    }
    for (int m = 0; m < M; m++) {
        lo[m] = 0;
        hi[m] = 0;
        for (int k = 0; k < n_freq; k++)
            if (fb[(size_t)m * n_freq + k] > 0) {
                if (hi[m] == 0) lo[m] = k;
                hi[m] = k + 1;
            }
    }
    free(edges);
    return 0;
}

int g4_audio_features(const g4_audio_features_config *c, const float *pcm, size_t n, float *out, g4_error *err) {
    if (n > (size_t)c->max_samples)
        return g4_fail(err, "a clip of %zu samples is longer than the extractor's limit of %d", n, c->max_samples);
    const int frames = g4_audio_n_frames(c, n);
    const int L = c->frame_length, hop = c->hop_length, half = L / 2, nfft = c->fft_length, nf = nfft / 2 + 1,
              M = c->n_mels;
    if (!frames) return 0;
    double *in = fftw_malloc((size_t)nfft * sizeof *in);
    fftw_complex *spec = fftw_malloc((size_t)nf * sizeof *spec);
    double *fb = malloc((size_t)nf * M * sizeof *fb), *mag = malloc((size_t)nf * sizeof *mag);
    float *win = malloc((size_t)L * sizeof *win), *raw = malloc((size_t)(L + 1) * sizeof *raw);
    int *lo = malloc((size_t)M * sizeof *lo), *hi = malloc((size_t)M * sizeof *hi);
    fftw_plan plan = NULL;
    int rc = -1;
    if (!in || !spec || !fb || !mag || !win || !raw || !lo || !hi) {
        g4_fail(err, "out of memory");
        goto done;
    }
    pthread_mutex_lock(&fftw_planner);
    plan = fftw_plan_dft_r2c_1d(nfft, in, spec, FFTW_ESTIMATE);
    pthread_mutex_unlock(&fftw_planner);
    if (!plan) {
        g4_fail(err, "FFTW could not plan a %d-point FFT", nfft);
        goto done;
    }
    if (mel_bank(c, nf, fb, lo, hi)) {
        g4_fail(err, "out of memory");
        goto done;
    }
    /* np.hanning(L + 1)[:-1]: periodic Hann, rounded to fp32 */
    for (int k = 0; k < L; k++) win[k] = (float)(0.5 + 0.5 * cos(M_PI * (double)(2 * k - L) / (double)L));
    const float scale = (float)c->input_scale_factor, pre = (float)c->preemphasis;
    for (int i = 0; i < frames; i++) {
        /* samples of the padded signal [0]*half ++ pcm, from hop*i, 321 of them */
        for (int k = 0; k <= L; k++) {
            long s = (long)i * hop + k - half;
            raw[k] = s >= 0 && (size_t)s < n ? pcm[s] : 0.0f;
            if (scale != 1.0f) raw[k] *= scale;
        }
        for (int k = 0; k < L; k++) {
            float v;
            if (pre <= 0.0f)
                v = raw[k];
            else if (c->preemphasis_htk_flavor)
                v = k == 0 ? raw[0] * (1.0f - pre) : raw[k] - pre * raw[k - 1];
            else
                v = raw[k + 1] - pre * raw[k];
            in[k] = (double)(v * win[k]);
        }
        for (int k = L; k < nfft; k++) in[k] = 0.0;
        fftw_execute(plan);
        for (int k = 0; k < nf; k++) mag[k] = hypot(spec[k][0], spec[k][1]);
        float *o = out + (size_t)i * M;
        for (int m = 0; m < M; m++) {
            double s = 0;
            for (int k = lo[m]; k < hi[m]; k++) s += mag[k] * fb[(size_t)m * nf + k];
            double v = log(s + c->mel_floor);
            if (c->per_bin_mean) v -= c->per_bin_mean[m];
            if (c->per_bin_stddev) v /= c->per_bin_stddev[m];
            o[m] = (float)v;
        }
    }
    rc = 0;
done:
    if (plan) {
        pthread_mutex_lock(&fftw_planner);
        fftw_destroy_plan(plan);
        pthread_mutex_unlock(&fftw_planner);
    }
    fftw_free(in);
    fftw_free(spec);
    free(fb);
    free(mag);
    free(win);
    free(raw);
    free(lo);
    free(hi);
    return rc;
}
