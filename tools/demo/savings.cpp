#include "tools/demo/savings.hpp"

#include <fmt/format.h>

namespace stowage::demo {

Saving predicted_saving(const Techniques& t, const DemoOptions& o, std::int64_t n) {
  Saving s;
  auto add = [&](std::int64_t bytes, std::int64_t blocks, const std::string& formula) {
    s.bytes += bytes;
    s.blocks += blocks;
    s.formula += (s.formula.empty() ? "" : " + ") + formula;
  };
  if (t.shared_storage) {
    // The separate bf16 copy (2 B/param) goes; nearest_even adds its tie bitmap (1 bit/param).
    const auto ties = static_cast<std::int64_t>(tie_bitmap_bytes(static_cast<std::size_t>(n), o.rounding));
    add(2 * n - ties, ties > 0 ? 2 : 1, fmt::format("2 B x {} params - {} B tie bitmap", n, ties));
  }
  return s;
}

}  // namespace stowage::demo
