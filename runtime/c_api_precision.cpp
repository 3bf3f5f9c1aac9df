// The C ABI of BF16/FP32 shared storage: split, merge, the finite check and the fused optimizer
// steps on host memory, and the steps queued on a device's stream, for frameworks that own the
// planes (stowage.torch's optimizers).
#include <fmt/format.h>

#include "runtime/c_api_guard.hpp"
#include "runtime/c_api_precision_args.hpp"
#include "stowage/error.hpp"
#include "stowage/runtime.hpp"

namespace stowage {
namespace {

// The count behind `step`, which must point to one.
OptimizerState state_at(const int64_t* step, const char* what) {
  if (step == nullptr) throw InvalidArgument(fmt::format("{}: step must point to a count >= 0", what));
  return capi::state_of(*step, what);
}

}  // namespace
}  // namespace stowage

using namespace stowage;
using namespace stowage::capi;

extern "C" {

int stowage_split(const float* src, const stowage_split_planes* dst) {
  return guarded(-1, [&] {
    const SplitPlanes p = planes_of(dst, "stowage_split");
    split(src, p);
    return 0;
  });
}

int stowage_merge(const stowage_split_planes* src, float* dst) {
  return guarded(-1, [&] {
    const SplitPlanes p = planes_of(src, "stowage_merge");
    merge(p, dst);
    return 0;
  });
}

int stowage_any_nonfinite(const void* grad, int grad_bits, size_t n) {
  return guarded(-1, [&] {
    const HostGrad g = grad_of(grad, grad_bits, "stowage_any_nonfinite");
    return any_nonfinite(g, 0, n) ? 1 : 0;
  });
}

int stowage_adam_step(const stowage_split_planes* weights, const void* grad, int grad_bits, float* m, float* v,
                      const stowage_adam_options* options, const stowage_grad_scaling* scaling, int64_t* step) {
  return guarded(-1, [&] {
    const char* what = "stowage_adam_step";
    const SplitPlanes p = planes_of(weights, what);
    const HostGrad g = grad_of(grad, grad_bits, what);
    const AdamOptions o = adam_options_of(options, what);
    OptimizerState state = state_at(step, what);
    const StepResult r = adam_step(p, g, m, v, o, scaling_of(scaling), state);
    *step = state.step;
    return r.applied ? 1 : 0;
  });
}

int stowage_sgd_step(const stowage_split_planes* weights, const void* grad, int grad_bits, float* momentum_buffer,
                     const stowage_sgd_options* options, const stowage_grad_scaling* scaling, int64_t* step) {
  return guarded(-1, [&] {
    const char* what = "stowage_sgd_step";
    const SplitPlanes p = planes_of(weights, what);
    const HostGrad g = grad_of(grad, grad_bits, what);
    const SgdOptions o = sgd_options_of(options, what);
    OptimizerState state = state_at(step, what);
    const StepResult r = sgd_step(p, g, momentum_buffer, o, scaling_of(scaling), state);
    *step = state.step;
    return r.applied ? 1 : 0;
  });
}

int stowage_adam_step_async(int device, void* stream, const stowage_split_planes* weights, const void* grad,
                            int grad_bits, float* m, float* v, const stowage_adam_options* options,
                            const stowage_grad_scaling* scaling, int64_t* step) {
  return guarded(-1, [&] {
    const char* what = "stowage_adam_step_async";
    const SplitPlanes p = planes_of(weights, what);
    const DeviceGrad g = device_grad(grad_of(grad, grad_bits, what));
    const AdamOptions o = adam_options_of(options, what);
    const GradScaling sc = scaling_of(scaling);
    OptimizerState state = state_at(step, what);
    const Stream s = stream_of(device, stream);
    Device& d = stowage::device(device);
    check_adam_step(p, g, m, v, sc);  // before the flag: a refused call allocates nothing
    const Flag flag(device, s, sc.skip_nonfinite && p.numel > 0);
    const StepResult r = adam_step(d, s, p, g, m, v, o, sc, state, flag.get());
    *step = state.step;
    return r.applied ? 1 : 0;
  });
}

int stowage_sgd_step_async(int device, void* stream, const stowage_split_planes* weights, const void* grad,
                           int grad_bits, float* momentum_buffer, const stowage_sgd_options* options,
                           const stowage_grad_scaling* scaling, int64_t* step) {
  return guarded(-1, [&] {
    const char* what = "stowage_sgd_step_async";
    const SplitPlanes p = planes_of(weights, what);
    const DeviceGrad g = device_grad(grad_of(grad, grad_bits, what));
    const SgdOptions o = sgd_options_of(options, what);
    const GradScaling sc = scaling_of(scaling);
    OptimizerState state = state_at(step, what);
    const Stream s = stream_of(device, stream);
    Device& d = stowage::device(device);
    check_sgd_step(p, g, momentum_buffer, o, sc);  // before the flag: a refused call allocates nothing
    const Flag flag(device, s, sc.skip_nonfinite && p.numel > 0);
    const StepResult r = sgd_step(d, s, p, g, momentum_buffer, o, sc, state, flag.get());
    *step = state.step;
    return r.applied ? 1 : 0;
  });
}

int stowage_synchronize(int device, void* stream) {
  return guarded(-1, [&] {
    stowage::device(device).synchronize(stream_of(device, stream));
    return 0;
  });
}

}  // extern "C"
