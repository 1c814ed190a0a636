/* llama.cpp's multimodal projector files ("mmproj-*.gguf", general.architecture "clip") for Gemma 4: the vision
 * tower that llama.cpp's converter (conversion/gemma.py Gemma4VisionAudioModel, projector type "gemma4v") writes
 * beside the text GGUF, read back into the tensors and config our vision tower binds (docs/mmproj.md).
 *
 * Contract: g4_mmproj_attach opens FILE, checks it is a Gemma 4 vision projector for a text model of hidden size
 * `text_hidden`, renames its tensors to the Hugging Face names (model.vision_tower.*, model.embed_vision.*),
 * undoes the converter's layout changes (the patch embedding's permutation) into buffers the set owns, and adds
 * them to `set` (its file goes with them; call g4_tensor_set_finish afterwards). *vision_config receives a
 * transformers-style vision_config object (new reference). Every problem is a one-line error naming FILE: not a
 * GGUF, a text GGUF, another projector type, missing metadata, wrong shapes. An audio tower in the file
 * (projector "gemma4a", a.* tensors) is not read: *has_audio says it was there. Nothing exits. */
#ifndef G4_FORMATS_GGUF_MMPROJ_H
#define G4_FORMATS_GGUF_MMPROJ_H

#include <jansson.h>

#include "formats/tensor_set.h"

int g4_mmproj_attach(const char *path, int text_hidden, g4_tensor_set *set, json_t **vision_config, int *has_audio,
                     g4_error *err);

/* The one mmproj*.gguf beside a .gguf model file (llama.cpp names them "mmproj-<model>-<type>.gguf"): 1 and its
 * path when there is exactly one, 0 when none, -1 when several (names in `out`, for a message). */
int g4_mmproj_beside(const char *model_path, char *out, size_t cap);

#endif
