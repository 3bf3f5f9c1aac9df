// Swap-attention on the emulated device with a throttled link: how much transfer time is hidden
// behind compute (1 - (step time with swap - without) / copy time), and how far the device peak
// drops. Each layer's forward is attention (its
// output offloaded) then MLP; backward is MLP (the prefetch runs behind it) then attention.
// Compute is a sleeping kernel, so the numbers do not depend on how busy the CPU is. The host
// runs at most two layers ahead of the compute stream (as a framework's launch queue and syncs
// keep it), so the allocator sees finished copies and reuses their blocks.
// With --cuda 1 the same runs on GPU 0 over its real link: the link rate is measured first
// (D2H then H2D between device memory and the pinned pool), and compute is device work
// (memsets of a 64 MiB scratch buffer, their count calibrated to the wanted time) competing with
// the copies for device memory, as memory-bound kernels do.
//   offload_tool [--layers N] [--attn-mib A] [--mlp-mib M] [--gbps G] [--steps S] [--ratio R] [--cuda 1]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "stowage/allocator.hpp"
#include "stowage/cuda_device.hpp"
#include "stowage/emulated_device.hpp"
#include "stowage/host_pool.hpp"
#include "stowage/swap.hpp"

using namespace stowage;
using Clock = std::chrono::steady_clock;

namespace {

struct Workload {
  int layers = 8;
  std::size_t attn_bytes = std::size_t{32} << 20;  // swapped per layer
  std::size_t mlp_bytes = std::size_t{16} << 20;   // kept per layer
  double gbps = 4.0;
  double compute_ratio = 1.25;  // MLP (and attention) time / one tensor's transfer time
  int steps = 3;
  bool cuda = false;
};

struct Outcome {
  double step_ms = 0;                                  // median
  std::int64_t peak_allocated = 0, peak_reserved = 0;  // first step, fresh allocator
  SwapStats swap;
};

// Occupies a stream for about `ms`: a sleeping host function on the emulated device, device
// memsets of a scratch buffer on a GPU (their count calibrated with events).
class Compute {
 public:
  explicit Compute(Device& d) : d_(d) {
    if (d_.kind() == DeviceKind::emulated) return;
    scratch_ = d_.allocate(kScratch);
    const Stream s = kDefaultStream;
    issue(s, 1);  // warm-up
    Event a = d_.create_event(true), b = d_.create_event(true);
    d_.record(a, s);
    issue(s, 50);
    d_.record(b, s);
    d_.synchronize(b);
    ms_per_unit_ = d_.elapsed_ms(a, b) / 50;
    d_.destroy_event(a);
    d_.destroy_event(b);
  }
  ~Compute() {
    if (scratch_) d_.deallocate(scratch_);
  }
  void run(Stream s, double ms) {
    if (scratch_ == nullptr) {
      d_.launch_host(s, [ms] { std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms)); });
      return;
    }
    issue(s, std::max(1, static_cast<int>(std::lround(ms / ms_per_unit_))));
  }

 private:
  static constexpr std::size_t kScratch = std::size_t{64} << 20;
  void issue(Stream s, int units) {
    for (int i = 0; i < units; ++i) d_.fill_async(scratch_, static_cast<std::uint8_t>(i), kScratch, s);
  }
  Device& d_;
  void* scratch_ = nullptr;
  double ms_per_unit_ = 0;
};

std::unique_ptr<Device> make_device(const Workload& w) {
  if (w.cuda) return make_cuda_device(0);
  EmulatedOptions o;
  o.capacity = std::size_t{4} << 30;
  o.link_bandwidth_gbps = w.gbps;
  return make_emulated_device(0, o);
}

// GPU 0's link in GB/s, one direction's average: `bytes` D2H then H2D between device memory and
// pinned pool pages, median of 7.
double measure_link_gbps(std::size_t bytes) {
  auto dev = make_cuda_device(0);
  HostPool pool(*dev);
  void* d = dev->allocate(bytes);
  void* h = pool.allocate(bytes);
  std::memset(h, 1, bytes);
  const Stream s = dev->create_stream();
  Event a = dev->create_event(true), b = dev->create_event(true);
  std::vector<double> ms;
  for (int i = 0; i < 8; ++i) {
    dev->record(a, s);
    dev->copy_async(h, d, bytes, CopyKind::device_to_host, s);
    dev->copy_async(d, h, bytes, CopyKind::host_to_device, s);
    dev->record(b, s);
    dev->synchronize(b);
    if (i > 0) ms.push_back(dev->elapsed_ms(a, b));  // the first is a warm-up
  }
  std::sort(ms.begin(), ms.end());
  dev->destroy_event(a);
  dev->destroy_event(b);
  dev->destroy_stream(s);
  pool.deallocate(h);
  dev->deallocate(d);
  return 2.0 * static_cast<double>(bytes) / (ms[ms.size() / 2] * 1e6);
}

// Keeps the host at most `ahead` layers in front of the stream.
class Pacer {
 public:
  Pacer(Device& d, Stream s, int ahead) : d_(d), s_(s), events_(ahead) {
    for (auto& e : events_) e = d_.create_event();
  }
  ~Pacer() {
    for (auto e : events_) d_.destroy_event(e);
  }
  void layer_enqueued() {
    Event& e = events_[next_++ % events_.size()];
    d_.synchronize(e);  // the layer `ahead` back has finished
    d_.record(e, s_);
  }

 private:
  Device& d_;
  Stream s_;
  std::vector<Event> events_;
  std::size_t next_ = 0;
};

// One step (forward then backward); returns its wall time in ms.
double step(Device& dev, CachingAllocator& alloc, SwapScheduler* swap, const Workload& w, double compute_ms,
            Compute& work) {
  const Stream compute = kDefaultStream;
  std::vector<TensorView> attn(w.layers), mlp(w.layers);
  Pacer pace(dev, compute, 2);
  const auto t0 = Clock::now();
  for (int l = 0; l < w.layers; ++l) {
    attn[l] = TensorView::empty(alloc, DType::u8, {static_cast<std::int64_t>(w.attn_bytes)}, compute);
    work.run(compute, compute_ms);  // attention forward writes attn[l]
    if (swap) swap->offload(attn[l], l, "attn");
    mlp[l] = TensorView::empty(alloc, DType::u8, {static_cast<std::int64_t>(w.mlp_bytes)}, compute);
    work.run(compute, compute_ms);  // MLP forward: the D2H runs behind it
    pace.layer_enqueued();
  }
  for (int l = w.layers - 1; l >= 0; --l) {
    if (swap) swap->before_backward(l);
    work.run(compute, compute_ms);  // MLP backward: the H2D runs behind it
    mlp[l] = {};
    if (swap) attn[l] = swap->acquire(attn[l]);
    work.run(compute, compute_ms);  // attention backward reads attn[l]
    attn[l] = {};
    if (swap) swap->after_backward(l);
    pace.layer_enqueued();
  }
  dev.synchronize(compute);
  if (swap) swap->finish_step();
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

Outcome measure(const Workload& w, bool with_swap, int distance, double compute_ms) {
  auto dev = make_device(w);
  Compute work(*dev);
  CachingAllocator alloc(*dev);
  HostPool pool(*dev);
  SwapOptions so;
  so.prefetch_distance = distance;
  SwapScheduler swap(alloc, pool, so);
  SwapScheduler* s = with_swap ? &swap : nullptr;
  // The first step on a fresh allocator shows what the device must provide; later steps, with
  // segments and pinned pages in place, are timed.
  Outcome out;
  step(*dev, alloc, s, w, compute_ms, work);
  out.peak_allocated = alloc.stats().allocated_bytes.all.peak;
  out.peak_reserved = alloc.stats().reserved_bytes.all.peak;
  std::vector<double> times;
  for (int i = 0; i < w.steps; ++i) {
    swap.reset_stats();
    times.push_back(step(*dev, alloc, s, w, compute_ms, work));
  }
  out.swap = swap.stats();  // the last step's
  std::sort(times.begin(), times.end());
  out.step_ms = times[times.size() / 2];
  return out;
}

double mib(std::int64_t b) { return static_cast<double>(b) / (1 << 20); }

}  // namespace

int main(int argc, char** argv) {
  Workload w;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const double v = std::stod(argv[i + 1]);
    if (k == "--layers") w.layers = static_cast<int>(v);
    else if (k == "--attn-mib") w.attn_bytes = static_cast<std::size_t>(v * (1 << 20));
    else if (k == "--mlp-mib") w.mlp_bytes = static_cast<std::size_t>(v * (1 << 20));
    else if (k == "--gbps") w.gbps = v;
    else if (k == "--steps") w.steps = static_cast<int>(v);
    else if (k == "--ratio") w.compute_ratio = v;
    else if (k == "--cuda") w.cuda = v != 0;
    else {
      fmt::print(stderr, "unknown option {}\n", k);
      return 2;
    }
  }
  if (w.cuda) {
    if (cuda_device_count() == 0) {
      fmt::print(stderr, "--cuda: no CUDA device ({})\n", cuda_unavailable_reason());
      return 2;
    }
    w.gbps = measure_link_gbps(w.attn_bytes);
    fmt::print("compute: memsets of a 64 MiB buffer (memory-bound)\n");
    fmt::print("GPU 0's link, measured: {:.1f} GB/s per direction (D2H then H2D of {:.0f} MiB, pinned pool pages)\n",
               w.gbps, mib(static_cast<std::int64_t>(w.attn_bytes)));
  }
  const double transfer_ms = static_cast<double>(w.attn_bytes) / (w.gbps * 1e6);  // one tensor, one way
  fmt::print(
      "workload: {} layers, attention {:.0f} MiB/layer swapped, MLP {:.0f} MiB/layer kept, link {:g} GB/s "
      "({:.2f} ms per tensor per direction), median of {} steps\n\n",
      w.layers, mib(w.attn_bytes), mib(w.mlp_bytes), w.gbps, transfer_ms, w.steps);
  fmt::print(
      "| compute / transfer | distance | step ms (no swap) | step ms (swap) | link ms (nominal / measured) | hidden | "
      "scheduler overlap | compute wait ms | swapped MiB | peak allocated MiB (no swap → swap) | "
      "peak reserved MiB (no swap → swap) | reserved drop MiB |\n");
  fmt::print("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (double ratio : {w.compute_ratio, 0.5}) {
    const double compute_ms = ratio * transfer_ms;
    const Outcome base = measure(w, false, 0, compute_ms);
    for (int distance : {0, 1}) {
      const Outcome sw = measure(w, true, distance, compute_ms);
      const double link_ms = static_cast<double>(sw.swap.bytes_d2h + sw.swap.bytes_h2d) / (w.gbps * 1e6);
      const double exposed = std::max(0.0, sw.step_ms - base.step_ms);
      const double copy_ms = sw.swap.d2h_ms + sw.swap.h2d_ms;  // as the copy streams measured it
      const double hidden = copy_ms > 0 ? std::clamp(1.0 - exposed / copy_ms, 0.0, 1.0) : 1.0;
      fmt::print(
          "| {:.2f} | {} | {:.1f} | {:.1f} | {:.1f} / {:.1f} | {:.1f}% | {:.1f}% | {:.1f} | {:.0f} | {:.0f} → {:.0f} | "
          "{:.0f} → {:.0f} | {:.0f} |\n",
          ratio, distance, base.step_ms, sw.step_ms, link_ms, copy_ms, 100 * hidden, 100 * sw.swap.overlap_fraction,
          sw.swap.compute_wait_ms, mib(static_cast<std::int64_t>(sw.swap.bytes_d2h)), mib(base.peak_allocated),
          mib(sw.peak_allocated), mib(base.peak_reserved), mib(sw.peak_reserved),
          mib(base.peak_reserved - sw.peak_reserved));
    }
  }
  return 0;
}
