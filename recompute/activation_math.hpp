#pragma once
// Elementwise activation math, written once for two element types: float (the CUDA kernels,
// one element per thread) and the CPU kernels' 8-lane GCC vector (recompute/simd8.hpp).
// Only +, -, *, / and bit manipulation: no libm calls, so the CPU compiler vectorises it and
// every element of a tensor runs the same instruction sequence (a rematerialised output is
// bit-identical to the forward output). Accuracy is documented in docs/recompute.md.
#include <cstdint>
#include <cstring>

#include "simd/bf16.hpp"
#include "stowage/activations.hpp"
#if !defined(__CUDACC__)
#include "recompute/simd8.hpp"  // declared first: the templates below find its overloads
#endif

#if defined(__CUDACC__)
#define STOWAGE_HD __host__ __device__ __forceinline__
#else
#define STOWAGE_HD inline __attribute__((always_inline))
#endif

namespace stowage::act_math {

// ---- scalar primitives (the vector ones live in simd8.hpp with the same names) ----
STOWAGE_HD float splat_f(float c, float) { return c; }
STOWAGE_HD float select(bool m, float a, float b) { return m ? a : b; }
STOWAGE_HD std::int32_t bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_int(x);
#else
  std::int32_t i;
  std::memcpy(&i, &x, sizeof i);
  return i;
#endif
}
STOWAGE_HD float from_bits(std::int32_t i) {
#if defined(__CUDA_ARCH__)
  return __int_as_float(i);
#else
  float x;
  std::memcpy(&x, &i, sizeof x);
  return x;
#endif
}
// Only called on finite values with integral value in int range.
STOWAGE_HD std::int32_t to_int(float x) { return static_cast<std::int32_t>(x); }

template <class F>
STOWAGE_HD F splat(float c) {
  return splat_f(c, F{});
}

template <class F>
STOWAGE_HD F fabs_(const F& x) {
  return from_bits(bits(x) & 0x7FFFFFFF);
}

// exp(x) = p * s1 * s2: Cody-Waite range reduction x = n ln2 + r, Cephes degree-6 polynomial p
// on |r| <= ln2/2, and 2^n split into two exact powers of two so that a product
// ((y * p) * s1) * s2 rounds once even when it is subnormal. Below x = -125 p is 0, so that
// y * exp(x) is 0 there for any finite y (|y| exp(x) < 2^-150 for the y this file passes).
template <class F>
struct ExpParts {
  F p, s1, s2;
};
template <class F>
STOWAGE_HD ExpParts<F> exp_parts(const F& x_in) {
  F x = select(x_in > 88.8f, splat<F>(88.8f), x_in);
  x = select(x < -125.0f, splat<F>(-125.0f), x);
  const F t = x * 1.44269504088896341f + 12582912.0f;  // 1.5 * 2^23: rounds to an integer
  F n = t - 12582912.0f;
  n = select(n == n, n, splat<F>(0.0f));  // NOLINT(misc-redundant-expression): false for NaN input only
  F r = x - n * 0.693359375f;             // exact: 9-bit constant times |n| <= 181
  r = r - n * -2.12194440e-4f;
  F p = splat<F>(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  p = select(x_in < -125.0f, splat<F>(0.0f), p);
  const auto ni = to_int(n);
  const auto n1 = ni >> 1;
  const auto n2 = ni - n1;
  return {p, from_bits((n1 + 127) << 23), from_bits((n2 + 127) << 23)};
}
template <class F>
STOWAGE_HD F exp_(const F& x) {
  const auto e = exp_parts(x);
  return e.p * e.s1 * e.s2;
}

// ---- sigmoid-based activations ----
// With w = -|v| and e = exp(w) in (0, 1], nothing overflows and nothing cancels:
//   v >= 0: s = 1/(1+e), 1-s = e/(1+e);   v < 0: s = e/(1+e), 1-s = 1/(1+e).
// x*s for v < 0 is x*exp(w)/(1+e) with x folded in before the final scaling, so an output in
// the normal range stays accurate when s alone would be subnormal (e.g. GeLU at x = -10).
template <class F>
struct Sigmoid {
  F s, one_minus_s, x_s;
};
template <class F>
STOWAGE_HD F x_sigmoid(const F& x, const F& v) {
  const auto ep = exp_parts(-fabs_(v));
  const F den = ep.p * ep.s1 * ep.s2 + 1.0f;
  return select(v >= 0.0f, x, x * ep.p * ep.s1 * ep.s2) / den;
}
template <class F>
STOWAGE_HD Sigmoid<F> sigmoid_(const F& x, const F& v) {
  const auto ep = exp_parts(-fabs_(v));
  const F e = ep.p * ep.s1 * ep.s2;
  const F den = e + 1.0f;
  const auto pos = v >= 0.0f;
  const F a = 1.0f / den, b = e / den;
  const F xs = select(pos, x, x * ep.p * ep.s1 * ep.s2) / den;
  return {select(pos, a, b), select(pos, b, a), xs};
}

template <class F>
STOWAGE_HD F silu_fwd(const F& x) {
  return x_sigmoid(x, x);
}
template <class F>
STOWAGE_HD F silu_grad(const F& x) {  // d/dx x*s(x) = s + x s (1 - s)
  const auto sg = sigmoid_(x, x);
  return sg.s + sg.x_s * sg.one_minus_s;
}

// GeLU, tanh form: 0.5 x (1 + tanh(u)) = x * sigmoid(2u), u = k0 (x + k1 x^3).
inline constexpr float kTanhK0 = 0.797884560802865356f;  // sqrt(2/pi)
inline constexpr float kTanhK1 = 0.044715f;
template <class F>
STOWAGE_HD F gelu_tanh_fwd(const F& x) {
  const F u2 = (x * x * x * kTanhK1 + x) * (2.0f * kTanhK0);
  return x_sigmoid(x, u2);
}
template <class F>
STOWAGE_HD F gelu_tanh_grad(const F& x_in) {  // s + x * 2 s (1-s) * du/dx
  // Beyond |x| = 100 the gradient is exactly 1 or 0 in fp32; clamping keeps x^2 finite there.
  F x = select(x_in > 100.0f, splat<F>(100.0f), x_in);
  x = select(x < -100.0f, splat<F>(-100.0f), x);
  const F x2 = x * x;
  const F u2 = (x2 * x * kTanhK1 + x) * (2.0f * kTanhK0);
  const auto sg = sigmoid_(x, u2);
  const F du2 = (x2 * (3.0f * kTanhK1) + 1.0f) * (2.0f * kTanhK0);
  return sg.s + sg.x_s * sg.one_minus_s * du2;
}

// GeLU, erf form: x * Phi(x), Phi(x) = erfc(-x/sqrt2)/2. erfc(z), z >= 0, by the Chebyshev
// fit erfc(z) = t exp(-z^2 + P(t)), t = 1/(1 + z/2) (relative error < 1.2e-7). -z^2 = -x^2/2 is
// split as A + B with A exact (x's top 12 bits squared) so large |x| keeps full precision.
template <class F>
struct HalfErfc {
  F value;  // Phi(-|x|) = erfc(|x|/sqrt2)/2
  F ea, b;  // exp(A) and B, reused for the density
};
template <class F>
STOWAGE_HD HalfErfc<F> half_erfc_(const F& x) {
  // Phi(-100) is 0 in fp32; clamping keeps an infinite x's split (inf - inf) from making NaN.
  F ax = fabs_(x);
  ax = select(ax > 100.0f, splat<F>(100.0f), ax);
  const F xh = from_bits(bits(ax) & static_cast<std::int32_t>(0xFFFFF000u));
  const F xl = ax - xh;
  const F a = xh * xh * -0.5f;         // exact
  const F b = xl * (ax + xh) * -0.5f;  // the small rest of -x^2/2
  const F ea = exp_(a);
  const F t = 1.0f / (ax * 0.353553390593273762f + 1.0f);  // z/2 = |x| / (2 sqrt2)
  F p = splat<F>(0.17087277f);
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  return {t * ea * exp_(b + p) * 0.5f, ea, b};
}
template <class F>
STOWAGE_HD F gelu_erf_fwd(const F& x) {
  const F h = half_erfc_(x).value;
  return x * select(x < 0.0f, h, 1.0f - h);
}
template <class F>
STOWAGE_HD F gelu_erf_grad(const F& x_in) {  // Phi(x) + x phi(x)
  // Beyond |x| = 100 the gradient is exactly 1 or 0 in fp32 (as gelu_tanh_grad): inf * phi would be NaN.
  F x = select(x_in > 100.0f, splat<F>(100.0f), x_in);
  x = select(x < -100.0f, splat<F>(-100.0f), x);
  const auto h = half_erfc_(x);
  const F cdf = select(x < 0.0f, h.value, 1.0f - h.value);
  const F pdf = h.ea * exp_(h.b) * 0.398942280401432678f;  // exp(-x^2/2) / sqrt(2 pi)
  return cdf + x * pdf;
}

// ReLU: NaN passes through forward; the gradient is zero where x <= 0 (as PyTorch).
template <class F>
STOWAGE_HD F relu_fwd(const F& x) {
  return select(x < 0.0f, splat<F>(0.0f), x);
}
template <class F>
STOWAGE_HD F relu_grad_times(const F& x, const F& dy) {
  return select(x <= 0.0f, splat<F>(0.0f), dy);
}

// ---- bf16 bit patterns: widen exactly; narrow round-to-nearest-even, NaN kept quiet ----
STOWAGE_HD float bf16_to_f32(std::uint16_t h) { return bf16::to_f32(h); }
STOWAGE_HD std::uint16_t f32_to_bf16(float f) { return bf16::from_f32(f); }

// ---- by activation: f(x), and w * f'(x) ----
template <Activation A, class F>
STOWAGE_HD F act_fwd(const F& x) {
  if constexpr (A == Activation::relu) return relu_fwd(x);
  else if constexpr (A == Activation::silu) return silu_fwd(x);
  else if constexpr (A == Activation::gelu_erf) return gelu_erf_fwd(x);
  else return gelu_tanh_fwd(x);
}
template <Activation A, class F>
STOWAGE_HD F act_grad_times(const F& x, const F& w) {
  if constexpr (A == Activation::relu) return relu_grad_times(x, w);
  else if constexpr (A == Activation::silu) return w * silu_grad(x);
  else if constexpr (A == Activation::gelu_erf) return w * gelu_erf_grad(x);
  else return w * gelu_tanh_grad(x);
}

}  // namespace stowage::act_math
