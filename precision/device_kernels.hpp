#pragma once
// The precision kernels of each device backend, queued on a stream of that device: one table per
// backend, looked up by the device's kind (precision's only question about backends). Host
// backends run the SIMD host kernels (kernel_table.hpp) on the stream; CUDA launches its own.
#include <cstddef>
#include <cstdint>

#include "precision/kernel_table.hpp"
#include "stowage/device.hpp"

namespace stowage::detail {

struct DeviceKernels {
  void (*fill_u16)(Device& device, Stream stream, std::uint16_t* dst, std::uint16_t value, std::size_t n);
  // Pointers are the device's; element ranges [begin, end) index both sides.
  void (*split)(Device& device, Stream stream, const float* src, const SplitPlanes& dst, std::size_t begin,
                std::size_t end);
  void (*merge)(Device& device, Stream stream, const SplitPlanes& src, float* dst, std::size_t begin, std::size_t end);
  // Sets *flag (an int in device memory, zeroed by the caller) to 1 when a gradient in
  // [begin, end) is Inf or NaN.
  void (*any_nonfinite)(Device& device, Stream stream, const void* grad, bool bf16, std::size_t begin, std::size_t end,
                        int* flag);
  void (*adam)(Device& device, Stream stream, const AdamArgs& args, std::size_t begin, std::size_t end);
  // Adam on a plain fp32 master array `params` (args.w unused), the same update as `adam`.
  void (*adam_fp32)(Device& device, Stream stream, const AdamArgs& args, float* params, std::size_t begin,
                    std::size_t end);
  void (*sgd)(Device& device, Stream stream, const SgdArgs& args, std::size_t begin, std::size_t end);
};

const DeviceKernels& host_device_kernels();  // host_backend_kernels.cpp
const DeviceKernels& cuda_device_kernels();  // cuda_backend_kernels.cpp
// The table for `device`'s backend; Unsupported when precision has no kernels for it.
const DeviceKernels& device_kernels(const Device& device);

}  // namespace stowage::detail
