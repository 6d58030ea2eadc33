// The CUDA backend: the device kernels of kiln::cuda_kernels on one NVIDIA GPU. It implements
// the backend contract of plan/backend.hpp; nothing else in kiln knows it exists.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include <cuda_runtime_api.h>

#include "kiln/backends/cuda/check.hpp"
#include "kiln/backends/cuda/device.hpp"
#include "kiln/backends/cuda/kernel_table.hpp"
#include "kiln/plan/backend.hpp"

namespace kiln::cuda {

/// Fails with kiln.cuda.no_device or kiln.cuda.driver unless device `index` can run kernels:
/// the message says what was found (devices, driver and runtime versions).
inline void require_device(int index) {
  int driver = 0, runtime = 0, count = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  const cudaError_t error = cudaGetDeviceCount(&count);
  const std::string versions = "driver supports CUDA " + std::to_string(driver / 1000) + "." +
                               std::to_string(driver % 1000 / 10) + ", kiln was built with " +
                               std::to_string(runtime / 1000) + "." +
                               std::to_string(runtime % 1000 / 10);
  if (driver == 0)
    fail(errc::cuda_no_device, "cuda: no CUDA device is visible (no NVIDIA driver is installed: "
                               "libcuda.so was not found)");
  // Within one major version a driver runs newer runtimes (CUDA minor version compatibility).
  if (error == cudaErrorInsufficientDriver || driver / 1000 < runtime / 1000)
    fail(errc::cuda_driver, "cuda: the NVIDIA driver is too old for this build (" + versions + ")");
  if (error != cudaSuccess || count == 0)
    fail(errc::cuda_no_device,
         "cuda: no CUDA device is visible (" +
             (error != cudaSuccess ? describe(error) : std::string("no device found")) + "; " +
             versions + ")");
  if (index < 0 || index >= count)
    fail(errc::cuda_no_device, "cuda: device " + std::to_string(index) + " does not exist (" +
                                   std::to_string(count) + " visible)");
}

/// The CUDA backend on one device: kernel selection from the CUDA kernel table, devices that
/// run on that GPU, and a target that measures its peak there.
class CudaBackend final : public Backend {
public:
  explicit CudaBackend(int index = 0) : index_(index) {
    require_device(index_);
    cudaDeviceProp properties{};
    check(cudaGetDeviceProperties(&properties, index_), "cudaGetDeviceProperties",
          device_text(index_));
    target_.backend = "cuda";
    target_.isa = std::string(properties.name) + " sm_" + std::to_string(properties.major) +
                  std::to_string(properties.minor);
    // NCHW until the layout pass weighs a GPU's own costs: its column-matrix rule is the CPU's.
    target_.channels_last_multiple = 0;
    target_.default_threads = 1;
    target_.has_kernel = [this](const KernelQuery& q) { return select(q).kernel != nullptr; };
    target_.peak_gflops = [this](int) { return measured().gflops; };
    target_.copy_gbytes_per_s = [this](int) { return measured().gbytes_per_s; };
  }
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  [[nodiscard]] const Target& target() const override { return target_; }
  [[nodiscard]] KernelChoice select(const KernelQuery& query) const override {
    return kernel_table().select(query, "the CUDA backend");
  }
  [[nodiscard]] std::unique_ptr<Device> open(int) const override {
    return std::make_unique<CudaDevice>(index_);
  }

private:
  struct Peak {
    double gflops = 0.0, gbytes_per_s = 0.0;
  };
  /// Measured on first use, on this backend's device.
  const Peak& measured() const {
    std::call_once(measured_once_, [this] {
      check(cudaSetDevice(index_), "cudaSetDevice", device_text(index_));
      peak_.gflops = kernel_table().fma_gflops();
      peak_.gbytes_per_s = kernel_table().copy_gbytes_per_s();
    });
    return peak_;
  }

  int index_;
  Target target_;
  mutable std::once_flag measured_once_;
  mutable Peak peak_;
};

} // namespace kiln::cuda

namespace kiln {

/// The CUDA backend on device 0. Throws kiln.cuda.no_device when no GPU is visible and
/// kiln.cuda.driver when the driver is too old. Its kernels come from the kiln::cuda_kernels
/// library (or kiln/backends/cuda/implementation.cuh in one .cu file of the program).
inline const Backend& cuda_backend() {
  static const cuda::CudaBackend backend(0);
  return backend;
}

} // namespace kiln
