// Activation recompute cost against the matmuls around it, at Llama-2-7B MLP shapes (hidden
// 4096, intermediate 11008, SwiGLU), and the device memory release-and-recompute saves.
// Matmuls: this file's blocked fp32 kernel (4x16 register tile of 8-lane FMA vectors, K blocked
// by 256, N by 512), single thread; activations: stowage's CPU kernels, single thread.
// STOWAGE_BENCH_TOKENS sets the token count (default 256). Results: bench/results/recompute.md.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <vector>

#include "stowage/activations.hpp"
#include "stowage/allocator.hpp"
#include "stowage/emulated_device.hpp"
#include "stowage/recompute.hpp"

namespace {

using namespace stowage;

constexpr std::int64_t kHidden = 4096, kInter = 11008, kLayers = 32;

std::int64_t tokens() {
  const char* v = std::getenv("STOWAGE_BENCH_TOKENS");
  const long t = v != nullptr ? std::atol(v) : 256;
  return t > 0 ? (t + 3) / 4 * 4 : 256;  // the matmul tile wants a multiple of 4 rows
}

std::vector<float> filled(std::size_t n, std::uint32_t seed) {
  std::vector<float> v(n);
  for (auto& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = static_cast<float>(static_cast<std::int32_t>(seed >> 8) - (1 << 23)) * (1.0f / (1 << 25));
  }
  return v;
}

// ---- blocked matmul C[M, N] = A[M, K] B[K, N], row-major; M % 4 == 0, N % 16 == 0 ----
typedef float v8 __attribute__((vector_size(32)));

template <int kUnused = 0>
inline __attribute__((always_inline)) void matmul_body(std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                                                       const float* b, float* c) {
  std::memset(c, 0, static_cast<std::size_t>(m * n) * sizeof(float));
  constexpr std::int64_t kb = 256, nb = 512;
  for (std::int64_t k0 = 0; k0 < k; k0 += kb) {
    const std::int64_t k1 = std::min(k, k0 + kb);
    for (std::int64_t j0 = 0; j0 < n; j0 += nb) {
      const std::int64_t j1 = std::min(n, j0 + nb);
      for (std::int64_t i = 0; i < m; i += 4)
        for (std::int64_t j = j0; j < j1; j += 16) {
          v8 acc[4][2];
          for (int r = 0; r < 4; ++r)
            for (int h = 0; h < 2; ++h) std::memcpy(&acc[r][h], c + (i + r) * n + j + 8 * h, 32);
          for (std::int64_t p = k0; p < k1; ++p) {
            v8 b0, b1;
            std::memcpy(&b0, b + p * n + j, 32);
            std::memcpy(&b1, b + p * n + j + 8, 32);
            for (int r = 0; r < 4; ++r) {
              const float av = a[(i + r) * k + p];
              acc[r][0] += av * b0;
              acc[r][1] += av * b1;
            }
          }
          for (int r = 0; r < 4; ++r)
            for (int h = 0; h < 2; ++h) std::memcpy(c + (i + r) * n + j + 8 * h, &acc[r][h], 32);
        }
    }
  }
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
__attribute__((target("avx2,fma"))) void matmul_avx2(std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                                                     const float* b, float* c) {
  matmul_body(m, n, k, a, b, c);
}
void matmul_generic(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, const float* b, float* c) {
  matmul_body(m, n, k, a, b, c);
}
#pragma GCC diagnostic pop

void matmul(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, const float* b, float* c) {
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  (avx2 ? matmul_avx2 : matmul_generic)(m, n, k, a, b, c);
}

// The MLP's tensors, made once.
struct Mlp {
  std::int64_t t = tokens();
  std::vector<float> x = filled(t * kHidden, 1), w_gate_up = filled(kHidden * 2 * kInter, 2),
                     w_down = filled(kInter * kHidden, 3), gate_up = std::vector<float>(t * 2 * kInter),
                     act = std::vector<float>(t * kInter), y = std::vector<float>(t * kHidden);
  static Mlp& get() {
    static Mlp m;
    return m;
  }
};

// Thread CPU seconds: the ratio of work, unaffected by other processes on a shared machine.
double seconds_of(const std::function<void()>& fn) {
  auto now = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  };
  const double t0 = now();
  fn();
  return now() - t0;
}

void BM_MatmulGateUp(benchmark::State& state) {
  auto& m = Mlp::get();
  for (auto _ : state) matmul(m.t, 2 * kInter, kHidden, m.x.data(), m.w_gate_up.data(), m.gate_up.data());
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * m.t * kHidden * 2 * kInter * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_MatmulGateUp)->Unit(benchmark::kMillisecond)->Iterations(1);

void BM_MatmulDown(benchmark::State& state) {
  auto& m = Mlp::get();
  for (auto _ : state) matmul(m.t, kHidden, kInter, m.act.data(), m.w_down.data(), m.y.data());
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * m.t * kInter * kHidden * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_MatmulDown)->Unit(benchmark::kMillisecond)->Iterations(1);

// The recompute itself: SwiGLU over the fused gate|up projection (what before_backward runs).
void BM_SwiGLUForward(benchmark::State& state) {
  auto& m = Mlp::get();
  const bool bf16 = state.range(0) == 1;
  std::vector<std::uint16_t> gu16(m.gate_up.size()), a16(m.act.size());
  for (auto _ : state) {
    if (bf16)
      cpu::gated_activation_forward(Activation::silu, DType::bf16, m.t, kInter, gu16.data(), 2 * kInter,
                                    gu16.data() + kInter, 2 * kInter, a16.data());
    else
      cpu::gated_activation_forward(Activation::silu, DType::f32, m.t, kInter, m.gate_up.data(), 2 * kInter,
                                    m.gate_up.data() + kInter, 2 * kInter, m.act.data());
  }
  state.SetItemsProcessed(state.iterations() * m.t * kInter);
  state.SetLabel(bf16 ? "bf16" : "f32");
}
BENCHMARK(BM_SwiGLUForward)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->MinTime(0.3);

void BM_ActivationForward(benchmark::State& state) {
  auto& m = Mlp::get();
  const auto a = static_cast<Activation>(state.range(0));
  for (auto _ : state) cpu::activation_forward(a, DType::f32, m.act.size(), m.gate_up.data(), m.act.data());
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(m.act.size()));
  state.SetLabel(to_string(a));
}
BENCHMARK(BM_ActivationForward)->DenseRange(0, 3)->Unit(benchmark::kMillisecond)->MinTime(0.3);

// One forward in a single run: gate_up matmul, SwiGLU, down matmul. The recompute adds the
// SwiGLU once more per step; the step's matmuls are the forward's plus twice that in backward.
void BM_MlpRecomputeFraction(benchmark::State& state) {
  auto& m = Mlp::get();
  double mm = 0, act = 0, act16 = 0;
  std::vector<std::uint16_t> gu16(m.gate_up.size()), a16(m.act.size());
  for (auto _ : state) {
    mm += seconds_of([&] { matmul(m.t, 2 * kInter, kHidden, m.x.data(), m.w_gate_up.data(), m.gate_up.data()); });
    act += seconds_of([&] {
      cpu::gated_activation_forward(Activation::silu, DType::f32, m.t, kInter, m.gate_up.data(), 2 * kInter,
                                    m.gate_up.data() + kInter, 2 * kInter, m.act.data());
    });
    mm += seconds_of([&] { matmul(m.t, kHidden, kInter, m.act.data(), m.w_down.data(), m.y.data()); });
    act16 += seconds_of([&] {
      cpu::gated_activation_forward(Activation::silu, DType::bf16, m.t, kInter, gu16.data(), 2 * kInter,
                                    gu16.data() + kInter, 2 * kInter, a16.data());
    });
  }
  state.counters["matmuls_ms"] = 1e3 * mm / static_cast<double>(state.iterations());
  state.counters["swiglu_f32_ms"] = 1e3 * act / static_cast<double>(state.iterations());
  state.counters["swiglu_bf16_ms"] = 1e3 * act16 / static_cast<double>(state.iterations());
  state.counters["f32_vs_fwd_matmuls"] = act / mm;
  state.counters["f32_vs_step_matmuls"] = act / (3 * mm);
  state.counters["bf16_vs_fwd_matmuls"] = act16 / mm;
  state.counters["tokens"] = static_cast<double>(m.t);
}
BENCHMARK(BM_MlpRecomputeFraction)->Unit(benchmark::kMillisecond)->Iterations(1);

// Device bytes saved over 32 layers, measured as the allocator's peak with release off and on
// (emulated device; bf16; the gate|up projection is kept as the recompute's input).
void BM_MemorySaved(benchmark::State& state) {
  const std::int64_t t = tokens();
  std::int64_t peak[2] = {0, 0};
  for (auto _ : state) {
    for (int release = 0; release < 2; ++release) {
      EmulatedOptions o;
      o.capacity = std::size_t{4} << 30;
      auto dev = make_emulated_device(0, o);
      CachingAllocator alloc(*dev);
      const Stream s = dev->create_stream();
      {
        RecomputeOptions ro;
        ro.compute_stream = s;
        Recompute rc(alloc, ro);
        std::vector<TensorView> keep;
        for (int l = 0; l < kLayers; ++l) {
          auto gu = TensorView::empty(alloc, DType::bf16, {t, 2 * kInter}, s);
          dev->fill_async(gu.data(), 0, gu.nbytes(), s);
          keep.push_back(gu);
          keep.push_back(rc.forward(l, "mlp.swiglu", {gu}, {{DType::bf16, {t, kInter}}}, [](const RecomputeContext& c) {
            const auto& p = c.inputs[0];
            gated_activation_forward(Activation::silu, p.slice(1, 0, kInter), p.slice(1, kInter, 2 * kInter),
                                     c.outputs[0], c.stream);
          })[0]);
          if (release == 1) rc.release(l);
        }
        for (int l = kLayers - 1; l >= 0; --l) {
          rc.before_backward(l);
          rc.after_backward(l);
          keep.pop_back();
          keep.pop_back();
        }
        peak[release] = alloc.stats().allocated_bytes.all.peak;
        dev->synchronize();
      }
      dev->destroy_stream(s);
    }
  }
  state.counters["peak_MiB_keep"] = static_cast<double>(peak[0]) / (1 << 20);
  state.counters["peak_MiB_release"] = static_cast<double>(peak[1]) / (1 << 20);
  state.counters["saved_MiB"] = static_cast<double>(peak[0] - peak[1]) / (1 << 20);
  state.counters["act_MiB_per_layer"] = static_cast<double>(t * kInter * 2) / (1 << 20);
}
BENCHMARK(BM_MemorySaved)->Unit(benchmark::kMillisecond)->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
