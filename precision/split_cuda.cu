// CUDA split / merge kernels: one element per thread, grid-stride (see split_math_cuda.cuh).
#include "precision/cuda_kernels.hpp"
#include "precision/split_math_cuda.cuh"

namespace stowage::cuda_precision {
namespace {

__global__ void fill_u16_kernel(std::uint16_t* dst, std::uint16_t value, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_step()) dst[i] = value;
}

// The loop runs while the warp's first element is in range, so all lanes reach the ballot.
__global__ void split_kernel(const float* src, SplitPlanes w, std::size_t begin, std::size_t end) {
  const bool rne = w.rounding == Rounding::nearest_even;
  for (std::size_t i = begin + first_index(); i - lane_index() < end; i += grid_step()) {
    const bool active = i < end;
    const std::uint32_t tie = active ? split_one(w, i, src[i], rne) : 0u;
    store_ties_warp(w, i, end, active, tie);
  }
}

__global__ void merge_kernel(SplitPlanes w, float* dst, std::size_t begin, std::size_t end) {
  for (std::size_t i = begin + first_index(); i < end; i += grid_step()) dst[i] = merge_one(w, i, tie_in(w, i));
}

}  // namespace

CurrentDevice::CurrentDevice(int ordinal) {
  if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
  if (previous_ != ordinal) detail::check_cuda(cudaSetDevice(ordinal), "cudaSetDevice (the precision kernels)");
}

CurrentDevice::~CurrentDevice() {
  int now = -1;
  if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_) (void)cudaSetDevice(previous_);
}

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
