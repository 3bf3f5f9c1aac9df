#pragma once
// The CUDA kernels of the precision layer (split_cuda.cu, optimizers_cuda.cu), launched on
// `stream` (a cudaStream_t). Without the CUDA backend they throw Unsupported.
#include <cstddef>
#include <cstdint>

#include "precision/kernel_table.hpp"

namespace stowage::cuda_precision {

// Makes CUDA device `ordinal` the calling thread's current device while it lives (a kernel runs on
// the current device, whatever stream it is given), then puts the previous one back.
class CurrentDevice {
 public:
  explicit CurrentDevice(int ordinal);
  ~CurrentDevice();  // NOLINT(performance-trivially-destructible): with CUDA it puts the device back
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  [[maybe_unused]] int previous_ = -1;  // used by the CUDA build's destructor only
};

void fill_u16(std::uint16_t* dst, std::uint16_t value, std::size_t n, void* stream);
void split(const float* src, const SplitPlanes& dst, std::size_t begin, std::size_t end, void* stream);
void merge(const SplitPlanes& src, float* dst, std::size_t begin, std::size_t end, void* stream);
// Sets *flag (device memory, int) to 1 when a gradient in [begin, end) is Inf or NaN.
void any_nonfinite(const void* grad, bool bf16, std::size_t begin, std::size_t end, int* flag, void* stream);
void adam(const detail::AdamArgs& a, std::size_t begin, std::size_t end, void* stream);
// Adam on a plain fp32 array (a.w unused): the same update, for fp32 masters (optimizer offload).
void adam_fp32(const detail::AdamArgs& a, float* params, std::size_t begin, std::size_t end, void* stream);
void sgd(const detail::SgdArgs& a, std::size_t begin, std::size_t end, void* stream);

}  // namespace stowage::cuda_precision
