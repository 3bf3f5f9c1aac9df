// Tensor-level activation dispatch on each backend: the kernel runs on the stream (the stream's
// thread on the emulated device, native(stream) on CUDA) and gives the bits of that backend's
// pointer-level kernel; mismatched tensors are refused up front. CUDA skips without a GPU.
#include <gtest/gtest.h>

#include <functional>

#include "recompute_test_util.hpp"
#include "stowage/activations.hpp"
#include "stowage/cuda_device.hpp"

namespace stowage {
namespace {

using namespace stowage::testing;

class ActivationDispatch : public ::testing::TestWithParam<DeviceKind> {
 protected:
  void SetUp() override {
    if (GetParam() == DeviceKind::cuda && cuda_device_count() == 0)
      GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
    dev_ = make_test_device(GetParam(), {.capacity = std::size_t{64} << 20});
    alloc_ = std::make_unique<CachingAllocator>(*dev_);
    s_ = dev_->create_stream();
  }
  void TearDown() override {
    if (!dev_) return;  // skipped
    dev_->synchronize();
    alloc_.reset();
    dev_->destroy_stream(s_);
  }
  TensorView tensor(DType t, std::vector<std::int64_t> shape) { return TensorView::empty(*alloc_, t, shape, s_); }
  bool on_cuda() const { return GetParam() == DeviceKind::cuda; }

  // Runs a pointer-level kernel where this backend's kernels read memory: on the host buffers
  // themselves (CPU kernels), or on device copies of them, copied back after (CUDA kernels, given
  // the stream).
  template <class... Vecs>
  void pointer_level(const std::function<void(const std::vector<void*>&, void*)>& fn, Vecs&... vecs) {
    const std::vector<std::vector<float>*> host{&vecs...};
    std::vector<void*> ptrs;
    if (!on_cuda()) {
      for (auto* h : host) ptrs.push_back(h->data());
      fn(ptrs, nullptr);
      return;
    }
    std::vector<TensorView> bufs;
    for (auto* h : host) {
      bufs.push_back(tensor(DType::f32, {static_cast<std::int64_t>(h->size())}));
      upload(*dev_, bufs.back(), *h, s_);
      ptrs.push_back(bufs.back().data());
    }
    fn(ptrs, native(s_));
    for (std::size_t i = 0; i < host.size(); ++i) {
      const auto bytes = download(*dev_, bufs[i], s_);
      std::memcpy(host[i]->data(), bytes.data(), bytes.size());
    }
  }
  std::unique_ptr<Device> dev_;
  std::unique_ptr<CachingAllocator> alloc_;
  Stream s_{};
};

TEST_P(ActivationDispatch, RunsOnTheStreamAndMatchesThePointerKernels) {
  auto xv = normal_values(24 * 40, 1, 2.0f), bv = normal_values(40, 2), dv = normal_values(24 * 40, 3);
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
  pointer_level(
      [&](const auto& p, void* st) {
        if (on_cuda()) cuda::activation_forward(Activation::silu, DType::f32, want.size(), p[0], p[1], st);
        else cpu::activation_forward(Activation::silu, DType::f32, want.size(), p[0], p[1]);
      },
      xv, want);
  EXPECT_EQ(as_floats(download(*dev_, y, s_)), want);

  bias_activation_backward(Activation::gelu_tanh, x, b, dy, dx, db, s_);
  pointer_level(
      [&](const auto& p, void* st) {
        if (on_cuda())
          cuda::bias_activation_backward(Activation::gelu_tanh, DType::f32, 24, 40, p[0], p[1], p[2], p[3], p[4], st);
        else cpu::bias_activation_backward(Activation::gelu_tanh, DType::f32, 24, 40, p[0], p[1], p[2], p[3], p[4]);
      },
      xv, bv, dv, want_dx, want_db);
  EXPECT_EQ(as_floats(download(*dev_, dx, s_)), want_dx);
  EXPECT_EQ(as_floats(download(*dev_, db, s_)), want_db);

  // GeGLU on the two halves of x seen as a fused [24, 2*20] projection.
  auto g = x.slice(1, 0, 20), u = x.slice(1, 20, 40);
  auto yg = tensor(DType::f32, {24, 20});
  gated_activation_forward(Activation::gelu_erf, g, u, yg, s_);
  std::vector<float> want_g(24 * 20);
  pointer_level(
      [&](const auto& p, void* st) {
        const float* up = static_cast<const float*>(p[0]) + 20;
        if (on_cuda())
          cuda::gated_activation_forward(Activation::gelu_erf, DType::f32, 24, 20, p[0], 40, up, 40, p[1], st);
        else cpu::gated_activation_forward(Activation::gelu_erf, DType::f32, 24, 20, p[0], 40, up, 40, p[1]);
      },
      xv, want_g);
  EXPECT_EQ(as_floats(download(*dev_, yg, s_)), want_g);
}

TEST_P(ActivationDispatch, MismatchedTensorsAreRefusedBeforeLaunch) {
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

INSTANTIATE_TEST_SUITE_P(Backends, ActivationDispatch, ::testing::Values(DeviceKind::emulated, DeviceKind::cuda),
                         [](const auto& info) { return std::string(to_string(info.param)); });

TEST(ActivationNames, ToString) {
  EXPECT_STREQ(to_string(Activation::gelu_erf), "gelu_erf");
  EXPECT_STREQ(to_string(Activation::gelu_tanh), "gelu_tanh");
  EXPECT_STREQ(to_string(Activation::silu), "silu");
  EXPECT_STREQ(to_string(Activation::relu), "relu");
}

}  // namespace
}  // namespace stowage
