#include "tools/estimate/memory_size.hpp"

#include <fmt/format.h>

#include "stowage/error.hpp"
#include "tools/common/byte_size.hpp"

namespace stowage::estimate {

std::int64_t parse_memory_size(const std::string& text, const char* option) {
  const auto last = text.find_last_not_of(" \t");
  if (last == std::string::npos || (text[last] >= '0' && text[last] <= '9') || text[last] == '.')
    throw InvalidArgument(
        fmt::format("{}: '{}' has no unit; write e.g. 80GiB (binary) or 80GB (decimal)", option, text));
  return tools::parse_byte_size(text, option);
}

}  // namespace stowage::estimate
