// Activation-function recompute: the GeLU output's device bytes are given back between forward
// and backward, and recomputed from the kept fc1 output just before the layer's backward.
#include <fmt/format.h>

#include "stowage/byte_size.hpp"

#include "stowage/recompute.hpp"
#include "tools/demo/kernels.hpp"
#include "tools/demo/report.hpp"
#include "tools/demo/techniques.hpp"

namespace stowage::demo {

namespace {

class RecomputeHooks final : public ActivationHooks {
 public:
  explicit RecomputeHooks(const Context& ctx) : registry_(*ctx.allocator, options(ctx)) {}

  bool compute_mlp_activation(int layer, const TensorView& in, TensorView& out) override {
    registry_.forward_into(layer, "mlp.act", {in}, {out}, [](const RecomputeContext& c) {
      const float* x = c.inputs[0].data_as<float>();
      float* y = c.outputs[0].data_as<float>();
      const std::int64_t n = c.outputs[0].numel();
      // Pointers, not views, in queued work: a held view would count as an alias.
      c.device.launch_host(c.stream, [x, y, n] { kernels::gelu_forward(x, y, n); });
    });
    return true;
  }
  void mlp_activation_done(int layer, TensorView&, const TensorView&) override { registry_.release(layer); }
  void before_layer_backward(int layer) override { registry_.before_backward(layer); }
  // Forgotten as soon as GeLU's backward is enqueued, so fc1 and the output are freed where the
  // baseline frees them.
  void mlp_activation_backward_done(int layer) override { registry_.after_backward(layer); }

  void describe(std::vector<std::string>& lines) const override {
    const RecomputeStats s = registry_.stats();
    lines.push_back(fmt::format("recompute: {} GeLU outputs released ({}), {} rematerialised", s.releases,
                                format_bytes(s.bytes_released), s.rematerializations));
  }

 private:
  static RecomputeOptions options(const Context& ctx) {
    RecomputeOptions o;
    o.compute_stream = ctx.compute;
    o.prefetch_distance = 0;  // rematerialise in the layer's own before_backward
    return o;
  }
  Recompute registry_;
};

}  // namespace

std::unique_ptr<ActivationHooks> make_recompute_hooks(const Context& ctx) {
  return std::make_unique<RecomputeHooks>(ctx);
}

}  // namespace stowage::demo
