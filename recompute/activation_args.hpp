#pragma once
// Argument checks shared by the CPU and CUDA pointer-level activation kernels: bad input is
// refused before anything is touched. (Defined in a .cpp: fmt's compile-time format checks do
// not build under nvcc.)
#include <cstddef>
#include <initializer_list>

#include "stowage/activations.hpp"

namespace stowage::act_args {

// InvalidArgument for an unknown activation; Unsupported for a dtype other than f32 / bf16;
// InvalidArgument for a null pointer when there are elements, overflowing sizes, or row
// strides shorter than a row.
void check_unary(const char* fn, Activation a, DType dtype, std::size_t n, std::initializer_list<const void*> ptrs);
void check_bias(const char* fn, Activation a, DType dtype, std::size_t rows, std::size_t cols,
                std::initializer_list<const void*> ptrs);
void check_gated(const char* fn, Activation a, DType dtype, std::size_t rows, std::size_t cols, std::size_t gate_ld,
                 std::size_t up_ld, std::initializer_list<const void*> ptrs);

}  // namespace stowage::act_args
