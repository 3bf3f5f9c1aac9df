#pragma once
// The host kernels of one instruction-set level, as a table of function pointers; dispatch.cpp
// picks one table per call from simd_level().
#include <cstddef>
#include <cstdint>

#include "stowage/optimizers.hpp"
#include "stowage/precision.hpp"
#include "stowage/simd_level.hpp"

namespace stowage::detail {

struct AdamArgs {
  SplitPlanes w;
  const void* grad;
  bool grad_bf16;
  float* m;
  float* v;
  AdamScalars s;
};

struct SgdArgs {
  SplitPlanes w;
  const void* grad;
  bool grad_bf16;
  float* buf;
  SgdScalars s;
};

struct KernelTable {
  void (*split)(const float* src, const SplitPlanes& dst, std::size_t begin, std::size_t end);
  void (*merge)(const SplitPlanes& src, float* dst, std::size_t begin, std::size_t end);
  bool (*any_nonfinite)(const void* grad, bool bf16, std::size_t begin, std::size_t end);
  void (*adam)(const AdamArgs& a, std::size_t begin, std::size_t end);
  void (*sgd)(const SgdArgs& a, std::size_t begin, std::size_t end);
  // Adam on a plain fp32 master array (a.w unused): the unfused path's update.
  void (*adam_fp32)(const AdamArgs& a, float* params, std::size_t begin, std::size_t end);
};

const KernelTable& scalar_kernels();
const KernelTable& avx2_kernels();
const KernelTable& avx512_kernels();
// The table for simd_level().
const KernelTable& kernels();

}  // namespace stowage::detail
