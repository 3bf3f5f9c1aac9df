// Optimizer steps on raw device pointers: argument checks, the finite check on the stream, then
// the backend's kernels (precision/device_kernels.hpp).
#include "stowage/device_optimizers.hpp"

#include <fmt/format.h>

#include "precision/device_kernels.hpp"
#include "precision/validate.hpp"
#include "stowage/error.hpp"

namespace stowage {
namespace {

bool grad_bf16(DeviceGrad g, std::size_t n, const char* fn) {
  if (g.dtype != DType::f32 && g.dtype != DType::bf16)
    throw InvalidArgument(fmt::format("{}: gradients must be f32 or bf16 (got {})", fn, to_string(g.dtype)));
  const bool bf16 = g.dtype == DType::bf16;
  if (n > 0) detail::check_pointer(g.data, bf16 ? 2 : 4, "gradient");
  return bf16;
}

// The finite check first when asked; true when the step must be skipped.
bool skip(Device& device, Stream stream, DeviceGrad grad, std::size_t n, const GradScaling& scaling, int* flag) {
  return scaling.skip_nonfinite && n > 0 && any_nonfinite(device, stream, grad, n, flag);
}

}  // namespace

bool any_nonfinite(Device& device, Stream stream, DeviceGrad grad, std::size_t n, int* flag) {
  const DeviceGradSpan one{grad, n};
  return any_nonfinite(device, stream, std::span(&one, 1), flag);
}

bool any_nonfinite(Device& device, Stream stream, std::span<const DeviceGradSpan> grads, int* flag) {
  bool any = false;
  for (const DeviceGradSpan& g : grads) {
    grad_bf16(g.grad, g.n, "any_nonfinite(device)");
    any = any || g.n > 0;
  }
  if (!any) return false;
  detail::check_pointer(flag, alignof(int), "any_nonfinite(device): flag");
  const detail::DeviceKernels& kernels = detail::device_kernels(device);
  int host = 0;
  device.fill_async(flag, 0, sizeof(int), stream);
  for (const DeviceGradSpan& g : grads)
    if (g.n > 0) kernels.any_nonfinite(device, stream, g.grad.data, g.grad.dtype == DType::bf16, 0, g.n, flag);
  device.copy_async(&host, flag, sizeof(int), CopyKind::device_to_host, stream);
  device.synchronize(stream);
  return host != 0;
}

void check_adam_step(const SplitPlanes& w, DeviceGrad grad, const float* m, const float* v,
                     const GradScaling& scaling) {
  const char* fn = "adam_step";
  detail::check_scaling(scaling, fn);
  detail::check_planes(w, 0, w.numel, fn);
  grad_bf16(grad, w.numel, fn);
  if (w.numel > 0) {
    detail::check_pointer(m, 4, "adam: m (exp_avg)");
    detail::check_pointer(v, 4, "adam: v (exp_avg_sq)");
  }
}

StepResult adam_step(Device& device, Stream stream, const SplitPlanes& w, DeviceGrad grad, float* m, float* v,
                     const AdamOptions& options, const GradScaling& scaling, OptimizerState& state, int* flag) {
  check_adam_step(w, grad, m, v, scaling);
  const detail::AdamArgs args{w, grad.data, grad.dtype == DType::bf16,
                              m, v,         adam_scalars(options, state.step + 1, scaling)};
  StepResult r;
  if (skip(device, stream, grad, w.numel, scaling, flag)) {
    r.found_nonfinite = true;
    r.step = state.step;
    return r;
  }
  if (w.numel > 0) detail::device_kernels(device).adam(device, stream, args, 0, w.numel);
  r.applied = true;
  r.step = ++state.step;
  return r;
}

void check_sgd_step(const SplitPlanes& w, DeviceGrad grad, const float* buf, const SgdOptions& options,
                    const GradScaling& scaling) {
  const char* fn = "sgd_step";
  detail::check_scaling(scaling, fn);
  detail::check_planes(w, 0, w.numel, fn);
  grad_bf16(grad, w.numel, fn);
  if (w.numel > 0 && options.momentum != 0.0f) detail::check_pointer(buf, 4, "sgd: momentum buffer");
}

StepResult sgd_step(Device& device, Stream stream, const SplitPlanes& w, DeviceGrad grad, float* buf,
                    const SgdOptions& options, const GradScaling& scaling, OptimizerState& state, int* flag) {
  check_sgd_step(w, grad, buf, options, scaling);
  const detail::SgdArgs args{w, grad.data, grad.dtype == DType::bf16, buf,
                             sgd_scalars(options, state.step + 1, scaling)};
  StepResult r;
  if (skip(device, stream, grad, w.numel, scaling, flag)) {
    r.found_nonfinite = true;
    r.step = state.step;
    return r;
  }
  if (w.numel > 0) detail::device_kernels(device).sgd(device, stream, args, 0, w.numel);
  r.applied = true;
  r.step = ++state.step;
  return r;
}

void adam_step_range_fp32(Device& device, Stream stream, float* params, DeviceGrad grad, float* m, float* v,
                          std::size_t begin, std::size_t end, const AdamScalars& scalars) {
  if (end <= begin) return;
  const bool bf16 = grad_bf16(grad, end, "adam_step_range_fp32(device)");
  detail::check_pointer(params, 4, "adam: fp32 weights");
  detail::check_pointer(m, 4, "adam: m (exp_avg)");
  detail::check_pointer(v, 4, "adam: v (exp_avg_sq)");
  const detail::AdamArgs args{{}, grad.data, bf16, m, v, scalars};
  detail::device_kernels(device).adam_fp32(device, stream, args, params, begin, end);
}

}  // namespace stowage
