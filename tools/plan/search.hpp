#pragma once
// The strategy search: every TP × PP × virtual stages × CP × EP × ZeRO stage × micro-batch
// layout of a cluster, each with a set of memory techniques (recompute none/activation
// function/full, swap-attention, optimizer offload, shared storage). A plan fits when the
// estimator's peak reserved bytes, with a margin, fit the GPU and its host bytes fit the node;
// fitting plans are ranked by the modelled step time. Full recompute and swap-attention are
// chosen per layer: the search takes the fewest recomputed (or swapped) layers that fit.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tools/estimate/run_config.hpp"
#include "tools/plan/time_model.hpp"

namespace stowage::plan {

struct SearchSpace {
  bool techniques = true;    // stowage's techniques (swap, offload, shared storage, act-fn recompute)
  bool zero3 = true;         // FSDP (ZeRO-3) layouts
  std::int64_t max_vpp = 8;  // virtual stages per pipeline rank
  std::int64_t max_micro_batch = 16;
  std::int64_t max_cp = 16;
};

struct PlanRequest {
  estimate::RunConfig base;  // model, sequence length, global batch, precision, attention
  Cluster cluster;
  SearchSpace space;
  double margin = 0.05;  // fraction of GPU memory left free
  std::int64_t top = 5;
  int threads = 2;
};

struct Plan {
  estimate::RunConfig config;
  estimate::StageMemory memory;
  StepTime time;
  double model_tflops_per_gpu = 0;  // model FLOPs (no recompute) per second per GPU
};

struct SearchStats {
  std::int64_t layouts = 0;      // parallel layouts (TP, PP, VPP, CP, EP, ZeRO, micro-batch)
  std::int64_t candidates = 0;   // layouts × technique sets (offload at stage 0 only without DP)
  std::int64_t evaluations = 0;  // estimator calls, fine-grained choices included
  std::int64_t fitting = 0;
  double seconds = 0;
};

struct SearchResult {
  std::vector<Plan> plans;  // fastest first, at most request.top
  SearchStats stats;
};

// `progress(done, total)` is called from the searching threads every few thousand candidates.
// InvalidArgument for a request that cannot be searched (no global batch, bad cluster).
SearchResult search(const PlanRequest& request, const std::function<void(std::int64_t, std::int64_t)>& progress = {});

// The plan for one given configuration (its memory and time), or nullopt-like: fits == false.
Plan evaluate(const estimate::RunConfig& config, const Cluster& cluster);

// Every candidate the search considers (layouts × technique sets), before the per-layer choices:
// what a search that called the estimator once per candidate would evaluate (the benchmark's peer).
void for_each_candidate(const PlanRequest& request, const std::function<void(const estimate::RunConfig&)>& visit);

// The largest peak reserved bytes a plan may have on this cluster.
std::int64_t memory_budget(const PlanRequest& request);

}  // namespace stowage::plan
