#include "stowage/byte_size.hpp"

#include <cctype>
#include <cmath>

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
    double factor;
  } units[] = {{"", 1},       {"b", 1},        {"k", 0x1p10},   {"kib", 0x1p10}, {"kb", 1e3},
               {"m", 0x1p20}, {"mib", 0x1p20}, {"mb", 1e6},     {"g", 0x1p30},   {"gib", 0x1p30},
               {"gb", 1e9},   {"t", 0x1p40},   {"tib", 0x1p40}, {"tb", 1e12}};
  for (const auto& u : units) {
    if (unit != u.name) continue;
    double bytes = *number * u.factor;
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
