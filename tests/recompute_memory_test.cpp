// The memory claim, measured through the allocator: a stack of MLP layers (matmul -> GeLU ->
// matmul), forward and backward, with the activation released after forward and recomputed
// before backward, peaks lower by exactly the released activations less one layer's worth
// (less one more per layer of prefetch distance), and computes the same gradients bit for bit.
// On each backend; CUDA skips without a GPU.
#include <gtest/gtest.h>

#include "recompute_test_util.hpp"
#include "stowage/activations.hpp"
#include "stowage/cuda_device.hpp"
#include "stowage/recompute.hpp"

namespace stowage {
namespace {

using namespace stowage::testing;

constexpr int kLayers = 5;
constexpr std::int64_t kTokens = 32, kHidden = 128, kInter = 512;

struct StackRun {
  std::int64_t peak = 0;  // peak allocated bytes over forward + backward
  std::int64_t activation_block = 0;
  std::uint64_t input_grad_hash = 0;
  std::uint64_t weight_grad_hash = 0;
};

StackRun run_mlp_stack(DeviceKind kind, bool release, int prefetch_distance) {
  auto dev = make_test_device(kind, {.capacity = std::size_t{256} << 20});
  CachingAllocator alloc(*dev);
  const Stream s = dev->create_stream();
  StackRun out;
  {
    std::vector<TensorView> w1, w2;
    for (int l = 0; l < kLayers; ++l) {
      w1.push_back(TensorView::empty(alloc, DType::f32, {kHidden, kInter}, s));
      w2.push_back(TensorView::empty(alloc, DType::f32, {kInter, kHidden}, s));
      upload(*dev, w1.back(), normal_values(kHidden * kInter, 100 + l, 0.05f), s);
      upload(*dev, w2.back(), normal_values(kInter * kHidden, 200 + l, 0.05f), s);
    }
    auto x0 = TensorView::empty(alloc, DType::f32, {kTokens, kHidden}, s);
    upload(*dev, x0, normal_values(kTokens * kHidden, 7), s);
    auto dy_top = TensorView::empty(alloc, DType::f32, {kTokens, kHidden}, s);
    upload(*dev, dy_top, normal_values(kTokens * kHidden, 8), s);
    alloc.reset_peak_stats();

    RecomputeOptions o;
    o.compute_stream = s;
    o.prefetch_distance = prefetch_distance;
    Recompute rc(alloc, o);
    auto gelu = [](const RecomputeContext& c) {
      activation_forward(Activation::gelu_erf, c.inputs[0], c.outputs[0], c.stream);
    };
    // Forward: x -> h = x W1 -> a = gelu(h) -> y = a W2. Saved for backward: x, h, a.
    std::vector<TensorView> xs{x0}, hs, as;
    for (int l = 0; l < kLayers; ++l) {
      auto h = TensorView::empty(alloc, DType::f32, {kTokens, kInter}, s);
      matmul(*dev, s, xs.back(), false, w1[l], false, h);
      as.push_back(rc.forward(l, "mlp.act", {h}, {{DType::f32, {kTokens, kInter}}}, gelu)[0]);
      out.activation_block = static_cast<std::int64_t>(alloc.block_size(as.back().data()));
      auto y = TensorView::empty(alloc, DType::f32, {kTokens, kHidden}, s);
      matmul(*dev, s, as.back(), false, w2[l], false, y);
      if (release) rc.release(l);
      hs.push_back(std::move(h));
      xs.push_back(std::move(y));
    }
    xs.pop_back();  // the stack's output is not needed in backward
    // Backward, top layer first.
    TensorView dy = dy_top;
    std::vector<std::uint8_t> weight_grads;
    for (int l = kLayers - 1; l >= 0; --l) {
      rc.before_backward(l);
      auto dw2 = TensorView::empty(alloc, DType::f32, {kInter, kHidden}, s);
      matmul(*dev, s, as[l], true, dy, false, dw2);  // dW2 = a^T dy
      auto da = TensorView::empty(alloc, DType::f32, {kTokens, kInter}, s);
      matmul(*dev, s, dy, false, w2[l], true, da);  // da = dy W2^T
      auto dh = TensorView::empty(alloc, DType::f32, {kTokens, kInter}, s);
      activation_backward(Activation::gelu_erf, hs[l], da, dh, s);
      auto dw1 = TensorView::empty(alloc, DType::f32, {kHidden, kInter}, s);
      matmul(*dev, s, xs[l], true, dh, false, dw1);  // dW1 = x^T dh
      auto dx = TensorView::empty(alloc, DType::f32, {kTokens, kHidden}, s);
      matmul(*dev, s, dh, false, w1[l], true, dx);  // dx = dh W1^T
      for (const auto* g : {&dw1, &dw2}) {
        auto bytes = download(*dev, *g, s);
        weight_grads.insert(weight_grads.end(), bytes.begin(), bytes.end());
      }
      rc.after_backward(l);
      as[l] = TensorView{};
      hs[l] = TensorView{};
      xs[l] = TensorView{};
      dy = dx;
    }
    out.input_grad_hash = fnv1a(download(*dev, dy, s));
    out.weight_grad_hash = fnv1a(weight_grads);
    out.peak = alloc.stats().allocated_bytes.all.peak;
    dev->synchronize();
  }
  dev->destroy_stream(s);
  return out;
}

class RecomputeMemory : public ::testing::TestWithParam<DeviceKind> {
 protected:
  void SetUp() override {
    if (GetParam() == DeviceKind::cuda && cuda_device_count() == 0)
      GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
  }
};

TEST_P(RecomputeMemory, SavingIsReleasedActivationsLessOneLayer) {
  const StackRun keep = run_mlp_stack(GetParam(), false, 0);
  const StackRun released = run_mlp_stack(GetParam(), true, 0);
  const std::int64_t act = kTokens * kInter * 4;
  ASSERT_EQ(keep.activation_block, act);  // 64 KiB: no rounding in the block size
  EXPECT_EQ(keep.peak - released.peak, (kLayers - 1) * act);
  EXPECT_EQ(released.input_grad_hash, keep.input_grad_hash);
  EXPECT_EQ(released.weight_grad_hash, keep.weight_grad_hash);
}

TEST_P(RecomputeMemory, PrefetchDistanceHoldsOneMoreLayer) {
  const StackRun keep = run_mlp_stack(GetParam(), false, 0);
  const StackRun prefetched = run_mlp_stack(GetParam(), true, 1);
  EXPECT_EQ(keep.peak - prefetched.peak, (kLayers - 2) * kTokens * kInter * 4);
  EXPECT_EQ(prefetched.input_grad_hash, keep.input_grad_hash);
  EXPECT_EQ(prefetched.weight_grad_hash, keep.weight_grad_hash);
}

INSTANTIATE_TEST_SUITE_P(Backends, RecomputeMemory, ::testing::Values(DeviceKind::emulated, DeviceKind::cuda),
                         [](const auto& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace stowage
