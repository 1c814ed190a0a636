/* llama.cpp's multimodal projector files ("mmproj-*.gguf", general.architecture "clip") for Gemma 4: the vision
 * and audio towers that llama.cpp's converter (conversion/gemma.py Gemma4VisionAudioModel, projector types
 * "gemma4v" and "gemma4a") writes beside the text GGUF, and the 12B's encoder-free embedders
 * (Gemma4UnifiedVisionAudioModel, "gemma4uv" and "gemma4ua"), read back into the tensors and configs our towers
 * bind (docs/mmproj.md).
 *
 * Contract: g4_mmproj_attach opens FILE, checks it is a Gemma 4 projector for a text model of hidden size
 * `text_hidden`, renames the tensors of the towers it declares to the Hugging Face names (model.vision_tower.*,
 * model.embed_vision.*, model.audio_tower.*, model.embed_audio.*, model.vision_embedder.*), undoes the converter's
 * changes (the pixel order of the patch embedding and of the unified patch_ln1, softplus of per_dim_scale, the
 * unified position table's axes: into buffers the set owns; the depthwise kernel's shape) and adds them to `set`
 * (its file goes with them; call g4_tensor_set_finish afterwards). *vision_config and *audio_config receive
 * transformers-style config objects (new references: Gemma4VisionConfig / Gemma4AudioConfig, or the unified
 * model's Gemma4UnifiedVisionConfig / Gemma4UnifiedAudioConfig, *unified then 1), NULL for a tower the file does
 * not hold. Every problem is a one-line error naming FILE: not a GGUF, a text GGUF, another projector type,
 * missing metadata, wrong shapes; after an error `set` holds the tensors it held before (the file may stay in it).
 * Nothing exits. */
#ifndef G4_FORMATS_GGUF_MMPROJ_H
#define G4_FORMATS_GGUF_MMPROJ_H

#include <jansson.h>

#include "formats/tensor_set.h"

int g4_mmproj_attach(const char *path, int text_hidden, g4_tensor_set *set, json_t **vision_config,
                     json_t **audio_config, int *unified, g4_error *err);

/* The same for the towers Ollama's converter (convert/convert_gemma4.go) writes into the model file itself, beside
 * the decoder: keys gemma4.vision.* / gemma4.audio.*, the vision tensors under llama.cpp's names, the audio ones
 * partly under Ollama's own (docs/mmproj.md). `meta` is the model file's metadata and `set` (finished) already
 * holds its tensors, the towers' under their GGUF names: those are renamed and converted there, the file is not
 * opened again (after an error some may be renamed: the model is not usable). A file without towers: 0, both
 * configs NULL. */
int g4_mmproj_attach_embedded(const char *path, const json_t *meta, int text_hidden, g4_tensor_set *set,
                              json_t **vision_config, json_t **audio_config, g4_error *err);

/* The one mmproj*.gguf beside a .gguf model file (llama.cpp names them "mmproj-<model>-<type>.gguf"): 1 and its
 * path when there is exactly one, 0 when none, -1 when several (names in `out`, for a message). */
int g4_mmproj_beside(const char *model_path, char *out, size_t cap);

#endif
