#include "tools/demo/model.hpp"

#include <cmath>

#include <fmt/format.h>

#include "stowage/error.hpp"
#include "tools/demo/corpus.hpp"

namespace stowage::demo {

void ModelShape::validate() const {
  auto positive = [](const char* name, int v) {
    if (v <= 0) throw InvalidArgument(fmt::format("demo: --{} must be positive (got {})", name, v));
  };
  positive("layers", layers);
  positive("hidden", hidden);
  positive("heads", heads);
  positive("seq", seq);
  positive("batch", batch);
  if (hidden % heads != 0)
    throw InvalidArgument(fmt::format("demo: --hidden ({}) must be a multiple of --heads ({})", hidden, heads));
}

ParameterLayout make_layout(const ModelShape& s) {
  ParameterLayout l;
  auto add = [&](std::string name, std::string tag, std::int64_t rows, std::int64_t cols, bool decay) {
    ParamInfo p{std::move(name), std::move(tag), l.total, rows, cols, decay};
    l.total += (p.numel() + kParamAlign - 1) / kParamAlign * kParamAlign;
    l.params.push_back(std::move(p));
    return static_cast<int>(l.params.size() - 1);
  };
  const std::int64_t h = s.hidden;
  l.embedding = add("embedding", "embedding", s.vocab, h, true);
  for (int i = 0; i < s.layers; ++i) {
    const auto attn = fmt::format("layer{}.attn", i), mlp = fmt::format("layer{}.mlp", i);
    LayerParams lp{};
    lp.ln1 = add(fmt::format("layer{}.ln1", i), attn, 1, h, false);
    lp.w_qkv = add(fmt::format("layer{}.w_qkv", i), attn, h, 3 * h, true);
    lp.w_o = add(fmt::format("layer{}.w_o", i), attn, h, h, true);
    lp.ln2 = add(fmt::format("layer{}.ln2", i), mlp, 1, h, false);
    lp.w_fc1 = add(fmt::format("layer{}.w_fc1", i), mlp, h, s.ffn(), true);
    lp.w_fc2 = add(fmt::format("layer{}.w_fc2", i), mlp, s.ffn(), h, true);
    l.layers.push_back(lp);
  }
  l.ln_f = add("ln_f", "head", 1, h, false);
  l.w_out = add("w_out", "head", h, s.vocab, true);
  return l;
}

namespace {
float normal(std::uint64_t& rng) {
  // Box-Muller from two 53-bit uniforms; deterministic everywhere.
  const double u1 = (static_cast<double>(splitmix64(rng) >> 11) + 1.0) * 0x1.0p-53;
  const double u2 = static_cast<double>(splitmix64(rng) >> 11) * 0x1.0p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}
}  // namespace

std::vector<float> initial_parameters(const ParameterLayout& layout, const ModelShape& shape, std::uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(layout.total), 0.0f);
  std::uint64_t rng = seed;
  const float residual_scale = 1.0f / std::sqrt(2.0f * static_cast<float>(shape.layers));
  for (const auto& p : layout.params) {
    float* dst = v.data() + p.offset;
    if (!p.decay) {
      for (std::int64_t i = 0; i < p.numel(); ++i) dst[i] = 1.0f;
      continue;
    }
    const bool residual_out = p.name.ends_with("w_o") || p.name.ends_with("w_fc2");
    const float stddev = 0.02f * (residual_out ? residual_scale : 1.0f);
    for (std::int64_t i = 0; i < p.numel(); ++i) dst[i] = stddev * normal(rng);
  }
  return v;
}

}  // namespace stowage::demo
