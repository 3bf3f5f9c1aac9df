// Adam states placed by a device budget (docs/offload.md): each chunk, in order, stays on the
// device if it fits in what is left of the budget; the rest are mapped host memory, or pinned
// host memory streamed through three device windows (H2D of chunk k+1 on one copy stream while
// chunk k is updated, D2H of chunk k-1 on another).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "offload/state_home.hpp"
#include "stowage/device_handles.hpp"
#include "stowage/device_optimizers.hpp"
#include "stowage/offload.hpp"

namespace stowage {

using offload::StateHome;

const char* to_string(StatePlacement p) {
  switch (p) {
    case StatePlacement::device: return "device";
    case StatePlacement::mapped: return "mapped";
    case StatePlacement::streamed: return "streamed";
  }
  return "?";
}

struct OffloadedAdam::Impl {
  ResourceHandle allocator;
  HostPool& pool;
  Dependency pool_use;  // the pool must outlive the optimizer: host chunks are its buffers
  Device& dev;
  std::size_t numel;
  OffloadOptions options;
  std::vector<StateHome> chunks;
  // Streamed: [m | v] of chunk_elements each; three, so that the H2D of chunk k+1, the update
  // of chunk k and the D2H of chunk k-1 all proceed at once.
  static constexpr int kWindows = 3;
  TensorView windows[kWindows];
  OwnedStream h2d, d2h;
  OwnedEvent h2d_done[kWindows], compute_done[kWindows], slot_free[kWindows];
  OwnedEvent step_begin, step_end;  // timing events around the latest step
  std::int64_t steps = 0;
  // Set when a step failed after it had updated some chunks: weights and states then belong to
  // different steps, and every later step refuses with this message instead of going on.
  std::string broken;

  Impl(ResourceHandle a, HostPool& p, std::size_t n, OffloadOptions o)
      : allocator(std::move(a)), pool(p), dev(allocator->device()), numel(n), options(o) {}

  std::size_t chunk_len(std::size_t i) const {
    return std::min(options.chunk_elements, numel - i * options.chunk_elements);
  }
  std::size_t chunk_count() const { return (numel + options.chunk_elements - 1) / options.chunk_elements; }
  std::size_t window_bytes() const {
    return kWindows * offload::device_chunk_bytes(std::min(options.chunk_elements, numel));
  }

  // The placement of every chunk under `o` (the policy in docs/offload.md).
  std::vector<StatePlacement> plan(const OffloadOptions& o) const {
    const std::size_t count = (numel + o.chunk_elements - 1) / o.chunk_elements;
    std::vector<StatePlacement> where(count, StatePlacement::device);
    std::size_t total = 0;
    for (std::size_t i = 0; i < count; ++i)
      total += offload::device_chunk_bytes(std::min(o.chunk_elements, numel - i * o.chunk_elements));
    if (o.host_mode == StatePlacement::device || total <= o.device_budget_bytes) return where;
    std::size_t avail = o.device_budget_bytes;
    if (o.host_mode == StatePlacement::streamed) {
      const std::size_t window = kWindows * offload::device_chunk_bytes(std::min(o.chunk_elements, numel));
      if (window > avail)
        throw InvalidArgument(
            fmt::format("device budget {} B is below the streamed window's {} B; raise the budget "
                        "or lower chunk_elements",
                        o.device_budget_bytes, window));
      avail -= window;
    }
    std::size_t used = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const std::size_t b = offload::device_chunk_bytes(std::min(o.chunk_elements, numel - i * o.chunk_elements));
      if (used + b <= avail) {
        used += b;
      } else {
        where[i] = o.host_mode;
      }
    }
    return where;
  }

  bool any_streamed() const {
    return std::any_of(chunks.begin(), chunks.end(),
                       [](const StateHome& h) { return h.where == StatePlacement::streamed; });
  }

  // Windows exist exactly while some chunk is streamed.
  void ensure_windows() {
    if (!any_streamed()) {
      for (auto& w : windows) w = TensorView();
      return;
    }
    if (!windows[0].defined())
      for (auto& w : windows)
        w = TensorView::empty(allocator, DType::f32,
                              {2 * static_cast<std::int64_t>(std::min(options.chunk_elements, numel))});
  }

  void zero(StateHome& h, Stream s) {
    if (h.where == StatePlacement::streamed) {
      std::memset(h.mv.data(), 0, h.len * 8);
    } else {
      dev.fill_async(h.mv.data(), 0, h.len * 8, s);
    }
  }

  // Runs `update(m, v)` for chunk i on the compute stream, with m and v in device address space.
  template <class Update>
  void run_chunk(std::size_t i, std::size_t k_streamed, Stream compute, Update&& update) {
    StateHome& h = chunks[i];
    if (h.where != StatePlacement::streamed) {
      update(h.m(), h.v());
      return;
    }
    const int slot = static_cast<int>(k_streamed % kWindows);
    const std::size_t len = h.len;
    TensorView w = windows[slot].slice(0, 0, 2 * static_cast<std::int64_t>(len));
    TensorView wm = windows[slot].slice(0, 0, static_cast<std::int64_t>(len));
    TensorView wv = windows[slot].slice(0, static_cast<std::int64_t>(len), 2 * static_cast<std::int64_t>(len));
    dev.wait(h2d, slot_free[slot]);  // the window's previous chunk has gone back to the host
    dev.copy_async(w.data(), h.mv.data(), len * 8, CopyKind::host_to_device, h2d);
    dev.record(h2d_done[slot], h2d);
    dev.wait(compute, h2d_done[slot]);
    update(wm, wv);
    dev.record(compute_done[slot], compute);
    dev.wait(d2h, compute_done[slot]);
    dev.copy_async(h.mv.data(), w.data(), len * 8, CopyKind::device_to_host, d2h);
    dev.record(slot_free[slot], d2h);
  }

  // Brackets one step with timing events. The step ends on the compute stream after the last
  // D2H, so streamed steps count the write-back too.
  void begin_step(Stream compute) { dev.record(step_begin, compute); }
  void end_step(Stream compute) {
    if (any_streamed()) {
      for (Event e : slot_free) dev.wait(compute, e);
    }
    dev.record(step_end, compute);
    ++steps;
  }

  // One step: `update(i, m, v)` for every chunk, between the timing events. A device error
  // before the first update leaves everything as it was (the step can be retried); after it, the
  // step is partly applied, which is reported and remembered (see `broken`).
  template <class Update>
  void run_step(Stream compute, Update&& update) {
    if (!broken.empty()) throw DeviceError(broken);
    std::size_t updated = 0;
    try {
      begin_step(compute);
      std::size_t k = 0;
      for (std::size_t i = 0; i < chunks.size(); ++i) {
        run_chunk(i, chunks[i].where == StatePlacement::streamed ? k++ : 0, compute,
                  [&](const TensorView& m, const TensorView& v) {
                    update(i, m, v);
                    ++updated;
                  });
      }
      end_step(compute);
    } catch (const std::exception& e) {
      if (updated > 0)
        broken = fmt::format(
            "offloaded Adam: step {} failed after updating {} of {} chunks ({}); the weights and "
            "optimizer states no longer belong to one step: restore both from a checkpoint",
            steps + 1, updated, chunks.size(), e.what());
      try {
        dev.synchronize();  // copies already queued finish before anyone reuses their buffers
      } catch (...) {
      }
      if (updated > 0) throw DeviceError(broken);
      throw;
    }
  }

  // Gradient check before anything is written, when asked for: a kernel on the compute stream
  // into a flag, waited for. Every backend has the kernel, so there is one path for all.
  bool nonfinite(const TensorView& grad, Stream compute, const GradScaling& scaling) {
    if (!scaling.skip_nonfinite) return false;
    const TensorView flag = TensorView::empty(allocator, DType::i32, {1}, compute);
    return any_nonfinite(dev, compute, DeviceGrad{grad.data(), grad.dtype()}, numel, flag.data_as<int>());
  }

  void check_grad(const TensorView& grad) const {
    if (!grad.is_contiguous() || static_cast<std::size_t>(grad.numel()) != numel ||
        (grad.dtype() != DType::f32 && grad.dtype() != DType::bf16))
      throw InvalidArgument(
          fmt::format("offloaded Adam: gradient must be contiguous f32 or bf16 of {} elements", numel));
  }
};

OffloadedAdam::OffloadedAdam(ResourceHandle allocator, HostPool& pool, std::size_t numel, OffloadOptions options)
    : impl_(std::make_unique<Impl>(std::move(allocator), pool, numel, options)) {
  impl_->pool_use = pool.attach(fmt::format("OffloadedAdam {}", fmt::ptr(this)));
  if (numel == 0) throw InvalidArgument("offloaded Adam: numel must be positive");
  if (options.chunk_elements == 0 || options.chunk_elements % 64 != 0)
    throw InvalidArgument(
        fmt::format("offloaded Adam: chunk_elements {} must be a positive multiple of 64", options.chunk_elements));
  Impl& s = *impl_;
  const auto where = s.plan(options);
  s.h2d = OwnedStream(s.dev);
  s.d2h = OwnedStream(s.dev);
  for (int k = 0; k < Impl::kWindows; ++k) {
    s.h2d_done[k] = OwnedEvent(s.dev);
    s.compute_done[k] = OwnedEvent(s.dev);
    s.slot_free[k] = OwnedEvent(s.dev);
  }
  s.step_begin = OwnedEvent(s.dev, true);
  s.step_end = OwnedEvent(s.dev, true);
  try {
    for (std::size_t i = 0; i < where.size(); ++i) {
      s.chunks.push_back(offload::make_home(impl_->allocator.get(), pool, where[i], s.chunk_len(i), kDefaultStream));
      s.zero(s.chunks.back(), kDefaultStream);
    }
    s.ensure_windows();
    s.dev.synchronize(kDefaultStream);
  } catch (...) {
    s.chunks.clear();
    s.dev.synchronize();
    throw;
  }
}

OffloadedAdam::~OffloadedAdam() {
  Impl& s = *impl_;
  try {
    s.dev.synchronize();
  } catch (...) {
  }
  s.chunks.clear();
  for (auto& w : s.windows) w = TensorView();
}  // the streams and events go with impl_

void OffloadedAdam::replace(OffloadOptions options) {
  Impl& s = *impl_;
  if (options.chunk_elements != s.options.chunk_elements)
    throw InvalidArgument("offloaded Adam: replace keeps chunk_elements");
  const auto where = s.plan(options);
  s.dev.synchronize();
  s.options = options;
  // Windows first, so a chunk moved to streamed always has them even if a later move fails.
  if (std::find(where.begin(), where.end(), StatePlacement::streamed) != where.end() && !s.windows[0].defined())
    for (auto& w : s.windows)
      w = TensorView::empty(s.allocator, DType::f32,
                            {2 * static_cast<std::int64_t>(std::min(s.options.chunk_elements, s.numel))});
  try {
    for (std::size_t i = 0; i < where.size(); ++i) {
      if (where[i] == s.chunks[i].where) continue;
      StateHome next = offload::make_home(s.allocator.get(), s.pool, where[i], s.chunks[i].len, kDefaultStream);
      s.dev.copy_async(next.mv.data(), s.chunks[i].mv.data(), s.chunks[i].len * 8,
                       offload::copy_kind(s.chunks[i].where, where[i]), kDefaultStream);
      s.dev.synchronize(kDefaultStream);  // the old home goes only once its bytes have arrived
      s.chunks[i] = std::move(next);
    }
  } catch (...) {
    s.ensure_windows();
    throw;
  }
  s.ensure_windows();
}

StepResult OffloadedAdam::step(ParameterBucket& weights, const TensorView& grad, const AdamOptions& options,
                               const GradScaling& scaling, OptimizerState& state) {
  Impl& s = *impl_;
  if (weights.numel() != s.numel)
    throw InvalidArgument(fmt::format("offloaded Adam: bucket has {} elements, states {}", weights.numel(), s.numel));
  s.check_grad(grad);
  const Stream compute = weights.stream();
  if (s.nonfinite(grad, compute, scaling)) return {false, true, state.step};
  GradScaling checked = scaling;
  checked.skip_nonfinite = false;
  s.run_step(compute, [&](std::size_t i, const TensorView& m, const TensorView& v) {
    const std::size_t begin = i * s.options.chunk_elements;
    OptimizerState st = state;  // every chunk applies the same step number
    adam_step(weights, grad, m, v, options, checked, st, ElementRange{begin, begin + s.chunks[i].len});
  });
  ++state.step;
  return {true, false, state.step};
}

StepResult OffloadedAdam::step(const TensorView& fp32_weights, const TensorView& grad, const AdamOptions& options,
                               const GradScaling& scaling, OptimizerState& state) {
  Impl& s = *impl_;
  if (fp32_weights.dtype() != DType::f32 || !fp32_weights.is_contiguous() ||
      static_cast<std::size_t>(fp32_weights.numel()) != s.numel)
    throw InvalidArgument(fmt::format("offloaded Adam: weights must be contiguous f32 of {} elements", s.numel));
  s.check_grad(grad);
  const Stream compute = fp32_weights.storage().stream();
  if (s.nonfinite(grad, compute, scaling)) return {false, true, state.step};
  const AdamScalars sc = adam_scalars(options, state.step + 1, scaling);
  float* w = fp32_weights.data_as<float>();
  const auto* g = static_cast<const char*>(grad.data());
  const std::size_t isz = itemsize(grad.dtype());
  const DType gt = grad.dtype();
  // The device's own kernels (host ones on a host-accessible device's stream, CUDA's on a GPU).
  s.run_step(compute, [&](std::size_t i, const TensorView& m, const TensorView& v) {
    const std::size_t begin = i * s.options.chunk_elements, len = s.chunks[i].len;
    adam_step_range_fp32(s.dev, compute, w + begin, DeviceGrad{g + begin * isz, gt}, m.data_as<float>(),
                         v.data_as<float>(), 0, len, sc);
  });
  ++state.step;
  return {true, false, state.step};
}

std::size_t OffloadedAdam::numel() const { return impl_->numel; }
std::size_t OffloadedAdam::chunk_count() const { return impl_->chunks.size(); }
StatePlacement OffloadedAdam::placement(std::size_t i) const { return impl_->chunks.at(i).where; }

const void* OffloadedAdam::host_address(std::size_t i) const {
  const StateHome& h = impl_->chunks.at(i);
  if (h.where == StatePlacement::device) return nullptr;
  if (h.mapping == "mapped-pinned") return nullptr;  // the device address differs from the host one
  return h.mv.data();
}

OffloadReport OffloadedAdam::report() const {
  const Impl& s = *impl_;
  OffloadReport r;
  r.state_bytes = s.numel * 8;
  for (const StateHome& h : s.chunks) {
    switch (h.where) {
      case StatePlacement::device:
        ++r.chunks_on_device;
        r.device_bytes += offload::device_chunk_bytes(h.len);
        break;
      case StatePlacement::mapped:
        ++r.chunks_mapped;
        r.host_bytes += h.host_bytes;
        if (r.mapping.empty()) r.mapping = h.mapping;
        else if (r.mapping != h.mapping) r.mapping = "mixed";
        break;
      case StatePlacement::streamed:
        ++r.chunks_streamed;
        r.host_bytes += h.host_bytes;
        break;
    }
  }
  if (s.windows[0].defined()) r.device_bytes += s.window_bytes();
  r.device_bytes_saved = r.state_bytes > r.device_bytes ? r.state_bytes - r.device_bytes : 0;
  const auto& nodes = s.dev.properties().numa_nodes;
  r.steps = s.steps;
  if (s.steps > 0 && s.dev.query(s.step_end)) r.last_step_ms = s.dev.elapsed_ms(s.step_begin, s.step_end);
  r.numa_node = (r.chunks_mapped + r.chunks_streamed) > 0 && !nodes.empty() ? nodes.front() : -1;
  return r;
}

void OffloadedAdam::read_states(float* m, float* v) {
  Impl& s = *impl_;
  s.dev.synchronize();
  for (std::size_t i = 0; i < s.chunks.size(); ++i) {
    const StateHome& h = s.chunks[i];
    const std::size_t begin = i * s.options.chunk_elements;
    const CopyKind kind = h.where == StatePlacement::streamed ? CopyKind::host_to_host : CopyKind::device_to_host;
    s.dev.copy_async(m + begin, h.mv.data(), h.len * 4, kind, kDefaultStream);
    s.dev.copy_async(v + begin, static_cast<const char*>(h.mv.data()) + h.len * 4, h.len * 4, kind, kDefaultStream);
  }
  s.dev.synchronize(kDefaultStream);
}

}  // namespace stowage
