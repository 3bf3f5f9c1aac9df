// Fused optimizers on split storage: after every step the fp32 master (merge of the planes),
// m, v and momentum are bit-identical to a plain fp32 loop doing the same operations in the same
// order, and the bf16 plane is that master rounded in the storage's mode.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "stowage/error.hpp"
#include "stowage/optimizers.hpp"
#include "stowage/precision.hpp"
#include "stowage/simd_level.hpp"

// The reference must round every multiply and add on its own, like the fused kernels.
#pragma GCC optimize("fp-contract=off")

namespace stowage {
namespace {

// --- plain fp32 references (the order is documented in docs/precision.md) ---
void reference_adam(std::vector<float>& p, const std::vector<float>& grad, std::vector<float>& m, std::vector<float>& v,
                    const AdamScalars& s) {
  for (std::size_t i = 0; i < p.size(); ++i) {
    float g = grad[i] * s.inv_loss_scale;
    g = g * s.clip_coef;
    float w = p[i];
    if (s.weight_decay != 0.0f) {
      if (s.decoupled) w = w * s.decay;
      else g = g + w * s.weight_decay;
    }
    m[i] = m[i] * s.beta1 + g * s.one_minus_beta1;
    v[i] = v[i] * s.beta2 + (g * g) * s.one_minus_beta2;
    const float denom = std::sqrt(v[i]) / s.bias_correction2_sqrt + s.eps;
    w = w - (m[i] / denom) * s.step_size;
    p[i] = w;
  }
}

void reference_sgd(std::vector<float>& p, const std::vector<float>& grad, std::vector<float>& buf,
                   const SgdScalars& s) {
  for (std::size_t i = 0; i < p.size(); ++i) {
    float g = grad[i] * s.inv_loss_scale;
    g = g * s.clip_coef;
    if (s.weight_decay != 0.0f) g = g + p[i] * s.weight_decay;
    if (s.momentum != 0.0f) {
      buf[i] = s.first_step ? g : buf[i] * s.momentum + g * s.one_minus_dampening;
      g = s.nesterov ? g + buf[i] * s.momentum : buf[i];
    }
    p[i] = p[i] - g * s.lr;
  }
}

std::uint16_t round_bf16(float x, Rounding r) {
  const auto u = std::bit_cast<std::uint32_t>(x);
  if (r == Rounding::half_up) return static_cast<std::uint16_t>((u + 0x8000u) >> 16);
  return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

struct Split {
  std::vector<std::uint16_t> hi, lo;
  std::vector<std::uint8_t> ties;
  SplitPlanes view;
  Split(const std::vector<float>& init, Rounding r) : hi(init.size()), lo(init.size()), ties(init.size() / 8 + 1) {
    view = {hi.data(), lo.data(), r == Rounding::nearest_even ? ties.data() : nullptr, init.size(), r};
    split(init.data(), view);
  }
  std::vector<float> master() const {
    std::vector<float> out(view.numel);
    merge(view, out.data());
    return out;
  }
};

struct ScopedSimd {
  SimdLevel saved = simd_level();
  explicit ScopedSimd(SimdLevel l) { set_simd_level(l); }
  ~ScopedSimd() { set_simd_level(saved); }
};

// Gradients as given to the step (f32 or bf16 bits) and as the reference sees them (fp32).
struct Grad {
  std::vector<float> f32;
  std::vector<std::uint16_t> bf16;
  HostGrad host(DType t) const { return {t == DType::bf16 ? static_cast<const void*>(bf16.data()) : f32.data(), t}; }
};
Grad random_grad(std::mt19937& rng, std::size_t n, DType t, float scale) {
  std::normal_distribution<float> d(0.0f, 1e-2f);
  Grad g{std::vector<float>(n), std::vector<std::uint16_t>(n)};
  for (std::size_t i = 0; i < n; ++i) {
    g.f32[i] = d(rng) * scale;
    g.bf16[i] = round_bf16(g.f32[i], Rounding::nearest_even);
    if (t == DType::bf16) g.f32[i] = std::bit_cast<float>(std::uint32_t{g.bf16[i]} << 16);
  }
  return g;
}

std::vector<float> random_weights(std::mt19937& rng, std::size_t n) {
  std::normal_distribution<float> d(0.0f, 0.5f);
  std::vector<float> w(n);
  for (auto& x : w) x = d(rng);
  for (std::size_t i = 0; i < n; i += 101)
    w[i] = std::bit_cast<float>((std::bit_cast<std::uint32_t>(w[i]) & 0xFFFF0000u) | 0x8000u);
  return w;
}

bool bits_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

void expect_planes_match(const Split& s, const std::vector<float>& ref, Rounding r, int step) {
  ASSERT_TRUE(bits_equal(s.master(), ref)) << "master differs after step " << step;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(s.hi[i], round_bf16(ref[i], r)) << "bf16 plane, element " << i << ", step " << step;
  }
}

struct Case {
  SimdLevel level;
  Rounding rounding;
  DType grad;
};
std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (int l = 0; l <= static_cast<int>(detected_simd_level()); ++l) {
    for (Rounding r : {Rounding::half_up, Rounding::nearest_even}) {
      for (DType t : {DType::f32, DType::bf16}) cases.push_back({static_cast<SimdLevel>(l), r, t});
    }
  }
  return cases;
}

constexpr std::size_t kN = 4099;  // odd: every vector path has a head-free tail

TEST(PrecisionOptimizers, AdamW100StepsBitIdenticalToReference) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(std::string(to_string(c.level)) + " " + to_string(c.rounding) + " " + to_string(c.grad));
    ScopedSimd simd(c.level);
    std::mt19937 rng(1);
    std::vector<float> ref = random_weights(rng, kN), m(kN, 0.0f), v(kN, 0.0f), rm = m, rv = v;
    Split s(ref, c.rounding);
    const AdamOptions o{.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f};
    const GradScaling scaling{.loss_scale = 1024.0f, .clip_coef = 0.75f};
    OptimizerState state;
    for (int step = 1; step <= 100; ++step) {
      const Grad g = random_grad(rng, kN, c.grad, 1024.0f);
      const StepResult r = adam_step(s.view, g.host(c.grad), m.data(), v.data(), o, scaling, state);
      ASSERT_TRUE(r.applied);
      ASSERT_EQ(r.step, step);
      reference_adam(ref, g.f32, rm, rv, adam_scalars(o, step, scaling));
      expect_planes_match(s, ref, c.rounding, step);
      ASSERT_TRUE(bits_equal(m, rm) && bits_equal(v, rv)) << "m/v differ after step " << step;
    }
  }
}

// The unfused fp32 kernel (the benchmark's peer) runs the same update on a plain fp32 array.
TEST(PrecisionOptimizers, Fp32AdamKernelBitIdenticalToReference) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(std::string(to_string(c.level)) + " " + to_string(c.grad));
    ScopedSimd simd(c.level);
    std::mt19937 rng(8);
    std::vector<float> p = random_weights(rng, kN), ref = p, m(kN, 0.0f), v(kN, 0.0f), rm = m, rv = v;
    const AdamOptions o{.weight_decay = 0.05f};
    for (int step = 1; step <= 10; ++step) {
      const Grad g = random_grad(rng, kN, c.grad, 1.0f);
      adam_step_range_fp32(p.data(), g.host(c.grad), m.data(), v.data(), 0, kN, adam_scalars(o, step));
      reference_adam(ref, g.f32, rm, rv, adam_scalars(o, step));
      ASSERT_TRUE(bits_equal(p, ref) && bits_equal(m, rm) && bits_equal(v, rv)) << "step " << step;
    }
  }
}

TEST(PrecisionOptimizers, AdamWithL2WeightDecayBitIdenticalToReference) {
  std::mt19937 rng(2);
  std::vector<float> ref = random_weights(rng, kN), m(kN, 0.0f), v(kN, 0.0f), rm = m, rv = v;
  Split s(ref, Rounding::nearest_even);
  const AdamOptions o{.lr = 3e-4f, .weight_decay = 0.1f, .decoupled_weight_decay = false};
  OptimizerState state;
  for (int step = 1; step <= 20; ++step) {
    const Grad g = random_grad(rng, kN, DType::f32, 1.0f);
    ASSERT_TRUE(adam_step(s.view, g.host(DType::f32), m.data(), v.data(), o, {}, state).applied);
    reference_adam(ref, g.f32, rm, rv, adam_scalars(o, step));
    expect_planes_match(s, ref, Rounding::nearest_even, step);
  }
}

TEST(PrecisionOptimizers, Sgd100StepsBitIdenticalToReference) {
  const SgdOptions variants[] = {
      {.lr = 0.05f, .momentum = 0.9f, .dampening = 0.1f, .weight_decay = 1e-3f, .nesterov = false},
      {.lr = 0.05f, .momentum = 0.9f, .dampening = 0.0f, .weight_decay = 1e-3f, .nesterov = true},
      {.lr = 0.1f},  // plain SGD: no momentum buffer at all
  };
  for (const Case& c : all_cases()) {
    for (const SgdOptions& o : variants) {
      SCOPED_TRACE(std::string(to_string(c.level)) + " " + to_string(c.rounding) + " " + to_string(c.grad) +
                   (o.nesterov ? " nesterov" : "") + (o.momentum == 0.0f ? " plain" : ""));
      ScopedSimd simd(c.level);
      std::mt19937 rng(3);
      std::vector<float> ref = random_weights(rng, kN), buf(kN, 0.0f), rbuf = buf;
      Split s(ref, c.rounding);
      OptimizerState state;
      for (int step = 1; step <= 100; ++step) {
        const Grad g = random_grad(rng, kN, c.grad, 1.0f);
        const StepResult r =
            sgd_step(s.view, g.host(c.grad), o.momentum != 0.0f ? buf.data() : nullptr, o, {.clip_coef = 0.5f}, state);
        ASSERT_TRUE(r.applied);
        reference_sgd(ref, g.f32, rbuf, sgd_scalars(o, step, {.clip_coef = 0.5f}));
        expect_planes_match(s, ref, c.rounding, step);
        ASSERT_TRUE(bits_equal(buf, rbuf)) << "momentum differs after step " << step;
      }
    }
  }
}

std::uint64_t fnv(const void* data, std::size_t bytes, std::uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// A NaN the update computes must read as NaN in the bf16 plane: split as it is, CUDA's arithmetic
// NaN 0x7FFFFFFF (and other payloads) would show as -0 or Inf. Every payload class, in the weights
// and in the gradients, with the finite check off; the result is the canonical quiet NaN.
TEST(PrecisionOptimizers, ANaNResultReadsAsNaNInTheBf16Plane) {
  const std::uint32_t payloads[] = {0x7FFFFFFFu, 0xFFFFFFFFu, 0x7F800001u, 0xFF800001u,
                                    0x7FC00000u, 0xFFC00000u, 0x7FBFFFFFu, 0x7FFF8000u};
  auto is_bf16_nan = [](std::uint16_t h) { return (h & 0x7F80u) == 0x7F80u && (h & 0x7Fu) != 0; };
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(std::string(to_string(c.level)) + " " + to_string(c.rounding) + " " + to_string(c.grad));
    ScopedSimd simd(c.level);
    for (bool adam : {true, false}) {
      std::mt19937 rng(3);
      std::vector<float> ref = random_weights(rng, kN), m(kN, 0.0f), v(kN, 0.0f), rm = m, rv = v;
      Grad g = random_grad(rng, kN, c.grad, 1.0f);
      for (std::size_t k = 0; k < std::size(payloads); ++k) {
        ref[k * 509 + 3] = std::bit_cast<float>(payloads[k]);  // in heads, vector bodies and the tail
        const std::size_t j = kN - 1 - k * 211;
        const std::uint32_t bits = c.grad == DType::bf16 ? payloads[k] & 0xFFFF0000u : payloads[k];
        g.f32[j] = std::bit_cast<float>(bits | (c.grad == DType::bf16 && (bits & 0x7FFFFF) == 0 ? 0x10000u : 0u));
        g.bf16[j] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(g.f32[j]) >> 16);
      }
      Split s(ref, c.rounding);
      OptimizerState state;
      const GradScaling scaling{.skip_nonfinite = false};
      if (adam) {
        const AdamOptions o{.lr = 1e-3f, .weight_decay = 0.01f};
        ASSERT_TRUE(adam_step(s.view, g.host(c.grad), m.data(), v.data(), o, scaling, state).applied);
        reference_adam(ref, g.f32, rm, rv, adam_scalars(o, 1, scaling));
      } else {
        const SgdOptions o{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f};
        ASSERT_TRUE(sgd_step(s.view, g.host(c.grad), m.data(), o, scaling, state).applied);
        reference_sgd(ref, g.f32, rm, sgd_scalars(o, 1, scaling));
      }
      const std::vector<float> master = s.master();
      std::size_t nans = 0;
      for (std::size_t i = 0; i < kN; ++i) {
        if (std::isnan(ref[i])) {
          ++nans;
          ASSERT_TRUE(is_bf16_nan(s.hi[i])) << (adam ? "adam" : "sgd") << " element " << i << " bf16 " << s.hi[i];
          ASSERT_EQ(std::bit_cast<std::uint32_t>(master[i]), 0x7FC00000u) << i;
        } else {
          ASSERT_EQ(std::bit_cast<std::uint32_t>(master[i]), std::bit_cast<std::uint32_t>(ref[i])) << i;
          ASSERT_EQ(s.hi[i], round_bf16(ref[i], c.rounding)) << i;
        }
      }
      EXPECT_EQ(nans, 2 * std::size(payloads));
    }
  }
}

TEST(PrecisionOptimizers, NonFiniteGradientSkipsTheStepAndSaysSo) {
  for (DType t : {DType::f32, DType::bf16}) {
    for (float bad : {INFINITY, -INFINITY, NAN}) {
      std::mt19937 rng(4);
      std::vector<float> w = random_weights(rng, kN), m(kN, 0.25f), v(kN, 0.5f);
      Split s(w, Rounding::nearest_even);
      Grad g = random_grad(rng, kN, t, 65536.0f);
      g.f32[kN - 1] = bad;  // in the scalar tail
      g.bf16[kN - 1] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(bad) >> 16);
      const auto h = fnv(s.hi.data(), kN * 2, fnv(s.lo.data(), kN * 2, fnv(s.ties.data(), s.ties.size())));
      const auto hm = fnv(m.data(), kN * 4, fnv(v.data(), kN * 4));
      OptimizerState state{7};
      const StepResult r = adam_step(s.view, g.host(t), m.data(), v.data(), {}, {.loss_scale = 65536.0f}, state);
      EXPECT_FALSE(r.applied);
      EXPECT_TRUE(r.found_nonfinite);
      EXPECT_EQ(r.step, 7);
      EXPECT_EQ(state.step, 7);
      EXPECT_EQ(h, fnv(s.hi.data(), kN * 2, fnv(s.lo.data(), kN * 2, fnv(s.ties.data(), s.ties.size()))));
      EXPECT_EQ(hm, fnv(m.data(), kN * 4, fnv(v.data(), kN * 4)));
      OptimizerState sgd_state;
      EXPECT_FALSE(sgd_step(s.view, g.host(t), nullptr, {}, {}, sgd_state).applied);
      EXPECT_EQ(sgd_state.step, 0);
      // with the check off the step goes ahead (the caller checked elsewhere)
      g.f32[kN - 1] = 0.0f, g.bf16[kN - 1] = 0;
      EXPECT_FALSE(any_nonfinite(g.host(t), 0, kN));
      EXPECT_TRUE(adam_step(s.view, g.host(t), m.data(), v.data(), {}, {.loss_scale = 65536.0f}, state).applied);
      EXPECT_EQ(state.step, 8);
    }
  }
}

// A streamed window runs the step chunk by chunk (ranges starting at multiples of 8), even on
// several threads at once; the result equals one whole step.
TEST(PrecisionOptimizers, StepOnSubRangesEqualsWholeStep) {
  std::mt19937 rng(5);
  const std::vector<float> w = random_weights(rng, kN);
  const Grad g = random_grad(rng, kN, DType::bf16, 1.0f);
  const AdamOptions o{.weight_decay = 0.01f};
  const AdamScalars sc = adam_scalars(o, 3);
  Split whole(w, Rounding::nearest_even), parts(w, Rounding::nearest_even);
  std::vector<float> m1(kN, 0.1f), v1(kN, 0.2f), m2 = m1, v2 = v1;
  adam_step_range(whole.view, g.host(DType::bf16), m1.data(), v1.data(), 0, kN, sc);
  std::vector<std::thread> threads;
  for (std::size_t b = 0; b < kN; b += 1000) {  // 1000 is a multiple of 8
    threads.emplace_back([&, b] {
      adam_step_range(parts.view, g.host(DType::bf16), m2.data(), v2.data(), b, std::min(kN, b + 1000), sc);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(bits_equal(whole.master(), parts.master()));
  EXPECT_EQ(whole.hi, parts.hi);
  EXPECT_TRUE(bits_equal(m1, m2) && bits_equal(v1, v2));
}

TEST(PrecisionOptimizers, BadInputThrowsAndWritesNothing) {
  std::mt19937 rng(6);
  std::vector<float> w = random_weights(rng, 64), m(64), v(64);
  Split s(w, Rounding::half_up);
  const Grad g = random_grad(rng, 64, DType::f32, 1.0f);
  const auto h = fnv(s.hi.data(), 128, fnv(s.lo.data(), 128));
  OptimizerState state;
  EXPECT_THROW(adam_step(s.view, {g.f32.data(), DType::f16}, m.data(), v.data(), {}, {}, state), InvalidArgument);
  EXPECT_THROW(adam_step(s.view, g.host(DType::f32), nullptr, v.data(), {}, {}, state), InvalidArgument);
  EXPECT_THROW(adam_step(s.view, g.host(DType::f32), m.data(), v.data(), {}, {.loss_scale = 0.0f}, state),
               InvalidArgument);
  EXPECT_THROW(adam_step(s.view, {reinterpret_cast<const char*>(g.f32.data()) + 2, DType::f32}, m.data(), v.data(), {},
                         {}, state),
               InvalidArgument);
  EXPECT_THROW(adam_step_range(s.view, g.host(DType::f32), m.data(), v.data(), 0, 65, adam_scalars({}, 1)),
               InvalidArgument);
  EXPECT_THROW(sgd_step(s.view, g.host(DType::f32), nullptr, {.momentum = 0.9f}, {}, state), InvalidArgument);
  EXPECT_THROW(adam_scalars({}, 0), InvalidArgument);
  // Hyper-parameters PyTorch's optimizers refuse (adam.py, sgd.py), refused before any write.
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const AdamOptions& bad :
       {AdamOptions{.lr = -1e-3f}, AdamOptions{.lr = nan}, AdamOptions{.beta1 = 1.0f}, AdamOptions{.beta1 = 1.5f},
        AdamOptions{.beta1 = -0.1f}, AdamOptions{.beta2 = 1.0f}, AdamOptions{.beta2 = nan}, AdamOptions{.eps = -1e-8f},
        AdamOptions{.eps = inf}, AdamOptions{.weight_decay = -0.01f}})
    EXPECT_THROW(adam_step(s.view, g.host(DType::f32), m.data(), v.data(), bad, {}, state), InvalidArgument);
  try {
    (void)adam_scalars({.beta1 = 1.5f}, 1);
    ADD_FAILURE() << "beta1 1.5 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "adam: beta1 must be in [0, 1) (got 1.5)");
  }
  for (const SgdOptions& bad : {SgdOptions{.lr = -0.1f}, SgdOptions{.momentum = -0.9f}, SgdOptions{.dampening = nan},
                                SgdOptions{.weight_decay = -1.0f}, SgdOptions{.momentum = 0.0f, .nesterov = true},
                                SgdOptions{.momentum = 0.9f, .dampening = 0.1f, .nesterov = true}})
    EXPECT_THROW(sgd_step(s.view, g.host(DType::f32), m.data(), bad, {}, state), InvalidArgument);
  // What PyTorch accepts: lr 0, eps 0, beta 0.
  EXPECT_NO_THROW((void)adam_scalars({.lr = 0.0f, .beta1 = 0.0f, .beta2 = 0.0f, .eps = 0.0f}, 1));
  EXPECT_EQ(state.step, 0);
  EXPECT_EQ(h, fnv(s.hi.data(), 128, fnv(s.lo.data(), 128)));
}

}  // namespace
}  // namespace stowage
