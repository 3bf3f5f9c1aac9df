// Randomised forward/backward schedules through the swap scheduler, on an emulated device with a
// 4 GB/s link and on a GPU: every tensor's contents are checked by hash, and after each step no
// device or host memory is left over. On the GPU (and in one emulated case, so that this path is
// checked without one) the contents are written and hashed through the device's copies; the
// emulated device's "kernels" otherwise touch its memory directly. CUDA skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <random>
#include <vector>

#include "offload_test_util.hpp"
#include "stowage/allocator.hpp"
#include "stowage/cuda_device.hpp"
#include "stowage/host_pool.hpp"
#include "stowage/swap.hpp"

namespace stowage {
namespace {

using namespace stowage::testing;

struct Schedule {
  std::uint32_t seed;
  int distance;
  std::size_t min_bytes;
  std::size_t host_cap;
  HostPoolBackend backend;
  DeviceKind kind = DeviceKind::emulated;
  bool staged = false;  // contents through copies (always on CUDA)
};

std::string name_of(const ::testing::TestParamInfo<Schedule>& info) {
  const auto& s = info.param;
  return "seed" + std::to_string(s.seed) + "_d" + std::to_string(s.distance) + "_min" + std::to_string(s.min_bytes) +
         "_cap" + std::to_string(s.host_cap >> 20) + "M_" + to_string(s.backend) + "_" + to_string(s.kind) +
         (s.staged && s.kind == DeviceKind::emulated ? "_staged" : "");
}

void PrintTo(const Schedule& s, std::ostream* os) {
  *os << "seed " << s.seed << ", distance " << s.distance << ", " << to_string(s.kind);
}

struct Tracked {
  TensorView view;
  std::size_t bytes = 0;
  std::uint64_t seed = 0;
  int layer = 0;
  bool released = false;  // released for recompute: not swapped, contents gone on purpose
  SwapDecision decision = SwapDecision::kept_tag;
  std::uint64_t got = 0;
};

class SwapSchedule : public ::testing::TestWithParam<Schedule> {
 protected:
  void SetUp() override {
    if (GetParam().backend == HostPoolBackend::jemalloc && !jemalloc_in_process())
      GTEST_SKIP() << "jemalloc is not linked into this executable (STOWAGE_LINK_JEMALLOC=OFF)";
    if (GetParam().kind == DeviceKind::cuda && cuda_device_count() == 0)
      GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
    device_ = make_test_device(GetParam().kind, {.capacity = std::size_t{512} << 20, .link_bandwidth_gbps = 4.0});
    staged_ = GetParam().staged || !device_->properties().host_accessible;
    allocator_ = std::make_unique<CachingAllocator>(*device_);
    HostPoolOptions po;
    po.backend = GetParam().backend;
    pool_ = std::make_unique<HostPool>(*device_, po);
  }

  std::size_t pick_size(std::mt19937& rng) {
    switch (rng() % 4) {
      case 0: return 1 + rng() % 4096;                             // tiny
      case 1: return (std::size_t{64} << 10) + rng() % (1 << 20);  // around the threshold
      case 2: return (std::size_t{1} << 20) + rng() % (3 << 20);
      default: return (std::size_t{4} << 20) + rng() % (8 << 20);  // huge
    }
  }

  // A scratch tensor filled with garbage right away: it lands in blocks just given back, so a
  // block reused before its copy finished shows up as a wrong hash.
  void scribble(std::mt19937& rng, Stream s) {
    auto t = TensorView::empty(*allocator_, DType::u8, {static_cast<std::int64_t>(pick_size(rng))}, s);
    fill(s, t, 0xdead);
  }

  void fill(Stream s, const TensorView& t, std::uint64_t seed) {
    if (staged_) upload_on(*device_, s, t, seed);
    else fill_on(*device_, s, t, seed);
  }
  void hash(Stream s, const TensorView& t, std::uint64_t* out) {
    if (staged_) download_hash_on(*device_, s, t, out);
    else hash_on(*device_, s, t, out);
  }

  // One training step; sizes come from `shape_seed` (the same each step), contents from `step`.
  void run_step(SwapScheduler& swap, std::uint32_t shape_seed, int step) {
    constexpr int kLayers = 10;
    const Stream compute = kDefaultStream;
    std::mt19937 shapes(shape_seed), rng(shape_seed * 31 + step);
    std::vector<Tracked> ts;
    for (int layer = 0; layer < kLayers; ++layer) {
      busy_on(*device_, compute, static_cast<int>(rng() % 300));
      const int count = 1 + static_cast<int>(shapes() % 5);
      for (int i = 0; i < count; ++i) {
        Tracked t;
        t.bytes = pick_size(shapes);
        t.seed = (std::uint64_t{static_cast<std::uint32_t>(step)} << 32) | ts.size();
        t.layer = layer;
        t.view = TensorView::empty(*allocator_, DType::u8, {static_cast<std::int64_t>(t.bytes)}, compute);
        fill(compute, t.view, t.seed);
        static const char* kTags[] = {"attn", "mlp", "attn.core", "norm"};
        const std::string tag = "layer" + std::to_string(layer) + "." + kTags[shapes() % 4];
        if (shapes() % 10 == 0) {
          t.view.storage().release(StorageState::released);
          t.released = true;
        }
        t.decision = swap.offload(t.view, layer, tag);
        if (t.released) EXPECT_EQ(t.decision, SwapDecision::kept_not_resident);
        if (rng() % 2) scribble(rng, compute);
        ts.push_back(std::move(t));
      }
    }
    for (int layer = kLayers - 1; layer >= 0; --layer) {
      swap.before_backward(layer);
      busy_on(*device_, compute, static_cast<int>(rng() % 500));  // the layer's MLP backward
      std::vector<Tracked*> mine;
      for (auto& t : ts)
        if (t.layer == layer && !t.released) mine.push_back(&t);
      std::shuffle(mine.begin(), mine.end(), rng);
      for (Tracked* t : mine) {
        const TensorView r = swap.acquire(t->view);
        hash(compute, r, &t->got);
        if (rng() % 2) scribble(rng, compute);
      }
      swap.after_backward(layer);
      for (Tracked* t : mine) t->view = {};
    }
    device_->synchronize(compute);
    swap.finish_step();
    for (const auto& t : ts) {
      if (t.released) continue;
      EXPECT_EQ(t.got, expected_hash(t.bytes, t.seed))
          << "layer " << t.layer << ", " << t.bytes << " bytes, " << to_string(t.decision) << ", step " << step;
    }
    const std::uint64_t swapped =
        std::count_if(ts.begin(), ts.end(), [](const Tracked& t) { return t.decision == SwapDecision::swapped; });
    const auto s = swap.stats();
    EXPECT_EQ(s.copies_d2h, swapped);
    EXPECT_EQ(s.copies_h2d, swapped);
    EXPECT_EQ(s.bytes_d2h, s.bytes_h2d);
    EXPECT_EQ(s.host_bytes, 0u);
    EXPECT_EQ(s.tensors_swapped, 0u);
    const auto& p = GetParam();
    if (p.host_cap) {
      EXPECT_LE(s.peak_host_bytes, p.host_cap);
      EXPECT_GT(s.kept_host_cap, 0u);  // the cap was reached: those tensors stayed (and hashed right)
    }
    for (const auto& t : ts) {
      if (t.decision == SwapDecision::swapped) EXPECT_GE(t.bytes, p.min_bytes);
      if (t.decision == SwapDecision::kept_small) EXPECT_LT(t.bytes, p.min_bytes);
    }
  }

  std::unique_ptr<Device> device_;
  std::unique_ptr<CachingAllocator> allocator_;
  std::unique_ptr<HostPool> pool_;
  bool staged_ = false;
};

TEST_P(SwapSchedule, ContentsSurviveAndNothingIsLeftAfterEachStep) {
  const auto& p = GetParam();
  SwapOptions o;
  o.prefetch_distance = p.distance;
  o.policy.tags = {"attn"};
  o.policy.min_bytes = p.min_bytes;
  o.policy.host_cap_bytes = p.host_cap;
  SwapScheduler swap(*allocator_, *pool_, o);
  const std::int64_t allocated_at_start = allocator_->stats().allocated_bytes.all.current;
  std::uint64_t maps_after_first = 0;
  for (int step = 0; step < 3; ++step) {
    swap.reset_stats();
    run_step(swap, p.seed, step);
    EXPECT_EQ(allocator_->stats().allocated_bytes.all.current, allocated_at_start) << "step " << step;
    EXPECT_EQ(pool_->stats().in_use_bytes, 0u) << "step " << step;
    EXPECT_EQ(pool_->stats().live_buffers, 0u) << "step " << step;
    if (step == 0) maps_after_first = pool_->stats().num_maps;
  }
  // Later steps reuse the pool's pinned pages: no pinning on the hot path.
  EXPECT_EQ(pool_->stats().num_maps, maps_after_first);
}

const Schedule kSchedules[] = {
    {1, 0, std::size_t{512} << 10, 0, HostPoolBackend::jemalloc},
    {2, 1, std::size_t{512} << 10, 0, HostPoolBackend::builtin},
    {3, 3, 0, 0, HostPoolBackend::jemalloc},
    {4, 0, 0, std::size_t{24} << 20, HostPoolBackend::builtin},
    {5, 2, std::size_t{512} << 10, std::size_t{16} << 20, HostPoolBackend::jemalloc},
    {6, 9, 0, 0, HostPoolBackend::builtin},
};

std::vector<Schedule> on(DeviceKind kind) {
  std::vector<Schedule> out(std::begin(kSchedules), std::end(kSchedules));
  for (auto& s : out) s.kind = kind;
  return out;
}

INSTANTIATE_TEST_SUITE_P(Random, SwapSchedule, ::testing::ValuesIn(on(DeviceKind::emulated)), name_of);
INSTANTIATE_TEST_SUITE_P(Staged, SwapSchedule,
                         ::testing::Values(Schedule{7, 1, std::size_t{512} << 10, std::size_t{16} << 20,
                                                    HostPoolBackend::builtin, DeviceKind::emulated, true}),
                         name_of);
INSTANTIATE_TEST_SUITE_P(Cuda, SwapSchedule, ::testing::ValuesIn(on(DeviceKind::cuda)), name_of);

}  // namespace
}  // namespace stowage
