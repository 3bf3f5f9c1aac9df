// The emulated copy engine's bandwidth: unthrottled and throttled to a link rate, against a
// plain memcpy of the same bytes (the peer). Throttled rates should sit at or just under the
// configured link; unthrottled ones near memcpy.
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "stowage/device.hpp"
#include "stowage/emulated_device.hpp"

namespace {

constexpr std::size_t kBytes = std::size_t{64} << 20;

std::unique_ptr<stowage::Device> make_device(double link_gbps) {
  stowage::EmulatedOptions o;
  o.capacity = std::size_t{256} << 20;
  o.link_bandwidth_gbps = link_gbps;
  return stowage::make_emulated_device(0, o);
}

// args: direction (0 = H2D, 1 = D2H), link bandwidth in GB/s (0 = unthrottled)
void BM_EmulatedCopy(benchmark::State& state) {
  const bool h2d = state.range(0) == 0;
  const auto link = static_cast<double>(state.range(1));
  auto dev = make_device(link);
  std::vector<std::uint8_t> host(kBytes, 0x5A);
  dev->pin_host(host.data(), host.size());
  void* buf = dev->allocate(kBytes);
  dev->fill_async(buf, 0xA5, kBytes, stowage::kDefaultStream);
  dev->synchronize();
  for (auto _ : state) {
    if (h2d) dev->copy_async(buf, host.data(), kBytes, stowage::CopyKind::host_to_device, stowage::kDefaultStream);
    else dev->copy_async(host.data(), buf, kBytes, stowage::CopyKind::device_to_host, stowage::kDefaultStream);
    dev->synchronize(stowage::kDefaultStream);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kBytes));
  state.SetLabel(link > 0 ? "throttled" : "unthrottled");
  dev->deallocate(buf);
  dev->unpin_host(host.data());
}
BENCHMARK(BM_EmulatedCopy)
    ->ArgNames({"d2h", "link_gbps"})
    ->ArgsProduct({{0, 1}, {0, 2, 8, 32}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.3);

// The peer: memcpy of the same size on the calling thread.
void BM_Memcpy(benchmark::State& state) {
  std::vector<std::uint8_t> src(kBytes, 0x5A), dst(kBytes, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), kBytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kBytes));
}
BENCHMARK(BM_Memcpy)->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.3);

// Copy/compute overlap: a host "kernel" of fixed work on one stream and a throttled H2D copy,
// on one stream (serial: copy + kernel) or on two (overlapped: near max(copy, kernel)).
// mode: 0 = copy only, 1 = kernel only, 2 = both on one stream, 3 = both on two streams.
void BM_CopyComputeOverlap(benchmark::State& state) {
  const int mode = static_cast<int>(state.range(0));
  auto dev = make_device(2);  // 16 MiB at 2 GB/s: about 8 ms of copying
  std::vector<std::uint8_t> host(kBytes / 4, 1);
  dev->pin_host(host.data(), host.size());
  void* buf = dev->allocate(kBytes / 4);
  const stowage::Stream compute = dev->create_stream(), copy = mode == 3 ? dev->create_stream() : compute;
  std::vector<double> work(1 << 20, 1.0);
  for (auto _ : state) {
    if (mode != 1) dev->copy_async(buf, host.data(), host.size(), stowage::CopyKind::host_to_device, copy);
    if (mode != 0)
      dev->launch_host(compute, [&work] {
        double acc = 0;
        for (int rep = 0; rep < 4; ++rep)
          for (double& w : work) acc += (w = w * 1.0000001 + 1e-9);
        benchmark::DoNotOptimize(acc);
      });
    dev->synchronize();
  }
  static const char* kLabels[] = {"copy only", "kernel only", "one stream", "two streams"};
  state.SetLabel(kLabels[mode]);
  if (copy != compute) dev->destroy_stream(copy);
  dev->destroy_stream(compute);
  dev->deallocate(buf);
  dev->unpin_host(host.data());
}
BENCHMARK(BM_CopyComputeOverlap)
    ->ArgNames({"mode"})
    ->DenseRange(0, 3)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.3);

}  // namespace

BENCHMARK_MAIN();
