// The pinned NUMA-aware host pool, on both backends (jemalloc arena, builtin size classes).
#include <gtest/gtest.h>
#include <numaif.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "offload/extent_source.hpp"
#include "stowage/emulated_device.hpp"
#include "stowage/host_pool.hpp"

namespace stowage {
namespace {

std::uint64_t hash_bytes(const void* p, std::size_t n) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 1099511628211ull;
  return h;
}

void fill(void* p, std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  auto* b = static_cast<unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>(rng());
}

// The byte-valued statistics, for "nothing changed" comparisons.
auto bytes_of(const HostPoolStats& s) {
  std::vector<std::size_t> v{s.pinned_bytes, s.in_use_bytes, s.requested_bytes, s.live_buffers};
  for (const auto& n : s.nodes)
    v.insert(v.end(), {static_cast<std::size_t>(n.node + 1), n.pinned_bytes, n.in_use_bytes});
  return v;
}

class HostPoolTest : public ::testing::TestWithParam<HostPoolBackend> {
 protected:
  void SetUp() override {
    if (GetParam() == HostPoolBackend::jemalloc && !jemalloc_in_process())
      GTEST_SKIP() << "jemalloc is not linked into this executable (STOWAGE_LINK_JEMALLOC=OFF, e.g. sanitizer builds)";
    EmulatedOptions o;
    o.capacity = std::size_t{64} << 20;
    device_ = make_emulated_device(0, o);
  }
  HostPoolOptions options(std::size_t cap = 0) {
    HostPoolOptions o;
    o.backend = GetParam();
    o.cap_bytes = cap;
    return o;
  }
  std::unique_ptr<Device> device_;
};

TEST_P(HostPoolTest, ReportsTheBackendInUse) {
  HostPool pool(*device_, options());
  EXPECT_EQ(pool.backend(), GetParam());
  EXPECT_EQ(pool.stats().backend, to_string(GetParam()));
}

TEST_P(HostPoolTest, ContentsSurviveAndEveryLiveBufferIsPinned) {
  HostPool pool(*device_, options());
  std::mt19937 rng(7);
  struct Buf {
    void* p;
    std::size_t n;
    std::uint64_t h;
  };
  std::vector<Buf> bufs;
  for (int i = 0; i < 200; ++i) {
    const std::size_t n = std::size_t{1} << std::uniform_int_distribution<int>(4, 22)(rng);  // 16 B .. 4 MiB
    const std::size_t size = n + rng() % n;
    void* p = pool.allocate(size);
    ASSERT_NE(p, nullptr);
    fill(p, size, i);
    bufs.push_back({p, size, hash_bytes(p, size)});
    EXPECT_GE(pool.usable_size(p), size);
    EXPECT_TRUE(device_->is_pinned(p));
    EXPECT_TRUE(device_->is_pinned(static_cast<char*>(p) + size - 1));
  }
  const auto s = pool.stats();
  EXPECT_EQ(s.live_buffers, bufs.size());
  EXPECT_EQ(s.requested_bytes, std::accumulate(bufs.begin(), bufs.end(), std::size_t{0},
                                               [](std::size_t a, const Buf& b) { return a + b.n; }));
  EXPECT_GE(s.pinned_bytes, s.in_use_bytes);
  EXPECT_EQ(device_->counters().pinned_host, s.pinned_bytes);
  std::shuffle(bufs.begin(), bufs.end(), rng);
  for (const auto& b : bufs) {
    EXPECT_EQ(hash_bytes(b.p, b.n), b.h);
    pool.deallocate(b.p);
  }
  EXPECT_EQ(pool.stats().in_use_bytes, 0u);
  EXPECT_EQ(pool.stats().live_buffers, 0u);
}

TEST_P(HostPoolTest, ReuseDoesNotPinAgain) {
  HostPool pool(*device_, options());
  pool.deallocate(pool.allocate(std::size_t{3} << 20));
  pool.deallocate(pool.allocate(1000));
  const auto warm = pool.stats();
  for (int i = 0; i < 1000; ++i) {
    void* a = pool.allocate(std::size_t{3} << 20);
    void* b = pool.allocate(1000);
    pool.deallocate(a);
    pool.deallocate(b);
  }
  const auto s = pool.stats();
  EXPECT_EQ(s.num_maps, warm.num_maps);
  EXPECT_EQ(s.pinned_bytes, warm.pinned_bytes);
  EXPECT_EQ(s.num_allocs, warm.num_allocs + 2000);
}

TEST_P(HostPoolTest, PagesLieOnTheDevicesNodeAndAreAccountedThere) {
  HostPool pool(*device_, options());
  const auto& nearest = device_->properties().numa_nodes;
  std::vector<void*> bufs;
  for (std::size_t n : {std::size_t{100}, std::size_t{64} << 10, std::size_t{5} << 20})
    bufs.push_back(pool.allocate(n));
  const auto s = pool.stats();
  std::size_t pinned = 0, in_use = 0;
  for (const auto& n : s.nodes) {
    pinned += n.pinned_bytes;
    in_use += n.in_use_bytes;
  }
  EXPECT_EQ(pinned, s.pinned_bytes);
  EXPECT_EQ(in_use, s.in_use_bytes);
  for (void* p : bufs) {
    const int actual = offload::numa_node_of_page(p);
    if (actual < 0) GTEST_SKIP() << "get_mempolicy(MPOL_F_ADDR) is not available here";
    EXPECT_EQ(pool.node_of(p), actual);
    if (!nearest.empty() && s.numa_bound) EXPECT_EQ(actual, nearest.front());
  }
  for (void* p : bufs) pool.deallocate(p);
}

TEST_P(HostPoolTest, BindsToTheNodesAskedFor) {
  const auto present = offload::numa_nodes_present();
  if (present.empty()) GTEST_SKIP() << "no NUMA support on this machine";
  auto o = options();
  o.numa_nodes = {present.back()};
  HostPool pool(*device_, o);
  void* p = pool.allocate(std::size_t{4} << 20);
  EXPECT_TRUE(pool.stats().numa_bound);
  for (std::size_t off = 0; off < (std::size_t{4} << 20); off += 4096)
    ASSERT_EQ(offload::numa_node_of_page(static_cast<char*>(p) + off), present.back()) << "offset " << off;
  const auto s = pool.stats();
  ASSERT_EQ(s.nodes.size(), 1u);
  EXPECT_EQ(s.nodes[0].node, present.back());
  EXPECT_EQ(s.nodes[0].in_use_bytes, s.in_use_bytes);
  pool.deallocate(p);
}

TEST_P(HostPoolTest, RejectsANodeThatDoesNotExist) {
  auto o = options();
  o.numa_nodes = {4000};
  EXPECT_THROW(HostPool(*device_, o), InvalidArgument);
}

TEST_P(HostPoolTest, CapExhaustionThrowsAndChangesNothing) {
  const std::size_t cap = std::size_t{16} << 20, block = std::size_t{1} << 20;
  HostPool pool(*device_, options(cap));
  std::vector<std::pair<void*, std::uint64_t>> live;
  for (;;) {
    const auto before = pool.stats();
    void* p = nullptr;
    try {
      p = pool.allocate(block);
    } catch (const OutOfMemory& e) {
      EXPECT_NE(std::string(e.what()).find("cap"), std::string::npos);
      EXPECT_EQ(bytes_of(pool.stats()), bytes_of(before));
      EXPECT_EQ(pool.stats().num_ooms, before.num_ooms + 1);
      break;
    }
    fill(p, block, static_cast<std::uint32_t>(live.size()));
    live.emplace_back(p, hash_bytes(p, block));
    ASSERT_LE(pool.stats().pinned_bytes, cap);
    ASSERT_LT(live.size(), 64u) << "the cap was never reached";
  }
  // Most of the cap holds buffers (jemalloc also keeps its arena's metadata and a page of padding
  // per large buffer in the pool's pages).
  EXPECT_GE(live.size(), GetParam() == HostPoolBackend::builtin ? 16u : 7u);
  for (auto& [p, h] : live) EXPECT_EQ(hash_bytes(p, block), h);
  pool.deallocate(live.back().first);
  live.pop_back();
  void* again = pool.allocate(block);  // room again after a free
  EXPECT_NE(again, nullptr);
  pool.deallocate(again);
  for (auto& [p, h] : live) pool.deallocate(p);
}

// A size no host has is out of memory like any other refusal (it was an InvalidArgument past
// 2^46 bytes and an OutOfMemory below): counted, and nothing else changes.
TEST_P(HostPoolTest, HugeRequestsAreOutOfMemoryOnBothSidesOfTheLimit) {
  HostPool pool(*device_, options(std::size_t{16} << 20));
  void* p = pool.allocate(4096);
  const auto before = pool.stats();
  const std::size_t sizes[] = {std::size_t{1} << 45, std::size_t{1} << 46, (std::size_t{1} << 46) + 1,
                               std::size_t{1} << 62, ~std::size_t{0}};
  std::uint64_t ooms = before.num_ooms;
  for (std::size_t bytes : sizes) {
    try {
      pool.allocate(bytes);
      ADD_FAILURE() << bytes << " bytes were handed out";
    } catch (const OutOfMemory& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(bytes) + " bytes"), std::string::npos) << e.what();
    }
    EXPECT_EQ(pool.stats().num_ooms, ++ooms);
  }
  EXPECT_EQ(bytes_of(pool.stats()), bytes_of(before));
  pool.deallocate(p);
}

TEST_P(HostPoolTest, ReleaseUnusedUnpinsEverythingOnceEmpty) {
  const std::size_t device_pinned_at_start = device_->counters().pinned_host;
  HostPool pool(*device_, options());
  std::vector<void*> bufs;
  for (int i = 0; i < 8; ++i) bufs.push_back(pool.allocate((std::size_t{1} << 20) * (i + 1)));
  for (int i = 0; i < 50; ++i) bufs.push_back(pool.allocate(3000));
  EXPECT_GT(pool.stats().pinned_bytes, 0u);
  for (void* p : bufs) pool.deallocate(p);
  const std::size_t pinned = pool.stats().pinned_bytes;
  EXPECT_EQ(pool.release_unused(), pinned);
  EXPECT_EQ(pool.stats().pinned_bytes, 0u);
  EXPECT_TRUE(pool.stats().nodes.empty());
  EXPECT_EQ(device_->counters().pinned_host, device_pinned_at_start);
  void* p = pool.allocate(12345);  // usable again afterwards
  EXPECT_TRUE(device_->is_pinned(p));
  pool.deallocate(p);
}

TEST_P(HostPoolTest, DestroyingThePoolUnpinsItsPages) {
  const std::size_t at_start = device_->counters().pinned_host;
  {
    HostPool pool(*device_, options());
    pool.deallocate(pool.allocate(std::size_t{6} << 20));
    EXPECT_GT(device_->counters().pinned_host, at_start);
  }
  EXPECT_EQ(device_->counters().pinned_host, at_start);
}

TEST_P(HostPoolTest, BadFreesThrowAndChangeNothing) {
  HostPool pool(*device_, options());
  void* p = pool.allocate(4096);
  const auto before = pool.stats();
  int local = 0;
  EXPECT_THROW(pool.deallocate(&local), InvalidArgument);
  EXPECT_THROW(pool.deallocate(static_cast<char*>(p) + 8), InvalidArgument);
  EXPECT_THROW((void)pool.usable_size(&local), InvalidArgument);
  EXPECT_EQ(bytes_of(pool.stats()), bytes_of(before));
  pool.deallocate(p);
  EXPECT_THROW(pool.deallocate(p), InvalidArgument);  // double free
  EXPECT_EQ(pool.stats().in_use_bytes, 0u);
  EXPECT_EQ(pool.allocate(0), nullptr);
  pool.deallocate(nullptr);  // a no-op
}

TEST_P(HostPoolTest, ThreadsShareThePool) {
  HostPool pool(*device_, options());
  auto work = [&](std::uint32_t seed, int* bad) {
    std::mt19937 rng(seed);
    std::vector<std::pair<void*, std::size_t>> mine;
    for (int i = 0; i < 400; ++i) {
      if (!mine.empty() && rng() % 2) {
        auto [p, n] = mine.back();
        mine.pop_back();
        if (static_cast<unsigned char*>(p)[n - 1] != static_cast<unsigned char>(seed)) ++*bad;
        pool.deallocate(p);
      } else {
        const std::size_t n = 64 + rng() % (std::size_t{1} << 20);
        void* p = pool.allocate(n);
        std::memset(p, static_cast<int>(seed & 0xff), n);
        mine.emplace_back(p, n);
      }
    }
    for (auto [p, n] : mine) pool.deallocate(p);
  };
  int bad1 = 0, bad2 = 0;
  std::thread t1(work, 11u, &bad1), t2(work, 22u, &bad2);
  t1.join();
  t2.join();
  EXPECT_EQ(bad1 + bad2, 0);
  EXPECT_EQ(pool.stats().in_use_bytes, 0u);
}

// The builtin backend also gives back pages while other buffers live.
TEST(HostPoolBuiltin, ReleaseUnusedKeepsLiveBuffers) {
  auto device = make_emulated_device(0, EmulatedOptions{});
  HostPoolOptions o;
  o.backend = HostPoolBackend::builtin;
  HostPool pool(*device, o);
  const std::size_t big = std::size_t{4} << 20;
  void* a = pool.allocate(big);
  void* b = pool.allocate(big);
  fill(b, big, 3);
  const auto hb = hash_bytes(b, big);
  pool.deallocate(a);
  const std::size_t before = pool.stats().pinned_bytes;
  EXPECT_EQ(pool.release_unused(), big);
  EXPECT_EQ(pool.stats().pinned_bytes, before - big);
  EXPECT_TRUE(device->is_pinned(b));
  EXPECT_FALSE(device->is_pinned(a));
  EXPECT_EQ(hash_bytes(b, big), hb);
  pool.deallocate(b);
}

TEST(HostPoolBackendChoice, AutomaticPicksJemallocExactlyWhenItIsLoaded) {
  auto device = make_emulated_device(0, EmulatedOptions{});
  HostPool pool(*device);
  EXPECT_EQ(pool.backend(), jemalloc_in_process() ? HostPoolBackend::jemalloc : HostPoolBackend::builtin);
  if (!jemalloc_in_process()) {
    HostPoolOptions o;
    o.backend = HostPoolBackend::jemalloc;
    EXPECT_THROW(HostPool(*device, o), Unsupported);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, HostPoolTest, ::testing::Values(HostPoolBackend::jemalloc, HostPoolBackend::builtin),
                         [](const auto& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace stowage
