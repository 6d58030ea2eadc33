// Per-target measurement of the FP32 fused multiply-add peak, the yardstick of the profiler's
// achieved GFLOP/s; re-included per target.
#if defined(KILN_CPU_PEAK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_CPU_PEAK_INL_H_
#undef KILN_CPU_PEAK_INL_H_
#else
#define KILN_CPU_PEAK_INL_H_
#endif

#include <chrono>
#include <cstddef>

#include <hwy/highway.h>

#include "kiln/backends/cpu/kernel_table.hpp"

HWY_BEFORE_NAMESPACE();
namespace kiln::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// GFLOP/s of multiply-adds the calling thread sustains for about `seconds`. Twelve
/// independent chains cover the FMA latency (4 cycles) times the FMA units (2) of every core
/// kiln targets, so the loop runs at throughput, not latency.
inline double FmaGflops(double seconds) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  constexpr std::size_t chains = 12, block = 1 << 14;
  V acc[chains];
  for (std::size_t c = 0; c < chains; ++c) acc[c] = hn::Set(d, static_cast<float>(c));
  // x * 0.999999 + 1e-7 stays finite and normal forever.
  const V scale = hn::Set(d, 0.999999f), shift = hn::Set(d, 1e-7f);
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  std::size_t blocks = 0;
  double elapsed = 0.0;
  do {
    for (std::size_t i = 0; i < block; ++i) {
      HWY_UNROLL(12)
      for (std::size_t c = 0; c < chains; ++c) acc[c] = hn::MulAdd(acc[c], scale, shift);
    }
    ++blocks;
    elapsed = std::chrono::duration<double>(clock::now() - start).count();
  } while (elapsed < seconds);
  V sum = acc[0];
  for (std::size_t c = 1; c < chains; ++c) sum = hn::Add(sum, acc[c]);
  // Keeps the chains alive: the compiler cannot drop a loop whose result reaches memory.
  volatile float sink = hn::GetLane(sum);
  (void)sink;
  const double flops =
      2.0 * static_cast<double>(hn::Lanes(d) * chains * block) * static_cast<double>(blocks);
  return flops / elapsed * 1e-9;
}

inline void RegisterPeakMeasurement(KernelTable& table) { table.fma_gflops = &FmaGflops; }

} // namespace kiln::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif
