#pragma once
// 8-lane float/int vectors (GCC and Clang vector extensions) with the primitive names that
// activation_math.hpp's templates call, so the same math runs eight elements at a time. The
// compiler maps them onto AVX2 registers, or pairs of SSE registers on a baseline x86-64 build.
#include <cstdint>
#include <cstring>

#include "simd/bf16.hpp"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"  // 32-byte vectors only pass between inlined functions

namespace stowage::act_math {

typedef float v8f __attribute__((vector_size(32)));
typedef std::int32_t v8i __attribute__((vector_size(32)));
typedef std::uint32_t v8u __attribute__((vector_size(32)));
typedef std::uint16_t v8h __attribute__((vector_size(16)));

#define STOWAGE_SIMD inline __attribute__((always_inline))
STOWAGE_SIMD v8f splat_f(float c, const v8f&) { return v8f{} + c; }
STOWAGE_SIMD v8f select(const v8i& m, const v8f& a, const v8f& b) { return m ? a : b; }
STOWAGE_SIMD v8i bits(const v8f& x) { return reinterpret_cast<v8i>(x); }
STOWAGE_SIMD v8f from_bits(const v8i& i) { return reinterpret_cast<v8f>(i); }
STOWAGE_SIMD v8i to_int(const v8f& x) { return __builtin_convertvector(x, v8i); }

// Loads and stores of 8 elements (float, or bf16 bit patterns widened exactly / narrowed RNE).
STOWAGE_SIMD v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
STOWAGE_SIMD v8f load8(const std::uint16_t* p) {
  v8h h;
  std::memcpy(&h, p, sizeof h);
  return reinterpret_cast<v8f>(__builtin_convertvector(h, v8u) << 16);
}
STOWAGE_SIMD void store8(float* p, const v8f& v) { std::memcpy(p, &v, sizeof v); }
STOWAGE_SIMD void store8(std::uint16_t* p, const v8f& v) {
  const v8h h = __builtin_convertvector(bf16::round_bits(reinterpret_cast<v8u>(v)), v8h);
  std::memcpy(p, &h, sizeof h);
}
// The last 1..7 elements: padded with zeros, so they run the very same vector code.
template <class T>
STOWAGE_SIMD v8f load_part(const T* p, std::size_t n) {
  T buf[8] = {};
  std::memcpy(buf, p, n * sizeof(T));
  return load8(buf);
}
template <class T>
STOWAGE_SIMD void store_part(T* p, const v8f& v, std::size_t n) {
  T buf[8];
  store8(buf, v);
  std::memcpy(p, buf, n * sizeof(T));
}
#undef STOWAGE_SIMD

}  // namespace stowage::act_math

#pragma GCC diagnostic pop
