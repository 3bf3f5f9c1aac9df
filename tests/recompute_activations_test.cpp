// Activation kernels (pointer level) on each backend: fp32 against double-precision references
// within the tolerance stated in docs/recompute.md, backward against central finite
// differences, bf16 as the exactly rounded fp32 result, and results independent of where the
// buffers lie (what makes a rematerialised activation bit-identical).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "recompute_reference.hpp"
#include "stowage/activations.hpp"
#include "stowage/cuda_device.hpp"
#include "stowage/device.hpp"

namespace stowage {
namespace {

using ref::bf16_round;
using ref::widen;

constexpr Activation kAll[] = {Activation::relu, Activation::silu, Activation::gelu_erf, Activation::gelu_tanh};

// The kernels of one backend behind one signature (the CPU ones ignore the stream).
struct Kernels {
  std::function<void(Activation, DType, std::size_t, const void*, void*, void*)> fwd;
  std::function<void(Activation, DType, std::size_t, const void*, const void*, void*, void*)> bwd;
  std::function<void(Activation, DType, std::size_t, std::size_t, const void*, const void*, void*, void*)> bias_fwd;
  std::function<void(Activation, DType, std::size_t, std::size_t, const void*, const void*, const void*, void*, void*,
                     void*)>
      bias_bwd;
  std::function<void(Activation, DType, std::size_t, std::size_t, const void*, std::size_t, const void*, std::size_t,
                     void*, void*)>
      gated_fwd;
  std::function<void(Activation, DType, std::size_t, std::size_t, const void*, std::size_t, const void*, std::size_t,
                     const void*, void*, void*, void*)>
      gated_bwd;
};

Kernels cpu_kernels() {
  Kernels k;
  k.fwd = [](Activation a, DType t, std::size_t n, const void* x, void* y, void*) {
    cpu::activation_forward(a, t, n, x, y);
  };
  k.bwd = [](Activation a, DType t, std::size_t n, const void* x, const void* dy, void* dx, void*) {
    cpu::activation_backward(a, t, n, x, dy, dx);
  };
  k.bias_fwd = [](Activation a, DType t, std::size_t r, std::size_t c, const void* x, const void* b, void* y, void*) {
    cpu::bias_activation_forward(a, t, r, c, x, b, y);
  };
  k.bias_bwd = [](Activation a, DType t, std::size_t r, std::size_t c, const void* x, const void* b, const void* dy,
                  void* dx, void* db, void*) { cpu::bias_activation_backward(a, t, r, c, x, b, dy, dx, db); };
  k.gated_fwd = [](Activation a, DType t, std::size_t r, std::size_t c, const void* g, std::size_t gl, const void* u,
                   std::size_t ul, void* y, void*) { cpu::gated_activation_forward(a, t, r, c, g, gl, u, ul, y); };
  k.gated_bwd = [](Activation a, DType t, std::size_t r, std::size_t c, const void* g, std::size_t gl, const void* u,
                   std::size_t ul, const void* dy, void* dg, void* du,
                   void*) { cpu::gated_activation_backward(a, t, r, c, g, gl, u, ul, dy, dg, du); };
  return k;
}

Kernels cuda_kernels() {
  return {&cuda::activation_forward,       &cuda::activation_backward,      &cuda::bias_activation_forward,
          &cuda::bias_activation_backward, &cuda::gated_activation_forward, &cuda::gated_activation_backward};
}

// Host buffers in, kernels run on the backend's memory, buffers back out.
class Backend {
 public:
  explicit Backend(const std::string& name) : name_(name) {
    kernels_ = name == "cuda" ? cuda_kernels() : cpu_kernels();
    if (name == "cuda") device_ = make_cuda_device(0);
  }
  const Kernels& k() const { return kernels_; }

  template <class... Vecs>
  void run(const std::function<void(std::vector<void*>&, void*)>& fn, Vecs&... vecs) {
    std::vector<std::pair<void*, std::size_t>> host{{vecs.data(), vecs.size() * sizeof(vecs[0])}...};
    std::vector<void*> ptrs;
    if (!device_) {
      for (auto& h : host) ptrs.push_back(h.first);
      fn(ptrs, nullptr);
      return;
    }
    for (auto& h : host) {
      ptrs.push_back(device_->allocate(h.second == 0 ? 1 : h.second));
      device_->copy_async(ptrs.back(), h.first, h.second, CopyKind::host_to_device, kDefaultStream);
    }
    fn(ptrs, native(kDefaultStream));
    for (std::size_t i = 0; i < host.size(); ++i)
      device_->copy_async(host[i].first, ptrs[i], host[i].second, CopyKind::device_to_host, kDefaultStream);
    device_->synchronize(kDefaultStream);
    for (void* p : ptrs) device_->deallocate(p);
  }

 private:
  std::string name_;
  Kernels kernels_;
  std::unique_ptr<Device> device_;
};

class ActivationKernels : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "cuda" && cuda_device_count() == 0)
      GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
    backend_ = std::make_unique<Backend>(GetParam());
  }
  std::unique_ptr<Backend> backend_;
};

// A grid over [-30, 30], Gaussian samples, and values that exercise the edges of the math.
std::vector<float> test_inputs() {
  std::vector<float> xs;
  for (int i = -30 * 64; i <= 30 * 64; ++i) xs.push_back(static_cast<float>(i) / 64.0f);
  std::mt19937 gen(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (int i = 0; i < 20000; ++i) xs.push_back(nd(gen));
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-40f, -1e-40f, 87.5f, -87.5f, 90.0f, -90.0f, 105.0f, -105.0f, 130.0f,
                  -130.0f, 1e30f, -1e30f})
    xs.push_back(v);
  return xs;
}

TEST_P(ActivationKernels, ForwardF32WithinToleranceOfDoubleReference) {
  const auto xs = test_inputs();
  for (Activation a : kAll) {
    std::vector<float> x = xs, y(xs.size());
    backend_->run([&](auto& p, void* s) { backend_->k().fwd(a, DType::f32, x.size(), p[0], p[1], s); }, x, y);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double r = ref::f(a, x[i]);
      const double tol = ref::kForwardUlps * ref::ulp(r) * std::max(1.0, ref::cond_f(a, x[i]));
      ASSERT_LE(std::fabs(y[i] - r), tol) << to_string(a) << " x=" << x[i] << " y=" << y[i] << " ref=" << r;
    }
  }
}

TEST_P(ActivationKernels, BackwardF32MatchesDoubleReferenceAndFiniteDifferences) {
  const auto xs = test_inputs();
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> ud(0.5f, 2.0f);
  for (Activation a : kAll) {
    std::vector<float> x = xs, dy(xs.size()), dx(xs.size());
    for (auto& v : dy) v = ud(gen);
    backend_->run([&](auto& p, void* s) { backend_->k().bwd(a, DType::f32, x.size(), p[0], p[1], p[2], s); }, x, dy,
                  dx);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double xi = x[i], g = dy[i] * ref::df(a, xi);
      const double tol = ref::kBackwardUlps * ref::ulp(g) * std::max(1.0, ref::cond_df(a, xi));
      ASSERT_LE(std::fabs(dx[i] - g), tol) << to_string(a) << " x=" << xi << " dx=" << dx[i] << " ref=" << g;
      if (std::fabs(xi) > 60 || (a == Activation::relu && std::fabs(xi) < 1e-3)) continue;
      const double h = 1e-5 * std::max(1.0, std::fabs(xi));
      const double fd = dy[i] * (ref::f(a, xi + h) - ref::f(a, xi - h)) / (2 * h);
      ASSERT_NEAR(dx[i], fd, tol + 1e-8 * std::max(1.0, std::fabs(ref::f(a, xi))))
          << to_string(a) << " x=" << xi << " (finite difference)";
    }
  }
}

TEST_P(ActivationKernels, InfinitiesGiveTheLimits) {
  // forward(+inf) = +inf for all four (gelu_erf gave NaN: inf - inf in its erfc's split); the GeLUs'
  // gradients are 1 at +inf and 0 at -inf. (silu and the GeLUs at -inf are -inf * 0: NaN, as in PyTorch.)
  const float inf = std::numeric_limits<float>::infinity();
  for (Activation a : kAll) {
    std::vector<float> x = {inf, -inf, 1e30f}, y(3), dy = {1.0f, 1.0f, 1.0f}, dx(3);
    backend_->run([&](auto& p, void* s) { backend_->k().fwd(a, DType::f32, x.size(), p[0], p[1], s); }, x, y);
    backend_->run([&](auto& p, void* s) { backend_->k().bwd(a, DType::f32, x.size(), p[0], p[1], p[2], s); }, x, dy,
                  dx);
    EXPECT_EQ(y[0], inf) << to_string(a);
    EXPECT_EQ(y[2], 1e30f) << to_string(a);
    if (a == Activation::relu) EXPECT_EQ(y[1], 0.0f);
    if (a == Activation::gelu_erf || a == Activation::gelu_tanh) {
      EXPECT_EQ(dx[0], 1.0f) << to_string(a);
      EXPECT_EQ(dx[1], 0.0f) << to_string(a);
    }
  }
}

TEST_P(ActivationKernels, BiasForwardAndBackwardIncludingBiasGradient) {
  const std::size_t rows = 9, cols = 37;  // ragged: 37 = 4 * 8 + 5
  std::mt19937 gen(3);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (Activation a : kAll) {
    std::vector<float> x(rows * cols), b(cols), dy(rows * cols), y(rows * cols), dx(rows * cols), db(cols);
    for (auto& v : x) v = nd(gen);
    for (auto& v : b) v = nd(gen);
    for (auto& v : dy) v = nd(gen);
    backend_->run(
        [&](auto& p, void* s) {
          backend_->k().bias_fwd(a, DType::f32, rows, cols, p[0], p[1], p[2], s);
          backend_->k().bias_bwd(a, DType::f32, rows, cols, p[0], p[1], p[3], p[4], p[5], s);
        },
        x, b, y, dy, dx, db);
    std::vector<double> sum(cols, 0.0), mag(cols, 0.0);
    for (std::size_t i = 0; i < rows * cols; ++i) {
      const float z = x[i] + b[i % cols];  // the kernel adds in fp32, as this does
      const double r = ref::f(a, z), g = dy[i] * ref::df(a, z);
      ASSERT_LE(std::fabs(y[i] - r), ref::kForwardUlps * ref::ulp(r) * std::max(1.0, ref::cond_f(a, z)));
      ASSERT_LE(std::fabs(dx[i] - g), ref::kBackwardUlps * ref::ulp(g) * std::max(1.0, ref::cond_df(a, z)));
      sum[i % cols] += g;
      mag[i % cols] += std::fabs(g);
    }
    for (std::size_t c = 0; c < cols; ++c)  // fp32 sum of rows: rows * eps relative to sum |dx|
      ASSERT_NEAR(db[c], sum[c], 1e-6 * static_cast<double>(rows) * mag[c] + 1e-30) << to_string(a) << " c=" << c;
  }
}

TEST_P(ActivationKernels, GatedOnFusedProjectionHalves) {
  const std::size_t rows = 5, cols = 21;  // one [rows, 2*cols] buffer: gate | up
  std::mt19937 gen(5);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (Activation a : kAll) {
    std::vector<float> xu(rows * 2 * cols), dy(rows * cols), y(rows * cols), dxu(rows * 2 * cols, -7.0f);
    for (auto& v : xu) v = nd(gen);
    for (auto& v : dy) v = nd(gen);
    const std::size_t ld = 2 * cols;
    backend_->run(
        [&](auto& p, void* s) {
          auto* g = static_cast<float*>(p[0]);
          auto* dg = static_cast<float*>(p[3]);
          backend_->k().gated_fwd(a, DType::f32, rows, cols, g, ld, g + cols, ld, p[1], s);
          backend_->k().gated_bwd(a, DType::f32, rows, cols, g, ld, g + cols, ld, p[2], dg, dg + cols, s);
        },
        xu, y, dy, dxu);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c) {
        const double g = xu[r * ld + c], u = xu[r * ld + cols + c], d = dy[r * cols + c];
        const double yr = ref::f(a, g) * u, dgr = d * u * ref::df(a, g), dur = d * ref::f(a, g);
        const double kf = 2 * ref::kForwardUlps * std::max(1.0, ref::cond_f(a, g)) + 2;
        const double kb = 2 * ref::kBackwardUlps * std::max(1.0, ref::cond_df(a, g)) + 4;
        EXPECT_LE(std::fabs(y[r * cols + c] - yr), kf * ref::ulp(yr)) << to_string(a);
        EXPECT_LE(std::fabs(dxu[r * ld + c] - dgr), kb * ref::ulp(dgr)) << to_string(a);
        EXPECT_LE(std::fabs(dxu[r * ld + cols + c] - dur), kf * ref::ulp(dur)) << to_string(a);
      }
  }
}

// bf16: the fp32 kernel on the widened inputs, rounded to nearest even: bit for bit.
TEST_P(ActivationKernels, Bf16IsTheRoundedF32Result) {
  const std::size_t rows = 6, cols = 45;
  std::mt19937 gen(9);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (Activation a : kAll) {
    std::vector<std::uint16_t> h(rows * 2 * cols), b(cols), dy(rows * cols);
    for (auto& v : h) v = bf16_round(nd(gen));
    for (auto& v : b) v = bf16_round(nd(gen));
    for (auto& v : dy) v = bf16_round(nd(gen));
    const std::size_t n = rows * cols, ld = 2 * cols;
    std::vector<float> hf = widen(h), bf = widen(b), dyf = widen(dy);
    // Outputs: unary y, dx; bias y, dx, db; gated y, dgate|dup. Same layout in both dtypes.
    std::vector<std::uint16_t> o16[7];
    std::vector<float> o32[7];
    const std::size_t sizes[7] = {n, n, n, n, cols, n, rows * ld};
    for (int i = 0; i < 7; ++i) o16[i].assign(sizes[i], 0), o32[i].assign(sizes[i], 0.0f);
    auto go = [&](DType t, auto& in, auto& bias, auto& d, auto* o) {
      const std::size_t e = t == DType::f32 ? 4 : 2;
      backend_->run(
          [&](auto& p, void* s) {
            auto at = [&](int i, std::size_t k) { return static_cast<char*>(p[i]) + k * e; };
            const auto& K = backend_->k();
            K.fwd(a, t, n, p[0], p[3], s);
            K.bwd(a, t, n, p[0], p[2], p[4], s);
            K.bias_fwd(a, t, rows, cols, p[0], p[1], p[5], s);
            K.bias_bwd(a, t, rows, cols, p[0], p[1], p[2], p[6], p[7], s);
            K.gated_fwd(a, t, rows, cols, p[0], ld, at(0, cols), ld, p[8], s);
            K.gated_bwd(a, t, rows, cols, p[0], ld, at(0, cols), ld, p[2], p[9], at(9, cols), s);
          },
          in, bias, d, o[0], o[1], o[2], o[3], o[4], o[5], o[6]);
    };
    go(DType::bf16, h, b, dy, o16);
    go(DType::f32, hf, bf, dyf, o32);
    for (int i = 0; i < 7; ++i)
      for (std::size_t j = 0; j < sizes[i]; ++j)
        ASSERT_EQ(o16[i][j], bf16_round(o32[i][j])) << to_string(a) << " output " << i << " element " << j;
  }
}

// bf16 outputs are within one bf16 step of the double reference (|x| <= 8 keeps the
// conditioning of gelu_tanh's tail below the bf16 resolution).
TEST_P(ActivationKernels, Bf16WithinOneStepOfDoubleReference) {
  std::vector<std::uint16_t> x;
  for (int i = -8 * 256; i <= 8 * 256; ++i) x.push_back(bf16_round(static_cast<float>(i) / 256.0f));
  for (Activation a : kAll) {
    std::vector<std::uint16_t> y(x.size()), ones(x.size(), bf16_round(1.0f)), dx(x.size());
    backend_->run(
        [&](auto& p, void* s) {
          backend_->k().fwd(a, DType::bf16, x.size(), p[0], p[1], s);
          backend_->k().bwd(a, DType::bf16, x.size(), p[0], p[2], p[3], s);
        },
        x, y, ones, dx);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double xi = widen(x[i]);
      const double r = ref::f(a, xi), g = ref::df(a, xi);
      ASSERT_LE(std::fabs(widen(y[i]) - r), ref::bf16_ulp(r)) << to_string(a) << " x=" << xi;
      ASSERT_LE(std::fabs(widen(dx[i]) - g), ref::bf16_ulp(g)) << to_string(a) << " x=" << xi;
    }
  }
}

// Results do not depend on a buffer's address, on the length, or on running in place.
TEST_P(ActivationKernels, SameBitsAtAnyOffsetLengthOrInPlace) {
  const auto xs = test_inputs();
  const std::size_t n = 1000;
  for (Activation a : kAll) {
    std::vector<float> x(xs.begin(), xs.begin() + n), y(n);
    backend_->run([&](auto& p, void* s) { backend_->k().fwd(a, DType::f32, n, p[0], p[1], s); }, x, y);
    for (std::size_t off : {1u, 3u, 7u}) {
      for (std::size_t len : {n - off, std::size_t{13}, std::size_t{5}}) {
        std::vector<float> buf(n + 8, 0.0f);
        std::memcpy(buf.data() + off, x.data(), len * sizeof(float));
        backend_->run(
            [&](auto& p, void* s) {
              float* b = static_cast<float*>(p[0]) + off;
              backend_->k().fwd(a, DType::f32, len, b, b, s);  // in place, misaligned
            },
            buf);
        ASSERT_EQ(0, std::memcmp(buf.data() + off, y.data(), len * sizeof(float)))
            << to_string(a) << " offset " << off << " length " << len;
      }
    }
  }
}

TEST_P(ActivationKernels, BadArgumentsAreRefusedAndTouchNothing) {
  std::vector<float> x(16, 1.0f), y(16, 5.0f);
  const auto& K = backend_->k();
  backend_->run(
      [&](auto& p, void* s) {
        EXPECT_THROW(K.fwd(Activation::silu, DType::f16, 16, p[0], p[1], s), Unsupported);
        EXPECT_THROW(K.fwd(Activation::silu, DType::f32, 16, nullptr, p[1], s), InvalidArgument);
        EXPECT_THROW(K.fwd(static_cast<Activation>(9), DType::f32, 16, p[0], p[1], s), InvalidArgument);
        EXPECT_THROW(K.gated_fwd(Activation::silu, DType::f32, 2, 8, p[0], 4, p[0], 8, p[1], s), InvalidArgument);
        EXPECT_THROW(
            K.bias_fwd(Activation::relu, DType::f32, std::size_t{1} << 40, std::size_t{1} << 40, p[0], p[0], p[1], s),
            InvalidArgument);
      },
      x, y);
  for (float v : y) EXPECT_EQ(v, 5.0f);
}

INSTANTIATE_TEST_SUITE_P(Backends, ActivationKernels, ::testing::Values("cpu", "cuda"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace stowage
