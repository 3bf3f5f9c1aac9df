// The C ABI of shared storage: split / merge / the fused steps give exactly what the C++ API gives,
// and every bad argument is refused with a clear error and nothing written.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "capi_test_util.hpp"
#include "stowage/optimizers.hpp"
#include "stowage/precision.hpp"
#include "stowage/runtime.hpp"
#include "stowage/stowage.h"

namespace {

using stowage::test::random_floats;
using stowage::test::refused;

struct Planes {
  explicit Planes(std::size_t n, int rounding)
      : bf16(n), residual(n), ties((n + 7) / 8), c{bf16.data(), residual.data(), ties.data(), n, rounding} {}
  std::vector<std::uint16_t> bf16, residual;
  std::vector<std::uint8_t> ties;
  stowage_split_planes c;
  stowage::SplitPlanes cpp() const {
    return {const_cast<std::uint16_t*>(bf16.data()), const_cast<std::uint16_t*>(residual.data()),
            c.rounding == STOWAGE_ROUND_NEAREST_EVEN ? const_cast<std::uint8_t*>(ties.data()) : nullptr, c.numel,
            c.rounding == STOWAGE_ROUND_NEAREST_EVEN ? stowage::Rounding::nearest_even : stowage::Rounding::half_up};
  }
};

// Blocks the C ABI's allocator of device 0 has handed out so far.
std::int64_t allocations_made() {
  std::string buf(static_cast<std::size_t>(stowage_get_stats(0, nullptr, 0)) + 1, '\0');
  stowage_get_stats(0, buf.data(), buf.size());
  return nlohmann::json::parse(buf.c_str()).at("allocation.all.allocated").get<std::int64_t>();
}

TEST(CapiPrecision, SplitAndMergeAreExactInBothRoundings) {
  for (int rounding : {STOWAGE_ROUND_HALF_UP, STOWAGE_ROUND_NEAREST_EVEN}) {
    const std::size_t n = 1001;
    std::vector<float> src = random_floats(n, 1), back(n);
    src[7] = std::bit_cast<float>(0x3F808000u);  // an exact tie with an odd bf16
    Planes p(n, rounding);
    ASSERT_EQ(stowage_split(src.data(), &p.c), 0) << stowage_last_error();
    ASSERT_EQ(stowage_merge(&p.c, back.data()), 0) << stowage_last_error();
    EXPECT_EQ(std::memcmp(src.data(), back.data(), n * 4), 0);
    for (std::size_t i = 0; i < n; ++i) {
      const auto s = stowage::split_bits(std::bit_cast<std::uint32_t>(src[i]), rounding == STOWAGE_ROUND_HALF_UP
                                                                                   ? stowage::Rounding::half_up
                                                                                   : stowage::Rounding::nearest_even);
      ASSERT_EQ(p.bf16[i], s.bf16) << i;
    }
    EXPECT_EQ(p.bf16[7], rounding == STOWAGE_ROUND_HALF_UP ? 0x3F81 : 0x3F80);
  }
}

TEST(CapiPrecision, AdamStepIsTheCppStepAndSkipsNonFiniteGradients) {
  const std::size_t n = 517;
  const std::vector<float> w = random_floats(n, 2);
  std::vector<float> grad = random_floats(n, 3);
  Planes a(n, STOWAGE_ROUND_NEAREST_EVEN), b(n, STOWAGE_ROUND_NEAREST_EVEN);
  ASSERT_EQ(stowage_split(w.data(), &a.c), 0);
  ASSERT_EQ(stowage_split(w.data(), &b.c), 0);
  std::vector<float> ma(n), va(n), mb(n), vb(n);
  const stowage_adam_options o{1e-2f, 0.9f, 0.99f, 1e-8f, 0.1f, 1};
  const stowage_grad_scaling sc{4.0f, 0.5f, 1};
  std::int64_t step = 0;
  stowage::OptimizerState state;
  for (int k = 0; k < 3; ++k) {
    ASSERT_EQ(stowage_adam_step(&a.c, grad.data(), 32, ma.data(), va.data(), &o, &sc, &step), 1)
        << stowage_last_error();
    stowage::adam_step(b.cpp(), {grad.data(), stowage::DType::f32}, mb.data(), vb.data(),
                       {1e-2f, 0.9f, 0.99f, 1e-8f, 0.1f, true}, {4.0f, 0.5f, true}, state);
  }
  EXPECT_EQ(step, 3);
  EXPECT_EQ(a.bf16, b.bf16);
  EXPECT_EQ(a.residual, b.residual);
  EXPECT_EQ(a.ties, b.ties);
  EXPECT_EQ(std::memcmp(ma.data(), mb.data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(va.data(), vb.data(), n * 4), 0);
  // A NaN gradient: skipped, nothing written, the count unchanged.
  grad[100] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(stowage_any_nonfinite(grad.data(), 32, n), 1);
  EXPECT_EQ(stowage_any_nonfinite(grad.data(), 32, 100), 0);
  const auto before = a.residual;
  EXPECT_EQ(stowage_adam_step(&a.c, grad.data(), 32, ma.data(), va.data(), &o, &sc, &step), 0);
  EXPECT_EQ(step, 3);
  EXPECT_EQ(a.residual, before);
}

TEST(CapiPrecision, SgdStepWithBf16GradientsIsTheCppStep) {
  const std::size_t n = 300;
  const std::vector<float> w = random_floats(n, 4), g32 = random_floats(n, 5);
  std::vector<std::uint16_t> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(g32[i]) >> 16);
  Planes a(n, STOWAGE_ROUND_HALF_UP), b(n, STOWAGE_ROUND_HALF_UP);
  ASSERT_EQ(stowage_split(w.data(), &a.c), 0);
  ASSERT_EQ(stowage_split(w.data(), &b.c), 0);
  std::vector<float> ba(n), bb(n);
  const stowage_sgd_options o{0.1f, 0.9f, 0.0f, 0.01f, 1};
  std::int64_t step = 0;
  stowage::OptimizerState state;
  for (int k = 0; k < 2; ++k) {
    ASSERT_EQ(stowage_sgd_step(&a.c, g.data(), 16, ba.data(), &o, nullptr, &step), 1) << stowage_last_error();
    stowage::sgd_step(b.cpp(), {g.data(), stowage::DType::bf16}, bb.data(), {0.1f, 0.9f, 0.0f, 0.01f, true}, {}, state);
  }
  EXPECT_EQ(a.bf16, b.bf16);
  EXPECT_EQ(a.residual, b.residual);
  EXPECT_EQ(std::memcmp(ba.data(), bb.data(), n * 4), 0);
}

TEST(CapiPrecision, RefusesBadArgumentsAndWritesNothing) {
  const std::size_t n = 64;
  std::vector<float> w = random_floats(n, 6), grad(n, 1.0f), m(n), v(n);
  Planes p(n, STOWAGE_ROUND_NEAREST_EVEN);
  ASSERT_EQ(stowage_split(w.data(), &p.c), 0);
  const auto bf16 = p.bf16;
  const stowage_adam_options o{1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1};
  std::int64_t step = 0;
  EXPECT_TRUE(refused(stowage_split(w.data(), nullptr), "null planes"));
  Planes bad = p;
  bad.c = p.c;
  bad.c.rounding = 7;
  EXPECT_TRUE(refused(stowage_merge(&bad.c, w.data()), "rounding 7"));
  bad.c = p.c;
  bad.c.ties = nullptr;
  EXPECT_TRUE(refused(stowage_split(w.data(), &bad.c), "tie bitmap"));
  bad.c = p.c;
  bad.c.bf16 = reinterpret_cast<std::uint16_t*>(reinterpret_cast<char*>(p.bf16.data()) + 1);
  EXPECT_TRUE(refused(stowage_split(w.data(), &bad.c), "aligned"));
  EXPECT_TRUE(refused(stowage_split(nullptr, &p.c), "source"));
  EXPECT_TRUE(refused(stowage_any_nonfinite(grad.data(), 8, n), "grad_bits 8"));
  EXPECT_TRUE(
      refused(stowage_adam_step(&p.c, grad.data(), 32, m.data(), v.data(), nullptr, nullptr, &step), "null options"));
  EXPECT_TRUE(refused(stowage_adam_step(&p.c, grad.data(), 32, m.data(), v.data(), &o, nullptr, nullptr), "step"));
  step = -2;
  EXPECT_TRUE(refused(stowage_adam_step(&p.c, grad.data(), 32, m.data(), v.data(), &o, nullptr, &step), "step"));
  step = 0;
  EXPECT_TRUE(refused(stowage_adam_step(&p.c, grad.data(), 32, nullptr, v.data(), &o, nullptr, &step), "exp_avg"));
  const stowage_grad_scaling zero_scale{0.0f, 1.0f, 1};
  EXPECT_TRUE(
      refused(stowage_adam_step(&p.c, grad.data(), 32, m.data(), v.data(), &o, &zero_scale, &step), "loss_scale"));
  const stowage_sgd_options so{0.1f, 0.9f, 0.0f, 0.0f, 0};
  EXPECT_TRUE(refused(stowage_sgd_step(&p.c, grad.data(), 32, nullptr, &so, nullptr, &step), "momentum buffer"));
  EXPECT_EQ(step, 0);
  EXPECT_EQ(p.bf16, bf16);
  for (float x : m) EXPECT_EQ(x, 0.0f);
  // And the next good call works.
  EXPECT_EQ(stowage_adam_step(&p.c, grad.data(), 32, m.data(), v.data(), &o, nullptr, &step), 1);
  EXPECT_STREQ(stowage_last_error(), "");
  EXPECT_EQ(step, 1);
}

// The steps queued on a device's stream (here an emulated device, whose memory the host reads) give
// exactly what the host steps give; the finite check runs on the stream.
TEST(CapiPrecision, StepsQueuedOnADeviceStreamAreTheHostSteps) {
  const std::size_t n = 1000;
  const std::vector<float> w = random_floats(n, 7);
  std::vector<float> grad = random_floats(n, 8), m(n), v(n);
  Planes host(n, STOWAGE_ROUND_NEAREST_EVEN);
  ASSERT_EQ(stowage_split(w.data(), &host.c), 0);
  // The same planes, gradient and moments in device memory (a GPU's when the C ABI uses CUDA:
  // copied by the device, never touched from the host).
  std::vector<std::pair<void*, std::size_t>> blocks;
  stowage::Device& d = stowage::device(0);
  auto upload = [&d](void* dst, const void* src, std::size_t bytes) {
    d.copy_async(dst, src, bytes, stowage::CopyKind::host_to_device, stowage::kDefaultStream);
    d.synchronize(stowage::kDefaultStream);
  };
  auto device_copy = [&blocks, &upload](const void* src, std::size_t bytes) {
    void* p = stowage_malloc(static_cast<ssize_t>(bytes), 0, nullptr);
    EXPECT_NE(p, nullptr) << stowage_last_error();
    upload(p, src, bytes);
    blocks.emplace_back(p, bytes);
    return p;
  };
  // memcmp of device bytes against host bytes (0 when equal).
  auto compare = [&d](const void* dev_ptr, const void* host_ptr, std::size_t bytes) {
    std::vector<std::uint8_t> back(bytes);
    d.synchronize(stowage::kDefaultStream);
    d.copy_async(back.data(), dev_ptr, bytes, stowage::CopyKind::device_to_host, stowage::kDefaultStream);
    d.synchronize(stowage::kDefaultStream);
    return std::memcmp(back.data(), host_ptr, bytes);
  };
  auto* hi = static_cast<std::uint16_t*>(device_copy(host.bf16.data(), n * 2));
  auto* lo = static_cast<std::uint16_t*>(device_copy(host.residual.data(), n * 2));
  auto* ties = static_cast<std::uint8_t*>(device_copy(host.ties.data(), host.ties.size()));
  auto* dgrad = static_cast<float*>(device_copy(grad.data(), n * 4));
  auto* dm = static_cast<float*>(device_copy(m.data(), n * 4));
  auto* dv = static_cast<float*>(device_copy(v.data(), n * 4));
  const stowage_split_planes dev{hi, lo, ties, n, STOWAGE_ROUND_NEAREST_EVEN};
  const stowage_adam_options o{1e-2f, 0.9f, 0.99f, 1e-8f, 0.1f, 1};
  std::int64_t host_step = 0, dev_step = 0;
  for (int k = 0; k < 3; ++k) {
    const stowage_grad_scaling sc{2.0f, 0.5f, k % 2};  // the finite check on the stream, and without it
    ASSERT_EQ(stowage_adam_step(&host.c, grad.data(), 32, m.data(), v.data(), &o, &sc, &host_step), 1);
    ASSERT_EQ(stowage_adam_step_async(0, nullptr, &dev, dgrad, 32, dm, dv, &o, &sc, &dev_step), 1)
        << stowage_last_error();
  }
  ASSERT_EQ(stowage_synchronize(0, nullptr), 0) << stowage_last_error();
  EXPECT_EQ(dev_step, 3);
  EXPECT_EQ(compare(hi, host.bf16.data(), n * 2), 0);
  EXPECT_EQ(compare(lo, host.residual.data(), n * 2), 0);
  EXPECT_EQ(compare(ties, host.ties.data(), host.ties.size()), 0);
  EXPECT_EQ(compare(dm, m.data(), n * 4), 0);
  EXPECT_EQ(compare(dv, v.data(), n * 4), 0);
  // A NaN gradient on the device: skipped, nothing written, the count unchanged.
  const float nan = std::numeric_limits<float>::quiet_NaN(), one = 1.0f;
  upload(dgrad + 500, &nan, sizeof nan);
  const stowage_grad_scaling check{1.0f, 1.0f, 1};
  EXPECT_EQ(stowage_adam_step_async(0, nullptr, &dev, dgrad, 32, dm, dv, &o, &check, &dev_step), 0);
  EXPECT_EQ(dev_step, 3);
  EXPECT_EQ(compare(lo, host.residual.data(), n * 2), 0);
  // SGD queued the same way.
  const stowage_sgd_options so{0.1f, 0.0f, 0.0f, 0.0f, 0};
  upload(dgrad + 500, &one, sizeof one);
  grad[500] = 1.0f;
  std::int64_t s1 = 0, s2 = 0;
  ASSERT_EQ(stowage_sgd_step(&host.c, grad.data(), 32, nullptr, &so, nullptr, &s1), 1);
  ASSERT_EQ(stowage_sgd_step_async(0, nullptr, &dev, dgrad, 32, nullptr, &so, nullptr, &s2), 1);
  ASSERT_EQ(stowage_synchronize(0, nullptr), 0);
  EXPECT_EQ(compare(lo, host.residual.data(), n * 2), 0);
  // Bad input: refused, nothing queued.
  EXPECT_TRUE(
      refused(stowage_adam_step_async(99, nullptr, &dev, dgrad, 32, dm, dv, &o, nullptr, &dev_step), "device 99"));
  EXPECT_TRUE(
      refused(stowage_adam_step_async(0, nullptr, &dev, dgrad, 8, dm, dv, &o, nullptr, &dev_step), "grad_bits 8"));
  // A stream that was destroyed (a made-up handle is not detectable on CUDA: the runtime
  // dereferences what it is given, docs of Device::check_stream).
  const stowage::Stream gone = d.create_stream();
  d.destroy_stream(gone);
  void* gone_native = stowage::native(gone);
  EXPECT_TRUE(refused(stowage_synchronize(0, gone_native), "stream"));
  const stowage_grad_scaling unchecked{1.0f, 1.0f, 0};
  EXPECT_TRUE(refused(stowage_adam_step_async(0, gone_native, &dev, dgrad, 32, dm, dv, &o, &unchecked, &dev_step),
                      "stream"));  // refused before a kernel is queued on it, with the finite check off too
  // A refused call allocates nothing (the finite check's flag comes after the argument checks).
  const std::int64_t allocations = allocations_made();
  EXPECT_TRUE(
      refused(stowage_adam_step_async(0, nullptr, &dev, dgrad, 32, nullptr, dv, &o, &check, &dev_step), "exp_avg"));
  EXPECT_EQ(allocations_made(), allocations);
  EXPECT_EQ(dev_step, 3);
  for (auto [p, bytes] : blocks) {
    stowage_free(p, static_cast<ssize_t>(bytes), 0, nullptr);
    EXPECT_EQ(stowage_last_error_code(), STOWAGE_OK) << stowage_last_error();
  }
}

}  // namespace
