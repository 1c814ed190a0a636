/* The GEMV (cuda_gemv.cuh) for half of the quantized weight types: IQ4_NL, IQ4_XS, the codebook layouts, MXF4 and MLX's affine types. */
#include "backend/cuda/cuda_gemv.cuh"

GEMV_TYPE_FUNCTIONS(G4_IQ4_NL)
GEMV_TYPE_FUNCTIONS(G4_IQ4_XS)
GEMV_TYPE_FUNCTIONS(G4_CB4)
GEMV_TYPE_FUNCTIONS(G4_CB4_16)
GEMV_TYPE_FUNCTIONS(G4_MXF4)
GEMV_TYPE_FUNCTIONS(G4_MLX4)
GEMV_TYPE_FUNCTIONS(G4_MLX8)
