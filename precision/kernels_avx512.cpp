// Host kernels for avx512. Only this file is compiled for avx512, and its code runs only when
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
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw"))), apply_to = function)
#else
#pragma GCC optimize("fp-contract=off")
#pragma GCC target("avx512f,avx512bw")
// GCC 12 warns about the deliberately undefined registers inside its own intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace stowage::detail {
namespace {
// The order matters: the kernel bodies use the ops structs declared before them.
// clang-format off
#include "precision/ops_scalar.hpp"
#include "precision/ops_avx512.hpp"
#include "precision/host_kernels.hpp"
// clang-format on
}  // namespace

const KernelTable& avx512_kernels() {
  static const KernelTable table = make_table<Avx512Ops>();
  return table;
}

}  // namespace stowage::detail

#if defined(__clang__)
#pragma clang attribute pop
#endif
