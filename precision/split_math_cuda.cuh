#pragma once
// Device-side split / merge of one element and the launch shape shared by the precision
// layer's CUDA kernels. Thread t of the grid handles element begin + t (grid-stride), so every
// load and store is coalesced; tie bits are gathered per warp with __ballot_sync and written a
// byte per 8 lanes (ranges start at multiples of 8, so a warp owns its tie bytes).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "device/cuda/cuda_check_cuda.hpp"
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

// The tie bit of element i (0 in half_up mode).
// A computed NaN becomes the canonical quiet NaN 0x7FC00000: CUDA's arithmetic NaN 0x7FFFFFFF,
// split as it is, would read as -0 in the bf16 plane and hide the divergence.
__device__ __forceinline__ float quiet_nan(float x) { return isnan(x) ? __int_as_float(0x7FC00000) : x; }

__device__ __forceinline__ std::uint32_t tie_in(const SplitPlanes& w, std::size_t i) {
  return w.rounding == Rounding::nearest_even ? (w.ties[i / 8] >> (i % 8)) & 1u : 0u;
}

// Called by all 32 lanes of a warp (the loop condition is warp-uniform); lane L holds element
// warp_base + L, and `active` says whether it is < end. Lanes at multiples of 8 write a byte.
__device__ __forceinline__ void store_ties_warp(const SplitPlanes& w, std::size_t i, std::size_t end, bool active,
                                                std::uint32_t tie) {
  if (w.rounding != Rounding::nearest_even) return;
  const unsigned bits = __ballot_sync(0xFFFFFFFFu, active && tie != 0u);
  const unsigned lane = threadIdx.x & 31u;
  if (!active || (lane & 7u) != 0u) return;
  const std::uint32_t byte = (bits >> lane) & 0xFFu;
  if (i + 8 <= end) {
    w.ties[i / 8] = static_cast<std::uint8_t>(byte);
  } else {  // the range ends inside this byte: keep the bits past it
    const std::uint32_t mask = (1u << (end - i)) - 1u;
    w.ties[i / 8] = static_cast<std::uint8_t>((w.ties[i / 8] & ~mask) | byte);
  }
}

__device__ __forceinline__ std::size_t lane_index() { return threadIdx.x & 31u; }
__device__ __forceinline__ std::size_t first_index() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::size_t grid_step() { return static_cast<std::size_t>(gridDim.x) * blockDim.x; }

inline constexpr unsigned kThreads = 256;

inline unsigned blocks_for(std::size_t begin, std::size_t end) {
  const std::size_t blocks = (end - begin + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 ? (blocks == 0 ? 1 : blocks) : 65535);
}

inline void check_begin(std::size_t begin, const char* fn) {
  if (begin % 8 != 0) throw InvalidArgument(std::string(fn) + ": CUDA ranges must start at a multiple of 8");
}

}  // namespace stowage::cuda_precision
