#pragma once
// The CUDA backend: runtime API for streams, events, copies and launches; the driver's virtual
// memory API for expandable segments and host-backed mappings. Built whenever nvcc is found; the
// driver is reached at run time, so the same binaries run without a GPU.
#include <memory>
#include <string>

#include "stowage/device.hpp"

namespace stowage {

// Number of CUDA devices usable now (0 when built without CUDA, or with no driver/GPU).
int cuda_device_count();
// Why cuda_device_count() is 0, e.g. "built without CUDA" or "no CUDA driver (libcuda.so.1)".
std::string cuda_unavailable_reason();
// Opens CUDA device `ordinal` (throws Unsupported when unavailable).
std::unique_ptr<Device> make_cuda_device(int ordinal);

}  // namespace stowage
