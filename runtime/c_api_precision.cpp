// The C ABI of BF16/FP32 shared storage: split, merge, the finite check and the fused optimizer
// steps on host memory, and the steps queued on a device's stream, for frameworks that own the
// planes (stowage.torch's optimizers).
#include <fmt/format.h>

#include "common/log.hpp"
#include "runtime/c_api_devices.hpp"
#include "runtime/c_api_guard.hpp"
#include "stowage/device_optimizers.hpp"
#include "stowage/error.hpp"
#include "stowage/optimizers.hpp"
#include "stowage/precision.hpp"
#include "stowage/runtime.hpp"
#include "stowage/stowage.h"

namespace stowage {
namespace {

using capi::guarded;

SplitPlanes planes_of(const stowage_split_planes* p, const char* what) {
  if (p == nullptr) throw InvalidArgument(fmt::format("{}: null planes", what));
  if (p->rounding != STOWAGE_ROUND_HALF_UP && p->rounding != STOWAGE_ROUND_NEAREST_EVEN)
    throw InvalidArgument(
        fmt::format("{}: rounding {} is neither STOWAGE_ROUND_HALF_UP (0) nor "
                    "STOWAGE_ROUND_NEAREST_EVEN (1)",
                    what, p->rounding));
  // Null or misaligned planes are refused by the kernels' own checks, before anything is written.
  const Rounding r = p->rounding == STOWAGE_ROUND_HALF_UP ? Rounding::half_up : Rounding::nearest_even;
  return SplitPlanes{p->bf16, p->residual, r == Rounding::nearest_even ? p->ties : nullptr, p->numel, r};
}

HostGrad grad_of(const void* grad, int bits, const char* what) {
  if (bits != 32 && bits != 16)
    throw InvalidArgument(fmt::format("{}: grad_bits {} is neither 32 (fp32) nor 16 (bf16)", what, bits));
  return HostGrad{grad, bits == 32 ? DType::f32 : DType::bf16};
}

// NULL: no loss scale, no clipping, non-finite gradients skip the step. The values are checked
// by the steps themselves.
GradScaling scaling_of(const stowage_grad_scaling* s) {
  if (s == nullptr) return GradScaling{};
  return GradScaling{s->loss_scale, s->clip_coef, s->skip_nonfinite != 0};
}

AdamOptions adam_options_of(const stowage_adam_options* o, const char* what) {
  if (o == nullptr) throw InvalidArgument(fmt::format("{}: null options", what));
  return AdamOptions{o->lr, o->beta1, o->beta2, o->eps, o->weight_decay, o->decoupled_weight_decay != 0};
}

SgdOptions sgd_options_of(const stowage_sgd_options* o, const char* what) {
  if (o == nullptr) throw InvalidArgument(fmt::format("{}: null options", what));
  return SgdOptions{o->lr, o->momentum, o->dampening, o->weight_decay, o->nesterov != 0};
}

// The finite check's flag in the device's memory, from the C ABI's allocator of that device, only
// when the step checks (a framework that checks for itself never makes that allocator); given
// back when the step returns (the check has been waited for).
class Flag {
 public:
  Flag(int device, Stream stream, bool needed) {
    if (!needed) return;
    from_ = &capi::allocator_of(device);
    ptr_ = static_cast<int*>(from_->allocate(sizeof(int), stream));
  }
  ~Flag() {
    if (ptr_ == nullptr) return;
    try {
      from_->deallocate(ptr_, sizeof(int));
    } catch (const std::exception& e) {  // a destructor may not throw; a failed step's error is the one to report
      log().warn("the finite check's flag was not given back: {}", e.what());
    }
  }
  Flag(const Flag&) = delete;
  Flag& operator=(const Flag&) = delete;
  int* get() const { return ptr_; }

 private:
  MemoryResource* from_ = nullptr;
  int* ptr_ = nullptr;
};

DeviceGrad device_grad(const HostGrad& g) { return DeviceGrad{g.data, g.dtype}; }

OptimizerState state_of(const int64_t* step, const char* what) {
  if (step == nullptr || *step < 0) throw InvalidArgument(fmt::format("{}: step must point to a count >= 0", what));
  return OptimizerState{*step};
}

}  // namespace
}  // namespace stowage

using namespace stowage;

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
    OptimizerState state = state_of(step, what);
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
    OptimizerState state = state_of(step, what);
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
    OptimizerState state = state_of(step, what);
    Device& d = stowage::device(device);  // InvalidArgument for an ordinal that names no device
    const Stream s = stream_from_native(stream);
    d.check_stream(s);                // a stream never created or destroyed is refused before anything is queued
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
    OptimizerState state = state_of(step, what);
    Device& d = stowage::device(device);  // InvalidArgument for an ordinal that names no device
    const Stream s = stream_from_native(stream);
    d.check_stream(s);  // a stream never created or destroyed is refused before anything is queued
    check_sgd_step(p, g, momentum_buffer, o, sc);  // before the flag: a refused call allocates nothing
    const Flag flag(device, s, sc.skip_nonfinite && p.numel > 0);
    const StepResult r = sgd_step(d, s, p, g, momentum_buffer, o, sc, state, flag.get());
    *step = state.step;
    return r.applied ? 1 : 0;
  });
}

int stowage_synchronize(int device, void* stream) {
  return guarded(-1, [&] {
    Device& d = stowage::device(device);  // InvalidArgument for an ordinal that names no device
    const Stream s = stream_from_native(stream);
    d.check_stream(s);
    d.synchronize(s);
    return 0;
  });
}

}  // extern "C"
