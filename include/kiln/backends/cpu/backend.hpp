// The CPU backend: Highway SIMD kernels (best target chosen at run time), oneTBB threads, host
// memory. It implements the backend contract of plan/backend.hpp.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <oneapi/tbb/info.h>

#include "kiln/backends/cpu/device.hpp"
#include "kiln/backends/cpu/kernel_table.hpp"
#include "kiln/backends/cpu/kernel_work.hpp"
#include "kiln/backends/cpu/variants.hpp"
#include "kiln/plan/backend.hpp"

namespace kiln::cpu {

/// The variant of `table` that runs the call, with its scratch need.
inline KernelChoice select(const KernelTable& table, const KernelQuery& query) {
  return table.select(query, "the CPU");
}

/// select() for a call whose arguments are already laid out (data pointers may be null), for
/// tests and micro-benchmarks that call kernels directly.
inline KernelChoice select(const KernelTable& table, Op op, const KernelArgs& args,
                           Precision precision = Precision::f32) {
  return table.select(op, args, "the CPU", precision);
}

/// Sum of the multiply-add rates of `threads` threads running the FMA loop at the same time:
/// the best of three passes, since on a shared machine a pass may lose a core for a moment.
inline double peak_gflops(const KernelTable& table, int threads) {
  const int n = std::max(1, threads);
  double best = 0.0;
  for (int pass = 0; pass < 3; ++pass) {
    std::vector<double> rates(static_cast<std::size_t>(n));
    std::vector<std::thread> workers;
    for (int t = 0; t < n; ++t)
      workers.emplace_back(
          [&rates, &table, t] { rates[static_cast<std::size_t>(t)] = table.fma_gflops(0.05); });
    for (std::thread& w : workers) w.join();
    best = std::max(best, std::accumulate(rates.begin(), rates.end(), 0.0));
  }
  return best;
}

/// Bytes read plus written per second by `threads` threads each copying its own part of a
/// buffer of `bytes` `repeats` times over (64 MiB once: far larger than the caches; 4 MiB many
/// times: within them, after a first pass brought it there): the best of three passes, in GB/s.
inline double copy_gbytes_per_s(int threads, std::size_t bytes, int repeats) {
  const int n = std::max(1, threads);
  const std::size_t part = bytes / static_cast<std::size_t>(n);
  std::vector<char> from(bytes, 1), to(bytes, 0);
  double best = 0.0;
  for (int pass = 0; pass < 3; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> workers;
    for (int t = 0; t < n; ++t) {
      const std::size_t at = static_cast<std::size_t>(t) * part;
      workers.emplace_back([&, at] {
        for (int r = 0; r < repeats; ++r) std::memcpy(to.data() + at, from.data() + at, part);
      });
    }
    for (std::thread& w : workers) w.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * static_cast<double>(part * static_cast<std::size_t>(n)) *
                              static_cast<double>(repeats) / s);
  }
  return best * 1e-9;
}

/// The CPU backend over one kernel table: a fixed Highway target's (tests check every target
/// this way), or, by default, the best target's, looked up at every selection so that Highway's
/// target choice stays in force.
class CpuBackend final : public Backend {
public:
  explicit CpuBackend(const KernelTable* table = nullptr) : table_(table) {
    target_.backend = "cpu";
    target_.isa = kernels().target_name;
    target_.channels_last_multiple = channels_last_multiple;
    target_.bf16_products = kernels().bf16_products;
    target_.default_threads = tbb::info::default_concurrency();
    target_.has_kernel = [this](const KernelQuery& q) { return select(q).kernel != nullptr; };
    target_.peak_gflops = [this](int threads) { return peak_gflops(kernels(), threads); };
    target_.copy_gbytes_per_s = [](int threads) {
      return copy_gbytes_per_s(threads, std::size_t{64} << 20, 1);
    };
    target_.cache_gbytes_per_s = [](int threads) {
      return copy_gbytes_per_s(threads, std::size_t{4} << 20, 50);
    };
    target_.kernel_work = [this](const KernelQuery& q) { return cpu::kernel_work(kernels(), q); };
  }
  CpuBackend(const CpuBackend&) = delete;
  CpuBackend& operator=(const CpuBackend&) = delete;

  [[nodiscard]] const Target& target() const override { return target_; }
  [[nodiscard]] KernelChoice select(const KernelQuery& query) const override {
    return cpu::select(kernels(), query);
  }
  [[nodiscard]] std::unique_ptr<Device> open(int workers) const override {
    return std::make_unique<CpuDevice>(workers);
  }

private:
  [[nodiscard]] const KernelTable& kernels() const { return table_ ? *table_ : kernel_table(); }

  const KernelTable* table_;
  Target target_;
};

} // namespace kiln::cpu

namespace kiln {

/// The CPU backend. Its kernels come from kiln/backends/cpu/implementation.hpp, which one
/// .cpp file of the program must include.
inline const Backend& cpu_backend() {
  static const cpu::CpuBackend backend;
  return backend;
}

} // namespace kiln
