// The CUDA backend's entry point: every op's device kernels (their host-side launchers), the
// device's peak measurements, and the launch context the launchers read.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kiln/backends/variant_table.hpp"

namespace kiln::cuda {

/// What a kernel launcher needs besides its KernelArgs, set by the CUDA device around each
/// run on the calling thread: the stream to launch on and the device's run counter. A launcher
/// never throws: it records the first failed launch here and the device reports it.
struct LaunchContext {
  cudaStream_t stream = nullptr;
  /// Completed runs of the plan, in device memory: read by kernels that draw per-run random
  /// numbers, so that a replayed CUDA graph draws new ones every run.
  const std::uint64_t* run_counter = nullptr;
  cudaError_t error = cudaSuccess;
  const char* failed_kernel = nullptr;
};

/// The device kernels, with the device's peak measurements.
struct KernelTable : VariantTable {
  /// FP32 multiply-add GFLOP/s of the whole device, measured by a kernel of dependent FMAs.
  double (*fma_gflops)() = nullptr;
  /// Bytes read plus written per second by a device-to-device copy of 256 MiB, in GB/s.
  double (*copy_gbytes_per_s)() = nullptr;
  /// Adds one to a device counter on the current stream (the run counter, after each run).
  void (*count_run)(std::uint64_t* counter) = nullptr;
};

/// The CUDA kernel table. Defined in kiln/backends/cuda/implementation.cuh, which exactly one
/// .cu file of the program includes (the kiln::cuda_kernels library is that file).
const KernelTable& kernel_table();

/// The calling thread's launch context.
LaunchContext& launch_context();

} // namespace kiln::cuda
