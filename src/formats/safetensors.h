/* safetensors: single files and sharded folders (model.safetensors.index.json),
 * memory-mapped and validated like the reference reader (docs/formats.md 1.2). */
#ifndef G4_FORMATS_SAFETENSORS_H
#define G4_FORMATS_SAFETENSORS_H

#include "formats/tensor_set.h"

#define G4_SAFETENSORS_MAX_HEADER 100000000u

/* Maps one .safetensors file and adds its tensors to `set`. */
int g4_safetensors_add_file(g4_tensor_set *set, const char *path, g4_error *err);

/* Opens the weights of a model folder: model.safetensors.index.json if present
 * (every listed shard, names checked against the shards), else model.safetensors. */
int g4_safetensors_open_dir(const char *dir, g4_tensor_set *set, g4_error *err);

g4_dtype g4_safetensors_dtype(const char *name);           /* G4_DTYPE_UNKNOWN if not supported */
const char *g4_safetensors_dtype_name(g4_dtype t);

/* The first bytes of a file of these tensors (u64 length + JSON padded to 8; data offsets
 * contiguous in the given order, from nbytes); heap string, its length in *len. */
char *g4_safetensors_header(const g4_tensor *tensors, int n, size_t *len, g4_error *err);

/* Writes tensors (in the given order, contiguous, header padded to 8 bytes). */
int g4_safetensors_write(const char *path, const g4_tensor *tensors, int n, g4_error *err);

#endif
