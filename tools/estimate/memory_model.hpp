#pragma once
// The memory model: bytes per device for the most loaded pipeline stage. Every formula and its
// source is in memory_model.cpp beside the code and in docs/estimate.md.
#include <cstdint>
#include <string>
#include <vector>

#include "tools/estimate/run_config.hpp"

namespace stowage::estimate {

struct NamedBytes {
  std::string name;
  std::int64_t bytes = 0;
};

struct StageMemory {
  std::int64_t stage = 0;             // pipeline rank that is most loaded
  std::int64_t layers = 0;            // transformer layers on it
  std::int64_t mtp_layers = 0;        // multi-token-prediction layers on it
  double microbatches_in_flight = 1;  // activations held at once (1F1B / interleaved schedule)
  std::int64_t parameters = 0;        // parameters held by this device (after TP/PP/EP split)
  std::int64_t weights = 0;
  std::int64_t gradients = 0;
  std::int64_t optimizer_states = 0;
  std::vector<NamedBytes> activations;  // by kind, fixed order (see kActivationKinds)
  std::int64_t communication = 0;
  std::int64_t framework = 0;  // cuBLAS / TransformerEngine workspaces (RunConfig::framework)
  // Allocated inside the optimizer step only, when backward has freed the activations (DeepSpeed's
  // fp32 gradients); the peak holds the larger of the two, so only what exceeds the activations
  // is counted in it (optimizer_step_beyond_activations).
  std::int64_t optimizer_step = 0;
  std::int64_t optimizer_step_beyond_activations = 0;
  std::int64_t peak_allocated = 0;      // everything above
  std::int64_t allocator_overhead = 0;  // reserved − allocated
  std::int64_t peak_reserved = 0;
  std::int64_t host_bytes = 0;     // moved to host memory per device (offloaded states, swapped activations)
  std::int64_t swapped_bytes = 0;  // of host_bytes: the swapped activations (moved every micro-batch)
  std::int64_t activation_total() const;
  std::int64_t model_states() const { return weights + gradients + optimizer_states; }
};

inline constexpr const char* kActivationKinds[] = {
    "attention",              // norms, QKV input, Q/K/V, attention output (what swap-attention moves)
    "core_attention",         // softmax scores / dropout (none with flash attention) or log-sum-exp
    "mlp",                    // fc1 input, activation-function input, dropout mask
    "mlp_activation_output",  // activation-function output: fc2's input (and silu(x1) unfused)
    "moe_router",             // router probabilities (MoE only)
    "mtp",                    // the multi-token-prediction layers (last stage)
    "embedding",              // token ids and embedding dropout mask (first stage)
    "output_logits",          // final norm and output-layer inputs, bf16 logits and the loss's fp32 copy (last stage)
    "recompute_working_set",  // layers rematerialised in backward, beyond the loss's peak
};

// The memory of config.stage, or of the most loaded stage (largest peak_reserved of the first and
// the last) when it is −1. InvalidArgument from validate() for nonsensical configurations.
StageMemory estimate_memory(const RunConfig& config);
// The memory of pipeline stage `stage` (0..pp−1).
StageMemory estimate_stage(const RunConfig& config, std::int64_t stage);
// The vocabulary as Megatron pads it: a multiple of make-vocab-size-divisible-by × TP.
std::int64_t padded_vocab(const RunConfig& config);
// Chunk-forwards (one micro-batch through one model chunk) a pipeline rank holds at its peak:
// 1F1B warms up pp − rank − 1 micro-batches; the interleaved schedule (pp − rank − 1)·2 +
// (vp − 1)·group (Megatron-LM schedules.py get_pp_rank_microbatches); one more runs; at most
// all micro-batches × chunks of the step.
std::int64_t chunks_in_flight(const RunConfig& config, std::int64_t stage);

// The Korthikanti et al. (2022) per-layer activation bytes, Table 2, for checks and docs:
// s·b·h·(34 + 5·a·s/h) without parallelism, and its TP / SP / selective variants.
double korthikanti_layer_bytes(double s, double b, double h, double a, double t, bool sp, bool selective);

// DeepSpeed's estimators (estimate_zero2/3_model_states_mem_needs): bytes per GPU for params,
// gradients and optimizer states. ZeRO-2 as of v0.14.3 (2Ψ + 18Ψ/N) and as it was before (4Ψ +
// 16Ψ/N, the figures of deepspeed.readthedocs.io "Memory Requirements", now ZeRO-1's).
double deepspeed_zero2_gpu_bytes(double params, double gpus, bool offload_optimizer);
double deepspeed_zero2_gpu_bytes_before_0_14_3(double params, double gpus, bool offload_optimizer);
double deepspeed_zero3_gpu_bytes(double params, double largest_layer_params, double gpus, bool offload_optimizer,
                                 bool offload_params);

}  // namespace stowage::estimate
