#include "tools/plan/search.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <numeric>
#include <optional>
#include <thread>
#include <tuple>

#include <fmt/format.h>

#include "stowage/error.hpp"
#include "tools/estimate/comparison.hpp"

namespace stowage::plan {

using estimate::OffloadMode;
using estimate::Recompute;
using estimate::RunConfig;
using estimate::StageMemory;

namespace {

struct Layout {
  std::int64_t tp, pp, vpp, cp, ep, dp, micro_batch;
  int zero;
  std::int64_t first = 0, last = 0;  // an uneven first and last stage's layers (0: an even split)
};

// The layers of an uneven first and last stage when PP does not divide them (Megatron
// --decoder-first/last-pipeline-num-layers): the middle stages take ⌈L/PP⌉ each, the first and the
// last share the rest, the last (which also runs the loss) the smaller half. None when a stage
// would be left empty or hold more than a middle one.
std::optional<std::pair<std::int64_t, std::int64_t>> uneven_split(std::int64_t layers, std::int64_t pp) {
  if (pp < 2) return std::nullopt;
  const std::int64_t q = (layers + pp - 1) / pp, rest = pp == 2 ? layers : layers - (pp - 2) * q;
  const std::int64_t last = rest / 2, first = rest - last;
  if (last < 1 || (pp > 2 && first > q)) return std::nullopt;
  return std::make_pair(first, last);
}

// Technique sets tried on every layout; full recompute and swap are refined per layer.
struct Techniques {
  bool full = false, act_fn = false, swap = false, offload = false, shared = false, selective = false;
};

// Selective recompute (core attention) only matters where attention stores its s×s scores; with
// flash attention it is the same plan as no recompute, and is not tried.
std::vector<Techniques> technique_sets(const SearchSpace& s, bool flash_attention) {
  std::vector<Techniques> out;
  for (int bits = 0; bits < 64; ++bits) {
    Techniques t{bool(bits & 1), bool(bits & 2), bool(bits & 4), bool(bits & 8), bool(bits & 16), bool(bits & 32)};
    if (!s.techniques && (t.act_fn || t.swap || t.offload || t.shared)) continue;
    if (t.selective && (t.full || flash_attention)) continue;
    out.push_back(t);
  }
  return out;
}

std::vector<std::int64_t> divisors(std::int64_t n, std::int64_t limit) {
  std::vector<std::int64_t> d;
  for (std::int64_t i = 1; i <= std::min(n, limit); ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

std::vector<Layout> layouts(const PlanRequest& r) {
  const auto& m = r.base.model;
  const auto& cl = r.cluster;
  const std::int64_t gbs = r.base.training.global_batch, seq = r.base.training.seq_length;
  std::vector<Layout> out;
  for (std::int64_t tp : divisors(cl.gpus_per_node, cl.gpus)) {
    if (m.num_heads % tp || m.ffn_hidden_size % tp || m.kv_heads() % tp) continue;  // Megatron splits the groups
    if (m.shared_experts() && m.shared_expert_ffn_hidden_size % tp) continue;       // split by TP as a dense MLP
    for (std::int64_t cp = 1; cp <= r.space.max_cp && tp * cp <= cl.gpus; cp *= 2) {
      // Sequence parallelism splits each rank's seq/cp tokens by tp; Megatron-LM's load-balanced
      // context parallelism cuts the sequence into 2·cp chunks (arguments.py asserts both).
      if (seq % (cp * tp) != 0 || (cp > 1 && seq % (2 * cp) != 0)) continue;
      for (std::int64_t pp : divisors(cl.gpus / (tp * cp), m.num_layers)) {
        // PP dividing the layers splits them evenly; otherwise the first and last stages differ.
        std::int64_t first = 0, last = 0, per_stage = m.num_layers / pp;
        if (m.num_layers % pp != 0) {
          const auto split = uneven_split(m.num_layers, pp);
          if (!split) continue;
          std::tie(first, last) = *split;
          per_stage = std::gcd(first, last);
          if (pp > 2) per_stage = std::gcd(per_stage, (m.num_layers - first - last) / (pp - 2));
        }
        if (cl.gpus % (tp * cp * pp) != 0) continue;
        const std::int64_t dp = cl.gpus / (tp * cp * pp);
        // MoE parallel folding (Megatron-LM parallel_state.py): experts need only ETP·EP to divide
        // TP·CP·DP, the ranks of a pipeline stage; ETP follows TP unless the base run fixes it.
        const std::int64_t etp = r.base.parallel.etp > 0 ? r.base.parallel.etp : tp;
        if (m.moe() && m.expert_ffn() % etp) continue;
        for (std::int64_t ep : m.moe() ? divisors(m.num_experts, tp * cp * dp) : std::vector<std::int64_t>{1}) {
          if ((tp * cp * dp) % (etp * ep)) continue;
          for (std::int64_t mb = 1; mb <= r.space.max_micro_batch; mb *= 2) {
            if (gbs % (mb * dp) != 0) continue;
            const std::int64_t M = gbs / (mb * dp);
            std::vector<std::int64_t> vpps{1};
            // The interleaved schedule takes micro-batches in groups of pp: Megatron-LM refuses a
            // count that is not a multiple of pp (schedules.py, microbatch_group_size_per_vp_stage).
            if (pp > 1 && M >= pp && M % pp == 0)
              for (std::int64_t v : divisors(per_stage, r.space.max_vpp))
                if (v > 1) vpps.push_back(v);
            for (std::int64_t v : vpps)
              for (int zero : {0, 1, 3}) {
                if (zero > 0 && dp * cp == 1) continue;
                if (zero == 3 && (!r.space.zero3 || pp > 1)) continue;  // Megatron FSDP without PP
                out.push_back({tp, pp, v, cp, ep, dp, mb, zero, first, last});
              }
          }
        }
      }
    }
  }
  return out;
}

RunConfig configure(const PlanRequest& r, const Layout& l, const Techniques& t) {
  RunConfig c = r.base;
  auto& p = c.parallel;
  p.tp = l.tp;
  p.pp = l.pp;
  p.vpp = l.vpp;
  // The plan splits the layers itself: a split written for one pipeline size does not carry over.
  p.layout_layers.clear();
  p.layout_mtp_rank = -1;
  p.embedding_as_layer = p.loss_as_layer = false;
  p.first_stage_layers = l.first;
  p.last_stage_layers = l.last;
  p.cp = l.cp;
  p.ep = l.ep;
  p.dp = l.dp;
  p.sequence_parallel = l.tp > 1;
  // Megatron-LM offloads the optimizer only as the distributed optimizer's precision-aware form
  // (arguments.py, optimizer/__init__.py): a layout without data parallelism takes it at stage 1.
  p.zero_stage = t.offload && l.zero == 0 ? 1 : l.zero;
  c.training.micro_batch = l.micro_batch;
  c.training.grad_accumulation = c.training.global_batch / (l.micro_batch * l.dp);
  c.recompute = {};
  if (t.full) {
    c.recompute.granularity = Recompute::full;
    c.recompute.method = estimate::RecomputeMethod::block;
  } else if (t.selective) {
    c.recompute.granularity = Recompute::selective;
  }
  c.techniques = {};
  c.techniques.rounding = r.base.techniques.rounding;
  c.techniques.act_fn_recompute = t.act_fn;
  c.techniques.swap_attention = t.swap;
  c.techniques.optimizer_offload = t.offload ? OffloadMode::mapped : OffloadMode::none;
  c.techniques.shared_storage = t.shared && !t.offload;
  c.stage = -1;
  return c;
}

struct Evaluator {
  const PlanRequest& r;
  std::int64_t budget;
  std::int64_t evaluations = 0;

  bool fits(const RunConfig& c, StageMemory& m) {
    ++evaluations;
    m = estimate::estimate_memory(c);
    if (m.peak_reserved > budget) return false;
    const double host_per_node = double(m.host_bytes) * double(std::min(r.cluster.gpus, r.cluster.gpus_per_node));
    return host_per_node <= double(r.cluster.host_memory_per_node);
  }

  // The smallest k in [lo, hi] for which set(k) fits (memory falls as k grows); false if none.
  template <typename Set>
  bool smallest(RunConfig& c, std::int64_t lo, std::int64_t hi, Set set, StageMemory& m) {
    set(c, hi);
    if (!fits(c, m)) return false;
    StageMemory best = m;
    while (lo < hi) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      set(c, mid);
      if (fits(c, m)) {
        hi = mid;
        best = m;
      } else {
        lo = mid + 1;
      }
    }
    set(c, hi);
    m = best;
    return true;
  }

  // Fits the candidate, choosing per layer: the fewest full-recompute layers per model chunk,
  // then the fewest swapped layers (the largest prefetch window).
  bool fit(RunConfig& c, const Techniques& t, StageMemory& m) {
    std::int64_t chunk = 0;  // the largest model chunk
    for (std::int64_t r = 0; r < c.parallel.pp; ++r)
      for (std::int64_t k = 0; k < c.parallel.vpp; ++k) chunk = std::max(chunk, estimate::chunk_layers(c, r, k));
    if (t.full) {
      c.techniques.prefetch_window = 0;  // with swap on, everything not recomputed is swapped
      return smallest(
          c, 1, chunk, [](RunConfig& rc, std::int64_t k) { rc.recompute.num_layers = k; }, m);
    }
    if (t.swap) {
      // Layer-micro-batches resident = stored units − swapped; swap the fewest.
      const std::int64_t units = estimate::chunks_in_flight(c, 0) * chunk;
      return smallest(
          c, 1, units, [units](RunConfig& rc, std::int64_t k) { rc.techniques.prefetch_window = units - k; }, m);
    }
    return fits(c, m);
  }
};

// Faster first; equal times ordered by the layout and techniques, so the result does not
// depend on which thread found a plan.
int technique_count(const RunConfig& c) {
  return int(c.recompute.granularity != Recompute::none) + int(c.techniques.act_fn_recompute) +
         int(c.techniques.swap_attention) + int(c.techniques.optimizer_offload != OffloadMode::none) +
         int(c.techniques.shared_storage);
}

// Faster first; at equal time fewer techniques (the simpler run), then the layout.
auto order_key(const Plan& p) {
  const auto& c = p.config;
  return std::make_tuple(p.time.total(), technique_count(c), c.parallel.tp, c.parallel.pp, c.parallel.vpp,
                         c.parallel.cp, c.parallel.ep, c.parallel.zero_stage, c.training.micro_batch,
                         int(c.recompute.granularity), c.recompute.num_layers, c.techniques.act_fn_recompute,
                         c.techniques.swap_attention, c.techniques.prefetch_window, int(c.techniques.optimizer_offload),
                         c.techniques.shared_storage);
}
bool faster(const Plan& a, const Plan& b) { return order_key(a) < order_key(b); }

// Offload on a layout without the distributed optimizer is the same plan as on its stage-1 twin
// (configure), which data parallelism makes a layout of its own: tried there only.
bool tried(const Layout& l, const Techniques& t) { return !(t.offload && l.zero == 0 && l.dp * l.cp > 1); }

}  // namespace

void for_each_candidate(const PlanRequest& r, const std::function<void(const RunConfig&)>& visit) {
  const std::vector<Techniques> sets = technique_sets(r.space, r.base.training.flash_attention);
  for (const Layout& l : layouts(r))
    for (const Techniques& t : sets)
      if (tried(l, t)) visit(configure(r, l, t));
}

std::int64_t memory_budget(const PlanRequest& r) {
  return std::int64_t(double(r.cluster.gpu_memory) * (1.0 - r.margin));
}

Plan evaluate(const RunConfig& config, const Cluster& cluster) {
  Plan p;
  p.config = config;
  p.memory = estimate::estimate_memory(config);
  p.time = step_time(config, cluster, p.memory);
  p.model_tflops_per_gpu = model_flops_per_step(config) / p.time.total() / double(cluster.gpus) / 1e12;
  return p;
}

SearchResult search(const PlanRequest& r, const std::function<void(std::int64_t, std::int64_t)>& progress) {
  validate(r.cluster);
  if (r.base.training.global_batch <= 0) throw InvalidArgument("plan: --global-batch must be positive");
  if (!(r.margin >= 0 && r.margin < 1))
    throw InvalidArgument(fmt::format("plan: --margin must be in [0, 1), got {}", r.margin));
  if (r.top <= 0) throw InvalidArgument("plan: --top must be positive");
  estimate::validate(r.base.model);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Layout> all = layouts(r);
  const std::vector<Techniques> sets = technique_sets(r.space, r.base.training.flash_attention);
  SearchResult result;
  result.stats.layouts = std::int64_t(all.size());
  for (const Layout& l : all)
    for (const Techniques& t : sets) result.stats.candidates += tried(l, t) ? 1 : 0;
  const std::int64_t budget = memory_budget(r);
  const int threads = std::max(1, std::min<int>(r.threads, 64));
  std::atomic<std::size_t> next{0};
  std::atomic<std::int64_t> done{0}, done_candidates{0};  // layouts, and candidates among them
  std::vector<std::vector<Plan>> best(threads);
  std::vector<std::int64_t> evaluations(threads), fitting(threads);
  auto work = [&](int id) {
    Evaluator ev{r, budget};
    auto& mine = best[id];
    for (std::size_t i = next++; i < all.size(); i = next++) {
      // Each layout enters the ranking once, with its best technique set.
      std::optional<Plan> layout_best;
      std::int64_t candidates = 0;
      for (const Techniques& t : sets) {
        if (!tried(all[i], t)) continue;
        ++candidates;
        RunConfig c = configure(r, all[i], t);
        StageMemory m;
        bool ok = false;
        try {
          ok = ev.fit(c, t, m);
        } catch (const InvalidArgument&) {
          ok = false;  // a layout the model refuses (e.g. SP and a sequence TP does not divide)
        }
        if (!ok) continue;
        ++fitting[id];
        Plan p;
        p.config = std::move(c);
        p.memory = m;
        p.time = step_time(p.config, r.cluster, m);
        if (!layout_best || faster(p, *layout_best)) layout_best = std::move(p);
      }
      if (layout_best && (std::int64_t(mine.size()) < r.top || faster(*layout_best, mine.back()))) {
        mine.insert(std::upper_bound(mine.begin(), mine.end(), *layout_best, faster), std::move(*layout_best));
        if (std::int64_t(mine.size()) > r.top) mine.pop_back();
      }
      const std::int64_t so_far = done_candidates.fetch_add(candidates) + candidates;
      const std::int64_t d = done.fetch_add(1) + 1;
      // The last layout's thread reports every candidate: each thread adds its candidates before its layout.
      if (progress && d == std::int64_t(all.size())) progress(done_candidates.load(), result.stats.candidates);
      else if (progress && d % 256 == 0) progress(so_far, result.stats.candidates);
    }
    evaluations[id] = ev.evaluations;
  };
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(work, i);
  work(0);
  for (auto& th : pool) th.join();
  for (int i = 0; i < threads; ++i) {
    result.stats.evaluations += evaluations[i];
    result.stats.fitting += fitting[i];
    for (auto& p : best[i]) result.plans.push_back(std::move(p));
  }
  std::stable_sort(result.plans.begin(), result.plans.end(), faster);
  if (std::int64_t(result.plans.size()) > r.top) result.plans.resize(std::size_t(r.top));
  for (auto& p : result.plans)
    p.model_tflops_per_gpu = model_flops_per_step(p.config) / p.time.total() / double(r.cluster.gpus) / 1e12;
  result.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace stowage::plan
