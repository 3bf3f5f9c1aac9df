// The C ABI's precision arguments as stowage's types (c_api_precision_args.hpp).
#include "runtime/c_api_precision_args.hpp"

#include <fmt/format.h>

#include <limits>

#include "common/log.hpp"
#include "runtime/c_api_devices.hpp"
#include "stowage/error.hpp"
#include "stowage/runtime.hpp"

namespace stowage::capi {

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

GradScaling scaling_of(const stowage_grad_scaling* s) {
  if (s == nullptr) return GradScaling{};
  return GradScaling{s->loss_scale, s->clip_coef, s->skip_nonfinite != 0};
}

// The hyper-parameters are checked here, before any tensor is looked at: a step that a
// non-finite gradient skips must refuse them all the same (adam_scalars/sgd_scalars say why).
template <class Options, class Scalars>
Options checked_options(Options options, Scalars (*scalars)(const Options&, std::int64_t, const GradScaling&),
                        const char* what) {
  try {
    (void)scalars(options, 1, GradScaling{});
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("{}: {}", what, e.what()));
  }
  return options;
}

AdamOptions adam_options_of(const stowage_adam_options* o, const char* what) {
  if (o == nullptr) throw InvalidArgument(fmt::format("{}: null options", what));
  return checked_options(
      AdamOptions{o->lr, o->beta1, o->beta2, o->eps, o->weight_decay, o->decoupled_weight_decay != 0}, &adam_scalars,
      what);
}

SgdOptions sgd_options_of(const stowage_sgd_options* o, const char* what) {
  if (o == nullptr) throw InvalidArgument(fmt::format("{}: null options", what));
  return checked_options(SgdOptions{o->lr, o->momentum, o->dampening, o->weight_decay, o->nesterov != 0}, &sgd_scalars,
                         what);
}

OptimizerState state_of(std::int64_t step, const char* what) {
  // The next step's number must fit: the bias corrections take step + 1.
  if (step < 0 || step == std::numeric_limits<std::int64_t>::max())
    throw InvalidArgument(fmt::format("{}: a step count must be >= 0 and below 2^63 - 1 (got {})", what, step));
  return OptimizerState{step};
}

Stream stream_of(int device, void* stream) {
  Device& d = stowage::device(device);
  const Stream s = stream_from_native(stream);
  d.check_stream(s);
  return s;
}

Flag::Flag(int device, Stream stream, bool needed) {
  if (!needed) return;
  from_ = &allocator_of(device);
  ptr_ = static_cast<int*>(from_->allocate(sizeof(int), stream));
}

Flag::~Flag() {
  if (ptr_ == nullptr) return;
  try {
    from_->deallocate(ptr_, sizeof(int));
  } catch (const std::exception& e) {  // a destructor may not throw; a failed step's error is the one to report
    log().warn("the finite check's flag was not given back: {}", e.what());
  }
}

}  // namespace stowage::capi
