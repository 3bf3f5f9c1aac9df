#pragma once
// Device-side split / merge of one element and the launch shape shared by the precision
// layer's CUDA kernels. Each thread owns a group of 8 consecutive elements, so it owns one tie
// byte outright (ranges start at multiples of 8).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "allocator/cuda_check_cuda.hpp"
#include "stowage/error.hpp"
#include "stowage/precision.hpp"

namespace stowage::cuda_precision {

__device__ __forceinline__ float merge_one(const SplitPlanes& w, std::size_t i, std::uint32_t tie) {
  const std::uint32_t hi = std::uint32_t{w.bf16[i]} + tie;
  return __uint_as_float(((hi << 16) | w.residual[i]) - 0x8000u);
}

// Writes bf16 and residual; returns the tie bit (always 0 in half_up mode).
__device__ __forceinline__ std::uint32_t split_one(const SplitPlanes& w, std::size_t i, float x, bool rne) {
  const std::uint32_t t = __float_as_uint(x) + 0x8000u;
  std::uint32_t hi = t >> 16;
  const std::uint32_t lo = t & 0xFFFFu;
  const std::uint32_t tie = (rne && lo == 0u) ? (hi & 1u) : 0u;
  hi -= tie;
  w.bf16[i] = static_cast<std::uint16_t>(hi);
  w.residual[i] = static_cast<std::uint16_t>(lo);
  return tie;
}

__device__ __forceinline__ std::uint32_t tie_byte(const SplitPlanes& w, std::size_t first) {
  return w.rounding == Rounding::nearest_even ? w.ties[first / 8] : 0u;
}

// Stores the tie bits of elements [first, min(first + 8, end)); bits past `end` keep their value.
__device__ __forceinline__ void store_tie_byte(const SplitPlanes& w, std::size_t first, std::size_t end,
                                               std::uint32_t bits) {
  if (w.rounding != Rounding::nearest_even) return;
  if (first + 8 <= end) {
    w.ties[first / 8] = static_cast<std::uint8_t>(bits);
  } else {
    const std::uint32_t mask = (1u << (end - first)) - 1u;
    w.ties[first / 8] = static_cast<std::uint8_t>((w.ties[first / 8] & ~mask) | (bits & mask));
  }
}

__device__ __forceinline__ std::size_t first_group() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::size_t group_step() { return static_cast<std::size_t>(gridDim.x) * blockDim.x; }

inline constexpr unsigned kThreads = 256;

inline unsigned blocks_for(std::size_t begin, std::size_t end) {
  const std::size_t groups = (end - begin + 7) / 8;
  const std::size_t blocks = (groups + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 ? (blocks == 0 ? 1 : blocks) : 65535);
}

inline void check_begin(std::size_t begin, const char* fn) {
  if (begin % 8 != 0) throw InvalidArgument(std::string(fn) + ": CUDA ranges must start at a multiple of 8");
}

}  // namespace stowage::cuda_precision
