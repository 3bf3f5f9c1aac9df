#pragma once
// Byte quantities as people write them: "80GiB", "80GB", "1.5 TiB", "4096".
#include <cstdint>
#include <string>
#include <string_view>

namespace stowage::tools {

// InvalidArgument naming `field` for negative, malformed or overflowing sizes.
std::int64_t parse_byte_size(std::string_view text, std::string_view field = "size");

// "12.34 GiB" (binary units, two decimals).
std::string format_bytes(std::int64_t bytes);

}  // namespace stowage::tools
