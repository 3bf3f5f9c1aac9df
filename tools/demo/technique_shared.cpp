// Shared fp32/bf16 storage: the bf16 weights compute reads are the high halves of the master.
#include <fmt/format.h>

#include "stowage/error.hpp"
#include "tools/demo/techniques.hpp"

namespace stowage::demo {

namespace {

class SharedStorageStore final : public ParameterStore {
 public:
  SharedStorageStore(const Context& ctx, const std::vector<float>& init, const AdamOptions& options, Rounding r)
      : ctx_(ctx), options_(options), rounding_(r) {
    const auto n = static_cast<std::int64_t>(init.size());
    ScopedTag tag("weights");
    buffer_ = ctx.f32({n});  // 4 B per parameter: bf16 plane + residual plane after the split
    if (const std::size_t tb = tie_bitmap_bytes(init.size(), r); tb > 0)
      ties_ = TensorView::empty(*ctx.allocator, DType::u8, {static_cast<std::int64_t>(tb)}, ctx.compute);
    // The initial values come from the host: split them straight into the two planes.
    auto* base = static_cast<std::uint16_t*>(buffer_.data());
    planes_ = SplitPlanes{base, base + init.size(), ties_.defined() ? ties_.data_as<std::uint8_t>() : nullptr,
                          init.size(), r};
    split(init.data(), planes_);
  }

  const std::uint16_t* bf16() override { return planes_.bf16; }

  void step(const float* grads, OptimizerStates& states, std::int64_t step) override {
    if (state_.step + 1 != step)
      throw InvalidArgument(fmt::format("demo: shared storage step {} after step {}", step, state_.step));
    float* m = states.m();
    float* v = states.v();
    ctx_.launch([this, grads, m, v] {
      GradScaling scaling;
      scaling.skip_nonfinite = false;  // the baseline has no skip either
      adam_step(planes_, HostGrad{grads, DType::f32}, m, v, options_, scaling, state_);
    });
  }

  std::vector<float> master() override {
    ctx_.sync();
    std::vector<float> out(planes_.numel);
    merge(planes_, out.data());
    return out;
  }

  std::string describe() const override {
    return fmt::format("fp32 master as bf16 + residual planes ({})", to_string(rounding_));
  }

 private:
  Context ctx_;
  AdamOptions options_;
  Rounding rounding_;
  TensorView buffer_, ties_;
  SplitPlanes planes_;
  OptimizerState state_;
};

}  // namespace

std::unique_ptr<ParameterStore> make_shared_storage_store(const Context& ctx, const std::vector<float>& init,
                                                          const AdamOptions& options, Rounding rounding) {
  return std::make_unique<SharedStorageStore>(ctx, init, options, rounding);
}

}  // namespace stowage::demo
