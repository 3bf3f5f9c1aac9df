#include "stowage/byte_size.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <system_error>

#include <fmt/format.h>

#include "common/text.hpp"
#include "stowage/error.hpp"

namespace stowage {

std::size_t parse_byte_size(std::string_view text, std::string_view what) {
  auto fail = [&](std::string_view why) {
    return ParseError(fmt::format("{}: '{}' is not a byte size ({}); use e.g. 4096, 512MiB, 8GiB", what, text, why));
  };
  std::string_view t = detail::trim(text);
  std::size_t split = 0;
  while (split < t.size() && (std::isdigit(static_cast<unsigned char>(t[split])) || t[split] == '.')) ++split;
  std::string_view digits = t.substr(0, split);
  std::string unit = detail::lower(detail::trim(t.substr(split)));
  auto number = detail::parse_number(digits);
  if (!number) throw fail("no number");
  static constexpr struct {
    const char* name;
    std::uint64_t factor;
  } units[] = {{"", 1},
               {"b", 1},
               {"k", 1ULL << 10},
               {"kib", 1ULL << 10},
               {"kb", 1000},
               {"m", 1ULL << 20},
               {"mib", 1ULL << 20},
               {"mb", 1000000},
               {"g", 1ULL << 30},
               {"gib", 1ULL << 30},
               {"gb", 1000000000},
               {"t", 1ULL << 40},
               {"tib", 1ULL << 40},
               {"tb", 1000000000000}};
  for (const auto& u : units) {
    if (unit != u.name) continue;
    if (digits.find('.') == std::string_view::npos) {
      // A whole number exactly: a double holds integers only up to 2^53.
      std::uint64_t whole = 0;
      const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), whole);
      if (error == std::errc::result_out_of_range || (error == std::errc{} && whole > UINT64_MAX / u.factor))
        throw fail("too large");
      if (error != std::errc{} || end != digits.data() + digits.size()) throw fail("no number");
      return static_cast<std::size_t>(whole * u.factor);
    }
    double bytes = *number * static_cast<double>(u.factor);
    if (u.factor > 1) bytes = std::nearbyint(bytes);  // a fraction of a unit: to the nearest byte
    if (bytes >= 0x1p64) throw fail("too large");
    if (bytes != std::floor(bytes)) throw fail("not a whole number of bytes");
    return static_cast<std::size_t>(bytes);
  }
  throw fail(fmt::format("unknown unit '{}'", unit));
}

std::string format_bytes_unsigned(std::uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 0x1p40) return fmt::format("{:.2f} TiB", b / 0x1p40);
  if (b >= 0x1p30) return fmt::format("{:.2f} GiB", b / 0x1p30);
  if (b >= 0x1p20) return fmt::format("{:.2f} MiB", b / 0x1p20);
  if (b >= 0x1p10) return fmt::format("{:.2f} KiB", b / 0x1p10);
  return fmt::format("{} B", bytes);
}

std::string format_bytes_signed(std::int64_t bytes) {
  if (bytes >= 0) return format_bytes_unsigned(static_cast<std::uint64_t>(bytes));
  // The magnitude of INT64_MIN does not fit an int64_t; it does fit a uint64_t.
  return "-" + format_bytes_unsigned(std::uint64_t{0} - static_cast<std::uint64_t>(bytes));
}

}  // namespace stowage
