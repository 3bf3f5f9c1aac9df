// ParameterBucket on a device: layout and views, fp32 read/write, shards, fused steps equal to
// the host kernels, bad input that changes nothing, and the memory saving measured through the
// allocator. Runs on the emulated device and, when a GPU is lent, on CUDA.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <type_traits>
#include <vector>

#include "stowage/allocator.hpp"
#include "stowage/bucket_optimizers.hpp"
#include "stowage/cuda_device.hpp"
#include "stowage/device.hpp"
#include "stowage/emulated_device.hpp"
#include "stowage/error.hpp"
#include "stowage/parameter_bucket.hpp"

namespace stowage {
namespace {

class Bucket : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "cuda") {
      if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
      device_ = make_cuda_device(0);
    } else {
      device_ = make_emulated_device(0, {.capacity = std::size_t{1} << 30});
    }
    alloc_ = std::make_unique<CachingAllocator>(*device_);
  }
  void TearDown() override {
    alloc_.reset();
    device_.reset();
  }

  std::vector<std::uint8_t> download(const Storage& s) {
    std::vector<std::uint8_t> out(s.nbytes());
    device_->copy_async(out.data(), s.data(), out.size(), CopyKind::device_to_host, kDefaultStream);
    device_->synchronize(kDefaultStream);
    return out;
  }
  template <class T>
  TensorView upload(const std::vector<T>& host, DType t) {
    TensorView v = TensorView::empty(*alloc_, t, {static_cast<std::int64_t>(host.size())});
    device_->copy_async(v.data(), host.data(), host.size() * sizeof(T), CopyKind::host_to_device, kDefaultStream);
    device_->synchronize(kDefaultStream);
    return v;
  }
  template <class T>
  std::vector<T> fetch(const TensorView& v) {
    std::vector<T> out(static_cast<std::size_t>(v.numel()));
    device_->synchronize(kDefaultStream);
    device_->copy_async(out.data(), v.data(), out.size() * sizeof(T), CopyKind::device_to_host, kDefaultStream);
    device_->synchronize(kDefaultStream);
    return out;
  }
  std::int64_t allocated() const { return alloc_->stats().allocated_bytes.all.current; }

  std::unique_ptr<Device> device_;
  std::unique_ptr<CachingAllocator> alloc_;
};

// A small GPT: token and position embeddings, two blocks of attention and MLP weights and norms.
std::vector<ParameterSpec> small_model() {
  std::vector<ParameterSpec> p = {{"wte", {512, 256}}, {"wpe", {12, 256}}};
  for (int l = 0; l < 2; ++l) {
    const std::string b = "h" + std::to_string(l) + ".";
    p.push_back({b + "ln1", {256}});
    p.push_back({b + "attn.qkv", {768, 256}});
    p.push_back({b + "attn.proj", {256, 256}});
    p.push_back({b + "ln2", {256}});
    p.push_back({b + "mlp.fc1", {1024, 256}});
    p.push_back({b + "mlp.fc2", {256, 1024}});
  }
  return p;
}

std::vector<float> random_values(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.02f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST_P(Bucket, LayoutViewsAndFp32RoundTrip) {
  const std::vector<ParameterSpec> specs = {{"a", {3, 5}}, {"b", {100}}, {"c", {7, 1, 9}}};
  ParameterBucket bucket(*alloc_, specs, {.rounding = Rounding::nearest_even, .align_elements = 64});
  ASSERT_EQ(bucket.size(), 3u);
  EXPECT_EQ(bucket.slot(0).offset, 0u);
  EXPECT_EQ(bucket.slot(1).offset, 64u);
  EXPECT_EQ(bucket.slot(2).offset, 192u);
  EXPECT_EQ(bucket.numel(), 256u);
  EXPECT_EQ(bucket.nbytes(), 4u * 256 + 32);
  EXPECT_EQ(bucket.index_of("c"), 2u);
  const TensorView c = bucket.bf16(2);
  EXPECT_EQ(c.dtype(), DType::bf16);
  EXPECT_EQ(c.shape(), (std::vector<std::int64_t>{7, 1, 9}));
  EXPECT_EQ(c.byte_offset(), 2u * 192);
  EXPECT_TRUE(c.storage().same_as(bucket.storage()));

  std::vector<std::vector<float>> values;
  for (std::size_t i = 0; i < bucket.size(); ++i) {
    values.push_back(random_values(bucket.slot(i).numel, 10 + static_cast<unsigned>(i)));
    values.back()[0] = std::bit_cast<float>(0x3F808000u);  // a tie that RNE rounds down
    bucket.write_fp32(i, values.back().data(), values.back().size());
  }
  for (std::size_t i = 0; i < bucket.size(); ++i) {
    std::vector<float> back(bucket.slot(i).numel);
    bucket.read_fp32(i, back.data(), back.size());
    EXPECT_EQ(std::memcmp(back.data(), values[i].data(), back.size() * 4), 0) << bucket.slot(i).name;
    const auto bf16 = fetch<std::uint16_t>(bucket.bf16(i).reshape({bucket.bf16(i).numel()}).view_as(DType::u16));
    for (std::size_t k = 0; k < back.size(); ++k) {
      ASSERT_EQ(bf16[k], split_bits(std::bit_cast<std::uint32_t>(values[i][k]), Rounding::nearest_even).bf16);
    }
    EXPECT_EQ(bf16[0], 0x3F80);  // round-to-nearest-even, not half up
  }
}

TEST_P(Bucket, ShardsCoverTheBucketAtAlignedBoundaries) {
  ParameterBucket bucket(*alloc_, small_model(), {.align_elements = 64});
  for (int world : {1, 3, 8, 64}) {
    std::size_t next = 0;
    for (int r = 0; r < world; ++r) {
      const auto [b, e] = bucket.shard(r, world);
      EXPECT_EQ(b, next);
      EXPECT_LE(b, e);
      EXPECT_EQ(b % 64, 0u);
      next = e;
    }
    EXPECT_EQ(next, bucket.numel());
  }
  EXPECT_THROW(bucket.shard(3, 3), InvalidArgument);
  EXPECT_THROW(bucket.shard(0, 0), InvalidArgument);
}

// The saving, measured: the same model as fp32 master + separate bf16 copy, and as shared storage.
TEST_P(Bucket, SharedStorageSavesExactlyTwoBytesPerParameter) {
  for (Rounding r : {Rounding::half_up, Rounding::nearest_even}) {
    const std::int64_t start = allocated();
    std::size_t n = 0;
    for (const auto& p : small_model())
      n += static_cast<std::size_t>(p.shape.size() == 1 ? p.shape[0] : p.shape[0] * p.shape[1]);
    ASSERT_EQ(n % 4096, 0u) << "sizes chosen so the allocator's 512-byte rounding is exact";
    std::int64_t separate = 0, shared = 0;
    {
      Storage master = Storage::allocate(*alloc_, 4 * n);
      Storage copy = Storage::allocate(*alloc_, 2 * n);
      separate = allocated() - start;
    }
    {
      ParameterBucket bucket(*alloc_, small_model(), {.rounding = r});
      ASSERT_EQ(bucket.numel(), n);  // every shape is a multiple of 64: no padding
      shared = allocated() - start;
    }
    EXPECT_EQ(separate, static_cast<std::int64_t>(6 * n));
    EXPECT_EQ(separate - shared, static_cast<std::int64_t>(2 * n - tie_bitmap_bytes(n, r))) << to_string(r);
    EXPECT_EQ(allocated(), start);
  }
}

TEST_P(Bucket, AdamOnBucketMatchesHostKernelsAndShardsAgree) {
  ParameterBucket whole(*alloc_, small_model(), {.rounding = Rounding::nearest_even});
  ParameterBucket sharded(*alloc_, small_model(), {.rounding = Rounding::nearest_even});
  const std::size_t n = whole.numel();
  // host copy of the same split storage
  std::vector<std::uint16_t> hi(n), lo(n);
  std::vector<std::uint8_t> ties(n / 8);
  SplitPlanes host{hi.data(), lo.data(), ties.data(), n, Rounding::nearest_even};
  const std::vector<float> init = random_values(n, 3);
  split(init.data(), host);
  for (std::size_t i = 0; i < whole.size(); ++i) {
    whole.write_fp32(i, init.data() + whole.slot(i).offset, whole.slot(i).numel);
    sharded.write_fp32(i, init.data() + whole.slot(i).offset, whole.slot(i).numel);
  }
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  TensorView dm = upload(m, DType::f32), dv = upload(v, DType::f32);
  const int world = 3;
  std::vector<TensorView> sm, sv;
  for (int r = 0; r < world; ++r) {
    const auto [b, e] = sharded.shard(r, world);
    sm.push_back(upload(std::vector<float>(e - b, 0.0f), DType::f32));
    sv.push_back(upload(std::vector<float>(e - b, 0.0f), DType::f32));
  }
  const AdamOptions o{.lr = 1e-3f, .weight_decay = 0.1f};
  OptimizerState hs, ds, ss;
  for (int step = 1; step <= 5; ++step) {
    std::vector<float> g = random_values(n, 100 + step);
    std::vector<std::uint16_t> gb(n);
    for (std::size_t i = 0; i < n; ++i) gb[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(g[i]) >> 16);
    TensorView dg = upload(gb, DType::bf16);
    ASSERT_TRUE(adam_step(host, {gb.data(), DType::bf16}, m.data(), v.data(), o, {}, hs).applied);
    ASSERT_TRUE(adam_step(whole, dg, dm, dv, o, {}, ds).applied);
    for (int r = 0; r < world; ++r) {
      const auto [b, e] = sharded.shard(r, world);
      OptimizerState rank_state = ss;
      ASSERT_TRUE(adam_step(sharded, dg, sm[r], sv[r], o, {}, rank_state, {b, e}).applied);
      if (r == world - 1) ss = rank_state;
    }
  }
  const auto planes = download(whole.storage());
  EXPECT_EQ(std::memcmp(planes.data(), hi.data(), 2 * n), 0);
  EXPECT_EQ(std::memcmp(planes.data() + 2 * n, lo.data(), 2 * n), 0);
  EXPECT_EQ(std::memcmp(planes.data() + 4 * n, ties.data(), n / 8), 0);
  EXPECT_EQ(download(sharded.storage()), planes);
  EXPECT_EQ(fetch<float>(dm), m);
}

std::uint64_t fnv(const std::vector<std::uint8_t>& bytes) {
  std::uint64_t h = 1469598103934665603ull;
  for (auto b : bytes) h = (h ^ b) * 1099511628211ull;
  return h;
}

TEST_P(Bucket, BadInputThrowsAndChangesNoByte) {
  ParameterBucket bucket(*alloc_, {{"w", {64, 8}}, {"b", {8}}}, {.rounding = Rounding::nearest_even});
  const std::vector<float> w = random_values(512, 9);
  bucket.write_fp32(0, w.data(), w.size());
  const std::uint64_t before = fnv(download(bucket.storage()));
  const std::int64_t bytes = allocated();

  EXPECT_THROW(bucket.write_fp32(0, w.data(), 511), InvalidArgument);  // size mismatch
  EXPECT_THROW(bucket.write_fp32(2, w.data(), 8), InvalidArgument);    // no such parameter
  EXPECT_THROW(bucket.write_fp32(1, reinterpret_cast<const float*>(reinterpret_cast<const char*>(w.data()) + 1), 8),
               InvalidArgument);  // misaligned
  std::vector<float> out(8);
  EXPECT_THROW(bucket.read_fp32(1, out.data(), 7), InvalidArgument);
  EXPECT_THROW(bucket.index_of("nope"), InvalidArgument);
  // buckets that cannot be made: nothing is allocated
  EXPECT_THROW(ParameterBucket(*alloc_, {{"x", {100}}, {"y", {100}}}, {.capacity_elements = 150}), InvalidArgument);
  EXPECT_THROW(ParameterBucket(*alloc_, {{"x", {100}}}, {.align_elements = 12}), InvalidArgument);
  EXPECT_THROW(ParameterBucket(*alloc_, {{"x", {4}}, {"x", {4}}}), InvalidArgument);
  EXPECT_THROW(ParameterBucket(*alloc_, {{"x", {-1, 4}}}), InvalidArgument);
  EXPECT_THROW(ParameterBucket(*alloc_, {{"x", {1 << 30, 1 << 30}}}), InvalidArgument);
  EXPECT_EQ(allocated(), bytes);
  // steps with mismatched sizes, dtypes or ranges
  const std::size_t n = bucket.numel();
  TensorView g = upload(std::vector<float>(n, 1.0f), DType::f32);
  TensorView m = upload(std::vector<float>(n, 0.0f), DType::f32);
  TensorView m2 = upload(std::vector<float>(n, 0.0f), DType::f32);
  OptimizerState st;
  EXPECT_THROW(adam_step(bucket, g, m, m, {}, {}, st), InvalidArgument);  // m and v alias
  // shard-local state of the wrong length
  TensorView short_m = upload(std::vector<float>(n - 16, 0.0f), DType::f32);
  EXPECT_THROW(sgd_step(bucket, g, short_m, {.momentum = 0.9f}, {}, st, {0, n - 8}), InvalidArgument);
  TensorView short_g = upload(std::vector<float>(n - 8, 1.0f), DType::f32);
  TensorView int_m = upload(std::vector<std::int32_t>(n, 0), DType::i32);
  EXPECT_THROW(adam_step(bucket, short_g, m, m2, {}, {}, st), InvalidArgument);
  EXPECT_THROW(adam_step(bucket, g, int_m, m2, {}, {}, st), InvalidArgument);
  EXPECT_THROW(adam_step(bucket, g, m, m2, {}, {}, st, {4, 64}), InvalidArgument);     // begin not a multiple of 8
  EXPECT_THROW(adam_step(bucket, g, m, m2, {}, {}, st, {0, n + 8}), InvalidArgument);  // past the end
  EXPECT_THROW(sgd_step(bucket, g, TensorView{}, {.momentum = 0.9f}, {}, st), InvalidArgument);
  EXPECT_EQ(st.step, 0);
  device_->synchronize();
  EXPECT_EQ(fnv(download(bucket.storage())), before);
}

// align_elements is a power of two of at least 8 (the header said "a multiple of 8", and 24 was
// refused); a bucket is move-only (a copy shared its storage: writes through one changed the
// other).
static_assert(!std::is_copy_constructible_v<ParameterBucket> && !std::is_copy_assignable_v<ParameterBucket>);
static_assert(std::is_nothrow_move_constructible_v<ParameterBucket> &&
              std::is_nothrow_move_assignable_v<ParameterBucket>);

TEST_P(Bucket, AlignmentIsAPowerOfTwoAndABucketMovesButNeverCopies) {
  for (std::size_t a : {8, 16, 32, 128, 4096}) {
    ParameterBucket b(*alloc_, {{"x", {100}}, {"y", {3}}}, {.align_elements = a});
    EXPECT_EQ(b.slot(1).offset % a, 0u) << a;
  }
  for (std::size_t a : {0, 4, 12, 24, 40, 96}) {
    EXPECT_THROW(ParameterBucket(*alloc_, {{"x", {100}}}, {.align_elements = a}), InvalidArgument) << a;
  }
  ParameterBucket first(*alloc_, {{"w", {64}}});
  std::vector<float> ones(64, 1.0f), back(64);
  first.write_fp32(0, ones.data(), 64);
  const void* id = first.storage().id();
  ParameterBucket second = std::move(first);
  EXPECT_EQ(second.storage().id(), id);
  second.read_fp32(0, back.data(), 64);
  EXPECT_EQ(back, ones);
  EXPECT_THROW(first.read_fp32(0, back.data(), 64), InvalidArgument);            // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(first.size(), 0u);                                                   // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(first.numel(), 0u);                                                  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(first.shard(0, 2), std::make_pair(std::size_t{0}, std::size_t{0}));  // NOLINT(bugprone-use-after-move)
  first = std::move(second);
  EXPECT_EQ(first.numel(), 64u);
  EXPECT_EQ(first.storage().id(), id);
}

INSTANTIATE_TEST_SUITE_P(Backends, Bucket, ::testing::Values("emulated", "cuda"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace stowage
