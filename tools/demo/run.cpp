#include "tools/demo/run.hpp"

#include "tools/demo/fit_check.hpp"

#include <bit>
#include <chrono>
#include <memory>

#include <fmt/format.h>

#include "stowage/allocator.hpp"
#include "stowage/config.hpp"
#include "stowage/device_handles.hpp"
#include "stowage/emulated_device.hpp"
#include "stowage/fault_injection.hpp"
#include "stowage/runtime.hpp"
#include "tools/demo/adamw.hpp"
#include "tools/demo/baseline_store.hpp"
#include "tools/demo/corpus.hpp"
#include "tools/demo/techniques.hpp"
#include "tools/demo/trainer.hpp"

namespace stowage::demo {

Device& demo_device(std::string* note) {
  if (!using_cuda()) {
    if (note) *note = "emulated device (the process default device)";
    return device(0);
  }
  // No GPU kernels in the demo yet: train on an emulated device beside the GPU.
  // STOWAGE_FAULTS applies to it as to the registry's devices.
  static std::unique_ptr<Device> own = [] {
    std::unique_ptr<Device> d = make_emulated_device(0);
    if (config().faults.any()) d = std::make_unique<FaultInjectingDevice>(std::move(d), config().faults);
    return d;
  }();
  if (note) *note = "emulated device (a GPU is present, but the demo has CPU kernels only)";
  return *own;
}

namespace {

std::uint64_t hash_bits(const std::vector<float>& values) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (float v : values) {
    h ^= std::bit_cast<std::uint32_t>(v);
    h *= 0x100000001b3ull;
  }
  return h;
}

struct Setup {
  std::unique_ptr<ParameterStore> params;
  std::unique_ptr<OptimizerStates> states;
  std::unique_ptr<HookChain> hooks = std::make_unique<HookChain>();
};

Setup make_setup(const Context& ctx, const Techniques& t, const std::vector<float>& init, const DemoOptions& o) {
  Setup s;
  s.params = t.shared_storage ? make_shared_storage_store(ctx, init, o.rounding) : make_separate_copy_store(ctx, init);
  const auto n = static_cast<std::int64_t>(init.size());
  s.states = t.offload_optimizer ? make_offloaded_states(ctx, n) : make_device_states(ctx, n);
  if (t.swap_attention) s.hooks->add(make_swap_hooks(ctx));
  if (t.recompute) s.hooks->add(make_recompute_hooks(ctx));
  return s;
}

ConfigResult run_one(const Configuration& config, const DemoOptions& o, Device& dev, const ParameterLayout& layout,
                     const std::vector<float>& init, const std::vector<std::int32_t>& tokens, std::size_t index,
                     const Progress& progress) {
  ConfigResult r;
  r.name = config.name;
  r.summary = config.summary;
  r.techniques = config.techniques;
  r.params = layout.total;
  r.vocab = o.shape.vocab;
  r.must_match = !(config.techniques.shared_storage && o.rounding == Rounding::half_up);
  // A fresh allocator per configuration: its peak statistics are this configuration's alone.
  CachingAllocator allocator(dev);
  const OwnedStream compute(dev);
  {
    Context ctx{&dev, &allocator, compute};
    Setup s = make_setup(ctx, config.techniques, init, o);
    r.details.push_back(s.params->describe());
    Trainer trainer(ctx, o.shape, layout, *s.params, *s.states, *s.hooks);
    double total_ms = 0;
    for (int step = 1; step <= o.steps; ++step) {
      const Batch batch = sample_batch(tokens, o.shape.batch, o.shape.seq, step);
      const auto t0 = std::chrono::steady_clock::now();
      r.losses.push_back(trainer.train_step(batch, step));
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (step > 1 || o.steps == 1) total_ms += ms;
      if (progress) progress(index, step, r.losses.back(), r);
    }
    r.mean_step_ms = total_ms / std::max(1, o.steps - 1);
    dev.synchronize(compute);
    r.master_hash = hash_bits(s.params->master());
    r.details.push_back(s.states->describe());  // after the run: what the states hold now
    s.hooks->describe(r.details);
  }
  dev.synchronize(compute);
  const AllocatorStats stats = allocator.stats();
  r.peak_allocated = stats.allocated_bytes.all.peak;
  r.peak_reserved = stats.reserved_bytes.all.peak;
  r.peak_requested = stats.requested_bytes.all.peak;
  r.left_allocated = stats.allocated_bytes.all.current;
  return r;
}

void compare(ConfigResult& r, const ConfigResult& baseline) {
  r.compared = true;
  r.bit_identical = r.losses.size() == baseline.losses.size();
  for (std::size_t i = 0; i < r.losses.size() && i < baseline.losses.size(); ++i)
    if (std::bit_cast<std::uint32_t>(r.losses[i]) != std::bit_cast<std::uint32_t>(baseline.losses[i])) {
      r.bit_identical = false;
      r.first_difference = static_cast<int>(i);
      break;
    }
}

}  // namespace

std::vector<ConfigResult> run_demo(const DemoOptions& o, const Progress& progress) {
  const std::string text = make_corpus(o.corpus_bytes);
  const CharTokenizer tok(text);
  const auto tokens = tok.encode(text);
  ModelShape shape = o.shape;
  shape.vocab = tok.vocab_size();
  shape.validate();
  if (o.steps <= 0) throw InvalidArgument(fmt::format("demo: --steps must be positive (got {})", o.steps));
  DemoOptions opts = o;
  opts.shape = shape;
  Device& dev = o.device ? *o.device : demo_device();
  if (!dev.properties().host_accessible)
    throw Unsupported("demo: the CPU kernels need a device whose memory the host can address");
  check_fits(shape, dev);  // before anything the size of the model is built
  const ParameterLayout layout = make_layout(shape);
  const std::vector<float> init = initial_parameters(layout, shape);

  std::vector<ConfigResult> results;
  for (std::size_t i = 0; i < opts.configs.size(); ++i)
    results.push_back(run_one(opts.configs[i], opts, dev, layout, init, tokens, i, progress));
  for (const auto& base : results)
    if (base.name == "baseline") {
      for (auto& r : results) compare(r, base);  // the baseline against itself: identical
      break;
    }
  return results;
}

}  // namespace stowage::demo
