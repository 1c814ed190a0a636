/* Gemma 4 in GGUF files as llama.cpp writes and reads them (docs/formats.md 3.3):
 * tensor names both ways, the config rebuilt from the metadata, the metadata written
 * from a config. */
#ifndef G4_FORMATS_GGUF_GEMMA4_H
#define G4_FORMATS_GGUF_GEMMA4_H

#include "formats/gguf.h"
#include "model/config.h"

/* The HF name (text decoder, after "model.language_model."; "lm_head.weight" for the
 * untied head) of a GGUF tensor name, and back. -1 when the name is not one of
 * Gemma 4's text tensors (rope_freqs.weight included: it is generated). */
int g4_gemma4_hf_name(const char *gguf_name, char *out, size_t cap);
int g4_gemma4_gguf_name(const char *hf_name, char *out, size_t cap);

/* Opens a gemma4 GGUF as a model: the tensors renamed to "model.<HF name>" (lm_head
 * as is), shapes in row-major order, and a config.json object (model_type gemma4_text)
 * rebuilt from the metadata; a gemma4-assistant GGUF (llama.cpp's drafter: keys under
 * "gemma4-assistant.", nextn.{pre,post}_projection as pre_/post_projection.weight) gives
 * a gemma4_assistant config around it. The caller frees g (g4_gguf_free) and *config. */
int g4_gemma4_gguf_open(const char *path, g4_gguf *g, json_t **config, g4_error *err);

/* gemma4.* hyper-parameters of a text config (the tokenizer keys are written apart); with
 * asst, a drafter's: gemma4-assistant.* and its embedding_length_out, nextn_predict_layers. */
void g4_gemma4_gguf_write_meta(g4_gguf_writer *w, const g4_text_config *c, const g4_assistant_config *asst);

#endif
