// The backend contract: the one place where a device meets the compiler. Lowering asks a
// Backend for each node's kernel; the executor asks the backend's Device for memory, copies,
// runs and time. Only lowering, the executor and the backends that implement it include it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "kiln/core/dtype.hpp"
#include "kiln/core/shape.hpp"
#include "kiln/ir/attrs.hpp"
#include "kiln/ir/op_list.hpp"
#include "kiln/passes/target.hpp"

namespace kiln {

/// A tensor as a kernel sees it: dense, row-major, in device memory, no ownership.
struct TensorView {
  void* data = nullptr;
  Shape shape;
  DType dtype = DType::f32;

  [[nodiscard]] float* f32() const { return static_cast<float*>(data); }
  [[nodiscard]] std::int32_t* i32() const { return static_cast<std::int32_t*>(data); }
  [[nodiscard]] std::int64_t numel() const { return shape.numel(); }
};

/// Arguments of one kernel call. Kernels never throw and never allocate: everything they
/// need, scratch memory included, arrives here.
struct KernelArgs {
  static constexpr int max_inputs = max_op_inputs;
  std::array<TensorView, max_inputs> in{};
  int num_inputs = 0;
  TensorView out;
  const Attrs* attrs = nullptr;
  /// Scratch memory: `workspace_per_worker` bytes for each of the device's workers, 64-byte
  /// aligned; how a kernel finds its worker's slice is the backend's business.
  std::byte* workspace = nullptr;
  std::size_t workspace_per_worker = 0;
  /// Number of completed runs of the plan; seeds per-step randomness such as dropout.
  std::uint64_t run_counter = 0;
};

/// Every kernel has this signature.
using KernelFn = void (*)(const KernelArgs&);

/// A backend's kernel for one node, chosen once at lowering: the function, the scratch it
/// needs, and the variant's name (e.g. "conv2d.shifted_rows"). Without a kernel, `name`
/// says why none fits.
struct KernelChoice {
  KernelFn kernel = nullptr;
  std::size_t workspace_per_worker = 0; ///< bytes, a multiple of 64
  std::string name;
};

/// One device's memory, copies, execution and clock, as one executor uses them. Device
/// memory is addressed by std::byte pointers; on a device whose memory is not the host's,
/// only copy_in and copy_out may touch it from the host.
class Device {
public:
  virtual ~Device() = default;

  /// Workers that run kernels at once (threads, streams); the executor gives each of them a
  /// workspace slice of the plan's per-worker size.
  [[nodiscard]] virtual int workers() const = 0;
  /// Whether device memory is host memory: the executor then runs parameters in their host
  /// tensors and hands out outputs without copying.
  [[nodiscard]] virtual bool shares_host_memory() const = 0;

  /// `bytes` of zero-filled device memory, 64-byte aligned (a valid pointer for 0 bytes);
  /// throws kiln::Error (kiln.memory.host) naming the size when the device has no room.
  [[nodiscard]] virtual std::byte* allocate(std::size_t bytes) = 0;
  /// Returns memory from allocate().
  virtual void free(std::byte* memory) noexcept = 0;
  virtual void copy_in(std::byte* device, const void* host, std::size_t bytes) = 0;
  virtual void copy_out(void* host, const std::byte* device, std::size_t bytes) = 0;
  virtual void fill(std::byte* device, std::byte value, std::size_t bytes) = 0;

  /// Runs kernels[i](args[i]) in order. When `seconds` is not empty, adds each call's time to
  /// seconds[i]. May return before the work is done; synchronize() waits for it.
  /// An executor passes the same spans on every call, only KernelArgs::run_counter changing, so
  /// a device may record the calls once and replay the recording (a CUDA graph); kernels of
  /// such a device read per-run values through the device, not from their arguments.
  virtual void run(std::span<const KernelFn> kernels, std::span<const KernelArgs> args,
                   std::span<double> seconds) = 0;
  /// Whether run() may replay a recording of earlier calls (on by default where a device can);
  /// off, every run launches each kernel, for profilers and debuggers.
  virtual void set_replay(bool) {}
  /// Waits until every run and copy issued so far is done.
  virtual void synchronize() = 0;
  /// A clock in seconds: two readings taken after synchronize() time the device work between.
  [[nodiscard]] virtual double seconds() = 0;
};

/// A device kind kiln compiles for. Backends are long-lived (one per device kind, e.g.
/// kiln::cpu_backend()): they outlive the executors that use them.
class Backend {
public:
  virtual ~Backend() = default;

  /// What passes may know of the device: layouts, tile multiples, peak and bandwidth.
  [[nodiscard]] virtual const Target& target() const = 0;
  /// The kernel for one node and its workspace need, or none (kernel == nullptr) with the
  /// reason in `name`. The only place a kernel variant is chosen.
  [[nodiscard]] virtual KernelChoice select(const KernelQuery& query) const = 0;
  /// A device with `workers` workers (>= 1) for one executor.
  [[nodiscard]] virtual std::unique_ptr<Device> open(int workers) const = 0;
};

} // namespace kiln
