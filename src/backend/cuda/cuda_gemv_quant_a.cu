/* The GEMV (cuda_gemv.cuh) for half of the quantized weight types: GGUF's Q8_0, Q4_0, Q5_0 and K-quants. */
#include "backend/cuda/cuda_gemv.cuh"

GEMV_TYPE_FUNCTIONS(G4_Q8_0)
GEMV_TYPE_FUNCTIONS(G4_Q4_0)
GEMV_TYPE_FUNCTIONS(G4_Q5_0)
GEMV_TYPE_FUNCTIONS(G4_Q2_K)
GEMV_TYPE_FUNCTIONS(G4_Q4_K)
GEMV_TYPE_FUNCTIONS(G4_Q5_K)
GEMV_TYPE_FUNCTIONS(G4_Q6_K)
