// Split storage throughput against memcpy of the same bytes, and the fused AdamW step on split
// storage against the unfused path (merge -> fp32 AdamW -> split), single-threaded, on arrays
// far larger than the caches. Bytes/s counts every byte read and written.
#include <benchmark/benchmark.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <new>
#include <random>
#include <vector>

#include "stowage/cuda_device.hpp"
#include "stowage/device.hpp"
#include "stowage/optimizers.hpp"
#include "stowage/precision.hpp"
#include "stowage/simd_level.hpp"

#if defined(STOWAGE_HAVE_CUDA)
#include <memory>

#include "precision/cuda_kernels.hpp"
#endif

namespace {
using namespace stowage;

constexpr std::size_t kN = std::size_t{16} << 20;  // 16 Mi elements: 64 MiB per fp32 array

// 64-byte aligned like the allocator's blocks (malloc's large blocks are only 16-byte aligned,
// which splits every 64-byte vector store across two cache lines).
template <class T>
struct Aligned {
  using value_type = T;
  Aligned() = default;
  template <class U>
  Aligned(const Aligned<U>&) {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{64})); }
  void deallocate(T* p, std::size_t) { ::operator delete (p, std::align_val_t{64}); }
  bool operator==(const Aligned&) const { return true; }
};
template <class T>
using Vec = std::vector<T, Aligned<T>>;

struct Data {
  Vec<float> master, scratch, m, v, gf;
  Vec<std::uint16_t> hi, lo, gb;
  Vec<std::uint8_t> ties;
  Data() : master(kN), scratch(kN), m(kN, 0.0f), v(kN, 0.0f), gf(kN), hi(kN), lo(kN), gb(kN), ties(kN / 8) {
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.0f, 0.02f);
    for (std::size_t i = 0; i < kN; ++i) {
      master[i] = d(rng);
      gf[i] = d(rng) * 1e-2f;
      std::uint32_t u;
      std::memcpy(&u, &gf[i], 4);
      gb[i] = static_cast<std::uint16_t>(u >> 16);
    }
    scratch = master;
  }
  SplitPlanes planes(Rounding r) {
    return {hi.data(), lo.data(), r == Rounding::nearest_even ? ties.data() : nullptr, kN, r};
  }
};
Data& data() {
  static Data d;
  return d;
}

void use_level(benchmark::State& state, int arg) {
  const auto level = static_cast<SimdLevel>(arg);
  if (static_cast<int>(level) > static_cast<int>(detected_simd_level())) {
    state.SkipWithError("CPU lacks this SIMD level");
    return;
  }
  set_simd_level(level);
  state.SetLabel(to_string(level));
}

void BM_Memcpy(benchmark::State& state) {
  Data& d = data();
  for (auto _ : state) {
    std::memcpy(d.scratch.data(), d.master.data(), kN * 4);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kN * 8));
}
BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond);

void BM_Split(benchmark::State& state) {
  use_level(state, static_cast<int>(state.range(0)));
  const auto r = static_cast<Rounding>(state.range(1));
  Data& d = data();
  const SplitPlanes p = d.planes(r);
  for (auto _ : state) {
    split(d.master.data(), p);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * (kN * 8 + tie_bitmap_bytes(kN, r))));
  state.SetLabel(std::string(to_string(simd_level())) + " " + to_string(r));
}
BENCHMARK(BM_Split)->ArgsProduct({{0, 1, 2}, {0, 1}})->Unit(benchmark::kMillisecond);

void BM_Merge(benchmark::State& state) {
  use_level(state, static_cast<int>(state.range(0)));
  const auto r = static_cast<Rounding>(state.range(1));
  Data& d = data();
  const SplitPlanes p = d.planes(r);
  split(d.master.data(), p);
  for (auto _ : state) {
    merge(p, d.scratch.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * (kN * 8 + tie_bitmap_bytes(kN, r))));
  state.SetLabel(std::string(to_string(simd_level())) + " " + to_string(r));
}
BENCHMARK(BM_Merge)->ArgsProduct({{0, 1, 2}, {0, 1}})->Unit(benchmark::kMillisecond);

// AdamW with weight decay; args: rounding, grad dtype (0 f32, 1 bf16). Best SIMD level.
const AdamOptions kAdam{.lr = 1e-4f, .weight_decay = 0.01f};

std::size_t grad_bytes(bool bf16) { return bf16 ? 2 : 4; }

void BM_AdamWFused(benchmark::State& state) {
  set_simd_level(detected_simd_level());
  const auto r = static_cast<Rounding>(state.range(0));
  const bool bf16 = state.range(1) != 0;
  Data& d = data();
  const SplitPlanes p = d.planes(r);
  split(d.master.data(), p);
  const HostGrad g{bf16 ? static_cast<const void*>(d.gb.data()) : d.gf.data(), bf16 ? DType::bf16 : DType::f32};
  std::int64_t step = 0;
  for (auto _ : state) {
    adam_step_range(p, g, d.m.data(), d.v.data(), 0, kN, adam_scalars(kAdam, ++step));
    benchmark::ClobberMemory();
  }
  // read: planes 4, grad, m 4, v 4; write: planes 4, m 4, v 4 (+ tie bitmap both ways)
  const std::size_t bytes = kN * (24 + grad_bytes(bf16)) + 2 * tie_bitmap_bytes(kN, r);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
  state.SetLabel(std::string(to_string(r)) + (bf16 ? " bf16 grad" : " f32 grad"));
}
BENCHMARK(BM_AdamWFused)->ArgsProduct({{0, 1}, {0, 1}})->Unit(benchmark::kMillisecond);

// The unfused path on the same split storage: merge to an fp32 buffer, AdamW on it, split back.
void BM_AdamWUnfused(benchmark::State& state) {
  set_simd_level(detected_simd_level());
  const auto r = static_cast<Rounding>(state.range(0));
  const bool bf16 = state.range(1) != 0;
  Data& d = data();
  const SplitPlanes p = d.planes(r);
  split(d.master.data(), p);
  const HostGrad g{bf16 ? static_cast<const void*>(d.gb.data()) : d.gf.data(), bf16 ? DType::bf16 : DType::f32};
  std::int64_t step = 0;
  for (auto _ : state) {
    merge(p, d.scratch.data());
    adam_step_range_fp32(d.scratch.data(), g, d.m.data(), d.v.data(), 0, kN, adam_scalars(kAdam, ++step));
    split(d.scratch.data(), p);
    benchmark::ClobberMemory();
  }
  // the same useful work as the fused step: bytes counted as for the fused step
  const std::size_t bytes = kN * (24 + grad_bytes(bf16)) + 2 * tie_bitmap_bytes(kN, r);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
  state.SetLabel(std::string(to_string(r)) + (bf16 ? " bf16 grad" : " f32 grad"));
}
BENCHMARK(BM_AdamWUnfused)->ArgsProduct({{0, 1}, {0, 1}})->Unit(benchmark::kMillisecond);

// The fused step's memory traffic (half_up) with one cheap operation per stream instead of
// AdamW: the bandwidth floor of that step measured on its own streams, which one core's memcpy
// (one read and one write stream) understates. `zero` is 0 and `one` is 1 at run time, read from
// volatiles so the compiler cannot drop the work: every array keeps its values. Arg: grad dtype
// (0 f32, 1 bf16).
inline std::uint32_t grad_bits(float g) { return std::bit_cast<std::uint32_t>(g); }
inline std::uint32_t grad_bits(std::uint16_t g) { return g; }
template <class G>
void traffic(std::uint16_t* hi, std::uint16_t* lo, const G* g, float* m, float* v, std::uint32_t zero, float one) {
  for (std::size_t i = 0; i < kN; ++i) {
    const auto gi = static_cast<std::uint16_t>(grad_bits(g[i]) & zero);
    hi[i] = static_cast<std::uint16_t>(hi[i] ^ gi);
    lo[i] = static_cast<std::uint16_t>(lo[i] ^ gi);
    m[i] *= one;
    v[i] *= one;
  }
}
volatile std::uint32_t g_zero = 0;
volatile float g_one = 1.0f;
void BM_AdamWTraffic(benchmark::State& state) {
  const bool bf16 = state.range(0) != 0;
  Data& d = data();
  for (auto _ : state) {
    const std::uint32_t zero = g_zero;
    const float one = g_one;
    if (bf16) traffic(d.hi.data(), d.lo.data(), d.gb.data(), d.m.data(), d.v.data(), zero, one);
    else traffic(d.hi.data(), d.lo.data(), d.gf.data(), d.m.data(), d.v.data(), zero, one);
    benchmark::ClobberMemory();
  }
  const std::size_t bytes = kN * (24 + grad_bytes(bf16));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
  state.SetLabel(bf16 ? "bf16 grad" : "f32 grad");
}
BENCHMARK(BM_AdamWTraffic)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

#if defined(STOWAGE_HAVE_CUDA)
// --- GPU: split / merge / fused AdamW against a device-to-device copy of the same bytes, timed
// with CUDA events (skipped without a GPU) ---
constexpr std::size_t kGpuN = std::size_t{64} << 20;  // 256 MiB per fp32 array, beyond L2

struct Gpu {
  std::unique_ptr<Device> dev;
  float *src = nullptr, *dst = nullptr, *m = nullptr, *v = nullptr, *g = nullptr;
  std::uint16_t *hi = nullptr, *lo = nullptr;
  std::uint8_t* ties = nullptr;
  Event start{}, stop{};
};
Gpu* gpu() {
  static Gpu* g = []() -> Gpu* {
    if (cuda_device_count() == 0) return nullptr;
    auto* x = new Gpu;
    x->dev = make_cuda_device(0);
    // Random data, never zeros (zeros can run faster than real data): weights N(0,1) split into
    // the planes, gradients N(0,1e-2), m N(0,1e-3), v U(0,1e-4).
    std::vector<float> host(kGpuN);
    std::mt19937 rng(7);
    auto upload = [&](auto&& dist) {
      for (float& f : host) f = dist(rng);
      void* p = x->dev->allocate(kGpuN * 4);
      x->dev->copy_async(p, host.data(), kGpuN * 4, CopyKind::host_to_device, kDefaultStream);
      x->dev->synchronize(kDefaultStream);
      return static_cast<float*>(p);
    };
    x->src = upload(std::normal_distribution<float>(0.0f, 1.0f));
    x->dst = upload(std::normal_distribution<float>(0.0f, 1.0f));
    x->g = upload(std::normal_distribution<float>(0.0f, 1e-2f));
    x->m = upload(std::normal_distribution<float>(0.0f, 1e-3f));
    x->v = upload(std::uniform_real_distribution<float>(0.0f, 1e-4f));
    x->hi = static_cast<std::uint16_t*>(x->dev->allocate(kGpuN * 2));
    x->lo = static_cast<std::uint16_t*>(x->dev->allocate(kGpuN * 2));
    x->ties = static_cast<std::uint8_t*>(x->dev->allocate(kGpuN / 8));
    cuda_precision::split(x->src, {x->hi, x->lo, x->ties, kGpuN, Rounding::nearest_even}, 0, kGpuN,
                          native(kDefaultStream));
    x->start = x->dev->create_event(true);
    x->stop = x->dev->create_event(true);
    x->dev->synchronize();
    return x;
  }();
  return g;
}

template <class Fn>
void time_gpu(benchmark::State& state, std::size_t bytes, Fn&& fn) {
  Gpu* g = gpu();
  if (g == nullptr) {
    state.SkipWithError("no CUDA device");
    return;
  }
  for (auto _ : state) {
    g->dev->record(g->start, kDefaultStream);
    fn(*g);
    g->dev->record(g->stop, kDefaultStream);
    g->dev->synchronize(g->stop);
    state.SetIterationTime(g->dev->elapsed_ms(g->start, g->stop) / 1e3);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

SplitPlanes gpu_planes(Gpu& g, Rounding r) {
  return {g.hi, g.lo, r == Rounding::nearest_even ? g.ties : nullptr, kGpuN, r};
}

void BM_CudaCopyD2D(benchmark::State& state) {
  time_gpu(state, kGpuN * 8,
           [](Gpu& g) { g.dev->copy_async(g.dst, g.src, kGpuN * 4, CopyKind::device_to_device, kDefaultStream); });
}
BENCHMARK(BM_CudaCopyD2D)->UseManualTime()->Unit(benchmark::kMillisecond);

void BM_CudaSplit(benchmark::State& state) {
  const auto r = static_cast<Rounding>(state.range(0));
  time_gpu(state, kGpuN * 8 + tie_bitmap_bytes(kGpuN, r),
           [r](Gpu& g) { cuda_precision::split(g.src, gpu_planes(g, r), 0, kGpuN, native(kDefaultStream)); });
  state.SetLabel(to_string(r));
}
BENCHMARK(BM_CudaSplit)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);

void BM_CudaMerge(benchmark::State& state) {
  const auto r = static_cast<Rounding>(state.range(0));
  time_gpu(state, kGpuN * 8 + tie_bitmap_bytes(kGpuN, r),
           [r](Gpu& g) { cuda_precision::merge(gpu_planes(g, r), g.dst, 0, kGpuN, native(kDefaultStream)); });
  state.SetLabel(to_string(r));
}
BENCHMARK(BM_CudaMerge)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);

void BM_CudaAdamWFused(benchmark::State& state) {
  const auto r = static_cast<Rounding>(state.range(0));
  std::int64_t step = 0;
  time_gpu(state, kGpuN * 28 + 2 * tie_bitmap_bytes(kGpuN, r), [&](Gpu& g) {
    const detail::AdamArgs a{gpu_planes(g, r), g.g, false, g.m, g.v, adam_scalars(kAdam, ++step)};
    cuda_precision::adam(a, 0, kGpuN, native(kDefaultStream));
  });
  state.SetLabel(to_string(r));
}
BENCHMARK(BM_CudaAdamWFused)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);
#endif

}  // namespace

BENCHMARK_MAIN();
