// The host kernel table for the SIMD level in effect (simd_level(): STOWAGE_SIMD or
// set_simd_level(), else the best the CPU has).
#include "precision/kernel_table.hpp"
#include "stowage/simd_level.hpp"

namespace stowage::detail {

const KernelTable& kernels() {
  switch (simd_level()) {
#if defined(__x86_64__) || defined(__i386__)
    case SimdLevel::avx512: return avx512_kernels();
    case SimdLevel::avx2: return avx2_kernels();
#endif
    default: return scalar_kernels();
  }
}

}  // namespace stowage::detail
