// The CUDA device: one GPU's memory, one stream, pinned staging for inputs, CUDA events for
// per-step time, and the whole step recorded once as a CUDA graph and replayed.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include <cuda_runtime_api.h>

#include "kiln/backends/cuda/check.hpp"
#include "kiln/backends/cuda/kernel_table.hpp"
#include "kiln/plan/backend.hpp"

namespace kiln::cuda {

/// "device 0 (NVIDIA H200)".
inline std::string device_text(int index) {
  cudaDeviceProp properties{};
  const bool named = cudaGetDeviceProperties(&properties, index) == cudaSuccess;
  return "device " + std::to_string(index) +
         (named ? " (" + std::string(properties.name) + ")" : "");
}

/// Runs a plan's kernels on one GPU. Kernels are launched on one stream in plan order, so
/// they need no other synchronisation; the host waits only when it reads a result.
class CudaDevice final : public Device {
public:
  explicit CudaDevice(int index) : index_(index), where_(device_text(index)) {
    check(cudaSetDevice(index_), "cudaSetDevice", where_);
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate", where_);
    run_counter_ = reinterpret_cast<std::uint64_t*>(allocate(sizeof(std::uint64_t)));
  }
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;
  ~CudaDevice() override {
    cudaStreamSynchronize(stream_);
    drop_graph();
    for (auto& [destination, slot] : staging_) {
      cudaEventDestroy(slot.copied);
      cudaFreeHost(slot.memory);
    }
    for (cudaEvent_t e : events_)
      if (e) cudaEventDestroy(e);
    cudaFree(run_counter_);
    cudaStreamDestroy(stream_);
  }

  /// One stream: the plan's steps run one after the other, each kernel using the whole GPU.
  [[nodiscard]] int workers() const override { return 1; }
  [[nodiscard]] bool shares_host_memory() const override { return false; }

  /// Zero-filled device memory, 256-byte aligned (cudaMalloc's alignment). A request larger
  /// than the free memory is refused before asking, naming both.
  [[nodiscard]] std::byte* allocate(std::size_t bytes) override {
    select();
    std::size_t free = 0, total = 0;
    check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo", where_);
    void* memory = nullptr;
    const cudaError_t error = bytes > free ? cudaErrorMemoryAllocation
                                           : cudaMalloc(&memory, std::max<std::size_t>(bytes, 1));
    if (error != cudaSuccess) {
      cudaGetLastError(); // a failed cudaMalloc leaves no sticky error; clear the record anyway
      fail(error == cudaErrorMemoryAllocation ? errc::cuda_memory : error_code(error),
           "cuda: cannot allocate " + std::to_string(bytes) + " bytes on " + where_ + ": " +
               std::to_string(free) + " of " + std::to_string(total) + " bytes are free (" +
               describe(error) + ")");
    }
    check(cudaMemsetAsync(memory, 0, std::max<std::size_t>(bytes, 1), stream_), "cudaMemset",
          where_);
    return static_cast<std::byte*>(memory);
  }
  void free(std::byte* memory) noexcept override {
    cudaStreamSynchronize(stream_);
    cudaFree(memory);
  }

  /// Copies through a pinned buffer kept for this destination: the host's part (into the
  /// pinned buffer) overlaps whatever the GPU is still running, and the transfer is queued
  /// behind it. Copies larger than staging_limit go straight, after the stream drains.
  void copy_in(std::byte* device, const void* host, std::size_t bytes) override {
    if (bytes == 0) return;
    select();
    if (bytes > staging_limit) {
      check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", where_);
      check(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the device",
            where_);
      return;
    }
    Staging& slot = staging_for(device, bytes);
    // The previous copy out of this buffer must have left it before it is overwritten.
    check(cudaEventSynchronize(slot.copied), "cudaEventSynchronize", where_);
    std::memcpy(slot.memory, host, bytes);
    check(cudaMemcpyAsync(device, slot.memory, bytes, cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync to the device", where_);
    check(cudaEventRecord(slot.copied, stream_), "cudaEventRecord", where_);
  }
  void copy_out(void* host, const std::byte* device, std::size_t bytes) override {
    if (bytes == 0) return;
    synchronize();
    check(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to the host",
          where_);
  }
  void fill(std::byte* device, std::byte value, std::size_t bytes) override {
    select();
    check(cudaMemsetAsync(device, std::to_integer<int>(value), bytes, stream_), "cudaMemsetAsync",
          where_);
  }

  void set_replay(bool on) override {
    replay_ = on;
    if (!on) drop_graph();
  }

  /// Launches the steps on the stream and returns. The first run launches them one by one; the
  /// second records them as a CUDA graph, which every later run replays in one launch. With
  /// `seconds`, each step is timed by events and the run waits for them.
  void run(std::span<const KernelFn> kernels, std::span<const KernelArgs> args,
           std::span<double> seconds) override {
    select();
    LaunchContext& context = launch_context();
    context = LaunchContext{stream_, run_counter_, cudaSuccess, nullptr};
    if (!seconds.empty()) {
      run_timed(kernels, args, seconds);
    } else if (replay_ && graph_ && recorded_kernels_ == kernels.data() &&
               recorded_args_ == args.data()) {
      check(cudaGraphLaunch(graph_, stream_), "cudaGraphLaunch", where_);
    } else if (replay_ && runs_ > 0) {
      record(kernels, args);
      check(cudaGraphLaunch(graph_, stream_), "cudaGraphLaunch", where_);
    } else {
      launch_all(kernels, args);
    }
    report_launch_failure(context, args.size());
    ++runs_;
  }

  /// Waits for the stream; a kernel that failed on the device fails here.
  void synchronize() override {
    select();
    const cudaError_t error = cudaStreamSynchronize(stream_);
    if (error != cudaSuccess)
      fail(error_code(error), "cuda: a kernel failed on " + where_ + ": " + describe(error));
  }
  [[nodiscard]] double seconds() override {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  /// Whether the next plain run will be replayed from a recorded CUDA graph.
  [[nodiscard]] bool replaying() const { return graph_ != nullptr; }

  /// Copies larger than this go without staging (parameters uploaded once, not per step).
  static constexpr std::size_t staging_limit = std::size_t{64} << 20;

private:
  struct Staging {
    void* memory = nullptr;
    std::size_t bytes = 0;
    cudaEvent_t copied = nullptr;
  };

  /// Kernel launches go to this thread's current device: make it ours.
  void select() const { check(cudaSetDevice(index_), "cudaSetDevice", where_); }

  Staging& staging_for(std::byte* device, std::size_t bytes) {
    Staging& slot = staging_[device];
    if (slot.bytes >= bytes) return slot;
    if (slot.memory) {
      check(cudaEventSynchronize(slot.copied), "cudaEventSynchronize", where_);
      cudaFreeHost(slot.memory);
      slot.memory = nullptr;
      slot.bytes = 0;
    }
    check(cudaHostAlloc(&slot.memory, bytes, cudaHostAllocDefault),
          "cudaHostAlloc of " + std::to_string(bytes) + " pinned bytes", where_);
    slot.bytes = bytes;
    if (!slot.copied)
      check(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming), "cudaEventCreate",
            where_);
    return slot;
  }

  void launch_all(std::span<const KernelFn> kernels, std::span<const KernelArgs> args) {
    for (std::size_t i = 0; i < kernels.size(); ++i) {
      kernels[i](args[i]);
      if (launch_context().error != cudaSuccess && !failed_step_) failed_step_ = i + 1;
    }
    kernel_table().count_run(run_counter_);
  }

  void run_timed(std::span<const KernelFn> kernels, std::span<const KernelArgs> args,
                 std::span<double> seconds) {
    events_.resize(kernels.size() + 1);
    for (cudaEvent_t& e : events_)
      if (!e) check(cudaEventCreate(&e), "cudaEventCreate", where_);
    check(cudaEventRecord(events_[0], stream_), "cudaEventRecord", where_);
    for (std::size_t i = 0; i < kernels.size(); ++i) {
      kernels[i](args[i]);
      if (launch_context().error != cudaSuccess && !failed_step_) failed_step_ = i + 1;
      check(cudaEventRecord(events_[i + 1], stream_), "cudaEventRecord", where_);
    }
    kernel_table().count_run(run_counter_);
    synchronize();
    for (std::size_t i = 0; i < kernels.size(); ++i) {
      float ms = 0.0f;
      check(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]), "cudaEventElapsedTime", where_);
      seconds[i] += ms * 1e-3;
    }
  }

  /// Records every launch of one run as a CUDA graph and instantiates it.
  void record(std::span<const KernelFn> kernels, std::span<const KernelArgs> args) {
    drop_graph();
    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
          "cudaStreamBeginCapture", where_);
    launch_all(kernels, args);
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
    if (ended != cudaSuccess || launch_context().error != cudaSuccess) {
      if (graph) cudaGraphDestroy(graph);
      report_launch_failure(launch_context(), args.size());
      check(ended, "cudaStreamEndCapture", where_);
    }
    const cudaError_t made = cudaGraphInstantiate(&graph_, graph, 0);
    cudaGraphDestroy(graph);
    check(made, "cudaGraphInstantiate", where_);
    recorded_kernels_ = kernels.data();
    recorded_args_ = args.data();
  }

  void drop_graph() {
    if (graph_) cudaGraphExecDestroy(graph_);
    graph_ = nullptr;
    recorded_kernels_ = nullptr;
    recorded_args_ = nullptr;
  }

  void report_launch_failure(const LaunchContext& context, std::size_t steps) {
    if (context.error == cudaSuccess) return;
    const std::size_t step = failed_step_;
    failed_step_ = 0;
    fail(error_code(context.error) == errc::cuda_call ? errc::cuda_launch
                                                      : error_code(context.error),
         "cuda: kernel " + std::string(context.failed_kernel ? context.failed_kernel : "?") +
             (step
                  ? " (plan step " + std::to_string(step - 1) + " of " + std::to_string(steps) + ")"
                  : std::string()) +
             " failed to launch on " + where_ + ": " + describe(context.error));
  }

  int index_;
  std::string where_;
  cudaStream_t stream_ = nullptr;
  std::uint64_t* run_counter_ = nullptr;
  std::unordered_map<std::byte*, Staging> staging_;
  std::vector<cudaEvent_t> events_;
  cudaGraphExec_t graph_ = nullptr;
  const KernelFn* recorded_kernels_ = nullptr; // what the graph replays
  const KernelArgs* recorded_args_ = nullptr;
  std::uint64_t runs_ = 0;
  std::size_t failed_step_ = 0;
  bool replay_ = true;
};

} // namespace kiln::cuda
