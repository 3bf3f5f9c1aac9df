// The allocator's fast path across threads: cached alloc+free pairs of one size on one device,
// from 1, 2 and 8 threads at once, through the C ABI (stowage_malloc / stowage_free, what
// PyTorch calls) and the C++ API, against the same allocator with the threads' caches off (the
// device-wide lock on every call), glibc's malloc/free and jemalloc's. items_per_second is the total over
// all threads; every thread allocates on the default stream, as a training process's threads do.
#include <benchmark/benchmark.h>

#include <cstdlib>

#include "stowage/caching_allocator.hpp"
#include "stowage/emulated_device.hpp"
#include "stowage/stowage.h"

namespace {

stowage::CachingAllocator& direct(bool caches) {
  static auto device = stowage::make_emulated_device(1, stowage::EmulatedOptions{.capacity = std::size_t{4} << 30});
  static stowage::CachingAllocator with(*device);
  static stowage::CachingAllocator without(*device, stowage::parse_allocator_options("thread_cache_mb:0"));
  return caches ? with : without;
}

void BM_ThreadsPair_CApi(benchmark::State& state) {
  const auto n = static_cast<ssize_t>(state.range(0));
  stowage_free(stowage_malloc(n, 0, nullptr), n, 0, nullptr);  // this thread's first: the slow path
  for (auto _ : state) {
    void* p = stowage_malloc(n, 0, nullptr);
    benchmark::DoNotOptimize(p);
    stowage_free(p, n, 0, nullptr);
  }
  state.SetItemsProcessed(state.iterations());
}

template <bool Caches>
void BM_ThreadsPair_Direct(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  stowage::CachingAllocator& a = direct(Caches);
  a.deallocate(a.allocate(n), n);
  for (auto _ : state) {
    void* p = a.allocate(n);
    benchmark::DoNotOptimize(p);
    a.deallocate(p, n);
  }
  state.SetItemsProcessed(state.iterations());
}

// glibc's malloc (its own entry points: jemalloc, linked into stowage's programs for the host
// pool, provides malloc itself) and jemalloc's.
extern "C" void* __libc_malloc(std::size_t);
extern "C" void __libc_free(void*);

template <void* (*Malloc)(std::size_t), void (*Free)(void*)>
void BM_ThreadsPair_Host(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = Malloc(n);
    benchmark::DoNotOptimize(p);
    Free(p);
  }
  state.SetItemsProcessed(state.iterations());
}

}  // namespace

#define STOWAGE_THREADS ->Arg(64 << 10)->Arg(1 << 20)->Threads(1)->Threads(2)->Threads(8)->UseRealTime()
BENCHMARK(BM_ThreadsPair_CApi) STOWAGE_THREADS;
BENCHMARK(BM_ThreadsPair_Direct<true>)->Name("BM_ThreadsPair_Direct") STOWAGE_THREADS;
BENCHMARK(BM_ThreadsPair_Direct<false>)->Name("BM_ThreadsPair_NoCache") STOWAGE_THREADS;
BENCHMARK(BM_ThreadsPair_Host<__libc_malloc, __libc_free>)->Name("BM_ThreadsPair_Glibc") STOWAGE_THREADS;
BENCHMARK(BM_ThreadsPair_Host<std::malloc, std::free>)->Name("BM_ThreadsPair_Jemalloc") STOWAGE_THREADS;
BENCHMARK_MAIN();
