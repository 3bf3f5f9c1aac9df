// The C ABI's multi-tensor steps: each tensor ends bit-identical to its one-tensor step, the skip
// decision is one for all tensors, and a bad tensor anywhere is refused before any is written, on
// the host and queued on a device's stream.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "capi_test_util.hpp"
#include "stowage/runtime.hpp"
#include "stowage/stowage.h"

namespace {

using stowage::test::random_floats;
using stowage::test::refused;

// One tensor of a step on the host: planes, a gradient (fp32 or bf16), two state arrays.
struct Tensor {
  Tensor(std::size_t n, int rounding, int grad_bits, unsigned seed)
      : bf16(n), residual(n), ties((n + 7) / 8), s0(n), s1(n), bits(grad_bits) {
    const std::vector<float> w = random_floats(n, seed), g = random_floats(n, seed + 100);
    planes = {bf16.data(), residual.data(), rounding == STOWAGE_ROUND_NEAREST_EVEN ? ties.data() : nullptr, n,
              rounding};
    EXPECT_EQ(stowage_split(w.data(), &planes), 0) << stowage_last_error();
    grad32 = g;
    for (float x : g) grad16.push_back(static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(x) >> 16));
  }
  const void* grad() const { return bits == 32 ? static_cast<const void*>(grad32.data()) : grad16.data(); }
  stowage_step_tensor c(bool with_s1 = true) {
    return {planes, grad(), bits, s0.data(), with_s1 ? s1.data() : nullptr, step};
  }
  bool operator==(const Tensor& o) const {
    return bf16 == o.bf16 && residual == o.residual && ties == o.ties && s0 == o.s0 && s1 == o.s1 && step == o.step;
  }
  std::vector<std::uint16_t> bf16, residual;
  std::vector<std::uint8_t> ties;
  std::vector<float> s0, s1, grad32;
  std::vector<std::uint16_t> grad16;
  stowage_split_planes planes{};
  int bits;
  std::int64_t step = 0;
};

// Sizes that are not multiples of a vector or a tie byte, both roundings, both gradient widths.
std::vector<Tensor> model(unsigned seed) {
  std::vector<Tensor> ts;
  ts.emplace_back(517, STOWAGE_ROUND_NEAREST_EVEN, 32, seed);
  ts.emplace_back(64, STOWAGE_ROUND_HALF_UP, 16, seed + 1);
  ts.emplace_back(1000, STOWAGE_ROUND_NEAREST_EVEN, 16, seed + 2);
  return ts;
}

std::vector<stowage_step_tensor> views(std::vector<Tensor>& ts, bool with_s1 = true) {
  std::vector<stowage_step_tensor> out;
  for (Tensor& t : ts) out.push_back(t.c(with_s1));
  return out;
}

void take_steps(std::vector<Tensor>& ts, const std::vector<stowage_step_tensor>& cs) {
  for (std::size_t i = 0; i < ts.size(); ++i) ts[i].step = cs[i].step;
}

// The C ABI's statistics of device 0, as JSON.
std::string stats_json() {
  std::string s(static_cast<std::size_t>(stowage_get_stats(0, nullptr, 0)) + 1, '\0');
  stowage_get_stats(0, s.data(), s.size());
  return s;
}

const stowage_adam_options kAdam{1e-2f, 0.9f, 0.99f, 1e-8f, 0.1f, 1};
const stowage_sgd_options kSgd{0.1f, 0.9f, 0.0f, 0.01f, 1};

TEST(CapiMultiStep, EachTensorIsItsOneTensorStep) {
  std::vector<Tensor> multi = model(1), one = model(1);
  const stowage_grad_scaling sc{4.0f, 0.5f, 1};
  for (int k = 0; k < 3; ++k) {
    std::vector<stowage_step_tensor> cs = views(multi);
    ASSERT_EQ(stowage_adam_step_multi(cs.size(), cs.data(), &kAdam, &sc), 1) << stowage_last_error();
    take_steps(multi, cs);
    for (Tensor& t : one)
      ASSERT_EQ(stowage_adam_step(&t.planes, t.grad(), t.bits, t.s0.data(), t.s1.data(), &kAdam, &sc, &t.step), 1);
  }
  for (std::size_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(multi[i].step, 3);
    EXPECT_TRUE(multi[i] == one[i]) << "tensor " << i;
  }
  // SGD with momentum (state0 is the buffer), and without (no buffer at all).
  for (const stowage_sgd_options& o : {kSgd, stowage_sgd_options{0.1f, 0.0f, 0.0f, 0.0f, 0}}) {
    float* const none = nullptr;
    for (int k = 0; k < 2; ++k) {
      std::vector<stowage_step_tensor> cs = views(multi, false);
      if (o.momentum == 0.0f)
        for (auto& c : cs) c.state0 = none;
      ASSERT_EQ(stowage_sgd_step_multi(cs.size(), cs.data(), &o, nullptr), 1) << stowage_last_error();
      take_steps(multi, cs);
      for (Tensor& t : one)
        ASSERT_EQ(stowage_sgd_step(&t.planes, t.grad(), t.bits, o.momentum == 0.0f ? none : t.s0.data(), &o, nullptr,
                                   &t.step),
                  1);
    }
  }
  for (std::size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(multi[i] == one[i]) << "tensor " << i;
}

TEST(CapiMultiStep, OneNonFiniteGradientSkipsEveryTensor) {
  std::vector<Tensor> ts = model(2);
  std::vector<stowage_step_tensor> cs = views(ts);
  EXPECT_EQ(stowage_any_nonfinite_multi(cs.size(), cs.data()), 0);
  // The check reads the gradients and their lengths only.
  std::vector<stowage_step_tensor> grads_only = cs;
  for (auto& c : grads_only)
    c = {{nullptr, nullptr, nullptr, c.weights.numel, 9}, c.grad, c.grad_bits, nullptr, nullptr, -1};
  EXPECT_EQ(stowage_any_nonfinite_multi(grads_only.size(), grads_only.data()), 0) << stowage_last_error();
  ts[2].grad16[999] = 0x7F80;  // +Inf, the last element of the last tensor
  EXPECT_EQ(stowage_any_nonfinite_multi(cs.size(), cs.data()), 1);
  const std::vector<Tensor> before = ts;
  const stowage_grad_scaling check{1.0f, 1.0f, 1};
  EXPECT_EQ(stowage_adam_step_multi(cs.size(), cs.data(), &kAdam, &check), 0);
  EXPECT_EQ(stowage_sgd_step_multi(cs.size(), cs.data(), &kSgd, &check), 0);
  for (std::size_t i = 0; i < ts.size(); ++i) {
    EXPECT_EQ(cs[i].step, 0);
    EXPECT_TRUE(ts[i] == before[i]) << "tensor " << i << " was written";
  }
  // Without the check every tensor steps (the caller decided), the non-finite one included.
  const stowage_grad_scaling unchecked{1.0f, 1.0f, 0};
  EXPECT_EQ(stowage_adam_step_multi(cs.size(), cs.data(), &kAdam, &unchecked), 1);
  for (const stowage_step_tensor& c : cs) EXPECT_EQ(c.step, 1);
}

TEST(CapiMultiStep, ABadTensorAnywhereIsRefusedBeforeAnyIsWritten) {
  std::vector<Tensor> ts = model(3);
  const std::vector<Tensor> before = ts;
  std::vector<stowage_step_tensor> cs = views(ts);
  cs[2].state1 = reinterpret_cast<float*>(reinterpret_cast<char*>(cs[2].state1) + 2);
  EXPECT_TRUE(refused(stowage_adam_step_multi(cs.size(), cs.data(), &kAdam, nullptr), "(tensor 2 of 3)"));
  cs = views(ts);
  cs[1].grad_bits = 8;
  EXPECT_TRUE(refused(stowage_adam_step_multi(cs.size(), cs.data(), &kAdam, nullptr), "grad_bits 8"));
  EXPECT_TRUE(refused(stowage_any_nonfinite_multi(cs.size(), cs.data()), "(tensor 1 of 3)"));
  cs = views(ts);
  cs[2].step = -1;
  EXPECT_TRUE(refused(stowage_sgd_step_multi(cs.size(), cs.data(), &kSgd, nullptr), "step count"));
  cs = views(ts);
  cs[1].weights.rounding = 5;
  EXPECT_TRUE(refused(stowage_sgd_step_multi(cs.size(), cs.data(), &kSgd, nullptr), "rounding 5"));
  cs = views(ts);
  cs[0].state0 = nullptr;
  EXPECT_TRUE(refused(stowage_sgd_step_multi(cs.size(), cs.data(), &kSgd, nullptr), "momentum buffer"));
  cs = views(ts);
  cs[1].grad = nullptr;  // the message names the entry point and the tensor
  EXPECT_TRUE(refused(stowage_adam_step_multi(cs.size(), cs.data(), &kAdam, nullptr), "stowage_adam_step_multi: "));
  EXPECT_TRUE(refused(stowage_adam_step_multi(cs.size(), cs.data(), &kAdam, nullptr), "(tensor 1 of 3)"));
  cs = views(ts);
  cs[2].step = std::numeric_limits<std::int64_t>::max();  // the next step's number would not fit
  EXPECT_TRUE(refused(stowage_adam_step_multi(cs.size(), cs.data(), &kAdam, nullptr), "(tensor 2 of 3)"));
  EXPECT_EQ(cs[0].step, 0);
  EXPECT_TRUE(refused(stowage_adam_step_multi(3, nullptr, &kAdam, nullptr), "null tensors"));
  EXPECT_TRUE(refused(stowage_adam_step_multi(cs.size(), cs.data(), nullptr, nullptr), "null options"));
  for (std::size_t i = 0; i < ts.size(); ++i) EXPECT_TRUE(ts[i] == before[i]) << "tensor " << i << " was written";
  // No tensors: nothing to do, and that is not an error.
  EXPECT_EQ(stowage_adam_step_multi(0, nullptr, &kAdam, nullptr), 1);
  EXPECT_STREQ(stowage_last_error(), "");
}

// Bad hyper-parameters are refused whether or not a non-finite gradient would skip the step, and
// with no tensors at all: a misconfigured optimizer does not pass as skipped on every overflow.
TEST(CapiMultiStep, BadHyperParametersAreRefusedEvenWhenTheStepWouldBeSkipped) {
  std::vector<Tensor> ts = model(4);
  ts[0].grad32[0] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<Tensor> before = ts;
  std::vector<stowage_step_tensor> cs = views(ts);
  const stowage_grad_scaling check{1.0f, 1.0f, 1};
  stowage_adam_options adam = kAdam;
  adam.lr = -1.0f;
  stowage_sgd_options sgd = kSgd;
  sgd.momentum = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(
      refused(stowage_adam_step_multi(cs.size(), cs.data(), &adam, &check), "stowage_adam_step_multi: adam: lr"));
  EXPECT_TRUE(refused(stowage_sgd_step_multi(cs.size(), cs.data(), &sgd, &check), "sgd: momentum"));
  EXPECT_TRUE(refused(stowage_adam_step_multi(0, nullptr, &adam, nullptr), "lr"));
  adam = kAdam;
  adam.beta2 = 1.0f;
  EXPECT_TRUE(refused(stowage_adam_step_multi_async(0, nullptr, cs.size(), cs.data(), &adam, &check), "beta2"));
  EXPECT_TRUE(refused(stowage_sgd_step_multi_async(0, nullptr, cs.size(), cs.data(), &sgd, &check), "momentum"));
  for (std::size_t i = 0; i < ts.size(); ++i) {
    EXPECT_EQ(cs[i].step, 0);
    EXPECT_TRUE(ts[i] == before[i]) << "tensor " << i << " was written";
  }
}

// Queued on a device's stream (an emulated device, or a GPU when the C ABI uses CUDA): the
// tensors end as the host's one-tensor steps leave them; the decision runs on the stream.
TEST(CapiMultiStep, QueuedOnADeviceStreamTheyAreTheHostSteps) {
  stowage::Device& d = stowage::device(0);
  auto sync = [&d] { d.synchronize(stowage::kDefaultStream); };
  std::vector<std::pair<void*, std::size_t>> blocks;
  auto upload = [&](const void* src, std::size_t bytes) {
    void* p = stowage_malloc(static_cast<ssize_t>(bytes), 0, nullptr);
    EXPECT_NE(p, nullptr) << stowage_last_error();
    d.copy_async(p, src, bytes, stowage::CopyKind::host_to_device, stowage::kDefaultStream);
    sync();
    blocks.emplace_back(p, bytes);
    return p;
  };
  auto download = [&](const void* src, std::size_t bytes) {
    std::vector<std::uint8_t> out(bytes);
    sync();
    d.copy_async(out.data(), src, bytes, stowage::CopyKind::device_to_host, stowage::kDefaultStream);
    sync();
    return out;
  };
  auto bytes_of = [](const auto& v) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(v.data());
    return std::vector<std::uint8_t>(p, p + v.size() * sizeof(v[0]));
  };
  std::vector<Tensor> host = model(4);
  std::vector<stowage_step_tensor> dev;
  for (Tensor& t : host) {
    const std::size_t n = t.planes.numel;
    stowage_split_planes p{static_cast<std::uint16_t*>(upload(t.bf16.data(), n * 2)),
                           static_cast<std::uint16_t*>(upload(t.residual.data(), n * 2)),
                           t.planes.ties ? static_cast<std::uint8_t*>(upload(t.ties.data(), t.ties.size())) : nullptr,
                           n, t.planes.rounding};
    const void* g = t.bits == 32 ? upload(t.grad32.data(), n * 4) : upload(t.grad16.data(), n * 2);
    dev.push_back({p, g, t.bits, static_cast<float*>(upload(t.s0.data(), n * 4)),
                   static_cast<float*>(upload(t.s1.data(), n * 4)), 0});
  }
  for (int k = 0; k < 3; ++k) {
    const stowage_grad_scaling sc{2.0f, 0.5f, k % 2};  // the decision on the stream, and without it
    ASSERT_EQ(stowage_adam_step_multi_async(0, nullptr, dev.size(), dev.data(), &kAdam, &sc), 1)
        << stowage_last_error();
    for (Tensor& t : host)
      ASSERT_EQ(stowage_adam_step(&t.planes, t.grad(), t.bits, t.s0.data(), t.s1.data(), &kAdam, &sc, &t.step), 1);
  }
  ASSERT_EQ(stowage_synchronize(0, nullptr), 0) << stowage_last_error();
  auto expect_same = [&] {
    for (std::size_t i = 0; i < host.size(); ++i) {
      const Tensor& t = host[i];
      const std::size_t n = t.planes.numel;
      EXPECT_EQ(dev[i].step, t.step);
      EXPECT_EQ(download(dev[i].weights.bf16, n * 2), bytes_of(t.bf16)) << "tensor " << i;
      EXPECT_EQ(download(dev[i].weights.residual, n * 2), bytes_of(t.residual)) << "tensor " << i;
      if (t.planes.ties) EXPECT_EQ(download(dev[i].weights.ties, t.ties.size()), t.ties) << "tensor " << i;
      EXPECT_EQ(download(dev[i].state0, n * 4), bytes_of(t.s0)) << "tensor " << i;
      EXPECT_EQ(download(dev[i].state1, n * 4), bytes_of(t.s1)) << "tensor " << i;
    }
  };
  expect_same();
  // A NaN in the first tensor's gradient: every tensor skipped on the device too.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  d.copy_async(const_cast<void*>(dev[0].grad), &nan, sizeof nan, stowage::CopyKind::host_to_device,
               stowage::kDefaultStream);
  sync();
  EXPECT_EQ(stowage_any_nonfinite_multi_async(0, nullptr, dev.size(), dev.data(), nullptr), 1);
  // With the caller's flag (device memory of its own): the same answer, and stowage allocates nothing.
  int* flag = static_cast<int*>(upload(&nan, sizeof(int)));
  const std::string stats_before = stats_json();
  EXPECT_EQ(stowage_any_nonfinite_multi_async(0, nullptr, dev.size(), dev.data(), flag), 1);
  EXPECT_EQ(stats_json(), stats_before);
  const float one = 1.0f;
  d.copy_async(const_cast<void*>(dev[0].grad), &one, sizeof one, stowage::CopyKind::host_to_device,
               stowage::kDefaultStream);
  sync();
  EXPECT_EQ(stowage_any_nonfinite_multi_async(0, nullptr, dev.size(), dev.data(), flag), 0);  // the flag is reset
  d.copy_async(const_cast<void*>(dev[0].grad), &nan, sizeof nan, stowage::CopyKind::host_to_device,
               stowage::kDefaultStream);
  sync();
  const stowage_grad_scaling check{1.0f, 1.0f, 1};
  EXPECT_EQ(stowage_adam_step_multi_async(0, nullptr, dev.size(), dev.data(), &kAdam, &check), 0);
  EXPECT_EQ(stowage_sgd_step_multi_async(0, nullptr, dev.size(), dev.data(), &kSgd, &check), 0);
  expect_same();
  // Bad input: refused before anything is queued or allocated.
  EXPECT_TRUE(refused(stowage_adam_step_multi_async(99, nullptr, dev.size(), dev.data(), &kAdam, &check), "device 99"));
  std::vector<stowage_step_tensor> bad = dev;
  bad[1].state0 = nullptr;
  const std::string stats = stats_json();
  EXPECT_TRUE(refused(stowage_adam_step_multi_async(0, nullptr, bad.size(), bad.data(), &kAdam, &check), "exp_avg"));
  EXPECT_EQ(stats_json(), stats);  // not even the finite check's flag
  expect_same();
  for (auto [p, bytes] : blocks) {
    stowage_free(p, static_cast<ssize_t>(bytes), 0, nullptr);
    EXPECT_EQ(stowage_last_error_code(), STOWAGE_OK) << stowage_last_error();
  }
}

}  // namespace
