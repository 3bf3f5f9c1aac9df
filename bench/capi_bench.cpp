// Cost of the C ABI's entry points over calling the CachingAllocator directly: a cached
// alloc+free pair through stowage_malloc/stowage_free vs CachingAllocator::allocate/deallocate
// on the same kind of emulated device, with malloc/free of the same size as the host peer.
#include <benchmark/benchmark.h>

#include <cstdlib>

#include "stowage/allocator.hpp"
#include "stowage/emulated_device.hpp"
#include "stowage/stowage.h"

namespace {

void BM_CApiPair(benchmark::State& state) {
  const auto n = static_cast<ssize_t>(state.range(0));
  stowage_free(stowage_malloc(n, 0, nullptr), n, 0, nullptr);  // warm the cache
  for (auto _ : state) {
    void* p = stowage_malloc(n, 0, nullptr);
    benchmark::DoNotOptimize(p);
    stowage_free(p, n, 0, nullptr);
  }
}

void BM_DirectPair(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  static auto device = stowage::make_emulated_device(1);
  static stowage::CachingAllocator allocator(*device);
  allocator.deallocate(allocator.allocate(n));
  for (auto _ : state) {
    void* p = allocator.allocate(n);
    benchmark::DoNotOptimize(p);
    allocator.deallocate(p, n);
  }
}

void BM_HostMallocPair(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = std::malloc(n);
    benchmark::DoNotOptimize(p);
    std::free(p);
  }
}

}  // namespace

BENCHMARK(BM_CApiPair)->Arg(4096)->Arg(1 << 20)->Arg(64 << 20);
BENCHMARK(BM_DirectPair)->Arg(4096)->Arg(1 << 20)->Arg(64 << 20);
BENCHMARK(BM_HostMallocPair)->Arg(4096)->Arg(1 << 20)->Arg(64 << 20);
BENCHMARK_MAIN();
