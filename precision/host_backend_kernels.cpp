// Backends whose memory the host addresses (the emulated device): the SIMD host kernels, run in
// order on the stream (Device::launch_host).
#include <algorithm>

#include "precision/device_kernels.hpp"

namespace stowage::detail {

const DeviceKernels& host_device_kernels() {
  static const DeviceKernels table{
      [](Device& d, Stream s, std::uint16_t* dst, std::uint16_t value, std::size_t n) {
        d.launch_host(s, [=] { std::fill(dst, dst + n, value); });
      },
      [](Device& d, Stream s, const float* src, const SplitPlanes& dst, std::size_t b, std::size_t e) {
        d.launch_host(s, [=] { kernels().split(src, dst, b, e); });
      },
      [](Device& d, Stream s, const SplitPlanes& src, float* dst, std::size_t b, std::size_t e) {
        d.launch_host(s, [=] { kernels().merge(src, dst, b, e); });
      },
      [](Device& d, Stream s, const void* grad, bool bf16, std::size_t b, std::size_t e, int* flag) {
        d.launch_host(s, [=] {
          if (kernels().any_nonfinite(grad, bf16, b, e)) *flag = 1;
        });
      },
      [](Device& d, Stream s, const AdamArgs& a, std::size_t b, std::size_t e) {
        d.launch_host(s, [a, b, e] { kernels().adam(a, b, e); });
      },
      [](Device& d, Stream s, const AdamArgs& a, float* params, std::size_t b, std::size_t e) {
        d.launch_host(s, [a, params, b, e] { kernels().adam_fp32(a, params, b, e); });
      },
      [](Device& d, Stream s, const SgdArgs& a, std::size_t b, std::size_t e) {
        d.launch_host(s, [a, b, e] { kernels().sgd(a, b, e); });
      },
  };
  return table;
}

}  // namespace stowage::detail
