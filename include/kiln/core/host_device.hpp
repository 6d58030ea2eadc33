// KILN_HOST_DEVICE: marks a function that the CUDA kernels call as well as host code, so an
// elementwise op's one line of arithmetic serves the scalar, SIMD and CUDA kernels alike.
#pragma once

#if defined(__CUDACC__)
#define KILN_HOST_DEVICE __host__ __device__
#else
#define KILN_HOST_DEVICE
#endif
