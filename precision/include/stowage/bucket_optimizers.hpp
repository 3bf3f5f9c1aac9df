#pragma once
// Fused optimizer steps on a ParameterBucket, run where its memory lives: on the emulated
// device as host kernels on the stream's thread, on CUDA as kernels on the stream.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>

#include "stowage/optimizers.hpp"
#include "stowage/parameter_bucket.hpp"
#include "stowage/tensor.hpp"

namespace stowage {

// Elements [begin, end) of the bucket (begin a multiple of 8); the default is all of it.
struct ElementRange {
  std::size_t begin = 0;
  std::size_t end = std::numeric_limits<std::size_t>::max();
};

// grad: contiguous f32 or bf16 with the bucket's numel(), on the bucket's device. m, v (Adam)
// and momentum (SGD): contiguous f32 with either the bucket's numel() or the range's length
// (a shard's own state). Finite check first when scaling.skip_nonfinite (that needs the stream
// to finish it, so the call waits for the check); returns after queueing the update.
// InvalidArgument, with nothing written, for mismatched sizes, dtypes or devices.
StepResult adam_step(ParameterBucket& weights, const TensorView& grad, const TensorView& m, const TensorView& v,
                     const AdamOptions& options, const GradScaling& scaling, OptimizerState& state,
                     ElementRange range = {});
StepResult sgd_step(ParameterBucket& weights, const TensorView& grad, const TensorView& momentum,
                    const SgdOptions& options, const GradScaling& scaling, OptimizerState& state,
                    ElementRange range = {});

}  // namespace stowage
