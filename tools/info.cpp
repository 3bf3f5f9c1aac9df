// `stowage info`: what this build can do and which devices the process would use — the
// devices with their memory and NUMA locality, whether CUDA was found (and why not), and the
// build's features and dependency versions.
#include <dlpack/dlpack.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include <nlohmann/json.hpp>

#include <cstdio>

#include "stowage/byte_size.hpp"
#include "stowage/config.hpp"
#include "stowage/cuda_device.hpp"
#include "stowage/device.hpp"
#include "stowage/runtime.hpp"
#include "stowage/simd_level.hpp"
#include "stowage/topology.hpp"
#include "stowage_build_info.hpp"
#include "tools/command.hpp"

namespace stowage::tools {
namespace {

#ifdef STOWAGE_HAVE_CUDA
constexpr bool kCudaBuilt = true;
#else
constexpr bool kCudaBuilt = false;
#endif

nlohmann::ordered_json build_facts() {
  nlohmann::ordered_json deps = {
      {"hwloc", STOWAGE_HWLOC_VERSION},
      {"libnuma", STOWAGE_NUMA_VERSION},
      {"jemalloc", STOWAGE_JEMALLOC_VERSION},
      {"fmt", STOWAGE_FMT_VERSION},
      {"spdlog", STOWAGE_SPDLOG_VERSION},
      {"nlohmann_json",
       fmt::format("{}.{}.{}", NLOHMANN_JSON_VERSION_MAJOR, NLOHMANN_JSON_VERSION_MINOR, NLOHMANN_JSON_VERSION_PATCH)},
      {"CLI11", CLI11_VERSION},
#ifdef DLPACK_MAJOR_VERSION
      {"dlpack", fmt::format("{}.{}", DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION)},
#else
      {"dlpack", fmt::format("0.{}", DLPACK_VERSION / 10)},  // DLPACK_VERSION 60 is 0.6
#endif
  };
  nlohmann::ordered_json cuda = {{"enabled", kCudaBuilt}};
  if (kCudaBuilt) {
    cuda["compiler"] = STOWAGE_CUDA_COMPILER_VERSION;
    cuda["architectures"] = STOWAGE_CUDA_ARCHITECTURES;
  }
  return {{"version", STOWAGE_VERSION_STRING},
          {"build_type", STOWAGE_BUILD_TYPE},
          {"compiler", STOWAGE_CXX_COMPILER},
          {"sanitizers", STOWAGE_SANITIZE},
          {"cuda_backend", cuda},
          {"dependencies", deps}};
}

nlohmann::ordered_json device_facts(Device& d) {
  const DeviceProperties& p = d.properties();
  return {{"ordinal", p.ordinal},
          {"kind", to_string(p.kind)},
          {"name", p.name},
          {"capacity_bytes", p.capacity},
          {"free_bytes", d.free_memory()},
          {"virtual_memory", p.virtual_memory},
          {"granularity_bytes", p.granularity},
          {"host_numa_memory", p.host_numa_memory},
          {"host_accessible", p.host_accessible},
          {"pci_bus_id", p.pci_bus_id},
          {"numa_nodes", p.numa_nodes}};
}

nlohmann::ordered_json collect() {
  nlohmann::ordered_json cuda = {{"devices", cuda_device_count()}};
  if (cuda_device_count() == 0) cuda["reason"] = cuda_unavailable_reason();
  nlohmann::ordered_json j = {{"schema", "stowage.info/1"},
                              {"build", build_facts()},
                              {"cuda", cuda},
                              {"host",
                               {{"numa_nodes", numa_node_count()},
                                {"cpu_kernels", to_string(simd_level())},
                                {"cpu_kernels_detected", to_string(detected_simd_level())}}},
                              {"device_selection", config().device}};
  // A device that cannot be opened (STOWAGE_DEVICE=cuda without a GPU, a failing driver) is
  // reported with everything else rather than hiding the build facts.
  nlohmann::ordered_json devices = nlohmann::ordered_json::array();
  try {
    for (int i = 0; i < device_count(); ++i) devices.push_back(device_facts(device(i)));
    j["using_cuda"] = using_cuda();
  } catch (const ParseError&) {
    throw;
  } catch (const Error& e) {
    j["devices_error"] = e.what();
  }
  j["devices"] = devices;
  return j;
}

std::string yes_no(bool b) { return b ? "yes" : "no"; }

void print_text(const nlohmann::ordered_json& j) {
  const auto& b = j["build"];
  fmt::print("stowage {} ({}, {})\n", b["version"].get<std::string>(), b["build_type"].get<std::string>(),
             b["compiler"].get<std::string>());
  if (!b["sanitizers"].get<std::string>().empty()) fmt::print("  sanitizers: {}\n", b["sanitizers"].get<std::string>());
  const auto& cb = b["cuda_backend"];
  if (cb["enabled"].get<bool>())
    fmt::print("  CUDA backend: built (nvcc {}, architectures {})\n", cb["compiler"].get<std::string>(),
               cb["architectures"].get<std::string>());
  else fmt::print("  CUDA backend: not built\n");
  std::string deps;
  for (const auto& [name, version] : b["dependencies"].items())
    deps += fmt::format("{}{} {}", deps.empty() ? "" : ", ", name, version.get<std::string>());
  fmt::print("  dependencies: {}\n", deps);

  const auto& cuda = j["cuda"];
  if (cuda["devices"].get<int>() > 0) fmt::print("CUDA: {} device(s)\n", cuda["devices"].get<int>());
  else fmt::print("CUDA: no GPU: {}\n", cuda["reason"].get<std::string>());
  fmt::print("host: {} NUMA node(s); CPU kernels: {} (the CPU has {}; STOWAGE_SIMD lowers it)\n",
             j["host"]["numa_nodes"].get<int>(), j["host"]["cpu_kernels"].get<std::string>(),
             j["host"]["cpu_kernels_detected"].get<std::string>());
  if (j.contains("devices_error")) {
    fmt::print("devices (selection {}): none opened: {}\n", j["device_selection"].get<std::string>(),
               j["devices_error"].get<std::string>());
    return;
  }
  fmt::print("devices ({}, selection {}):\n", j["using_cuda"].get<bool>() ? "cuda" : "emulated",
             j["device_selection"].get<std::string>());
  for (const auto& d : j["devices"]) {
    fmt::print("  device {}: {}, {} backend\n", d["ordinal"].get<int>(), d["name"].get<std::string>(),
               d["kind"].get<std::string>());
    fmt::print("      memory: {} total, {} free\n", format_bytes(d["capacity_bytes"].get<std::int64_t>()),
               format_bytes(d["free_bytes"].get<std::int64_t>()));
    if (d["virtual_memory"].get<bool>())
      fmt::print("      virtual memory: yes, granularity {}; host-NUMA chunks: {}\n",
                 format_bytes(d["granularity_bytes"].get<std::int64_t>()), yes_no(d["host_numa_memory"].get<bool>()));
    else fmt::print("      virtual memory: no\n");
    const auto nodes = d["numa_nodes"].get<std::vector<int>>();
    fmt::print("      nearest NUMA node(s): {}{}\n",
               nodes.empty() ? "unknown" : fmt::format("{}", fmt::join(nodes, ",")),
               d["pci_bus_id"].get<std::string>().empty() ? "" : ", PCI " + d["pci_bus_id"].get<std::string>());
  }
}

void setup(CLI::App& app, int& exit_code) {
  auto* cmd =
      app.add_subcommand("info", "Show the devices found, their memory and NUMA locality, and the build's features");
  auto json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "Print the same facts as JSON");
  cmd->callback([json, &exit_code] {
    const nlohmann::ordered_json facts = collect();
    if (*json) fmt::print("{}\n", facts.dump(2));
    else print_text(facts);
    exit_code = facts.contains("devices_error") ? 1 : 0;
  });
}

STOWAGE_COMMAND(10, setup);

}  // namespace
}  // namespace stowage::tools
