#pragma once
// Which CPU vector instruction set stowage's host kernels use. Detected once at start-up; a
// level can be forced (lower only) so every path this CPU has can be tested and compared.
namespace stowage {

enum class SimdLevel { scalar = 0, avx2 = 1, avx512 = 2 };
const char* to_string(SimdLevel level);

// The best level this CPU supports (AVX-512 means avx512f + avx512bw).
SimdLevel detected_simd_level();
// The level host kernels use now: detected_simd_level(), lowered by STOWAGE_SIMD
// (scalar | avx2 | avx512) or set_simd_level().
SimdLevel simd_level();
// Unsupported when this CPU lacks `level`.
void set_simd_level(SimdLevel level);

}  // namespace stowage
