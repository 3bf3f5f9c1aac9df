#pragma once
// Small text helpers for parsing configuration values; private to the library.
#include <optional>
#include <string>
#include <string_view>

namespace stowage::detail {

std::string lower(std::string_view text);
std::string_view trim(std::string_view text);
// A finite, non-negative decimal number taking the whole text ("1.5", ".5", "1e3").
std::optional<double> parse_number(std::string_view text);

}  // namespace stowage::detail
