// The recompute registry on each backend: release gives bytes back and keeps the views,
// before_backward brings back bit-identical contents on the compute stream, aliasing and
// swapped storages are refused without changing anything, random state recomputes the same.
// Device bytes move only through the device's copies, so CUDA runs it too (and skips without a GPU).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>

#include "recompute_test_util.hpp"
#include "stowage/activations.hpp"
#include "stowage/counter_rng.hpp"
#include "stowage/cuda_device.hpp"
#include "stowage/recompute.hpp"

namespace stowage {
namespace {

using namespace stowage::testing;

class RecomputeRegistry : public ::testing::TestWithParam<DeviceKind> {
 protected:
  void SetUp() override {
    if (GetParam() == DeviceKind::cuda && cuda_device_count() == 0)
      GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
    dev_ = make_test_device(GetParam(), {.capacity = std::size_t{256} << 20});
    alloc_ = std::make_unique<CachingAllocator>(*dev_);
    stream_ = dev_->create_stream();
  }
  void TearDown() override {
    if (!dev_) return;  // skipped
    dev_->synchronize();
    alloc_.reset();
    dev_->destroy_stream(stream_);
  }
  TensorView input(DType t, std::vector<std::int64_t> shape, unsigned seed) {
    auto x = TensorView::empty(*alloc_, t, shape, stream_);
    auto v = normal_values(static_cast<std::size_t>(x.numel()), seed, 2.0f);
    if (t == DType::f32) {
      upload(*dev_, x, v, stream_);
    } else {
      std::vector<std::uint16_t> h(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) {
        std::uint32_t u;
        std::memcpy(&u, &v[i], 4);
        h[i] = static_cast<std::uint16_t>(u >> 16);
      }
      upload(*dev_, x, h, stream_);
    }
    return x;
  }
  // Reuses freed bytes for junk, so a rematerialised tensor cannot inherit its old contents.
  void scribble(std::size_t nbytes) {
    auto junk = TensorView::empty(*alloc_, DType::u8, {static_cast<std::int64_t>(nbytes)}, stream_);
    dev_->fill_async(junk.data(), 0xAB, nbytes, stream_);
  }
  RecomputeOptions opts() {
    RecomputeOptions o;
    o.compute_stream = stream_;
    o.seed = 1234;
    return o;
  }

  std::unique_ptr<Device> dev_;
  std::unique_ptr<CachingAllocator> alloc_;
  Stream stream_{};
};

RecomputeFn unary(Activation a) {
  return [a](const RecomputeContext& c) { activation_forward(a, c.inputs[0], c.outputs[0], c.stream); };
}

TEST_P(RecomputeRegistry, ReleaseReturnsBytesAndRematerialisesBitIdentical) {
  Recompute rc(*alloc_, opts());
  for (DType t : {DType::f32, DType::bf16}) {
    auto x = input(t, {67, 301}, 1);  // ragged rows
    auto y = rc.forward(3, "mlp.act", {x}, {{t, {67, 301}}}, unary(Activation::gelu_erf))[0];
    const auto before = fnv1a(download(*dev_, y, stream_));
    const auto allocated = alloc_->stats().allocated_bytes.all.current;
    const std::size_t block = alloc_->block_size(y.data());

    EXPECT_EQ(rc.release(3), y.nbytes());
    EXPECT_EQ(y.storage().state(), StorageState::released);
    EXPECT_EQ(alloc_->stats().allocated_bytes.all.current, allocated - static_cast<std::int64_t>(block));
    EXPECT_EQ(y.shape(), (std::vector<std::int64_t>{67, 301}));  // the view keeps its shape
    EXPECT_EQ(y.dtype(), t);
    EXPECT_THROW(y.data(), InvalidArgument);
    EXPECT_TRUE(rc.released(3));
    EXPECT_EQ(rc.stats().released_bytes_now, y.nbytes());
    EXPECT_EQ(rc.release(3), 0u);  // already released: nothing more to give

    scribble(y.nbytes());
    rc.before_backward(3);
    EXPECT_EQ(y.storage().state(), StorageState::resident);
    EXPECT_EQ(alloc_->stats().allocated_bytes.all.current, allocated);
    EXPECT_EQ(fnv1a(download(*dev_, y, stream_)), before);
    rc.after_backward(3);
  }
  EXPECT_EQ(rc.stats().releases, 2u);
  EXPECT_EQ(rc.stats().rematerializations, 2u);
}

TEST_P(RecomputeRegistry, SwiGLUOnFusedProjectionAndBiasGeLURematerialise) {
  Recompute rc(*alloc_, opts());
  auto proj = input(DType::bf16, {33, 2 * 88}, 2);  // gate | up, one fused projection
  auto bias_in = input(DType::f32, {33, 88}, 3);
  auto bias = input(DType::f32, {88}, 4);
  auto y1 = rc.forward(1, "mlp.swiglu", {proj}, {{DType::bf16, {33, 88}}}, [](const RecomputeContext& c) {
    const auto& p = c.inputs[0];
    gated_activation_forward(Activation::silu, p.slice(1, 0, 88), p.slice(1, 88, 176), c.outputs[0], c.stream);
  })[0];
  auto y2 = rc.forward(1, "mlp.bias_gelu", {bias_in, bias}, {{DType::f32, {33, 88}}}, [](const RecomputeContext& c) {
    bias_activation_forward(Activation::gelu_tanh, c.inputs[0], c.inputs[1], c.outputs[0], c.stream);
  })[0];
  const auto h1 = fnv1a(download(*dev_, y1, stream_)), h2 = fnv1a(download(*dev_, y2, stream_));
  EXPECT_EQ(rc.release(1), y1.nbytes() + y2.nbytes());
  scribble(y1.nbytes() + y2.nbytes());
  rc.before_backward(1);
  EXPECT_EQ(fnv1a(download(*dev_, y1, stream_)), h1);
  EXPECT_EQ(fnv1a(download(*dev_, y2, stream_)), h2);
}

TEST_P(RecomputeRegistry, RefusesAnOutputSharingStorageWithAnInput) {
  Recompute rc(*alloc_, opts());
  auto x = input(DType::f32, {16, 64}, 5);
  rc.forward_into(0, "act_inplace", {x}, {x}, unary(Activation::relu));  // y is x
  const auto stats = alloc_->stats();
  EXPECT_THROW(rc.release(0), InvalidArgument);
  EXPECT_EQ(x.storage().state(), StorageState::resident);
  EXPECT_EQ(alloc_->stats().allocated_bytes.all.current, stats.allocated_bytes.all.current);
  EXPECT_EQ(rc.stats().releases, 0u);
}

TEST_P(RecomputeRegistry, RefusesWhileAnotherViewAliasesAndChangesNothing) {
  Recompute rc(*alloc_, opts());
  auto x = input(DType::f32, {16, 64}, 6);
  auto y = rc.forward(0, "act", {x}, {{DType::f32, {16, 64}}}, unary(Activation::silu))[0];
  auto z = rc.forward(0, "act2", {x}, {{DType::f32, {16, 64}}}, unary(Activation::relu))[0];
  {
    auto alias = y.slice(0, 0, 4);  // e.g. kept by another op for its backward
    EXPECT_THROW(rc.release(0), InvalidArgument);
    EXPECT_EQ(y.storage().state(), StorageState::resident);
    EXPECT_EQ(z.storage().state(), StorageState::resident);  // all or nothing
  }
  {
    TensorView copy = y;  // a second handle to the same storage is an alias too
    EXPECT_THROW(rc.release(0), InvalidArgument);
  }
  EXPECT_EQ(rc.release(0), y.nbytes() + z.nbytes());  // aliases gone: allowed
}

TEST_P(RecomputeRegistry, AnOutputThatIsAnotherFunctionsInputIsNotReleased) {
  Recompute rc(*alloc_, opts());
  auto x = input(DType::f32, {8, 40}, 7);
  auto a = rc.forward(2, "act", {x}, {{DType::f32, {8, 40}}}, unary(Activation::gelu_erf))[0];
  auto d = rc.forward(2, "act2", {a}, {{DType::f32, {8, 40}}}, unary(Activation::relu))[0];
  EXPECT_THROW(rc.release(2), InvalidArgument);
  EXPECT_EQ(d.storage().state(), StorageState::resident);
}

TEST_P(RecomputeRegistry, SwappedStoragesAreNeverAlsoReleased) {
  Recompute rc(*alloc_, opts());
  auto x = input(DType::f32, {8, 40}, 8);
  auto y = rc.forward(4, "act", {x}, {{DType::f32, {8, 40}}}, unary(Activation::silu))[0];
  y.storage().release(StorageState::swapped_out);  // what the swap scheduler does
  EXPECT_THROW(rc.release(4), InvalidArgument);
  EXPECT_EQ(y.storage().state(), StorageState::swapped_out);

  // An input that is swapped out when backward comes: refused, nothing materialised.
  auto x2 = input(DType::f32, {8, 40}, 9);
  auto y2 = rc.forward(5, "act", {x2}, {{DType::f32, {8, 40}}}, unary(Activation::silu))[0];
  rc.release(5);
  x2.storage().release(StorageState::swapped_out);
  const auto allocated = alloc_->stats().allocated_bytes.all.current;
  EXPECT_THROW(rc.before_backward(5), InvalidArgument);
  EXPECT_EQ(y2.storage().state(), StorageState::released);
  EXPECT_EQ(alloc_->stats().allocated_bytes.all.current, allocated);
}

TEST_P(RecomputeRegistry, SnapshotsTagTheActivation) {
  Recompute rc(*alloc_, opts());
  auto x = input(DType::f32, {8, 128}, 10);
  auto y = rc.forward(3, "mlp.act", {x}, {{DType::f32, {8, 128}}}, unary(Activation::gelu_tanh))[0];
  auto tagged = [&] {
    std::size_t n = 0;
    for (const auto& seg : alloc_->snapshot().segments)
      for (const auto& b : seg.blocks)
        if (b.state == BlockState::active_allocated && b.tag == "layer3.mlp.act") n += b.requested_size;
    return n;
  };
  EXPECT_EQ(tagged(), y.nbytes());
  rc.release(3);
  EXPECT_EQ(tagged(), 0u);
  rc.before_backward(3);
  EXPECT_EQ(tagged(), y.nbytes());
  const auto entries = rc.entries();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].tag, "layer3.mlp.act");
  EXPECT_EQ(entries[0].state, StorageState::resident);
}

// A consumer on a second stream, ordered after the recompute by an event, sees the original
// bytes; before_backward itself never waits on the device.
TEST_P(RecomputeRegistry, HookIsStreamOrderedAcrossStreams) {
  Recompute rc(*alloc_, opts());
  auto x = input(DType::f32, {64, 256}, 11);
  auto slow = [](const RecomputeContext& c) {
    if (c.recomputing)  // widen the window in which a missing dependency would show
      c.device.launch_host(c.stream, [] { std::this_thread::sleep_for(std::chrono::milliseconds(30)); });
    activation_forward(Activation::gelu_erf, c.inputs[0], c.outputs[0], c.stream);
  };
  auto y = rc.forward(7, "mlp.act", {x}, {{DType::f32, {64, 256}}}, slow)[0];
  const auto expected = fnv1a(download(*dev_, y, stream_));
  // Made first, so that nothing after the gate waits on the held stream: the consumer, and the
  // buffer it copies y into, taken before y's block is freed (which the recompute then reuses).
  const Stream consumer = dev_->create_stream();
  const Event done = dev_->create_event();
  auto seen = TensorView::empty(*alloc_, DType::f32, {64, 256}, stream_);
  rc.release(7);
  scribble(y.nbytes());

  std::promise<void> go;
  auto gate = go.get_future().share();
  std::atomic<bool> gate_timed_out{false};
  dev_->launch_host(stream_, [gate, &gate_timed_out] {
    gate_timed_out = gate.wait_for(std::chrono::seconds(20)) != std::future_status::ready;
  });
  rc.before_backward(7);  // returns while the compute stream is still held at the gate
  dev_->record(done, stream_);
  dev_->wait(consumer, done);
  // The consumer reads y on its own stream: a device copy, valid on a GPU too.
  dev_->copy_async(seen.data(), y.data(), y.nbytes(), CopyKind::device_to_device, consumer);
  go.set_value();
  dev_->synchronize(consumer);
  EXPECT_FALSE(gate_timed_out.load());
  EXPECT_EQ(fnv1a(download(*dev_, seen, consumer)), expected);
  dev_->destroy_event(done);
  dev_->destroy_stream(consumer);
}

// Dropout with probability p drawn from the registration's counter-based stream.
RecomputeFn dropout(float p) {
  return [p](const RecomputeContext& c) {
    stowage::testing::dropout(c.device, c.stream, c.rng, p, c.inputs[0], c.outputs[0]);
  };
}

TEST_P(RecomputeRegistry, DropoutRecomputesTheSameMask) {
  Recompute rc(*alloc_, opts());
  auto x = input(DType::f32, {32, 100}, 12);
  auto y1 = rc.forward(1, "dropout", {x}, {{DType::f32, {32, 100}}}, dropout(0.25f))[0];
  auto y2 = rc.forward(2, "dropout", {x}, {{DType::f32, {32, 100}}}, dropout(0.25f))[0];
  const auto b1 = download(*dev_, y1, stream_), b2 = download(*dev_, y2, stream_);
  EXPECT_NE(fnv1a(b1), fnv1a(b2));  // each registration draws its own mask
  rc.release(1);
  rc.release(2);
  scribble(2 * y1.nbytes());
  rc.before_backward(2);
  rc.before_backward(1);
  EXPECT_EQ(download(*dev_, y1, stream_), b1);
  EXPECT_EQ(download(*dev_, y2, stream_), b2);
}

TEST_P(RecomputeRegistry, PrefetchDistanceRematerialisesTheNextLayerEarly) {
  auto o = opts();
  o.prefetch_distance = 1;
  Recompute rc(*alloc_, o);
  std::vector<TensorView> xs, ys;
  for (int l = 0; l < 3; ++l) {
    xs.push_back(input(DType::f32, {8, 64}, 20 + l));
    ys.push_back(rc.forward(l, "act", {xs.back()}, {{DType::f32, {8, 64}}}, unary(Activation::silu))[0]);
    rc.release(l);
  }
  rc.before_backward(2);
  EXPECT_EQ(ys[2].storage().state(), StorageState::resident);
  EXPECT_EQ(ys[1].storage().state(), StorageState::resident);  // one layer early
  EXPECT_EQ(ys[0].storage().state(), StorageState::released);
  // A prefetched layer whose input is not back yet is left for its own hook.
  xs[0].storage().release(StorageState::swapped_out);
  rc.before_backward(1);
  EXPECT_EQ(ys[0].storage().state(), StorageState::released);
  EXPECT_EQ(rc.stats().prefetches_deferred, 1u);
}

TEST_P(RecomputeRegistry, BadRegistrationsAreRefused) {
  EXPECT_THROW(Recompute(*alloc_, RecomputeOptions{.prefetch_distance = -1}), InvalidArgument);
  Recompute rc(*alloc_, opts());
  auto x = input(DType::f32, {4, 8}, 30);
  EXPECT_THROW(rc.forward(0, "f", {x}, {{DType::f32, {4, 8}}}, RecomputeFn{}), InvalidArgument);
  EXPECT_THROW(rc.forward(0, "f", {TensorView{}}, {{DType::f32, {4, 8}}}, unary(Activation::relu)), InvalidArgument);
  auto y = rc.forward(0, "f", {x}, {{DType::f32, {4, 8}}}, unary(Activation::relu))[0];
  EXPECT_THROW(rc.forward_into(0, "g", {x}, {y}, unary(Activation::relu)), InvalidArgument);  // registered
  EXPECT_EQ(rc.entries().size(), 1u);
  EXPECT_EQ(rc.release(99), 0u);  // nothing registered there
  EXPECT_NO_THROW(rc.before_backward(99));
}

// A function that calls back into its own registry used to deadlock (before_backward runs it
// under the registry's lock). Now the call throws, from forward and from a recomputation, and
// what the registry holds is as it was: the outputs of a refused recomputation stay released and
// come back bit-identical once the function behaves. Another registry may be called.
TEST_P(RecomputeRegistry, AFunctionCallingBackIntoItsRegistryIsRefusedNotDeadlocked) {
  Recompute rc(*alloc_, opts());
  Recompute other(*alloc_, opts());
  auto x = input(DType::f32, {16, 32}, 40);
  std::string seen;
  auto call_back = [&](const RecomputeContext&) { (void)rc.stats(); };
  try {
    rc.forward(0, "f", {x}, {{DType::f32, {16, 32}}}, call_back);
    ADD_FAILURE() << "a call back from forward's function was accepted";
  } catch (const InvalidArgument& e) {
    seen = e.what();
  }
  EXPECT_NE(seen.find("Recompute::stats: called from inside a function"), std::string::npos) << seen;
  EXPECT_TRUE(rc.entries().empty());  // nothing was registered

  bool misbehave = false;
  auto y = rc.forward(1, "g", {x}, {{DType::f32, {16, 32}}}, [&](const RecomputeContext& c) {
    if (misbehave && c.recomputing) (void)rc.entries();
    (void)other.entries();  // another registry is fine
    activation_forward(Activation::silu, c.inputs[0], c.outputs[0], c.stream);
  })[0];
  const auto before = fnv1a(download(*dev_, y, stream_));
  ASSERT_EQ(rc.release(1), y.nbytes());
  misbehave = true;
  std::promise<std::string> outcome;
  auto finished = outcome.get_future();
  std::thread worker([&rc, outcome = std::move(outcome)]() mutable {
    try {
      rc.before_backward(1);
      outcome.set_value("accepted");
    } catch (const InvalidArgument& e) {
      outcome.set_value(e.what());
    }
  });
  if (finished.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    std::fprintf(stderr, "before_backward deadlocked on a function calling back into its registry\n");
    std::_Exit(1);  // the registry's lock stays held: nothing after this could finish
  }
  worker.join();
  seen = finished.get();
  EXPECT_NE(seen.find("Recompute::entries: called from inside a function this registry is running"), std::string::npos)
      << seen;
  EXPECT_EQ(y.storage().state(), StorageState::released);
  EXPECT_TRUE(rc.released(1));
  misbehave = false;
  rc.before_backward(1);
  EXPECT_EQ(fnv1a(download(*dev_, y, stream_)), before);
  rc.after_backward(1);
}

INSTANTIATE_TEST_SUITE_P(Backends, RecomputeRegistry, ::testing::Values(DeviceKind::emulated, DeviceKind::cuda),
                         [](const auto& info) { return std::string(to_string(info.param)); });

TEST(CounterRng, PhiloxMatchesRandom123KnownAnswers) {
  EXPECT_EQ(philox::generate({0, 0, 0, 0}, {0, 0}),
            (philox::Counter{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox::generate({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}),
            (philox::Counter{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  const RngState s{42, 7};
  EXPECT_EQ(random_word(s, 5), random_block(s, 1)[1]);
  EXPECT_NE(random_word(s, 5), random_word(RngState{42, 8}, 5));
  for (std::uint64_t i = 0; i < 1000; ++i) {
    const float u = random_uniform(s, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
  }
}

}  // namespace
}  // namespace stowage
