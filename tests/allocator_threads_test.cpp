// Several threads allocate and free on several streams at once; every live block carries a
// canary pattern that must survive until its free (no two live blocks overlap).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "allocator_test_util.hpp"

namespace stowage {
namespace {

using namespace test;

struct Live {
  unsigned char* p;
  std::size_t n;
  unsigned char mark;
};

void fill(const Live& b) {
  std::memset(b.p, b.mark, std::min<std::size_t>(b.n, 256));
  std::memset(b.p + b.n - std::min<std::size_t>(b.n, 256), b.mark, std::min<std::size_t>(b.n, 256));
}

bool intact(const Live& b) {
  const std::size_t k = std::min<std::size_t>(b.n, 256);
  for (std::size_t i = 0; i < k; ++i) {
    if (b.p[i] != b.mark || b.p[b.n - 1 - i] != b.mark) return false;
  }
  return true;
}

void run_threads(SegmentMode mode) {
  auto dev = small_device();
  AllocatorOptions o;
  o.segments = mode;
  CachingAllocator a(*dev, o);
  constexpr int kThreads = 4, kSteps = 3000;
  std::vector<Stream> streams{kDefaultStream, dev->create_stream(), dev->create_stream(), dev->create_stream()};
  std::atomic<int> corrupted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(1234 + t);
      std::vector<Live> live;
      const Stream mine = streams[t];
      for (int i = 0; i < kSteps; ++i) {
        if (live.size() < 24 && (live.empty() || rng() % 2)) {
          const std::size_t n = std::size_t{1} << (rng() % 22);  // 1 B .. 2 MiB
          auto* p = static_cast<unsigned char*>(a.allocate(n, mine));
          Live b{p, n, static_cast<unsigned char>(t * 61 + i)};
          fill(b);
          if (rng() % 8 == 0) a.record_stream(p, streams[(t + 1) % kThreads]);
          live.push_back(b);
        } else {
          const std::size_t k = rng() % live.size();
          if (!intact(live[k])) ++corrupted;
          a.deallocate(live[k].p, live[k].n);
          live[k] = live.back();
          live.pop_back();
        }
      }
      for (const Live& b : live) {
        if (!intact(b)) ++corrupted;
        a.deallocate(b.p);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(corrupted.load(), 0);
  AllocatorStats st = a.stats();
  EXPECT_EQ(st.allocated_bytes.all.current, 0);
  EXPECT_EQ(st.allocation.all.current, 0);
  EXPECT_EQ(st.allocation.all.allocated, st.allocation.all.freed);
  a.empty_cache();
  st = a.stats();
  EXPECT_EQ(st.active_bytes.all.current, 0);
  EXPECT_EQ(st.reserved_bytes.all.current, 0);
  EXPECT_EQ(dev->counters().physical_allocated + dev->counters().raw_allocated, 0u);
  for (std::size_t i = 1; i < streams.size(); ++i) dev->destroy_stream(streams[i]);
}

TEST(AllocatorThreads, ExpandableNoOverlap) { run_threads(SegmentMode::expandable); }
TEST(AllocatorThreads, ClassicNoOverlap) { run_threads(SegmentMode::classic); }

}  // namespace
}  // namespace stowage
