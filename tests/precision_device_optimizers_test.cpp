// The fused optimizer suite on a device: 100 AdamW / SGD steps on a ParameterBucket, run where
// the bucket lives (emulated: host kernels on the stream's thread; CUDA: kernels on the stream),
// bit-identical to the host kernels (which precision_optimizers_test checks against the plain
// fp32 reference), in both rounding modes with f32 and bf16 gradients; a skipped step on Inf.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "stowage/allocator.hpp"
#include "stowage/bucket_optimizers.hpp"
#include "stowage/cuda_device.hpp"
#include "stowage/device.hpp"
#include "stowage/dlpack.hpp"
#include "stowage/emulated_device.hpp"
#include "stowage/parameter_bucket.hpp"

namespace stowage {
namespace {

class DeviceOptimizers : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "cuda") {
      if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
      device_ = make_cuda_device(0);
    } else {
      device_ = make_emulated_device(0, {.capacity = std::size_t{1} << 30});
    }
    alloc_ = std::make_unique<CachingAllocator>(*device_);
  }
  void TearDown() override {
    alloc_.reset();
    device_.reset();
  }
  template <class T>
  TensorView upload(const std::vector<T>& host, DType t) {
    TensorView v = TensorView::empty(*alloc_, t, {static_cast<std::int64_t>(host.size())});
    device_->copy_async(v.data(), host.data(), host.size() * sizeof(T), CopyKind::host_to_device, kDefaultStream);
    device_->synchronize(kDefaultStream);
    return v;
  }
  template <class T>
  std::vector<T> fetch(const void* p, std::size_t n) {
    std::vector<T> out(n);
    device_->synchronize(kDefaultStream);
    device_->copy_async(out.data(), p, n * sizeof(T), CopyKind::device_to_host, kDefaultStream);
    device_->synchronize(kDefaultStream);
    return out;
  }
  std::unique_ptr<Device> device_;
  std::unique_ptr<CachingAllocator> alloc_;
};

// Odd parameter sizes so ranges end inside tie bytes; 64-element alignment between them.
const std::vector<ParameterSpec> kParams = {{"w1", {37, 29}}, {"b1", {29}}, {"w2", {29, 101}}, {"b2", {3}}};

struct HostCopy {
  std::vector<std::uint16_t> hi, lo;
  std::vector<std::uint8_t> ties;
  SplitPlanes view;
  HostCopy(std::size_t n, Rounding r) : hi(n), lo(n), ties(n / 8 + 1) {
    view = {hi.data(), lo.data(), r == Rounding::nearest_even ? ties.data() : nullptr, n, r};
  }
};

TEST_P(DeviceOptimizers, Hundred_AdamW_And_Sgd_Steps_BitIdenticalToHostKernels) {
  for (Rounding r : {Rounding::half_up, Rounding::nearest_even}) {
    for (DType gt : {DType::f32, DType::bf16}) {
      for (int opt = 0; opt < 2; ++opt) {  // 0 AdamW, 1 SGD with Nesterov momentum
        SCOPED_TRACE(std::string(to_string(r)) + " " + to_string(gt) + (opt ? " sgd" : " adamw"));
        ParameterBucket bucket(*alloc_, kParams, {.rounding = r});
        const std::size_t n = bucket.numel();
        std::mt19937 rng(21);
        std::normal_distribution<float> d(0.0f, 0.1f);
        std::vector<float> init(n, 0.0f);
        for (std::size_t i = 0; i < bucket.size(); ++i) {
          const ParameterSlot& s = bucket.slot(i);
          for (std::size_t k = 0; k < s.numel; ++k) init[s.offset + k] = d(rng);
          bucket.write_fp32(i, init.data() + s.offset, s.numel);
        }
        HostCopy host(n, r);
        split(init.data(), host.view);
        std::vector<float> m(n, 0.0f), v(n, 0.0f);
        TensorView dm = upload(m, DType::f32), dv = upload(v, DType::f32);
        const AdamOptions adam{.lr = 1e-3f, .weight_decay = 0.01f};
        const SgdOptions sgd{.lr = 0.01f, .momentum = 0.9f, .weight_decay = 1e-4f, .nesterov = true};
        const GradScaling scaling{.loss_scale = 128.0f, .clip_coef = 0.9f};
        OptimizerState hs, ds;
        for (int step = 1; step <= 100; ++step) {
          std::vector<float> gf(n);
          std::vector<std::uint16_t> gb(n);
          for (std::size_t i = 0; i < n; ++i) {
            gf[i] = d(rng) * 128.0f;
            gb[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(gf[i]) >> 16);
          }
          TensorView g = gt == DType::bf16 ? upload(gb, DType::bf16) : upload(gf, DType::f32);
          const HostGrad hg{gt == DType::bf16 ? static_cast<const void*>(gb.data()) : gf.data(), gt};
          StepResult dr, hr;
          if (opt == 0) {
            hr = adam_step(host.view, hg, m.data(), v.data(), adam, scaling, hs);
            dr = adam_step(bucket, g, dm, dv, adam, scaling, ds);
          } else {
            hr = sgd_step(host.view, hg, m.data(), sgd, scaling, hs);
            dr = sgd_step(bucket, g, dm, sgd, scaling, ds);
          }
          ASSERT_TRUE(hr.applied && dr.applied);
          ASSERT_EQ(dr.step, step);
        }
        const SplitPlanes p = bucket.planes();
        EXPECT_EQ(fetch<std::uint16_t>(p.bf16, n), host.hi);
        EXPECT_EQ(fetch<std::uint16_t>(p.residual, n), host.lo);
        if (r == Rounding::nearest_even) {
          EXPECT_EQ(fetch<std::uint8_t>(p.ties, n / 8),
                    std::vector<std::uint8_t>(host.ties.begin(), host.ties.begin() + n / 8));
        }
        EXPECT_EQ(fetch<float>(dm.data(), n), m);
        if (opt == 0) EXPECT_EQ(fetch<float>(dv.data(), n), v);
        // fp32 read-back equals the host merge
        std::vector<float> master(n), back(bucket.slot(2).numel);
        merge(host.view, master.data());
        bucket.read_fp32(2, back.data(), back.size());
        EXPECT_EQ(std::memcmp(back.data(), master.data() + bucket.slot(2).offset, back.size() * 4), 0);
      }
    }
  }
}

TEST_P(DeviceOptimizers, InfGradientSkipsTheStepOnTheDevice) {
  ParameterBucket bucket(*alloc_, kParams, {.rounding = Rounding::nearest_even});
  const std::size_t n = bucket.numel();
  std::vector<float> w(bucket.slot(0).numel, 0.5f);
  bucket.write_fp32(0, w.data(), w.size());
  const SplitPlanes p = bucket.planes();
  const auto before = fetch<std::uint16_t>(p.bf16, 2 * n);
  std::vector<float> g(n, 0.01f);
  g[n - 1] = INFINITY;
  TensorView dg = upload(g, DType::f32), m = upload(std::vector<float>(n, 0.0f), DType::f32);
  TensorView v = upload(std::vector<float>(n, 0.0f), DType::f32);
  OptimizerState st{4};
  const StepResult r = adam_step(bucket, dg, m, v, {}, {.loss_scale = 1024.0f}, st);
  EXPECT_FALSE(r.applied);
  EXPECT_TRUE(r.found_nonfinite);
  EXPECT_EQ(st.step, 4);
  EXPECT_EQ(fetch<std::uint16_t>(p.bf16, 2 * n), before);
}

// With the finite check off, NaN and Inf gradients of every payload class make non-finite weights,
// and the bf16 plane must show them: a NaN as 0x7FC0, not as the -0 that CUDA's arithmetic NaN
// (0x7FFFFFFF) would split into. Bit-identical to the host kernels, AdamW and SGD, both roundings.
TEST_P(DeviceOptimizers, NanGradientsWithTheCheckOffLeaveNanInTheBf16Plane) {
  const std::vector<std::uint32_t> bad = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFFBFFFFFu,
                                          0x7FFFFFFFu, 0x7F800000u, 0xFF800000u};
  for (Rounding r : {Rounding::half_up, Rounding::nearest_even}) {
    for (int opt = 0; opt < 2; ++opt) {
      SCOPED_TRACE(std::string(to_string(r)) + (opt ? " sgd" : " adamw"));
      ParameterBucket bucket(*alloc_, kParams, {.rounding = r});
      const std::size_t n = bucket.numel();
      std::vector<float> init(n, 0.25f), g(n, 0.01f);
      for (std::size_t i = 0; i < bucket.size(); ++i) bucket.write_fp32(i, init.data(), bucket.slot(i).numel);
      std::vector<std::size_t> at;
      for (std::size_t k = 0; k < bad.size(); ++k) {
        at.push_back(bucket.slot(0).offset + 3 * k);
        g[at.back()] = std::bit_cast<float>(bad[k]);
      }
      HostCopy host(n, r);  // the bucket's masters, padding (zeros) included
      std::vector<float> master(n, 0.0f);
      for (std::size_t i = 0; i < bucket.size(); ++i) {
        const ParameterSlot& s = bucket.slot(i);
        bucket.read_fp32(i, master.data() + s.offset, s.numel);
      }
      split(master.data(), host.view);
      std::vector<float> m(n, 0.0f), v(n, 0.0f);
      TensorView dg = upload(g, DType::f32), dm = upload(m, DType::f32), dv = upload(v, DType::f32);
      const GradScaling off{.skip_nonfinite = false};
      OptimizerState hs, ds;
      StepResult hr, dr;
      if (opt == 0) {
        hr = adam_step(host.view, HostGrad{g.data(), DType::f32}, m.data(), v.data(), {}, off, hs);
        dr = adam_step(bucket, dg, dm, dv, {}, off, ds);
      } else {
        hr = sgd_step(host.view, HostGrad{g.data(), DType::f32}, m.data(), {.lr = 0.1f, .momentum = 0.9f}, off, hs);
        dr = sgd_step(bucket, dg, dm, {.lr = 0.1f, .momentum = 0.9f}, off, ds);
      }
      ASSERT_TRUE(hr.applied && dr.applied);
      const SplitPlanes p = bucket.planes();
      const auto bf16 = fetch<std::uint16_t>(p.bf16, n);
      for (std::size_t i : at) {  // NaN as the canonical 0x7FC0; SGD turns an Inf gradient into an Inf weight
        EXPECT_EQ(bf16[i] & 0x7F80u, 0x7F80u) << "element " << i << " reads as finite";
        if ((bf16[i] & 0x7Fu) != 0) EXPECT_EQ(bf16[i], 0x7FC0u) << "element " << i;
      }
      EXPECT_EQ(bf16, host.hi);
      EXPECT_EQ(fetch<std::uint16_t>(p.residual, n), host.lo);
    }
  }
}

// A parameter's bf16 weights leave as an ordinary DLPack bf16 tensor over the shared storage.
TEST_P(DeviceOptimizers, Bf16ViewExportsThroughDlpack) {
  ParameterBucket bucket(*alloc_, kParams);
  DLManagedTensor* t = to_dlpack(bucket.bf16(2));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dl_tensor.dtype.code, kDLBfloat);
  EXPECT_EQ(t->dl_tensor.dtype.bits, 16);
  ASSERT_EQ(t->dl_tensor.ndim, 2);
  EXPECT_EQ(t->dl_tensor.shape[0], 29);
  EXPECT_EQ(t->dl_tensor.shape[1], 101);
  const auto* base = static_cast<const char*>(t->dl_tensor.data) + t->dl_tensor.byte_offset;
  EXPECT_EQ(base, static_cast<const char*>(bucket.storage().data()) + 2 * bucket.slot(2).offset);
  t->deleter(t);
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceOptimizers, ::testing::Values("emulated", "cuda"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace stowage
