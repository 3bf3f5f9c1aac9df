// Optimizer steps on a ParameterBucket: argument checks, then host kernels on the emulated
// device's stream thread or CUDA kernels on the stream.
#include "stowage/bucket_optimizers.hpp"

#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "precision/device_kernels.hpp"
#include "precision/validate.hpp"
#include "stowage/device_optimizers.hpp"
#include "stowage/error.hpp"
#include "stowage/memory_resource.hpp"

namespace stowage {
namespace {

ElementRange resolve(const ParameterBucket& w, ElementRange r, const char* fn) {
  if (r.end == std::numeric_limits<std::size_t>::max()) r.end = w.numel();
  if (r.begin > r.end || r.end > w.numel() || r.begin % 8 != 0) {
    throw InvalidArgument(
        fmt::format("{}: range [{}, {}) is not inside the bucket's {} elements starting at a "
                    "multiple of 8",
                    fn, r.begin, r.end, w.numel()));
  }
  return r;
}

void check_tensor(const ParameterBucket& w, const TensorView& t, const char* fn, const char* what, bool grad,
                  ElementRange r) {
  if (!t.defined()) throw InvalidArgument(fmt::format("{}: {} is undefined", fn, what));
  if (grad ? (t.dtype() != DType::f32 && t.dtype() != DType::bf16) : t.dtype() != DType::f32) {
    throw InvalidArgument(
        fmt::format("{}: {} must be {} (got {})", fn, what, grad ? "f32 or bf16" : "f32", to_string(t.dtype())));
  }
  const auto n = static_cast<std::size_t>(t.numel());
  if (n != w.numel() && (grad || n != r.end - r.begin)) {
    throw InvalidArgument(fmt::format("{}: {} has {} elements; the bucket has {}{}", fn, what, n, w.numel(),
                                      grad ? "" : fmt::format(" and the range {}", r.end - r.begin)));
  }
  if (!t.is_contiguous()) throw InvalidArgument(fmt::format("{}: {} is not contiguous", fn, what));
  const std::size_t align = t.dtype() == DType::bf16 ? 2 : 4;
  if (reinterpret_cast<std::uintptr_t>(t.data()) % align != 0) {
    throw InvalidArgument(fmt::format("{}: {} at {} is not {}-byte aligned", fn, what, t.data(), align));
  }
  if (&t.storage().device() != &w.device()) {
    throw InvalidArgument(fmt::format("{}: {} is on another device than the weights", fn, what));
  }
}

// A state tensor indexed like the bucket: shard-local state is shifted back by begin.
float* indexed(const TensorView& t, const ParameterBucket& w, ElementRange r) {
  float* p = t.data_as<float>();
  return static_cast<std::size_t>(t.numel()) == w.numel() ? p : p - r.begin;
}

// The finite check over the range on the bucket's stream, into a flag allocated from the bucket's
// resource.
bool nonfinite_on_device(ParameterBucket& w, const void* grad, bool bf16, ElementRange r) {
  MemoryResource& alloc = *w.storage().resource();
  void* flag = alloc.allocate(sizeof(int), w.stream());
  const DeviceGrad g{static_cast<const char*>(grad) + r.begin * (bf16 ? 2 : 4), bf16 ? DType::bf16 : DType::f32};
  try {
    const bool found = any_nonfinite(w.device(), w.stream(), g, r.end - r.begin, static_cast<int*>(flag));
    alloc.deallocate(flag, sizeof(int));
    return found;
  } catch (...) {
    try {  // the stream may still write the flag; a failure here must not hide the first one
      w.device().synchronize(w.stream());
    } catch (...) {
    }
    alloc.deallocate(flag, sizeof(int));
    throw;
  }
}

}  // namespace

StepResult adam_step(ParameterBucket& w, const TensorView& grad, const TensorView& m, const TensorView& v,
                     const AdamOptions& options, const GradScaling& scaling, OptimizerState& state,
                     ElementRange range) {
  const char* fn = "adam_step(bucket)";
  const ElementRange r = resolve(w, range, fn);
  check_tensor(w, grad, fn, "grad", true, r);
  check_tensor(w, m, fn, "m", false, r);
  check_tensor(w, v, fn, "v", false, r);
  if (m.data() == v.data()) throw InvalidArgument(fmt::format("{}: m and v are the same memory", fn));
  detail::check_scaling(scaling, fn);
  const detail::AdamArgs args{w.planes(),       grad.data(),      grad.dtype() == DType::bf16,
                              indexed(m, w, r), indexed(v, w, r), adam_scalars(options, state.step + 1, scaling)};
  StepResult result;
  if (scaling.skip_nonfinite && nonfinite_on_device(w, args.grad, args.grad_bf16, r)) {
    result.found_nonfinite = true;
    result.step = state.step;
    return result;
  }
  Device& dev = w.device();
  detail::device_kernels(dev).adam(dev, w.stream(), args, r.begin, r.end);
  result.applied = true;
  result.step = ++state.step;
  return result;
}

StepResult sgd_step(ParameterBucket& w, const TensorView& grad, const TensorView& momentum, const SgdOptions& options,
                    const GradScaling& scaling, OptimizerState& state, ElementRange range) {
  const char* fn = "sgd_step(bucket)";
  const ElementRange r = resolve(w, range, fn);
  check_tensor(w, grad, fn, "grad", true, r);
  if (options.momentum != 0.0f) check_tensor(w, momentum, fn, "momentum", false, r);
  detail::check_scaling(scaling, fn);
  const detail::SgdArgs args{w.planes(), grad.data(), grad.dtype() == DType::bf16,
                             options.momentum != 0.0f ? indexed(momentum, w, r) : nullptr,
                             sgd_scalars(options, state.step + 1, scaling)};
  StepResult result;
  if (scaling.skip_nonfinite && nonfinite_on_device(w, args.grad, args.grad_bf16, r)) {
    result.found_nonfinite = true;
    result.step = state.step;
    return result;
  }
  Device& dev = w.device();
  detail::device_kernels(dev).sgd(dev, w.stream(), args, r.begin, r.end);
  result.applied = true;
  result.step = ++state.step;
  return result;
}

}  // namespace stowage
