// CUDA runtime errors as kiln::Error: every CUDA call the host side makes goes through check(),
// which names the call, the device and CUDA's own description, under a kiln.cuda.* code.
#pragma once

#include <string>
#include <string_view>

#include <cuda_runtime_api.h>

#include "kiln/core/error.hpp"

namespace kiln::cuda {

/// The kiln.cuda.* code of a CUDA error: what a program can act on (no device, an old driver,
/// memory, a failed kernel) apart from every other failed call.
inline std::string_view error_code(cudaError_t error) {
  switch (error) {
  case cudaErrorNoDevice:
  case cudaErrorInvalidDevice:
  case cudaErrorDevicesUnavailable:
    return errc::cuda_no_device;
  case cudaErrorInsufficientDriver:
  case cudaErrorCompatNotSupportedOnDevice:
  case cudaErrorUnsupportedPtxVersion:
  case cudaErrorNoKernelImageForDevice:
    return errc::cuda_driver;
  case cudaErrorMemoryAllocation:
    return errc::cuda_memory;
  case cudaErrorLaunchFailure:
  case cudaErrorIllegalAddress:
  case cudaErrorLaunchOutOfResources:
  case cudaErrorLaunchTimeout:
  case cudaErrorInvalidConfiguration:
  case cudaErrorMisalignedAddress:
  case cudaErrorIllegalInstruction:
    return errc::cuda_launch;
  default:
    return errc::cuda_call;
  }
}

/// "cudaErrorMemoryAllocation (out of memory)".
inline std::string describe(cudaError_t error) {
  return std::string(cudaGetErrorName(error)) + " (" + cudaGetErrorString(error) + ")";
}

/// Throws unless `error` is cudaSuccess: "cuda: <what> failed on <where>: <CUDA's words>".
inline void check(cudaError_t error, std::string_view what, std::string_view where) {
  if (error == cudaSuccess) return;
  fail(error_code(error),
       "cuda: " + std::string(what) + " failed on " + std::string(where) + ": " + describe(error));
}

} // namespace kiln::cuda
