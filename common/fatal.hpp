#pragma once
// The one way the library ends the process: for misuse it cannot report by throwing (it is found
// in a destructor) and cannot survive (going on would touch freed memory). Private to the library.
#include <string_view>

namespace stowage::detail {

// Writes "stowage: fatal: <message>" to stderr, whatever the log level, and aborts.
[[noreturn]] void fatal(std::string_view message) noexcept;

}  // namespace stowage::detail
