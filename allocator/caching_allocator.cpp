// The caching allocator's public entry points and its allocation and free paths.
#include <algorithm>
#include <new>

#include "allocator/caching_allocator_impl.hpp"
#include "allocator/size_classes.hpp"
#include "fmt/format.h"

namespace stowage {

using detail::Block;
using detail::BlockUse;

namespace {

// A positive fraction caps at one byte at least: a cap of 0 would mean no cap at all.
std::size_t cap_of(double fraction, std::size_t capacity) {
  return std::max<std::size_t>(1, static_cast<std::size_t>(fraction * static_cast<double>(capacity)));
}

// In a process forked from the one that made an allocator, its lock and its caches' locks may be
// held by a parent's thread, which is not here: they are neither taken nor destroyed (destroying
// a held mutex is undefined) but kept, reachable, until the process ends.
void keep_in_forked_child(std::shared_ptr<detail::CacheOwner> owner) {
  using Owners = std::vector<std::shared_ptr<detail::CacheOwner>>;
  static std::mutex mutex;
  static auto* kept = new Owners();  // NOLINT(cppcoreguidelines-owning-memory): never destroyed
  std::lock_guard lock(mutex);
  kept->push_back(std::move(owner));
}

}  // namespace

CachingAllocator::Impl::Impl(Device& d, AllocatorOptions o)
    : device(d),
      opts(o),
      owner(std::make_shared<detail::CacheOwner>()),
      mu(owner->mu),
      generation(owner->generation),
      thread_caches(opts.thread_cache_bytes > 0 && opts.trace_entries == 0),
      trace(opts.trace_entries) {
  owner->allocator = this;
  owner->retire = &Impl::retire_cache;
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
    const std::size_t frac = cap_of(opts.memory_cap_fraction, props.capacity);
    cap = cap > 0 ? std::min(cap, frac) : frac;
  }
}

CachingAllocator::Impl::~Impl() {
  if (forked_since(generation)) {
    owner->allocator = nullptr;  // no thread of the parent is here to read it under mu
    keep_in_forked_child(owner);
  } else {
    detach_caches();
  }
  release_everything();
}

void CachingAllocator::Impl::refuse_forked(const char* what) const {
  refuse_in_forked_child(
      fmt::format("stowage: {} on the caching allocator of device {} ({})", what, device.ordinal(), device.name()));
}

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
  if (!unsplittable && detail::should_split(b->size, rounded, b->pool, b->segment->expandable))
    bp.split(b, rounded, rest_stream);
  b->stream = stream;
  b->requested = bytes;
  b->tag = ScopedTag::current();
  b->split_member = b->segment->expandable || b->prev != nullptr || b->next != nullptr;
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

bool CachingAllocator::Impl::stream_alive(Stream s) {
  try {
    device.check_stream(s);
    return true;
  } catch (const InvalidArgument&) {
    return false;
  }
}

void CachingAllocator::Impl::complete_free(Block* b) {
  const Pool p = b->pool;
  st.active_bytes.sub(p, static_cast<std::int64_t>(b->size));
  // The tag of the thread whose call completes it (the free, or a later call that finds the
  // streams done), not the block's: step marks read what each step did.
  if (trace.enabled()) trace.push(TraceAction::free_completed, b->addr, b->size, b->stream, ScopedTag::current());
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
    const bool done = std::all_of(pe.events.begin(), pe.events.end(), [&](Event e) { return device.query(e); });
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
  bool ordered = !waited.empty();
  // The stream it was last used on, up to now; one destroyed since has finished its work.
  if (best->stream != stream && stream_alive(best->stream)) {
    Event e = take_event();
    try {
      device.record(e, best->stream);
      device.wait(stream, e);
    } catch (...) {
      spare_events.push_back(e);
      throw;
    }
    spare_events.push_back(e);  // a wait holds the point recorded, so the event can be reused
    ordered = true;
  }
  if (ordered) ++st.num_stream_waits;
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
  // Before waiting on other streams or asking the device for more: the blocks threads keep for
  // themselves go back to the pools, where they merge with their free neighbours.
  if (cached_bytes() > 0) {
    drain_caches();
    if (Block* b = pool(p).find(rounded, stream, max_split())) return b;
  }
  if (Block* b = take_from_other_streams(rounded, p, stream)) return b;
  if (rounded > limit()) {
    throw_oom(bytes, rounded, "the request is larger than the device capacity or the memory cap");
  }
  maybe_collect_garbage(p, rounded);
  // A refused reservation or mapping (DeviceError) counts as a refusal too: growth rolls back
  // whatever it mapped, so the retry starts from the same state.
  try {
    if (Block* b = grow(p, rounded, stream)) return b;
  } catch (const OutOfMemory&) {
  } catch (const DeviceError&) {
  }
  // Refused: give back everything cached (after the streams finish with it) and retry once.
  ++st.num_alloc_retries;
  release_cached(static_cast<std::size_t>(-1), false);
  if (Block* b = pool(p).find(rounded, stream, max_split())) return b;
  try {
    if (Block* b = grow(p, rounded, stream)) return b;
  } catch (const OutOfMemory& e) {
    throw_oom(bytes, rounded, e.what());
  } catch (const DeviceError& e) {
    throw_oom(bytes, rounded, e.what());
  }
  throw_oom(bytes, rounded, "no block fits after growing");
}

// ---------------------------------------------------------------------------------------------

CachingAllocator::CachingAllocator(Device& device, AllocatorOptions options)
    : impl_(std::make_unique<Impl>(device, options)) {
  impl_->use = device.attach(fmt::format("CachingAllocator {}", fmt::ptr(this)));
}
CachingAllocator::~CachingAllocator() = default;

Device& CachingAllocator::device() const { return impl_->device; }
const AllocatorOptions& CachingAllocator::options() const { return impl_->opts; }
SegmentMode CachingAllocator::segment_mode() const { return impl_->mode; }

void* CachingAllocator::do_allocate(std::size_t bytes, Stream stream) {
  Impl& m = *impl_;
  m.check_not_forked("allocate");
  if (bytes == 0) return nullptr;
  if (bytes > detail::kMaxRequest) {
    // Out of memory however large, as PyTorch's allocator says it: the size is a size, just not
    // one any device has. (Rounding it would overflow, so it is refused before.)
    m.device.check_stream(stream);
    Impl::Exclusive ex(m);
    m.throw_oom(bytes, bytes, "the request is larger than the device capacity or the memory cap");
  }
  const std::size_t rounded = detail::round_size(bytes);
  // A thread's cache files no block larger than thread_cache_max_block: larger sizes skip it.
  const bool cached_size = m.thread_caches && rounded <= m.opts.thread_cache_max_block;
  if (cached_size) {
    if (void* p = m.fast_allocate(bytes, rounded, stream)) return p;
  }
  // A block never carries a stream that is not real: a bad one fails here, changing nothing.
  // (A thread's cache serves only streams checked since the device last destroyed one.)
  m.device.check_stream(stream);
  const Pool p = detail::pool_for(rounded);
  Impl::Exclusive ex(m);
  if (m.thread_caches) {
    if (detail::ThreadCache* c = m.thread_cache(false)) m.check_cached_streams(*c);
    if (cached_size) {
      if (void* cached = m.hand_out_cached(bytes, rounded, stream)) return cached;
    }
  }
  // Frees whose streams have arrived go back first (as PyTorch's malloc does), so their blocks
  // serve this request before another block is split.
  if (!m.pending.empty()) m.process_events();
  Block* b = m.pool(p).find(rounded, stream, m.max_split());
  if (!b) b = m.slow_find(bytes, rounded, p, stream);
  return m.hand_out(b, bytes, rounded, stream);
}

void CachingAllocator::do_deallocate(void* ptr, std::size_t expected_bytes) {
  Impl& m = *impl_;
  m.check_not_forked("deallocate");
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  // Under the block's shard lock: check it, and mark it cached when this thread may cache it
  // (then no other thread can free it twice meanwhile).
  bool size_mismatch = false;
  bool taken = false;
  Block* b = m.live.with(addr, [&](detail::AddressMap& map) -> Block* {
    Block* found = map.find(addr);
    if (found == nullptr || found->cached.load(std::memory_order_acquire)) return nullptr;
    if (expected_bytes != 0 && expected_bytes != found->requested && expected_bytes != found->size) {
      size_mismatch = true;
      return found;
    }
    if (m.cacheable(found)) {
      found->cached.store(true, std::memory_order_relaxed);
      taken = true;
    }
    return found;
  });
  if (b == nullptr) {
    Impl::Exclusive ex(m);
    throw InvalidArgument(m.describe_foreign(addr));
  }
  if (size_mismatch) {
    throw InvalidArgument(
        fmt::format("stowage: free of {} with size {} bytes, but the block was allocated with {} bytes", ptr,
                    expected_bytes, b->requested));
  }
  if (taken) {
    try {
      if (m.fast_free(b)) return;
    } catch (const std::bad_alloc&) {  // no memory for this thread's first cache: the slow way
    }
    Impl::Exclusive ex(m);
    if (m.cache_freed(b)) return;
    m.uncache(b);
    m.free_block(b);  // no other stream's use: nothing to record, so it cannot fail part-way
    return;
  }
  Impl::Exclusive ex(m);
  b = m.live.with(addr, [&](detail::AddressMap& map) -> Block* {
    Block* now = map.find(addr);
    if (now == nullptr || now->cached.load(std::memory_order_acquire)) return nullptr;
    map.erase(addr);
    return now;
  });
  if (b == nullptr) throw InvalidArgument(m.describe_foreign(addr));  // freed by another thread meanwhile
  try {
    m.free_block(b);
  } catch (...) {
    m.live.insert(addr, b);  // nothing changed
    throw;
  }
}

void CachingAllocator::Impl::free_block(Block* b) {
  // Events first: if recording fails nothing has changed yet.
  std::vector<Event> events;
  try {
    for (Stream s : b->uses) {
      if (!stream_alive(s)) continue;  // destroyed: its work on the block has finished
      events.push_back(take_event());
      device.record(events.back(), s);
    }
  } catch (...) {
    spare_events.insert(spare_events.end(), events.begin(), events.end());
    throw;
  }
  const Pool p = b->pool;
  st.allocated_bytes.sub(p, static_cast<std::int64_t>(b->size));
  st.requested_bytes.sub(p, static_cast<std::int64_t>(b->requested));
  st.allocation.sub(p, 1);
  if (trace.enabled()) trace.push(TraceAction::free_requested, b->addr, b->size, b->stream, ScopedTag::current());
  if (events.empty()) {
    complete_free(b);
  } else {
    b->use = BlockUse::pending;
    pending.push_back({b, std::move(events)});
  }
}

void CachingAllocator::do_record_stream(void* ptr, Stream stream) {
  impl_->check_not_forked("record_stream");
  impl_->device.check_stream(stream);  // else every later free of the block would fail
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  const bool found = impl_->live.with(addr, [&](detail::AddressMap& map) {
    Block* b = map.find(addr);
    if (b == nullptr || b->cached.load(std::memory_order_acquire)) return false;
    if (stream != b->stream && std::find(b->uses.begin(), b->uses.end(), stream) == b->uses.end())
      b->uses.push_back(stream);
    return true;
  });
  if (!found) throw InvalidArgument(fmt::format("stowage: record_stream on {}, which is not a live allocation", ptr));
}

std::size_t CachingAllocator::block_size(const void* ptr) const {
  impl_->check_not_forked("block_size");
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  const std::size_t size = impl_->live.with(addr, [&](detail::AddressMap& map) -> std::size_t {
    const Block* b = map.find(addr);
    return b != nullptr && !b->cached.load(std::memory_order_acquire) ? b->size : 0;
  });
  if (size == 0) throw InvalidArgument(fmt::format("stowage: {} is not a live allocation of this allocator", ptr));
  return size;
}

bool CachingAllocator::owns(const void* ptr) const {
  impl_->check_not_forked("owns");
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  return impl_->live.with(addr, [&](detail::AddressMap& map) {
    const Block* b = map.find(addr);
    return b != nullptr && !b->cached.load(std::memory_order_acquire);
  });
}

void CachingAllocator::empty_cache() {
  impl_->check_not_forked("empty_cache");
  Impl::Exclusive ex(*impl_);
  impl_->release_cached(static_cast<std::size_t>(-1), false);
}

void CachingAllocator::set_memory_cap(std::size_t bytes) {
  impl_->check_not_forked("set_memory_cap");
  std::lock_guard lock(impl_->mu);  // the cap is read under mu alone
  impl_->cap = bytes;
}

void CachingAllocator::set_memory_fraction(double fraction) {
  impl_->check_not_forked("set_memory_fraction");
  if (!(fraction >= 0.0 && fraction <= 1.0)) {
    throw InvalidArgument(fmt::format("stowage: memory fraction {} is not in [0, 1]", fraction));
  }
  // As PyTorch's setMemoryFraction: 1 is no cap at all, 0 a cap no reservation fits.
  set_memory_cap(fraction == 1.0 ? 0 : cap_of(fraction, impl_->device.capacity()));
}

std::size_t CachingAllocator::memory_cap() const {
  impl_->check_not_forked("memory_cap");
  std::lock_guard lock(impl_->mu);
  return impl_->cap;
}

AllocatorStats CachingAllocator::stats() const {
  impl_->check_not_forked("stats");
  Impl::Exclusive ex(*impl_);
  AllocatorStats s = impl_->st;
  s.thread_cache_bytes = static_cast<std::int64_t>(impl_->cached_bytes());
  return s;
}

void CachingAllocator::reset_peak_stats() {
  impl_->check_not_forked("reset_peak_stats");
  Impl::Exclusive ex(*impl_);
  impl_->st.reset_peaks();
  for (const auto& c : impl_->owner->caches) c->revoke_headroom();  // total + headroom <= peak == total
}

}  // namespace stowage
