// Optimizer offload (stowage/offload.hpp): states on the device, mapped into it from host
// memory, or streamed through device windows give bit-identical parameters and states; the
// device budget is exact in allocator bytes; host pages sit on the device's NUMA node; failures
// to map, pin or copy leave every state where it was.
#include <gtest/gtest.h>
#include <numaif.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "stowage/allocator.hpp"
#include "stowage/bucket_optimizers.hpp"
#include "stowage/cuda_device.hpp"
#include "stowage/emulated_device.hpp"
#include "stowage/fault_injection.hpp"
#include "stowage/host_pool.hpp"
#include "stowage/offload.hpp"
#include "stowage/optimizers.hpp"
#include "stowage/parameter_bucket.hpp"

namespace stowage {
namespace {

constexpr std::size_t kChunk = 512;  // elements per chunk: several chunks per bucket
constexpr int kSteps = 50;

std::vector<ParameterSpec> specs() { return {{"wq", {37, 19}}, {"b", {1000}}, {"w2", {3, 5, 7}}, {"tail", {333}}}; }

// Everything a run ends with, as bytes.
struct Outcome {
  std::vector<std::uint16_t> bf16, residual;
  std::vector<float> fp32, m, v;
  bool operator==(const Outcome&) const = default;
};

std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> out(n);
  for (auto& x : out) x = d(rng);
  return out;
}

class OffloadOptimizer : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::unique_ptr<Device> inner;
    if (GetParam() == "cuda") {
      if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
      inner = make_cuda_device(0);
    } else {  // a throttled link makes copies slow, so ordering mistakes show
      inner = make_emulated_device(
          0, {.capacity = std::size_t{1} << 30, .link_bandwidth_gbps = GetParam() == "emulated_throttled" ? 1.0 : 0.0});
    }
    device_ = std::make_unique<FaultInjectingDevice>(std::move(inner), FaultPlan{});
    alloc_ = std::make_unique<CachingAllocator>(*device_);
    pool_ = std::make_unique<HostPool>(*device_);
  }
  void TearDown() override {
    pool_.reset();
    alloc_.reset();
  }

  // The finite check runs on the host where it reads device memory, else on the device.
  GradScaling scaling() const { return {.skip_nonfinite = true}; }

  TensorView to_device(const std::vector<float>& host) {
    TensorView t = TensorView::empty(*alloc_, DType::f32, {static_cast<std::int64_t>(host.size())});
    device_->copy_async(t.data(), host.data(), host.size() * 4, CopyKind::host_to_device, kDefaultStream);
    device_->synchronize(kDefaultStream);
    return t;
  }
  std::vector<float> from_device(const TensorView& t, std::size_t n) {
    std::vector<float> out(n);
    device_->copy_async(out.data(), t.data(), n * 4, CopyKind::device_to_host, kDefaultStream);
    device_->synchronize(kDefaultStream);
    return out;
  }

  std::unique_ptr<ParameterBucket> make_bucket(Rounding rounding) {
    auto b = std::make_unique<ParameterBucket>(*alloc_, specs(), BucketOptions{.rounding = rounding});
    for (std::size_t i = 0; i < b->size(); ++i) {
      const auto w = random_floats(b->slot(i).numel, 100 + static_cast<std::uint32_t>(i), 0.5f);
      b->write_fp32(i, w.data(), w.size());
    }
    return b;
  }

  Outcome read_bucket(const ParameterBucket& b) {
    Outcome o;
    o.bf16.resize(b.numel());
    o.residual.resize(b.numel());
    device_->copy_async(o.bf16.data(), b.bf16_plane().data(), b.numel() * 2, CopyKind::device_to_host, b.stream());
    device_->copy_async(o.residual.data(), b.residual_plane().data(), b.numel() * 2, CopyKind::device_to_host,
                        b.stream());
    device_->synchronize(b.stream());
    return o;
  }

  // kSteps AdamW steps with seeded gradients; `offload` null = plain device tensors m, v.
  Outcome run_split(Rounding rounding, const OffloadOptions* offload) {
    auto bucket = make_bucket(rounding);
    const std::size_t n = bucket->numel();
    std::unique_ptr<OffloadedAdam> adam;
    TensorView m, v;
    if (offload) {
      adam = std::make_unique<OffloadedAdam>(*alloc_, *pool_, n, *offload);
    } else {
      m = to_device(std::vector<float>(n, 0.0f));
      v = to_device(std::vector<float>(n, 0.0f));
    }
    const AdamOptions opt{.lr = 1e-2f, .weight_decay = 0.01f};
    OptimizerState state;
    for (int s = 0; s < kSteps; ++s) {
      TensorView g = to_device(random_floats(n, 7000 + s, 1.0f));
      const StepResult r =
          adam ? adam->step(*bucket, g, opt, scaling(), state) : adam_step(*bucket, g, m, v, opt, scaling(), state);
      EXPECT_TRUE(r.applied);
      device_->synchronize(bucket->stream());  // g goes at the end of the iteration
    }
    EXPECT_EQ(state.step, kSteps);
    Outcome o = read_bucket(*bucket);
    if (adam) {
      o.m.resize(n);
      o.v.resize(n);
      adam->read_states(o.m.data(), o.v.data());
    } else {
      o.m = from_device(m, n);
      o.v = from_device(v, n);
    }
    for (std::size_t i = 0; i < bucket->size(); ++i) {
      std::vector<float> w(bucket->slot(i).numel);
      bucket->read_fp32(i, w.data(), w.size());
      o.fp32.insert(o.fp32.end(), w.begin(), w.end());
    }
    return o;
  }

  std::unique_ptr<FaultInjectingDevice> device_;
  std::unique_ptr<CachingAllocator> alloc_;
  std::unique_ptr<HostPool> pool_;
};

OffloadOptions opts(StatePlacement mode, std::size_t budget) {
  return {.host_mode = mode, .device_budget_bytes = budget, .chunk_elements = kChunk};
}

// Budgets that put everything on the host (0 / just the streamed window) or half of it.
std::vector<std::pair<std::string, OffloadOptions>> placements() {
  const std::size_t chunk_bytes = kChunk * 8, window = 3 * chunk_bytes;
  return {{"device", opts(StatePlacement::device, 0)},
          {"mapped", opts(StatePlacement::mapped, 0)},
          {"mapped+device", opts(StatePlacement::mapped, 2 * chunk_bytes)},
          {"streamed", opts(StatePlacement::streamed, window)},
          {"streamed+device", opts(StatePlacement::streamed, window + 2 * chunk_bytes)}};
}

TEST_P(OffloadOptimizer, FiftyAdamWStepsBitIdenticalToDeviceStatesOnSharedStorage) {
  for (Rounding rounding : {Rounding::half_up, Rounding::nearest_even}) {
    const Outcome reference = run_split(rounding, nullptr);
    for (const auto& [name, o] : placements()) {
      SCOPED_TRACE(name);
      const Outcome got = run_split(rounding, &o);
      EXPECT_TRUE(got.bf16 == reference.bf16);
      EXPECT_TRUE(got.residual == reference.residual);
      EXPECT_EQ(0, std::memcmp(got.fp32.data(), reference.fp32.data(), got.fp32.size() * 4));
      EXPECT_EQ(0, std::memcmp(got.m.data(), reference.m.data(), got.m.size() * 4));
      EXPECT_EQ(0, std::memcmp(got.v.data(), reference.v.data(), got.v.size() * 4));
    }
    // The weights moved: the comparison is not between untouched buffers.
    auto start = make_bucket(rounding);
    EXPECT_FALSE(read_bucket(*start).bf16 == reference.bf16);
  }
}

TEST_P(OffloadOptimizer, FiftyAdamWStepsBitIdenticalOnPlainFp32Weights) {
  auto bucket = make_bucket(Rounding::half_up);
  const std::size_t n = bucket->numel();
  // Plain fp32 masters: the bucket's merged weights, padding included (zeros).
  std::vector<float> initial(n, 0.0f);
  for (std::size_t i = 0; i < bucket->size(); ++i)
    bucket->read_fp32(i, initial.data() + bucket->slot(i).offset, bucket->slot(i).numel);
  const Outcome split = run_split(Rounding::half_up, nullptr);

  for (const auto& [name, o] : placements()) {
    SCOPED_TRACE(name);
    TensorView w = to_device(initial);
    OffloadedAdam adam(*alloc_, *pool_, n, o);
    const AdamOptions opt{.lr = 1e-2f, .weight_decay = 0.01f};
    OptimizerState state;
    for (int s = 0; s < kSteps; ++s) {
      TensorView g = to_device(random_floats(n, 7000 + s, 1.0f));
      EXPECT_TRUE(adam.step(w, g, opt, scaling(), state).applied);
      device_->synchronize(kDefaultStream);
    }
    const auto got = from_device(w, n);
    std::vector<float> m(n), v(n);
    adam.read_states(m.data(), v.data());
    // Same update as on the split planes, merged: the fp32 kernel matches the split one.
    std::size_t k = 0;
    for (std::size_t i = 0; i < bucket->size(); ++i)
      for (std::size_t e = 0; e < bucket->slot(i).numel; ++e, ++k)
        ASSERT_EQ(0, std::memcmp(&got[bucket->slot(i).offset + e], &split.fp32[k], 4))
            << "param " << i << " elem " << e;
    EXPECT_EQ(0, std::memcmp(m.data(), split.m.data(), n * 4));
    EXPECT_EQ(0, std::memcmp(v.data(), split.v.data(), n * 4));
  }
}

TEST_P(OffloadOptimizer, DeviceBudgetIsExactInAllocatorBytes) {
  const std::size_t n = 10 * kChunk + 100;  // 10 full chunks and a short one (chunk 10)
  const std::size_t chunk_bytes = kChunk * 8, tail_bytes = (100 * 8 + 511) / 512 * 512;
  const std::size_t window = 3 * chunk_bytes;
  struct Case {
    StatePlacement mode;
    std::size_t budget;
    std::vector<std::size_t> on_device;  // chunks that stay: in order, each while it fits
    std::size_t expect_device;
  };
  const std::vector<Case> cases = {
      {StatePlacement::mapped, 0, {}, 0},
      {StatePlacement::mapped, 3 * chunk_bytes + tail_bytes - 1, {0, 1, 2}, 3 * chunk_bytes},
      // The short last chunk still fits beside three full ones.
      {StatePlacement::mapped, 3 * chunk_bytes + chunk_bytes / 2, {0, 1, 2, 10}, 3 * chunk_bytes + tail_bytes},
      {StatePlacement::mapped,
       10 * chunk_bytes + tail_bytes,
       {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10},
       10 * chunk_bytes + tail_bytes},
      {StatePlacement::streamed, window, {}, window},
      {StatePlacement::streamed, window + 4 * chunk_bytes + 1, {0, 1, 2, 3}, window + 4 * chunk_bytes},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(to_string(c.mode)) + " budget " + std::to_string(c.budget));
    const std::int64_t before = alloc_->stats().allocated_bytes.all.current;
    OffloadedAdam adam(*alloc_, *pool_, n, opts(c.mode, c.budget));
    const std::int64_t used = alloc_->stats().allocated_bytes.all.current - before;
    const OffloadReport r = adam.report();
    EXPECT_EQ(static_cast<std::size_t>(used), c.expect_device);
    EXPECT_EQ(r.device_bytes, c.expect_device);
    EXPECT_LE(r.device_bytes, c.budget);
    EXPECT_EQ(r.chunks_on_device, c.on_device.size());
    EXPECT_EQ(r.chunks_on_device + r.chunks_mapped + r.chunks_streamed, adam.chunk_count());
    EXPECT_EQ(r.state_bytes, n * 8);
    EXPECT_EQ(r.device_bytes_saved, r.state_bytes > c.expect_device ? r.state_bytes - c.expect_device : 0);
    std::size_t host_chunks = 0;
    for (std::size_t i = 0; i < adam.chunk_count(); ++i) {
      const bool expect_on_device = std::find(c.on_device.begin(), c.on_device.end(), i) != c.on_device.end();
      EXPECT_EQ(adam.placement(i), expect_on_device ? StatePlacement::device : c.mode) << "chunk " << i;
      host_chunks += !expect_on_device;
    }
    if (host_chunks > 0) {
      EXPECT_GT(r.host_bytes, 0u);
    } else {
      EXPECT_EQ(r.host_bytes, 0u);
    }
  }
  // The streamed window must fit the budget.
  EXPECT_THROW(OffloadedAdam(*alloc_, *pool_, n, opts(StatePlacement::streamed, 3 * chunk_bytes - 1)), InvalidArgument);
  EXPECT_EQ(alloc_->stats().allocated_bytes.all.current, 0);
}

TEST_P(OffloadOptimizer, HostStatesSitOnTheDevicesNumaNode) {
  const auto& nodes = device_->properties().numa_nodes;
  for (StatePlacement mode : {StatePlacement::mapped, StatePlacement::streamed}) {
    SCOPED_TRACE(to_string(mode));
    const std::size_t n = 4 * kChunk;
    const auto pool_before = pool_->stats();
    OffloadedAdam adam(*alloc_, *pool_, n, opts(mode, mode == StatePlacement::streamed ? 3 * kChunk * 8 : 0));
    const OffloadReport r = adam.report();
    EXPECT_EQ(r.numa_node, nodes.empty() ? -1 : nodes.front());
    if (mode == StatePlacement::mapped) EXPECT_FALSE(r.mapping.empty());
    for (std::size_t i = 0; i < adam.chunk_count(); ++i) {
      const void* p = adam.host_address(i);
      if (!p) {  // mapped pinned memory: the pool's accounting says where its pages are
        const auto after = pool_->stats();
        ASSERT_GT(after.in_use_bytes, pool_before.in_use_bytes);
        continue;
      }
      int node = -1;
      ASSERT_EQ(0, get_mempolicy(&node, nullptr, 0, const_cast<void*>(p), MPOL_F_NODE | MPOL_F_ADDR))
          << std::strerror(errno);
      if (r.numa_node >= 0) EXPECT_EQ(node, r.numa_node) << "chunk " << i;
    }
    if (mode == StatePlacement::streamed) {  // pool buffers, accounted per node
      const auto after = pool_->stats();
      EXPECT_GE(after.in_use_bytes - pool_before.in_use_bytes, n * 8);
      if (r.numa_node >= 0) {
        bool found = false;
        for (const auto& ns : after.nodes) found |= ns.node == r.numa_node && ns.in_use_bytes >= n * 8;
        EXPECT_TRUE(found);
      }
    }
  }
}

TEST_P(OffloadOptimizer, MappedFallsBackToPinnedHostMemoryWhenVirtualMemoryFails) {
  const OffloadOptions mapped = opts(StatePlacement::mapped, 0);
  {
    OffloadedAdam adam(*alloc_, *pool_, 2 * kChunk, mapped);
    const auto& p = device_->properties();
    if (p.virtual_memory && p.host_numa_memory) EXPECT_EQ(adam.report().mapping, "vmm-host-numa");
  }
  // Classic segments, so the allocator itself needs no mapping; then the driver's virtual memory
  // refuses and pinning works.
  AllocatorOptions classic;
  classic.segments = SegmentMode::classic;
  alloc_ = std::make_unique<CachingAllocator>(*device_, classic);
  device_->set_plan({.map_every = 1});
  const Outcome reference = run_split(Rounding::half_up, nullptr);
  const Outcome got = run_split(Rounding::half_up, &mapped);
  EXPECT_TRUE(got == reference);
  OffloadedAdam adam(*alloc_, *pool_, 2 * kChunk, mapped);
  EXPECT_EQ(adam.report().mapping, "mapped-pinned");
  EXPECT_EQ(adam.report().chunks_mapped, 2u);
  EXPECT_GT(device_->injected().map, 0u);
  device_->set_plan({});
}

// Reads m, v and where every chunk lives, to compare across a failed replace.
struct Placed {
  std::vector<float> m, v;
  std::vector<StatePlacement> where;
  bool operator==(const Placed&) const = default;
};
Placed placed(OffloadedAdam& a) {
  Placed p{std::vector<float>(a.numel()), std::vector<float>(a.numel()), {}};
  a.read_states(p.m.data(), p.v.data());
  for (std::size_t i = 0; i < a.chunk_count(); ++i) p.where.push_back(a.placement(i));
  return p;
}

TEST_P(OffloadOptimizer, FailureToMapPinOrCopyLeavesStatesWhereTheyWere) {
  const std::size_t n = 6 * kChunk;
  auto bucket =
      std::make_unique<ParameterBucket>(*alloc_, std::vector<ParameterSpec>{{"w", {static_cast<std::int64_t>(n)}}});
  const auto w0 = random_floats(n, 5, 0.5f);
  bucket->write_fp32(0, w0.data(), n);
  OffloadedAdam adam(*alloc_, *pool_, n, opts(StatePlacement::device, 0));
  OptimizerState state;
  for (int s = 0; s < 3; ++s) {  // non-zero states worth keeping
    TensorView g = to_device(random_floats(n, 90 + s, 1.0f));
    adam.step(*bucket, g, {}, scaling(), state);
    device_->synchronize(kDefaultStream);
  }
  const Placed before = placed(adam);
  ASSERT_NE(before.m[0], 0.0f);
  const std::int64_t device_before = alloc_->stats().allocated_bytes.all.current;
  const std::size_t pool_before = pool_->stats().in_use_bytes;

  struct Fault {
    const char* name;
    FaultPlan plan;
    OffloadOptions to;
  };
  const std::vector<Fault> faults = {
      {"map and pin refused", {.map_every = 1, .pin_every = 1}, opts(StatePlacement::mapped, 0)},
      {"host allocation refused",
       {.allocation_every = 1, .map_every = 1, .pin_every = 1},
       opts(StatePlacement::mapped, 0)},
      {"pin refused (streamed)", {.pin_every = 1}, opts(StatePlacement::streamed, 3 * kChunk * 8)},
      {"copy refused", {.copy_every = 1}, opts(StatePlacement::streamed, 3 * kChunk * 8)},
  };
  for (const Fault& f : faults) {
    SCOPED_TRACE(f.name);
    device_->set_plan(f.plan);
    try {
      adam.replace(f.to);
      ADD_FAILURE() << "replace succeeded under faults";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()), "") << "the error says what failed";
    }
    device_->set_plan({});
    device_->synchronize();
    EXPECT_TRUE(placed(adam) == before) << "states moved or changed";
    EXPECT_EQ(alloc_->stats().allocated_bytes.all.current, device_before);
    EXPECT_LE(pool_->stats().in_use_bytes, pool_before) << "host bytes leaked";
  }
  // A mapped move that fails part-way keeps every chunk whole: where it was, or fully moved.
  device_->set_plan({.copy_every = 4});
  EXPECT_THROW(adam.replace(opts(StatePlacement::mapped, 0)), Error);
  device_->set_plan({});
  const Placed partial = placed(adam);
  EXPECT_EQ(partial.m, before.m);
  EXPECT_EQ(partial.v, before.v);
  // And the optimizer still steps from there, then moves cleanly.
  TensorView g = to_device(random_floats(n, 99, 1.0f));
  EXPECT_TRUE(adam.step(*bucket, g, {}, scaling(), state).applied);
  adam.replace(opts(StatePlacement::streamed, 3 * kChunk * 8));
  EXPECT_EQ(adam.report().chunks_streamed, adam.chunk_count());
}

// A streamed step copies every chunk in and out. A refused copy before the first update changes
// nothing and the step can simply be taken again (the run then equals one that never failed); a
// refusal after some chunks were updated is reported as a partly applied step, and every later
// step refuses rather than mix weights and states of different steps.
TEST_P(OffloadOptimizer, AStepThatFailsIsRetriedOrRefusedNeverSilentlyHalfApplied) {
  // No finite check: on a GPU it copies a flag back, and this test counts the step's copies.
  const GradScaling unchecked{.skip_nonfinite = false};
  const std::size_t n = 6 * kChunk;
  auto make = [&] {
    auto b =
        std::make_unique<ParameterBucket>(*alloc_, std::vector<ParameterSpec>{{"w", {static_cast<std::int64_t>(n)}}});
    const auto w0 = random_floats(n, 5, 0.5f);
    b->write_fp32(0, w0.data(), n);
    return b;
  };
  auto outcome = [&](ParameterBucket& b, OffloadedAdam& adam) {
    Outcome o = read_bucket(b);
    o.m.resize(n);
    o.v.resize(n);
    adam.read_states(o.m.data(), o.v.data());
    return o;
  };
  const OffloadOptions streamed = opts(StatePlacement::streamed, 3 * kChunk * 8);
  auto bucket = make(), reference_bucket = make();
  OffloadedAdam adam(*alloc_, *pool_, n, streamed), reference(*alloc_, *pool_, n, streamed);
  OptimizerState state, reference_state;
  for (int s = 0; s < 4; ++s) {
    TensorView g = to_device(random_floats(n, 300 + s, 1.0f));
    if (s == 2) {  // the first copy of this step, an H2D, is refused: nothing has been updated
      const Outcome before = outcome(*bucket, adam);
      device_->set_plan({.copy_every = 1});
      EXPECT_THROW(adam.step(*bucket, g, {}, unchecked, state), DeviceError);
      device_->set_plan({});
      EXPECT_EQ(state.step, 2);
      EXPECT_TRUE(outcome(*bucket, adam) == before) << "a refused step changed weights or states";
    }
    EXPECT_TRUE(adam.step(*bucket, g, {}, unchecked, state).applied);
    EXPECT_TRUE(reference.step(*reference_bucket, g, {}, unchecked, reference_state).applied);
    device_->synchronize();
  }
  EXPECT_EQ(state.step, 4);
  EXPECT_TRUE(outcome(*bucket, adam) == outcome(*reference_bucket, reference));

  // Chunk 0 in and out, then chunk 1's H2D refused: one of six chunks updated.
  TensorView g = to_device(random_floats(n, 400, 1.0f));
  device_->set_plan({.copy_every = 3});
  std::string first;
  try {
    adam.step(*bucket, g, {}, unchecked, state);
    ADD_FAILURE() << "the step succeeded with its third copy refused";
  } catch (const DeviceError& e) {
    first = e.what();
  }
  device_->set_plan({});
  EXPECT_NE(first.find("step 5 failed after updating 1 of 6 chunks"), std::string::npos) << first;
  EXPECT_NE(first.find("injected copy fault"), std::string::npos) << first;
  EXPECT_EQ(state.step, 4);
  try {
    adam.step(*bucket, g, {}, unchecked, state);
    ADD_FAILURE() << "a step after a partly applied one went on";
  } catch (const DeviceError& e) {
    EXPECT_EQ(std::string(e.what()), first);
  }
  EXPECT_EQ(state.step, 4);
  device_->synchronize();
}

TEST_P(OffloadOptimizer, ReplaceMovesStatesAndKeepsStepping) {
  const std::size_t n = 5 * kChunk;
  const OffloadOptions sequence[] = {opts(StatePlacement::mapped, 0), opts(StatePlacement::streamed, 3 * kChunk * 8),
                                     opts(StatePlacement::mapped, 3 * kChunk * 8), opts(StatePlacement::device, 0)};
  // Nine steps from the same weights and gradients; `moving`: a replace before every odd step.
  auto train = [&](OffloadedAdam& adam, bool moving) {
    ParameterBucket b(*alloc_, {{"w", {static_cast<std::int64_t>(n)}}});
    const auto w0 = random_floats(n, 5, 0.5f);
    b.write_fp32(0, w0.data(), n);
    OptimizerState state;
    for (int s = 0; s < 9; ++s) {
      if (moving && s % 2 == 1) adam.replace(sequence[(s / 2) % 4]);
      TensorView g = to_device(random_floats(n, 300 + s, 1.0f));
      adam.step(b, g, {}, scaling(), state);
      device_->synchronize(kDefaultStream);
    }
    Outcome o = read_bucket(b);
    o.m.resize(n);
    o.v.resize(n);
    adam.read_states(o.m.data(), o.v.data());
    return o;
  };
  OffloadedAdam still(*alloc_, *pool_, n, opts(StatePlacement::device, 0));
  const Outcome reference = train(still, false);
  OffloadedAdam adam(*alloc_, *pool_, n, opts(StatePlacement::device, 0));
  const Outcome o = train(adam, true);
  EXPECT_TRUE(o == reference);
  EXPECT_EQ(adam.report().chunks_on_device, adam.chunk_count());
  EXPECT_GE(adam.report().last_step_ms, 0.0);
  EXPECT_EQ(adam.report().steps, 9);
}

TEST_P(OffloadOptimizer, NonFiniteGradientSkipsTheStepAndWritesNothing) {
  const std::size_t n = 3 * kChunk;
  auto b =
      std::make_unique<ParameterBucket>(*alloc_, std::vector<ParameterSpec>{{"w", {static_cast<std::int64_t>(n)}}});
  OffloadedAdam adam(*alloc_, *pool_, n, opts(StatePlacement::streamed, 3 * kChunk * 8));
  OptimizerState state;
  auto grad = random_floats(n, 1, 1.0f);
  TensorView g = to_device(grad);
  adam.step(*b, g, {}, scaling(), state);
  const Placed before = placed(adam);
  const Outcome w_before = read_bucket(*b);
  grad[n - 3] = std::numeric_limits<float>::infinity();
  TensorView bad = to_device(grad);
  const StepResult r = adam.step(*b, bad, {}, scaling(), state);
  EXPECT_FALSE(r.applied);
  EXPECT_TRUE(r.found_nonfinite);
  EXPECT_EQ(state.step, 1);
  EXPECT_TRUE(placed(adam) == before);
  EXPECT_TRUE(read_bucket(*b) == w_before);
}

TEST_P(OffloadOptimizer, BadArgumentsAreRefused) {
  EXPECT_THROW(OffloadedAdam(*alloc_, *pool_, 0, opts(StatePlacement::mapped, 0)), InvalidArgument);
  EXPECT_THROW(OffloadedAdam(*alloc_, *pool_, 100, {.chunk_elements = 100}), InvalidArgument);
  EXPECT_THROW(OffloadedAdam(*alloc_, *pool_, 100, {.chunk_elements = 0}), InvalidArgument);
  OffloadedAdam adam(*alloc_, *pool_, 2 * kChunk, opts(StatePlacement::mapped, 0));
  EXPECT_THROW(adam.replace({.chunk_elements = 2 * kChunk}), InvalidArgument);
  auto b = std::make_unique<ParameterBucket>(
      *alloc_, std::vector<ParameterSpec>{{"w", {3 * static_cast<std::int64_t>(kChunk)}}});
  OptimizerState state;
  TensorView g = to_device(std::vector<float>(3 * kChunk, 1.0f));
  EXPECT_THROW(adam.step(*b, g, {}, scaling(), state), InvalidArgument);  // 3 chunks of weights, 2 of states
  TensorView g_small = to_device(std::vector<float>(kChunk, 1.0f));
  EXPECT_THROW(adam.step(g_small, g_small, {}, scaling(), state), Error);
  EXPECT_EQ(state.step, 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, OffloadOptimizer, ::testing::Values("emulated", "emulated_throttled", "cuda"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace stowage
