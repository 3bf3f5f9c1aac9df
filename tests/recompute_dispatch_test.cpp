// Tensor-level activation dispatch on the emulated device: the kernel runs on the stream's
// thread and gives the pointer-level kernel's bits; mismatched tensors are refused up front.
#include <gtest/gtest.h>

#include "recompute_test_util.hpp"
#include "stowage/activations.hpp"

namespace stowage {
namespace {

using namespace stowage::testing;

class ActivationDispatch : public ::testing::Test {
 protected:
  void SetUp() override {
    dev_ = small_device(64 << 20);
    alloc_ = std::make_unique<CachingAllocator>(*dev_);
    s_ = dev_->create_stream();
  }
  void TearDown() override {
    dev_->synchronize();
    alloc_.reset();
    dev_->destroy_stream(s_);
  }
  TensorView tensor(DType t, std::vector<std::int64_t> shape) { return TensorView::empty(*alloc_, t, shape, s_); }
  std::unique_ptr<Device> dev_;
  std::unique_ptr<CachingAllocator> alloc_;
  Stream s_{};
};

TEST_F(ActivationDispatch, RunsOnTheStreamAndMatchesThePointerKernels) {
  const auto xv = normal_values(24 * 40, 1, 2.0f), bv = normal_values(40, 2), dv = normal_values(24 * 40, 3);
  auto x = tensor(DType::f32, {24, 40}), b = tensor(DType::f32, {40}), dy = tensor(DType::f32, {24, 40});
  upload(*dev_, x, xv, s_);
  upload(*dev_, b, bv, s_);
  upload(*dev_, dy, dv, s_);
  auto y = tensor(DType::f32, {24, 40}), dx = tensor(DType::f32, {24, 40}), db = tensor(DType::f32, {40});
  auto as_floats = [](const std::vector<std::uint8_t>& bytes) {
    std::vector<float> f(bytes.size() / 4);
    std::memcpy(f.data(), bytes.data(), bytes.size());
    return f;
  };
  std::vector<float> want(24 * 40), want_dx(24 * 40), want_db(40);

  activation_forward(Activation::silu, x, y, s_);
  cpu::activation_forward(Activation::silu, DType::f32, want.size(), xv.data(), want.data());
  EXPECT_EQ(as_floats(download(*dev_, y, s_)), want);

  bias_activation_backward(Activation::gelu_tanh, x, b, dy, dx, db, s_);
  cpu::bias_activation_backward(Activation::gelu_tanh, DType::f32, 24, 40, xv.data(), bv.data(), dv.data(),
                                want_dx.data(), want_db.data());
  EXPECT_EQ(as_floats(download(*dev_, dx, s_)), want_dx);
  EXPECT_EQ(as_floats(download(*dev_, db, s_)), want_db);

  // GeGLU on the two halves of x seen as a fused [24, 2*20] projection.
  auto g = x.slice(1, 0, 20), u = x.slice(1, 20, 40);
  auto yg = tensor(DType::f32, {24, 20});
  gated_activation_forward(Activation::gelu_erf, g, u, yg, s_);
  std::vector<float> want_g(24 * 20);
  cpu::gated_activation_forward(Activation::gelu_erf, DType::f32, 24, 20, xv.data(), 40, xv.data() + 20, 40,
                                want_g.data());
  EXPECT_EQ(as_floats(download(*dev_, yg, s_)), want_g);
}

TEST_F(ActivationDispatch, MismatchedTensorsAreRefusedBeforeLaunch) {
  auto x = tensor(DType::f32, {8, 16}), y = tensor(DType::f32, {8, 16});
  dev_->fill_async(y.data(), 0x11, y.nbytes(), s_);
  const auto before = download(*dev_, y, s_);
  EXPECT_THROW(activation_forward(Activation::relu, x, tensor(DType::f32, {8, 15}), s_), InvalidArgument);
  EXPECT_THROW(activation_forward(Activation::relu, x, tensor(DType::bf16, {8, 16}), s_), InvalidArgument);
  EXPECT_THROW(activation_forward(Activation::relu, tensor(DType::f16, {8, 16}), tensor(DType::f16, {8, 16}), s_),
               Unsupported);
  EXPECT_THROW(activation_forward(Activation::relu, x, TensorView{}, s_), InvalidArgument);
  EXPECT_THROW(activation_forward(Activation::relu, x.slice(1, 0, 8), y.slice(1, 0, 8), s_), InvalidArgument);
  EXPECT_THROW(bias_activation_forward(Activation::relu, x, tensor(DType::f32, {8}), y, s_), InvalidArgument);
  EXPECT_THROW(gated_activation_forward(Activation::silu, x, x, tensor(DType::f32, {8, 16}).slice(1, 0, 8), s_),
               InvalidArgument);
  auto released = tensor(DType::f32, {8, 16});
  released.storage().release();
  EXPECT_THROW(activation_forward(Activation::relu, released, y, s_), InvalidArgument);
  EXPECT_EQ(download(*dev_, y, s_), before);
}

TEST(ActivationNames, ToString) {
  EXPECT_STREQ(to_string(Activation::gelu_erf), "gelu_erf");
  EXPECT_STREQ(to_string(Activation::gelu_tanh), "gelu_tanh");
  EXPECT_STREQ(to_string(Activation::silu), "silu");
  EXPECT_STREQ(to_string(Activation::relu), "relu");
}

}  // namespace
}  // namespace stowage
