// Host kernels for avx2. Only this file is compiled for avx2, and its code runs only when
// dispatch.cpp finds the CPU supports it.
#include <immintrin.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "precision/kernel_table.hpp"

// Contraction off and this instruction set for every function below (to the end of the file).
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC optimize("fp-contract=off")
#pragma GCC target("avx2")
#endif

namespace stowage::detail {
namespace {
// The order matters: the kernel bodies use the ops structs declared before them.
// clang-format off
#include "precision/ops_scalar.hpp"
#include "precision/ops_avx2.hpp"
#include "precision/host_kernels.hpp"
// clang-format on
}  // namespace

const KernelTable& avx2_kernels() {
  static const KernelTable table = make_table<Avx2Ops>();
  return table;
}

}  // namespace stowage::detail

#if defined(__clang__)
#pragma clang attribute pop
#endif
