#include "device/cuda/cuda_check_cuda.hpp"

#include <fmt/format.h>

#include "device/cuda/cuda_driver_cuda.hpp"
#include "stowage/error.hpp"

namespace stowage::detail {

void check_cuda(cudaError_t result, const char* what) {
  if (result == cudaSuccess) return;
  cudaGetLastError();  // a non-sticky error must not be reported again by the next call
  const std::string message =
      fmt::format("{} failed: {} ({})", what, cudaGetErrorName(result), cudaGetErrorString(result));
  switch (result) {
    case cudaErrorMemoryAllocation: throw OutOfMemory(message);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidDevice:
    case cudaErrorHostMemoryAlreadyRegistered:
    case cudaErrorHostMemoryNotRegistered: throw InvalidArgument(message);
    case cudaErrorNotSupported: throw Unsupported(message);
    default: throw DeviceError(message);
  }
}

void check_cu(CUresult result, const char* what) {
  if (result == CUDA_SUCCESS) return;
  const std::string message = fmt::format("{} failed: {}", what, driver_error_name(result));
  switch (result) {
    case CUDA_ERROR_OUT_OF_MEMORY: throw OutOfMemory(message);
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE:
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_NOT_MAPPED:
    case CUDA_ERROR_ALREADY_MAPPED: throw InvalidArgument(message);
    case CUDA_ERROR_NOT_SUPPORTED:
    case CUDA_ERROR_NOT_PERMITTED: throw Unsupported(message);
    default: throw DeviceError(message);
  }
}

}  // namespace stowage::detail
