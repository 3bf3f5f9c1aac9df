// The plan's time model against published training throughput (tests/data/
// plan_published_throughput.json, each case with its source): the modelled step time of the
// published configuration, the ratio to the published step time, and what the search ranks first
// for the same model, cluster and batch. docs/plan.md reports the table this test prints.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tools/estimate/megatron_args.hpp"
#include "tools/plan/search.hpp"

using namespace stowage;
using namespace stowage::plan;

namespace {

struct Row {
  std::string name;
  double published = 0, modelled = 0, best = 0;
  bool published_fits = false;
  std::string best_layout;
};

Cluster cluster_of(const nlohmann::json& j, double efficiency) {
  Cluster c;
  c.gpus = j.at("gpus");
  c.gpus_per_node = j.at("gpus_per_node");
  c.peak_tflops = j.at("peak_tflops");
  c.intra_node_gbps = j.at("intra_node_gbps");
  c.inter_node_gbps = j.at("inter_node_gbps");
  c.efficiency = efficiency;
  return c;
}

std::vector<Row> evaluate_all(double efficiency, bool search_too) {
  std::ifstream in(std::string(STOWAGE_SOURCE_DIR) + "/tests/data/plan_published_throughput.json");
  const auto cases = nlohmann::json::parse(in);
  std::vector<Row> rows;
  for (const auto& j : cases) {
    Row r;
    r.name = j.at("name");
    r.published = j.at("published_step_seconds");
    estimate::RunConfig c;
    estimate::apply_megatron_args(j.at("megatron_args").get<std::string>(), c);
    const Cluster cl = cluster_of(j, efficiency);
    c.parallel.dp = cl.gpus / (c.parallel.tp * c.parallel.pp * c.parallel.cp);
    estimate::finalize(c);
    const Plan p = evaluate(c, cl);
    r.modelled = p.time.total();
    r.published_fits = p.memory.peak_reserved <= std::int64_t(double(cl.gpu_memory) * 0.95);
    if (search_too) {
      PlanRequest req;
      req.base = c;
      req.cluster = cl;
      req.top = 1;
      req.space.techniques = false;  // what Megatron-LM alone can run, as the published runs did
      const SearchResult s = search(req);
      if (!s.plans.empty()) {
        r.best = s.plans[0].time.total();
        const auto& b = s.plans[0].config;
        r.best_layout = "TP" + std::to_string(b.parallel.tp) + " PP" + std::to_string(b.parallel.pp) + "x" +
                        std::to_string(b.parallel.vpp) + " CP" + std::to_string(b.parallel.cp) + " mb" +
                        std::to_string(b.training.micro_batch) +
                        (b.parallel.zero_stage == 3   ? " FSDP"
                         : b.parallel.zero_stage == 1 ? " DistOpt"
                                                      : "") +
                        (b.recompute.granularity == estimate::Recompute::none
                             ? ""
                             : std::string(" ") + estimate::to_string(b.recompute.granularity) + "-recompute");
      }
    }
    rows.push_back(r);
  }
  return rows;
}

}  // namespace

TEST(PlanPublished, TimeModelAgainstPublishedThroughput) {
  const auto rows = evaluate_all(Cluster{}.efficiency, true);
  ASSERT_EQ(rows.size(), 10u);
  std::vector<double> ratios;
  for (const auto& r : rows) {
    std::printf("%-78s published %7.2f s modelled %7.2f s ratio %.2f%s | search #1 %7.2f s %s\n", r.name.c_str(),
                r.published, r.modelled, r.modelled / r.published,
                r.published_fits ? "" : " (does not fit the estimate)", r.best, r.best_layout.c_str());
    ratios.push_back(r.modelled / r.published);
    // The search ranks by the same model, so its first plan is never slower than the published
    // layout when that layout fits.
    if (r.published_fits) EXPECT_LE(r.best, r.modelled * (1 + 1e-9)) << r.name;
  }
  std::sort(ratios.begin(), ratios.end());
  std::printf("modelled/published: min %.2f median %.2f max %.2f\n", ratios.front(), ratios[ratios.size() / 2],
              ratios.back());
  // docs/plan.md: at the default efficiency the model is within 0.5x..1.4x of every published
  // step time (median 0.8x: it is optimistic, most for FP8 runs measured against the FP8 peak).
  EXPECT_GE(ratios.front(), 0.5);
  EXPECT_LE(ratios.back(), 1.4);
}
