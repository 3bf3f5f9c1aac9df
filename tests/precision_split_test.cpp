// Split storage: every fp32 bit pattern round-trips bit-exactly in both rounding modes, the bf16
// plane is exactly the documented rounding, and every SIMD level gives the same planes.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "stowage/error.hpp"
#include "stowage/precision.hpp"
#include "stowage/simd_level.hpp"

namespace stowage {
namespace {

float f32(std::uint32_t u) { return std::bit_cast<float>(u); }
bool is_nan_bits(std::uint32_t u) { return (u & 0x7F800000u) == 0x7F800000u && (u & 0x7FFFFFu) != 0; }

// IEEE round-to-nearest-even to bf16 by value, independent of the bit trick: compare the
// distances (exact in double) to the two bf16 neighbours of x.
std::uint16_t rne_reference(std::uint32_t u) {
  const float x = f32(u);
  const std::uint32_t a_bits = u & 0xFFFF0000u;  // neighbour toward zero
  if (a_bits == u || std::isinf(x)) return static_cast<std::uint16_t>(u >> 16);
  const std::uint32_t b_bits = a_bits + 0x10000u;  // neighbour away from zero
  const double a = f32(a_bits);
  const double b = (b_bits & 0x7FFFFFFFu) == 0x7F800000u ? std::copysign(std::ldexp(1.0, 128), x) : f32(b_bits);
  const double da = std::fabs(double{x} - a), db = std::fabs(b - double{x});
  if (da < db) return static_cast<std::uint16_t>(a_bits >> 16);
  if (db < da) return static_cast<std::uint16_t>(b_bits >> 16);
  return static_cast<std::uint16_t>(((a_bits >> 16) & 1u) ? b_bits >> 16 : a_bits >> 16);
}

// The usual integer form of the same rounding (PyTorch's and TensorFlow's float -> bf16 for
// non-NaN input); cheap enough for all 2^32 patterns. Checked against rne_reference below.
std::uint16_t rne_integer(std::uint32_t u) {
  return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

struct Planes {
  std::vector<std::uint16_t> hi, lo;
  std::vector<std::uint8_t> ties;
  SplitPlanes view;
  Planes(std::size_t n, Rounding r) : hi(n), lo(n), ties(tie_bitmap_bytes(n, r) + 1) {
    view = {hi.data(), lo.data(), r == Rounding::nearest_even ? ties.data() : nullptr, n, r};
  }
};

struct ScopedSimd {
  SimdLevel saved = simd_level();
  explicit ScopedSimd(SimdLevel l) { set_simd_level(l); }
  ~ScopedSimd() { set_simd_level(saved); }
};

// What the exhaustive sweep found; filled per thread, summed after.
struct Sweep {
  std::uint64_t roundtrip_errors = 0, bf16_errors = 0, differs_from_rne = 0;
  std::uint64_t nan_as_pos_inf = 0, nan_as_neg_inf = 0, nan_as_pos_zero = 0, nan_as_neg_zero = 0;
  std::uint32_t first_bad = 0;
  void bad(std::uint64_t& counter, std::uint32_t u) {
    if (roundtrip_errors + bf16_errors == 0) first_bad = u;
    ++counter;
  }
  void add(const Sweep& o) {
    if (roundtrip_errors + bf16_errors == 0) first_bad = o.first_bad;
    roundtrip_errors += o.roundtrip_errors, bf16_errors += o.bf16_errors, differs_from_rne += o.differs_from_rne;
    nan_as_pos_inf += o.nan_as_pos_inf, nan_as_neg_inf += o.nan_as_neg_inf;
    nan_as_pos_zero += o.nan_as_pos_zero, nan_as_neg_zero += o.nan_as_neg_zero;
  }
};

// The per-chunk loops, vectorised where the CPU allows (they dominate the sweep's time).
#define STOWAGE_SWEEP_LOOP __attribute__((target_clones("avx2", "default"), optimize("O3")))

STOWAGE_SWEEP_LOOP void fill_patterns(std::uint32_t* bits, std::uint64_t base, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) bits[i] = static_cast<std::uint32_t>(base + i);
}

// Counts non-NaN patterns whose bf16 differs from `want` (half_up formula or integer RNE), and
// adds the number of non-NaN patterns where the two roundings differ to `differs`.
STOWAGE_SWEEP_LOOP std::uint32_t count_bf16_errors(const std::uint32_t* bits, const std::uint16_t* hi, std::size_t n,
                                                   bool rne, std::uint64_t& differs) {
  std::uint32_t bad = 0, diff = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t u = bits[i];
    const auto half_up = static_cast<std::uint16_t>((u + 0x8000u) >> 16);
    const auto even = static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    const std::uint16_t want = rne ? even : half_up;
    const std::uint32_t number = (u & 0x7FFFFFFFu) <= 0x7F800000u;
    bad += (hi[i] != want) & number;
    diff += (half_up != even) & number;
  }
  differs += diff;
  return bad;
}

// Splits and merges patterns [first, last) in chunks; check_values also compares the bf16
// plane with the rounding it promises.
void sweep_range(std::uint64_t first, std::uint64_t last, Rounding r, bool check_values, Sweep& out) {
  constexpr std::size_t kChunk = std::size_t{1} << 14;  // stays in L2
  std::vector<float> src(kChunk), dst(kChunk);
  Planes p(kChunk, r);
  for (std::uint64_t base = first; base < last; base += kChunk) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, last - base));
    auto* bits = reinterpret_cast<std::uint32_t*>(src.data());
    fill_patterns(bits, base, n);
    split(src.data(), p.view, 0, n);
    merge(p.view, dst.data(), 0, n);
    if (std::memcmp(src.data(), dst.data(), n * 4) != 0) {
      for (std::size_t i = 0; i < n; ++i) {
        if (std::bit_cast<std::uint32_t>(dst[i]) != bits[i]) out.bad(out.roundtrip_errors, bits[i]);
      }
    }
    if (!check_values) continue;
    if (count_bf16_errors(bits, p.hi.data(), n, r == Rounding::nearest_even, out.differs_from_rne) != 0) {
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint16_t want =
            r == Rounding::half_up ? static_cast<std::uint16_t>((bits[i] + 0x8000u) >> 16) : rne_integer(bits[i]);
        if (!is_nan_bits(bits[i]) && p.hi[i] != want) out.bad(out.bf16_errors, bits[i]);
      }
    }
    if (((base >> 23) & 0xFF) != 0xFF) continue;  // no NaN in this chunk
    for (std::size_t i = 0; i < n; ++i) {
      if (!is_nan_bits(bits[i])) continue;
      const std::uint16_t h = p.hi[i];
      out.nan_as_pos_inf += h == 0x7F80, out.nan_as_neg_inf += h == 0xFF80;
      out.nan_as_pos_zero += h == 0x0000, out.nan_as_neg_zero += h == 0x8000;
    }
  }
}

Sweep sweep_all(Rounding r, bool check_values) {
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<Sweep> parts(threads);
  std::vector<std::thread> pool;
  const std::uint64_t total = std::uint64_t{1} << 32, per = (total / threads + 0xFFFFF) & ~std::uint64_t{0xFFFFF};
  for (unsigned t = 0; t < threads; ++t) {
    const std::uint64_t first = std::min(total, per * t), last = std::min(total, per * (t + 1));
    pool.emplace_back([&, t, first, last] { sweep_range(first, last, r, check_values, parts[t]); });
  }
  for (auto& th : pool) th.join();
  Sweep sum;
  for (const auto& s : parts) sum.add(s);
  return sum;
}

TEST(PrecisionSplit, AllPatternsHalfUpRoundTripAndMatchFormula) {
  const Sweep s = sweep_all(Rounding::half_up, true);
  EXPECT_EQ(s.roundtrip_errors, 0u) << std::hex << "first bad pattern 0x" << s.first_bad;
  EXPECT_EQ(s.bf16_errors, 0u) << std::hex << "first bad pattern 0x" << s.first_bad;
  // half_up differs from RNE exactly on non-NaN ties with an even last bit.
  EXPECT_EQ(s.differs_from_rne, 32640u);
  // NaN payloads that leave the NaN range in the bf16 view (docs/precision.md).
  EXPECT_EQ(s.nan_as_pos_inf, 32767u);   // 0x7F800001..0x7F807FFF
  EXPECT_EQ(s.nan_as_neg_zero, 32768u);  // 0x7FFF8000..0x7FFFFFFF wrap into the sign bit
  EXPECT_EQ(s.nan_as_neg_inf, 32767u);   // 0xFF800001..0xFF807FFF
  EXPECT_EQ(s.nan_as_pos_zero, 32768u);  // 0xFFFF8000..0xFFFFFFFF wrap past 2^32
}

TEST(PrecisionSplit, AllPatternsNearestEvenRoundTripAndMatchIeeeRne) {
  const Sweep s = sweep_all(Rounding::nearest_even, true);
  EXPECT_EQ(s.roundtrip_errors, 0u) << std::hex << "first bad pattern 0x" << s.first_bad;
  EXPECT_EQ(s.bf16_errors, 0u) << std::hex << "first bad pattern 0x" << s.first_bad;
  EXPECT_EQ(s.nan_as_pos_inf, 32768u);   // 0x7F800001..0x7F808000 (the tie rounds down)
  EXPECT_EQ(s.nan_as_neg_zero, 32768u);  // 0x7FFF8000..0x7FFFFFFF
  EXPECT_EQ(s.nan_as_neg_inf, 32768u);   // 0xFF800001..0xFF808000
  EXPECT_EQ(s.nan_as_pos_zero, 32768u);  // 0xFFFF8000..0xFFFFFFFF
}

// The portable path: all 2^32 patterns would take minutes on two cores, so it covers every low
// half for every 61st high half (70M patterns, each sign, exponent and mantissa region) plus
// every high half with the low halves around the rounding point.
TEST(PrecisionSplit, StridedPatternsRoundTripOnScalarPath) {
  ScopedSimd scalar(SimdLevel::scalar);
  for (Rounding r : {Rounding::half_up, Rounding::nearest_even}) {
    Sweep s;
    for (std::uint64_t hi = 0; hi < 0x10000u; hi += 61) sweep_range(hi << 16, (hi + 1) << 16, r, true, s);
    std::vector<float> src, back;
    for (std::uint32_t hi = 0; hi < 0x10000u; ++hi) {
      for (std::uint32_t lo : {0x0000u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) src.push_back(f32((hi << 16) | lo));
    }
    Planes p(src.size(), r);
    back.resize(src.size());
    split(src.data(), p.view);
    merge(p.view, back.data());
    EXPECT_EQ(s.roundtrip_errors, 0u) << to_string(r) << std::hex << " first bad 0x" << s.first_bad;
    EXPECT_EQ(s.bf16_errors, 0u) << to_string(r) << std::hex << " first bad 0x" << s.first_bad;
    EXPECT_EQ(std::memcmp(src.data(), back.data(), src.size() * 4), 0) << to_string(r);
    for (std::size_t i = 0; i < src.size(); ++i) {
      const auto u = std::bit_cast<std::uint32_t>(src[i]);
      if (is_nan_bits(u)) continue;
      const std::uint16_t want =
          r == Rounding::half_up ? static_cast<std::uint16_t>((u + 0x8000u) >> 16) : rne_integer(u);
      ASSERT_EQ(p.hi[i], want) << to_string(r) << std::hex << " pattern 0x" << u;
    }
  }
}

// The integer formula the sweep uses equals round-to-nearest-even by value on every high half
// combined with the low halves where rounding changes (ties, their neighbours, extremes) and
// a random sample of the rest: 65536 x 24 patterns.
TEST(PrecisionSplit, IntegerRneFormulaMatchesValueDefinition) {
  std::mt19937 rng(7);
  std::vector<std::uint32_t> lows = {0x0000, 0x0001, 0x7FFE, 0x7FFF, 0x8000, 0x8001, 0xFFFE, 0xFFFF};
  while (lows.size() < 24) lows.push_back(rng() & 0xFFFFu);
  std::uint64_t checked = 0;
  for (std::uint32_t hi = 0; hi < 0x10000u; ++hi) {
    for (std::uint32_t lo : lows) {
      const std::uint32_t u = (hi << 16) | lo;
      if (is_nan_bits(u)) continue;
      ASSERT_EQ(rne_integer(u), rne_reference(u)) << std::hex << "pattern 0x" << u;
      ++checked;
    }
  }
  EXPECT_GT(checked, 1500000u);
}

TEST(PrecisionSplit, SpecialValuesKeepTheirMeaning) {
  for (Rounding r : {Rounding::half_up, Rounding::nearest_even}) {
    const std::vector<std::uint32_t> bits = {
        0x00000000u, 0x80000000u,               // +-0
        0x00000001u, 0x807FFFFFu, 0x00010000u,  // denormals
        0x7F800000u, 0xFF800000u,               // +-Inf
        0x7FC00000u, 0xFFC00000u,               // canonical NaNs
        0x3F800000u, 0x7F7FFFFFu,               // 1.0, max finite (rounds to Inf)
    };
    std::vector<float> src(bits.size()), back(bits.size());
    std::memcpy(src.data(), bits.data(), bits.size() * 4);
    Planes p(bits.size(), r);
    split(src.data(), p.view);
    merge(p.view, back.data());
    EXPECT_EQ(std::memcmp(src.data(), back.data(), bits.size() * 4), 0) << to_string(r);
    const std::vector<std::uint16_t> want = {0x0000, 0x8000, 0x0000, 0x8080, 0x0001, 0x7F80,
                                             0xFF80, 0x7FC0, 0xFFC0, 0x3F80, 0x7F80};
    for (std::size_t i = 0; i < bits.size(); ++i) {
      EXPECT_EQ(p.hi[i], want[i]) << to_string(r) << " pattern " << std::hex << bits[i];
    }
    EXPECT_TRUE(std::isnan(f32(std::uint32_t{p.hi[7]} << 16)));  // canonical NaN stays NaN
  }
}

// Odd sizes, starts that are not multiples of 8 or 16, and sizes past the streaming threshold
// (1 Mi elements: non-temporal stores where the destination is aligned, plain stores where not;
// the 64-byte aligned output and 16-byte aligned planes below exercise both).
TEST(PrecisionSplit, EveryDispatchLevelGivesIdenticalPlanes) {
  std::mt19937 rng(42);
  const std::size_t n = (std::size_t{1} << 20) + 77;
  std::vector<std::uint32_t> bits(n + 7);
  for (auto& b : bits) b = rng();
  for (std::size_t i = 0; i < n; i += 97) bits[i] = (bits[i] & 0xFFFF0000u) | 0x8000u;  // ties
  const float* src = reinterpret_cast<const float*>(bits.data());
  std::unique_ptr<float[], decltype(&std::free)> back(
      static_cast<float*>(std::aligned_alloc(64, (n * 4 + 127) / 64 * 64)), &std::free);
  for (Rounding r : {Rounding::half_up, Rounding::nearest_even}) {
    Planes ref(n, r);
    {
      ScopedSimd scalar(SimdLevel::scalar);
      split(src, ref.view);
    }
    for (int level = 0; level <= static_cast<int>(detected_simd_level()); ++level) {
      ScopedSimd use(static_cast<SimdLevel>(level));
      for (std::size_t begin : {std::size_t{0}, std::size_t{3}, std::size_t{13}}) {
        SCOPED_TRACE(std::string(to_string(static_cast<SimdLevel>(level))) + " " + to_string(r) + " begin " +
                     std::to_string(begin));
        Planes p(n, r);
        split(src, p.view, begin, n - begin);
        EXPECT_TRUE(std::equal(p.hi.begin() + begin, p.hi.end() - begin, ref.hi.begin() + begin));
        EXPECT_TRUE(std::equal(p.lo.begin() + begin, p.lo.end() - begin, ref.lo.begin() + begin));
        for (std::size_t i = begin; r == Rounding::nearest_even && i < n - begin; ++i) {
          ASSERT_EQ((p.ties[i / 8] >> (i % 8)) & 1, (ref.ties[i / 8] >> (i % 8)) & 1) << "element " << i;
        }
        std::fill(back.get(), back.get() + n, 0.0f);
        merge(p.view, back.get(), begin, n - begin);
        EXPECT_EQ(std::memcmp(back.get() + begin, src + begin, (n - 2 * begin) * 4), 0);
        if (begin > 0) EXPECT_EQ(back[begin - 1], 0.0f);  // nothing written outside the range
        EXPECT_EQ(back[n - begin], 0.0f);
      }
    }
  }
}

// STOWAGE_SIMD lowers the level at start-up (checked in a fresh process each time); asking for
// more than the CPU has, or for nonsense, leaves the detected level and says so on stderr with
// the log off.
TEST(PrecisionSplitDeathTest, StowageSimdEnvironmentChoosesTheLevel) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto level_under = [](const char* value) {
    setenv("STOWAGE_SIMD", value, 1);
    std::exit(static_cast<int>(simd_level()));
  };
  EXPECT_EXIT(level_under("scalar"), ::testing::ExitedWithCode(0), "");
  if (detected_simd_level() >= SimdLevel::avx2) EXPECT_EXIT(level_under("avx2"), ::testing::ExitedWithCode(1), "");
  const int best = static_cast<int>(detected_simd_level());
  const std::string using_best = std::string("; using ") + to_string(detected_simd_level());
  if (detected_simd_level() < SimdLevel::avx512)
    EXPECT_EXIT(level_under("avx512"), ::testing::ExitedWithCode(best),
                "stowage: STOWAGE_SIMD=avx512: this CPU supports up to .*" + using_best);
  else EXPECT_EXIT(level_under("avx512"), ::testing::ExitedWithCode(best), "");
  EXPECT_EXIT(level_under("bogus"), ::testing::ExitedWithCode(best),
              "stowage: STOWAGE_SIMD=bogus is not scalar, avx2 or avx512" + using_best);
}

TEST(PrecisionSplit, SplitBitsAndMergeBitsAreInverse) {
  for (std::uint32_t u : {0x3F808000u, 0x3F818000u, 0x7F7F8000u, 0xFFFFFFFFu, 0x12345678u}) {
    for (Rounding r : {Rounding::half_up, Rounding::nearest_even}) EXPECT_EQ(merge_bits(split_bits(u, r)), u);
  }
  EXPECT_TRUE(split_bits(0x3F808000u, Rounding::nearest_even).tie);  // 1.00390625: even below
  EXPECT_EQ(split_bits(0x3F808000u, Rounding::nearest_even).bf16, 0x3F80);
  EXPECT_EQ(split_bits(0x3F808000u, Rounding::half_up).bf16, 0x3F81);
  EXPECT_FALSE(split_bits(0x3F818000u, Rounding::nearest_even).tie);  // odd below: rounds up
}

TEST(PrecisionSplit, BadInputThrowsAndWritesNothing) {
  const std::size_t n = 64;
  std::vector<float> src(n + 1, 1.5f);
  Planes p(n, Rounding::nearest_even);
  std::fill(p.hi.begin(), p.hi.end(), 0xABCD);
  const auto before = p.hi;
  EXPECT_THROW(split(src.data(), p.view, 0, n + 1), InvalidArgument);
  EXPECT_THROW(split(src.data(), p.view, 9, 8), InvalidArgument);
  EXPECT_THROW(split(nullptr, p.view, 0, n), InvalidArgument);
  const float* misaligned = reinterpret_cast<const float*>(reinterpret_cast<const char*>(src.data()) + 1);
  EXPECT_THROW(split(misaligned, p.view, 0, n), InvalidArgument);
  SplitPlanes no_ties = p.view;
  no_ties.ties = nullptr;
  EXPECT_THROW(split(src.data(), no_ties, 0, n), InvalidArgument);
  SplitPlanes odd = p.view;
  odd.residual = reinterpret_cast<std::uint16_t*>(reinterpret_cast<char*>(p.lo.data()) + 1);
  EXPECT_THROW(split(src.data(), odd, 0, n), InvalidArgument);
  EXPECT_THROW(merge(odd, src.data(), 0, n), InvalidArgument);
  EXPECT_EQ(p.hi, before);
  EXPECT_THROW(set_simd_level(static_cast<SimdLevel>(7)), Unsupported);
}

}  // namespace
}  // namespace stowage
