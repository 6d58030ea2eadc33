// The CPU device: host memory, oneTBB worker threads, the steady clock.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <span>
#include <string>

#include <sys/sysinfo.h>

#include <oneapi/tbb/task_arena.h>

#include "kiln/core/error.hpp"
#include "kiln/plan/backend.hpp"

namespace kiln::cpu {

/// Physical memory plus swap: the most one allocation could ever be given.
inline std::size_t host_memory_bytes() {
  struct sysinfo info {};
  if (sysinfo(&info) != 0) return std::numeric_limits<std::size_t>::max();
  return (std::size_t{info.totalram} + std::size_t{info.totalswap}) * info.mem_unit;
}

/// Runs a plan's kernels in one oneTBB arena of `workers` threads; its memory is the host's.
class CpuDevice final : public Device {
public:
  explicit CpuDevice(int workers) : workers_(workers), arena_(workers) {}

  [[nodiscard]] int workers() const override { return workers_; }
  [[nodiscard]] bool shares_host_memory() const override { return true; }

  /// 64-byte aligned with a cache line of slack past the end, zero-filled. A request beyond the
  /// machine's memory and swap is refused before asking the allocator: zero-filling it would end
  /// in the kernel's out-of-memory killer rather than an error.
  [[nodiscard]] std::byte* allocate(std::size_t bytes) override {
    const std::size_t available = host_memory_bytes();
    const bool possible =
        bytes <= available && bytes <= std::numeric_limits<std::size_t>::max() - 128;
    const std::size_t rounded = possible ? (bytes + 63) / 64 * 64 + 64 : 0;
    auto* memory = possible ? static_cast<std::byte*>(std::aligned_alloc(64, rounded)) : nullptr;
    if (!memory)
      fail(errc::memory, "cpu: cannot allocate " + std::to_string(bytes) +
                             " bytes of host memory (the machine has " + std::to_string(available) +
                             " bytes of memory and swap)");
    std::memset(memory, 0, rounded);
    return memory;
  }
  void free(std::byte* memory) noexcept override { std::free(memory); }
  void copy_in(std::byte* device, const void* host, std::size_t bytes) override {
    if (bytes) std::memcpy(device, host, bytes);
  }
  void copy_out(void* host, const std::byte* device, std::size_t bytes) override {
    if (bytes) std::memcpy(host, device, bytes);
  }
  void fill(std::byte* device, std::byte value, std::size_t bytes) override {
    std::memset(device, std::to_integer<int>(value), bytes);
  }

  void run(std::span<const KernelFn> kernels, std::span<const KernelArgs> args,
           std::span<double> seconds) override {
    arena_.execute([&] {
      if (seconds.empty()) {
        for (std::size_t i = 0; i < kernels.size(); ++i) kernels[i](args[i]);
        return;
      }
      for (std::size_t i = 0; i < kernels.size(); ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        kernels[i](args[i]);
        seconds[i] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
    });
  }
  /// Kernels return when their work is done.
  void synchronize() override {}
  [[nodiscard]] double seconds() override {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

private:
  int workers_;
  tbb::task_arena arena_;
};

} // namespace kiln::cpu
