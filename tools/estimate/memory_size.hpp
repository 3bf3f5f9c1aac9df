#pragma once
// A device or host memory size as a user writes it on the command line. A bare number ("80")
// would be 80 bytes to the byte-size parser and is never what is meant, so a unit is required.
#include <cstdint>
#include <string>

namespace stowage::estimate {

// InvalidArgument naming `option` when the text has no unit; ParseError when it is not a size.
std::int64_t parse_memory_size(const std::string& text, const char* option);
// A byte size as stowage::parse_byte_size reads it (a unit optional), as the model's int64.
std::int64_t parse_byte_count(const std::string& text, const char* option);

}  // namespace stowage::estimate
