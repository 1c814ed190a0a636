/* A set of named tensors read from one or more files (safetensors shards today;
 * MLX folders and GGUF later). Tensors are views into memory-mapped files. */
#ifndef G4_FORMATS_TENSOR_SET_H
#define G4_FORMATS_TENSOR_SET_H

#include "core/mapped_file.h"
#include "core/tensor.h"
#include "gemma4c.h"

typedef struct g4_tensor_set {
    g4_tensor *tensors;    /* sorted by name once g4_tensor_set_finish ran */
    int n_tensors, cap_tensors;
    g4_mapped_file *files; /* every file the tensors point into */
    char **file_paths;
    int n_files, cap_files;
    int *file_of;          /* file index of each tensor (parallel to tensors) */
    void **owned;          /* heap buffers tensors point into (converted layouts), freed with the set */
    int n_owned;
} g4_tensor_set;

void g4_tensor_set_free(g4_tensor_set *set);

/* Adds a mapped file to the set (takes ownership); returns its index or -1. */
int g4_tensor_set_add_file(g4_tensor_set *set, g4_mapped_file file, const char *path, g4_error *err);
/* Hands a heap buffer to the set (freed with it); on failure the buffer is freed and -1 returned. */
int g4_tensor_set_own(g4_tensor_set *set, void *buf, g4_error *err);
/* Adds a tensor view (the name is copied). */
int g4_tensor_set_add(g4_tensor_set *set, const g4_tensor *t, int file_index, g4_error *err);
/* Sorts by name and rejects duplicate names across files. */
int g4_tensor_set_finish(g4_tensor_set *set, g4_error *err);
/* Binary search by exact name; NULL if absent. */
const g4_tensor *g4_tensor_set_find(const g4_tensor_set *set, const char *name);
/* Path of the file a tensor lives in (for messages). */
const char *g4_tensor_set_file_of(const g4_tensor_set *set, const g4_tensor *t);

#endif
