// The device's yardsticks, measured on it: the FP32 multiply-add peak and the copy bandwidth
// the profiler divides achieved rates by; and the run counter's increment.
#pragma once

#include <algorithm>
#include <cstdint>

#include <cuda_runtime.h>

#include "kiln/backends/cuda/launch.cuh"

namespace kiln::cuda {

/// Eight independent chains of dependent multiply-adds per thread: enough in flight to keep
/// every FMA pipe busy. The result is written only where it cannot be, so the work stays.
__global__ void fma_chains_kernel(float seed, int rounds, float* sink) {
  float v[8];
  for (int c = 0; c < 8; ++c) v[c] = seed + static_cast<float>(threadIdx.x + c);
  for (int r = 0; r < rounds; ++r)
#pragma unroll
    for (int c = 0; c < 8; ++c) v[c] = fmaf(v[c], 0.999f, 0.001f);
  float total = 0.0f;
  for (int c = 0; c < 8; ++c) total += v[c];
  if (total == 1234.5f) *sink = total;
}

/// Milliseconds of the work `enqueue` puts on `stream`, by events around it; -1 on failure.
template <class Enqueue> float timed_ms(cudaStream_t stream, const Enqueue& enqueue) {
  cudaEvent_t start = nullptr, stop = nullptr;
  float ms = -1.0f;
  if (cudaEventCreate(&start) == cudaSuccess && cudaEventCreate(&stop) == cudaSuccess) {
    cudaEventRecord(start, stream);
    enqueue();
    cudaEventRecord(stop, stream);
    if (cudaEventSynchronize(stop) != cudaSuccess ||
        cudaEventElapsedTime(&ms, start, stop) != cudaSuccess)
      ms = -1.0f;
  }
  if (start) cudaEventDestroy(start);
  if (stop) cudaEventDestroy(stop);
  return ms;
}

/// FP32 GFLOP/s of multiply-adds over every multiprocessor: the best of three launches.
inline double device_fma_gflops() {
  int device = 0, processors = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&processors, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return 0.0;
  float* sink = nullptr;
  if (cudaMalloc(&sink, sizeof(float)) != cudaSuccess) return 0.0;
  const int blocks = processors * 8, threads = 256, rounds = 4096;
  double best = 0.0;
  for (int pass = 0; pass < 3; ++pass) {
    const float ms =
        timed_ms(nullptr, [&] { fma_chains_kernel<<<blocks, threads>>>(1.0f, rounds, sink); });
    if (ms > 0.0f)
      best = std::max(best, 2.0 * 8.0 * rounds * blocks * threads / (ms * 1e-3) * 1e-9);
  }
  cudaFree(sink);
  return best;
}

/// Bytes read plus written per second by a device-to-device copy of 256 MiB: the best of three.
inline double device_copy_gbytes_per_s() {
  const std::size_t bytes = std::size_t{256} << 20;
  void* from = nullptr;
  void* to = nullptr;
  double best = 0.0;
  if (cudaMalloc(&from, bytes) == cudaSuccess && cudaMalloc(&to, bytes) == cudaSuccess) {
    for (int pass = 0; pass < 3; ++pass) {
      const float ms = timed_ms(
          nullptr, [&] { cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, nullptr); });
      if (ms > 0.0f) best = std::max(best, 2.0 * static_cast<double>(bytes) / (ms * 1e-3) * 1e-9);
    }
  }
  if (from) cudaFree(from);
  if (to) cudaFree(to);
  return best;
}

__global__ void count_run_kernel(std::uint64_t* counter) { *counter += 1; }

/// Adds one to the run counter after a run's kernels, on the context's stream: a replayed
/// CUDA graph counts its runs as plain launches do.
inline void count_run(std::uint64_t* counter) {
  launch("count_run", &count_run_kernel, 1, 1, 0, counter);
}

inline void register_measurements(KernelTable& table) {
  table.fma_gflops = &device_fma_gflops;
  table.copy_gbytes_per_s = &device_copy_gbytes_per_s;
  table.count_run = &count_run;
}

} // namespace kiln::cuda
