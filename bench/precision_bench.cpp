// Split storage throughput against memcpy of the same bytes, and the fused AdamW step on split
// storage against the unfused path (merge -> fp32 AdamW -> split), single-threaded, on arrays
// far larger than the caches. Bytes/s counts every byte read and written.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "stowage/optimizers.hpp"
#include "stowage/precision.hpp"
#include "stowage/simd_level.hpp"

namespace {
using namespace stowage;

constexpr std::size_t kN = std::size_t{16} << 20;  // 16 Mi elements: 64 MiB per fp32 array

struct Data {
  std::vector<float> master, scratch, m, v, gf;
  std::vector<std::uint16_t> hi, lo, gb;
  std::vector<std::uint8_t> ties;
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
  SplitPlanes planes(Rounding r) { return {hi.data(), lo.data(), r == Rounding::nearest_even ? ties.data() : nullptr, kN, r}; }
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

}  // namespace

BENCHMARK_MAIN();
