// In-place conversion of an interleaved fp32 buffer into split storage and back.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "stowage/error.hpp"
#include "stowage/precision.hpp"

namespace stowage {
namespace {

TEST(PrecisionInPlace, SplitEqualsOutOfPlaceAndMergeRestoresEveryBit) {
  std::mt19937 rng(11);
  for (Rounding r : {Rounding::half_up, Rounding::nearest_even}) {
    for (std::size_t chunk : {std::size_t{8}, std::size_t{64}, std::size_t{1} << 20}) {
      for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{1000},
                            std::size_t{64 * 5 + 3}, std::size_t{64 * 6}, std::size_t{100003}}) {
        SCOPED_TRACE(std::string(to_string(r)) + " chunk " + std::to_string(chunk) + " n " + std::to_string(n));
        std::vector<std::uint32_t> bits(n + 1);  // + 1: data() is never null, even for n = 0
        for (auto& b : bits) b = rng();
        for (std::size_t i = 0; i < n; i += 5) bits[i] = (bits[i] & 0xFFFF0000u) | 0x8000u;  // ties
        std::vector<float> buf(n + 1);
        std::memcpy(buf.data(), bits.data(), n * 4);
        // out-of-place reference
        std::vector<std::uint16_t> hi(n + 1), lo(n + 1);
        std::vector<std::uint8_t> ref_ties(n / 8 + 1, 0), ties(n / 8 + 1, 0);
        split(buf.data(), SplitPlanes{hi.data(), lo.data(), ref_ties.data(), n, r});

        const SplitPlanes p = split_in_place(buf.data(), n, ties.data(), r, chunk);
        ASSERT_EQ(p.bf16, reinterpret_cast<std::uint16_t*>(buf.data()));
        ASSERT_EQ(p.residual, p.bf16 + n);
        EXPECT_EQ(std::memcmp(p.bf16, hi.data(), n * 2), 0);
        EXPECT_EQ(std::memcmp(p.residual, lo.data(), n * 2), 0);
        if (r == Rounding::nearest_even) EXPECT_EQ(ties, ref_ties);

        float* back = merge_in_place(p, chunk);
        ASSERT_EQ(back, buf.data());
        EXPECT_EQ(std::memcmp(buf.data(), bits.data(), n * 4), 0);
      }
    }
  }
}

TEST(PrecisionInPlace, BadInputThrowsAndWritesNothing) {
  std::vector<float> buf(64, 1.25f);
  std::vector<std::uint8_t> ties(8);
  EXPECT_THROW(split_in_place(buf.data(), 64, ties.data(), Rounding::half_up, 12), InvalidArgument);
  EXPECT_THROW(split_in_place(buf.data(), 64, ties.data(), Rounding::half_up, 0), InvalidArgument);
  EXPECT_THROW(split_in_place(nullptr, 64, ties.data(), Rounding::half_up), InvalidArgument);
  EXPECT_THROW(split_in_place(buf.data(), 64, nullptr, Rounding::nearest_even), InvalidArgument);
  auto* odd = reinterpret_cast<float*>(reinterpret_cast<char*>(buf.data()) + 2);
  EXPECT_THROW(split_in_place(odd, 32, ties.data(), Rounding::half_up), InvalidArgument);
  for (float x : buf) ASSERT_EQ(x, 1.25f);
  SplitPlanes p = split_in_place(buf.data(), 64, ties.data(), Rounding::half_up);
  SplitPlanes wrong = p;
  wrong.residual += 1;
  EXPECT_THROW(merge_in_place(wrong), InvalidArgument);
  merge_in_place(p);
  for (float x : buf) ASSERT_EQ(x, 1.25f);
}

}  // namespace
}  // namespace stowage
