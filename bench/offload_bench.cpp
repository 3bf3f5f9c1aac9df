// Pinned host memory: an allocate+free pair from the host pool (pages pinned once, reused)
// against pinning per buffer, as code that allocates pinned memory on the fly does
// (mmap + mlock + munlock + munmap on the CPU; cudaHostAlloc/cudaFreeHost on a GPU).
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <cstring>

#include "stowage/cuda_device.hpp"
#include "stowage/emulated_device.hpp"
#include "stowage/host_pool.hpp"

#if defined(STOWAGE_HAVE_CUDA)
#include <cuda_runtime.h>

#include <memory>
#endif

using namespace stowage;

namespace {

Device& emulated() {
  static auto d = make_emulated_device(0, EmulatedOptions{});
  return *d;
}

void pool_pair(benchmark::State& state, HostPoolBackend backend, Device& device = emulated()) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  HostPoolOptions o;
  o.backend = backend;
  if (backend == HostPoolBackend::jemalloc && !jemalloc_in_process()) {
    state.SkipWithError("jemalloc is not linked into this executable");
    return;
  }
  HostPool pool(device, o);
  pool.deallocate(pool.allocate(bytes));  // pages mapped and pinned once
  for (auto _ : state) {
    void* p = pool.allocate(bytes);
    static_cast<volatile char*>(p)[0] = 1;
    pool.deallocate(p);
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["maps"] = static_cast<double>(pool.stats().num_maps);
}

void BM_HostPoolJemalloc(benchmark::State& state) { pool_pair(state, HostPoolBackend::jemalloc); }
void BM_HostPoolBuiltin(benchmark::State& state) { pool_pair(state, HostPoolBackend::builtin); }

// The peer: a fresh mapping, locked and faulted in, per buffer.
void BM_MmapMlockPerBuffer(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED || ::mlock(p, bytes) != 0) {
      state.SkipWithError("mmap/mlock refused (RLIMIT_MEMLOCK?)");
      if (p != MAP_FAILED) ::munmap(p, bytes);
      return;
    }
    static_cast<volatile char*>(p)[0] = 1;
    ::munlock(p, bytes);
    ::munmap(p, bytes);
  }
  state.SetItemsProcessed(state.iterations());
}

// What the emulated device's pin_host adds on top of a fresh mapping per buffer.
void BM_MmapPinHostPerBuffer(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  Device& d = emulated();
  for (auto _ : state) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    d.pin_host(p, bytes);
    d.unpin_host(p);
    ::munmap(p, bytes);
  }
  state.SetItemsProcessed(state.iterations());
}

#if defined(STOWAGE_HAVE_CUDA)
// --- GPU 0 (skipped without one): the pool on the CUDA backend (pages registered with the
// driver once) against cudaHostAlloc/cudaFreeHost per buffer. ---
Device* gpu() {
  static std::unique_ptr<Device> d = cuda_device_count() > 0 ? make_cuda_device(0) : nullptr;
  return d.get();
}

void BM_CudaHostPool(benchmark::State& state) {
  if (gpu() == nullptr) return state.SkipWithError("no CUDA device");
  pool_pair(state, HostPoolBackend::builtin, *gpu());
}

void BM_CudaHostAllocPerBuffer(benchmark::State& state) {
  if (gpu() == nullptr) return state.SkipWithError("no CUDA device");
  const auto bytes = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = nullptr;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) != cudaSuccess)
      return state.SkipWithError("cudaHostAlloc failed");
    static_cast<volatile char*>(p)[0] = 1;
    cudaFreeHost(p);
  }
  state.SetItemsProcessed(state.iterations());
}
#endif

}  // namespace

// 64 KiB .. 4 MiB (mlock needs RLIMIT_MEMLOCK above the largest).
BENCHMARK(BM_HostPoolJemalloc)->RangeMultiplier(4)->Range(64 << 10, 4 << 20);
BENCHMARK(BM_HostPoolBuiltin)->RangeMultiplier(4)->Range(64 << 10, 4 << 20);
BENCHMARK(BM_MmapMlockPerBuffer)->RangeMultiplier(4)->Range(64 << 10, 4 << 20);
BENCHMARK(BM_MmapPinHostPerBuffer)->RangeMultiplier(4)->Range(64 << 10, 4 << 20);
#if defined(STOWAGE_HAVE_CUDA)
BENCHMARK(BM_CudaHostPool)->RangeMultiplier(4)->Range(64 << 10, 4 << 20);
BENCHMARK(BM_CudaHostAllocPerBuffer)->RangeMultiplier(4)->Range(64 << 10, 4 << 20);
#endif

BENCHMARK_MAIN();
