// The estimate against measured per-GPU peaks: every dense GPT training case of Megatron-LM's
// functional tests that records torch.cuda.memory_stats()["allocated_bytes.all.peak"] on H100
// (tests/data/estimate_measured_peaks.json, each case with its source file and commit). The
// test prints the error of every case, and holds the cases docs/estimate.md claims within ±5 %
// (field "claim": "within_5pct") and the error distribution it reports.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "stowage/error.hpp"
#include "tools/estimate/megatron_args.hpp"
#include "tools/estimate/memory_model.hpp"

using namespace stowage::estimate;

namespace {

struct Case {
  std::string name;
  double measured = 0, predicted = 0;
  bool claimed = false;
  std::string refused;  // the model's error when it cannot represent the configuration
  std::vector<std::string> warnings;
  double error() const { return (predicted - measured) / measured; }
};

std::vector<Case> evaluate_all() {
  std::ifstream in(std::string(STOWAGE_SOURCE_DIR) + "/tests/data/estimate_measured_peaks.json");
  EXPECT_TRUE(in) << "tests/data/estimate_measured_peaks.json";
  const auto cases = nlohmann::json::parse(in);
  std::vector<Case> out;
  for (const auto& j : cases) {
    Case k;
    k.name = j.at("case").get<std::string>();
    k.measured = j.at("measured_peak_allocated").get<double>();
    k.claimed = j.value("claim", "") == "within_5pct";
    RunConfig c;
    // Every argument of the real launch lines must be known to the parser.
    apply_megatron_args(j.at("megatron_args").get<std::string>(), c, UnknownArguments::error);
    const std::int64_t gpus = j.at("gpus").get<std::int64_t>();
    const auto& p = c.parallel;
    EXPECT_EQ(gpus % (p.tp * p.pp * p.cp), 0) << k.name;
    c.parallel.dp = gpus / (p.tp * p.pp * p.cp);
    // Megatron logs memory on the last rank: the last pipeline stage.
    c.stage = c.parallel.pp - 1;
    k.warnings = c.warnings;
    try {
      finalize(c);
      k.predicted = double(estimate_memory(c).peak_allocated);
    } catch (const stowage::InvalidArgument& e) {
      k.refused = e.what();
    }
    out.push_back(std::move(k));
  }
  return out;
}

}  // namespace

TEST(EstimateMeasured, MegatronCiPeaksOnH100) {
  const std::vector<Case> cases = evaluate_all();
  ASSERT_EQ(cases.size(), 61u);
  std::vector<double> abs_errors;
  int within = 0, claimed = 0, modelled = 0;
  int refused = 0;
  for (const auto& k : cases) {
    if (!k.refused.empty()) {
      std::printf("%-72s measured %8.0f MiB not representable: %s\n", k.name.c_str(), k.measured / 1048576.0,
                  k.refused.c_str());
      EXPECT_FALSE(k.claimed) << k.name;
      ++refused;
      continue;
    }
    std::printf("%-72s measured %8.0f MiB predicted %8.0f MiB error %+6.1f %%%s\n", k.name.c_str(),
                k.measured / 1048576.0, k.predicted / 1048576.0, 100.0 * k.error(),
                k.warnings.empty() ? "" : "  (unmodelled arguments)");
    abs_errors.push_back(std::abs(k.error()));
    if (std::abs(k.error()) <= 0.05) ++within;
    if (k.warnings.empty()) ++modelled;
    if (k.claimed) {
      ++claimed;
      EXPECT_LE(std::abs(k.error()), 0.05) << k.name << " is claimed within ±5 %";
    }
  }
  // docs/estimate.md: 59 of the 61 cases within ±5 % (97 %), median |error| under 1 %.
  EXPECT_EQ(claimed, 59);
  EXPECT_GE(within, claimed);
  std::sort(abs_errors.begin(), abs_errors.end());
  const double median = abs_errors[abs_errors.size() / 2];
  std::printf("not representable: %d\n", refused);
  std::printf(
      "within ±5 %%: %d of %zu (claimed %d); modelled without warnings: %d; median |error| %.2f %%; "
      "90th percentile %.2f %%; max %.2f %%\n",
      within, cases.size(), claimed, modelled, 100 * median, 100 * abs_errors[abs_errors.size() * 9 / 10],
      100 * abs_errors.back());
  EXPECT_LE(median, 0.01);
  EXPECT_EQ(refused, 0);
}
