#include "tools/estimate/megatron_arg_values.hpp"

#include <fmt/format.h>

#include <charconv>

#include "stowage/error.hpp"

namespace stowage::estimate {

std::int64_t to_int(const std::string& arg, const std::string& value) {
  std::int64_t v = 0;
  const char* end = value.data() + value.size();
  auto [ptr, ec] = std::from_chars(value.data(), end, v);
  if (ec != std::errc() || ptr != end)
    throw InvalidArgument(fmt::format("megatron-args: {} expects an integer, got '{}'", arg, value));
  return v;
}

std::int64_t to_positive(const std::string& arg, const std::string& value) {
  const std::int64_t v = to_int(arg, value);
  if (v <= 0) throw InvalidArgument(fmt::format("megatron-args: {} must be positive, got {}", arg, v));
  return v;
}

double to_double(const std::string& arg, const std::string& value) {
  try {
    std::size_t used = 0;
    double v = std::stod(value, &used);
    if (used == value.size() && v >= 0.0 && v <= 1.0) return v;
  } catch (const std::exception&) {
  }
  throw InvalidArgument(fmt::format("megatron-args: {} expects a probability in [0, 1], got '{}'", arg, value));
}

std::string one_of(const std::string& arg, const std::string& value, std::initializer_list<std::string_view> choices) {
  for (std::string_view c : choices)
    if (value == c) return value;
  throw InvalidArgument(fmt::format("megatron-args: {} '{}' is not one of {}", arg, value, fmt::join(choices, ", ")));
}

}  // namespace stowage::estimate
