#pragma once
// A DeepSpeed config JSON applied to a RunConfig: ZeRO stage, optimizer/parameter offload,
// bucket sizes, batch sizes and precision. Switches the model-state bookkeeping to DeepSpeed's
// (Accounting::deepspeed).
#include <string>

#include "tools/estimate/run_config.hpp"

namespace stowage::estimate {

// ParseError naming the file, the key ("zero_optimization.stage") and the value for malformed,
// wrongly typed, unknown (inside zero_optimization, as DeepSpeed) or contradictory settings.
// "auto" values (Hugging Face integration) keep the command's setting, except the sizes Hugging
// Face's Trainer fills from the hidden size (reduce_bucket_size, stage3_prefetch_bucket_size,
// stage3_param_persistence_threshold), which are filled as it fills them; "auto" under any other
// size, their other spellings included, is refused (DeepSpeed would get it unfilled). The batch
// values are recorded in config.deepspeed_batch for resolve_deepspeed_batch.
void apply_deepspeed_config(const std::string& json_text, RunConfig& config,
                            const std::string& name = "deepspeed config");

// Micro-batch and gradient accumulation from the config's train_batch_size,
// train_micro_batch_size_per_gpu and gradient_accumulation_steps and the data-parallel size, as
// DeepSpeed derives them (runtime/config.py _set_batch_related_parameters). InvalidArgument naming
// the keys and the file when train_batch_size ≠ micro × accumulation × DP. No-op without a config.
void resolve_deepspeed_batch(RunConfig& config);

}  // namespace stowage::estimate
