// The caching allocator against glibc malloc and jemalloc's mallocx, in the same run, on the
// emulated device: (a) a cached alloc+free pair of one size, (b) random allocations with sizes
// log-uniform in 256 B .. 64 MiB freed in random order. Memory is not touched: this measures
// the allocators' bookkeeping, not page faults. With the CUDA backend, BM_Cuda* run the same two
// measures on GPU 0 against cudaMalloc and cudaMallocAsync (skipped without a GPU).
#include <benchmark/benchmark.h>
#include <dlfcn.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "stowage/allocator.hpp"
#include "stowage/cuda_device.hpp"
#include "stowage/device.hpp"
#include "stowage/emulated_device.hpp"

#if defined(STOWAGE_HAVE_CUDA)
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#endif

extern "C" void* __libc_malloc(std::size_t);  // glibc's own, under the jemalloc linked in
extern "C" void __libc_free(void*);

namespace {

using stowage::CachingAllocator;

constexpr std::size_t MiB = std::size_t{1} << 20;

// Allocators behind one shape: allocate(bytes) / release(ptr, bytes).
enum class On { emulated, gpu };

struct StowageAlloc {
  std::unique_ptr<stowage::Device> dev;
  std::unique_ptr<CachingAllocator> a;
  explicit StowageAlloc(stowage::SegmentMode mode, On on = On::emulated) {
    if (on == On::gpu) {
      dev = stowage::make_cuda_device(0);
    } else {
      stowage::EmulatedOptions o;
      o.capacity = std::size_t{16} << 30;
      dev = stowage::make_emulated_device(0, o);
    }
    stowage::AllocatorOptions ao;
    ao.segments = mode;
    a = std::make_unique<CachingAllocator>(*dev, ao);
  }
  void* allocate(std::size_t n) { return a->allocate(n); }
  void release(void* p, std::size_t) { a->deallocate(p); }
};

struct GlibcAlloc {
  void* allocate(std::size_t n) { return __libc_malloc(n); }
  void release(void* p, std::size_t) { __libc_free(p); }
};

struct JemallocAlloc {
  using Mallocx = void* (*)(std::size_t, int);
  using Dallocx = void (*)(void*, int);
  Mallocx mallocx = reinterpret_cast<Mallocx>(dlsym(RTLD_DEFAULT, "mallocx"));
  Dallocx dallocx = reinterpret_cast<Dallocx>(dlsym(RTLD_DEFAULT, "dallocx"));
  bool ok() const { return mallocx && dallocx; }
  void* allocate(std::size_t n) { return mallocx(n, 0); }
  void release(void* p, std::size_t) { dallocx(p, 0); }
};

template <typename A>
void cached_pair(benchmark::State& state, A& alloc) {
  const auto n = static_cast<std::size_t>(state.range(0));
  alloc.release(alloc.allocate(n), n);  // warm the cache
  for (auto _ : state) {
    void* p = alloc.allocate(n);
    benchmark::DoNotOptimize(p);
    alloc.release(p, n);
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_CachedPair_Stowage(benchmark::State& state) {
  StowageAlloc a(stowage::SegmentMode::expandable);
  cached_pair(state, a);
}
void BM_CachedPair_StowageClassic(benchmark::State& state) {
  StowageAlloc a(stowage::SegmentMode::classic);
  cached_pair(state, a);
}
void BM_CachedPair_Glibc(benchmark::State& state) {
  GlibcAlloc a;
  cached_pair(state, a);
}
void BM_CachedPair_Jemalloc(benchmark::State& state) {
  JemallocAlloc a;
  if (!a.ok()) return state.SkipWithError("mallocx not found");
  cached_pair(state, a);
}

// A fixed random program: at most 64 live blocks, sizes log-uniform 256 B .. 64 MiB, frees of a
// random live block. The same program runs against every allocator.
struct Op {
  bool alloc;
  std::size_t slot, bytes;
};
const std::vector<Op>& random_program() {
  static const std::vector<Op> ops = [] {
    std::mt19937_64 rng(42);
    std::uniform_real_distribution<double> logsize(std::log(256.0), std::log(64.0 * MiB));
    std::vector<Op> out;
    std::vector<std::size_t> live, free_slots;
    for (std::size_t s = 0; s < 64; ++s) free_slots.push_back(s);
    std::vector<std::size_t> size_of(64);
    for (int i = 0; i < 4096; ++i) {
      const bool alloc = live.empty() || (!free_slots.empty() && rng() % 2);
      if (alloc) {
        const std::size_t slot = free_slots.back();
        free_slots.pop_back();
        size_of[slot] = static_cast<std::size_t>(std::exp(logsize(rng)));
        out.push_back({true, slot, size_of[slot]});
        live.push_back(slot);
      } else {
        const std::size_t k = rng() % live.size();
        out.push_back({false, live[k], size_of[live[k]]});
        free_slots.push_back(live[k]);
        live[k] = live.back();
        live.pop_back();
      }
    }
    for (std::size_t slot : live) out.push_back({false, slot, size_of[slot]});
    return out;
  }();
  return ops;
}

template <typename A>
void random_sizes(benchmark::State& state, A& alloc) {
  const auto& ops = random_program();
  void* slots[64] = {};
  for (auto _ : state) {
    for (const Op& op : ops) {
      if (op.alloc) {
        slots[op.slot] = alloc.allocate(op.bytes);
      } else {
        alloc.release(slots[op.slot], op.bytes);
      }
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(ops.size()));
}

void BM_Random_Stowage(benchmark::State& state) {
  StowageAlloc a(stowage::SegmentMode::expandable);
  random_sizes(state, a);
  state.counters["reserved_MiB"] = static_cast<double>(a.a->stats().reserved_bytes.all.peak) / MiB;
}
void BM_Random_StowageClassic(benchmark::State& state) {
  StowageAlloc a(stowage::SegmentMode::classic);
  random_sizes(state, a);
  state.counters["reserved_MiB"] = static_cast<double>(a.a->stats().reserved_bytes.all.peak) / MiB;
}
void BM_Random_Glibc(benchmark::State& state) {
  GlibcAlloc a;
  random_sizes(state, a);
}
void BM_Random_Jemalloc(benchmark::State& state) {
  JemallocAlloc a;
  if (!a.ok()) return state.SkipWithError("mallocx not found");
  random_sizes(state, a);
}

#if defined(STOWAGE_HAVE_CUDA)
// --- GPU 0: stowage on the CUDA backend against cudaMalloc/cudaFree (what an allocator without a
// cache pays per call) and cudaMallocAsync/cudaFreeAsync on a stream, with the device's default
// pool told to keep its memory (release threshold at the maximum, as frameworks set it). Host
// time per call; device memory is never touched. ---
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

struct CudaMallocAlloc {
  void* allocate(std::size_t n) {
    void* p = nullptr;
    check(cudaMalloc(&p, n), "cudaMalloc");
    return p;
  }
  void release(void* p, std::size_t) { check(cudaFree(p), "cudaFree"); }
};

struct CudaMallocAsyncAlloc {
  cudaStream_t stream = nullptr;
  CudaMallocAsyncAlloc() {
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    cudaMemPool_t pool = nullptr;
    check(cudaDeviceGetDefaultMemPool(&pool, 0), "cudaDeviceGetDefaultMemPool");
    std::uint64_t keep = std::numeric_limits<std::uint64_t>::max();
    check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute");
  }
  ~CudaMallocAsyncAlloc() {
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
  }
  void* allocate(std::size_t n) {
    void* p = nullptr;
    check(cudaMallocAsync(&p, n, stream), "cudaMallocAsync");
    return p;
  }
  void release(void* p, std::size_t) { check(cudaFreeAsync(p, stream), "cudaFreeAsync"); }
};

template <typename A, typename... Args>
void on_gpu(benchmark::State& state, void (*measure)(benchmark::State&, A&), Args... args) {
  if (stowage::cuda_device_count() == 0) return state.SkipWithError("no CUDA device");
  try {
    A a(args...);
    measure(state, a);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void BM_CudaCachedPair_Stowage(benchmark::State& s) {
  on_gpu<StowageAlloc>(s, cached_pair<StowageAlloc>, stowage::SegmentMode::expandable, On::gpu);
}
void BM_CudaCachedPair_StowageClassic(benchmark::State& s) {
  on_gpu<StowageAlloc>(s, cached_pair<StowageAlloc>, stowage::SegmentMode::classic, On::gpu);
}
void BM_CudaCachedPair_CudaMalloc(benchmark::State& s) { on_gpu<CudaMallocAlloc>(s, cached_pair<CudaMallocAlloc>); }
void BM_CudaCachedPair_CudaMallocAsync(benchmark::State& s) {
  on_gpu<CudaMallocAsyncAlloc>(s, cached_pair<CudaMallocAsyncAlloc>);
}
void BM_CudaRandom_Stowage(benchmark::State& s) {
  on_gpu<StowageAlloc>(s, random_sizes<StowageAlloc>, stowage::SegmentMode::expandable, On::gpu);
}
void BM_CudaRandom_StowageClassic(benchmark::State& s) {
  on_gpu<StowageAlloc>(s, random_sizes<StowageAlloc>, stowage::SegmentMode::classic, On::gpu);
}
void BM_CudaRandom_CudaMalloc(benchmark::State& s) { on_gpu<CudaMallocAlloc>(s, random_sizes<CudaMallocAlloc>); }
void BM_CudaRandom_CudaMallocAsync(benchmark::State& s) {
  on_gpu<CudaMallocAsyncAlloc>(s, random_sizes<CudaMallocAsyncAlloc>);
}
#endif

#define PAIR_SIZES Arg(512)->Arg(64 << 10)->Arg(1 << 20)->Arg(8 << 20)
BENCHMARK(BM_CachedPair_Stowage)->PAIR_SIZES;
BENCHMARK(BM_CachedPair_StowageClassic)->PAIR_SIZES;
BENCHMARK(BM_CachedPair_Glibc)->PAIR_SIZES;
BENCHMARK(BM_CachedPair_Jemalloc)->PAIR_SIZES;
BENCHMARK(BM_Random_Stowage);
BENCHMARK(BM_Random_StowageClassic);
BENCHMARK(BM_Random_Glibc);
BENCHMARK(BM_Random_Jemalloc);
#if defined(STOWAGE_HAVE_CUDA)
BENCHMARK(BM_CudaCachedPair_Stowage)->PAIR_SIZES->UseRealTime();
BENCHMARK(BM_CudaCachedPair_StowageClassic)->PAIR_SIZES->UseRealTime();
BENCHMARK(BM_CudaCachedPair_CudaMalloc)->PAIR_SIZES->UseRealTime();
BENCHMARK(BM_CudaCachedPair_CudaMallocAsync)->PAIR_SIZES->UseRealTime();
BENCHMARK(BM_CudaRandom_Stowage)->UseRealTime();
BENCHMARK(BM_CudaRandom_StowageClassic)->UseRealTime();
BENCHMARK(BM_CudaRandom_CudaMalloc)->UseRealTime();
BENCHMARK(BM_CudaRandom_CudaMallocAsync)->UseRealTime();
#endif

}  // namespace

BENCHMARK_MAIN();
