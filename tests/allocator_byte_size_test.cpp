// The one byte-size formatter: units, signs and the ends of every integer type's range.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "stowage/byte_size.hpp"
#include "stowage/error.hpp"

namespace stowage {
namespace {

TEST(ByteSize, FormatsInBinaryUnitsWithTwoDecimals) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023u), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1.00 KiB");
  EXPECT_EQ(format_bytes(std::size_t{3} << 19), "1.50 MiB");
  EXPECT_EQ(format_bytes(std::int64_t{80} << 30), "80.00 GiB");
  EXPECT_EQ(format_bytes(std::uint64_t{5} << 40), "5.00 TiB");
}

TEST(ByteSize, NegativeAmountsKeepTheirSignAndHugeOnesStayPositive) {
  EXPECT_EQ(format_bytes(-1536), "-1.50 KiB");
  EXPECT_EQ(format_bytes(std::int64_t{-5} << 20), "-5.00 MiB");
  EXPECT_EQ(format_bytes(std::numeric_limits<std::uint64_t>::max()), "16777216.00 TiB");
  EXPECT_EQ(format_bytes(std::numeric_limits<std::int64_t>::min()), "-8388608.00 TiB");
}

TEST(ByteSize, ParsesWhatItFormats) {
  for (std::uint64_t v : {std::uint64_t{512}, std::uint64_t{1} << 20, std::uint64_t{3} << 29}) {
    EXPECT_EQ(parse_byte_size(format_bytes(v)), v) << format_bytes(v);
  }
}

TEST(ByteSize, WholeNumbersAreReadExactlyUpToTwoToTheSixtyFourLessOne) {
  // Above 2^53 a double no longer holds every integer: these came back rounded.
  EXPECT_EQ(parse_byte_size("9007199254740993"), 9007199254740993ULL);
  EXPECT_EQ(parse_byte_size("9223372036854775807"), 9223372036854775807ULL);
  EXPECT_EQ(parse_byte_size("18446744073709551615"), std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(parse_byte_size("16777215TiB"), std::uint64_t{16777215} << 40);
  EXPECT_EQ(parse_byte_size("18446744073709551kb"), 18446744073709551000ULL);
  for (const char* too_large :
       {"18446744073709551616", "99999999999999999999999", "16777216TiB", "18446744073709552kb"})
    EXPECT_THROW(parse_byte_size(too_large), ParseError) << too_large;
  // Fractions of a unit are still rounded to the nearest byte.
  EXPECT_EQ(parse_byte_size("1.5KiB"), 1536U);
  EXPECT_EQ(parse_byte_size("0.3kb"), 300U);
  EXPECT_THROW(parse_byte_size("0.3"), ParseError);
}

}  // namespace
}  // namespace stowage
