#pragma once
// A DeepSpeed config JSON applied to a RunConfig: ZeRO stage, optimizer/parameter offload,
// bucket sizes, micro-batch, gradient accumulation and precision. Switches the model-state
// bookkeeping to DeepSpeed's (Accounting::deepspeed).
#include <string>

#include "tools/estimate/run_config.hpp"

namespace stowage::estimate {

// ParseError naming the field ("zero_optimization.stage") for malformed or wrongly typed values.
// "auto" values (Hugging Face integration) leave the setting as it is.
void apply_deepspeed_config(const std::string& json_text, RunConfig& config,
                            const std::string& name = "deepspeed config");

}  // namespace stowage::estimate
