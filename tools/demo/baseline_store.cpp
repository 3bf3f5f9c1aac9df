#include "tools/demo/baseline_store.hpp"

#include <cstring>

#include <fmt/format.h>

#include "simd/bf16.hpp"
#include "stowage/bucket_optimizers.hpp"
#include "stowage/error.hpp"
#include "tools/demo/adamw.hpp"

namespace stowage::demo {

namespace {

void refresh_copy(const float* master, std::uint16_t* copy, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) copy[i] = bf16::from_f32(master[i]);
}

class SeparateCopyStore final : public ParameterStore {
 public:
  SeparateCopyStore(const Context& ctx, const std::vector<float>& init) : ctx_(ctx), n_(init.size()) {
    ScopedTag tag("weights");
    master_ = ctx.f32({static_cast<std::int64_t>(n_)});
    copy_ = TensorView::empty(*ctx.allocator, DType::bf16, {static_cast<std::int64_t>(n_)}, ctx.compute);
    std::memcpy(f32_ptr(master_), init.data(), n_ * sizeof(float));
    refresh_copy(f32_ptr(master_), copy_.data_as<std::uint16_t>(), n_);
  }

  const std::uint16_t* bf16() override { return copy_.data_as<std::uint16_t>(); }

  void step(const TensorView& grads, OptimizerStates& states, std::int64_t step) override {
    states.step_fp32(master_, grads, demo_adam_options(), step);
    const float* p = f32_ptr(master_);
    auto* copy = copy_.data_as<std::uint16_t>();
    const auto n = n_;
    ctx_.launch([=] { refresh_copy(p, copy, n); });  // the bf16 copy forward reads
  }

  std::vector<float> master() override {
    ctx_.sync();
    const float* p = f32_ptr(master_);
    return {p, p + n_};
  }

  std::string describe() const override { return "weights: fp32 master + separate bf16 copy (RNE), 6 B/param"; }

 private:
  Context ctx_;
  std::size_t n_;
  TensorView master_, copy_;
};

class DeviceStates final : public OptimizerStates {
 public:
  DeviceStates(const Context& ctx, std::int64_t n) : ctx_(ctx) {
    ScopedTag tag("optimizer");
    m_ = ctx.f32({n});
    v_ = ctx.f32({n});
    std::memset(m_.data(), 0, m_.nbytes());
    std::memset(v_.data(), 0, v_.nbytes());
  }

  void step_fp32(const TensorView& master, const TensorView& grads, const AdamOptions& options,
                 std::int64_t step) override {
    float *p = f32_ptr(master), *m = f32_ptr(m_), *v = f32_ptr(v_);
    const float* g = f32_ptr(grads);
    const auto n = static_cast<std::size_t>(master.numel());
    ctx_.launch([=] { adamw_fp32(p, g, m, v, n, options, step); });
  }

  void step_bucket(ParameterBucket& weights, const TensorView& grads, const AdamOptions& options,
                   std::int64_t step) override {
    if (state_.step + 1 != step)
      throw InvalidArgument(fmt::format("demo: optimizer step {} after step {}", step, state_.step));
    GradScaling scaling;
    scaling.skip_nonfinite = false;  // the baseline has no skip either
    adam_step(weights, grads, m_, v_, options, scaling, state_);
  }

  std::string describe() const override { return "optimizer: AdamW m, v on the device, 8 B/param"; }

 private:
  Context ctx_;
  TensorView m_, v_;
  OptimizerState state_;
};

}  // namespace

std::unique_ptr<ParameterStore> make_separate_copy_store(const Context& ctx, const std::vector<float>& init) {
  return std::make_unique<SeparateCopyStore>(ctx, init);
}

std::unique_ptr<OptimizerStates> make_device_states(const Context& ctx, std::int64_t n) {
  return std::make_unique<DeviceStates>(ctx, n);
}

}  // namespace stowage::demo
