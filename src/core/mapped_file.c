#include "core/mapped_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

/* A descriptor of path, opened for reading, when it is a regular file (a FIFO would wait for a writer, /dev/zero never
 * ends): its size in *size (size may be NULL); -1 with the error otherwise. */
static int open_regular(const char *path, off_t *size, g4_error *err) {
    /* O_NONBLOCK: a FIFO is refused below instead of waiting for a writer (regular files read as usual) */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return g4_fail(err, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return g4_fail(err, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return g4_fail(err, "%s: not a regular file", path);
    }
    if (size) *size = st.st_size;
    return fd;
}

int g4_map_file(const char *path, g4_mapped_file *out, g4_error *err) {
    out->data = NULL;
    out->size = 0;
    off_t size = 0;
    int fd = open_regular(path, &size, err);
    if (fd < 0) return -1;
    if (size == 0) {
        close(fd);
        return 0;
    }
    void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) return g4_fail(err, "%s: mmap failed: %s", path, strerror(e));
    out->data = p;
    out->size = (size_t)size;
    return 0;
}

void g4_unmap_file(g4_mapped_file *f) {
    if (f->data) munmap((void *)f->data, f->size);
    f->data = NULL;
    f->size = 0;
}

int g4_read_file(const char *path, char **out, size_t *len, g4_error *err) {
    *out = NULL;
    int fd = open_regular(path, NULL, err);
    if (fd < 0) return -1;
    FILE *fp = fdopen(fd, "rb");
    if (!fp) {
        int e = errno;
        close(fd);
        return g4_fail(err, "%s: %s", path, strerror(e));
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        fclose(fp);
        return g4_fail(err, "%s: out of memory", path);
    }
    for (;;) {
        size_t got = fread(buf + n, 1, cap - n, fp);
        n += got;
        if (n < cap) {
            if (ferror(fp)) {
                free(buf);
                fclose(fp);
                return g4_fail(err, "%s: read error", path);
            }
            break;
        }
        char *nb = realloc(buf, cap * 2 + 1);
        if (!nb) {
            free(buf);
            fclose(fp);
            return g4_fail(err, "%s: out of memory", path);
        }
        buf = nb;
        cap *= 2;
    }
    fclose(fp);
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return 0;
}

int g4_path_join(char *buf, size_t cap, const char *dir, const char *name, g4_error *err) {
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap) return g4_fail(err, "path too long: %s/%s", dir, name);
    return 0;
}

int g4_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}
