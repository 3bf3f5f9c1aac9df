// Optimizer offload: AdamW's m and v live in host memory the device addresses directly
// (stowage::OffloadedAdam, mapped mode, a device budget of 0), so they take no device memory;
// the same fused step runs on them.
#include <fmt/format.h>

#include "stowage/byte_size.hpp"

#include "stowage/error.hpp"
#include "stowage/offload.hpp"
#include "tools/demo/report.hpp"
#include "tools/demo/techniques.hpp"

namespace stowage::demo {

namespace {

class OffloadedStates final : public OptimizerStates {
 public:
  OffloadedStates(const Context& ctx, std::int64_t n)
      : pool_(*ctx.device), adam_(*ctx.allocator, pool_, static_cast<std::size_t>(n), options()) {}

  void step_fp32(const TensorView& master, const TensorView& grads, const AdamOptions& options,
                 std::int64_t step) override {
    check(step);
    adam_.step(master, grads, options, scaling(), state_);
  }
  void step_bucket(ParameterBucket& weights, const TensorView& grads, const AdamOptions& options,
                   std::int64_t step) override {
    check(step);
    adam_.step(weights, grads, options, scaling(), state_);
  }

  std::string describe() const override {
    const OffloadReport r = adam_.report();
    return fmt::format("optimizer: AdamW m, v offloaded ({}): {} on host, {} on device, {} device bytes saved",
                       r.mapping.empty() ? "mapped" : r.mapping, format_bytes(r.host_bytes),
                       format_bytes(r.device_bytes), format_bytes(r.device_bytes_saved));
  }

 private:
  static OffloadOptions options() {
    OffloadOptions o;
    o.host_mode = StatePlacement::mapped;
    o.device_budget_bytes = 0;  // every chunk on the host
    return o;
  }
  static GradScaling scaling() {
    GradScaling s;
    s.skip_nonfinite = false;  // the baseline has no skip either
    return s;
  }
  void check(std::int64_t step) const {
    if (state_.step + 1 != step)
      throw InvalidArgument(fmt::format("demo: optimizer step {} after step {}", step, state_.step));
  }

  HostPool pool_;  // outlives the states it holds
  OffloadedAdam adam_;
  OptimizerState state_;
};

}  // namespace

std::unique_ptr<OptimizerStates> make_offloaded_states(const Context& ctx, std::int64_t n) {
  return std::make_unique<OffloadedStates>(ctx, n);
}

}  // namespace stowage::demo
