#pragma once
// Megatron-LM's assertions between launch arguments that change no memory the estimate models
// but stop the launch: a line Megatron-LM would refuse is refused here too (InvalidArgument
// naming both arguments), so an estimate never describes a run that cannot start.
#include <string>
#include <vector>

#include "tools/estimate/run_config.hpp"

namespace stowage::estimate {

// `args`: the launch line's words. Refuses what the line alone decides (Megatron-LM d98e8a6
// arguments.py: --optimizer-cpu-offload without --use-precision-aware-optimizer,
// --overlap-param-gather without --overlap-grad-reduce) and records in `p` what depends on
// settings the command line may still change (validate() checks those against the final
// settings: the distributed optimizer for --use-precision-aware-optimizer and
// --overlap-param-gather, sequence parallelism at TP > 1 for --tp-comm-overlap).
void check_megatron_rules(const std::vector<std::string>& args, Parallelism& p);

}  // namespace stowage::estimate
