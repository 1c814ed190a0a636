/* The tokenizer's binary cache: one file of sections (what they hold is tok_load.c's
 * business) with a header that ties it to the source tokenizer.json (size, modification
 * time, a hash of its first and last MiB), a format version and a checksum over the whole
 * file. The file is written to a temporary name and renamed into place, so a reader never
 * sees a half-written cache; it is mapped read-only and checked before any use.
 * Layout: tok_cache_header, then the sections, each 8-byte aligned. Native byte order
 * (a cache is a local artifact; the header records the order and a reader rejects another).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tokenizer/tok_internal.h"

#define TOK_CACHE_MAGIC "G4TOKC\r\n"
#define TOK_CACHE_VERSION 2u
#define TOK_CACHE_ENDIAN 0x01020304u
#define TOK_SAMPLE_BYTES (1u << 20)

typedef struct tok_cache_header {
    char magic[8];
    uint32_t version;
    uint32_t endian;
    uint64_t file_size;
    uint64_t src_size;
    int64_t src_mtime_sec;
    int64_t src_mtime_nsec;
    uint64_t src_sample_hash;
    uint64_t param[TOK_CACHE_PARAMS];
    uint64_t sec_off[TOK_CACHE_SECTIONS];
    uint64_t sec_len[TOK_CACHE_SECTIONS];
    uint64_t checksum; /* over the header up to here and everything after the header */
} tok_cache_header;

_Static_assert(sizeof(tok_cache_header) % 8 == 0, "cache header layout");

static uint64_t cache_checksum(const unsigned char *file, size_t size) {
    uint64_t seed = tok_hash_bytes(file, offsetof(tok_cache_header, checksum), 0x6734746f6b63ULL);
    return tok_hash_bytes(file + sizeof(tok_cache_header), size - sizeof(tok_cache_header), seed);
}

/* Hash of the first and last MiB of the source, with its size. */
static int source_sample_hash(const char *path, uint64_t size, uint64_t *out) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t cap = TOK_SAMPLE_BYTES;
    unsigned char *buf = malloc(size < cap ? (size_t)size + 1 : cap);
    if (!buf) {
        close(fd);
        return -1;
    }
    uint64_t h = size * 0x9E3779B97F4A7C15ULL;
    uint64_t starts[2] = {0, size > cap ? size - cap : 0};
    int n_parts = size > cap ? 2 : 1;
    int rc = 0;
    for (int k = 0; k < n_parts && rc == 0; k++) {
        size_t want = size - starts[k] < cap ? (size_t)(size - starts[k]) : cap;
        size_t got = 0;
        while (got < want) {
            ssize_t r = pread(fd, buf + got, want - got, (off_t)(starts[k] + got));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
                rc = -1;
                break;
            }
            got += (size_t)r;
        }
        h = tok_hash_bytes(buf, got, h);
    }
    free(buf);
    close(fd);
    *out = h;
    return rc;
}

static size_t align8(size_t x) { return (x + 7) & ~(size_t)7; }

void tok_cache_close(tok_cache_data *d) {
    if (d->map) munmap(d->map, d->map_size);
    d->map = NULL;
    d->map_size = 0;
}

int tok_cache_open(const char *cache_path, const char *src_path, tok_cache_data *d) {
    memset(d, 0, sizeof *d);
    struct stat src;
    if (stat(src_path, &src) != 0) return -1;
    int fd = open(cache_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < (off_t)sizeof(tok_cache_header) ||
        (uint64_t)st.st_size > ((uint64_t)1 << 36)) {
        close(fd);
        return -1;
    }
    size_t size = (size_t)st.st_size;
    /* cheap checks on the header before mapping the whole file */
    tok_cache_header h;
    if (pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h || memcmp(h.magic, TOK_CACHE_MAGIC, 8) ||
        h.version != TOK_CACHE_VERSION || h.endian != TOK_CACHE_ENDIAN || h.file_size != size ||
        h.src_size != (uint64_t)src.st_size || h.src_mtime_sec != (int64_t)src.st_mtim.tv_sec ||
        h.src_mtime_nsec != (int64_t)src.st_mtim.tv_nsec) {
        close(fd);
        return -1;
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return -1;
    d->map = map;
    d->map_size = size;
    const unsigned char *file = map;
    memcpy(&h, file, sizeof h); /* the mapped bytes are the ones checked */
    uint64_t sample;
    if (h.file_size != size || cache_checksum(file, size) != h.checksum ||
        source_sample_hash(src_path, (uint64_t)src.st_size, &sample) != 0 || sample != h.src_sample_hash)
        goto bad;
    for (int k = 0; k < TOK_CACHE_SECTIONS; k++) {
        if ((h.sec_off[k] & 7) || h.sec_off[k] < sizeof h || h.sec_off[k] > size || h.sec_len[k] > size - h.sec_off[k])
            goto bad;
        d->sec[k].data = file + h.sec_off[k];
        d->sec[k].size = h.sec_len[k];
    }
    memcpy(d->param, h.param, sizeof d->param);
    return 0;
bad:
    tok_cache_close(d);
    return -1;
}

int tok_cache_reseal(unsigned char *file, size_t size, const char *src_path) {
    struct stat src;
    tok_cache_header h;
    if (size < sizeof h || stat(src_path, &src) != 0) return -1;
    memcpy(&h, file, sizeof h);
    h.file_size = size;
    h.src_size = (uint64_t)src.st_size;
    h.src_mtime_sec = (int64_t)src.st_mtim.tv_sec;
    h.src_mtime_nsec = (int64_t)src.st_mtim.tv_nsec;
    if (source_sample_hash(src_path, h.src_size, &h.src_sample_hash) != 0) return -1;
    memcpy(file, &h, sizeof h);
    h.checksum = cache_checksum(file, size);
    memcpy(file, &h, sizeof h);
    return 0;
}

int tok_cache_write(const char *cache_path, const char *src_path, const tok_cache_data *d) {
    struct stat src;
    if (stat(src_path, &src) != 0) return -1;
    tok_cache_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, TOK_CACHE_MAGIC, 8);
    h.version = TOK_CACHE_VERSION;
    h.endian = TOK_CACHE_ENDIAN;
    h.src_size = (uint64_t)src.st_size;
    h.src_mtime_sec = (int64_t)src.st_mtim.tv_sec;
    h.src_mtime_nsec = (int64_t)src.st_mtim.tv_nsec;
    if (source_sample_hash(src_path, h.src_size, &h.src_sample_hash) != 0) return -1;
    memcpy(h.param, d->param, sizeof h.param);
    size_t pos = align8(sizeof h);
    for (int k = 0; k < TOK_CACHE_SECTIONS; k++) {
        h.sec_off[k] = pos;
        h.sec_len[k] = d->sec[k].size;
        pos = align8(pos + d->sec[k].size);
    }
    h.file_size = pos;

    unsigned char *buf = calloc(1, pos);
    if (!buf) return -1;
    for (int k = 0; k < TOK_CACHE_SECTIONS; k++)
        if (d->sec[k].size) memcpy(buf + h.sec_off[k], d->sec[k].data, d->sec[k].size);
    memcpy(buf, &h, sizeof h);
    h.checksum = cache_checksum(buf, pos);
    memcpy(buf, &h, sizeof h);

    static unsigned counter = 0;
    char tmp[PATH_MAX + 64];
    int n = snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", cache_path, (long)getpid(), counter++);
    if (n < 0 || (size_t)n >= sizeof tmp) {
        free(buf);
        return -1;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        free(buf);
        return -1;
    }
    size_t done = 0;
    while (done < pos) {
        ssize_t w = write(fd, buf + done, pos - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        done += (size_t)w;
    }
    free(buf);
    if (close(fd) != 0 || done != pos || rename(tmp, cache_path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

static int mkdir_p(const char *dir) {
    char buf[PATH_MAX];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof buf) return -1;
    memcpy(buf, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == 0) {
            char c = buf[i];
            buf[i] = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
            buf[i] = c;
        }
    }
    return 0;
}

static char *concat(const char *a, const char *b) {
    size_t n = strlen(a) + strlen(b) + 1;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s%s", a, b);
    return s;
}

char *tok_cache_path(const char *src_path) {
    char real[PATH_MAX];
    const char *key = realpath(src_path, real) ? real : src_path;
    char name[64];
    snprintf(name, sizeof name, "/tokenizer-%016llx.g4c",
             (unsigned long long)tok_hash_bytes(key, strlen(key), 0x70617468ULL));

    const char *forced = getenv("G4_TOKENIZER_CACHE_DIR");
    if (forced && *forced) return mkdir_p(forced) == 0 ? concat(forced, name) : NULL;
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    char dir[PATH_MAX];
    int ok = 0;
    if (xdg && *xdg && xdg[0] == '/')
        ok = snprintf(dir, sizeof dir, "%s/gemma4c", xdg) < (int)sizeof dir;
    else if (home && *home)
        ok = snprintf(dir, sizeof dir, "%s/.cache/gemma4c", home) < (int)sizeof dir;
    return ok ? concat(dir, name) : NULL;
}

int tok_cache_prepare_dir(const char *cache_path) {
    char dir[PATH_MAX];
    size_t n = strlen(cache_path);
    if (n >= sizeof dir) return -1;
    memcpy(dir, cache_path, n + 1);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return 0;
    *slash = 0;
    struct stat st;
    if (stat(dir, &st) == 0) return S_ISDIR(st.st_mode) ? 0 : -1;
    return mkdir_p(dir);
}
