// The CUDA kernels as one translation unit, built into the kiln::cuda_kernels library.
#include "kiln/backends/cuda/implementation.cuh"
