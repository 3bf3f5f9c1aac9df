#pragma once
// Double-precision references for the activation kernels, the error measures the tolerance is
// stated in (docs/recompute.md), and bf16 rounding done independently of the library's.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "stowage/activations.hpp"

namespace stowage::ref {

// Tolerances, in units in the last place of the reference, times max(1, condition number).
inline constexpr double kForwardUlps = 8;
inline constexpr double kBackwardUlps = 16;

inline double normal_cdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }
inline double normal_pdf(double x) { return std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI); }
inline double tanh_u2(double x) { return 2.0 * std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x); }
// sigmoid(v), 1 - sigmoid(v), written to avoid cancellation and overflow.
inline double sig(double v) { return v >= 0 ? 1.0 / (1.0 + std::exp(-v)) : std::exp(v) / (1.0 + std::exp(v)); }
inline double sig_c(double v) { return sig(-v); }

inline double f(Activation a, double x) {
  switch (a) {
    case Activation::relu: return x < 0 ? 0.0 : x;
    case Activation::silu: return x >= 0 ? x / (1.0 + std::exp(-x)) : x * std::exp(x) / (1.0 + std::exp(x));
    case Activation::gelu_erf: return x * normal_cdf(x);
    case Activation::gelu_tanh: {
      const double v = tanh_u2(x);  // 0.5 x (1 + tanh(u)) = x sigmoid(2u)
      return v >= 0 ? x / (1.0 + std::exp(-v)) : x * std::exp(v) / (1.0 + std::exp(v));
    }
  }
  return 0;
}

inline double df(Activation a, double x) {
  switch (a) {
    case Activation::relu: return x > 0 ? 1.0 : 0.0;
    case Activation::silu: return sig(x) + x * sig(x) * sig_c(x);
    case Activation::gelu_erf: return normal_cdf(x) + x * normal_pdf(x);
    case Activation::gelu_tanh: {
      const double v = tanh_u2(x), dv = 2.0 * std::sqrt(2.0 / M_PI) * (1.0 + 3 * 0.044715 * x * x);
      return sig(v) + x * sig(v) * sig_c(v) * dv;
    }
  }
  return 0;
}

// Condition numbers |x g'(x) / g(x)|: how much a half-ulp change of x moves g, in ulps.
inline double cond_f(Activation a, double x) {
  const double y = f(a, x);
  return y == 0 || !std::isfinite(y) ? 0.0 : std::fabs(x * df(a, x) / y);
}
inline double cond_df(Activation a, double x) {
  const double g = df(a, x);
  if (g == 0 || a == Activation::relu || !std::isfinite(g)) return 0.0;
  const double h = 1e-6 * std::max(1.0, std::fabs(x));
  const double d2 = (df(a, x + h) - df(a, x - h)) / (2 * h);
  return std::fabs(x * d2 / g);
}

// One unit in the last place of a float near r (subnormal spacing at the bottom).
inline double ulp(double r) {
  if (r == 0 || !std::isfinite(r)) return std::ldexp(1.0, -149);
  int e = 0;
  std::frexp(r, &e);
  return std::max(std::ldexp(1.0, e - 24), std::ldexp(1.0, -149));
}
inline double bf16_ulp(double r) {
  if (r == 0) return std::ldexp(1.0, -133);
  int e = 0;
  std::frexp(r, &e);
  return std::max(std::ldexp(1.0, e - 8), std::ldexp(1.0, -133));
}

inline float widen(std::uint16_t h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline std::vector<float> widen(const std::vector<std::uint16_t>& v) {
  std::vector<float> out;
  for (auto h : v) out.push_back(widen(h));
  return out;
}
// Nearest bf16, ties to even, decided by comparing distances in double.
inline std::uint16_t bf16_round(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return static_cast<std::uint16_t>((u >> 16) | 0x40);
  const auto lo = static_cast<std::uint16_t>(u >> 16);
  if ((u & 0xFFFF) == 0) return lo;
  const auto hi = static_cast<std::uint16_t>(lo + 1);
  const double dl = std::fabs(static_cast<double>(f) - widen(lo));
  const double dh = std::isinf(widen(hi)) ? INFINITY : std::fabs(static_cast<double>(f) - widen(hi));
  if (std::isinf(dh)) {  // next step up is infinity: overflow when past the halfway point
    return (u & 0xFFFF) >= 0x8000 && !((u & 0xFFFF) == 0x8000 && (lo & 1) == 0) ? hi : lo;
  }
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1) == 0 ? lo : hi;
}

}  // namespace stowage::ref
