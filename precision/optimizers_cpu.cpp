// Fused optimizer steps on split storage in host memory: argument checks, per-step scalars,
// the finite check, and the dispatch to the vectorised kernels.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include <fmt/format.h>

#include "precision/kernel_table.hpp"
#include "precision/validate.hpp"
#include "stowage/error.hpp"
#include "stowage/optimizers.hpp"

namespace stowage {
namespace {

bool grad_is_bf16(const HostGrad& g, const char* what) {
  if (g.dtype == DType::f32) return false;
  if (g.dtype == DType::bf16) return true;
  throw InvalidArgument(
      fmt::format("{}: gradients must be f32 or bf16 (got dtype #{})", what, static_cast<int>(g.dtype)));
}

void check_grad(const HostGrad& g, std::size_t n, const char* what) {
  const bool bf16 = grad_is_bf16(g, what);
  if (n > 0) detail::check_pointer(g.data, bf16 ? 2 : 4, "gradient");
}

// The hyper-parameters PyTorch's own optimizers accept (torch/optim/adam.py, sgd.py __init__).
void check_non_negative(float value, const char* name, const char* what) {
  if (!(std::isfinite(value) && value >= 0.0f))
    throw InvalidArgument(fmt::format("{}: {} must be finite and >= 0 (got {})", what, name, value));
}

void check_beta(float value, const char* name, const char* what) {
  if (!(value >= 0.0f && value < 1.0f))
    throw InvalidArgument(fmt::format("{}: {} must be in [0, 1) (got {})", what, name, value));
}

}  // namespace

AdamScalars adam_scalars(const AdamOptions& o, std::int64_t step, const GradScaling& scaling) {
  if (step < 1) throw InvalidArgument(fmt::format("adam_scalars: step is 1-based (got {})", step));
  check_non_negative(o.lr, "lr", "adam");
  check_beta(o.beta1, "beta1", "adam");
  check_beta(o.beta2, "beta2", "adam");
  check_non_negative(o.eps, "eps", "adam");
  check_non_negative(o.weight_decay, "weight_decay", "adam");
  const double t = static_cast<double>(step);
  AdamScalars s{};
  s.beta1 = o.beta1;
  s.one_minus_beta1 = static_cast<float>(1.0 - double{o.beta1});
  s.beta2 = o.beta2;
  s.one_minus_beta2 = static_cast<float>(1.0 - double{o.beta2});
  s.eps = o.eps;
  s.weight_decay = o.weight_decay;
  s.decay = static_cast<float>(1.0 - double{o.lr} * double{o.weight_decay});
  s.step_size = static_cast<float>(double{o.lr} / (1.0 - std::pow(double{o.beta1}, t)));
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(double{o.beta2}, t)));
  s.inv_loss_scale = static_cast<float>(1.0 / double{scaling.loss_scale});
  s.clip_coef = scaling.clip_coef;
  s.decoupled = o.decoupled_weight_decay;
  return s;
}

SgdScalars sgd_scalars(const SgdOptions& o, std::int64_t step, const GradScaling& scaling) {
  if (step < 1) throw InvalidArgument(fmt::format("sgd_scalars: step is 1-based (got {})", step));
  check_non_negative(o.lr, "lr", "sgd");
  check_non_negative(o.momentum, "momentum", "sgd");
  check_non_negative(o.weight_decay, "weight_decay", "sgd");
  if (!std::isfinite(o.dampening))
    throw InvalidArgument(fmt::format("sgd: dampening must be finite (got {})", o.dampening));
  if (o.nesterov && (o.momentum <= 0.0f || o.dampening != 0.0f))
    throw InvalidArgument("sgd: Nesterov momentum needs a momentum above 0 and zero dampening");
  SgdScalars s{};
  s.lr = o.lr;
  s.momentum = o.momentum;
  s.one_minus_dampening = static_cast<float>(1.0 - double{o.dampening});
  s.weight_decay = o.weight_decay;
  s.inv_loss_scale = static_cast<float>(1.0 / double{scaling.loss_scale});
  s.clip_coef = scaling.clip_coef;
  s.nesterov = o.nesterov;
  s.first_step = step == 1;
  return s;
}

bool any_nonfinite(HostGrad grad, std::size_t begin, std::size_t end) {
  if (begin > end) throw InvalidArgument(fmt::format("any_nonfinite: begin {} > end {}", begin, end));
  check_grad(grad, end - begin, "any_nonfinite");
  return detail::kernels().any_nonfinite(grad.data, grad.dtype == DType::bf16, begin, end);
}

void adam_step_range(const SplitPlanes& w, HostGrad grad, float* m, float* v, std::size_t begin, std::size_t end,
                     const AdamScalars& scalars) {
  detail::check_planes(w, begin, end, "adam_step_range");
  check_grad(grad, end - begin, "adam_step_range");
  if (end > begin) {
    detail::check_pointer(m, 4, "adam: m (exp_avg)");
    detail::check_pointer(v, 4, "adam: v (exp_avg_sq)");
  }
  const detail::AdamArgs args{w, grad.data, grad.dtype == DType::bf16, m, v, scalars};
  detail::kernels().adam(args, begin, end);
}

void adam_step_range_fp32(float* params, HostGrad grad, float* m, float* v, std::size_t begin, std::size_t end,
                          const AdamScalars& scalars) {
  if (begin > end) throw InvalidArgument(fmt::format("adam_step_range_fp32: begin {} > end {}", begin, end));
  check_grad(grad, end - begin, "adam_step_range_fp32");
  if (end > begin) {
    detail::check_pointer(params, 4, "adam: params");
    detail::check_pointer(m, 4, "adam: m (exp_avg)");
    detail::check_pointer(v, 4, "adam: v (exp_avg_sq)");
  }
  const detail::AdamArgs args{SplitPlanes{}, grad.data, grad.dtype == DType::bf16, m, v, scalars};
  detail::kernels().adam_fp32(args, params, begin, end);
}

void sgd_step_range(const SplitPlanes& w, HostGrad grad, float* buf, std::size_t begin, std::size_t end,
                    const SgdScalars& scalars) {
  detail::check_planes(w, begin, end, "sgd_step_range");
  check_grad(grad, end - begin, "sgd_step_range");
  if (end > begin && scalars.momentum != 0.0f) detail::check_pointer(buf, 4, "sgd: momentum buffer");
  const detail::SgdArgs args{w, grad.data, grad.dtype == DType::bf16, buf, scalars};
  detail::kernels().sgd(args, begin, end);
}

StepResult adam_step(const SplitPlanes& w, HostGrad grad, float* m, float* v, const AdamOptions& options,
                     const GradScaling& scaling, OptimizerState& state) {
  detail::check_scaling(scaling, "adam_step");
  const AdamScalars s = adam_scalars(options, state.step + 1, scaling);
  detail::check_planes(w, 0, w.numel, "adam_step");
  check_grad(grad, w.numel, "adam_step");
  StepResult r;
  if (scaling.skip_nonfinite && any_nonfinite(grad, 0, w.numel)) {
    r.found_nonfinite = true;
    r.step = state.step;
    return r;
  }
  adam_step_range(w, grad, m, v, 0, w.numel, s);
  r.applied = true;
  r.step = ++state.step;
  return r;
}

StepResult sgd_step(const SplitPlanes& w, HostGrad grad, float* buf, const SgdOptions& options,
                    const GradScaling& scaling, OptimizerState& state) {
  detail::check_scaling(scaling, "sgd_step");
  const SgdScalars s = sgd_scalars(options, state.step + 1, scaling);
  detail::check_planes(w, 0, w.numel, "sgd_step");
  check_grad(grad, w.numel, "sgd_step");
  StepResult r;
  if (scaling.skip_nonfinite && any_nonfinite(grad, 0, w.numel)) {
    r.found_nonfinite = true;
    r.step = state.step;
    return r;
  }
  sgd_step_range(w, grad, buf, 0, w.numel, s);
  r.applied = true;
  r.step = ++state.step;
  return r;
}

}  // namespace stowage
