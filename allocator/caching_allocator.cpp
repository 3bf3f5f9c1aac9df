// The caching allocator's public entry points and its allocation and free paths.
#include <algorithm>

#include "allocator/caching_allocator_impl.hpp"
#include "allocator/size_classes.hpp"
#include "fmt/format.h"

namespace stowage {

using detail::Block;
using detail::BlockUse;

CachingAllocator::Impl::Impl(Device& d, AllocatorOptions o)
    : device(d), opts(o), trace(opts.trace_entries) {
  if (opts.max_split_size > 0 && opts.max_split_size <= detail::kLargeBuffer) {
    throw InvalidArgument(fmt::format("stowage: max_split_size must be 0 or above {} bytes (20 MiB), got {}",
                                      detail::kLargeBuffer, opts.max_split_size));
  }
  if (!(opts.memory_cap_fraction >= 0.0 && opts.memory_cap_fraction <= 1.0) ||
      !(opts.gc_threshold >= 0.0 && opts.gc_threshold <= 1.0)) {
    throw InvalidArgument("stowage: memory_cap_fraction and gc_threshold must lie in [0, 1]");
  }
  const DeviceProperties& props = device.properties();
  const bool vmm = props.virtual_memory && props.granularity > 0;
  mode = opts.segments == SegmentMode::expandable && vmm ? SegmentMode::expandable : SegmentMode::classic;
  if (opts.memory_cap_bytes > 0) cap = opts.memory_cap_bytes;
  if (opts.memory_cap_fraction > 0.0) {
    const auto frac = static_cast<std::size_t>(opts.memory_cap_fraction * static_cast<double>(props.capacity));
    cap = cap > 0 ? std::min(cap, frac) : frac;
  }
}

CachingAllocator::Impl::~Impl() { release_everything(); }

std::size_t CachingAllocator::Impl::limit() const {
  const std::size_t capacity = device.capacity();
  return cap > 0 ? std::min(cap, capacity) : capacity;
}

void CachingAllocator::Impl::sync_split_stat(Pool p) {
  const std::int64_t now = st.reserved_bytes.of(p).current - st.active_bytes.of(p).current -
                           static_cast<std::int64_t>(pool(p).unsplit_free_bytes());
  const std::int64_t delta = now - st.inactive_split_bytes.of(p).current;
  if (delta > 0) st.inactive_split_bytes.add(p, delta);
  if (delta < 0) st.inactive_split_bytes.sub(p, -delta);
}

void* CachingAllocator::Impl::hand_out(Block* b, std::size_t bytes, std::size_t rounded, Stream stream) {
  detail::BlockPool& bp = pool(b->pool);
  bp.remove(b);
  const Stream rest_stream = b->stream;
  b->use = BlockUse::allocated;
  const std::size_t ms = max_split();
  const bool unsplittable = ms > 0 && b->size >= ms;
  if (!unsplittable && detail::should_split(b->size, rounded, b->pool, b->segment->expandable)) bp.split(b, rounded, rest_stream);
  b->stream = stream;
  b->requested = bytes;
  b->tag = ScopedTag::current();
  live.insert(b->addr, b);
  const auto size = static_cast<std::int64_t>(b->size);
  st.allocated_bytes.add(b->pool, size);
  st.active_bytes.add(b->pool, size);
  st.requested_bytes.add(b->pool, static_cast<std::int64_t>(bytes));
  st.allocation.add(b->pool, 1);
  sync_split_stat(b->pool);
  if (trace.enabled()) trace.push(TraceAction::alloc, b->addr, b->size, stream, b->tag);
  return reinterpret_cast<void*>(b->addr);
}

void CachingAllocator::Impl::complete_free(Block* b) {
  const Pool p = b->pool;
  st.active_bytes.sub(p, static_cast<std::int64_t>(b->size));
  if (trace.enabled()) trace.push(TraceAction::free_completed, b->addr, b->size, b->stream, b->tag);
  b->free_tick = ++tick;
  pool(p).insert(b);
  sync_split_stat(p);
}

Event CachingAllocator::Impl::take_event() {
  if (spare_events.empty()) return device.create_event();
  Event e = spare_events.back();
  spare_events.pop_back();
  return e;
}

void CachingAllocator::Impl::process_events() {
  for (std::size_t i = 0; i < pending.size();) {
    Pending& pe = pending[i];
    const bool done = std::all_of(pe.events.begin(), pe.events.end(),
                                  [&](Event e) { return device.query(e); });
    if (!done) {
      ++i;
      continue;
    }
    spare_events.insert(spare_events.end(), pe.events.begin(), pe.events.end());
    Block* b = pe.block;
    pending[i] = std::move(pending.back());
    pending.pop_back();
    complete_free(b);
  }
}

// The fitting block that is free or pending on another stream, made usable on `stream` by a
// device-side wait (no host synchronisation) instead of growing the pool.
Block* CachingAllocator::Impl::take_from_other_streams(std::size_t rounded, Pool p, Stream stream) {
  detail::BlockPool& bp = pool(p);
  Block* best = bp.find_other_stream(rounded, stream, max_split());
  std::size_t pending_index = pending.size();
  for (std::size_t i = 0; i < pending.size(); ++i) {
    const Block* b = pending[i].block;
    if (b->pool == p && b->size >= rounded && (!best || b->size < best->size)) {
      best = pending[i].block;
      pending_index = i;
    }
  }
  if (!best) return nullptr;
  std::vector<Event> waited;
  if (pending_index < pending.size()) waited = pending[pending_index].events;
  for (Event e : waited) device.wait(stream, e);
  if (best->stream != stream) {  // the stream it was last used on, up to now
    Event e = take_event();
    try {
      device.record(e, best->stream);
      device.wait(stream, e);
    } catch (...) {
      spare_events.push_back(e);
      throw;
    }
    spare_events.push_back(e);  // a wait holds the point recorded, so the event can be reused
  }
  ++st.num_stream_waits;
  if (pending_index < pending.size()) {
    spare_events.insert(spare_events.end(), waited.begin(), waited.end());
    pending[pending_index] = std::move(pending.back());
    pending.pop_back();
    best->stream = stream;
    complete_free(best);
  } else {
    bp.remove(best);
    best->stream = stream;
    bp.insert(best);
    sync_split_stat(p);
  }
  return bp.find(rounded, stream, max_split());
}

Block* CachingAllocator::Impl::slow_find(std::size_t bytes, std::size_t rounded, Pool p, Stream stream) {
  process_events();
  if (Block* b = pool(p).find(rounded, stream, max_split())) return b;
  if (Block* b = take_from_other_streams(rounded, p, stream)) return b;
  if (rounded > limit()) {
    throw_oom(bytes, rounded, "the request is larger than the device capacity or the memory cap");
  }
  maybe_collect_garbage(p, rounded);
  // A refused reservation or mapping (DeviceError) counts as a refusal too: growth rolls back
  // whatever it mapped, so the retry starts from the same state.
  try {
    grow(p, rounded, stream);
    if (Block* b = pool(p).find(rounded, stream, max_split())) return b;
  } catch (const OutOfMemory&) {
  } catch (const DeviceError&) {
  }
  // Refused: give back everything cached (after the streams finish with it) and retry once.
  ++st.num_alloc_retries;
  release_cached(static_cast<std::size_t>(-1), false);
  if (Block* b = pool(p).find(rounded, stream, max_split())) return b;
  try {
    grow(p, rounded, stream);
    if (Block* b = pool(p).find(rounded, stream, max_split())) return b;
  } catch (const OutOfMemory& e) {
    throw_oom(bytes, rounded, e.what());
  } catch (const DeviceError& e) {
    throw_oom(bytes, rounded, e.what());
  }
  throw_oom(bytes, rounded, "no block fits after growing");
}

// ---------------------------------------------------------------------------------------------

CachingAllocator::CachingAllocator(Device& device, AllocatorOptions options)
    : impl_(std::make_unique<Impl>(device, options)) {}
CachingAllocator::~CachingAllocator() = default;

Device& CachingAllocator::device() const { return impl_->device; }
const AllocatorOptions& CachingAllocator::options() const { return impl_->opts; }
SegmentMode CachingAllocator::segment_mode() const { return impl_->mode; }

void* CachingAllocator::do_allocate(std::size_t bytes, Stream stream) {
  if (bytes == 0) return nullptr;
  if (bytes > detail::kMaxRequest) {
    throw InvalidArgument(fmt::format("stowage: allocation of {} bytes is larger than any device", bytes));
  }
  const std::size_t rounded = detail::round_size(bytes);
  const Pool p = detail::pool_for(rounded);
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  Block* b = m.pool(p).find(rounded, stream, m.max_split());
  if (!b) b = m.slow_find(bytes, rounded, p, stream);
  return m.hand_out(b, bytes, rounded, stream);
}

void CachingAllocator::do_deallocate(void* ptr, std::size_t expected_bytes) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  Block* b = m.live.find(addr);
  if (!b) throw InvalidArgument(m.describe_foreign(addr));
  if (expected_bytes != 0 && expected_bytes != b->requested && expected_bytes != b->size) {
    throw InvalidArgument(fmt::format(
        "stowage: free of {} with size {} bytes, but the block was allocated with {} bytes",
        ptr, expected_bytes, b->requested));
  }
  // Events first: if recording fails nothing has changed yet.
  std::vector<Event> events;
  try {
    for (Stream s : b->uses) {
      events.push_back(m.take_event());
      m.device.record(events.back(), s);
    }
  } catch (...) {
    m.spare_events.insert(m.spare_events.end(), events.begin(), events.end());
    throw;
  }
  m.live.erase(addr);
  const Pool p = b->pool;
  m.st.allocated_bytes.sub(p, static_cast<std::int64_t>(b->size));
  m.st.requested_bytes.sub(p, static_cast<std::int64_t>(b->requested));
  m.st.allocation.sub(p, 1);
  if (m.trace.enabled()) m.trace.push(TraceAction::free_requested, b->addr, b->size, b->stream, b->tag);
  if (events.empty()) {
    m.complete_free(b);
  } else {
    b->use = BlockUse::pending;
    m.pending.push_back({b, std::move(events)});
  }
}

void CachingAllocator::do_record_stream(void* ptr, Stream stream) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  Block* b = m.live.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (!b) {
    throw InvalidArgument(fmt::format("stowage: record_stream on {}, which is not a live allocation", ptr));
  }
  if (stream == b->stream || std::find(b->uses.begin(), b->uses.end(), stream) != b->uses.end()) return;
  b->uses.push_back(stream);
}

std::size_t CachingAllocator::block_size(const void* ptr) const {
  std::lock_guard lock(impl_->mu);
  const Block* b = impl_->live.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (!b) throw InvalidArgument(fmt::format("stowage: {} is not a live allocation of this allocator", ptr));
  return b->size;
}

bool CachingAllocator::owns(const void* ptr) const {
  std::lock_guard lock(impl_->mu);
  return impl_->live.find(reinterpret_cast<std::uintptr_t>(ptr)) != nullptr;
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(impl_->mu);
  impl_->release_cached(static_cast<std::size_t>(-1), false);
}

void CachingAllocator::set_memory_cap(std::size_t bytes) {
  std::lock_guard lock(impl_->mu);
  impl_->cap = bytes;
}

std::size_t CachingAllocator::memory_cap() const {
  std::lock_guard lock(impl_->mu);
  return impl_->cap;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard lock(impl_->mu);
  return impl_->st;
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard lock(impl_->mu);
  impl_->st.reset_peaks();
}

}  // namespace stowage
