#pragma once
// Small text helpers for parsing configuration values; private to the library.
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace stowage::detail {

std::string lower(std::string_view text);
std::string_view trim(std::string_view text);
// A finite, non-negative decimal number taking the whole text ("1.5", ".5", "1e3").
std::optional<double> parse_number(std::string_view text);
// Levenshtein distance: for "did you mean ...?" suggestions.
std::size_t edit_distance(std::string_view a, std::string_view b);

// The first of `names` nearest to `word` by edit_distance, and that distance; an empty name when
// none is within `max_distance`.
struct Nearest {
  std::string_view name;
  std::size_t distance = 0;
};
Nearest nearest(std::string_view word, std::span<const std::string_view> names, std::size_t max_distance);

}  // namespace stowage::detail
