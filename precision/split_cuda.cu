// CUDA split / merge kernels (grid-stride over groups of 8 elements; see split_math_cuda.cuh).
#include "precision/cuda_kernels.hpp"
#include "precision/split_math_cuda.cuh"

namespace stowage::cuda_precision {
namespace {

__global__ void fill_u16_kernel(std::uint16_t* dst, std::uint16_t value, std::size_t n) {
  for (std::size_t i = first_group(); i < n; i += group_step()) dst[i] = value;
}

__global__ void split_kernel(const float* src, SplitPlanes w, std::size_t begin, std::size_t end) {
  const bool rne = w.rounding == Rounding::nearest_even;
  for (std::size_t g = first_group(); begin + g * 8 < end; g += group_step()) {
    const std::size_t first = begin + g * 8;
    const std::size_t last = first + 8 < end ? first + 8 : end;
    std::uint32_t bits = 0;
    for (std::size_t i = first; i < last; ++i) bits |= split_one(w, i, src[i], rne) << (i - first);
    store_tie_byte(w, first, end, bits);
  }
}

__global__ void merge_kernel(SplitPlanes w, float* dst, std::size_t begin, std::size_t end) {
  for (std::size_t g = first_group(); begin + g * 8 < end; g += group_step()) {
    const std::size_t first = begin + g * 8;
    const std::size_t last = first + 8 < end ? first + 8 : end;
    const std::uint32_t bits = tie_byte(w, first);
    for (std::size_t i = first; i < last; ++i) dst[i] = merge_one(w, i, (bits >> (i - first)) & 1u);
  }
}

}  // namespace

void fill_u16(std::uint16_t* dst, std::uint16_t value, std::size_t n, void* stream) {
  if (n == 0) return;
  const std::size_t blocks = (n + kThreads - 1) / kThreads;
  fill_u16_kernel<<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), kThreads, 0,
                    static_cast<cudaStream_t>(stream)>>>(dst, value, n);
  detail::check_cuda(cudaGetLastError(), "fill_u16 launch");
}

void split(const float* src, const SplitPlanes& dst, std::size_t begin, std::size_t end, void* stream) {
  check_begin(begin, "cuda split");
  if (end <= begin) return;
  split_kernel<<<blocks_for(begin, end), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(src, dst, begin, end);
  detail::check_cuda(cudaGetLastError(), "split launch");
}

void merge(const SplitPlanes& src, float* dst, std::size_t begin, std::size_t end, void* stream) {
  check_begin(begin, "cuda merge");
  if (end <= begin) return;
  merge_kernel<<<blocks_for(begin, end), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(src, dst, begin, end);
  detail::check_cuda(cudaGetLastError(), "merge launch");
}

}  // namespace stowage::cuda_precision
