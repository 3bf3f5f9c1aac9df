// Swap-attention: the attention block's saved activations live in pinned host memory between
// forward and backward.
#include <fmt/format.h>

#include "stowage/byte_size.hpp"

#include "stowage/host_pool.hpp"
#include "stowage/swap.hpp"
#include "tools/demo/report.hpp"
#include "tools/demo/techniques.hpp"

namespace stowage::demo {

namespace {

class SwapHooks final : public ActivationHooks {
 public:
  explicit SwapHooks(const Context& ctx) : pool_(*ctx.device), swap_(*ctx.allocator, pool_, options(ctx)) {}

  void attention_done(int layer, const std::vector<TensorView*>& saved) override {
    const std::string tag = fmt::format("layer{}.attn", layer);
    for (TensorView* v : saved)
      if (swap_.offload(*v, layer, tag) != SwapDecision::swapped) ++kept_;
  }
  void before_layer_backward(int layer) override { swap_.before_backward(layer); }
  void before_attention_backward(int layer, const std::vector<TensorView*>& saved) override {
    for (TensorView* v : saved) *v = swap_.acquire(*v);
  }
  void after_layer_backward(int layer) override { swap_.after_backward(layer); }
  void backward_done() override { swap_.finish_step(); }

  void describe(std::vector<std::string>& lines) const override {
    const SwapStats s = swap_.stats();
    lines.push_back(
        fmt::format("swap-attention: {} tensors to host ({}), {} back ({}), {} kept on device; peak host {}; "
                    "overlap {:.0f}%, compute waited {:.1f} ms",
                    s.copies_d2h, format_bytes(s.bytes_d2h), s.copies_h2d, format_bytes(s.bytes_h2d), kept_,
                    format_bytes(s.peak_host_bytes), 100.0 * s.overlap_fraction, s.compute_wait_ms));
  }

 private:
  static SwapOptions options(const Context& ctx) {
    SwapOptions o;
    o.policy.tags = {"attn"};
    o.policy.min_bytes = 0;
    o.prefetch_distance = kSwapPrefetchDistance;
    o.compute_stream = ctx.compute;
    return o;
  }
  HostPool pool_;  // outlives the scheduler, which gives its buffers back on destruction
  SwapScheduler swap_;
  std::uint64_t kept_ = 0;
};

}  // namespace

std::unique_ptr<ActivationHooks> make_swap_hooks(const Context& ctx) { return std::make_unique<SwapHooks>(ctx); }

}  // namespace stowage::demo
