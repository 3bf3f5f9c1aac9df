#include "tools/common/byte_size.hpp"

#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "stowage/error.hpp"

namespace stowage::tools {

std::int64_t parse_byte_size(std::string_view text, std::string_view field) {
  std::string s(text);
  std::size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  const std::size_t start = i;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == start) throw InvalidArgument(fmt::format("{}: '{}' is not a byte size (e.g. 80GiB)", field, text));
  const double value = std::strtod(s.substr(start, i - start).c_str(), nullptr);
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  std::string unit;
  for (; i < s.size(); ++i) unit += static_cast<char>(std::tolower(static_cast<unsigned char>(s[i])));
  double scale = 0;
  if (unit.empty() || unit == "b") scale = 1;
  else if (unit == "k" || unit == "kib") scale = 0x1p10;
  else if (unit == "m" || unit == "mib") scale = 0x1p20;
  else if (unit == "g" || unit == "gib") scale = 0x1p30;
  else if (unit == "t" || unit == "tib") scale = 0x1p40;
  else if (unit == "kb") scale = 1e3;
  else if (unit == "mb") scale = 1e6;
  else if (unit == "gb") scale = 1e9;
  else if (unit == "tb") scale = 1e12;
  else throw InvalidArgument(fmt::format("{}: unknown unit '{}' in '{}'", field, unit, text));
  const double bytes = value * scale;
  if (!std::isfinite(bytes) || bytes >= 0x1p62)
    throw InvalidArgument(fmt::format("{}: '{}' is too large", field, text));
  return static_cast<std::int64_t>(std::llround(bytes));
}

std::string format_bytes(std::int64_t bytes) {
  const double b = double(bytes);
  const double a = std::fabs(b);
  if (a >= 0x1p30) return fmt::format("{:.2f} GiB", b / 0x1p30);
  if (a >= 0x1p20) return fmt::format("{:.2f} MiB", b / 0x1p20);
  if (a >= 0x1p10) return fmt::format("{:.2f} KiB", b / 0x1p10);
  return fmt::format("{} B", bytes);
}

}  // namespace stowage::tools
