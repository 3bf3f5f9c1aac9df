#include "tools/demo/savings.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "tools/demo/techniques.hpp"

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
  const auto& m = o.shape;
  const std::int64_t T = m.tokens(), h = m.hidden, L = m.layers;
  if (t.recompute) {
    // Every layer's GeLU output (T x ffn fp32) is released; the layer being back-propagated has
    // its own rematerialised, so L - 1 of them are gone at the peak.
    const std::int64_t act = T * m.ffn() * 4;
    add((L - 1) * act, 2 * (L - 1), fmt::format("({} - 1) layers x {} B GeLU output", L, act));
  }
  if (t.swap_attention) {
    // Per layer: norm output (T x h), qkv (T x 3h), probabilities (b x heads x s x s), context
    // (T x h), fp32. All but the prefetch window (the current layer and `distance` more) are on
    // the host at the peak.
    const std::int64_t attn = (T * h + T * 3 * h + std::int64_t{m.batch} * m.heads * m.seq * m.seq + T * h) * 4;
    const std::int64_t on_host = std::max<std::int64_t>(0, L - 1 - kSwapPrefetchDistance);
    add(on_host * attn, 4 * 2 * on_host,
        fmt::format("({} - 1 - {}) layers x {} B attention activations", L, kSwapPrefetchDistance, attn));
  }
  if (t.offload_optimizer) {
    // m and v, 4 B each per parameter, all in host memory (a device budget of 0).
    add(8 * n, 2, fmt::format("8 B x {} params of AdamW m, v", n));
  }
  return s;
}

}  // namespace stowage::demo
