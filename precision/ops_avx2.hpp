#pragma once
// Eight-lane operations on AVX2. Included after `#pragma GCC target("avx2")`.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

struct Avx2Ops {
  static constexpr std::size_t W = 8;
  using U = __m256i;
  using F = __m256;
  static U set1(std::uint32_t x) { return _mm256_set1_epi32(static_cast<int>(x)); }
  static F fset1(float x) { return _mm256_set1_ps(x); }
  static U load_u16(const std::uint16_t* p) {
    return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void store_u16(std::uint16_t* p, U v) {  // lanes hold values <= 0xFFFF
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
  static F load_f32(const float* p) { return _mm256_loadu_ps(p); }
  static void store_f32(float* p, F v) { _mm256_storeu_ps(p, v); }
  // Non-temporal: p is 32-byte aligned; fence() before the data is used elsewhere.
  static void stream_f32(float* p, F v) { _mm256_stream_ps(p, v); }
  static void stream_u16(std::uint16_t* p, U v) {  // p is 16-byte aligned
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), packed);
  }
  static void fence() { _mm_sfence(); }
  // i is a multiple of 8: the eight tie bits are one byte.
  static U load_ties(const std::uint8_t* t, std::size_t i) {
    const U bits = _mm256_and_si256(_mm256_set1_epi32(t[i >> 3]), _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128));
    return _mm256_min_epu32(bits, _mm256_set1_epi32(1));
  }
  static void store_ties(std::uint8_t* t, std::size_t i, U v) {
    t[i >> 3] = static_cast<std::uint8_t>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v, 31))));
  }
  static U add(U a, U b) { return _mm256_add_epi32(a, b); }
  static U sub(U a, U b) { return _mm256_sub_epi32(a, b); }
  static U and_(U a, U b) { return _mm256_and_si256(a, b); }
  static U or_(U a, U b) { return _mm256_or_si256(a, b); }
  static U shl16(U a) { return _mm256_slli_epi32(a, 16); }
  static U shr16(U a) { return _mm256_srli_epi32(a, 16); }
  static U eq(U a, U b) { return _mm256_srli_epi32(_mm256_cmpeq_epi32(a, b), 31); }
  static bool any(U a) { return !_mm256_testz_si256(a, a); }
  static F as_f(U a) { return _mm256_castsi256_ps(a); }
  static U as_u(F f) { return _mm256_castps_si256(f); }
  static F fadd(F a, F b) { return _mm256_add_ps(a, b); }
  static F fsub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F fmul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fdiv(F a, F b) { return _mm256_div_ps(a, b); }
  static F fsqrt(F a) { return _mm256_sqrt_ps(a); }
  static F quiet_nan(F a) {
    return _mm256_blendv_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)), _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
};
