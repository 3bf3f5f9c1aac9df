// BF16/FP32 split storage on arbitrary bytes taken as fp32 bit patterns (NaN payloads, denormals,
// ties included), in both rounding modes, at every SIMD level this CPU has, from unaligned
// starts and over sub-ranges:
//  - the bf16 plane equals an independent scalar reference of the documented rule (half_up: the
//    high half of bits + 0x8000; nearest_even: IEEE round-to-nearest-even by exact distance),
//    the residual plane and tie bits are what docs/precision.md says;
//  - elements and tie bits outside [begin, end) are not written;
//  - merge gives back the input bit for bit;
//  - in-place conversion with a small workspace gives the same planes, and merging in place
//    (with another chunk size) gives back the input.
// Header bytes: [0] SIMD level and chunks, [1] start offsets (and the rounding of a large run),
// [2] range begin, [3] range end, [4] 0xA5 repeats the data past 2^20 elements (the
// non-temporal store path; one rounding mode, no in-place conversion, to keep it fast).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "stowage/precision.hpp"
#include "stowage/simd_level.hpp"

namespace {

using namespace stowage;

[[noreturn]] void fail(const char* what, std::size_t i, std::uint32_t bits) {
  std::fprintf(stderr, "split/merge broken: %s (element %zu, bits 0x%08X)\n", what, i, bits);
  std::abort();
}

float as_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::uint16_t half_up_reference(std::uint32_t u) { return static_cast<std::uint16_t>((u + 0x8000u) >> 16); }

// IEEE round-to-nearest-even to bf16, from values: the nearer of the two bf16 neighbours by exact
// distance (double holds every difference exactly), ties to the even one; above the largest bf16
// the upper neighbour is 2^128, i.e. Inf. NaNs have no nearest value: for them the documented
// integer rule (u + 0x7FFF + lsb) >> 16 (docs/precision.md, NaN table).
std::uint16_t nearest_even_reference(std::uint32_t u) {
  const std::uint32_t sign = u & 0x80000000u, mag = u & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  const std::uint32_t down = mag >> 16;
  std::uint32_t pick = down;
  if ((mag & 0xFFFFu) != 0) {
    const double x = as_float(mag);
    const double lo = as_float(down << 16);
    const double hi = down + 1 == 0x7F80u ? std::ldexp(1.0, 128) : static_cast<double>(as_float((down + 1) << 16));
    const double dl = x - lo, dh = hi - x;
    pick = dl < dh ? down : dh < dl ? down + 1 : ((down & 1u) ? down + 1 : down);
  }
  return static_cast<std::uint16_t>((sign >> 16) | pick);
}

template <class Bytes>
bool tie_bit(const Bytes& ties, std::size_t i) {
  return (ties[i / 8] >> (i % 8)) & 1u;
}

// Expected planes of element with bits u.
void check_element(std::uint32_t u, Rounding r, std::uint16_t bf16, std::uint16_t residual, bool tie, std::size_t i) {
  const std::uint16_t up = half_up_reference(u);
  const std::uint16_t want = r == Rounding::half_up ? up : nearest_even_reference(u);
  if (bf16 != want) fail(r == Rounding::half_up ? "bf16 != half_up rule" : "bf16 != IEEE RNE", i, u);
  if (residual != static_cast<std::uint16_t>((u + 0x8000u) & 0xFFFFu)) fail("residual plane", i, u);
  if (tie != (want != up)) fail("tie bit", i, u);
  if (tie && (residual != 0 || static_cast<std::uint16_t>(up - want) != 1)) fail("tie on a non-tie", i, u);
}

constexpr std::uint16_t kSentinel16 = 0xA5A5;
constexpr std::uint32_t kSentinel32 = 0xDDDDDDDDu;
constexpr std::uint8_t kSentinelTies = 0x5A;

// Buffers set with memset: a fill loop in this (coverage-instrumented) file would cost more than
// the kernels under test at 2^20 elements.
template <class T>
struct Buffer {
  std::unique_ptr<T[]> p;
  std::size_t n;
  T* data() const { return p.get(); }
  T& back() const { return p[n - 1]; }
  T& operator[](std::size_t i) const { return p[i]; }
};
template <class T>
Buffer<T> filled(std::size_t n, std::uint8_t byte) {
  Buffer<T> b{std::unique_ptr<T[]>(new T[n]), n};  // default-initialised: no loop
  std::memset(b.data(), byte, n * sizeof(T));
  return b;
}
constexpr std::size_t kMaxElements = 4096;
constexpr std::size_t kLarge = std::size_t{1} << 20;

// `period` > 0: the input repeats with this period (a multiple of 8), so past the first period
// the planes must repeat too (checked with memcmp, as per-element checks of 2^20 elements would
// make the fuzzer crawl), and the in-place conversion is left to the small inputs.
void run(const Buffer<std::uint32_t>& input, Rounding r, const std::uint8_t* h, std::size_t period) {
  const std::size_t n = input.n;
  const std::size_t src_off = h[1] & 7, plane_off = (h[1] >> 3) & 7;
  // Out of place, a sub-range first: [begin, end) with begin a multiple of 8 (tie bytes).
  auto src_buf = filled<std::uint32_t>(n + 8, 0);
  std::memcpy(src_buf.data() + src_off, input.data(), n * 4);
  const auto* src = reinterpret_cast<const float*>(src_buf.data() + src_off);
  auto bf16_buf = filled<std::uint16_t>(n + 8, 0xA5), res_buf = filled<std::uint16_t>(n + 8, 0xA5);
  auto ties = filled<std::uint8_t>(tie_bitmap_bytes(n, Rounding::nearest_even) + 1, kSentinelTies);
  const SplitPlanes planes{bf16_buf.data() + plane_off, res_buf.data() + plane_off,
                           r == Rounding::nearest_even ? ties.data() : nullptr, n, r};
  const std::size_t begin = std::min(n, 8 * (h[2] % (n / 8 + 1)));
  const std::size_t end = n - h[3] % (n - begin + 1);
  split(src, planes, begin, end);
  auto untouched = [&](std::size_t i) {
    if (planes.bf16[i] != kSentinel16 || planes.residual[i] != kSentinel16)
      fail("wrote outside the range", i, input[i]);
    if (tie_bit(ties, i) != ((kSentinelTies >> (i % 8)) & 1u)) fail("tie bit outside the range", i, input[i]);
  };
  for (std::size_t i = 0; i < begin; ++i) untouched(i);
  for (std::size_t i = end; i < n; ++i) untouched(i);
  const std::size_t checked = period ? std::min(end, begin + period) : end;
  for (std::size_t i = begin; i < checked; ++i)
    check_element(input[i], r, planes.bf16[i], planes.residual[i], r == Rounding::nearest_even && tie_bit(ties, i), i);
  if (checked < end) {  // the rest of the range repeats what was checked, one period earlier
    const std::size_t len = end - checked;
    if (std::memcmp(planes.bf16 + checked, planes.bf16 + begin, len * 2) != 0 ||
        std::memcmp(planes.residual + checked, planes.residual + begin, len * 2) != 0 ||
        std::memcmp(ties.data() + checked / 8, ties.data() + begin / 8, len / 8) != 0)
      fail("planes of repeated input do not repeat", checked, 0);
  }
  for (std::size_t k = 0; k < plane_off; ++k)
    if (bf16_buf[k] != kSentinel16 || res_buf[k] != kSentinel16) fail("wrote before the planes", k, 0);
  if (ties.back() != kSentinelTies) fail("wrote past the tie bitmap", n, 0);
  // The rest, then merge back: a sub-range into a sentinel-filled destination, then everything.
  split(src, planes, 0, begin);
  split(src, planes, end, n);
  auto dst_buf = filled<std::uint32_t>(n + 8, 0xDD);
  std::uint32_t* dst = dst_buf.data() + plane_off;
  merge(planes, reinterpret_cast<float*>(dst), begin, end);
  if (std::memcmp(dst + begin, input.data() + begin, (end - begin) * 4) != 0) fail("merge of a sub-range", begin, 0);
  for (std::size_t i = 0; i < begin; ++i)
    if (dst[i] != kSentinel32) fail("merge wrote outside the range", i, input[i]);
  for (std::size_t i = end; i < n; ++i)
    if (dst[i] != kSentinel32) fail("merge wrote outside the range", i, input[i]);
  merge(planes, reinterpret_cast<float*>(dst));
  if (std::memcmp(dst, input.data(), n * 4) != 0) {
    for (std::size_t i = 0; i < n; ++i)
      if (dst[i] != input[i]) fail("merge is not the input bit for bit", i, input[i]);
  }
  if (period) return;
  // In place, with a workspace of `chunk` elements: the same planes, and back.
  const std::size_t chunk = 8 * (1 + (h[0] >> 2 & 7)), chunk_back = 8 * (1 + (h[0] >> 5 & 7));
  auto buffer = filled<std::uint32_t>(n, 0);
  std::memcpy(buffer.data(), input.data(), n * 4);
  auto ties_ip = filled<std::uint8_t>(tie_bitmap_bytes(n, Rounding::nearest_even) + 1, 0);
  const SplitPlanes ip = split_in_place(reinterpret_cast<float*>(buffer.data()), n, ties_ip.data(), r, chunk);
  if (reinterpret_cast<void*>(ip.bf16) != buffer.data() || ip.residual != ip.bf16 + n || ip.numel != n)
    fail("split_in_place layout", 0, 0);
  if (std::memcmp(ip.bf16, planes.bf16, n * 2) != 0 || std::memcmp(ip.residual, planes.residual, n * 2) != 0)
    fail("split_in_place planes differ from split", 0, 0);
  if (r == Rounding::nearest_even) {
    for (std::size_t i = 0; i < n; ++i)
      if (tie_bit(ties_ip, i) != tie_bit(ties, i)) fail("split_in_place tie bits differ from split", i, input[i]);
  }
  float* back = merge_in_place(ip, chunk_back);
  if (reinterpret_cast<void*>(back) != buffer.data() || std::memcmp(buffer.data(), input.data(), n * 4) != 0)
    fail("merge_in_place is not the input bit for bit", 0, 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  constexpr std::size_t kHeader = 5;
  std::uint8_t h[kHeader] = {};
  std::memcpy(h, data, std::min(size, kHeader));
  const std::size_t payload = size > kHeader ? size - kHeader : 0;
  const std::size_t n = std::min(payload / 4, kMaxElements);
  if (n == 0) return 0;
  auto input = filled<std::uint32_t>(n, 0);
  std::memcpy(input.data(), data + kHeader, n * 4);
  const auto top = static_cast<int>(detected_simd_level());
  set_simd_level(static_cast<SimdLevel>(std::min(static_cast<int>(h[0] & 3) % 3, top)));
  if (h[4] == 0xA5 && n >= 8) {  // large: whole periods of the data up to 2^20, then a tail
    const std::size_t period = n / 8 * 8;
    const std::size_t total = kLarge + n % 64;
    auto large = filled<std::uint32_t>(total, 0);
    for (std::size_t at = 0; at < total; at += period)
      std::memcpy(large.data() + at, input.data(), std::min(period, total - at) * 4);
    input = std::move(large);
    run(input, (h[1] & 0x40) ? Rounding::nearest_even : Rounding::half_up, h, period);
    return 0;
  }
  run(input, Rounding::half_up, h, 0);
  run(input, Rounding::nearest_even, h, 0);
  return 0;
}
