#pragma once
// Fused optimizers that update split storage (precision.hpp) in place: each element is merged
// to fp32 in registers, updated, and split again; the fp32 master never goes to memory. After
// every step the master is bit-identical to a plain fp32 implementation that does the same
// float operations in the same order (docs/precision.md lists the order).
#include <cstddef>
#include <cstdint>

#include "stowage/dtype.hpp"
#include "stowage/precision.hpp"

namespace stowage {

struct AdamOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool decoupled_weight_decay = true;  // AdamW; false: Adam's L2 term g += wd * p
};

struct SgdOptions {
  float lr = 1e-2f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
};

// What happens to gradients before the update: g = (g * (1 / loss_scale)) * clip_coef. With
// skip_nonfinite, a gradient that is Inf or NaN anywhere skips the whole step.
struct GradScaling {
  float loss_scale = 1.0f;
  float clip_coef = 1.0f;  // e.g. min(1, max_norm / total_norm), computed by the caller
  bool skip_nonfinite = true;
};

// The state a step needs besides m and v: the number of steps applied so far.
struct OptimizerState {
  std::int64_t step = 0;
};

struct StepResult {
  bool applied = false;          // false: skipped, nothing was written
  bool found_nonfinite = false;  // a gradient was Inf or NaN
  std::int64_t step = 0;         // state.step after the call
};

// Per-step scalars, computed once on the host in double and rounded to float; the fused
// kernels and any reference use the same values. `step` is 1-based (the step being applied).
struct AdamScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay;
  float decay;                  // 1 - lr * weight_decay (decoupled)
  float step_size;              // lr / (1 - beta1^step)
  float bias_correction2_sqrt;  // sqrt(1 - beta2^step)
  float inv_loss_scale, clip_coef;
  bool decoupled;
};
// InvalidArgument for hyper-parameters PyTorch's optimizers refuse (lr, eps, weight_decay < 0 or
// not finite; a beta outside [0, 1)); every step computes these first, before writing anything.
AdamScalars adam_scalars(const AdamOptions& options, std::int64_t step, const GradScaling& scaling = {});

struct SgdScalars {
  float lr, momentum, one_minus_dampening, weight_decay, inv_loss_scale, clip_coef;
  bool nesterov;
  bool first_step;  // the momentum buffer is initialised to g
};
// InvalidArgument as PyTorch's SGD: lr, momentum, weight_decay negative or not finite; dampening
// not finite; Nesterov without momentum or with dampening.
SgdScalars sgd_scalars(const SgdOptions& options, std::int64_t step, const GradScaling& scaling = {});

// A gradient array in host-addressable memory, indexed like the weights (f32 or bf16).
struct HostGrad {
  const void* data = nullptr;
  DType dtype = DType::f32;
};

// --- pointer-level steps on elements [begin, end), for callers that stream windows ---
// True when any gradient in [begin, end) is Inf or NaN.
bool any_nonfinite(HostGrad grad, std::size_t begin, std::size_t end);
// m, v: fp32 arrays indexed like the weights. No finite check, no state change.
void adam_step_range(const SplitPlanes& weights, HostGrad grad, float* m, float* v, std::size_t begin, std::size_t end,
                     const AdamScalars& scalars);
// The same Adam update on a plain fp32 master array (what a framework without split storage
// runs), bit-identical to adam_step_range on the merged planes.
void adam_step_range_fp32(float* params, HostGrad grad, float* m, float* v, std::size_t begin, std::size_t end,
                          const AdamScalars& scalars);
// momentum_buffer may be null when momentum == 0.
void sgd_step_range(const SplitPlanes& weights, HostGrad grad, float* momentum_buffer, std::size_t begin,
                    std::size_t end, const SgdScalars& scalars);

// --- whole steps on host memory: finite check (optional), update, ++state.step ---
// InvalidArgument (nothing written) for null/misaligned pointers, an unsupported grad dtype, or
// hyper-parameters adam_scalars/sgd_scalars refuse.
StepResult adam_step(const SplitPlanes& weights, HostGrad grad, float* m, float* v, const AdamOptions& options,
                     const GradScaling& scaling, OptimizerState& state);
StepResult sgd_step(const SplitPlanes& weights, HostGrad grad, float* momentum_buffer, const SgdOptions& options,
                    const GradScaling& scaling, OptimizerState& state);

}  // namespace stowage
