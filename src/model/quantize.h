/* Writing a model in another weight format: `gemma4c quantize` and random-weight
 * checkpoints (docs/formats.md 1-3). The source is a loaded model (safetensors, MLX or
 * GGUF, any dtype) or random weights for a config; the output is
 *   - a GGUF file in llama.cpp's Gemma 4 layout (types f32, f16, bf16, q8_0, q4_0, q4_1, q5_0,
 *     q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs; 1-D tensors and the router in F32, rows
 *     that are not whole blocks of the type as g4_quant_row_type says: IQ4_NL for q2_k, q3_k and
 *     iq4_xs, Q8_0 for the others when they are whole 32-blocks, else BF16), or
 *   - an mlx-community folder (types mlx2 to mlx6 and mlx8: model.safetensors with MLX names,
 *     config.json with the "quantization" block; routers 8-bit group 64 as mlx-lm does;
 *     tensors whose rows are not whole groups stay BF16), or
 *   - a Hugging Face safetensors folder (types f32, f16, bf16 when OUT is not *.gguf).
 * Every tensor is produced a block of rows at a time: nothing holds a whole model. */
#ifndef G4_MODEL_QUANTIZE_H
#define G4_MODEL_QUANTIZE_H

#include "gemma4c.h"

/* g4_quantize_params and g4_quantize are declared in gemma4c.h. */

#endif
