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

void check_megatron_rules(const std::vector<std::string>& args, Parallelism& p) {
  if (given(args, "--optimizer-cpu-offload") && !given(args, "--use-precision-aware-optimizer"))
    refuse(
        "--optimizer-cpu-offload needs --use-precision-aware-optimizer (the hybrid device optimizer runs "
        "through its code path)");
  if (given(args, "--overlap-param-gather") && !given(args, "--overlap-grad-reduce"))
    refuse("--overlap-param-gather needs --overlap-grad-reduce");
  // Checked by validate(), after the command line's options.
  p.tp_comm_overlap = given(args, "--tp-comm-overlap");
  p.precision_aware_optimizer =
      given(args, "--use-precision-aware-optimizer") && value_of(args, "--megatron-fsdp-version") != "2";
  p.overlap_param_gather = given(args, "--overlap-param-gather");
  p.megatron_fsdp = given(args, "--use-megatron-fsdp");
}

}  // namespace stowage::estimate
