#pragma once
// One-lane "vector" operations: the portable path and the head/tail of the vector paths.
// Included inside an anonymous namespace by each kernel file, so every instruction-set level
// gets its own copy compiled for it.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

struct ScalarOps {
  static constexpr std::size_t W = 1;
  using U = std::uint32_t;
  using F = float;
  static U set1(std::uint32_t x) { return x; }
  static F fset1(float x) { return x; }
  static U load_u16(const std::uint16_t* p) { return *p; }
  static void store_u16(std::uint16_t* p, U v) { *p = static_cast<std::uint16_t>(v); }
  static F load_f32(const float* p) { return *p; }
  static void store_f32(float* p, F v) { *p = v; }
  static void stream_f32(float* p, F v) { *p = v; }
  static void stream_u16(std::uint16_t* p, U v) { *p = static_cast<std::uint16_t>(v); }
  static void fence() {}
  static U load_ties(const std::uint8_t* t, std::size_t i) { return (t[i >> 3] >> (i & 7)) & 1u; }
  static void store_ties(std::uint8_t* t, std::size_t i, U v) {
    const auto bit = static_cast<std::uint8_t>(1u << (i & 7));
    t[i >> 3] = v ? static_cast<std::uint8_t>(t[i >> 3] | bit) : static_cast<std::uint8_t>(t[i >> 3] & ~bit);
  }
  static U add(U a, U b) { return a + b; }
  static U sub(U a, U b) { return a - b; }
  static U and_(U a, U b) { return a & b; }
  static U or_(U a, U b) { return a | b; }
  static U shl16(U a) { return a << 16; }
  static U shr16(U a) { return a >> 16; }
  static U eq(U a, U b) { return a == b ? 1u : 0u; }  // 1 or 0 per lane
  static bool any(U a) { return a != 0; }
  static F as_f(U a) {
    F f;
    std::memcpy(&f, &a, 4);
    return f;
  }
  static U as_u(F f) {
    U a;
    std::memcpy(&a, &f, 4);
    return a;
  }
  static F fadd(F a, F b) { return a + b; }
  static F fsub(F a, F b) { return a - b; }
  static F fmul(F a, F b) { return a * b; }
  static F fdiv(F a, F b) { return a / b; }
  static F fsqrt(F a) { return std::sqrt(a); }
  // NaN lanes become the canonical quiet NaN 0x7FC00000 (its bf16 half is NaN too).
  static F quiet_nan(F a) { return std::isnan(a) ? as_f(0x7FC00000u) : a; }
};
