// Argument checks for the pointer-level activation kernels.
#include "recompute/activation_args.hpp"

#include <fmt/format.h>

#include "stowage/error.hpp"

namespace stowage::act_args {
namespace {

void check_common(const char* fn, Activation a, DType dtype) {
  if (static_cast<unsigned>(a) > static_cast<unsigned>(Activation::gelu_tanh))
    throw InvalidArgument(fmt::format("{}: unknown activation {}", fn, static_cast<unsigned>(a)));
  if (dtype != DType::f32 && dtype != DType::bf16)
    throw Unsupported(fmt::format("{}: dtype {} (f32 and bf16 are supported)", fn, to_string(dtype)));
}

void check_pointers(const char* fn, std::size_t n, std::initializer_list<const void*> ptrs) {
  if (n == 0) return;
  for (const void* p : ptrs)
    if (p == nullptr) throw InvalidArgument(fmt::format("{}: null pointer for {} elements", fn, n));
}

std::size_t checked_product(const char* fn, std::size_t rows, std::size_t cols) {
  std::size_t n = 0;
  if (__builtin_mul_overflow(rows, cols, &n))
    throw InvalidArgument(fmt::format("{}: {} x {} elements overflow", fn, rows, cols));
  return n;
}

}  // namespace

void check_unary(const char* fn, Activation a, DType dtype, std::size_t n, std::initializer_list<const void*> ptrs) {
  check_common(fn, a, dtype);
  check_pointers(fn, n, ptrs);
}

void check_bias(const char* fn, Activation a, DType dtype, std::size_t rows, std::size_t cols,
                std::initializer_list<const void*> ptrs) {
  check_common(fn, a, dtype);
  check_pointers(fn, checked_product(fn, rows, cols), ptrs);
}

void check_gated(const char* fn, Activation a, DType dtype, std::size_t rows, std::size_t cols, std::size_t gate_ld,
                 std::size_t up_ld, std::initializer_list<const void*> ptrs) {
  check_common(fn, a, dtype);
  if (rows > 1 && (gate_ld < cols || up_ld < cols))
    throw InvalidArgument(
        fmt::format("{}: row strides gate {} / up {} are shorter than {} columns", fn, gate_ld, up_ld, cols));
  checked_product(fn, rows, gate_ld > cols ? gate_ld : cols);
  checked_product(fn, rows, up_ld > cols ? up_ld : cols);
  check_pointers(fn, checked_product(fn, rows, cols), ptrs);
}

}  // namespace stowage::act_args
