#pragma once
// Megatron-LM's assertions between launch arguments that change no memory the estimate models
// but stop the launch: a line Megatron-LM would refuse is refused here too (InvalidArgument
// naming both arguments), so an estimate never describes a run that cannot start.
#include <cstdint>
#include <string>
#include <vector>

namespace stowage::estimate {

// `args`: the launch line's words; `tp`: its tensor-parallel size. Megatron-LM d98e8a6:
// arguments.py (--optimizer-cpu-offload, --overlap-param-gather, --tp-comm-overlap) and
// megatron/core/optimizer/__init__.py (--use-precision-aware-optimizer).
void check_megatron_rules(const std::vector<std::string>& args, std::int64_t tp);

}  // namespace stowage::estimate
