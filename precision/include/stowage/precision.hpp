#pragma once
// BF16/FP32 shared storage: an fp32 master weight kept as two 16-bit planes, a bf16 plane that
// compute reads as an ordinary bf16 tensor and a residual plane, so the bf16 copy costs nothing.
// Encoding (docs/precision.md): t = bits(x) + 0x8000 (mod 2^32); bf16 = t >> 16, residual = t & 0xFFFF.
// nearest_even adds one tie bit per element so the bf16 plane is IEEE round-to-nearest-even.
#include <cstddef>
#include <cstdint>

namespace stowage {

enum class Rounding : std::uint8_t {
  half_up,       // bf16 = high half of bits + 0x8000 (MindSpeed / TransformerEngine)
  nearest_even,  // bf16 = IEEE round-to-nearest-even; needs the tie bitmap
};
const char* to_string(Rounding r);

// Bytes of the tie bitmap for n elements (0 in half_up mode).
constexpr std::size_t tie_bitmap_bytes(std::size_t n, Rounding r) {
  return r == Rounding::nearest_even ? (n + 7) / 8 : 0;
}

// Split storage in host-addressable memory. Element i is bf16[i], residual[i] and, in
// nearest_even mode, bit (i % 8) of ties[i / 8]. Ranges [begin, end) worked on concurrently
// must not share a tie byte: start them at multiples of 8.
struct SplitPlanes {
  std::uint16_t* bf16 = nullptr;
  std::uint16_t* residual = nullptr;
  std::uint8_t* ties = nullptr;  // nearest_even only
  std::size_t numel = 0;
  Rounding rounding = Rounding::half_up;
};

// One element, for references and tests.
struct SplitValue {
  std::uint16_t bf16 = 0;
  std::uint16_t residual = 0;
  bool tie = false;  // nearest_even: bf16 is one below the half_up result
};
constexpr SplitValue split_bits(std::uint32_t bits, Rounding r) {
  const std::uint32_t t = bits + 0x8000u;
  SplitValue s{static_cast<std::uint16_t>(t >> 16), static_cast<std::uint16_t>(t & 0xFFFFu), false};
  if (r == Rounding::nearest_even && s.residual == 0 && (s.bf16 & 1u)) {
    s.bf16 = static_cast<std::uint16_t>(s.bf16 - 1);  // exact tie, even neighbour below
    s.tie = true;
  }
  return s;
}
constexpr std::uint32_t merge_bits(SplitValue s) {
  const std::uint32_t hi = std::uint32_t{s.bf16} + (s.tie ? 1u : 0u);
  return ((hi << 16) | s.residual) - 0x8000u;
}

// Host kernels (vectorised, see simd_level.hpp) on elements [begin, end) of full-length arrays.
// InvalidArgument for null or misaligned pointers, end > planes.numel or begin > end; nothing
// is written then.
void split(const float* src, const SplitPlanes& dst, std::size_t begin, std::size_t end);
void merge(const SplitPlanes& src, float* dst, std::size_t begin, std::size_t end);
inline void split(const float* src, const SplitPlanes& dst) { split(src, dst, 0, dst.numel); }
inline void merge(const SplitPlanes& src, float* dst) { merge(src, dst, 0, src.numel); }

// In-place conversion of an interleaved fp32 buffer of n elements (4-byte aligned, host
// memory) into split storage: afterwards its first 2n bytes are the bf16 plane and the next 2n
// bytes the residual plane; `ties` (tie_bitmap_bytes(n, r) bytes) receives the tie bits. Uses a
// workspace of chunk_elements x 4 bytes plus 2n / chunk_elements bits, never a second copy.
// chunk_elements must be a positive multiple of 8.
SplitPlanes split_in_place(float* buffer, std::size_t n, std::uint8_t* ties, Rounding r,
                           std::size_t chunk_elements = std::size_t{1} << 20);
// The inverse: planes laid out as split_in_place leaves them become n interleaved fp32 values
// starting at planes.bf16.
float* merge_in_place(const SplitPlanes& planes, std::size_t chunk_elements = std::size_t{1} << 20);

}  // namespace stowage
