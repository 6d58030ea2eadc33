// The CPU backend: Highway SIMD kernels (best target chosen at run time), oneTBB threads.
#pragma once

#include <algorithm>
#include <numeric>
#include <thread>
#include <vector>

#include "kiln/backends/cpu/kernel_table.hpp"
#include "kiln/backends/cpu/workspace.hpp"
#include "kiln/runtime/backend.hpp"

namespace kiln {

namespace cpu {
/// Sum of the multiply-add rates of `threads` threads running the FMA loop at the same time.
inline double peak_gflops(int threads) {
  const int n = std::max(1, threads);
  std::vector<double> rates(static_cast<std::size_t>(n));
  std::vector<std::thread> workers;
  for (int t = 0; t < n; ++t)
    workers.emplace_back(
        [&rates, t] { rates[static_cast<std::size_t>(t)] = kernel_table().fma_gflops(0.05); });
  for (std::thread& w : workers) w.join();
  return std::accumulate(rates.begin(), rates.end(), 0.0);
}
} // namespace cpu

/// The CPU backend. Its kernels come from kiln/backends/cpu/implementation.hpp, which one
/// .cpp file of the program must include.
inline Backend cpu_backend() {
  Backend b;
  b.name = "cpu";
  b.kernel = [](Op op) { return cpu::kernel_table().run[op_index(op)]; };
  b.workspace_per_thread = &cpu::workspace_per_thread;
  b.target = [] { return cpu::kernel_table().target_name; };
  b.peak_gflops = &cpu::peak_gflops;
  return b;
}

} // namespace kiln
