#include "tools/estimate/memory_size.hpp"

#include <fmt/format.h>

#include "stowage/byte_size.hpp"
#include "stowage/error.hpp"

namespace stowage::estimate {

std::int64_t parse_memory_size(const std::string& text, const char* option) {
  const auto last = text.find_last_not_of(" \t");
  if (last == std::string::npos || (text[last] >= '0' && text[last] <= '9') || text[last] == '.')
    throw InvalidArgument(
        fmt::format("{}: '{}' has no unit; write e.g. 80GiB (binary) or 80GB (decimal)", option, text));
  return parse_byte_count(text, option);
}

std::int64_t parse_byte_count(const std::string& text, const char* option) {
  const std::size_t bytes = parse_byte_size(text, option);  // ParseError for malformed text
  if (bytes > (std::size_t{1} << 62)) throw InvalidArgument(fmt::format("{}: '{}' is too large", option, text));
  return static_cast<std::int64_t>(bytes);
}

}  // namespace stowage::estimate
