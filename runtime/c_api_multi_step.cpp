// The C ABI's multi-tensor optimizer steps and finite check: one call for a parameter group (or a
// model's gradients) instead of one per tensor, which is what a framework's step pays for in
// calls, and on a GPU in launches and waits. Each tensor's numbers are those of the one-tensor
// step; the skip decision is one for all.
#include <fmt/format.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/c_api_guard.hpp"
#include "runtime/c_api_precision_args.hpp"
#include "stowage/error.hpp"
#include "stowage/runtime.hpp"

namespace stowage {
namespace {

using capi::guarded;

// One tensor's arguments, checked.
struct Checked {
  SplitPlanes weights;
  HostGrad grad;
  float* state0;
  float* state1;
  OptimizerState state;
};

// Runs f(i) for each tensor; a refusal names the entry point and the tensor.
template <class F>
void each_tensor(std::size_t n, const stowage_step_tensor* tensors, const char* what, F&& f) {
  if (n > 0 && tensors == nullptr) throw InvalidArgument(fmt::format("{}: null tensors for n = {}", what, n));
  if (n > (std::size_t{1} << 40))
    throw InvalidArgument(fmt::format("{}: n = {} tensors is not a plausible count", what, n));
  for (std::size_t i = 0; i < n; ++i) {
    try {
      f(i);
    } catch (const InvalidArgument& e) {
      const std::string_view msg = e.what();
      throw InvalidArgument(
          fmt::format("{}{} (tensor {} of {})", msg.starts_with(what) ? "" : std::string(what) + ": ", msg, i, n));
    }
  }
}

// The tensors, every one checked before anything is written or queued: `check` runs the step's
// own argument checks on each.
template <class Check>
std::vector<Checked> checked(std::size_t n, const stowage_step_tensor* tensors, const char* what, Check&& check) {
  std::vector<Checked> out;
  each_tensor(n, tensors, what, [&](std::size_t i) {
    const stowage_step_tensor& t = tensors[i];
    Checked c{capi::planes_of(&t.weights, what), capi::grad_of(t.grad, t.grad_bits, what), t.state0, t.state1,
              capi::state_of(t.step, what)};
    check(c);
    out.push_back(c);
  });
  return out;
}

// What the finite check reads: each gradient and its length, nothing else.
std::vector<DeviceGradSpan> grads_of(std::size_t n, const stowage_step_tensor* tensors, const char* what) {
  std::vector<DeviceGradSpan> out;
  each_tensor(n, tensors, what, [&](std::size_t i) {
    const stowage_step_tensor& t = tensors[i];
    out.push_back({capi::device_grad(capi::grad_of(t.grad, t.grad_bits, what)), t.weights.numel});
  });
  return out;
}

std::vector<DeviceGradSpan> grad_spans(const std::vector<Checked>& ts) {
  std::vector<DeviceGradSpan> out;
  out.reserve(ts.size());
  for (const Checked& t : ts) out.push_back({capi::device_grad(t.grad), t.weights.numel});
  return out;
}

bool any_elements(const std::vector<DeviceGradSpan>& grads) {
  for (const DeviceGradSpan& g : grads)
    if (g.n > 0) return true;
  return false;
}

bool any_nonfinite_host(const std::vector<DeviceGradSpan>& grads) {
  for (const DeviceGradSpan& g : grads)
    if (any_nonfinite(HostGrad{g.grad.data, g.grad.dtype}, 0, g.n)) return true;
  return false;
}

// The scaling each tensor's step gets once the decision was made for all.
GradScaling unchecked(GradScaling s) {
  s.skip_nonfinite = false;
  return s;
}

// Host steps: the decision, then each tensor's step; the counts written back.
template <class Step>
int host_steps(std::size_t n, stowage_step_tensor* tensors, std::vector<Checked>& ts, const GradScaling& scaling,
               Step&& step) {
  if (scaling.skip_nonfinite && any_nonfinite_host(grad_spans(ts))) return 0;
  for (std::size_t i = 0; i < n; ++i) tensors[i].step = step(ts[i], unchecked(scaling)).step;
  return 1;
}

// Device steps: the decision on the stream (one flag, one wait), then each tensor's step queued.
template <class Step>
int device_steps(int device, Stream s, std::size_t n, stowage_step_tensor* tensors, std::vector<Checked>& ts,
                 const GradScaling& scaling, Step&& step) {
  Device& d = stowage::device(device);
  if (const std::vector<DeviceGradSpan> grads = grad_spans(ts); scaling.skip_nonfinite && any_elements(grads)) {
    const capi::Flag flag(device, s, true);
    if (any_nonfinite(d, s, grads, flag.get())) return 0;
  }
  for (std::size_t i = 0; i < n; ++i) tensors[i].step = step(d, ts[i], unchecked(scaling)).step;
  return 1;
}

}  // namespace
}  // namespace stowage

using namespace stowage;

extern "C" {

int stowage_any_nonfinite_multi(size_t n, const stowage_step_tensor* tensors) {
  return guarded(-1, [&] { return any_nonfinite_host(grads_of(n, tensors, "stowage_any_nonfinite_multi")) ? 1 : 0; });
}

int stowage_any_nonfinite_multi_async(int device, void* stream, size_t n, const stowage_step_tensor* tensors,
                                      int* flag) {
  return guarded(-1, [&] {
    const Stream s = capi::stream_of(device, stream);
    const std::vector<DeviceGradSpan> grads = grads_of(n, tensors, "stowage_any_nonfinite_multi_async");
    const capi::Flag own(device, s, flag == nullptr && any_elements(grads));
    return any_nonfinite(stowage::device(device), s, grads, flag != nullptr ? flag : own.get()) ? 1 : 0;
  });
}

int stowage_adam_step_multi(size_t n, stowage_step_tensor* tensors, const stowage_adam_options* options,
                            const stowage_grad_scaling* scaling) {
  return guarded(-1, [&] {
    const char* what = "stowage_adam_step_multi";
    const AdamOptions o = capi::adam_options_of(options, what);
    const GradScaling sc = capi::scaling_of(scaling);
    std::vector<Checked> ts = checked(n, tensors, what, [&](const Checked& c) {
      check_adam_step(c.weights, capi::device_grad(c.grad), c.state0, c.state1, sc);
    });
    return host_steps(n, tensors, ts, sc, [&](Checked& c, const GradScaling& each) {
      return adam_step(c.weights, c.grad, c.state0, c.state1, o, each, c.state);
    });
  });
}

int stowage_sgd_step_multi(size_t n, stowage_step_tensor* tensors, const stowage_sgd_options* options,
                           const stowage_grad_scaling* scaling) {
  return guarded(-1, [&] {
    const char* what = "stowage_sgd_step_multi";
    const SgdOptions o = capi::sgd_options_of(options, what);
    const GradScaling sc = capi::scaling_of(scaling);
    std::vector<Checked> ts = checked(n, tensors, what, [&](const Checked& c) {
      check_sgd_step(c.weights, capi::device_grad(c.grad), c.state0, o, sc);
    });
    return host_steps(n, tensors, ts, sc, [&](Checked& c, const GradScaling& each) {
      return sgd_step(c.weights, c.grad, c.state0, o, each, c.state);
    });
  });
}

int stowage_adam_step_multi_async(int device, void* stream, size_t n, stowage_step_tensor* tensors,
                                  const stowage_adam_options* options, const stowage_grad_scaling* scaling) {
  return guarded(-1, [&] {
    const char* what = "stowage_adam_step_multi_async";
    const AdamOptions o = capi::adam_options_of(options, what);
    const GradScaling sc = capi::scaling_of(scaling);
    const Stream s = capi::stream_of(device, stream);
    std::vector<Checked> ts = checked(n, tensors, what, [&](const Checked& c) {
      check_adam_step(c.weights, capi::device_grad(c.grad), c.state0, c.state1, sc);
    });
    return device_steps(device, s, n, tensors, ts, sc, [&](Device& d, Checked& c, const GradScaling& each) {
      return adam_step(d, s, c.weights, capi::device_grad(c.grad), c.state0, c.state1, o, each, c.state, nullptr);
    });
  });
}

int stowage_sgd_step_multi_async(int device, void* stream, size_t n, stowage_step_tensor* tensors,
                                 const stowage_sgd_options* options, const stowage_grad_scaling* scaling) {
  return guarded(-1, [&] {
    const char* what = "stowage_sgd_step_multi_async";
    const SgdOptions o = capi::sgd_options_of(options, what);
    const GradScaling sc = capi::scaling_of(scaling);
    const Stream s = capi::stream_of(device, stream);
    std::vector<Checked> ts = checked(n, tensors, what, [&](const Checked& c) {
      check_sgd_step(c.weights, capi::device_grad(c.grad), c.state0, o, sc);
    });
    return device_steps(device, s, n, tensors, ts, sc, [&](Device& d, Checked& c, const GradScaling& each) {
      return sgd_step(d, s, c.weights, capi::device_grad(c.grad), c.state0, o, each, c.state, nullptr);
    });
  });
}

}  // extern "C"
