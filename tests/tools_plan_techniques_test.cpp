// `stowage plan` and stowage's memory techniques: the search picks swap-attention, optimizer
// offload, shared storage or activation-function recompute when nothing fits without it, pays for
// none when memory is ample, and among those that fit takes the one cheapest in modelled time.
// One GPU (one layout per micro-batch), so each case isolates the techniques; the budgets are the
// estimator's own bytes for a given technique set, with no margin.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "tools/estimate/megatron_args.hpp"
#include "tools/plan/search.hpp"

using namespace stowage;
using namespace stowage::plan;
using estimate::OffloadMode;
using estimate::Recompute;
using estimate::RunConfig;

namespace {

// A 1.3B GPT (24 layers × 2048), one H100-like GPU, global batch 8.
PlanRequest one_gpu(std::int64_t seq) {
  PlanRequest r;
  estimate::apply_megatron_args(
      fmt::format("--num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length {0} "
                  "--max-position-embeddings {0} --vocab-size 51200 --bf16 --use-distributed-optimizer",
                  seq),
      r.base);
  r.base.training.global_batch = 8;
  r.cluster.gpus = 1;
  r.margin = 0;
  r.top = 4;
  return r;
}

struct Set {
  std::int64_t full_layers = 0;  // full recompute (block) of this many layers; 0: none
  bool act_fn = false, swap = false, offload = false, shared = false;
  std::int64_t resident = 0;  // swap: layers kept on the device (the prefetch window)
};

// The one-GPU layout at micro-batch 1 with these techniques, as the search configures it.
RunConfig with(const PlanRequest& r, const Set& s) {
  RunConfig c = r.base;
  c.training.micro_batch = 1;
  c.training.grad_accumulation = c.training.global_batch;
  c.recompute = {};
  if (s.full_layers > 0) {
    c.recompute.granularity = Recompute::full;
    c.recompute.num_layers = s.full_layers;
  }
  c.techniques.act_fn_recompute = s.act_fn;
  c.techniques.swap_attention = s.swap;
  c.techniques.prefetch_window = s.resident;
  c.techniques.optimizer_offload = s.offload ? OffloadMode::mapped : OffloadMode::none;
  c.techniques.shared_storage = s.shared;
  return c;
}

std::int64_t peak(const PlanRequest& r, const Set& s) { return estimate::estimate_memory(with(r, s)).peak_reserved; }

bool uses(const Plan& p, bool full, bool act_fn, bool swap, bool offload, bool shared) {
  const auto& c = p.config;
  return (c.recompute.granularity == Recompute::full) == full && c.techniques.act_fn_recompute == act_fn &&
         c.techniques.swap_attention == swap && (c.techniques.optimizer_offload != OffloadMode::none) == offload &&
         c.techniques.shared_storage == shared;
}

// The plan fits by the estimator's own bytes (recomputed from its configuration).
void expect_fits(const PlanRequest& r, const Plan& p) {
  const auto m = estimate::estimate_memory(p.config);
  EXPECT_EQ(p.memory.peak_reserved, m.peak_reserved);
  EXPECT_EQ(p.memory.host_bytes, m.host_bytes);
  EXPECT_LE(m.peak_reserved, memory_budget(r));
}

std::string describe(const Plan& p) {
  const auto& c = p.config;
  return fmt::format("mb {} recompute {} ({} layers) act_fn {} swap {} (resident {}) offload {} shared {}; {:.4f} s",
                     c.training.micro_batch, estimate::to_string(c.recompute.granularity), c.recompute.num_layers,
                     c.techniques.act_fn_recompute, c.techniques.swap_attention, c.techniques.prefetch_window,
                     estimate::to_string(c.techniques.optimizer_offload), c.techniques.shared_storage, p.time.total());
}

}  // namespace

// (b) Ample memory: no recompute, swap or offload (each costs time), and no free technique either
// (equal time: the simpler run).
TEST(PlanTechniques, AmpleMemoryPaysForNoTechnique) {
  PlanRequest r = one_gpu(2048);
  ASSERT_LT(peak(r, {}), memory_budget(r) / 2);  // 80 GiB: everything fits as it is
  const SearchResult res = search(r);
  ASSERT_FALSE(res.plans.empty());
  const Plan& best = res.plans[0];
  EXPECT_TRUE(uses(best, false, false, false, false, false)) << describe(best);
  EXPECT_EQ(best.time.recompute, 0.0);
  EXPECT_EQ(best.time.swap, 0.0);
  EXPECT_EQ(best.memory.host_bytes, 0);
  expect_fits(r, best);

  // The same on a multi-GPU layout search (llama2-7b on one DGX).
  PlanRequest big;
  big.base.model = estimate::preset("llama2-7b");
  big.base.training.global_batch = 64;
  big.cluster.gpus = 8;
  const SearchResult many = search(big);
  ASSERT_FALSE(many.plans.empty());
  EXPECT_TRUE(uses(many.plans[0], false, false, false, false, false)) << describe(many.plans[0]);
  EXPECT_EQ(many.plans[0].time.recompute + many.plans[0].time.swap, 0.0);
}

// (a) Optimizer offload: the fp32 master and moments (12 B per parameter) do not fit even with
// every other technique at its most (all layers recomputed and swapped, shared storage); with the
// states on the host the run fits, and that is the plan, with nothing else.
TEST(PlanTechniques, OptimizerOffloadWhenTheStatesDoNotFit) {
  PlanRequest r = one_gpu(2048);
  const std::int64_t offloaded = peak(r, {.offload = true});
  r.cluster.gpu_memory = offloaded;
  EXPECT_GT(peak(r, {.full_layers = 24, .act_fn = true, .swap = true, .shared = true}), memory_budget(r));
  const SearchResult res = search(r);
  ASSERT_FALSE(res.plans.empty());
  const Plan& best = res.plans[0];
  EXPECT_TRUE(uses(best, false, false, false, true, false)) << describe(best);
  expect_fits(r, best);
  // On the host: the master and both moments, 12 B per parameter.
  const auto on_device = estimate::estimate_memory(with(r, {}));
  EXPECT_EQ(best.memory.host_bytes, on_device.optimizer_states);
  EXPECT_EQ(best.memory.host_bytes, 12 * on_device.parameters);
  EXPECT_GT(best.time.optimizer, evaluate(with(r, {}), r.cluster).time.optimizer);  // the host link is slower
  // The node's host memory must hold it: one byte short, no plan fits.
  r.cluster.host_memory_per_node = best.memory.host_bytes - 1;
  EXPECT_TRUE(search(r).plans.empty());
}

// (a) Shared storage: 2 B per parameter is what is missing; it costs no modelled time, so it is
// taken before any recompute or swap.
TEST(PlanTechniques, SharedStorageBeforeRecompute) {
  PlanRequest r = one_gpu(2048);
  r.cluster.gpu_memory = peak(r, {.shared = true});
  ASSERT_GT(peak(r, {}), memory_budget(r));
  ASSERT_LE(peak(r, {.full_layers = 24}), memory_budget(r));  // recompute would fit too
  const SearchResult res = search(r);
  ASSERT_FALSE(res.plans.empty());
  const Plan& best = res.plans[0];
  EXPECT_TRUE(uses(best, false, false, false, false, true)) << describe(best);
  expect_fits(r, best);
  EXPECT_EQ(best.time.recompute + best.time.swap, 0.0);
  EXPECT_LT(best.time.total(), evaluate(with(r, {.full_layers = 24}), r.cluster).time.total());
}

// (a, c) Activation-function recompute: at a long sequence the MLP activation outputs (2·ffn B per
// token per layer) are more than shared storage saves; rerunning the activation is HBM-bound and
// far cheaper than recomputing whole layers, and swapping is made slow here (a 1 GB/s host link).
TEST(PlanTechniques, ActivationFunctionRecomputeBeforeFullRecompute) {
  PlanRequest r = one_gpu(8192);
  r.cluster.host_link_gbps = 1;
  r.cluster.gpu_memory = peak(r, {.act_fn = true});
  ASSERT_GT(peak(r, {.shared = true}), memory_budget(r));  // shared storage alone is not enough
  const SearchResult res = search(r);
  ASSERT_FALSE(res.plans.empty());
  const Plan& best = res.plans[0];
  EXPECT_TRUE(uses(best, false, true, false, false, false)) << describe(best);
  expect_fits(r, best);
  EXPECT_GT(best.time.recompute, 0.0);
  // Full recompute of the fewest layers that fit costs more.
  std::int64_t k = 1;
  while (peak(r, {.full_layers = k}) > memory_budget(r)) ++k;
  ASSERT_LE(k, 24);
  const Plan full = evaluate(with(r, {.full_layers = k}), r.cluster);
  EXPECT_GT(full.time.recompute, best.time.recompute);
  EXPECT_GT(full.time.total(), best.time.total());
}

// (a) Swap-attention: with a fast host link its transfers hide under compute, so it beats
// recomputing when neither shared storage nor activation-function recompute is enough; the search
// swaps the fewest layers that fit.
TEST(PlanTechniques, SwapAttentionWhenItsTransfersHide) {
  PlanRequest r = one_gpu(8192);
  r.cluster.host_link_gbps = 1000;
  r.cluster.gpu_memory = peak(r, {.act_fn = true, .shared = true}) - 1;
  ASSERT_LE(peak(r, {.swap = true, .resident = 0}), memory_budget(r));
  const SearchResult res = search(r);
  ASSERT_FALSE(res.plans.empty());
  const Plan& best = res.plans[0];
  ASSERT_TRUE(best.config.techniques.swap_attention) << describe(best);
  EXPECT_NE(best.config.recompute.granularity, Recompute::full) << describe(best);
  expect_fits(r, best);
  EXPECT_EQ(best.time.swap, 0.0);  // hidden
  EXPECT_GT(best.memory.host_bytes, 0);
  // Fewest swapped: one more resident layer does not fit.
  RunConfig more = best.config;
  ++more.techniques.prefetch_window;
  EXPECT_GT(estimate::estimate_memory(more).peak_reserved, memory_budget(r)) << describe(best);
}

// (c) The same shortage with a slow host link (1 GB/s): the swap transfers would be exposed, so
// the search recomputes instead, and the swap it rejects is costed at its link time.
TEST(PlanTechniques, ASlowHostLinkMakesRecomputeCheaperThanSwap) {
  PlanRequest r = one_gpu(8192);
  r.cluster.host_link_gbps = 1;
  r.cluster.gpu_memory = peak(r, {.act_fn = true, .shared = true}) - 1;
  const SearchResult res = search(r);
  ASSERT_FALSE(res.plans.empty());
  const Plan& best = res.plans[0];
  EXPECT_FALSE(best.config.techniques.swap_attention) << describe(best);
  EXPECT_EQ(best.config.recompute.granularity, Recompute::full) << describe(best);
  expect_fits(r, best);
  const Plan swap = evaluate(with(r, {.swap = true, .resident = 0}), r.cluster);
  ASSERT_LE(swap.memory.peak_reserved, memory_budget(r));
  const double per_microbatch = double(swap.memory.host_bytes) / 1e9;  // one micro-batch in flight
  const double fwd = swap.time.compute / 3 / 8, bwd = 2 * fwd;
  EXPECT_NEAR(swap.time.swap, 8 * ((per_microbatch - fwd) + (per_microbatch - bwd)), 1e-9);
  EXPECT_GT(swap.time.total(), best.time.total());
}

// Swap time counts the swapped activations only: offloaded optimizer states share the host bytes
// but move in the optimizer step (timed there).
TEST(PlanTimeModel, SwapTimeCountsOnlySwappedActivations) {
  PlanRequest r = one_gpu(8192);
  r.cluster.host_link_gbps = 1;
  const Plan swap = evaluate(with(r, {.swap = true, .resident = 0}), r.cluster);
  const Plan both = evaluate(with(r, {.swap = true, .offload = true, .resident = 0}), r.cluster);
  ASSERT_GT(both.memory.host_bytes, swap.memory.host_bytes);
  EXPECT_GT(swap.time.swap, 0.0);
  EXPECT_DOUBLE_EQ(both.time.swap, swap.time.swap);
  EXPECT_GT(both.time.optimizer, swap.time.optimizer);
}

// Activation-function recompute reruns the activation of the layers full recompute leaves stored;
// a recomputed layer's activation is rerun by its forward already (counted there).
TEST(PlanTimeModel, ActivationFunctionRecomputeOnlyOnStoredLayers) {
  PlanRequest r = one_gpu(2048);
  const Plan act_fn = evaluate(with(r, {.act_fn = true}), r.cluster);
  const Plan full = evaluate(with(r, {.full_layers = 24}), r.cluster);
  const Plan half = evaluate(with(r, {.full_layers = 12}), r.cluster);
  ASSERT_GT(act_fn.time.recompute, 0.0);
  EXPECT_DOUBLE_EQ(evaluate(with(r, {.full_layers = 24, .act_fn = true}), r.cluster).time.recompute,
                   full.time.recompute);
  EXPECT_NEAR(evaluate(with(r, {.full_layers = 12, .act_fn = true}), r.cluster).time.recompute,
              half.time.recompute + act_fn.time.recompute / 2, 1e-12);
}

// Activation-function recompute of the first n layers only (Megatron's activation-function
// granularity with --recompute-num-layers n) costs n layers' reruns.
TEST(PlanTimeModel, ActivationFunctionRecomputeOfSomeLayers) {
  PlanRequest r = one_gpu(2048);
  const Plan all = evaluate(with(r, {.act_fn = true}), r.cluster);
  RunConfig some = with(r, {});
  some.recompute.granularity = Recompute::activation_function;
  some.recompute.num_layers = 6;
  EXPECT_NEAR(evaluate(some, r.cluster).time.recompute, all.time.recompute / 4, 1e-12);
}
