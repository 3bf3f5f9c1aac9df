#pragma once
// Sixteen-lane operations in plain C++: the portable path for CPUs without AVX2. Each operation
// is a fixed loop over the lanes that the compiler vectorises for the baseline instruction set
// (SSE2 on x86-64, NEON on AArch64); lane by lane it is the same IEEE operation as ScalarOps, so
// results are bit-identical. Sixteen lanes make two tie bytes, loaded and stored whole. Where the
// compiler targets SSE2 (all of x86-64), the streaming stores, the tie-bit gather and sqrt name
// it directly: plain C++ has no non-temporal store, its gather of eight bits stays scalar, and
// std::sqrt stays a call (errno).
// Included inside an anonymous namespace after ops_scalar.hpp; split_cpu.cpp includes these
// headers (and <emmintrin.h>) first, outside it.
#include <array>
#include <bit>

struct LanesOps {
  static constexpr std::size_t W = 16;  // two tie bytes: half the per-group overhead of eight
  using U = std::array<std::uint32_t, W>;
  using F = std::array<float, W>;

  template <class R, class Fn>
  static R each(Fn&& fn) {
    R r;
    for (std::size_t k = 0; k < W; ++k) r[k] = fn(k);
    return r;
  }

  static U set1(std::uint32_t x) {
    return each<U>([&](std::size_t) { return x; });
  }
  static F fset1(float x) {
    return each<F>([&](std::size_t) { return x; });
  }
  static U load_u16(const std::uint16_t* p) {
    return each<U>([&](std::size_t k) { return std::uint32_t{p[k]}; });
  }
  static void store_u16(std::uint16_t* p, const U& v) {
    for (std::size_t k = 0; k < W; ++k) p[k] = static_cast<std::uint16_t>(v[k]);
  }
  static F load_f32(const float* p) {
    return each<F>([&](std::size_t k) { return p[k]; });
  }
  static void store_f32(float* p, const F& v) {
    for (std::size_t k = 0; k < W; ++k) p[k] = v[k];
  }
#if defined(__SSE2__)
  // Non-temporal stores (SSE2 is part of x86-64), as the AVX paths and memcpy use for large
  // copies: no read-for-ownership of the destination. p is aligned to the group's bytes here.
  static void stream_f32(float* p, const F& v) {
    for (std::size_t k = 0; k < W; k += 4) _mm_stream_ps(p + k, _mm_loadu_ps(v.data() + k));
  }
  static void stream_u16(std::uint16_t* p, const U& v) {
    // Lanes hold 16-bit values: sign-extend each from bit 15 so that the signed saturating pack
    // (SSE2 has no unsigned one from 32 bits) keeps its low half exactly.
    const auto narrow = [&](std::size_t k) {
      return _mm_srai_epi32(_mm_slli_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v.data() + k)), 16), 16);
    };
    for (std::size_t k = 0; k < W; k += 8)
      _mm_stream_si128(reinterpret_cast<__m128i*>(p + k), _mm_packs_epi32(narrow(k), narrow(k + 4)));
  }
  static void fence() { _mm_sfence(); }
#else
  static void stream_f32(float* p, const F& v) { store_f32(p, v); }
  static void stream_u16(std::uint16_t* p, const U& v) { store_u16(p, v); }
  static void fence() {}
#endif
  // i is a multiple of 8 here (for_each_group): lane k is bit k % 8 of tie byte (i + k) / 8.
  // Loading takes each byte's eight lanes from a table (8 KiB): baseline SIMD has no per-lane
  // variable shifts, and a byte spread lane by lane stays scalar.
  using Lanes8 = std::array<std::uint32_t, 8>;
  static constexpr std::array<Lanes8, 256> kTieLanes = [] {
    std::array<Lanes8, 256> t{};
    for (std::size_t b = 0; b < 256; ++b)
      for (std::size_t k = 0; k < 8; ++k) t[b][k] = static_cast<std::uint32_t>((b >> k) & 1u);
    return t;
  }();
  static U load_ties(const std::uint8_t* t, std::size_t i) {
    U r;
    for (std::size_t j = 0; j < W / 8; ++j) std::memcpy(r.data() + 8 * j, kTieLanes[t[(i >> 3) + j]].data(), 32);
    return r;
  }
#if defined(__SSE2__)
  static void store_ties(std::uint8_t* t, std::size_t i, const U& v) {
    // v[k] is 0 or 1: move it to the sign bit and let movmskps gather four lanes at a time.
    const auto signs = [&](std::size_t k) {
      return static_cast<std::uint32_t>(_mm_movemask_ps(
          _mm_castsi128_ps(_mm_slli_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v.data() + k)), 31))));
    };
    for (std::size_t j = 0; j < W / 8; ++j)
      t[(i >> 3) + j] = static_cast<std::uint8_t>(signs(8 * j) | (signs(8 * j + 4) << 4));
  }
#else
  static void store_ties(std::uint8_t* t, std::size_t i, const U& v) {
    for (std::size_t j = 0; j < W / 8; ++j) {
      std::uint32_t byte = 0;
      for (std::size_t k = 0; k < 8; ++k) byte |= (v[8 * j + k] & 1u) << k;
      t[(i >> 3) + j] = static_cast<std::uint8_t>(byte);
    }
  }
#endif
  static U add(const U& a, const U& b) {
    return each<U>([&](std::size_t k) { return a[k] + b[k]; });
  }
  static U sub(const U& a, const U& b) {
    return each<U>([&](std::size_t k) { return a[k] - b[k]; });
  }
  static U and_(const U& a, const U& b) {
    return each<U>([&](std::size_t k) { return a[k] & b[k]; });
  }
  static U or_(const U& a, const U& b) {
    return each<U>([&](std::size_t k) { return a[k] | b[k]; });
  }
  static U shl16(const U& a) {
    return each<U>([&](std::size_t k) { return a[k] << 16; });
  }
  static U shr16(const U& a) {
    return each<U>([&](std::size_t k) { return a[k] >> 16; });
  }
  static U eq(const U& a, const U& b) {  // 1 or 0 per lane
    return each<U>([&](std::size_t k) { return static_cast<std::uint32_t>(a[k] == b[k]); });
  }
  static bool any(const U& a) {
    std::uint32_t r = 0;
    for (std::size_t k = 0; k < W; ++k) r |= a[k];
    return r != 0;
  }
  static F as_f(const U& a) { return std::bit_cast<F>(a); }
  static U as_u(const F& f) { return std::bit_cast<U>(f); }
  static F fadd(const F& a, const F& b) {
    return each<F>([&](std::size_t k) { return a[k] + b[k]; });
  }
  static F fsub(const F& a, const F& b) {
    return each<F>([&](std::size_t k) { return a[k] - b[k]; });
  }
  static F fmul(const F& a, const F& b) {
    return each<F>([&](std::size_t k) { return a[k] * b[k]; });
  }
  static F fdiv(const F& a, const F& b) {
    return each<F>([&](std::size_t k) { return a[k] / b[k]; });
  }
  static F quiet_nan(const F& a) {
    const U bits = as_u(a);
    return as_f(each<U>([&](std::size_t k) { return (bits[k] & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC00000u : bits[k]; }));
  }
#if defined(__SSE2__)
  // sqrtps is IEEE-exact like std::sqrt, which GCC keeps out of line here (errno).
  static F fsqrt(const F& a) {
    F r;
    for (std::size_t k = 0; k < W; k += 4) _mm_storeu_ps(r.data() + k, _mm_sqrt_ps(_mm_loadu_ps(a.data() + k)));
    return r;
  }
#else
  static F fsqrt(const F& a) {
    return each<F>([&](std::size_t k) { return std::sqrt(a[k]); });
  }
#endif
};
