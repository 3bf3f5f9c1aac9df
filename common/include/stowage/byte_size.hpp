#pragma once
// Byte quantities as people write and read them: one parser and one formatter for the library,
// its configuration and its tools.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace stowage {

// "4096", "512MiB", "8GiB", "1.5G", "2GB": K/KiB = 1024, KB = 1000 (and so on up to T), any case,
// spaces allowed around the unit. ParseError (mentioning `what`) on anything else, on a fraction
// of a byte and on sizes of 2^64 bytes or more.
std::size_t parse_byte_size(std::string_view text, std::string_view what = "size");

// "12.34 GiB", "1.00 MiB", "3.50 KiB", "512 B": binary units, two decimals.
std::string format_bytes(std::uint64_t bytes);

}  // namespace stowage
