// Backends whose memory the host addresses (the emulated device): the CPU kernels, run in order
// on the stream (Device::launch_host).
#include "recompute/device_kernels.hpp"

namespace stowage::detail {

const ActivationKernels& host_activation_kernels() {
  static const ActivationKernels table{
      [](Device& d, Stream s, Activation a, DType t, std::size_t n, const void* x, void* y) {
        d.launch_host(s, [=] { cpu::activation_forward(a, t, n, x, y); });
      },
      [](Device& d, Stream s, Activation a, DType t, std::size_t n, const void* x, const void* dy, void* dx) {
        d.launch_host(s, [=] { cpu::activation_backward(a, t, n, x, dy, dx); });
      },
      [](Device& d, Stream s, Activation a, DType t, std::size_t rows, std::size_t cols, const void* x,
         const void* bias,
         void* y) { d.launch_host(s, [=] { cpu::bias_activation_forward(a, t, rows, cols, x, bias, y); }); },
      [](Device& d, Stream s, Activation a, DType t, std::size_t rows, std::size_t cols, const void* x,
         const void* bias, const void* dy, void* dx, void* dbias) {
        d.launch_host(s, [=] { cpu::bias_activation_backward(a, t, rows, cols, x, bias, dy, dx, dbias); });
      },
      [](Device& d, Stream s, Activation a, DType t, std::size_t rows, std::size_t cols, const void* gate,
         std::size_t gate_ld, const void* up, std::size_t up_ld, void* y) {
        d.launch_host(s, [=] { cpu::gated_activation_forward(a, t, rows, cols, gate, gate_ld, up, up_ld, y); });
      },
      [](Device& d, Stream s, Activation a, DType t, std::size_t rows, std::size_t cols, const void* gate,
         std::size_t gate_ld, const void* up, std::size_t up_ld, const void* dy, void* dgate, void* dup) {
        d.launch_host(
            s, [=] { cpu::gated_activation_backward(a, t, rows, cols, gate, gate_ld, up, up_ld, dy, dgate, dup); });
      },
  };
  return table;
}

}  // namespace stowage::detail
