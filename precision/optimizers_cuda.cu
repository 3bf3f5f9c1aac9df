// CUDA fused optimizer kernels. The same operations in the same order as the host kernels
// (docs/precision.md), each one explicitly rounded (__fmul_rn, __fadd_rn, __fdiv_rn,
// __fsqrt_rn) so nvcc cannot contract them into FMAs: results are bit-identical to the host.
#include "precision/cuda_kernels.hpp"
#include "precision/split_math_cuda.cuh"

namespace stowage::cuda_precision {
namespace {

__device__ __forceinline__ float load_grad(const void* g, bool bf16, std::size_t i) {
  if (bf16) return __uint_as_float(std::uint32_t{static_cast<const std::uint16_t*>(g)[i]} << 16);
  return static_cast<const float*>(g)[i];
}

__device__ __forceinline__ float scaled_grad(const void* g, bool bf16, std::size_t i, float inv_scale, float clip) {
  return __fmul_rn(__fmul_rn(load_grad(g, bf16, i), inv_scale), clip);
}

__global__ void nonfinite_kernel(const void* grad, bool bf16, std::size_t begin, std::size_t end, int* flag) {
  for (std::size_t i = begin + first_index(); i < end; i += grid_step()) {
    const std::uint32_t u = __float_as_uint(load_grad(grad, bf16, i));
    if ((u & 0x7F800000u) == 0x7F800000u) *flag = 1;
  }
}

// Element i's Adam update of the master value p (m and v updated in place); shared by the split
// and the plain fp32 kernels, so both compute the same numbers.
__device__ __forceinline__ float adam_update(const detail::AdamArgs& a, std::size_t i, float p) {
  const AdamScalars& s = a.s;
  float g = scaled_grad(a.grad, a.grad_bf16, i, s.inv_loss_scale, s.clip_coef);
  if (s.weight_decay != 0.0f) {
    if (s.decoupled) p = __fmul_rn(p, s.decay);
    else g = __fadd_rn(g, __fmul_rn(p, s.weight_decay));
  }
  const float m = __fadd_rn(__fmul_rn(a.m[i], s.beta1), __fmul_rn(g, s.one_minus_beta1));
  const float v = __fadd_rn(__fmul_rn(a.v[i], s.beta2), __fmul_rn(__fmul_rn(g, g), s.one_minus_beta2));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bias_correction2_sqrt), s.eps);
  a.m[i] = m;
  a.v[i] = v;
  return __fsub_rn(p, __fmul_rn(__fdiv_rn(m, denom), s.step_size));
}

__global__ void adam_kernel(detail::AdamArgs a, std::size_t begin, std::size_t end) {
  const bool rne = a.w.rounding == Rounding::nearest_even;
  for (std::size_t i = begin + first_index(); i - lane_index() < end; i += grid_step()) {
    const bool active = i < end;
    std::uint32_t tie = 0;
    if (active) tie = split_one(a.w, i, quiet_nan(adam_update(a, i, merge_one(a.w, i, tie_in(a.w, i)))), rne);
    store_ties_warp(a.w, i, end, active, tie);
  }
}

// NaN canonicalised as in the split kernel and the host's fp32 kernel: the two paths stay bit-identical.
__global__ void adam_fp32_kernel(detail::AdamArgs a, float* params, std::size_t begin, std::size_t end) {
  for (std::size_t i = begin + first_index(); i < end; i += grid_step())
    params[i] = quiet_nan(adam_update(a, i, params[i]));
}

__global__ void sgd_kernel(detail::SgdArgs a, std::size_t begin, std::size_t end) {
  const SgdScalars s = a.s;
  const bool rne = a.w.rounding == Rounding::nearest_even;
  for (std::size_t i = begin + first_index(); i - lane_index() < end; i += grid_step()) {
    const bool active = i < end;
    std::uint32_t tie = 0;
    if (active) {
      float g = scaled_grad(a.grad, a.grad_bf16, i, s.inv_loss_scale, s.clip_coef);
      float p = merge_one(a.w, i, tie_in(a.w, i));
      if (s.weight_decay != 0.0f) g = __fadd_rn(g, __fmul_rn(p, s.weight_decay));
      if (s.momentum != 0.0f) {
        const float buf =
            s.first_step ? g : __fadd_rn(__fmul_rn(a.buf[i], s.momentum), __fmul_rn(g, s.one_minus_dampening));
        a.buf[i] = buf;
        g = s.nesterov ? __fadd_rn(g, __fmul_rn(buf, s.momentum)) : buf;
      }
      p = __fsub_rn(p, __fmul_rn(g, s.lr));
      tie = split_one(a.w, i, quiet_nan(p), rne);
    }
    store_ties_warp(a.w, i, end, active, tie);
  }
}

}  // namespace

void any_nonfinite(const void* grad, bool bf16, std::size_t begin, std::size_t end, int* flag, void* stream) {
  if (end <= begin) return;
  const std::size_t blocks = (end - begin + kThreads - 1) / kThreads;
  nonfinite_kernel<<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), kThreads, 0,
                     static_cast<cudaStream_t>(stream)>>>(grad, bf16, begin, end, flag);
  detail::check_cuda(cudaGetLastError(), "any_nonfinite launch");
}

void adam(const detail::AdamArgs& a, std::size_t begin, std::size_t end, void* stream) {
  check_begin(begin, "cuda adam");
  if (end <= begin) return;
  adam_kernel<<<blocks_for(begin, end), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a, begin, end);
  detail::check_cuda(cudaGetLastError(), "adam launch");
}

void adam_fp32(const detail::AdamArgs& a, float* params, std::size_t begin, std::size_t end, void* stream) {
  if (end <= begin) return;
  adam_fp32_kernel<<<blocks_for(begin, end), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a, params, begin, end);
  detail::check_cuda(cudaGetLastError(), "adam_fp32 launch");
}

void sgd(const detail::SgdArgs& a, std::size_t begin, std::size_t end, void* stream) {
  check_begin(begin, "cuda sgd");
  if (end <= begin) return;
  sgd_kernel<<<blocks_for(begin, end), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a, begin, end);
  detail::check_cuda(cudaGetLastError(), "sgd launch");
}

}  // namespace stowage::cuda_precision
