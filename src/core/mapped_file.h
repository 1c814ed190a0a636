/* Read-only memory-mapped files. */
#ifndef G4_CORE_MAPPED_FILE_H
#define G4_CORE_MAPPED_FILE_H

#include <stddef.h>

#include "gemma4c.h"

typedef struct g4_mapped_file {
    const unsigned char *data; /* NULL for an empty file */
    size_t size;
} g4_mapped_file;

int g4_map_file(const char *path, g4_mapped_file *out, g4_error *err);
void g4_unmap_file(g4_mapped_file *f);

/* Reads a whole (small) regular file into a NUL-terminated heap buffer; anything else (a FIFO, a
 * device, a folder) is an error, as for g4_map_file. */
int g4_read_file(const char *path, char **out, size_t *len, g4_error *err);

/* Joins dir and name into buf ("dir/name"); fails if it does not fit. */
int g4_path_join(char *buf, size_t cap, const char *dir, const char *name, g4_error *err);
int g4_file_exists(const char *path);

#endif
