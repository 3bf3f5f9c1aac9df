// The swap scheduler. Ordering rules that keep every byte safe:
//  - D2H starts on the d2h stream after an event on the compute stream (the producer is done);
//    the device block is released with record_stream(d2h), so it is reused only after the copy.
//  - H2D starts on the h2d stream after the D2H's completion event (a reload never races the
//    download that filled its buffer) and after the compute stream reached the prefetch point
//    (the fresh block comes from the allocator on the compute stream).
//  - The compute stream waits for the H2D's event in acquire(): device-side, no host sync.
//  - A host buffer goes back to the pool, and an unused incoming block to the allocator, only
//    after the copies that touch them have completed (no record_stream on the scheduler's own
//    streams, so blocks outlive the scheduler safely).
#include "stowage/swap.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "common/log.hpp"
#include "offload/swap_entry.hpp"
#include "offload/swap_timing.hpp"
#include "stowage/device_handles.hpp"
#include "stowage/host_pool.hpp"
#include "stowage/memory_resource.hpp"

namespace stowage {

using offload::SpanKind;
using offload::SwapEntry;

const char* to_string(SwapDecision d) {
  switch (d) {
    case SwapDecision::swapped: return "swapped";
    case SwapDecision::kept_tag: return "kept_tag";
    case SwapDecision::kept_small: return "kept_small";
    case SwapDecision::kept_host_cap: return "kept_host_cap";
    case SwapDecision::kept_pool_full: return "kept_pool_full";
    case SwapDecision::kept_not_resident: return "kept_not_resident";
    case SwapDecision::kept_not_ours: return "kept_not_ours";
  }
  return "?";
}

struct SwapScheduler::Impl {
  Impl(ResourceHandle a, HostPool& p, SwapOptions o)
      : allocator(std::move(a)),
        pool(p),
        device(allocator->device()),
        options(std::move(o)),
        events(device, false),
        timer(device) {
    if (&pool.device() != &device)
      throw InvalidArgument("SwapScheduler: the host pool pins memory for another device than the allocator's");
    if (options.prefetch_distance < 0)
      throw InvalidArgument(fmt::format("SwapScheduler: prefetch distance {} is negative", options.prefetch_distance));
    d2h = OwnedStream(device, options.copy_stream_priority);
    h2d = OwnedStream(device, options.copy_stream_priority);
  }

  // `waiter` does not run ahead of what `producer` has been given so far.
  void order_after(Stream waiter, Stream producer) {
    const Event e = events.take();
    device.record(e, producer);
    device.wait(waiter, e);
    events.give(e);  // a wait holds the point it was given; the event can be recorded again
  }

  // Starts the H2D of `e` into a fresh block; false when the device has no room now.
  bool prefetch(SwapEntry& e) {
    if (e.phase != SwapEntry::Phase::out) return true;
    void* block = nullptr;
    try {
      block = allocator->allocate(e.nbytes, options.compute_stream);
    } catch (const OutOfMemory&) {
      ++st.prefetch_oom;
      return false;
    }
    bool copying = false;
    const Event arrived = events.take();
    try {
      order_after(h2d, options.compute_stream);
      device.wait(h2d, e.d2h_done);
      timer.begin(h2d);
      device.copy_async(block, e.host, e.nbytes, CopyKind::host_to_device, h2d);
      copying = true;
      timer.end(h2d, SpanKind::h2d);
      device.record(arrived, h2d);
    } catch (...) {
      timer.cancel(h2d);
      events.give(arrived);
      // A copy already queued still writes into the block: it goes back only after the copy (if
      // that wait fails too, the block stays allocated rather than be handed out under it).
      if (copying) device.synchronize(h2d);
      allocator->deallocate(block, e.nbytes);
      throw;
    }
    e.h2d_done = arrived;
    e.incoming = block;
    e.phase = SwapEntry::Phase::coming;
    ++st.copies_h2d;
    st.bytes_h2d += e.nbytes;
    return true;
  }

  bool done(Event e, bool wait) {
    if (e == Event{}) return true;
    if (wait) device.synchronize(e);
    return device.query(e);
  }

  // Gives back the host buffer (and an unused incoming block) once the copies touching them are
  // done (`wait`: wait for them); false when they are still running.
  bool give_back(SwapEntry& e, bool wait) {
    if (!done(e.d2h_done, wait) || !done(e.h2d_done, wait)) return false;
    if (e.incoming) allocator->deallocate(e.incoming, e.nbytes);
    pool.deallocate(e.host);
    if (e.d2h_done != Event{}) events.give(e.d2h_done);
    if (e.h2d_done != Event{}) events.give(e.h2d_done);
    st.host_bytes -= e.nbytes;
    --st.tensors_swapped;
    return true;
  }

  // The storage holds its bytes again: the scheduler lets go of it at once (so the device block
  // goes when the user drops it) and keeps only the host buffer until the H2D is done.
  void came_back(std::unordered_map<const void*, SwapEntry>::iterator it) {
    SwapEntry e = std::move(it->second);
    entries.erase(it);
    e.storage = Storage();
    e.phase = SwapEntry::Phase::resident;
    if (!give_back(e, false)) returning.push_back(std::move(e));
  }

  // Returns the host buffers (and unused blocks) no one needs any more.
  void sweep(bool wait) {
    std::erase_if(returning, [&](SwapEntry& e) { return give_back(e, wait); });
    for (auto it = entries.begin(); it != entries.end();) {
      auto next = std::next(it);
      if (it->second.storage.use_count() == 1 && give_back(it->second, wait)) entries.erase(it);
      it = next;
    }
    timer.settle(wait);
  }

  void prefetch_from(int lowest_layer) {
    std::vector<SwapEntry*> due;
    for (auto& [id, e] : entries) {
      const bool wanted = e.storage.use_count() > 1;  // else no one can acquire it
      if (e.phase == SwapEntry::Phase::out && e.layer >= lowest_layer && wanted) due.push_back(&e);
    }
    // Nearest first: the layer backward reaches next, and in it the tensor made last (backward
    // uses a layer's tensors in reverse).
    std::sort(due.begin(), due.end(), [](const SwapEntry* a, const SwapEntry* b) {
      return a->layer != b->layer ? a->layer > b->layer : a->sequence > b->sequence;
    });
    for (SwapEntry* e : due)
      if (!prefetch(*e)) break;  // no room now: acquire() retries
  }

  bool tag_selected(std::string_view tag) const {
    const auto& tags = options.policy.tags;
    if (tags.empty()) return true;
    for (const auto& t : tags) {
      if (tag == t) return true;
      for (std::size_t pos = 0; (pos = tag.find(t, pos)) != std::string_view::npos; ++pos) {
        const bool starts = pos == 0 || tag[pos - 1] == '.';
        const bool ends = pos + t.size() == tag.size() || tag[pos + t.size()] == '.';
        if (starts && ends) return true;
      }
    }
    return false;
  }

  ResourceHandle allocator;
  HostPool& pool;
  Dependency pool_use;  // the pool must outlive the scheduler: swapped tensors live in its pages
  Device& device;
  SwapOptions options;
  OwnedStream d2h, h2d;
  offload::EventPool events;
  offload::SpanTimer timer;
  std::unordered_map<const void*, SwapEntry> entries;  // swapped storages, by identity
  std::vector<SwapEntry> returning;                    // back on the device; host buffers wait for their H2D
  std::uint64_t next_sequence = 0;
  SwapStats st;
  mutable std::mutex mutex;
};

SwapScheduler::SwapScheduler(ResourceHandle allocator, HostPool& pool, SwapOptions options)
    : impl_(std::make_unique<Impl>(std::move(allocator), pool, std::move(options))) {
  impl_->pool_use = pool.attach(fmt::format("SwapScheduler {}", fmt::ptr(this)));
}

SwapScheduler::~SwapScheduler() {
  auto& m = *impl_;
  std::lock_guard lock(m.mutex);
  try {
    m.device.synchronize(m.d2h);
    m.device.synchronize(m.h2d);
    m.sweep(true);
    // Tensors someone still holds come back to the device before the host copies go, each on
    // its own (one failure does not strand the others); a failed copy is tried once more.
    for (auto& [id, e] : m.entries) {
      for (int attempt = 0; attempt < 2 && !e.storage.resident(); ++attempt) {
        try {
          if (!m.prefetch(e)) break;
          m.device.synchronize(e.h2d_done);
          e.storage.adopt(e.incoming, m.options.compute_stream);
          e.incoming = nullptr;
        } catch (const std::exception& ex) {
          log().error("swap: bringing back {} bytes of layer {} at shutdown failed: {}", e.nbytes, e.layer, ex.what());
        }
      }
      if (!e.storage.resident())
        log().error(
            "swap: could not bring back {} bytes of layer {} at shutdown; they are lost (the storage stays "
            "swapped out)",
            e.nbytes, e.layer);
    }
    for (auto it = m.entries.begin(); it != m.entries.end();) {
      auto next = std::next(it);
      if (it->second.storage.resident()) m.came_back(it);
      it = next;
    }
    m.sweep(true);
    // What could not come back still holds host buffers: they go back to the pool too.
    for (auto it = m.entries.begin(); it != m.entries.end();)
      it = m.give_back(it->second, true) ? m.entries.erase(it) : std::next(it);
  } catch (const std::exception& ex) {
    log().error("swap: shutting down failed: {}", ex.what());
  }
}  // the copy streams go with impl_

SwapDecision SwapScheduler::offload(const TensorView& view, int layer, std::string_view tag) {
  auto& m = *impl_;
  Storage s = view.storage();
  if (!s.valid()) throw InvalidArgument("SwapScheduler::offload: an undefined tensor");
  std::lock_guard lock(m.mutex);
  auto keep = [&](SwapDecision d, std::uint64_t& counter) {
    ++counter;
    return d;
  };
  if (s.resource() != m.allocator.raw()) return keep(SwapDecision::kept_not_ours, m.st.kept_not_ours);
  if (m.entries.contains(s.id())) return SwapDecision::swapped;  // another view of a swapped storage
  if (!s.resident()) return keep(SwapDecision::kept_not_resident, m.st.kept_not_resident);
  if (!m.tag_selected(tag)) return keep(SwapDecision::kept_tag, m.st.kept_tag);
  const std::size_t n = s.nbytes();
  if (n < m.options.policy.min_bytes) return keep(SwapDecision::kept_small, m.st.kept_small);
  if (m.options.policy.host_cap_bytes != 0 && m.st.host_bytes + n > m.options.policy.host_cap_bytes) {
    m.st.kept_bytes_host_cap += n;
    return keep(SwapDecision::kept_host_cap, m.st.kept_host_cap);
  }
  void* host = nullptr;
  try {
    host = m.pool.allocate(n);  // pinned, from the pool: never allocated on the fly
  } catch (const OutOfMemory&) {
    m.st.kept_bytes_pool_full += n;
    return keep(SwapDecision::kept_pool_full, m.st.kept_pool_full);
  }
  SwapEntry e;
  try {
    void* data = s.data();
    m.order_after(m.d2h, m.options.compute_stream);
    if (s.stream() != m.options.compute_stream) m.order_after(m.d2h, s.stream());
    m.timer.begin(m.d2h);
    m.device.copy_async(host, data, n, CopyKind::device_to_host, m.d2h);
    m.timer.end(m.d2h, SpanKind::d2h);
    e.d2h_done = m.events.take();
    m.device.record(e.d2h_done, m.d2h);
    m.allocator->record_stream(data, m.d2h);  // the block is reused only after the copy
  } catch (...) {
    if (e.d2h_done != Event{}) m.events.give(e.d2h_done);
    m.timer.cancel(m.d2h);
    m.device.synchronize(m.d2h);  // the copy may be queued: let it finish before the buffer goes
    m.pool.deallocate(host);
    throw;
  }
  s.release(StorageState::swapped_out);
  e.storage = s;
  e.layer = layer;
  e.nbytes = n;
  e.host = host;
  e.sequence = m.next_sequence++;
  m.entries.emplace(s.id(), std::move(e));
  ++m.st.copies_d2h;
  m.st.bytes_d2h += n;
  m.st.host_bytes += n;
  m.st.peak_host_bytes = std::max(m.st.peak_host_bytes, m.st.host_bytes);
  ++m.st.tensors_swapped;
  return SwapDecision::swapped;
}

void SwapScheduler::before_backward(int layer) {
  std::lock_guard lock(impl_->mutex);
  impl_->sweep(false);
  impl_->prefetch_from(layer - impl_->options.prefetch_distance);
}

void SwapScheduler::after_backward(int) {
  std::lock_guard lock(impl_->mutex);
  impl_->sweep(false);
}

void SwapScheduler::prefetch(int layer) {
  auto& m = *impl_;
  std::lock_guard lock(m.mutex);
  for (auto& [id, e] : m.entries)
    if (e.layer == layer && !m.prefetch(e)) break;
}

TensorView SwapScheduler::acquire(const TensorView& view) {
  auto& m = *impl_;
  const Storage& s = view.storage();
  if (!s.valid()) throw InvalidArgument("SwapScheduler::acquire: an undefined tensor");
  std::lock_guard lock(m.mutex);
  auto it = m.entries.find(s.id());
  if (it == m.entries.end()) {
    if (!s.resident())
      throw InvalidArgument(fmt::format("SwapScheduler::acquire: storage is {} and was not swapped by this scheduler",
                                        to_string(s.state())));
    return view;
  }
  SwapEntry& e = it->second;
  if (e.phase == SwapEntry::Phase::out) {
    ++m.st.prefetch_on_demand;
    if (!m.prefetch(e))
      throw OutOfMemory(fmt::format(
          "SwapScheduler::acquire: no device memory to bring back {} bytes of layer {}; the tensor stays on the "
          "host, unchanged. Free device memory (or lower prefetch_distance) and acquire again.",
          e.nbytes, e.layer));
  }
  m.timer.begin(m.options.compute_stream);
  m.device.wait(m.options.compute_stream, e.h2d_done);
  m.timer.end(m.options.compute_stream, SpanKind::compute_wait);
  e.storage.adopt(e.incoming, m.options.compute_stream);
  e.incoming = nullptr;
  m.came_back(it);
  return view;
}

void SwapScheduler::finish_step() {
  auto& m = *impl_;
  std::lock_guard lock(m.mutex);
  m.device.synchronize(m.d2h);
  m.device.synchronize(m.h2d);
  m.sweep(true);
}

SwapStats SwapScheduler::stats() const {
  auto& m = *impl_;
  std::lock_guard lock(m.mutex);
  m.timer.settle(false);
  SwapStats s = m.st;
  s.d2h_ms = m.timer.total_ms(SpanKind::d2h);
  s.h2d_ms = m.timer.total_ms(SpanKind::h2d);
  s.compute_wait_ms = m.timer.total_ms(SpanKind::compute_wait);
  const double transfer = s.d2h_ms + s.h2d_ms;
  s.overlap_fraction = transfer > 0 ? std::clamp(1.0 - s.compute_wait_ms / transfer, 0.0, 1.0) : 1.0;
  return s;
}

void SwapScheduler::reset_stats() {
  auto& m = *impl_;
  std::lock_guard lock(m.mutex);
  m.timer.settle(false);
  m.timer.reset_totals();
  SwapStats fresh;
  fresh.host_bytes = fresh.peak_host_bytes = m.st.host_bytes;
  fresh.tensors_swapped = m.st.tensors_swapped;
  m.st = fresh;
}

const SwapOptions& SwapScheduler::options() const { return impl_->options; }
Stream SwapScheduler::d2h_stream() const { return impl_->d2h; }
Stream SwapScheduler::h2d_stream() const { return impl_->h2d; }

}  // namespace stowage
