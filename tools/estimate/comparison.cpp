#include "tools/estimate/comparison.hpp"

namespace stowage::estimate {

RunConfig normalized(RunConfig c) {
  if (c.recompute.granularity == Recompute::activation_function) {
    c.recompute.granularity = Recompute::none;
    c.techniques.act_fn_recompute = true;
  }
  return c;
}

RunConfig without_techniques(RunConfig c) {
  c = normalized(std::move(c));
  const Techniques keep = c.techniques;
  c.techniques = Techniques{};
  c.techniques.rounding = keep.rounding;
  c.techniques.prefetch_window = keep.prefetch_window;
  c.techniques.stream_window_layers = keep.stream_window_layers;
  return c;
}

RunConfig with_all_techniques(RunConfig c) {
  c = normalized(std::move(c));
  c.techniques.shared_storage = c.techniques.act_fn_recompute = c.techniques.swap_attention = true;
  if (c.techniques.optimizer_offload == OffloadMode::none) c.techniques.optimizer_offload = OffloadMode::mapped;
  return c;
}

EstimateResult run_estimate(const RunConfig& config) {
  EstimateResult r;
  r.config = normalized(config);
  r.configured = estimate_memory(r.config);
  const RunConfig base = without_techniques(config);
  r.baseline = estimate_memory(base);
  auto variant = [&](const char* name, const RunConfig& c) {
    Variant v{name, estimate_memory(c), 0};
    v.saving = r.baseline.peak_reserved - v.memory.peak_reserved;
    return v;
  };
  const Techniques& want = r.config.techniques;
  RunConfig c = base;
  c.techniques.shared_storage = true;
  r.alone.push_back(variant("shared_storage", c));
  c = base;
  c.techniques.act_fn_recompute = true;
  r.alone.push_back(variant("act_fn_recompute", c));
  c = base;
  c.techniques.swap_attention = true;
  r.alone.push_back(variant("swap_attention", c));
  c = base;
  c.techniques.optimizer_offload =
      want.optimizer_offload == OffloadMode::none ? OffloadMode::mapped : want.optimizer_offload;
  r.alone.push_back(variant("optimizer_offload", c));
  r.all = variant("all", with_all_techniques(config));
  return r;
}

}  // namespace stowage::estimate
