#include "common/fatal.hpp"

#include <cstdio>
#include <cstdlib>

namespace stowage::detail {

void fatal(std::string_view message) noexcept {
  // stdio, not the logger: the log is off by default, and this line is the only report there is.
  std::fprintf(stderr, "stowage: fatal: %.*s\n", static_cast<int>(message.size()), message.data());
  std::fflush(stderr);
  std::abort();
}

}  // namespace stowage::detail
