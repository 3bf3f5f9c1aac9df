#pragma once
// Fused optimizer steps on split storage that lives in a device's memory, given as raw pointers
// (a framework's tensors), queued on a stream of that device with the kernels of its backend:
// host kernels on an emulated device's stream, CUDA kernels on a CUDA stream. The numbers are
// those of optimizers.hpp (docs/precision.md).
#include <cstddef>
#include <span>

#include "stowage/device.hpp"
#include "stowage/dtype.hpp"
#include "stowage/optimizers.hpp"
#include "stowage/precision.hpp"

namespace stowage {

// A gradient in device memory, indexed like the weights (f32 or bf16).
struct DeviceGrad {
  const void* data = nullptr;
  DType dtype = DType::f32;
};

// True when any of the n gradients is Inf or NaN: the check runs on `stream` into `flag` (one int
// of the device's memory) and the call waits for it.
bool any_nonfinite(Device& device, Stream stream, DeviceGrad grad, std::size_t n, int* flag);

// A gradient and how many elements it has.
struct DeviceGradSpan {
  DeviceGrad grad;
  std::size_t n = 0;
};
// The same over many gradients (a model's, for one decision on all of them): one kernel each into
// the one flag, one wait. Every gradient is checked (InvalidArgument) before anything is queued.
bool any_nonfinite(Device& device, Stream stream, std::span<const DeviceGradSpan> grads, int* flag);

// The argument checks a step makes before it queues anything (InvalidArgument), for callers that
// run them before allocating what the step needs.
void check_adam_step(const SplitPlanes& weights, DeviceGrad grad, const float* m, const float* v,
                     const GradScaling& scaling);
void check_sgd_step(const SplitPlanes& weights, DeviceGrad grad, const float* momentum_buffer,
                    const SgdOptions& options, const GradScaling& scaling);

// One step, queued on `stream`. With scaling.skip_nonfinite the finite check runs first (into
// `flag`, waited for) and a non-finite gradient skips the step; otherwise `flag` may be null and
// the call returns once the update is queued. InvalidArgument (nothing queued) for null or
// misaligned pointers and unsupported dtypes; momentum_buffer may be null without momentum.
StepResult adam_step(Device& device, Stream stream, const SplitPlanes& weights, DeviceGrad grad, float* m, float* v,
                     const AdamOptions& options, const GradScaling& scaling, OptimizerState& state, int* flag);
StepResult sgd_step(Device& device, Stream stream, const SplitPlanes& weights, DeviceGrad grad, float* momentum_buffer,
                    const SgdOptions& options, const GradScaling& scaling, OptimizerState& state, int* flag);

// Adam on elements [begin, end) of a plain fp32 master array in device memory (params, grad, m and
// v indexed alike), queued on `stream`: optimizers.hpp's adam_step_range_fp32 where the device's
// kernels run. No finite check, no state change.
void adam_step_range_fp32(Device& device, Stream stream, float* params, DeviceGrad grad, float* m, float* v,
                          std::size_t begin, std::size_t end, const AdamScalars& scalars);

}  // namespace stowage
