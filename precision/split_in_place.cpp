// In-place conversion between an interleaved fp32 buffer and split storage, with a workspace of
// one chunk. Split: each chunk of C elements becomes [bf16 | residual] of that chunk (via the
// workspace), then a cycle-leader permutation of C-element blocks gathers all bf16 blocks in
// front and all residual blocks behind; a tail shorter than C is spliced in between. Every
// element moves about twice, and the extra memory is C x 4 bytes plus one bit per block.
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "precision/kernel_table.hpp"
#include "precision/validate.hpp"
#include "stowage/error.hpp"
#include "stowage/precision.hpp"

namespace stowage {
namespace {

// Moves u16 blocks of `c` elements so that position p receives the block now at source(p);
// `spare` holds one block.
template <class Source>
void permute_blocks(std::uint16_t* base, std::size_t c, std::size_t blocks, std::uint16_t* spare, Source source) {
  std::vector<bool> done(blocks, false);
  const std::size_t bytes = c * sizeof(std::uint16_t);
  for (std::size_t start = 0; start < blocks; ++start) {
    if (done[start]) continue;
    done[start] = true;
    if (source(start) == start) continue;
    std::memcpy(spare, base + start * c, bytes);
    std::size_t q = start;
    for (;;) {
      const std::size_t s = source(q);
      if (s == start) {
        std::memcpy(base + q * c, spare, bytes);
        break;
      }
      std::memcpy(base + q * c, base + s * c, bytes);
      done[s] = true;
      q = s;
    }
  }
}

void check_in_place(const void* buffer, std::size_t n, const std::uint8_t* ties, Rounding r, std::size_t chunk,
                    const char* fn) {
  if (chunk == 0 || chunk % 8 != 0) {
    throw InvalidArgument(fmt::format("{}: chunk_elements must be a positive multiple of 8 (got {})", fn, chunk));
  }
  if (r != Rounding::half_up && r != Rounding::nearest_even)
    throw InvalidArgument(fmt::format("{}: unknown rounding", fn));
  if (n == 0) return;
  detail::check_pointer(buffer, alignof(float), fn);
  if (r == Rounding::nearest_even) detail::check_pointer(ties, 1, "tie bitmap (nearest_even)");
}

}  // namespace

SplitPlanes split_in_place(float* buffer, std::size_t n, std::uint8_t* ties, Rounding r, std::size_t chunk) {
  check_in_place(buffer, n, ties, r, chunk, "split_in_place");
  auto* base = reinterpret_cast<std::uint16_t*>(buffer);
  const SplitPlanes result{base, base + n, r == Rounding::nearest_even ? ties : nullptr, n, r};
  if (n == 0) return result;
  const std::size_t c = chunk < n ? chunk : n;
  const std::size_t k = n / c, m = k * c, tail = n - m;
  std::vector<float> ws(c);
  const auto& kern = detail::kernels();
  auto ties_at = [&](std::size_t first) { return result.ties ? result.ties + first / 8 : nullptr; };
  // 1. each chunk k becomes [bf16_k | residual_k] in its own 4C bytes
  for (std::size_t b = 0; b < k; ++b) {
    std::memcpy(ws.data(), buffer + b * c, c * 4);
    const SplitPlanes local{base + 2 * b * c, base + 2 * b * c + c, ties_at(b * c), c, r};
    kern.split(ws.data(), local, 0, c);
  }
  // 2. gather: position q < K takes bf16_q (block 2q), q >= K takes residual_{q-K} (block 2(q-K)+1)
  permute_blocks(base, c, 2 * k, reinterpret_cast<std::uint16_t*>(ws.data()),
                 [k](std::size_t q) { return q < k ? 2 * q : 2 * (q - k) + 1; });
  // 3. tail: [H L t] -> [H h_t L l_t]
  if (tail > 0) {
    std::memcpy(ws.data(), buffer + m, tail * 4);
    std::memmove(base + m + tail, base + m, m * sizeof(std::uint16_t));
    const SplitPlanes local{base + m, base + n + m, ties_at(m), tail, r};
    kern.split(ws.data(), local, 0, tail);
  }
  return result;
}

float* merge_in_place(const SplitPlanes& planes, std::size_t chunk) {
  const std::size_t n = planes.numel;
  check_in_place(planes.bf16, n, planes.ties, planes.rounding, chunk, "merge_in_place");
  if (n == 0) return reinterpret_cast<float*>(planes.bf16);
  std::uint16_t* base = planes.bf16;
  if (planes.residual != base + n) {
    throw InvalidArgument("merge_in_place: the residual plane must follow the bf16 plane (split_in_place's layout)");
  }
  const Rounding r = planes.rounding;
  const std::size_t c = chunk < n ? chunk : n;
  const std::size_t k = n / c, m = k * c, tail = n - m;
  std::vector<float> ws(c);
  const auto& kern = detail::kernels();
  auto ties_at = [&](std::size_t first) { return r == Rounding::nearest_even ? planes.ties + first / 8 : nullptr; };
  auto* buffer = reinterpret_cast<float*>(base);
  // 3'. tail out: [H h_t L l_t] -> [H L t]
  if (tail > 0) {
    const SplitPlanes local{base + m, base + n + m, ties_at(m), tail, r};
    kern.merge(local, ws.data(), 0, tail);
    std::memmove(base + m, base + m + tail, m * sizeof(std::uint16_t));
    std::memcpy(buffer + m, ws.data(), tail * 4);
  }
  // 2'. scatter: block p takes bf16_{p/2} (now at p/2) or residual_{p/2} (now at K + p/2)
  permute_blocks(base, c, 2 * k, reinterpret_cast<std::uint16_t*>(ws.data()),
                 [k](std::size_t p) { return p % 2 == 0 ? p / 2 : k + p / 2; });
  // 1'. each chunk's [bf16 | residual] back to fp32
  for (std::size_t b = 0; b < k; ++b) {
    const SplitPlanes local{base + 2 * b * c, base + 2 * b * c + c, ties_at(b * c), c, r};
    kern.merge(local, ws.data(), 0, c);
    std::memcpy(buffer + b * c, ws.data(), c * 4);
  }
  return buffer;
}

}  // namespace stowage
