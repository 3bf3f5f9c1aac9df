#include "tools/demo/baseline_store.hpp"

#include <cstring>

#include "tools/demo/adamw.hpp"
#include "tools/demo/bf16.hpp"

namespace stowage::demo {

namespace {

void refresh_copy(const float* master, std::uint16_t* copy, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) copy[i] = to_bf16_rne(master[i]);
}

class SeparateCopyStore final : public ParameterStore {
 public:
  SeparateCopyStore(const Context& ctx, const std::vector<float>& init, const AdamOptions& options)
      : ctx_(ctx), options_(options), n_(init.size()) {
    ScopedTag tag("weights");
    master_ = ctx.f32({static_cast<std::int64_t>(n_)});
    copy_ = TensorView::empty(*ctx.allocator, DType::bf16, {static_cast<std::int64_t>(n_)}, ctx.compute);
    std::memcpy(f32_ptr(master_), init.data(), n_ * sizeof(float));
    refresh_copy(f32_ptr(master_), copy_.data_as<std::uint16_t>(), n_);
  }

  const std::uint16_t* bf16() override { return copy_.data_as<std::uint16_t>(); }

  void step(const float* grads, OptimizerStates& states, std::int64_t step) override {
    float* p = f32_ptr(master_);
    auto* copy = copy_.data_as<std::uint16_t>();
    float* m = states.m();
    float* v = states.v();
    const auto n = n_;
    const auto options = options_;
    ctx_.launch([=] {
      adamw_fp32(p, grads, m, v, n, options, step);
      refresh_copy(p, copy, n);
    });
  }

  std::vector<float> master() override {
    ctx_.sync();
    const float* p = f32_ptr(master_);
    return {p, p + n_};
  }

  std::string describe() const override { return "fp32 master + separate bf16 copy (RNE)"; }

 private:
  Context ctx_;
  AdamOptions options_;
  std::size_t n_;
  TensorView master_, copy_;
};

class DeviceStates final : public OptimizerStates {
 public:
  DeviceStates(const Context& ctx, std::int64_t n) {
    ScopedTag tag("optimizer");
    m_ = ctx.f32({n});
    v_ = ctx.f32({n});
    std::memset(m_.data(), 0, m_.nbytes());
    std::memset(v_.data(), 0, v_.nbytes());
  }
  float* m() override { return f32_ptr(m_); }
  float* v() override { return f32_ptr(v_); }
  std::string describe() const override { return "AdamW m, v on the device"; }

 private:
  TensorView m_, v_;
};

}  // namespace

std::unique_ptr<ParameterStore> make_separate_copy_store(const Context& ctx, const std::vector<float>& init,
                                                         const AdamOptions& options) {
  return std::make_unique<SeparateCopyStore>(ctx, init, options);
}

std::unique_ptr<OptimizerStates> make_device_states(const Context& ctx, std::int64_t n) {
  return std::make_unique<DeviceStates>(ctx, n);
}

}  // namespace stowage::demo
