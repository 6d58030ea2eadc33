// The one translation unit of the CUDA backend: exactly one .cu file of a program includes this
// (the kiln::cuda_kernels library is that file). nvcc compiles every device kernel here.
#pragma once

#include "kiln/backends/cuda/elementwise.cuh"
#include "kiln/backends/cuda/gemm.cuh"
#include "kiln/backends/cuda/kernel_table.hpp"
#include "kiln/backends/cuda/peak.cuh"
#include "kiln/backends/cuda/pool.cuh"
#include "kiln/backends/cuda/reduce.cuh"
#include "kiln/backends/cuda/softmax.cuh"
#include "kiln/backends/cuda/transpose.cuh"

namespace kiln::cuda {

const KernelTable& kernel_table() {
  static const KernelTable table = [] {
    KernelTable t;
    register_elementwise_kernels(t);
    register_gemm_kernels(t);
    register_pool_kernels(t);
    register_reduce_kernels(t);
    register_softmax_kernels(t);
    register_transpose_kernels(t);
    register_measurements(t);
    return t;
  }();
  return table;
}

LaunchContext& launch_context() {
  thread_local LaunchContext context;
  return context;
}

} // namespace kiln::cuda
