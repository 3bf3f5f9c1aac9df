#pragma once
// Turns CUDA runtime and driver results into stowage errors that carry the CUDA error name.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <string>

namespace stowage::detail {

// Throws OutOfMemory / InvalidArgument / Unsupported / DeviceError for a failed runtime call;
// clears the runtime's last-error slot so one failure does not leak into the next call.
void check_cuda(cudaError_t result, const char* what);
// Same for a driver-API result (names come from cuGetErrorName, found at run time).
void check_cu(CUresult result, const char* what);

}  // namespace stowage::detail
