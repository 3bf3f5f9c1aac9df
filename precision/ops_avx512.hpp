#pragma once
// Sixteen-lane operations on AVX-512 (F + BW). Included after `#pragma GCC target(...)`.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

struct Avx512Ops {
  static constexpr std::size_t W = 16;
  using U = __m512i;
  using F = __m512;
  static U set1(std::uint32_t x) { return _mm512_set1_epi32(static_cast<int>(x)); }
  static F fset1(float x) { return _mm512_set1_ps(x); }
  static U load_u16(const std::uint16_t* p) {
    return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void store_u16(std::uint16_t* p, U v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(v));
  }
  static F load_f32(const float* p) { return _mm512_loadu_ps(p); }
  static void store_f32(float* p, F v) { _mm512_storeu_ps(p, v); }
  // Non-temporal: p is 64-byte aligned; fence() before the data is used elsewhere.
  static void stream_f32(float* p, F v) { _mm512_stream_ps(p, v); }
  static void stream_u16(std::uint16_t* p, U v) {  // p is 32-byte aligned
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(v));
  }
  static void fence() { _mm_sfence(); }
  // i is a multiple of 8: the sixteen tie bits are two whole bytes.
  static U load_ties(const std::uint8_t* t, std::size_t i) {
    std::uint16_t k;
    std::memcpy(&k, t + (i >> 3), 2);
    return _mm512_maskz_set1_epi32(static_cast<__mmask16>(k), 1);
  }
  static void store_ties(std::uint8_t* t, std::size_t i, U v) {
    const auto k = static_cast<std::uint16_t>(_mm512_test_epi32_mask(v, v));
    std::memcpy(t + (i >> 3), &k, 2);
  }
  // The same two steps with the tie bits kept in a mask register (i is a multiple of 8):
  // hi + tie, and "lo == 0 and hi odd: hi - 1, tie bit set".
  static U add_ties(U hi, const std::uint8_t* t, std::size_t i) {
    std::uint16_t k;
    std::memcpy(&k, t + (i >> 3), 2);
    return _mm512_mask_add_epi32(hi, static_cast<__mmask16>(k), hi, _mm512_set1_epi32(1));
  }
  static U round_ties(U hi, U lo, std::uint8_t* t, std::size_t i) {
    const __m512i one = _mm512_set1_epi32(1);
    const __mmask16 k = _mm512_mask_testn_epi32_mask(_mm512_test_epi32_mask(hi, one), lo, lo);
    const auto bits = static_cast<std::uint16_t>(k);
    std::memcpy(t + (i >> 3), &bits, 2);
    return _mm512_mask_sub_epi32(hi, k, hi, one);
  }
  static U add(U a, U b) { return _mm512_add_epi32(a, b); }
  static U sub(U a, U b) { return _mm512_sub_epi32(a, b); }
  static U and_(U a, U b) { return _mm512_and_si512(a, b); }
  static U or_(U a, U b) { return _mm512_or_si512(a, b); }
  static U shl16(U a) { return _mm512_slli_epi32(a, 16); }
  static U shr16(U a) { return _mm512_srli_epi32(a, 16); }
  static U eq(U a, U b) { return _mm512_maskz_set1_epi32(_mm512_cmpeq_epi32_mask(a, b), 1); }
  static bool any(U a) { return _mm512_test_epi32_mask(a, a) != 0; }
  static F as_f(U a) { return _mm512_castsi512_ps(a); }
  static U as_u(F f) { return _mm512_castps_si512(f); }
  static F fadd(F a, F b) { return _mm512_add_ps(a, b); }
  static F fsub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F fmul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fdiv(F a, F b) { return _mm512_div_ps(a, b); }
  static F fsqrt(F a) { return _mm512_sqrt_ps(a); }
  static F quiet_nan(F a) {
    return _mm512_mask_mov_ps(a, _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q),
                              _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000)));
  }
};
