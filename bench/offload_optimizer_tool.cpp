// Optimizer offload on the emulated device with a throttled link: the AdamW step with states on
// the device, mapped, and streamed, at several sizes, against the time the link allows for the
// bytes streamed; then an end-to-end loop (8 micro-batches of matrix products, one step) for the
// step-time overhead with gradient accumulation. Prints markdown on stdout.
//   offload_optimizer_tool [--quick] [--link-gbps G] [--reps R]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "stowage/allocator.hpp"
#include "stowage/bucket_optimizers.hpp"
#include "stowage/host_pool.hpp"
#include "stowage/offload.hpp"
#include "stowage/parameter_bucket.hpp"

using namespace stowage;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  bool quick = false;
  double link_gbps = 4.0;
  int reps = 7;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--quick") {
      a.quick = true;
      a.reps = 3;
    } else if (s == "--link-gbps" && i + 1 < argc) {
      a.link_gbps = std::atof(argv[++i]);
    } else if (s == "--reps" && i + 1 < argc) {
      a.reps = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: offload_optimizer_tool [--quick] [--link-gbps G] [--reps R]\n");
      std::exit(2);
    }
  }
  return a;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Mode {
  const char* name;
  StatePlacement host_mode;
};
const Mode kModes[] = {{"device", StatePlacement::device}, {"mapped", StatePlacement::mapped},
                       {"streamed", StatePlacement::streamed}};

OffloadOptions options_for(StatePlacement mode, std::size_t chunk) {
  OffloadOptions o;
  o.host_mode = mode;
  o.chunk_elements = chunk;
  // Everything offloaded: the budget holds just the streamed window.
  o.device_budget_bytes = mode == StatePlacement::streamed ? 3 * chunk * 8 : 0;
  return o;
}

TensorView filled(CachingAllocator& a, std::size_t n, std::uint32_t seed) {
  TensorView t = TensorView::empty(a, DType::f32, {static_cast<std::int64_t>(n)});
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  float* p = t.data_as<float>();  // the emulated device's memory is host-addressable
  for (std::size_t i = 0; i < n; ++i) p[i] = d(rng);
  return t;
}

// Median wall time of one optimizer step, states placed by `mode`.
double step_ms(CachingAllocator& alloc, HostPool& pool, std::size_t n, StatePlacement mode, std::size_t chunk,
               int reps) {
  ParameterBucket bucket(alloc, {{"w", {static_cast<std::int64_t>(n)}}});
  TensorView g = filled(alloc, n, 1);
  OffloadedAdam adam(alloc, pool, n, options_for(mode, chunk));
  OptimizerState state;
  Device& dev = alloc.device();
  adam.step(bucket, g, {}, {.skip_nonfinite = false}, state);  // warm: pool pages, windows
  dev.synchronize();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    adam.step(bucket, g, {}, {.skip_nonfinite = false}, state);
    dev.synchronize();
    t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  return median(t);
}

// One layer's forward and weight-gradient products for T tokens on a [h x h] bf16 weight:
// y = x W, dW += x^T dy, dx = dy W^T (6 T h^2 flops), run on the compute stream.
void micro_batch(const std::uint16_t* w, float* dw, const float* x, float* y, float* dx, std::size_t h, std::size_t T) {
  std::vector<float> wf(h * h);
  for (std::size_t i = 0; i < h * h; ++i) {
    const std::uint32_t bits = std::uint32_t{w[i]} << 16;
    std::memcpy(&wf[i], &bits, 4);
  }
  for (std::size_t t = 0; t < T; ++t) {
    float* yt = y + t * h;
    std::fill(yt, yt + h, 0.0f);
    for (std::size_t k = 0; k < h; ++k) {
      const float xk = x[t * h + k];
      const float* row = &wf[k * h];
      for (std::size_t j = 0; j < h; ++j) yt[j] += xk * row[j];
    }
  }
  const float* dy = y;  // the loss gradient stands in as the output itself
  for (std::size_t t = 0; t < T; ++t)
    for (std::size_t k = 0; k < h; ++k) {
      const float xk = x[t * h + k];
      float* drow = dw + k * h;
      for (std::size_t j = 0; j < h; ++j) drow[j] += xk * dy[t * h + j] * 1e-3f;
    }
  for (std::size_t t = 0; t < T; ++t)
    for (std::size_t k = 0; k < h; ++k) {
      float s = 0;
      const float* row = &wf[k * h];
      for (std::size_t j = 0; j < h; ++j) s += dy[t * h + j] * row[j];
      dx[t * h + k] = s;
    }
}

// Median wall time of one global step: `accum` micro-batches over `layers` layers, then AdamW.
double e2e_ms(CachingAllocator& alloc, HostPool& pool, std::size_t layers, std::size_t h, std::size_t T, int accum,
              StatePlacement mode, std::size_t chunk, int reps) {
  std::vector<ParameterSpec> specs;
  for (std::size_t l = 0; l < layers; ++l)
    specs.push_back({"layer" + std::to_string(l), {static_cast<std::int64_t>(h), static_cast<std::int64_t>(h)}});
  ParameterBucket bucket(alloc, specs);
  const std::size_t n = bucket.numel();
  std::vector<float> init(h * h);
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 0.02f);
  for (std::size_t l = 0; l < layers; ++l) {
    for (auto& v : init) v = d(rng);
    bucket.write_fp32(l, init.data(), init.size());
  }
  TensorView grad = TensorView::empty(alloc, DType::f32, {static_cast<std::int64_t>(n)});
  TensorView x = filled(alloc, T * h, 4), y = filled(alloc, T * h, 5), dx = filled(alloc, T * h, 6);
  OffloadedAdam adam(alloc, pool, n, options_for(mode, chunk));
  OptimizerState state;
  Device& dev = alloc.device();
  const Stream s = bucket.stream();
  auto global_step = [&] {
    dev.fill_async(grad.data(), 0, n * 4, s);
    for (int m = 0; m < accum; ++m)
      for (std::size_t l = 0; l < layers; ++l) {
        const auto* w = static_cast<const std::uint16_t*>(bucket.bf16(l).data());
        float* dw = grad.data_as<float>() + bucket.slot(l).offset;
        const float* xp = x.data_as<float>();
        float* yp = y.data_as<float>();
        float* dxp = dx.data_as<float>();
        dev.launch_host(s, [=] { micro_batch(w, dw, xp, yp, dxp, h, T); });
      }
    adam.step(bucket, grad, {.lr = 1e-4f}, {.skip_nonfinite = false}, state);
    dev.synchronize();
  };
  global_step();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    global_step();
    t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  return median(t);
}

std::string cpu_model() {
  std::FILE* f = std::fopen("/proc/cpuinfo", "r");
  if (!f) return "unknown CPU";
  char line[512];
  std::string model = "unknown CPU";
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, "model name", 10) == 0) {
      const char* c = std::strchr(line, ':');
      if (c) model = std::string(c + 2);
      if (!model.empty() && model.back() == '\n') model.pop_back();
      break;
    }
  }
  std::fclose(f);
  return model;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  EmulatedOptions eo;
  eo.capacity = std::size_t{4} << 30;
  eo.link_bandwidth_gbps = args.link_gbps;
  auto dev = make_emulated_device(0, eo);
  CachingAllocator alloc(*dev);
  HostPool pool(*dev);
  const std::size_t chunk = std::size_t{1} << 18;  // 256 Ki elements: 2 MiB per streamed window

  std::printf("### Optimizer offload (emulated device, link %.1f GB/s each way)\n\n", args.link_gbps);
  std::printf("Machine: %s, %u hardware threads. Command: `offload_optimizer_tool%s --link-gbps %.1f --reps %d`. "
              "Median of %d steps.\n\n",
              cpu_model().c_str(), std::thread::hardware_concurrency(), args.quick ? " --quick" : "", args.link_gbps,
              args.reps, args.reps);
  std::printf("Optimizer step (AdamW on split-storage weights, m and v offloaded):\n\n");
  std::printf("| params | device ms | mapped ms | streamed ms | link bound ms | streamed / link bound | mapped / device |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|\n");
  const std::vector<std::size_t> sizes = args.quick ? std::vector<std::size_t>{1u << 20, 4u << 20}
                                                    : std::vector<std::size_t>{1u << 20, 4u << 20, 16u << 20, 64u << 20};
  for (std::size_t n : sizes) {
    double ms[3];
    // 16 chunks: the first H2D and the last D2H, which nothing overlaps, are 1/16 of the bytes.
    // No chunk below 64 Ki elements (512 KiB windows), where each chunk's kernel launch and
    // event round trips start to cost more than its bytes.
    const std::size_t c = std::max<std::size_t>(std::size_t{1} << 16, n / 16);
    for (int m = 0; m < 3; ++m) ms[m] = step_ms(alloc, pool, n, kModes[m].host_mode, c, args.reps);
    // Each direction carries m and v (8 B/param) on its own engine.
    const double bound = static_cast<double>(n) * 8 / (args.link_gbps * 1e9) * 1e3;
    std::printf("| %zu Mi (%zu chunks) | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", n >> 20, n / c, ms[0], ms[1], ms[2], bound,
                ms[2] / bound, ms[1] / ms[0]);
    std::fflush(stdout);
  }

  const std::size_t layers = 4, h = args.quick ? 256 : 512, T = 32;
  const int accum = 8;
  std::printf("\nEnd to end, gradient accumulation %d (%zu layers of %zux%zu, %zu tokens per micro-batch, "
              "6·T·h² flops per layer and micro-batch, then one AdamW step):\n\n",
              accum, layers, h, h, T);
  std::printf("| states | ms per global step | overhead vs device |\n|---|---:|---:|\n");
  double base = 0;
  for (const Mode& m : kModes) {
    const double t = e2e_ms(alloc, pool, layers, h, T, accum, m.host_mode, std::min(chunk, layers * h * h / 4),
                            std::max(3, args.reps / 2));
    if (m.host_mode == StatePlacement::device) base = t;
    std::printf("| %s | %.1f | %+.2f%% |\n", m.name, t, (t / base - 1) * 100);
    std::fflush(stdout);
  }
  std::printf("\n");
  return 0;
}
