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
#include "stowage/emulated_device.hpp"
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
const Mode kModes[] = {
    {"device", StatePlacement::device}, {"mapped", StatePlacement::mapped}, {"streamed", StatePlacement::streamed}};

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

// One placement's optimizer steps (AdamW, states placed by `mode`) on an n-parameter bucket.
// step() runs one and returns its wall time.
class OptimizerStep {
 public:
  OptimizerStep(CachingAllocator& alloc, HostPool& pool, std::size_t n, StatePlacement mode, std::size_t chunk)
      : bucket_(alloc, {{"w", {static_cast<std::int64_t>(n)}}}),
        g_(filled(alloc, n, 1)),
        adam_(alloc, pool, n, options_for(mode, chunk)),
        dev_(alloc.device()) {
    step();  // warm: pool pages, windows
  }

  double step() {
    const auto t0 = Clock::now();
    adam_.step(bucket_, g_, {}, {.skip_nonfinite = false}, state_);
    dev_.synchronize();
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  }

 private:
  ParameterBucket bucket_;
  TensorView g_;
  OffloadedAdam adam_;
  OptimizerState state_;
  Device& dev_;
};

// Median step time of each run, the runs taking turns one step each, so that drift in the
// machine's speed (a shared VM) falls on all of them alike.
template <class Run>
std::vector<double> interleaved_medians(std::vector<std::unique_ptr<Run>>& runs, int steps) {
  std::vector<std::vector<double>> t(runs.size());
  for (int r = 0; r < steps; ++r)
    for (std::size_t i = 0; i < runs.size(); ++i) t[i].push_back(runs[i]->step());
  std::vector<double> out;
  for (auto& ti : t) out.push_back(median(ti));
  return out;
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

// A training loop for one placement of the states: `accum` micro-batches over `layers` layers,
// then AdamW. step() runs one global step and returns its wall time.
class EndToEnd {
 public:
  EndToEnd(CachingAllocator& alloc, HostPool& pool, std::size_t layers, std::size_t h, std::size_t T, int accum,
           StatePlacement mode, std::size_t chunk)
      : layers_(layers),
        h_(h),
        T_(T),
        accum_(accum),
        bucket_(alloc, specs(layers, h)),
        n_(bucket_.numel()),
        grad_(TensorView::empty(alloc, DType::f32, {static_cast<std::int64_t>(n_)})),
        x_(filled(alloc, T * h, 4)),
        y_(filled(alloc, T * h, 5)),
        dx_(filled(alloc, T * h, 6)),
        adam_(alloc, pool, n_, options_for(mode, chunk)),
        dev_(alloc.device()) {
    std::vector<float> init(h * h);
    std::mt19937 rng(3);
    std::normal_distribution<float> d(0.0f, 0.02f);
    for (std::size_t l = 0; l < layers; ++l) {
      for (auto& v : init) v = d(rng);
      bucket_.write_fp32(l, init.data(), init.size());
    }
    step();  // warm: pool pages, windows
  }

  double step() {
    const auto t0 = Clock::now();
    const Stream s = bucket_.stream();
    dev_.fill_async(grad_.data(), 0, n_ * 4, s);
    for (int m = 0; m < accum_; ++m)
      for (std::size_t l = 0; l < layers_; ++l) {
        const auto* w = static_cast<const std::uint16_t*>(bucket_.bf16(l).data());
        float* dw = grad_.data_as<float>() + bucket_.slot(l).offset;
        const float* xp = x_.data_as<float>();
        float* yp = y_.data_as<float>();
        float* dxp = dx_.data_as<float>();
        dev_.launch_host(s, [=, h = h_, T = T_] { micro_batch(w, dw, xp, yp, dxp, h, T); });
      }
    adam_.step(bucket_, grad_, {.lr = 1e-4f}, {.skip_nonfinite = false}, state_);
    dev_.synchronize();
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  }

 private:
  static std::vector<ParameterSpec> specs(std::size_t layers, std::size_t h) {
    std::vector<ParameterSpec> v;
    for (std::size_t l = 0; l < layers; ++l)
      v.push_back({"layer" + std::to_string(l), {static_cast<std::int64_t>(h), static_cast<std::int64_t>(h)}});
    return v;
  }

  std::size_t layers_, h_, T_;
  int accum_;
  ParameterBucket bucket_;
  std::size_t n_;
  TensorView grad_, x_, y_, dx_;
  OffloadedAdam adam_;
  OptimizerState state_;
  Device& dev_;
};

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
  std::printf(
      "Machine: %s, %u hardware threads. Command: `offload_optimizer_tool%s --link-gbps %.1f --reps %d`. "
      "Median step time; the three placements take turns, one step each.\n\n",
      cpu_model().c_str(), std::thread::hardware_concurrency(), args.quick ? " --quick" : "", args.link_gbps,
      args.reps);
  std::printf("Optimizer step (AdamW on split-storage weights, m and v offloaded):\n\n");
  std::printf(
      "| params | steps | device ms | mapped ms | streamed ms | link bound ms | streamed / link bound | mapped / "
      "device |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  const std::vector<std::size_t> sizes = args.quick
                                             ? std::vector<std::size_t>{1u << 20, 4u << 20}
                                             : std::vector<std::size_t>{1u << 20, 4u << 20, 16u << 20, 64u << 20};
  for (std::size_t n : sizes) {
    // 16 chunks: the first H2D and the last D2H, which nothing overlaps, are 1/16 of the bytes.
    // No chunk below 64 Ki elements (512 KiB windows), where each chunk's kernel launch and
    // event round trips start to cost more than its bytes.
    const std::size_t c = std::max<std::size_t>(std::size_t{1} << 16, n / 16);
    std::vector<std::unique_ptr<OptimizerStep>> runs;
    for (const Mode& m : kModes) runs.push_back(std::make_unique<OptimizerStep>(alloc, pool, n, m.host_mode, c));
    // Small steps last a few ms, where one late thread wake-up is a large share: more of them.
    const int steps = std::max<int>(args.reps, static_cast<int>(args.reps * ((std::size_t{16} << 20) / n)));
    const std::vector<double> ms = interleaved_medians(runs, steps);
    // Each direction carries m and v (8 B/param) on its own engine.
    const double bound = static_cast<double>(n) * 8 / (args.link_gbps * 1e9) * 1e3;
    std::printf("| %zu Mi (%zu chunks) | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", n >> 20, n / c, steps,
                ms[0], ms[1], ms[2], bound, ms[2] / bound, ms[1] / ms[0]);
    std::fflush(stdout);
  }

  const std::size_t layers = 4, h = args.quick ? 256 : 512, T = 32;
  const int accum = 8;
  // The expected overhead (the streamed step's extra ms over ~300 ms of micro-batches) is well
  // under the run-to-run spread of one step on a shared VM: three times the steps.
  const int e2e_steps = 3 * args.reps;
  std::printf(
      "\nEnd to end, gradient accumulation %d (%zu layers of %zux%zu, %zu tokens per micro-batch, "
      "6·T·h² flops per layer and micro-batch, then one AdamW step; median of %d global steps, "
      "the placements taking turns):\n\n",
      accum, layers, h, h, T, e2e_steps);
  std::printf("| states | ms per global step | overhead vs device |\n|---|---:|---:|\n");
  // The placements take turns, one global step each, so that drift in the machine's speed
  // (a shared VM) falls on all of them alike.
  std::vector<std::unique_ptr<EndToEnd>> runs;
  for (const Mode& m : kModes)
    runs.push_back(
        std::make_unique<EndToEnd>(alloc, pool, layers, h, T, accum, m.host_mode, std::min(chunk, layers * h * h / 4)));
  const std::vector<double> ms = interleaved_medians(runs, e2e_steps);
  for (std::size_t i = 0; i < runs.size(); ++i)
    std::printf("| %s | %.1f | %+.2f%% |\n", kModes[i].name, ms[i], (ms[i] / ms[0] - 1) * 100);
  std::printf("\n");
  return 0;
}
