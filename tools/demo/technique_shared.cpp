// Shared fp32/bf16 storage: the bf16 weights compute reads are the high halves of the master,
// kept in a stowage::ParameterBucket (bf16 plane, residual plane, tie bitmap in one block).
#include <fmt/format.h>

#include "stowage/error.hpp"
#include "tools/demo/adamw.hpp"
#include "tools/demo/model.hpp"
#include "tools/demo/techniques.hpp"

namespace stowage::demo {

namespace {

class SharedStorageStore final : public ParameterStore {
 public:
  SharedStorageStore(const Context& ctx, const std::vector<float>& init, Rounding r)
      : ctx_(ctx), bucket_(make_bucket(ctx, init.size(), r)) {
    // The layout is aligned like the bucket, so the bucket has exactly the layout's elements.
    if (bucket_.numel() != init.size())
      throw InvalidArgument(fmt::format("demo: bucket of {} elements for {} parameters", bucket_.numel(), init.size()));
    bucket_.write_fp32(0, init.data(), init.size());
  }

  const std::uint16_t* bf16() override { return bucket_.planes().bf16; }

  void step(const TensorView& grads, OptimizerStates& states, std::int64_t step) override {
    states.step_bucket(bucket_, grads, demo_adam_options(), step);
  }

  std::vector<float> master() override {
    std::vector<float> out(bucket_.numel());
    bucket_.read_fp32(0, out.data(), out.size());
    return out;
  }

  std::string describe() const override {
    return fmt::format("weights: ParameterBucket, bf16 + residual planes ({}), 4 B/param{}",
                       to_string(bucket_.rounding()),
                       bucket_.rounding() == Rounding::nearest_even ? " + 1 tie bit" : "");
  }

 private:
  static ParameterBucket make_bucket(const Context& ctx, std::size_t n, Rounding r) {
    ScopedTag tag("weights");
    BucketOptions o;
    o.rounding = r;
    o.align_elements = static_cast<std::size_t>(kParamAlign);
    return ParameterBucket(*ctx.allocator, {ParameterSpec{"flat", {static_cast<std::int64_t>(n)}}}, o, ctx.compute);
  }

  Context ctx_;
  ParameterBucket bucket_;
};

}  // namespace

std::unique_ptr<ParameterStore> make_shared_storage_store(const Context& ctx, const std::vector<float>& init,
                                                          Rounding rounding) {
  return std::make_unique<SharedStorageStore>(ctx, init, rounding);
}

}  // namespace stowage::demo
