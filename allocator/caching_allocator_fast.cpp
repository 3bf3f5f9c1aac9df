// The threads' caches: the fast path that takes no device-wide lock, and how the slow path keeps
// statistics exact around it (the leases of thread_cache.hpp).
//
// Locks, always taken in this order: mu, then thread caches' locks, then live-map shards. A fast
// operation holds its own cache's lock and at most one shard's.
#include "allocator/caching_allocator_impl.hpp"
#include "allocator/size_classes.hpp"

namespace stowage {

using detail::Block;
using detail::FastDelta;
using detail::ThreadCache;

namespace {

struct TlsEntry {
  std::shared_ptr<detail::CacheOwner> owner;
  std::shared_ptr<ThreadCache> cache;
};

// A thread's caches, one per allocator it used; given back to their allocators when it exits.
struct TlsCaches {
  std::vector<TlsEntry> entries;
  ~TlsCaches() {
    for (TlsEntry& e : entries) {
      std::lock_guard lock(e.owner->mu);
      if (e.owner->allocator != nullptr) e.owner->retire(e.owner->allocator, e.cache);
    }
  }
};

thread_local TlsCaches tls_caches;

}  // namespace

// As in an Exclusive section, but without granting: the exiting thread's lease lapses (the
// invariant holds with less headroom), and its blocks go back to their pools. mu is held.
void CachingAllocator::Impl::retire_cache(void* allocator, const std::shared_ptr<ThreadCache>& cache) {
  Impl& m = *static_cast<Impl*>(allocator);
  for (const auto& c : m.owner->caches) c->lock.lock();
  m.fold_caches();
  for (Block* b : cache->take_all()) {
    b->free_tick = ++m.tick;
    m.pool(b->pool).insert(b);
  }
  for (Pool p : {Pool::small, Pool::large}) m.sync_split_stat(p);
  for (auto& per_stat : cache->headroom)
    for (std::int64_t& h : per_stat) h = 0;
  cache->detached = true;
  for (const auto& c : m.owner->caches) c->lock.unlock();
  std::erase(m.owner->caches, cache);
}

Stat& CachingAllocator::Impl::fast_stat(int stat, int slot) {
  StatArray* arrays[detail::kFastStats] = {&st.allocated_bytes, &st.active_bytes, &st.requested_bytes, &st.allocation,
                                           &st.inactive_split_bytes};
  StatArray& a = *arrays[stat];
  return slot == 0 ? a.all : slot == 1 ? a.small_pool : a.large_pool;
}

ThreadCache* CachingAllocator::Impl::thread_cache(bool create) {
  auto& entries = tls_caches.entries;
  for (TlsEntry& e : entries)
    if (e.owner == owner) return e.cache.get();
  if (!create || !thread_caches) return nullptr;
  // Forget caches of allocators that are gone.
  std::erase_if(entries, [](TlsEntry& e) {
    std::lock_guard lock(e.cache->lock);
    return e.cache->detached;
  });
  auto cache = std::make_shared<ThreadCache>();
  {
    std::lock_guard lock(mu);
    owner->caches.push_back(cache);
  }
  entries.push_back({owner, cache});
  return cache.get();
}

bool CachingAllocator::Impl::cacheable(const Block* b) const {
  // A block that is a whole classic segment would count as unsplit free memory in the pool, not
  // as inactive split memory: it goes back to the pool.
  return thread_caches && b->uses.empty() && b->size <= opts.thread_cache_max_block && b->split_member;
}

void* CachingAllocator::Impl::fast_allocate(std::size_t bytes, std::size_t rounded, Stream stream) {
  ThreadCache* c = thread_cache(false);
  if (c == nullptr) return nullptr;
  std::lock_guard lock(c->lock);
  // Streams destroyed since the cache checked its own: the slow path refuses a dead `stream`
  // and takes back the blocks kept for dead ones. (Relaxed: a destroy that happened before this
  // call is seen; one racing with it is the caller's race.)
  if (!c->streams_current(device.stream_epoch())) return nullptr;
  Block* b = c->take(stream, rounded);
  if (b == nullptr) return nullptr;
  if (!c->lease_allocation(b->size, bytes, b->pool)) {
    c->put(b, rounded);  // its bin is there: it just came out of it
    return nullptr;
  }
  ++c->hits;
  b->requested = bytes;
  if (const std::string& tag = ScopedTag::current(); !tag.empty() || !b->tag.empty()) b->tag = tag;
  live.insert(b->addr, b);
  return reinterpret_cast<void*>(b->addr);
}

bool CachingAllocator::Impl::fast_free(Block* b) {
  ThreadCache* c = thread_cache(true);
  if (c == nullptr) return false;
  std::lock_guard lock(c->lock);
  const std::size_t key = detail::round_size(b->requested);
  if (c->bytes + b->size > opts.thread_cache_bytes || !c->can_put(b->stream, key)) return false;
  if (!c->lease_free(b->size, b->requested, b->pool)) return false;
  c->put(b, key);
  return true;
}

void CachingAllocator::Impl::check_cached_streams(ThreadCache& c) {
  const std::uint64_t epoch = device.stream_epoch();  // before the checks: a later destroy shows
  if (c.streams_current(epoch)) return;
  const std::vector<Block*> gone = c.take_streams([&](Stream s) { return !stream_alive(s); });
  for (Block* b : gone) {
    b->free_tick = ++tick;
    pool(b->pool).insert(b);
  }
  if (!gone.empty())
    for (Pool p : {Pool::small, Pool::large}) sync_split_stat(p);
  c.stream_epoch = epoch;
}

void CachingAllocator::Impl::apply_exact(const FastDelta& d) {
  const Pool p = d.pool_slot == 1 ? Pool::small : Pool::large;
  StatArray* arrays[detail::kFastStats] = {&st.allocated_bytes, &st.active_bytes, &st.requested_bytes, &st.allocation,
                                           &st.inactive_split_bytes};
  for (int k = 0; k < detail::kFastStats; ++k) {
    if (d.by_stat[k] > 0) arrays[k]->add(p, d.by_stat[k]);
    if (d.by_stat[k] < 0) arrays[k]->sub(p, -d.by_stat[k]);
  }
}

void* CachingAllocator::Impl::hand_out_cached(std::size_t bytes, std::size_t rounded, Stream stream) {
  ThreadCache* c = thread_cache(false);
  if (c == nullptr) return nullptr;
  Block* b = c->take(stream, rounded);
  if (b == nullptr) return nullptr;
  apply_exact(detail::fast_delta(+1, b->size, bytes, b->pool));
  ++st.num_thread_cache_hits;
  b->requested = bytes;
  b->tag = ScopedTag::current();
  live.insert(b->addr, b);
  return reinterpret_cast<void*>(b->addr);
}

bool CachingAllocator::Impl::cache_freed(Block* b) {
  ThreadCache* c = thread_cache(false);
  if (c == nullptr || c->bytes + b->size > opts.thread_cache_bytes) return false;
  const FastDelta d = detail::fast_delta(-1, b->size, b->requested, b->pool);
  if (!c->put(b, detail::round_size(b->requested))) return false;
  apply_exact(d);
  return true;
}

void CachingAllocator::Impl::fold_caches() {
  for (const auto& c : owner->caches) {
    for (int pool = 0; pool < kPoolCount; ++pool) {
      for (int k = 0; k < detail::kFastStats; ++k) {
        for (Stat* s : {&fast_stat(k, 0), &fast_stat(k, pool + 1)}) {
          s->current += c->current[pool][k];
          s->allocated += c->allocated[pool][k];
          s->freed += c->freed[pool][k];
        }
        c->current[pool][k] = c->allocated[pool][k] = c->freed[pool][k] = 0;
      }
    }
    st.num_thread_cache_hits += c->hits;
    c->hits = 0;
  }
}

// Keeps total + every cache's headroom <= peak for each statistic: where the slow path raised a
// total, leases are taken back; what is left over goes to the calling thread's cache.
void CachingAllocator::Impl::grant_headroom(ThreadCache* self) {
  if (owner->caches.empty()) return;
  for (int k = 0; k < detail::kFastStats; ++k) {
    for (int slot = 0; slot < detail::kFastSlots; ++slot) {
      const Stat& s = fast_stat(k, slot);
      std::int64_t leased = 0;
      for (const auto& c : owner->caches) leased += c->headroom[k][slot];
      std::int64_t slack = s.peak - s.current - leased;
      if (slack < 0) {
        for (const auto& c : owner->caches) c->headroom[k][slot] = 0;
        slack = s.peak - s.current;
      }
      if (self != nullptr && slack > 0) self->headroom[k][slot] += slack;
    }
  }
}

void CachingAllocator::Impl::drain_caches() {
  bool any = false;
  for (const auto& c : owner->caches) {
    for (Block* b : c->take_all()) {
      b->free_tick = ++tick;
      pool(b->pool).insert(b);
      any = true;
    }
  }
  if (any)
    for (Pool p : {Pool::small, Pool::large}) sync_split_stat(p);
}

std::size_t CachingAllocator::Impl::cached_bytes() const {
  std::size_t n = 0;
  for (const auto& c : owner->caches) n += c->bytes;
  return n;
}

void CachingAllocator::Impl::detach_caches() noexcept {
  std::lock_guard lock(mu);
  for (const auto& c : owner->caches) {
    std::lock_guard cache_lock(c->lock);
    c->take_all();  // the blocks go with their segments
    c->detached = true;
  }
  owner->caches.clear();
  owner->allocator = nullptr;
}

CachingAllocator::Impl::Exclusive::Exclusive(Impl& m) : m_(m), lock_(m.mu) {
  if (m_.owner->caches.empty()) return;
  for (const auto& c : m_.owner->caches) c->lock.lock();
  m_.fold_caches();
}

CachingAllocator::Impl::Exclusive::~Exclusive() {
  if (m_.owner->caches.empty()) return;
  m_.grant_headroom(m_.thread_cache(false));
  for (const auto& c : m_.owner->caches) c->lock.unlock();
}

}  // namespace stowage
