#pragma once
// How request sizes map to block sizes, pools and classic segment sizes (PyTorch's classes).
#include <cstddef>

#include "stowage/allocator_stats.hpp"

namespace stowage::detail {

inline constexpr std::size_t kMinBlockSize = 512;                     // every block is a multiple
inline constexpr std::size_t kSmallSize = std::size_t{1} << 20;       // <= this: small pool
inline constexpr std::size_t kSmallBuffer = std::size_t{2} << 20;     // small-pool segment
inline constexpr std::size_t kMinLargeAlloc = std::size_t{10} << 20;  // below: share a 20 MiB segment
inline constexpr std::size_t kLargeBuffer = std::size_t{20} << 20;
inline constexpr std::size_t kRoundLarge = std::size_t{2} << 20;  // big segments round to this
// Larger requests are refused before rounding (it would overflow): out of memory, as any size
// no device has.
inline constexpr std::size_t kMaxRequest = std::size_t{1} << 60;

constexpr std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }
constexpr std::size_t round_down(std::size_t n, std::size_t to) { return n / to * to; }

// The block size a request of `bytes` gets (bytes > 0, <= kMaxRequest).
constexpr std::size_t round_size(std::size_t bytes) {
  return bytes < kMinBlockSize ? kMinBlockSize : round_up(bytes, kMinBlockSize);
}

constexpr Pool pool_for(std::size_t rounded) { return rounded <= kSmallSize ? Pool::small : Pool::large; }

// Size of a classic segment (one device allocation) made for a block of `rounded` bytes.
constexpr std::size_t classic_segment_size(std::size_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return round_up(rounded, kRoundLarge);
}

// Whether a free block of `block` bytes should be split to serve `rounded`: the remainder must
// be worth keeping (a small-pool remainder of at least 512 B, a large-pool one over 1 MiB). In
// expandable segments any remainder is kept: it merges with the next growth, so it never strands.
constexpr bool should_split(std::size_t block, std::size_t rounded, Pool pool, bool expandable) {
  const std::size_t rest = block - rounded;
  return pool == Pool::small || expandable ? rest >= kMinBlockSize : rest > kSmallSize;
}

}  // namespace stowage::detail
