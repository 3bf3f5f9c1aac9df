// Tensor-level activation dispatch: checks the views, then launches the backend's kernel on the
// stream (the emulated device runs the CPU kernel on the stream's worker thread).
#include "stowage/activations.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "recompute/device_kernels.hpp"
#include "stowage/error.hpp"
#include "stowage/tensor.hpp"

namespace stowage {

const char* to_string(Activation a) {
  switch (a) {
    case Activation::relu: return "relu";
    case Activation::silu: return "silu";
    case Activation::gelu_erf: return "gelu_erf";
    case Activation::gelu_tanh: return "gelu_tanh";
  }
  return "unknown";
}

namespace {

void require(bool ok, const char* fn, const std::string& why) {
  if (!ok) throw InvalidArgument(fmt::format("{}: {}", fn, why));
}

// Every view defined, resident, on one device, of one dtype; returns that device.
Device& common_device(const char* fn, std::initializer_list<const TensorView*> views) {
  const TensorView& first = **views.begin();
  for (const TensorView* v : views) {
    require(v->defined(), fn, "undefined tensor");
    require(v->storage().resident(), fn,
            fmt::format("a tensor's storage is {}, not resident", to_string(v->storage().state())));
    require(&v->storage().device() == &first.storage().device(), fn, "tensors on different devices");
    require(v->dtype() == first.dtype(), fn,
            fmt::format("dtypes {} and {} differ", to_string(first.dtype()), to_string(v->dtype())));
  }
  if (first.dtype() != DType::f32 && first.dtype() != DType::bf16)
    throw Unsupported(fmt::format("{}: dtype {} (f32 and bf16 are supported)", fn, to_string(first.dtype())));
  return first.storage().device();
}

void same_shape(const char* fn, const TensorView& a, const TensorView& b) {
  require(a.shape() == b.shape(), fn,
          fmt::format("shapes [{}] and [{}] differ", fmt::join(a.shape(), ", "), fmt::join(b.shape(), ", ")));
}

void contiguous(const char* fn, std::initializer_list<const TensorView*> views) {
  for (const TensorView* v : views)
    require(v->is_contiguous(), fn,
            fmt::format("tensor with strides [{}] is not contiguous", fmt::join(v->strides(), ", ")));
}

std::size_t last_dim(const TensorView& t) { return t.dim() == 0 ? 1 : static_cast<std::size_t>(t.shape().back()); }

// Rows of a view whose last dimension is contiguous and whose leading dimensions step evenly:
// returns the row stride in elements.
std::size_t row_stride(const char* fn, const TensorView& t) {
  const int d = t.dim();
  if (d <= 1 || t.numel() == 0) return last_dim(t);
  const auto& st = t.strides();
  const auto& sh = t.shape();
  bool ok = st[d - 1] == 1 || sh[d - 1] == 1;
  for (int i = 0; i + 2 < d && ok; ++i) ok = sh[i] == 1 || st[i] == st[i + 1] * sh[i + 1];
  ok = ok && st[d - 2] >= sh[d - 1];
  require(ok, fn,
          fmt::format("tensor with shape [{}] strides [{}] is not a set of evenly strided rows", fmt::join(sh, ", "),
                      fmt::join(st, ", ")));
  return static_cast<std::size_t>(st[d - 2]);
}

}  // namespace

void activation_forward(Activation a, const TensorView& x, const TensorView& y, Stream stream) {
  const char* fn = "activation_forward";
  Device& dev = common_device(fn, {&x, &y});
  same_shape(fn, x, y);
  contiguous(fn, {&x, &y});
  const DType t = x.dtype();
  const auto n = static_cast<std::size_t>(x.numel());
  const void* xp = x.data();
  void* yp = y.data();
  cpu::activation_forward(a, t, 0, xp, yp);  // argument checks now, not on the worker thread
  detail::activation_kernels(dev).forward(dev, stream, a, t, n, xp, yp);
}

void activation_backward(Activation a, const TensorView& x, const TensorView& dy, const TensorView& dx, Stream stream) {
  const char* fn = "activation_backward";
  Device& dev = common_device(fn, {&x, &dy, &dx});
  same_shape(fn, x, dy);
  same_shape(fn, x, dx);
  contiguous(fn, {&x, &dy, &dx});
  const DType t = x.dtype();
  const auto n = static_cast<std::size_t>(x.numel());
  const void *xp = x.data(), *dyp = dy.data();
  void* dxp = dx.data();
  cpu::activation_backward(a, t, 0, xp, dyp, dxp);
  detail::activation_kernels(dev).backward(dev, stream, a, t, n, xp, dyp, dxp);
}

void bias_activation_forward(Activation a, const TensorView& x, const TensorView& bias, const TensorView& y,
                             Stream stream) {
  const char* fn = "bias_activation_forward";
  Device& dev = common_device(fn, {&x, &bias, &y});
  same_shape(fn, x, y);
  contiguous(fn, {&x, &bias, &y});
  const std::size_t cols = last_dim(x);
  require(bias.dim() == 1 && static_cast<std::size_t>(bias.numel()) == cols, fn,
          fmt::format("bias of shape [{}] for {} columns", fmt::join(bias.shape(), ", "), cols));
  const DType t = x.dtype();
  const std::size_t rows = cols == 0 ? 0 : static_cast<std::size_t>(x.numel()) / cols;
  const void *xp = x.data(), *bp = bias.data();
  void* yp = y.data();
  cpu::bias_activation_forward(a, t, 0, 0, xp, bp, yp);
  detail::activation_kernels(dev).bias_forward(dev, stream, a, t, rows, cols, xp, bp, yp);
}

void bias_activation_backward(Activation a, const TensorView& x, const TensorView& bias, const TensorView& dy,
                              const TensorView& dx, const TensorView& dbias, Stream stream) {
  const char* fn = "bias_activation_backward";
  Device& dev =
      dbias.defined() ? common_device(fn, {&x, &bias, &dy, &dx, &dbias}) : common_device(fn, {&x, &bias, &dy, &dx});
  same_shape(fn, x, dy);
  same_shape(fn, x, dx);
  contiguous(fn, {&x, &bias, &dy, &dx});
  const std::size_t cols = last_dim(x);
  require(bias.dim() == 1 && static_cast<std::size_t>(bias.numel()) == cols, fn,
          fmt::format("bias of shape [{}] for {} columns", fmt::join(bias.shape(), ", "), cols));
  if (dbias.defined()) {
    same_shape(fn, bias, dbias);
    contiguous(fn, {&dbias});
  }
  const DType t = x.dtype();
  const std::size_t rows = cols == 0 ? 0 : static_cast<std::size_t>(x.numel()) / cols;
  const void *xp = x.data(), *bp = bias.data(), *dyp = dy.data();
  void* dxp = dx.data();
  void* dbp = dbias.defined() ? dbias.data() : nullptr;
  cpu::bias_activation_backward(a, t, 0, 0, xp, bp, dyp, dxp, dbp);
  detail::activation_kernels(dev).bias_backward(dev, stream, a, t, rows, cols, xp, bp, dyp, dxp, dbp);
}

void gated_activation_forward(Activation a, const TensorView& gate, const TensorView& up, const TensorView& y,
                              Stream stream) {
  const char* fn = "gated_activation_forward";
  Device& dev = common_device(fn, {&gate, &up, &y});
  same_shape(fn, gate, up);
  same_shape(fn, gate, y);
  contiguous(fn, {&y});
  const std::size_t gld = row_stride(fn, gate), uld = row_stride(fn, up);
  const std::size_t cols = last_dim(gate);
  const DType t = gate.dtype();
  const std::size_t rows = cols == 0 ? 0 : static_cast<std::size_t>(gate.numel()) / cols;
  const void *gp = gate.data(), *up_ = up.data();
  void* yp = y.data();
  cpu::gated_activation_forward(a, t, 0, 0, gp, gld, up_, uld, yp);
  detail::activation_kernels(dev).gated_forward(dev, stream, a, t, rows, cols, gp, gld, up_, uld, yp);
}

void gated_activation_backward(Activation a, const TensorView& gate, const TensorView& up, const TensorView& dy,
                               const TensorView& dgate, const TensorView& dup, Stream stream) {
  const char* fn = "gated_activation_backward";
  Device& dev = common_device(fn, {&gate, &up, &dy, &dgate, &dup});
  same_shape(fn, gate, up);
  same_shape(fn, gate, dy);
  same_shape(fn, gate, dgate);
  same_shape(fn, gate, dup);
  contiguous(fn, {&dy});
  require(dgate.strides() == gate.strides() && dup.strides() == up.strides(), fn,
          "dgate and dup must have the strides of gate and up");
  const std::size_t gld = row_stride(fn, gate), uld = row_stride(fn, up);
  const std::size_t cols = last_dim(gate);
  const DType t = gate.dtype();
  const std::size_t rows = cols == 0 ? 0 : static_cast<std::size_t>(gate.numel()) / cols;
  const void *gp = gate.data(), *up_ = up.data(), *dyp = dy.data();
  void *dgp = dgate.data(), *dup_ = dup.data();
  cpu::gated_activation_backward(a, t, 0, 0, gp, gld, up_, uld, dyp, dgp, dup_);
  detail::activation_kernels(dev).gated_backward(dev, stream, a, t, rows, cols, gp, gld, up_, uld, dyp, dgp, dup_);
}

#if !defined(STOWAGE_HAVE_CUDA)
// Without the CUDA backend the CUDA kernels exist only to say so.
namespace cuda {
namespace {
[[noreturn]] void no_cuda(const char* fn) {
  throw Unsupported(fmt::format("cuda::{}: stowage was built without CUDA", fn));
}
}  // namespace
void activation_forward(Activation, DType, std::size_t, const void*, void*, void*) { no_cuda("activation_forward"); }
void activation_backward(Activation, DType, std::size_t, const void*, const void*, void*, void*) {
  no_cuda("activation_backward");
}
void bias_activation_forward(Activation, DType, std::size_t, std::size_t, const void*, const void*, void*, void*) {
  no_cuda("bias_activation_forward");
}
void bias_activation_backward(Activation, DType, std::size_t, std::size_t, const void*, const void*, const void*, void*,
                              void*, void*) {
  no_cuda("bias_activation_backward");
}
void gated_activation_forward(Activation, DType, std::size_t, std::size_t, const void*, std::size_t, const void*,
                              std::size_t, void*, void*) {
  no_cuda("gated_activation_forward");
}
void gated_activation_backward(Activation, DType, std::size_t, std::size_t, const void*, std::size_t, const void*,
                               std::size_t, const void*, void*, void*, void*) {
  no_cuda("gated_activation_backward");
}
}  // namespace cuda
#endif

}  // namespace stowage
