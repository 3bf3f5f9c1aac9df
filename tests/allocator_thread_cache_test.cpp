// The allocator's fast path: each thread's cache of blocks it freed. Statistics stay exact at
// every call (checked against a bookkeeper), peaks too when threads allocate at once, the caches
// give their blocks back (empty_cache, out of memory, thread exit), streams stay ordered, and
// snapshots see cached blocks as free.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "allocator_test_util.hpp"

namespace stowage {
namespace {

using namespace test;
using ::testing::HasSubstr;

// What the statistics must say, kept by the test from the calls it made.
struct Books {
  std::map<void*, std::pair<std::size_t, std::size_t>> live;  // requested, block size
  std::int64_t requested = 0, requested_peak = 0, blocks = 0, blocks_peak = 0, count = 0, count_peak = 0;

  void allocated(CachingAllocator& a, void* p, std::size_t bytes) {
    const std::size_t size = a.block_size(p);
    live[p] = {bytes, size};
    requested += static_cast<std::int64_t>(bytes);
    blocks += static_cast<std::int64_t>(size);
    ++count;
    requested_peak = std::max(requested_peak, requested);
    blocks_peak = std::max(blocks_peak, blocks);
    count_peak = std::max(count_peak, count);
  }
  void freed(void* p) {
    auto it = live.find(p);
    requested -= static_cast<std::int64_t>(it->second.first);
    blocks -= static_cast<std::int64_t>(it->second.second);
    --count;
    live.erase(it);
  }
  void check(const CachingAllocator& a) const {
    const AllocatorStats s = a.stats();
    EXPECT_EQ(s.requested_bytes.all.current, requested);
    EXPECT_EQ(s.requested_bytes.all.peak, requested_peak);
    EXPECT_EQ(s.allocated_bytes.all.current, blocks);
    EXPECT_EQ(s.allocated_bytes.all.peak, blocks_peak);
    EXPECT_EQ(s.allocation.all.current, count);
    EXPECT_EQ(s.allocation.all.peak, count_peak);
  }
};

TEST(ThreadCache, TheSameSizeOnOneThreadComesFromItsCache) {
  auto dev = small_device();
  CachingAllocator a(*dev);
  void* first = a.allocate(64 * KiB);
  a.deallocate(first);
  const std::int64_t reserved = a.stats().reserved_bytes.all.current;
  for (int i = 0; i < 1000; ++i) {
    void* p = a.allocate(64 * KiB);
    EXPECT_EQ(p, first);
    a.deallocate(p);
  }
  const AllocatorStats s = a.stats();
  EXPECT_EQ(s.num_thread_cache_hits, 1000);
  EXPECT_EQ(s.thread_cache_bytes, static_cast<std::int64_t>(64 * KiB));
  EXPECT_EQ(s.allocated_bytes.all.current, 0);
  EXPECT_EQ(s.allocated_bytes.all.peak, static_cast<std::int64_t>(64 * KiB));
  EXPECT_EQ(s.allocation.all.allocated, 1001);
  EXPECT_EQ(s.allocation.all.freed, 1001);
  EXPECT_EQ(s.requested_bytes.small_pool.peak, static_cast<std::int64_t>(64 * KiB));
  EXPECT_EQ(s.reserved_bytes.all.current, reserved);
  // The cached block is free memory inside a split segment.
  EXPECT_EQ(s.inactive_split_bytes.all.current, s.reserved_bytes.all.current - s.active_bytes.all.current);
}

// A random program of sizes (cached and not), streams and peak resets; the statistics agree
// with the bookkeeper after every call.
TEST(ThreadCache, StatisticsAreExactAtEveryCall) {
  for (SegmentMode mode : {SegmentMode::expandable, SegmentMode::classic}) {
    auto dev = small_device(512 * MiB);
    AllocatorOptions o;
    o.segments = mode;
    CachingAllocator a(*dev, o);
    const Stream side = dev->create_stream();
    std::mt19937_64 rng(7);
    Books books;
    std::vector<void*> order;
    const std::size_t sizes[] = {512, 1000, 4 * KiB, 64 * KiB, 1 * MiB, 3 * MiB, 5 * MiB, 12 * MiB};
    for (int step = 0; step < 1500; ++step) {
      if (order.size() < 40 && (order.empty() || rng() % 3 != 0)) {
        const std::size_t bytes = sizes[rng() % std::size(sizes)];
        void* p = a.allocate(bytes, rng() % 4 == 0 ? side : kDefaultStream);
        books.allocated(a, p, bytes);
        order.push_back(p);
      } else {
        const std::size_t i = rng() % order.size();
        a.deallocate(order[i], books.live[order[i]].first);
        books.freed(order[i]);
        order.erase(order.begin() + static_cast<std::ptrdiff_t>(i));
      }
      if (step % 500 == 499) {
        a.reset_peak_stats();
        books.requested_peak = books.requested;
        books.blocks_peak = books.blocks;
        books.count_peak = books.count;
      }
      books.check(a);
      if (::testing::Test::HasFailure()) return;
    }
    EXPECT_GT(a.stats().num_thread_cache_hits, 100) << "the program should reuse cached blocks";
    for (void* p : order) a.deallocate(p);
    dev->synchronize();
    a.empty_cache();
    EXPECT_EQ(a.stats().reserved_bytes.all.current, 0);
    dev->destroy_stream(side);
  }
}

// Threads allocate and free at once, in phases; between phases (all threads waiting) the totals
// are known, and each peak must be the largest total so far.
TEST(ThreadCache, PeaksStayExactWhenThreadsAllocateAtOnce) {
  auto dev = small_device(1024 * MiB);
  CachingAllocator a(*dev);
  constexpr int kThreads = 4;
  const int counts[] = {8, 3, 12, 5, 12, 1};
  std::barrier sync(kThreads + 1);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<void*> mine;
      for (int k : counts) {
        for (int i = 0; i < k; ++i) mine.push_back(a.allocate(256 * KiB));
        sync.arrive_and_wait();  // allocated
        sync.arrive_and_wait();  // checked
        for (void* p : mine) a.deallocate(p);
        mine.clear();
        sync.arrive_and_wait();  // freed
        sync.arrive_and_wait();  // checked
      }
    });
  }
  std::int64_t peak = 0;
  for (int k : counts) {
    sync.arrive_and_wait();
    const std::int64_t total = std::int64_t{kThreads} * k * static_cast<std::int64_t>(256 * KiB);
    peak = std::max(peak, total);
    AllocatorStats s = a.stats();
    EXPECT_EQ(s.allocated_bytes.all.current, total);
    EXPECT_EQ(s.requested_bytes.all.current, total);
    EXPECT_EQ(s.allocation.all.current, kThreads * k);
    EXPECT_EQ(s.allocated_bytes.all.peak, peak);
    EXPECT_EQ(s.requested_bytes.all.peak, peak);
    EXPECT_EQ(s.allocation.all.peak, peak / static_cast<std::int64_t>(256 * KiB));
    sync.arrive_and_wait();
    sync.arrive_and_wait();
    s = a.stats();
    EXPECT_EQ(s.allocated_bytes.all.current, 0);
    EXPECT_EQ(s.allocated_bytes.all.peak, peak);
    EXPECT_EQ(s.active_bytes.all.current, 0);
    sync.arrive_and_wait();
  }
  for (auto& t : threads) t.join();
  const AllocatorStats s = a.stats();
  EXPECT_GT(s.num_thread_cache_hits, 0);
  EXPECT_EQ(s.thread_cache_bytes, 0) << "exited threads give their caches back";
  EXPECT_EQ(s.inactive_split_bytes.all.current + s.active_bytes.all.current, s.reserved_bytes.all.current);
}

TEST(ThreadCache, ABlockFreedByAnotherThreadJoinsThatThreadsCache) {
  auto dev = small_device();
  CachingAllocator a(*dev);
  void* p = a.allocate(100 * KiB);
  std::thread([&] {
    a.deallocate(p);
    void* q = a.allocate(100 * KiB);  // from this thread's cache
    EXPECT_EQ(q, p);
    a.deallocate(q);
  }).join();
  const AllocatorStats s = a.stats();
  EXPECT_EQ(s.num_thread_cache_hits, 1);
  EXPECT_EQ(s.allocated_bytes.all.current, 0);
  EXPECT_EQ(s.thread_cache_bytes, 0);
  void* r = a.allocate(100 * KiB);  // the exited thread's block, back in the pool
  EXPECT_EQ(r, p);
  a.deallocate(r);
}

// A thread whose first call frees from a pthread key's destructor: glibc runs those after the
// C++ thread-locals' destructors, and the cache made then is given back all the same.
TEST(ThreadCache, AThreadFirstFreeingFromAKeyDestructorGivesItsCacheBack) {
  auto dev = small_device();
  CachingAllocator a(*dev);
  struct Release {
    CachingAllocator* allocator;
    void* block;
  };
  pthread_key_t key{};
  ASSERT_EQ(pthread_key_create(&key,
                               [](void* r) {
                                 auto* release = static_cast<Release*>(r);
                                 release->allocator->deallocate(release->block);
                               }),
            0);
  Release release{&a, a.allocate(100 * KiB)};
  std::thread([&] { pthread_setspecific(key, &release); }).join();
  pthread_key_delete(key);
  const AllocatorStats s = a.stats();
  EXPECT_EQ(s.allocated_bytes.all.current, 0);
  EXPECT_EQ(s.thread_cache_bytes, 0) << "the exited thread's cache was never given back";
  void* again = a.allocate(100 * KiB);  // its block, back in the pool
  EXPECT_EQ(again, release.block);
  a.deallocate(again);
}

TEST(ThreadCache, EmptyCacheGivesCachedBlocksBack) {
  auto dev = small_device();
  CachingAllocator a(*dev);
  a.deallocate(a.allocate(MiB));
  EXPECT_EQ(a.stats().thread_cache_bytes, static_cast<std::int64_t>(MiB));
  a.empty_cache();
  const AllocatorStats s = a.stats();
  EXPECT_EQ(s.thread_cache_bytes, 0);
  EXPECT_EQ(s.reserved_bytes.all.current, 0);
  EXPECT_EQ(dev->free_memory(), dev->capacity());
}

// A thread that keeps blocks in its cache does not make another thread run out of memory.
TEST(ThreadCache, OutOfMemoryFirstEmptiesEveryThreadsCache) {
  auto dev = small_device(8 * MiB);
  CachingAllocator a(*dev);
  std::mutex m;
  std::condition_variable cv;
  bool cached = false, done = false;
  std::thread keeper([&] {
    std::vector<void*> mine;
    for (int i = 0; i < 3; ++i) mine.push_back(a.allocate(2 * MiB));
    for (void* p : mine) a.deallocate(p);  // 6 MiB kept in this thread's cache
    std::unique_lock lock(m);
    cached = true;
    cv.notify_all();
    cv.wait(lock, [&] { return done; });
  });
  {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return cached; });
  }
  EXPECT_EQ(a.stats().thread_cache_bytes, static_cast<std::int64_t>(6 * MiB));
  void* big = a.allocate(7 * MiB);  // fits only with the keeper's blocks back in the pool
  EXPECT_NE(big, nullptr);
  EXPECT_EQ(a.stats().thread_cache_bytes, 0);
  a.deallocate(big);
  {
    std::lock_guard lock(m);
    done = true;
  }
  cv.notify_all();
  keeper.join();
}

TEST(ThreadCache, AThreadMayOutliveItsAllocator) {
  auto dev = small_device();
  std::mutex m;
  std::condition_variable cv;
  int stage = 0;
  auto a = std::make_unique<CachingAllocator>(*dev);
  std::thread t([&] {
    a->deallocate(a->allocate(8 * KiB));  // this thread now has a cache of a's
    std::unique_lock lock(m);
    stage = 1;
    cv.notify_all();
    cv.wait(lock, [&] { return stage == 2; });
  });  // and exits after a is gone: its cache must not touch a
  {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return stage == 1; });
  }
  a.reset();
  EXPECT_EQ(dev->free_memory(), dev->capacity());
  {
    std::lock_guard lock(m);
    stage = 2;
  }
  cv.notify_all();
  t.join();
  CachingAllocator b(*dev);  // a new allocator on this thread starts with a new cache
  b.deallocate(b.allocate(8 * KiB));
  EXPECT_EQ(b.stats().thread_cache_bytes, static_cast<std::int64_t>(8 * KiB));
}

TEST(ThreadCache, ABlockCachedForOneStreamReachesAnotherOnlyBehindAWait) {
  for (SegmentMode mode : {SegmentMode::expandable, SegmentMode::classic}) {
    auto dev = small_device();
    AllocatorOptions o;
    o.segments = mode;
    CachingAllocator a(*dev, o);
    const Stream s1 = dev->create_stream(), s2 = dev->create_stream();
    void* p = a.allocate(MiB, s1);
    void* full = a.allocate(MiB, s1);  // the 2 MiB segment (or mapping) is full: s2 can only reuse p
    a.deallocate(p);
    ASSERT_EQ(a.stats().thread_cache_bytes, static_cast<std::int64_t>(MiB)) << "p should be in the cache";
    const AllocatorStats before = a.stats();
    void* q = a.allocate(MiB, s2);
    EXPECT_EQ(q, p) << "the cached block should be reused rather than growing";
    const AllocatorStats after = a.stats();
    EXPECT_EQ(after.num_stream_waits, before.num_stream_waits + 1) << "reused on s2 without waiting for s1";
    EXPECT_EQ(after.reserved_bytes.all.current, before.reserved_bytes.all.current);
    EXPECT_EQ(after.num_thread_cache_hits, 0);
    a.deallocate(q);
    a.deallocate(full);
    dev->synchronize();
    dev->destroy_stream(s1);
    dev->destroy_stream(s2);
  }
}

// A block cached for a stream that is then destroyed: allocating on that stream is refused
// (InvalidArgument, statistics unchanged) rather than served from the cache, and the block goes
// back to serve live streams.
TEST(ThreadCache, AStreamDestroyedWhileItsBlocksAreCachedIsRefused) {
  for (SegmentMode mode : {SegmentMode::expandable, SegmentMode::classic}) {
    auto dev = small_device();
    AllocatorOptions o;
    o.segments = mode;
    CachingAllocator a(*dev, o);
    const Stream s = dev->create_stream();
    void* p = a.allocate(MiB, s);
    void* full = a.allocate(MiB, s);
    a.deallocate(p);
    void* again = a.allocate(MiB, s);  // from the cache: the fast path serves s while it lives
    EXPECT_EQ(again, p);
    a.deallocate(again);
    ASSERT_EQ(a.stats().thread_cache_bytes, static_cast<std::int64_t>(MiB));
    dev->destroy_stream(s);
    const std::string before = to_json(a.stats());
    EXPECT_THROW(a.allocate(MiB, s), InvalidArgument);
    EXPECT_EQ(to_json(a.stats()), before);
    EXPECT_THROW(a.allocate(MiB, s), InvalidArgument);  // and again, now the cache was checked
    EXPECT_EQ(to_json(a.stats()), before);
    const AllocatorStats st = a.stats();
    void* q = a.allocate(MiB);  // the default stream takes the block back
    EXPECT_EQ(q, p);
    EXPECT_EQ(a.stats().reserved_bytes.all.current, st.reserved_bytes.all.current);
    EXPECT_EQ(a.stats().thread_cache_bytes, 0);
    a.deallocate(q);
    a.deallocate(full);
    // Freed into the cache for the default stream: the fast path serves it again.
    const std::int64_t hits = a.stats().num_thread_cache_hits;
    a.deallocate(a.allocate(MiB));
    void* r = a.allocate(MiB);
    EXPECT_GT(a.stats().num_thread_cache_hits, hits);
    a.deallocate(r);
  }
}

// Another thread destroys the stream a thread keeps blocks for: that thread's next allocation on
// it is refused, and its cached blocks serve the default stream (for any thread).
TEST(ThreadCache, AStreamDestroyedByAnotherThreadIsRefused) {
  auto dev = small_device();
  CachingAllocator a(*dev);
  const Stream s = dev->create_stream();
  std::mutex m;
  std::condition_variable cv;
  int stage = 0;
  void* p = nullptr;
  bool refused = false;
  std::thread t([&] {
    void* full = a.allocate(MiB, s);
    p = a.allocate(MiB, s);
    a.deallocate(p);
    a.deallocate(a.allocate(MiB, s));  // served from this thread's cache
    {
      std::unique_lock lock(m);
      stage = 1;
      cv.notify_all();
      cv.wait(lock, [&] { return stage == 2; });
    }
    try {
      a.allocate(MiB, s);
    } catch (const InvalidArgument&) {
      refused = true;
    }
    a.deallocate(full);
  });
  {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return stage == 1; });
  }
  dev->destroy_stream(s);
  {
    std::lock_guard lock(m);
    stage = 2;
  }
  cv.notify_all();
  t.join();
  EXPECT_TRUE(refused) << "the fast path served a stream another thread destroyed";
  const std::int64_t reserved = a.stats().reserved_bytes.all.current;
  void* q = a.allocate(MiB);  // the exited thread's blocks went back to the pools
  EXPECT_EQ(a.stats().reserved_bytes.all.current, reserved);
  a.deallocate(q);
  EXPECT_EQ(a.stats().allocated_bytes.all.current, 0);
}

// Blocks freed on a stream after another thread destroyed it still go through the thread's cache;
// the cache is checked again before the fast path serves that stream.
TEST(ThreadCache, ABlockFreedOnADestroyedStreamIsNotServedForIt) {
  auto dev = small_device();
  CachingAllocator a(*dev);
  const Stream s = dev->create_stream();
  a.deallocate(a.allocate(64 * KiB));  // the cache checks its streams at this epoch...
  void* p = a.allocate(64 * KiB, s);
  dev->destroy_stream(s);
  a.deallocate(a.allocate(64 * KiB));  // ...and at the new one
  a.deallocate(p);                     // p is kept for s, a stream the cache has not checked
  const std::string before = to_json(a.stats());
  EXPECT_THROW(a.allocate(64 * KiB, s), InvalidArgument);
  EXPECT_EQ(to_json(a.stats()), before);
}

TEST(ThreadCache, SnapshotsShowCachedBlocksAsFree) {
  auto dev = small_device();
  CachingAllocator a(*dev);
  ScopedTag tag("layer0.mlp");
  void* kept = a.allocate(4 * KiB);
  void* gone = a.allocate(16 * KiB);
  a.deallocate(gone);
  const Snapshot snap = a.snapshot();
  EXPECT_EQ(snap.stats.thread_cache_bytes, static_cast<std::int64_t>(16 * KiB));
  int allocated = 0;
  for (const auto& seg : snap.segments)
    for (const auto& b : seg.blocks) {
      if (b.address == reinterpret_cast<std::uintptr_t>(gone)) {
        EXPECT_EQ(b.state, BlockState::inactive);
        EXPECT_EQ(b.tag, "");
      }
      if (b.state == BlockState::active_allocated) {
        ++allocated;
        EXPECT_EQ(b.address, reinterpret_cast<std::uintptr_t>(kept));
        EXPECT_EQ(b.tag, "layer0.mlp");
      }
    }
  EXPECT_EQ(allocated, 1);
  a.deallocate(kept);
}

TEST(ThreadCache, ADoubleFreeOfACachedBlockIsRefused) {
  auto dev = small_device();
  CachingAllocator a(*dev);
  void* p = a.allocate(32 * KiB);
  a.deallocate(p);
  const std::string before = to_json(a.stats());
  try {
    a.deallocate(p);
    ADD_FAILURE() << "double free not detected";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("double free"));
  }
  EXPECT_EQ(to_json(a.stats()), before);
}

// A cached block stays filed by address (the fast path skips the map), so every lookup must see
// that it is not live: the ownership check, its size, record_stream, a free from another thread
// and a free of a block that went back to its pool; handed out again, it is live once more.
TEST(ThreadCache, ACachedBlockIsNotLiveToAnyLookup) {
  auto dev = small_device();
  CachingAllocator a(*dev);
  void* p = a.allocate(32 * KiB);
  EXPECT_TRUE(a.owns(p));
  a.deallocate(p);
  ASSERT_EQ(a.stats().thread_cache_bytes, static_cast<std::int64_t>(32 * KiB));
  EXPECT_FALSE(a.owns(p));
  EXPECT_THROW(a.block_size(p), InvalidArgument);
  const Stream side = dev->create_stream();
  EXPECT_THROW(a.record_stream(p, side), InvalidArgument);
  std::thread other([&] {
    try {
      a.deallocate(p);
      ADD_FAILURE() << "a free from another thread of a cached block was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(std::string(e.what()), HasSubstr("kept in a thread's cache"));
    }
  });
  other.join();
  void* q = a.allocate(32 * KiB);  // the same block, from the cache
  ASSERT_EQ(q, p);
  EXPECT_TRUE(a.owns(q));
  EXPECT_EQ(a.block_size(q), 32 * KiB);
  a.deallocate(q);
  a.empty_cache();  // back to its pool, and out of the map
  EXPECT_FALSE(a.owns(p));
  try {
    a.deallocate(p);
    ADD_FAILURE() << "a free of memory back in its pool was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("given back to the device"));  // by empty_cache
  }
  EXPECT_EQ(a.stats().allocation.all.current, 0);
}

// A snapshot trace must be complete, so it turns the caches off.
TEST(ThreadCache, ATraceTurnsTheCachesOff) {
  auto dev = small_device();
  AllocatorOptions o;
  o.trace_entries = 100;
  CachingAllocator a(*dev, o);
  for (int i = 0; i < 5; ++i) a.deallocate(a.allocate(8 * KiB));
  const Snapshot snap = a.snapshot();
  EXPECT_EQ(snap.stats.num_thread_cache_hits, 0);
  int allocs = 0, frees = 0;
  for (const auto& e : snap.trace) {
    allocs += e.action == TraceAction::alloc;
    frees += e.action == TraceAction::free_completed;
  }
  EXPECT_EQ(allocs, 5);
  EXPECT_EQ(frees, 5);
}

TEST(ThreadCache, OptionsBoundTheCache) {
  auto dev = small_device();
  AllocatorOptions o = parse_allocator_options("thread_cache_mb:1,thread_cache_max_block_kb:128");
  EXPECT_EQ(o.thread_cache_bytes, MiB);
  EXPECT_EQ(o.thread_cache_max_block, 128 * KiB);
  CachingAllocator a(*dev, o);
  a.deallocate(a.allocate(256 * KiB));  // above the block bound: back to the pool
  EXPECT_EQ(a.stats().thread_cache_bytes, 0);
  std::vector<void*> blocks;
  for (int i = 0; i < 12; ++i) blocks.push_back(a.allocate(100 * KiB));
  for (void* p : blocks) a.deallocate(p);
  EXPECT_LE(a.stats().thread_cache_bytes, static_cast<std::int64_t>(MiB));
  EXPECT_GT(a.stats().thread_cache_bytes, 0);
  CachingAllocator off(*dev, parse_allocator_options("thread_cache_mb:0"));
  off.deallocate(off.allocate(4 * KiB));
  EXPECT_EQ(off.stats().thread_cache_bytes, 0);
}

}  // namespace
}  // namespace stowage
