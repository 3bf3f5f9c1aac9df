// Runs the built `stowage info` and checks what it reports: the emulated devices it was told to
// use, their memory, why CUDA is not in use, and the build's features.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "stowage/cuda_device.hpp"
#include "stowage/device.hpp"
#include "stowage/simd_level.hpp"
#include "tools_cli_test_util.hpp"

namespace {

using stowage::testing::CommandResult;
using stowage::testing::run_cli;

constexpr const char* kTwoEmulated =
    "STOWAGE_DEVICE=emulated STOWAGE_EMULATED_DEVICES=2 STOWAGE_EMULATED_CAPACITY=1GiB STOWAGE_LOG_LEVEL=off";

// A misspelt variable used to be ignored without a word; stowage says so once, logging off or not.
TEST(ToolsInfo, AMisspeltVariableIsNamedOnce) {
  const CommandResult r = run_cli("info", std::string(kTwoEmulated) + " STOWAGE_EMULATED_CAPACTY=2GiB");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string warning =
      "stowage: STOWAGE_EMULATED_CAPACTY is not a stowage variable (did you mean "
      "STOWAGE_EMULATED_CAPACITY?); it is ignored";
  const auto at = r.output.find(warning);
  ASSERT_NE(at, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(warning, at + 1), std::string::npos) << "said twice:\n" << r.output;
  EXPECT_NE(r.output.find("1.00 GiB total"), std::string::npos) << r.output;  // the real one still holds
}

TEST(ToolsInfo, TextNamesTheEmulatedDevicesAndWhyNotCuda) {
  const CommandResult r = run_cli("info", kTwoEmulated);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("device 0: emulated 0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("device 1: emulated 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("1.00 GiB total"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("granularity 2.00 MiB"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("nearest NUMA node(s): "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dependencies: hwloc "), std::string::npos) << r.output;
  if (stowage::cuda_device_count() == 0)
    EXPECT_NE(r.output.find("CUDA: no GPU: " + stowage::cuda_unavailable_reason()), std::string::npos) << r.output;
#ifdef STOWAGE_HAVE_CUDA
  EXPECT_NE(r.output.find("CUDA backend: built"), std::string::npos) << r.output;
#else
  EXPECT_NE(r.output.find("CUDA backend: not built"), std::string::npos) << r.output;
#endif
}

// The CPU kernels' instruction-set level, and STOWAGE_SIMD's refusal said even with the log off.
TEST(ToolsInfo, NamesTheCpuKernelsLevelAndABadStowageSimd) {
  const std::string best = stowage::to_string(stowage::detected_simd_level());
  const CommandResult r = run_cli("info", std::string(kTwoEmulated) + " STOWAGE_SIMD=scalar");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("CPU kernels: scalar (the CPU has " + best + ";"), std::string::npos) << r.output;
  const CommandResult bad =
      run_cli("info --json", std::string(kTwoEmulated) + " STOWAGE_LOG_LEVEL=off STOWAGE_SIMD=avx3");
  ASSERT_EQ(bad.exit_code, 0) << bad.output;
  EXPECT_NE(bad.output.find("stowage: STOWAGE_SIMD=avx3 is not scalar, avx2 or avx512; using " + best),
            std::string::npos)
      << bad.output;
  const auto j = nlohmann::json::parse(bad.output.substr(bad.output.find('{')));
  EXPECT_EQ(j["host"]["cpu_kernels"], best);
  EXPECT_EQ(j["host"]["cpu_kernels_detected"], best);
}

TEST(ToolsCli, VersionPrintsTheProjectVersion) {
  const CommandResult r = run_cli("--version", kTwoEmulated);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(run_cli("info --json", kTwoEmulated).output);
  EXPECT_EQ(r.output, "stowage " + j["build"]["version"].get<std::string>() + "\n");
}

TEST(ToolsCli, AnUnknownSubcommandIsNamedWithTheClosestOne) {
  CommandResult r = run_cli("inspct snap.json", kTwoEmulated);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output,
            "stowage: unknown subcommand 'inspct' (did you mean inspect?); the subcommands are info, estimate, plan, "
            "inspect, demo (stowage --help)\n");
  r = run_cli("frobnicate", kTwoEmulated);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output.find("did you mean"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("unknown subcommand 'frobnicate'"), std::string::npos) << r.output;
}

// The options of `stowage SUB --help`: each entry's first line and its continuation lines.
std::vector<std::string> help_entries(const std::string& help) {
  std::vector<std::string> entries;
  std::istringstream lines(help);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("  --", 0) == 0) entries.push_back(line);
    else if (!entries.empty() && line.rfind("        ", 0) == 0) entries.back() += line;
  }
  return entries;
}

TEST(ToolsCli, HelpShowsEveryDefault) {
  // Every option that takes a value shows what holds when it is not given ("=value" from CLI11,
  // or "default" in its description), except those that name an input or output file or text.
  const std::vector<std::string> without_default = {"--model-json", "--megatron-args", "--deepspeed-config",
                                                    "--svg",        "--fit ",          "--compare",
                                                    "--configs",    "--to-memory-viz"};
  for (const char* sub : {"estimate", "plan", "inspect", "demo"}) {
    const CommandResult r = run_cli(std::string(sub) + " --help", kTwoEmulated);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    int checked = 0;
    for (const std::string& e : help_entries(r.output)) {
      const bool takes_value = e.find(" INT") != std::string::npos || e.find(" TEXT") != std::string::npos ||
                               e.find(" FLOAT") != std::string::npos || e.find(" UINT") != std::string::npos;
      if (!takes_value) continue;
      bool exempt = false;
      for (const auto& name : without_default) exempt = exempt || e.find("  " + name) == 0;
      if (exempt) continue;
      ++checked;
      EXPECT_TRUE(e.find('=') != std::string::npos || e.find("default") != std::string::npos ||
                  e.find("required") != std::string::npos)
          << sub << ": " << e;
    }
    EXPECT_GT(checked, 0) << sub;
  }
  const CommandResult demo = run_cli("demo --help", kTwoEmulated);
  for (const char* shown : {"--layers INT=4", "--steps INT=60", "--rounding TEXT=nearest_even"})
    EXPECT_NE(demo.output.find(shown), std::string::npos) << shown << "\n" << demo.output;
}

TEST(ToolsInfo, JsonCarriesTheSameFacts) {
  const CommandResult r = run_cli("info --json", kTwoEmulated);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["schema"], "stowage.info/1");
  EXPECT_FALSE(j["using_cuda"].get<bool>());
  EXPECT_EQ(j["device_selection"], "emulated");
  ASSERT_EQ(j["devices"].size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const auto& d = j["devices"][i];
    EXPECT_EQ(d["ordinal"], i);
    EXPECT_EQ(d["kind"], "emulated");
    EXPECT_EQ(d["capacity_bytes"], std::uint64_t{1} << 30);
    EXPECT_EQ(d["free_bytes"], std::uint64_t{1} << 30);
    EXPECT_EQ(d["granularity_bytes"], std::uint64_t{2} << 20);
    EXPECT_TRUE(d["virtual_memory"].get<bool>());
    EXPECT_FALSE(d["numa_nodes"].empty());
  }
  EXPECT_EQ(j["cuda"]["devices"], stowage::cuda_device_count());
  if (stowage::cuda_device_count() == 0) EXPECT_EQ(j["cuda"]["reason"], stowage::cuda_unavailable_reason());
#ifdef STOWAGE_HAVE_CUDA
  EXPECT_TRUE(j["build"]["cuda_backend"]["enabled"].get<bool>());
#else
  EXPECT_FALSE(j["build"]["cuda_backend"]["enabled"].get<bool>());
#endif
  EXPECT_GE(j["host"]["numa_nodes"].get<int>(), 1);
  for (const char* dep : {"hwloc", "libnuma", "jemalloc", "fmt", "spdlog", "nlohmann_json", "CLI11", "dlpack"})
    EXPECT_FALSE(j["build"]["dependencies"][dep].get<std::string>().empty()) << dep;
}

TEST(ToolsInfo, UnusableDeviceChoiceIsReportedWithTheBuildFacts) {
  if (stowage::cuda_device_count() > 0) GTEST_SKIP() << "a GPU is usable here: STOWAGE_DEVICE=cuda works";
  const CommandResult r = run_cli("info", "STOWAGE_DEVICE=cuda STOWAGE_LOG_LEVEL=off");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("none opened: STOWAGE_DEVICE=cuda"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(stowage::cuda_unavailable_reason()), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dependencies: hwloc "), std::string::npos) << r.output;
}

TEST(ToolsInfo, MalformedConfigurationIsAClearError) {
  const CommandResult r = run_cli("info", "STOWAGE_DEVICE=quantum");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("STOWAGE_DEVICE"), std::string::npos) << r.output;
}

}  // namespace
