// The CUDA backend's table: stowage::cuda's kernels (activations_cuda.cu) on the stream (a
// cudaStream_t). Built without CUDA they throw Unsupported (activations.cpp).
#include "recompute/device_kernels.hpp"

namespace stowage::detail {

const ActivationKernels& cuda_activation_kernels() {
  static const ActivationKernels table{
      [](Device&, Stream s, Activation a, DType t, std::size_t n, const void* x, void* y) {
        cuda::activation_forward(a, t, n, x, y, native(s));
      },
      [](Device&, Stream s, Activation a, DType t, std::size_t n, const void* x, const void* dy, void* dx) {
        cuda::activation_backward(a, t, n, x, dy, dx, native(s));
      },
      [](Device&, Stream s, Activation a, DType t, std::size_t rows, std::size_t cols, const void* x, const void* bias,
         void* y) { cuda::bias_activation_forward(a, t, rows, cols, x, bias, y, native(s)); },
      [](Device&, Stream s, Activation a, DType t, std::size_t rows, std::size_t cols, const void* x, const void* bias,
         const void* dy, void* dx,
         void* dbias) { cuda::bias_activation_backward(a, t, rows, cols, x, bias, dy, dx, dbias, native(s)); },
      [](Device&, Stream s, Activation a, DType t, std::size_t rows, std::size_t cols, const void* gate,
         std::size_t gate_ld, const void* up, std::size_t up_ld,
         void* y) { cuda::gated_activation_forward(a, t, rows, cols, gate, gate_ld, up, up_ld, y, native(s)); },
      [](Device&, Stream s, Activation a, DType t, std::size_t rows, std::size_t cols, const void* gate,
         std::size_t gate_ld, const void* up, std::size_t up_ld, const void* dy, void* dgate, void* dup) {
        cuda::gated_activation_backward(a, t, rows, cols, gate, gate_ld, up, up_ld, dy, dgate, dup, native(s));
      },
  };
  return table;
}

}  // namespace stowage::detail
