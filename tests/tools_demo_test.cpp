// A short `stowage demo` run: the loss trajectories that must match the baseline bit for bit
// do, and each technique lowers the measured peak of allocated device bytes by at least the
// first-principles prediction (tools/demo/savings.hpp) less a stated tolerance.
#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include <sys/wait.h>
#include <nlohmann/json.hpp>

#include "stowage/device.hpp"
#include "stowage/emulated_device.hpp"
#include "tools/demo/configurations.hpp"
#include "tools/demo/estimate_bridge.hpp"
#include "tools/demo/fit_check.hpp"
#include "tools/demo/report.hpp"
#include "tools/demo/run.hpp"
#include "tools/demo/savings.hpp"
#include "tools_cli_test_util.hpp"

namespace stowage::demo {
namespace {

using testing::CommandResult;
using testing::run_cli;

DemoOptions tiny_options(Device& dev, const std::string& configs, Rounding rounding = Rounding::nearest_even) {
  DemoOptions o;
  o.shape.layers = 3;
  o.shape.hidden = 32;
  o.shape.heads = 2;
  o.shape.seq = 16;
  o.shape.batch = 2;
  o.steps = 6;
  o.corpus_bytes = 4096;
  o.rounding = rounding;
  o.configs = select_configurations(configs);
  o.device = &dev;
  return o;
}

std::string all_config_names() {
  std::string names;
  for (const auto& c : all_configurations()) names += (names.empty() ? "" : ",") + c.name;
  return names;
}

class DemoRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    device_ = make_emulated_device(0, EmulatedOptions{.capacity = std::size_t{256} << 20}).release();
    options_ = new DemoOptions(tiny_options(*device_, all_config_names()));
    results_ = new std::vector<ConfigResult>(run_demo(*options_));
  }
  static void TearDownTestSuite() {
    delete results_;
    delete options_;
    delete device_;
  }
  static const ConfigResult& result(const std::string& name) {
    for (const auto& r : *results_)
      if (r.name == name) return r;
    throw std::runtime_error("no result for " + name);
  }
  static Device* device_;
  static DemoOptions* options_;
  static std::vector<ConfigResult>* results_;
};
Device* DemoRun::device_ = nullptr;
DemoOptions* DemoRun::options_ = nullptr;
std::vector<ConfigResult>* DemoRun::results_ = nullptr;

TEST_F(DemoRun, BaselineLearns) {
  const auto& base = result("baseline");
  ASSERT_EQ(base.losses.size(), 6u);
  // Character-level loss starts near ln(vocab) and falls within a few AdamW steps.
  EXPECT_GT(base.losses.front(), base.losses.back());
  EXPECT_GT(base.peak_allocated, 0);
  EXPECT_GE(base.peak_reserved, base.peak_allocated);
}

TEST_F(DemoRun, EveryConfigurationGivesBackAllItsDeviceMemory) {
  for (const auto& r : *results_) EXPECT_EQ(r.left_allocated, 0) << r.name;
}

TEST_F(DemoRun, EveryConfigurationIsBitIdenticalToTheBaseline) {
  const auto& base = result("baseline");
  for (const auto& r : *results_) {
    SCOPED_TRACE(r.name);
    ASSERT_EQ(r.losses.size(), base.losses.size());
    for (std::size_t i = 0; i < r.losses.size(); ++i)
      EXPECT_EQ(std::bit_cast<std::uint32_t>(r.losses[i]), std::bit_cast<std::uint32_t>(base.losses[i]))
          << "step " << i + 1;
    EXPECT_TRUE(r.compared);
    EXPECT_TRUE(r.bit_identical);
    // The weights the run ends with, not only the losses: the fp32 masters hash alike.
    EXPECT_EQ(r.master_hash, base.master_hash);
  }
}

// Tolerance (allocated bytes only): the allocator rounds each block up to its size class (512 B in the small pool), so
// a saving measured through it may fall short of the exact byte count by up to one rounding
// step per block the technique adds or removes, bounded here by kTolerancePerBlock × blocks.
constexpr std::int64_t kTolerancePerBlock = 512;

TEST_F(DemoRun, EachTechniqueLowersThePeakByAtLeastThePrediction) {
  const auto& base = result("baseline");
  for (const auto& r : *results_) {
    if (r.name == "baseline") continue;
    SCOPED_TRACE(r.name);
    const Saving predicted = predicted_saving(r.techniques, *options_, r.params);
    const std::int64_t measured = base.peak_allocated - r.peak_allocated;
    EXPECT_GT(predicted.bytes, 0);
    EXPECT_GE(measured, predicted.bytes - kTolerancePerBlock * predicted.blocks)
        << "measured " << measured << " B, predicted " << predicted.bytes << " B (" << predicted.formula << ")";
    // Bytes as asked (before rounding to block sizes): no tolerance at all.
    EXPECT_GE(base.peak_requested - r.peak_requested, predicted.bytes) << predicted.formula;
  }
}

// The same check against `stowage estimate`'s memory model for the demo's shape. Its bf16
// activations make it a lower bound for recompute and swap; for optimizer offload it counts
// 12 B/param (fp32 master too) where OffloadedAdam offloads m and v, so only 8/12 of it applies.
TEST_F(DemoRun, EachTechniqueLowersThePeakByAtLeastTheEstimate) {
  const auto& base = result("baseline");
  ModelShape shape = options_->shape;
  shape.vocab = base.vocab;
  for (const auto& r : *results_) {
    if (r.name == "baseline") continue;
    SCOPED_TRACE(r.name);
    std::int64_t estimate = estimated_saving(r.techniques, shape, options_->rounding);
    if (r.techniques.offload_optimizer) {
      const Techniques without_offload{r.techniques.shared_storage, r.techniques.recompute, r.techniques.swap_attention,
                                       false};
      const std::int64_t rest = estimated_saving(without_offload, shape, options_->rounding);
      estimate = rest + (estimate - rest) * 8 / 12;
    }
    EXPECT_GT(estimate, 0);
    EXPECT_GE(base.peak_allocated - r.peak_allocated, estimate - kTolerancePerBlock * 8) << "estimate " << estimate;
  }
}

TEST(DemoSharedStorage, SavesTwoBytesPerParameterLessTheTieBitmap) {
  auto dev = make_emulated_device(0, EmulatedOptions{.capacity = std::size_t{256} << 20});
  auto results = run_demo(tiny_options(*dev, "baseline,shared"));
  ASSERT_EQ(results.size(), 2u);
  const std::int64_t n = results[0].params;
  const std::int64_t exact =
      2 * n - static_cast<std::int64_t>(tie_bitmap_bytes(std::size_t(n), Rounding::nearest_even));
  const std::int64_t measured = results[0].peak_allocated - results[1].peak_allocated;
  // Two blocks differ (the bf16 copy goes, the tie bitmap comes): each rounded to 512 B.
  EXPECT_GE(measured, exact - 2 * kTolerancePerBlock);
  EXPECT_LE(measured, exact + 2 * kTolerancePerBlock);
  EXPECT_TRUE(results[1].bit_identical);
}

TEST(DemoSharedStorage, HalfUpRoundingRunsAndIsNotRequiredToMatch) {
  auto dev = make_emulated_device(0, EmulatedOptions{.capacity = std::size_t{256} << 20});
  auto results = run_demo(tiny_options(*dev, "baseline,shared", Rounding::half_up));
  ASSERT_EQ(results.size(), 2u);
  EXPECT_FALSE(results[1].must_match);
  // half_up has no tie bitmap: the full 2 B per parameter.
  EXPECT_GE(results[0].peak_allocated - results[1].peak_allocated, 2 * results[0].params - 2 * kTolerancePerBlock);
  for (float l : results[1].losses) EXPECT_TRUE(std::isfinite(l));
}

TEST(DemoReport, SvgIsWellFormedAndJsonCarriesEveryLoss) {
  auto dev = make_emulated_device(0, EmulatedOptions{.capacity = std::size_t{256} << 20});
  auto options = tiny_options(*dev, "baseline,shared");
  options.steps = 2;
  auto results = run_demo(options);
  options.shape.vocab = results[0].vocab;
  const std::string svg = to_svg(results, options);
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  // Every element opened is closed, in order (a minimal well-formedness check).
  std::vector<std::string> open;
  for (std::size_t i = svg.find('<', 1); i != std::string::npos; i = svg.find('<', i + 1)) {
    const std::size_t end = svg.find('>', i);
    ASSERT_NE(end, std::string::npos);
    std::string tag = svg.substr(i + 1, end - i - 1);
    if (tag[0] == '/') {
      ASSERT_FALSE(open.empty());
      EXPECT_EQ(open.back(), tag.substr(1));
      open.pop_back();
    } else if (tag.back() != '/') {
      open.push_back(tag.substr(0, tag.find(' ')));
    }
  }
  EXPECT_TRUE(open.empty());
  const auto j = nlohmann::json::parse(to_json(results, options));
  ASSERT_EQ(j["configs"].size(), 2u);
  EXPECT_EQ(j["configs"][1]["loss_bits"], j["configs"][0]["loss_bits"]);
  EXPECT_EQ(j["configs"][1]["bit_identical_to_baseline"], true);
}

constexpr const char* kQuietEmulated = "STOWAGE_LOG_LEVEL=off STOWAGE_DEVICE=emulated";

TEST(DemoFit, TheFloorCountsTheLayoutsParameters) {
  ModelShape s;
  s.layers = 3;
  s.hidden = 32;
  s.heads = 2;
  s.vocab = 50;
  std::int64_t exact = 0;
  for (const auto& p : make_layout(s).params) exact += p.numel();
  EXPECT_EQ(fit_floor(s).parameters, static_cast<double>(exact));
  EXPECT_EQ(fit_floor(s).device_bytes, 8.0 * exact + 4.0 * 3 * s.batch * s.seq * 32);
}

TEST(DemoFit, AModelThatCannotFitIsRefusedAtOnce) {
  // Each of these used to build its parameters on the host first (51 GB for the first) or never
  // finished; now each ends at once with the sizes.
  for (const char* args :
       {"--hidden 4096 --layers 64 --heads 32 --steps 1 --configs baseline",
        "--layers 2147483647 --steps 1 --configs baseline", "--batch 2147483647 --steps 1 --configs baseline",
        "--hidden 2147483647 --heads 1 --steps 1 --configs baseline"}) {
    const auto t0 = std::chrono::steady_clock::now();
    const CommandResult r = run_cli(std::string("demo ") + args, kQuietEmulated);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_TRUE(r.output.find("does not fit") != std::string::npos || r.output.find("too large") != std::string::npos)
        << args << "\n"
        << r.output;
    EXPECT_LT(seconds, 20.0) << args;  // a refusal, not a run (generous for loaded machines)
  }
  const CommandResult r =
      run_cli("demo --hidden 4096 --layers 64 --heads 32 --steps 1 --configs baseline", kQuietEmulated);
  EXPECT_NE(r.output.find("--layers 64 --hidden 4096 --heads 32"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("8.00 GiB"), std::string::npos) << r.output;  // the emulated device's default capacity
}

TEST(DemoCommand, ProgressLinesCarryAnEta) {
  const CommandResult r = run_cli(
      "demo --layers 1 --hidden 16 --heads 2 --seq 8 --batch 2 --steps 10 --configs baseline,shared "
      "2>&1 >/dev/null",
      kQuietEmulated);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::istringstream lines(r.output);
  std::string line;
  int with_eta = 0, finished = 0;
  while (std::getline(lines, line)) {
    if (line.find(" step ") == std::string::npos) continue;
    with_eta += line.find("ETA ") != std::string::npos;
    finished += line.find("done in ") != std::string::npos;
  }
  EXPECT_GE(with_eta, 10) << r.output;  // every step but the last (stderr is not a terminal: each is a line)
  EXPECT_EQ(finished, 1) << r.output;
}

// An --svg path that cannot be written is a bad flag: refused (2) with the path before anything
// trains, not found after every configuration has run (that exited 1).
TEST(DemoCommand, AnSvgPathThatCannotBeWrittenIsRefusedBeforeTraining) {
  for (const std::string& path : {std::string("/nonexistent/dir/peak.svg"), std::string(STOWAGE_BINARY_DIR)}) {
    const auto t0 = std::chrono::steady_clock::now();
    const CommandResult r = run_cli("demo --configs baseline --steps 1 --svg '" + path + "'", kQuietEmulated);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(r.exit_code, 2) << path << "\n" << r.output;
    EXPECT_NE(r.output.find("demo: --svg: cannot write '" + path + "'"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("training on"), std::string::npos) << r.output;  // nothing ran
    EXPECT_LT(seconds, 20.0) << path;
  }
  // The check leaves no file behind when the run then stops for another reason, and leaves an
  // existing file as it was.
  const std::string fresh = std::string(STOWAGE_BINARY_DIR) + "/tools_demo_test_never_written.svg";
  std::remove(fresh.c_str());
  const std::string too_big = "demo --hidden 4096 --layers 64 --heads 32 --steps 1 --configs baseline --svg ";
  CommandResult r = run_cli(too_big + fresh, kQuietEmulated);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_FALSE(std::ifstream(fresh).good()) << fresh;
  std::ofstream(fresh) << "kept";
  r = run_cli(too_big + fresh, kQuietEmulated);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  std::stringstream kept;
  kept << std::ifstream(fresh).rdbuf();
  EXPECT_EQ(kept.str(), "kept");
  std::remove(fresh.c_str());
}

TEST(DemoCommand, RunsFromTheCommandLineAndExitsZero) {
  const std::string svg = std::string(STOWAGE_BINARY_DIR) + "/tools_demo_test_chart.svg";
  const std::string cmd = std::string(STOWAGE_CLI) +
                          " demo --layers 2 --hidden 32 --heads 2 --seq 16 --batch 2 --steps 3 --json --svg " + svg;
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  EXPECT_EQ(pclose(p), 0);
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["schema"], "stowage.demo/1");
  EXPECT_EQ(j["configs"].size(), all_configurations().size());
  for (const auto& c : j["configs"]) EXPECT_EQ(c["bit_identical_to_baseline"], true) << c["name"];
  std::ifstream f(svg);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_NE(ss.str().find("</svg>"), std::string::npos);
  std::remove(svg.c_str());
}

}  // namespace
}  // namespace stowage::demo
