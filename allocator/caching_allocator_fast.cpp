// The threads' caches: the fast path that takes no device-wide lock, and how the slow path keeps
// statistics exact around it (the leases of thread_cache.hpp).
//
// Locks, always taken in this order: mu, then thread caches' locks, then live-map shards. A fast
// operation holds its own cache's lock and at most one shard's.
#include <algorithm>
#include <memory>
#include <new>

#include "allocator/caching_allocator_impl.hpp"
#include "allocator/size_classes.hpp"
#include "common/thread_exit_key.hpp"

namespace stowage {

using detail::Block;
using detail::ThreadCache;

namespace {

struct TlsEntry {
  std::shared_ptr<detail::CacheOwner> owner;
  std::shared_ptr<ThreadCache> cache;
};

// The cache the thread used last, and for which allocator: one thread-local access on the hot
// path (a thread-local with no destructor needs no guard). `owner` stays alive while an entry of
// the thread's caches names it, and the memo is cleared whenever entries go. `exited`: the
// thread's caches were given back (a later destructor that frees takes the slow path).
struct TlsMemo {
  const detail::CacheOwner* owner;
  ThreadCache* cache;
  bool exited;
};
thread_local TlsMemo tls_memo{};

// A thread's caches, one per allocator it used; given back to their allocators when it exits.
struct TlsCaches {
  std::vector<TlsEntry> entries;
  void retire_all() {
    for (TlsEntry& e : entries) {
      if (forked_since(e.owner->generation)) continue;  // a parent's: its locks may be held for ever
      std::lock_guard lock(e.owner->mu);
      if (e.owner->allocator != nullptr) e.owner->retire(e.owner->allocator, e.cache);
    }
  }
};

// Given back by a pthread key's destructor, not a thread_local's (common/thread_exit_key.hpp): a
// thread whose first call comes from a key destructor (a client's thread-exit hook freeing a
// block) would otherwise keep its cache for ever. (The caches stay valid while C++ thread_locals
// die.)
void give_back_thread_caches(void* caches) {
  tls_memo = {nullptr, nullptr, true};
  auto* c = static_cast<TlsCaches*>(caches);
  c->retire_all();
  delete c;
}

pthread_key_t thread_caches_key() {
  static const pthread_key_t key = make_thread_exit_key(give_back_thread_caches);
  return key;
}

// The thread's caches, made on first use; nullptr once given back.
TlsCaches* thread_caches_of_this_thread(bool create) {
  auto* c = static_cast<TlsCaches*>(pthread_getspecific(thread_caches_key()));
  if (c != nullptr || !create || tls_memo.exited) return c;
  auto fresh = std::make_unique<TlsCaches>();
  if (pthread_setspecific(thread_caches_key(), fresh.get()) != 0) throw std::bad_alloc();
  return fresh.release();
}

}  // namespace

// As in an Exclusive section, but without granting: the exiting thread's lease lapses (the
// invariant holds with less headroom), and its blocks go back to their pools. mu is held.
void CachingAllocator::Impl::retire_cache(void* allocator, const std::shared_ptr<ThreadCache>& cache) {
  Impl& m = *static_cast<Impl*>(allocator);
  for (const auto& c : m.owner->caches) c->lock.lock();
  m.fold_caches();
  for (Block* b : cache->take_all()) {
    m.uncache(b);
    b->free_tick = ++m.tick;
    m.pool(b->pool).insert(b);
  }
  for (Pool p : {Pool::small, Pool::large}) m.sync_split_stat(p);
  cache->revoke_headroom();
  cache->detached = true;
  for (const auto& c : m.owner->caches) c->lock.unlock();
  std::erase(m.owner->caches, cache);
}

ThreadCache* CachingAllocator::Impl::thread_cache(bool create) {
  const TlsMemo& memo = tls_memo;
  if (memo.owner == owner.get()) [[likely]]
    return memo.cache;
  return find_thread_cache(create);
}

ThreadCache* CachingAllocator::Impl::find_thread_cache(bool create) {
  TlsMemo& memo = tls_memo;
  if (memo.exited) return nullptr;
  TlsCaches* caches = thread_caches_of_this_thread(create && thread_caches);
  if (caches == nullptr) return nullptr;
  auto& entries = caches->entries;
  for (TlsEntry& e : entries) {
    if (e.owner == owner) {
      memo = {e.owner.get(), e.cache.get(), false};
      return e.cache.get();
    }
  }
  if (!create || !thread_caches) return nullptr;
  // Forget caches of allocators that are gone, and, unlocked, those of a parent process's.
  memo = {};
  std::erase_if(entries, [](TlsEntry& e) {
    if (forked_since(e.owner->generation)) return true;
    std::lock_guard lock(e.cache->lock);
    return e.cache->detached;
  });
  auto cache = std::make_shared<ThreadCache>();
  {
    std::lock_guard lock(mu);
    owner->caches.push_back(cache);
  }
  entries.push_back({owner, cache});
  memo = {owner.get(), cache.get(), false};
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
  b->cached.store(false, std::memory_order_release);  // live again: it never left `live`
  return reinterpret_cast<void*>(b->addr);
}

bool CachingAllocator::Impl::fast_free(Block* b) {
  ThreadCache* c = thread_cache(true);
  if (c == nullptr) return false;
  std::lock_guard lock(c->lock);
  const std::size_t key = detail::round_size(b->requested);
  if (c->bytes + b->size > opts.thread_cache_bytes) return false;
  ThreadCache::Bin* bin = c->find(b->stream, key);
  if (bin == nullptr && !c->can_put(b->stream, key)) return false;
  if (!c->lease_free(b->size, b->requested, b->pool)) return false;
  if (bin != nullptr) c->push(*bin, b);
  else c->put(b, key);
  return true;
}

void CachingAllocator::Impl::uncache(Block* b) {
  live.erase(b->addr);
  b->cached.store(false, std::memory_order_relaxed);
}

void CachingAllocator::Impl::check_cached_streams(ThreadCache& c) {
  const std::uint64_t epoch = device.stream_epoch();  // before the checks: a later destroy shows
  if (c.streams_current(epoch)) return;
  const std::vector<Block*> gone = c.take_streams([&](Stream s) { return !stream_alive(s); });
  for (Block* b : gone) {
    uncache(b);
    b->free_tick = ++tick;
    pool(b->pool).insert(b);
  }
  if (!gone.empty())
    for (Pool p : {Pool::small, Pool::large}) sync_split_stat(p);
  c.stream_epoch = epoch;
}

void CachingAllocator::Impl::apply_exact(bool handed_out, const Block& b, std::size_t requested) {
  const auto s = static_cast<std::int64_t>(b.size), r = static_cast<std::int64_t>(requested);
  if (handed_out) {
    st.allocated_bytes.add(b.pool, s);
    st.active_bytes.add(b.pool, s);
    st.requested_bytes.add(b.pool, r);
    st.allocation.add(b.pool, 1);
    st.inactive_split_bytes.sub(b.pool, s);
  } else {
    st.allocated_bytes.sub(b.pool, s);
    st.active_bytes.sub(b.pool, s);
    st.requested_bytes.sub(b.pool, r);
    st.allocation.sub(b.pool, 1);
    st.inactive_split_bytes.add(b.pool, s);
  }
}

void* CachingAllocator::Impl::hand_out_cached(std::size_t bytes, std::size_t rounded, Stream stream) {
  ThreadCache* c = thread_cache(false);
  if (c == nullptr) return nullptr;
  Block* b = c->take(stream, rounded);
  if (b == nullptr) return nullptr;
  apply_exact(true, *b, bytes);
  ++st.num_thread_cache_hits;
  b->requested = bytes;
  b->tag = ScopedTag::current();
  b->cached.store(false, std::memory_order_release);
  return reinterpret_cast<void*>(b->addr);
}

bool CachingAllocator::Impl::cache_freed(Block* b) {
  ThreadCache* c = thread_cache(false);
  if (c == nullptr || c->bytes + b->size > opts.thread_cache_bytes) return false;
  if (!c->put(b, detail::round_size(b->requested))) return false;
  apply_exact(false, *b, b->requested);
  return true;
}

void CachingAllocator::Impl::fold_caches() {
  for (const auto& c : owner->caches) {
    for (int p = 0; p < kPoolCount; ++p) {
      detail::FastMoves& mv = c->moves[p];
      if (mv.count_in == 0 && mv.count_out == 0) continue;  // every fast move counts one block
      const auto pool = static_cast<Pool>(p);
      const auto move = [&](StatArray& a, std::int64_t in, std::int64_t out) {
        for (Stat* s : {&a.all, &a.of(pool)}) {
          s->current += in - out;
          s->allocated += in;
          s->freed += out;
        }
      };
      move(st.allocated_bytes, mv.bytes_in, mv.bytes_out);
      move(st.active_bytes, mv.bytes_in, mv.bytes_out);
      move(st.inactive_split_bytes, mv.bytes_out, mv.bytes_in);
      move(st.requested_bytes, mv.requested_in, mv.requested_out);
      move(st.allocation, mv.count_in, mv.count_out);
      mv = {};
    }
    st.num_thread_cache_hits += c->hits;
    c->hits = 0;
  }
}

// Keeps total + every cache's headroom <= peak for each statistic a lease bounds: where the slow
// path raised a total, leases are taken back; what is left over goes to the calling thread's cache.
// Straight-line over the 4 x 3 leases: every slow operation with a thread cache runs it.
void CachingAllocator::Impl::grant_headroom(ThreadCache* self) {
  using detail::kFastSlots;
  using detail::kLeaseKinds;
  const auto& caches = owner->caches;
  if (caches.empty()) return;
  std::int64_t room[kLeaseKinds][kFastSlots];  // the least peak - current of what each lease bounds
  const auto least = [](const StatArray& a, int slot) {
    const Stat& s = slot == 0 ? a.all : a.of(static_cast<Pool>(slot - 1));
    return s.peak - s.current;
  };
  for (int slot = 0; slot < kFastSlots; ++slot) {
    room[detail::kLeaseBytes][slot] = std::min(least(st.allocated_bytes, slot), least(st.active_bytes, slot));
    room[detail::kLeaseRequested][slot] = least(st.requested_bytes, slot);
    room[detail::kLeaseCount][slot] = least(st.allocation, slot);
    room[detail::kLeaseInactive][slot] = least(st.inactive_split_bytes, slot);
  }
  std::int64_t leased[kLeaseKinds][kFastSlots] = {};
  for (const auto& c : caches)
    for (int lease = 0; lease < kLeaseKinds; ++lease)
      for (int slot = 0; slot < kFastSlots; ++slot) leased[lease][slot] += c->headroom[lease][slot];
  for (int lease = 0; lease < kLeaseKinds; ++lease) {
    for (int slot = 0; slot < kFastSlots; ++slot) {
      std::int64_t slack = room[lease][slot] - leased[lease][slot];
      if (slack < 0) {
        for (const auto& c : caches) c->headroom[lease][slot] = 0;
        slack = room[lease][slot];
      }
      if (self != nullptr && slack > 0) self->headroom[lease][slot] += slack;
    }
  }
}

void CachingAllocator::Impl::drain_caches() {
  bool any = false;
  for (const auto& c : owner->caches) {
    for (Block* b : c->take_all()) {
      uncache(b);
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
    for (Block* b : c->take_all()) uncache(b);  // the blocks go with their segments
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
