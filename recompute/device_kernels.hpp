#pragma once
// The activation kernels of each device backend, queued on a stream of that device: one table
// per backend, looked up by the device's kind. Host backends queue the CPU kernels
// (stowage::cpu) with Device::launch_host; CUDA launches stowage::cuda's on the stream.
#include <cstddef>

#include "stowage/activations.hpp"
#include "stowage/device.hpp"

namespace stowage::detail {

struct ActivationKernels {
  void (*forward)(Device& d, Stream s, Activation a, DType t, std::size_t n, const void* x, void* y);
  void (*backward)(Device& d, Stream s, Activation a, DType t, std::size_t n, const void* x, const void* dy, void* dx);
  void (*bias_forward)(Device& d, Stream s, Activation a, DType t, std::size_t rows, std::size_t cols, const void* x,
                       const void* bias, void* y);
  void (*bias_backward)(Device& d, Stream s, Activation a, DType t, std::size_t rows, std::size_t cols, const void* x,
                        const void* bias, const void* dy, void* dx, void* dbias);
  void (*gated_forward)(Device& d, Stream s, Activation a, DType t, std::size_t rows, std::size_t cols,
                        const void* gate, std::size_t gate_ld, const void* up, std::size_t up_ld, void* y);
  void (*gated_backward)(Device& d, Stream s, Activation a, DType t, std::size_t rows, std::size_t cols,
                         const void* gate, std::size_t gate_ld, const void* up, std::size_t up_ld, const void* dy,
                         void* dgate, void* dup);
};

const ActivationKernels& host_activation_kernels();  // host_backend_kernels.cpp
const ActivationKernels& cuda_activation_kernels();  // cuda_backend_kernels.cpp
// The table for `device`'s backend; Unsupported when recompute has no kernels for it.
const ActivationKernels& activation_kernels(const Device& device);

}  // namespace stowage::detail
