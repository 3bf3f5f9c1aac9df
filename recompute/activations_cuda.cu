// CUDA activation kernels: activation_math.hpp per element, one thread per element (grid-stride),
// except the bias backward with a bias gradient, where one thread owns a column and sums its
// rows in order, so dbias is deterministic without atomics.
#include <cuda_runtime_api.h>

#include <algorithm>

#include "device/cuda/cuda_check_cuda.hpp"
#include "recompute/activation_args.hpp"
#include "recompute/activation_math.hpp"
#include "stowage/activations.hpp"

namespace stowage::cuda {
namespace {

using namespace act_math;
using namespace act_args;
using bf16 = std::uint16_t;

__device__ __forceinline__ float ld(const float* p) { return *p; }
__device__ __forceinline__ float ld(const bf16* p) { return bf16_to_f32(*p); }
__device__ __forceinline__ void st(float* p, float v) { *p = v; }
__device__ __forceinline__ void st(bf16* p, float v) { *p = f32_to_bf16(v); }

__device__ __forceinline__ std::size_t first_index() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::size_t grid_step() { return static_cast<std::size_t>(gridDim.x) * blockDim.x; }

template <Activation A, class T>
__global__ void unary_fwd(std::size_t n, const T* x, T* y) {
  for (std::size_t i = first_index(); i < n; i += grid_step()) st(y + i, act_fwd<A>(ld(x + i)));
}

template <Activation A, class T>
__global__ void unary_bwd(std::size_t n, const T* x, const T* dy, T* dx) {
  for (std::size_t i = first_index(); i < n; i += grid_step()) st(dx + i, act_grad_times<A>(ld(x + i), ld(dy + i)));
}

template <Activation A, class T>
__global__ void bias_fwd(std::size_t rows, std::size_t cols, const T* x, const T* b, T* y) {
  const std::size_t n = rows * cols;
  for (std::size_t i = first_index(); i < n; i += grid_step()) st(y + i, act_fwd<A>(ld(x + i) + ld(b + i % cols)));
}

template <Activation A, class T>
__global__ void bias_bwd(std::size_t rows, std::size_t cols, const T* x, const T* b, const T* dy, T* dx) {
  const std::size_t n = rows * cols;
  for (std::size_t i = first_index(); i < n; i += grid_step())
    st(dx + i, act_grad_times<A>(ld(x + i) + ld(b + i % cols), ld(dy + i)));
}

template <Activation A, class T>
__global__ void bias_bwd_columns(std::size_t rows, std::size_t cols, const T* x, const T* b, const T* dy, T* dx,
                                 T* db) {
  for (std::size_t c = first_index(); c < cols; c += grid_step()) {
    const float bc = ld(b + c);
    float acc = 0.0f;
    for (std::size_t r = 0; r < rows; ++r) {
      const std::size_t i = r * cols + c;
      const float g = act_grad_times<A>(ld(x + i) + bc, ld(dy + i));
      st(dx + i, g);
      acc += g;
    }
    st(db + c, acc);
  }
}

template <Activation A, class T>
__global__ void gated_fwd(std::size_t rows, std::size_t cols, const T* g, std::size_t gld, const T* u, std::size_t uld,
                          T* y) {
  const std::size_t n = rows * cols;
  for (std::size_t i = first_index(); i < n; i += grid_step()) {
    const std::size_t r = i / cols, c = i % cols;
    st(y + i, act_fwd<A>(ld(g + r * gld + c)) * ld(u + r * uld + c));
  }
}

template <Activation A, class T>
__global__ void gated_bwd(std::size_t rows, std::size_t cols, const T* g, std::size_t gld, const T* u, std::size_t uld,
                          const T* dy, T* dg, T* du) {
  const std::size_t n = rows * cols;
  for (std::size_t i = first_index(); i < n; i += grid_step()) {
    const std::size_t r = i / cols, c = i % cols;
    const float gv = ld(g + r * gld + c), uv = ld(u + r * uld + c), dyv = ld(dy + i);
    const float dgv = act_grad_times<A>(gv, dyv * uv);
    const float duv = dyv * act_fwd<A>(gv);
    st(dg + r * gld + c, dgv);
    st(du + r * uld + c, duv);
  }
}

constexpr unsigned kThreads = 256;
unsigned blocks_for(std::size_t n) {
  return static_cast<unsigned>(std::clamp<std::size_t>((n + kThreads - 1) / kThreads, 1, 65535));
}

// Calls body.template operator()<A, T>() for the run-time activation and dtype.
template <class Body>
void dispatch(Activation a, DType dtype, Body&& body) {
  auto with_type = [&]<Activation A>() {
    if (dtype == DType::f32) body.template operator()<A, float>();
    else body.template operator()<A, bf16>();
  };
  switch (a) {
    case Activation::relu: with_type.template operator()<Activation::relu>(); break;
    case Activation::silu: with_type.template operator()<Activation::silu>(); break;
    case Activation::gelu_erf: with_type.template operator()<Activation::gelu_erf>(); break;
    case Activation::gelu_tanh: with_type.template operator()<Activation::gelu_tanh>(); break;
  }
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace

void activation_forward(Activation a, DType dtype, std::size_t n, const void* x, void* y, void* stream) {
  check_unary("cuda::activation_forward", a, dtype, n, {x, y});
  if (n == 0) return;
  dispatch(a, dtype, [&]<Activation A, class T>() {
    unary_fwd<A, T><<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(n, static_cast<const T*>(x), static_cast<T*>(y));
  });
  detail::check_cuda(cudaGetLastError(), "activation_forward launch");
}

void activation_backward(Activation a, DType dtype, std::size_t n, const void* x, const void* dy, void* dx,
                         void* stream) {
  check_unary("cuda::activation_backward", a, dtype, n, {x, dy, dx});
  if (n == 0) return;
  dispatch(a, dtype, [&]<Activation A, class T>() {
    unary_bwd<A, T><<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(n, static_cast<const T*>(x),
                                                                       static_cast<const T*>(dy), static_cast<T*>(dx));
  });
  detail::check_cuda(cudaGetLastError(), "activation_backward launch");
}

void bias_activation_forward(Activation a, DType dtype, std::size_t rows, std::size_t cols, const void* x,
                             const void* bias, void* y, void* stream) {
  check_bias("cuda::bias_activation_forward", a, dtype, rows, cols, {x, bias, y});
  if (rows * cols == 0) return;
  dispatch(a, dtype, [&]<Activation A, class T>() {
    bias_fwd<A, T><<<blocks_for(rows * cols), kThreads, 0, as_stream(stream)>>>(
        rows, cols, static_cast<const T*>(x), static_cast<const T*>(bias), static_cast<T*>(y));
  });
  detail::check_cuda(cudaGetLastError(), "bias_activation_forward launch");
}

void bias_activation_backward(Activation a, DType dtype, std::size_t rows, std::size_t cols, const void* x,
                              const void* bias, const void* dy, void* dx, void* dbias, void* stream) {
  check_bias("cuda::bias_activation_backward", a, dtype, rows, cols, {x, bias, dy, dx});
  if (cols == 0) return;
  dispatch(a, dtype, [&]<Activation A, class T>() {
    const auto* xp = static_cast<const T*>(x);
    const auto* bp = static_cast<const T*>(bias);
    const auto* dyp = static_cast<const T*>(dy);
    if (dbias != nullptr) {
      bias_bwd_columns<A, T><<<blocks_for(cols), kThreads, 0, as_stream(stream)>>>(
          rows, cols, xp, bp, dyp, static_cast<T*>(dx), static_cast<T*>(dbias));
    } else if (rows != 0) {
      bias_bwd<A, T>
          <<<blocks_for(rows * cols), kThreads, 0, as_stream(stream)>>>(rows, cols, xp, bp, dyp, static_cast<T*>(dx));
    }
  });
  detail::check_cuda(cudaGetLastError(), "bias_activation_backward launch");
}

void gated_activation_forward(Activation a, DType dtype, std::size_t rows, std::size_t cols, const void* gate,
                              std::size_t gate_ld, const void* up, std::size_t up_ld, void* y, void* stream) {
  check_gated("cuda::gated_activation_forward", a, dtype, rows, cols, gate_ld, up_ld, {gate, up, y});
  if (rows * cols == 0) return;
  dispatch(a, dtype, [&]<Activation A, class T>() {
    gated_fwd<A, T><<<blocks_for(rows * cols), kThreads, 0, as_stream(stream)>>>(
        rows, cols, static_cast<const T*>(gate), gate_ld, static_cast<const T*>(up), up_ld, static_cast<T*>(y));
  });
  detail::check_cuda(cudaGetLastError(), "gated_activation_forward launch");
}

void gated_activation_backward(Activation a, DType dtype, std::size_t rows, std::size_t cols, const void* gate,
                               std::size_t gate_ld, const void* up, std::size_t up_ld, const void* dy, void* dgate,
                               void* dup, void* stream) {
  check_gated("cuda::gated_activation_backward", a, dtype, rows, cols, gate_ld, up_ld, {gate, up, dy, dgate, dup});
  if (rows * cols == 0) return;
  dispatch(a, dtype, [&]<Activation A, class T>() {
    gated_bwd<A, T><<<blocks_for(rows * cols), kThreads, 0, as_stream(stream)>>>(
        rows, cols, static_cast<const T*>(gate), gate_ld, static_cast<const T*>(up), up_ld, static_cast<const T*>(dy),
        static_cast<T*>(dgate), static_cast<T*>(dup));
  });
  detail::check_cuda(cudaGetLastError(), "gated_activation_backward launch");
}

}  // namespace stowage::cuda
