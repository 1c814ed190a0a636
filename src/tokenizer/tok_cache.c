/* The tokenizer's binary cache: one file of sections (what they hold is tok_load.c's
 * business) with a header that ties it to the content of its source (a 128-bit key: the bytes of a
 * tokenizer.json, or the tokenizer keys of a GGUF file, tok_gguf.c), a format version and a checksum
 * over the whole file. The file is named by the key, so every copy of a tokenizer (the same
 * tokenizer.json in two folders, GGUF files of one model in several types) shares one cache, and a
 * changed source is a different key. The file is written to a temporary name and renamed into
 * place, so a reader never sees a half-written cache; it is mapped read-only and checked before any
 * use. The folder keeps the TOK_CACHE_KEEP caches used last (a hit renews a file's time; a write
 * removes the oldest beyond that), so it does not grow with every model file ever opened.
 * Layout: tok_cache_header, then the sections, each 8-byte aligned. Native byte order
 * (a cache is a local artifact; the header records the order and a reader rejects another).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tokenizer/tok_internal.h"

#define TOK_CACHE_MAGIC "G4TOKC\r\n"
#define TOK_CACHE_VERSION 3u
#define TOK_CACHE_ENDIAN 0x01020304u
#define TOK_CACHE_KEEP 16
#define TOK_KEY_SEED0 0x67346b6579306bULL
#define TOK_KEY_SEED1 0x9E3779B97F4A7C15ULL

typedef struct tok_cache_header {
    char magic[8];
    uint32_t version;
    uint32_t endian;
    uint64_t file_size;
    uint64_t src_key[2];
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

void tok_key_init(tok_source_key *k, uint64_t domain) {
    k->h[0] = TOK_KEY_SEED0 ^ domain;
    k->h[1] = TOK_KEY_SEED1 + domain;
}

void tok_key_add(tok_source_key *k, const void *data, size_t len) {
    /* (tok_hash_bytes mixes the length in: a sequence of parts is not the same key as their join) */
    k->h[0] = tok_hash_bytes(data, len, k->h[0]);
    k->h[1] = tok_hash_bytes(data, len, k->h[1] ^ 0x5bd1e9955bd1e995ULL);
}

int tok_key_file(const char *path, uint64_t domain, tok_source_key *k) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* (a FIFO: not waited on, refused below) */
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return -1;
    }
    tok_key_init(k, domain);
    size_t size = (size_t)st.st_size;
    void *map = size ? mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (map == MAP_FAILED) return -1;
    tok_key_add(k, map, size);
    if (map) munmap(map, size);
    return 0;
}

static size_t align8(size_t x) { return (x + 7) & ~(size_t)7; }

void tok_cache_close(tok_cache_data *d) {
    if (d->map) munmap(d->map, d->map_size);
    d->map = NULL;
    d->map_size = 0;
}

int tok_cache_open(const char *cache_path, const tok_source_key *key, tok_cache_data *d) {
    memset(d, 0, sizeof *d);
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
        h.src_key[0] != key->h[0] || h.src_key[1] != key->h[1]) {
        close(fd);
        return -1;
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    if (map == MAP_FAILED) {
        close(fd);
        return -1;
    }
    d->map = map;
    d->map_size = size;
    const unsigned char *file = map;
    memcpy(&h, file, sizeof h); /* the mapped bytes are the ones checked */
    if (h.file_size != size || h.src_key[0] != key->h[0] || h.src_key[1] != key->h[1] ||
        cache_checksum(file, size) != h.checksum)
        goto bad;
    for (int k = 0; k < TOK_CACHE_SECTIONS; k++) {
        if ((h.sec_off[k] & 7) || h.sec_off[k] < sizeof h || h.sec_off[k] > size || h.sec_len[k] > size - h.sec_off[k])
            goto bad;
        d->sec[k].data = file + h.sec_off[k];
        d->sec[k].size = h.sec_len[k];
    }
    memcpy(d->param, h.param, sizeof d->param);
    (void)futimens(fd, NULL); /* used now: kept longest when the folder is pruned (a read-only folder: as it was) */
    close(fd);
    return 0;
bad:
    close(fd);
    tok_cache_close(d);
    return -1;
}

int tok_cache_reseal(unsigned char *file, size_t size, const tok_source_key *key) {
    tok_cache_header h;
    if (size < sizeof h) return -1;
    memcpy(&h, file, sizeof h);
    h.file_size = size;
    h.src_key[0] = key->h[0];
    h.src_key[1] = key->h[1];
    memcpy(file, &h, sizeof h);
    h.checksum = cache_checksum(file, size);
    memcpy(file, &h, sizeof h);
    return 0;
}

typedef struct cache_entry {
    struct timespec used;
    char name[256];
} cache_entry;

static int older_first(const void *a, const void *b) {
    const struct timespec *x = &((const cache_entry *)a)->used, *y = &((const cache_entry *)b)->used;
    return x->tv_sec != y->tv_sec ? (x->tv_sec < y->tv_sec ? -1 : 1) : (x->tv_nsec > y->tv_nsec) - (x->tv_nsec < y->tv_nsec);
}

static int has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* Removes the caches beside cache_path (tokenizer-*.g4c) used least recently beyond the newest TOK_CACHE_KEEP, and
 * temporary files a killed writer left (older than an hour). Best effort: a file another process removes first, or
 * a folder that cannot be read, is passed over. */
static void prune(const char *cache_path) {
    char dir[PATH_MAX];
    const char *slash = strrchr(cache_path, '/');
    size_t n = slash ? (size_t)(slash - cache_path) : 0;
    if (!slash || n == 0 || n >= sizeof dir) return;
    memcpy(dir, cache_path, n);
    dir[n] = 0;
    DIR *dp = opendir(dir);
    if (!dp) return;
    cache_entry *e = NULL;
    size_t count = 0, cap = 0;
    time_t now = time(NULL);
    const struct dirent *de;
    while ((de = readdir(dp)) != NULL) {
        if (strncmp(de->d_name, "tokenizer-", 10) || strlen(de->d_name) >= sizeof e->name) continue;
        char path[PATH_MAX + 300];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        if (strstr(de->d_name, ".g4c.tmp.")) {
            if (now - st.st_mtim.tv_sec > 3600) unlink(path);
            continue;
        }
        if (!has_suffix(de->d_name, ".g4c")) continue;
        if (count == cap) {
            size_t c2 = cap ? cap * 2 : 32;
            cache_entry *e2 = realloc(e, c2 * sizeof *e);
            if (!e2) break;
            e = e2;
            cap = c2;
        }
        e[count].used = st.st_mtim;
        snprintf(e[count].name, sizeof e[count].name, "%s", de->d_name);
        count++;
    }
    closedir(dp);
    if (count > TOK_CACHE_KEEP) {
        qsort(e, count, sizeof *e, older_first);
        for (size_t i = 0; i < count - TOK_CACHE_KEEP; i++) {
            char path[PATH_MAX + 300];
            snprintf(path, sizeof path, "%s/%s", dir, e[i].name);
            if (strcmp(path, cache_path)) unlink(path); /* (never the one just written) */
        }
    }
    free(e);
}

int tok_cache_write(const char *cache_path, const tok_source_key *key, const tok_cache_data *d) {
    tok_cache_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, TOK_CACHE_MAGIC, 8);
    h.version = TOK_CACHE_VERSION;
    h.endian = TOK_CACHE_ENDIAN;
    h.src_key[0] = key->h[0];
    h.src_key[1] = key->h[1];
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
    prune(cache_path);
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

char *tok_cache_path(const tok_source_key *key) {
    char name[64];
    snprintf(name, sizeof name, "/tokenizer-%016llx%016llx.g4c", (unsigned long long)key->h[0],
             (unsigned long long)key->h[1]);

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
