#include "tools/estimate/megatron_arg_rules.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "stowage/error.hpp"

namespace stowage::estimate {
namespace {

// Whether the line gives `name`, alone or as name=value.
bool given(const std::vector<std::string>& args, const std::string& name) {
  return std::any_of(args.begin(), args.end(),
                     [&](const std::string& a) { return a == name || a.rfind(name + "=", 0) == 0; });
}

// The value of `name` ("" when not given).
std::string value_of(const std::vector<std::string>& args, const std::string& name) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i].rfind(name + "=", 0) == 0) return args[i].substr(name.size() + 1);
    if (args[i] == name && i + 1 < args.size()) return args[i + 1];
  }
  return "";
}

void refuse(const std::string& what) {
  throw InvalidArgument("megatron-args: " + what + " (Megatron-LM refuses it too)");
}

}  // namespace

void check_megatron_rules(const std::vector<std::string>& args, std::int64_t tp) {
  // Megatron-FSDP (v1, the default) turns the distributed optimizer on; so does dist_muon's layout.
  const bool fsdp = given(args, "--use-megatron-fsdp");
  const bool distributed =
      given(args, "--use-distributed-optimizer") || fsdp || value_of(args, "--optimizer") == "dist_muon";
  if (given(args, "--optimizer-cpu-offload") && !given(args, "--use-precision-aware-optimizer"))
    refuse(
        "--optimizer-cpu-offload needs --use-precision-aware-optimizer (the hybrid device optimizer runs "
        "through its code path)");
  if (given(args, "--use-precision-aware-optimizer") && !distributed &&
      value_of(args, "--megatron-fsdp-version") != "2")
    refuse("--use-precision-aware-optimizer needs --use-distributed-optimizer");
  if (given(args, "--overlap-param-gather")) {
    if (!distributed) refuse("--overlap-param-gather needs --use-distributed-optimizer, Megatron-FSDP or dist_muon");
    if (!given(args, "--overlap-grad-reduce")) refuse("--overlap-param-gather needs --overlap-grad-reduce");
  }
  // Sequence parallelism is turned off at TP 1, before this check.
  if (given(args, "--tp-comm-overlap") && !(given(args, "--sequence-parallel") && tp > 1))
    refuse(fmt::format("--tp-comm-overlap needs --sequence-parallel with TP > 1 (TP is {})", tp));
}

}  // namespace stowage::estimate
