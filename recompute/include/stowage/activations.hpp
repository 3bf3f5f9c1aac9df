#pragma once
// Activation kernels, forward and backward, fp32 and bf16 (bf16 as uint16_t bit patterns,
// computed in fp32 and rounded to nearest even). The named activations of transformer MLPs:
//   GeLU      activation_forward(Activation::gelu_erf | gelu_tanh, ...)
//   bias-GeLU bias_activation_forward(Activation::gelu_*, ...)      y = gelu(x + bias)
//   SiLU      activation_forward(Activation::silu, ...)
//   SwiGLU    gated_activation_forward(Activation::silu, ...)       y = silu(gate) * up
//   GeGLU     gated_activation_forward(Activation::gelu_*, ...)     y = gelu(gate) * up
//   ReLU      activation_forward(Activation::relu, ...)
// Every kernel is deterministic: the same inputs on the same backend give the same bits, so a
// recomputed activation equals the one the forward pass produced. Accuracy: docs/recompute.md.
#include <cstddef>
#include <cstdint>

#include "stowage/device.hpp"
#include "stowage/dtype.hpp"

namespace stowage {

class TensorView;

enum class Activation : std::uint8_t { relu, silu, gelu_erf, gelu_tanh };
const char* to_string(Activation a);

// Pointer-level kernels. dtype is DType::f32 (float) or DType::bf16 (uint16_t bit patterns);
// another dtype is Unsupported. Unary and bias kernels take contiguous [rows, cols] (or n)
// arrays. Gated kernels read gate and up with their own row strides (in elements, >= cols), so
// the two halves of one fused [rows, 2*cols] projection are passed as (x, 2*cols) and
// (x + cols, 2*cols); y and dy are contiguous [rows, cols]; dgate and dup are written with the
// row strides of gate and up. An output may be its own input's buffer (y == x, dx == dy); other
// overlaps are undefined.
namespace cpu {  // host memory, on the calling thread; AVX2 when the CPU has it

void activation_forward(Activation a, DType dtype, std::size_t n, const void* x, void* y);
// dx = dy * f'(x)
void activation_backward(Activation a, DType dtype, std::size_t n, const void* x, const void* dy, void* dx);
// y[r, c] = f(x[r, c] + bias[c])
void bias_activation_forward(Activation a, DType dtype, std::size_t rows, std::size_t cols, const void* x,
                             const void* bias, void* y);
// dx = dy * f'(x + bias); dbias[c] = sum over r of dx[r, c] (fp32, in row order) unless null.
void bias_activation_backward(Activation a, DType dtype, std::size_t rows, std::size_t cols, const void* x,
                              const void* bias, const void* dy, void* dx, void* dbias);
// y = f(gate) * up
void gated_activation_forward(Activation a, DType dtype, std::size_t rows, std::size_t cols, const void* gate,
                              std::size_t gate_ld, const void* up, std::size_t up_ld, void* y);
// dgate = dy * up * f'(gate); dup = dy * f(gate)
void gated_activation_backward(Activation a, DType dtype, std::size_t rows, std::size_t cols, const void* gate,
                               std::size_t gate_ld, const void* up, std::size_t up_ld, const void* dy, void* dgate,
                               void* dup);

}  // namespace cpu

// The same on CUDA device memory, launched on `stream` (a cudaStream_t; nullptr = legacy
// default). Unsupported when stowage was built without CUDA. dbias is reduced per column in
// row order, so it is deterministic too.
namespace cuda {

void activation_forward(Activation a, DType dtype, std::size_t n, const void* x, void* y, void* stream);
void activation_backward(Activation a, DType dtype, std::size_t n, const void* x, const void* dy, void* dx,
                         void* stream);
void bias_activation_forward(Activation a, DType dtype, std::size_t rows, std::size_t cols, const void* x,
                             const void* bias, void* y, void* stream);
void bias_activation_backward(Activation a, DType dtype, std::size_t rows, std::size_t cols, const void* x,
                              const void* bias, const void* dy, void* dx, void* dbias, void* stream);
void gated_activation_forward(Activation a, DType dtype, std::size_t rows, std::size_t cols, const void* gate,
                              std::size_t gate_ld, const void* up, std::size_t up_ld, void* y, void* stream);
void gated_activation_backward(Activation a, DType dtype, std::size_t rows, std::size_t cols, const void* gate,
                               std::size_t gate_ld, const void* up, std::size_t up_ld, const void* dy, void* dgate,
                               void* dup, void* stream);

}  // namespace cuda

// Tensor-level dispatch, ordered on `stream` of the tensors' device: on the emulated device the
// CPU kernel runs on the stream's thread (Device::launch_host); on CUDA the kernel is launched
// on native(stream). The host never waits. Tensors must be resident, on one device, of one
// dtype (f32 or bf16), with matching shapes; unary/bias tensors contiguous; gate and up may be
// row-strided (last-dimension stride 1, e.g. the two slices of a fused projection). The
// caller keeps the bytes alive until the stream has run the kernel (as with any launch).
// InvalidArgument for mismatched tensors, Unsupported for another dtype.
void activation_forward(Activation a, const TensorView& x, const TensorView& y, Stream stream);
void activation_backward(Activation a, const TensorView& x, const TensorView& dy, const TensorView& dx, Stream stream);
// bias has shape [cols] where x is [..., cols]; dbias may be an undefined TensorView.
void bias_activation_forward(Activation a, const TensorView& x, const TensorView& bias, const TensorView& y,
                             Stream stream);
void bias_activation_backward(Activation a, const TensorView& x, const TensorView& bias, const TensorView& dy,
                              const TensorView& dx, const TensorView& dbias, Stream stream);
void gated_activation_forward(Activation a, const TensorView& gate, const TensorView& up, const TensorView& y,
                              Stream stream);
void gated_activation_backward(Activation a, const TensorView& gate, const TensorView& up, const TensorView& dy,
                               const TensorView& dgate, const TensorView& dup, Stream stream);

}  // namespace stowage
