#pragma once
// Byte quantities as people write and read them: one parser and one formatter for the library,
// its configuration and its tools.
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace stowage {

// "4096", "512MiB", "8GiB", "1.5G", "2GB": K/KiB = 1024, KB = 1000 (and so on up to T), any case,
// spaces allowed around the unit; with a unit, a fraction is rounded to the nearest byte ("0.1GiB").
// ParseError (mentioning `what`) on anything else: a sign, a fraction of a byte without a unit
// ("0.3"), sizes of 2^64 bytes or more.
std::size_t parse_byte_size(std::string_view text, std::string_view what = "size");

// "12.34 GiB", "1.00 MiB", "3.50 KiB", "512 B": binary units up to TiB, two decimals; a negative
// amount (a difference) with its sign, "-1.50 MiB". Every integer type, its full range.
std::string format_bytes_unsigned(std::uint64_t bytes);
std::string format_bytes_signed(std::int64_t bytes);
template <std::integral T>
std::string format_bytes(T bytes) {
  if constexpr (std::is_signed_v<T>) return format_bytes_signed(static_cast<std::int64_t>(bytes));
  else return format_bytes_unsigned(static_cast<std::uint64_t>(bytes));
}

}  // namespace stowage
