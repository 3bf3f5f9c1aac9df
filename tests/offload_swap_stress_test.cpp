// The swap scheduler at work while other threads allocate and free from the same allocator on
// their own streams: swapped tensors come back bit-identical, the other threads' live blocks keep
// their bytes, and afterwards every device and host byte is accounted for. Run under TSan in CI.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "offload_test_util.hpp"
#include "stowage/allocator.hpp"
#include "stowage/emulated_device.hpp"
#include "stowage/host_pool.hpp"
#include "stowage/swap.hpp"

namespace stowage {
namespace {

using namespace stowage::testing;

constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;

// Allocates and frees random sizes on its own stream until `stop`; each live block holds a
// pattern written on that stream and checked (on the stream) before its free.
void churn(CachingAllocator& a, Device& d, int id, const std::atomic<bool>& stop, std::atomic<int>& bad,
           std::atomic<std::uint64_t>& ops) {
  const Stream s = d.create_stream();
  std::mt19937_64 rng(1000 + id);
  struct Live {
    TensorView v;
    std::uint64_t seed;
  };
  std::vector<Live> live;
  std::vector<std::unique_ptr<std::uint64_t>> hashes;
  auto check_and_drop = [&](std::size_t i) {
    auto h = std::make_unique<std::uint64_t>(0);
    hash_on(d, s, live[i].v, h.get());
    d.synchronize(s);
    if (*h != expected_hash(live[i].v.nbytes(), live[i].seed)) bad.fetch_add(1);
    live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
  };
  while (!stop.load()) {
    if (live.size() < 8 && (rng() & 1)) {
      const std::size_t n = 512 + rng() % (3 * MiB);
      try {
        TensorView v = TensorView::empty(a, DType::u8, {static_cast<std::int64_t>(n)}, s);
        const std::uint64_t seed = rng();
        fill_on(d, s, v, seed);
        live.push_back({std::move(v), seed});
      } catch (const OutOfMemory&) {
      }
    } else if (!live.empty()) {
      check_and_drop(rng() % live.size());
    }
    ops.fetch_add(1);
  }
  while (!live.empty()) check_and_drop(live.size() - 1);
  d.synchronize(s);
  d.destroy_stream(s);
}

constexpr int kThreads = 3;  // churning threads beside the scheduler
TEST(SwapStress, SchedulerWorksWhileOtherThreadsAllocate) {
  EmulatedOptions o;
  o.capacity = 512 * MiB;
  o.link_bandwidth_gbps = 8.0;
  auto device = make_emulated_device(0, o);
  CachingAllocator allocator(*device);
  HostPool pool(*device);
  const std::int64_t at_start = allocator.stats().allocated_bytes.all.current;
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::atomic<std::uint64_t> ops{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back(churn, std::ref(allocator), std::ref(*device), t, std::cref(stop), std::ref(bad),
                         std::ref(ops));

  constexpr int kLayers = 4, kSteps = 5;
  std::uint64_t swapped_total = 0;
  {
    SwapOptions so;
    so.prefetch_distance = 1;
    SwapScheduler swap(allocator, pool, so);
    for (int step = 0; step < kSteps; ++step) {
      std::vector<TensorView> acts;
      std::vector<std::uint64_t> seeds;
      for (int l = 0; l < kLayers; ++l) {  // forward
        for (int k = 0; k < 2; ++k) {
          const std::uint64_t seed = 97 * step + 11 * l + k;
          TensorView v = TensorView::empty(allocator, DType::u8, {static_cast<std::int64_t>(MiB + 4096 * l)});
          fill_on(*device, kDefaultStream, v, seed);
          busy_on(*device, kDefaultStream, 200);
          EXPECT_EQ(swap.offload(v, l, "attn"), SwapDecision::swapped);
          acts.push_back(v);
          seeds.push_back(seed);
        }
      }
      for (int l = kLayers - 1; l >= 0; --l) {  // backward
        swap.before_backward(l);
        for (int k = 0; k < 2; ++k) {
          const std::size_t i = static_cast<std::size_t>(2 * l + k);
          TensorView r = swap.acquire(acts[i]);
          std::uint64_t h = 0;
          hash_on(*device, kDefaultStream, r, &h);
          device->synchronize(kDefaultStream);
          EXPECT_EQ(h, expected_hash(r.nbytes(), seeds[i])) << "step " << step << " tensor " << i;
        }
        swap.after_backward(l);
      }
      acts.clear();
      swap.finish_step();
      EXPECT_EQ(swap.stats().tensors_swapped, 0u);
      EXPECT_EQ(swap.stats().host_bytes, 0u);
    }
    swapped_total = swap.stats().copies_d2h;
  }
  stop.store(true);
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0) << "a churning thread's block changed under it";
  EXPECT_GT(ops.load(), 0u);
  EXPECT_EQ(swapped_total, static_cast<std::uint64_t>(kLayers * 2 * kSteps));
  device->synchronize();
  EXPECT_EQ(allocator.stats().allocated_bytes.all.current, at_start);
  EXPECT_EQ(pool.stats().in_use_bytes, 0u);
}

}  // namespace
}  // namespace stowage
