// The CUDA backend's table: the kernels of split_cuda.cu and optimizers_cuda.cu on the stream
// (a cudaStream_t), launched with the stream's device current (a framework may call from a thread
// whose current device is another). Built without CUDA they throw Unsupported (cuda_stubs.cpp).
#include "precision/cuda_kernels.hpp"
#include "precision/device_kernels.hpp"

namespace stowage::detail {

const DeviceKernels& cuda_device_kernels() {
  static const DeviceKernels table{
      [](Device& d, Stream s, std::uint16_t* dst, std::uint16_t value, std::size_t n) {
        const cuda_precision::CurrentDevice on(d.ordinal());
        cuda_precision::fill_u16(dst, value, n, native(s));
      },
      [](Device& d, Stream s, const float* src, const SplitPlanes& dst, std::size_t b, std::size_t e) {
        const cuda_precision::CurrentDevice on(d.ordinal());
        cuda_precision::split(src, dst, b, e, native(s));
      },
      [](Device& d, Stream s, const SplitPlanes& src, float* dst, std::size_t b, std::size_t e) {
        const cuda_precision::CurrentDevice on(d.ordinal());
        cuda_precision::merge(src, dst, b, e, native(s));
      },
      [](Device& d, Stream s, const void* grad, bool bf16, std::size_t b, std::size_t e, int* flag) {
        const cuda_precision::CurrentDevice on(d.ordinal());
        cuda_precision::any_nonfinite(grad, bf16, b, e, flag, native(s));
      },
      [](Device& d, Stream s, const AdamArgs& a, std::size_t b, std::size_t e) {
        const cuda_precision::CurrentDevice on(d.ordinal());
        cuda_precision::adam(a, b, e, native(s));
      },
      [](Device& d, Stream s, const AdamArgs& a, float* params, std::size_t b, std::size_t e) {
        const cuda_precision::CurrentDevice on(d.ordinal());
        cuda_precision::adam_fp32(a, params, b, e, native(s));
      },
      [](Device& d, Stream s, const SgdArgs& a, std::size_t b, std::size_t e) {
        const cuda_precision::CurrentDevice on(d.ordinal());
        cuda_precision::sgd(a, b, e, native(s));
      },
  };
  return table;
}

}  // namespace stowage::detail
