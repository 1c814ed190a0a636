/* MLX folders (docs/formats.md 2): affine-quantized weights and MLX Gemma 4 names.
 * g4_mlx_adopt turns a safetensors tensor set as mlx-lm / mlx-vlm write it into the
 * names and tensors the model binds: every quantized `<p>.weight` (U32) with its
 * `<p>.scales` and `<p>.biases` becomes ONE tensor of dtype G4_MLX<bits> with its logical
 * shape [..., out, in]; `language_model.model.X` becomes `model.language_model.X`, and
 * `experts.switch_glu.{gate,up,down}_proj.weight` become `experts.{gate,up,down}_proj`. */
#ifndef G4_FORMATS_MLX_H
#define G4_FORMATS_MLX_H

#include <jansson.h>

#include "formats/tensor_set.h"

/* 1 if the set holds MLX-named or MLX-quantized tensors. */
int g4_mlx_detect(const g4_tensor_set *set);

/* quant: the config's "quantization" (or "quantization_config") object, or NULL. Bits and
 * group of each module come from its override, else the global values (defaults 4 / 64);
 * every quantized tensor is checked: cols(weight)*32/bits == cols(scales)*group. */
int g4_mlx_adopt(g4_tensor_set *set, const json_t *quant, g4_error *err);

#endif
