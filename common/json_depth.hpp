#pragma once
// Nesting depth of JSON text, found by one pass over the bytes: a bound checked before a plain
// (fast) parse, instead of a callback parser that sees every value. Private to the library.
#include <cstddef>
#include <optional>
#include <string_view>

namespace stowage::detail {

// The byte offset of the first '[' or '{' (outside strings) that opens level max_depth + 1;
// nullopt when the text never nests deeper than max_depth. Malformed text is the parser's to
// report: this only counts brackets.
std::optional<std::size_t> json_too_deep_at(std::string_view text, int max_depth);

}  // namespace stowage::detail
