#pragma once
// How a model is trained: batch shape, precision, parallelism, recompute, and which of stowage's
// memory techniques are on. Everything the memory model reads besides the model's shape.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tools/estimate/model_config.hpp"

namespace stowage::estimate {

enum class Precision { bf16, fp16, fp32 };
enum class Optimizer { adam, sgd };
enum class Recompute { none, selective, full, activation_function };
enum class OffloadMode { none, mapped, streamed };
enum class Rounding { half_away, nearest_even };
// Whose bookkeeping the model states follow: the ZeRO paper's, DeepSpeed's estimator's (fp16
// grads kept whole plus an fp32 grad partition), or Megatron-LM's (fp32 main grads).
enum class Accounting { zero_paper, deepspeed, megatron };

struct Training {
  std::int64_t seq_length = 4096;
  std::int64_t micro_batch = 1;
  std::int64_t grad_accumulation = 1;  // micro-batches per step per data-parallel rank
  std::int64_t global_batch = 0;       // when set, grad_accumulation = global / (micro × dp)
  Precision precision = Precision::bf16;
  Optimizer optimizer = Optimizer::adam;
  int grad_bytes = 0;  // 0: 2 for bf16/fp16 (ZeRO paper), 4 for fp32 or Megatron accounting
  bool flash_attention = true;  // no s² attention scores stored (FlashAttention / fused attention)
  bool fused_swiglu = true;     // fused SwiGLU stores its input only; unfused also keeps silu(x1)
  std::int64_t vocab_divisor = 128;  // Megatron pads the vocabulary to a multiple of this × TP
};

struct Parallelism {
  std::int64_t tp = 1, pp = 1, vpp = 1, dp = 1, cp = 1, ep = 1;
  bool sequence_parallel = false;
  int zero_stage = 0;  // 0..3; Megatron's distributed optimizer is stage 1
  Accounting accounting = Accounting::zero_paper;
  bool offload_optimizer_deepspeed = false;  // DeepSpeed offload_optimizer.device == cpu
  bool offload_param_deepspeed = false;      // DeepSpeed offload_param.device == cpu (stage 3)
  std::int64_t reduce_bucket_elements = 0;   // DeepSpeed reduce_bucket_size (0: not DeepSpeed)
  std::int64_t allgather_bucket_elements = 0;
};

struct RecomputeSettings {
  Recompute granularity = Recompute::none;
  std::int64_t num_layers = 0;  // full/activation-function: layers per stage recomputed (0 = all)
};

// stowage's own techniques (DESIGN.md).
struct Techniques {
  bool shared_storage = false;  // bf16 weights live inside the fp32 master
  Rounding rounding = Rounding::half_away;
  bool act_fn_recompute = false;  // storage-release recompute of the MLP activation output
  bool swap_attention = false;
  std::int64_t prefetch_window = 1;  // layers whose attention activations stay on the device
  OffloadMode optimizer_offload = OffloadMode::none;
  std::int64_t stream_window_layers = 1;  // streamed offload: layers of optimizer state per buffer
  bool any() const { return shared_storage || act_fn_recompute || swap_attention || optimizer_offload != OffloadMode::none; }
};

struct RunConfig {
  ModelConfig model;
  Training training;
  Parallelism parallel;
  RecomputeSettings recompute;
  Techniques techniques;
  double allocator_overhead = 0.05;  // reserved − allocated, as a fraction of peak allocated
  std::vector<std::string> notes;    // what the reader of the estimate should know (ignored args…)
};

// Derives what follows from the settings once every source is applied (grad accumulation from
// the global batch). InvalidArgument when the global batch is not a multiple of micro × dp.
void finalize(RunConfig& c);

// InvalidArgument naming the setting for zero/negative sizes and parallel sizes that do not
// divide what they split (TP must divide the heads, PP·VPP the layers, …).
void validate(const RunConfig& c);

// Parsing of the enum names used on the command line and in JSON ("selective", "mapped", …).
Precision parse_precision(std::string_view s);
Optimizer parse_optimizer(std::string_view s);
Recompute parse_recompute(std::string_view s);
OffloadMode parse_offload(std::string_view s);
Rounding parse_rounding(std::string_view s);
Accounting parse_accounting(std::string_view s);
const char* to_string(Precision p);
const char* to_string(Recompute r);
const char* to_string(OffloadMode m);
const char* to_string(Rounding r);
const char* to_string(Accounting a);

}  // namespace stowage::estimate
