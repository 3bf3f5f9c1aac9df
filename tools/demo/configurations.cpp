#include "tools/demo/configurations.hpp"

#include <fmt/format.h>

#include "stowage/error.hpp"
#include "tools/demo/techniques.hpp"

namespace stowage::demo {

const std::vector<Configuration>& all_configurations() {
  static const std::vector<Configuration> configs = [] {
    std::vector<Configuration> c;
    c.push_back({"baseline", {}, "fp32 master + bf16 copy, all activations and states on device"});
    c.push_back({"shared", {.shared_storage = true}, "bf16/fp32 shared storage"});
    c.push_back({"recompute", {.recompute = true}, "activation-function recompute (GeLU output released)"});
    c.push_back({"swap", {.swap_attention = true}, "swap-attention (attention activations to host)"});
    if (kHaveOffload)
      c.push_back({"offload", {.offload_optimizer = true}, "optimizer offload (AdamW m, v in mapped host memory)"});
    Techniques all;
    for (const auto& each : c) {
      all.shared_storage |= each.techniques.shared_storage;
      all.recompute |= each.techniques.recompute;
      all.swap_attention |= each.techniques.swap_attention;
      all.offload_optimizer |= each.techniques.offload_optimizer;
    }
    c.push_back({"all", all, "every technique above together"});
    return c;
  }();
  return configs;
}

std::vector<Configuration> select_configurations(const std::string& text) {
  std::vector<Configuration> out;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t comma = std::min(text.find(',', pos), text.size());
    const std::string name = text.substr(pos, comma - pos);
    pos = comma + 1;
    if (name.empty()) continue;
    bool found = false;
    for (const auto& c : all_configurations())
      if (c.name == name) {
        out.push_back(c);
        found = true;
      }
    if (!found) {
      std::string known;
      for (const auto& c : all_configurations()) known += (known.empty() ? "" : ", ") + c.name;
      throw InvalidArgument(fmt::format("demo: unknown configuration '{}' (this build has: {})", name, known));
    }
  }
  if (out.empty()) throw InvalidArgument("demo: --configs names no configuration");
  return out;
}

std::vector<std::string> missing_techniques() {
  if (!kHaveOffload) return {"offload: optimizer offload (stowage/offload.hpp) is not in this build"};
  return {};
}

}  // namespace stowage::demo
