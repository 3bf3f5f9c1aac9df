#pragma once
// How a model is trained: batch shape, precision, parallelism, recompute, and which of stowage's
// memory techniques are on. Everything the memory model reads besides the model's shape.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "stowage/precision.hpp"
#include "tools/estimate/model_config.hpp"

namespace stowage::estimate {

enum class Precision { bf16, fp16, fp32 };
// Muon (Megatron --optimizer muon, emerging_optimizers.py): a momentum for each 2-D weight but the
// embedding and output layer, the scalar optimizer (Adam, or Lion) for the rest.
enum class Optimizer { adam, sgd, muon };
// How an MoE layer moves tokens to its experts (Megatron --moe-token-dispatcher-type).
enum class MoeDispatcher { allgather, alltoall, flex };
enum class Recompute { none, selective, full, activation_function };
enum class OffloadMode { none, mapped, streamed };
// Shared-storage rounding: the library's own enum and spelling (half_up, nearest_even).
using stowage::Rounding;
// How full recompute picks its layers (Megatron-LM --recompute-method): `uniform` checkpoints the
// input of every chunk of num_layers layers and recomputes all of them, a chunk at a time;
// `block` recomputes the first num_layers layers of each model chunk and stores the rest.
enum class RecomputeMethod { block, uniform };
// Whose bookkeeping the model states follow: the ZeRO paper's, DeepSpeed's estimator's (fp16
// grads kept whole plus an fp32 grad partition), or Megatron-LM's (fp32 main grads).
enum class Accounting { zero_paper, deepspeed, megatron };

struct Training {
  std::int64_t seq_length = 4096;
  std::int64_t micro_batch = 1;
  std::int64_t grad_accumulation = 1;  // micro-batches per step per data-parallel rank
  std::int64_t global_batch = 0;       // when set, grad_accumulation = global / (micro × dp)
  // Megatron's --rampup-batch-size / --step-batch-size-schedule: the micro-batches per step change
  // during training; grad_accumulation is then one step's, not every step's.
  bool batch_schedule = false;
  Precision precision = Precision::bf16;
  Optimizer optimizer = Optimizer::adam;
  // Muon's optimizer for the parameters it does not orthogonalise (--muon-scalar-optimizer): adam,
  // or sgd for Lion's single moment.
  Optimizer muon_scalar = Optimizer::adam;
  int grad_bytes = 0;           // 0: 2 for bf16/fp16 (ZeRO paper), 4 for fp32 or Megatron accounting
  bool flash_attention = true;  // no s² attention scores stored (FlashAttention / fused attention)
  bool fused_swiglu = true;     // fused SwiGLU stores its input only; unfused also keeps silu(x1)
  // TransformerEngine fuses the norm before QKV and the one before a dense MLP's fc1 into those
  // linears (LayerNormLinear); MLA's input norm and an MoE layer's pre-MLP norm stay modules of
  // their own, as every norm does with Megatron's --transformer-impl local. Only selective
  // recompute of "layernorm" tells them apart: it recomputes norms that are modules of their own.
  bool fused_norms = true;
  std::int64_t vocab_divisor = 128;  // Megatron pads the vocabulary to a multiple of this × TP
  // Bytes per logit alive while the loss runs (16-bit training; fp32 training keeps 4).
  // Megatron's vocab-parallel cross-entropy upcasts the bf16 logits to fp32 and keeps that copy
  // as the softmax for backward: 2 + 4 (tensor_parallel/cross_entropy.py). Its fused version
  // (--cross-entropy-loss-fusion, native) runs the steps as separate jit-fused functions, so the
  // fp32 logits and the fp32 exp(logits) exist together: 2 + 4 + 4 (fusions/fused_cross_entropy.py).
  double loss_bytes_per_logit = 6.0;
  // Megatron --defer-embedding-wgrad-compute: the output layer's weight gradient waits, keeping
  // each micro-batch's logits gradient (2 B per logit) and input (2h) for up to this many
  // output-layer calls (--wgrad-deferral-limit; 0 there means the whole step), one per micro-batch
  // and one more per MTP layer. 0: not deferred.
  std::int64_t deferred_wgrad_microbatches = 0;
};

// Memory a training process allocates besides the model (PyTorch's caching allocator counts it).
struct Framework {
  // PyTorch keeps one cuBLAS workspace per (handle, stream); handles are per thread, so the
  // forward thread and autograd's device thread each have one (aten/src/ATen/cuda/
  // CublasHandlePool.cpp: 4096·8 KiB = 32 MiB on sm90 by default, CUBLAS_WORKSPACE_CONFIG sets it).
  std::int64_t cublas_workspace = std::int64_t{32} << 20;
  std::int64_t cublas_workspaces = 2;
  // TransformerEngine allocates its own cuBLAS workspace once (transformer_engine/pytorch/module/
  // base.py get_cublas_workspace_size_bytes: 32 MiB on Hopper, 4 MiB before); 0 without TE.
  std::int64_t te_workspace = 0;
  // TransformerEngine's GroupedLinear (Megatron --moe-grouped-gemm) runs its GEMMs on 4 streams,
  // each with a workspace of that size (cpp_extensions/gemm.py get_cublas_workspace, grouped_gemm;
  // common/util/multi_stream.cpp get_num_compute_streams = 4); 0 without it.
  std::int64_t te_grouped_gemm_workspaces = 0;
  std::int64_t total() const {
    return cublas_workspace * cublas_workspaces + te_workspace * (1 + te_grouped_gemm_workspaces);
  }
};

struct Parallelism {
  std::int64_t tp = 1, pp = 1, vpp = 1, dp = 1, cp = 1, ep = 1;
  // Expert tensor parallelism (Megatron --expert-tensor-parallel-size): experts' weights split by
  // this instead of tp; 0 follows tp, Megatron's default (arguments.py: None → TP).
  std::int64_t etp = 0;
  std::int64_t expert_tp() const { return etp > 0 ? etp : tp; }
  // Ranks holding the same experts (parallel_state.py initialize_model_parallel: world ÷
  // (ETP·EP·PP) = TP·CP·DP ÷ (ETP·EP)); MoE parallel folding needs only that this divides.
  std::int64_t expert_dp() const { return tp * cp * dp / (expert_tp() * ep); }
  bool sequence_parallel = false;
  int zero_stage = 0;  // 0..3; Megatron's distributed optimizer is stage 1
  Accounting accounting = Accounting::zero_paper;
  bool offload_optimizer_deepspeed = false;  // DeepSpeed offload_optimizer.device == cpu
  bool offload_param_deepspeed = false;      // DeepSpeed offload_param.device == cpu (stage 3)
  // DeepSpeed data_types.grad_accum_dtype; absent: the weights' dtype (engine.py get_data_types).
  // bf16 with fp32 accumulation at stage 1 runs the BF16_Optimizer.
  std::optional<Precision> grad_accum_deepspeed;
  // How a DeepSpeed optimizer without ZeRO (stage 0, 16-bit) gets its fp32 gradients in step():
  // FP16_Optimizer around DeepSpeed's FusedAdam (the config's optimizer section) flattens them,
  // the unfused wrapper around a client's optimizer does not (engine.py _configure_fp16_optimizer).
  enum class Fp16Step { unfused, fused, fused_legacy } fp16_step_deepspeed = Fp16Step::unfused;
  // Interleaved schedule: micro-batches a rank runs through one model chunk before the next
  // (Megatron --microbatch-group-size-per-virtual-pipeline-stage); 0 = pp, Megatron's default.
  std::int64_t microbatch_group = 0;
  // Megatron --overlap-moe-expert-parallel-comm: the combined 1F1B schedule runs one
  // micro-batch's forward beside another's backward, layer by layer, to hide the expert
  // all-to-alls (combined_1f1b.py, model_chunk_schedule_plan.py).
  bool combined_1f1b = false;
  // Megatron-LM launch-line settings whose requirements the command line can still meet
  // (--tp, --sequence-parallel, --distributed-optimizer): checked by validate(), as Megatron-LM
  // asserts them. No memory of their own here.
  bool tp_comm_overlap = false;            // --tp-comm-overlap: SP at TP > 1
  bool precision_aware_optimizer = false;  // --use-precision-aware-optimizer: the distributed optimizer
  bool overlap_param_gather = false;       // --overlap-param-gather: the distributed optimizer
  bool megatron_fsdp = false;              // --use-megatron-fsdp (v1 turns the distributed optimizer on)
  // Megatron --num-distributed-optimizer-instances: the distributed optimizer shards over
  // DP·CP / instances ranks (one replica per instance).
  std::int64_t optimizer_instances = 1;
  // Uneven pipeline splits (Megatron --decoder-first/last-pipeline-num-layers; 0 = even), and
  // the embedding and the loss counted as a layer each when splitting
  // (--account-for-embedding/loss-in-pipeline-split); transformer_block.py get_num_layers_to_build.
  std::int64_t first_stage_layers = 0, last_stage_layers = 0;
  bool embedding_as_layer = false, loss_as_layer = false;
  // Megatron --pipeline-model-parallel-layout (pipeline_layout.hpp): the decoder layers of each
  // virtual stage, index chunk·pp + rank, and the rank whose last virtual stage runs the MTP
  // layers. Empty: the rules above split the layers, and MTP runs on the last rank.
  std::vector<std::int64_t> layout_layers;
  std::int64_t layout_mtp_rank = -1;
  bool own_end_stages() const { return first_stage_layers > 0 || last_stage_layers > 0; }
  // The rules split the layers unevenly: an end stage of its own size, or the embedding or loss
  // counted as a layer.
  bool uneven_rules() const { return own_end_stages() || embedding_as_layer || loss_as_layer; }
  bool has_layout() const { return !layout_layers.empty(); }
  std::int64_t reduce_bucket_elements = 0;  // DeepSpeed reduce_bucket_size (0: not DeepSpeed)
  // ZeRO-1/2 double-buffer the reduce bucket with overlap_comm (stage_1_and_2.py); stage 3 has one.
  std::int64_t reduce_buffers = 1;
  std::int64_t allgather_bucket_elements = 0;  // ZeRO-3 stage3_prefetch_bucket_size (no buffer at 0–2)
};

// The batch sizes of a DeepSpeed config, resolved as DeepSpeed does once the data-parallel size is
// known (resolve_deepspeed_batch): 0 absent, kAuto "auto" (the command's value stands in).
struct DeepSpeedBatch {
  static constexpr std::int64_t kAuto = -1;
  std::int64_t train = 0, micro = 0, accumulation = 0;
  // What each value is called in messages: the config key, or the option that replaced it.
  std::string train_name = "train_batch_size", micro_name = "train_micro_batch_size_per_gpu",
              accumulation_name = "gradient_accumulation_steps";
  std::string file;
};

// What selective recompute rematerialises in each layer (Megatron-LM --recompute-modules,
// transformer_config.py); a set of these bits. `core_attn`, `mlp` (dense layers), `moe` and
// `shared_experts` checkpoint the module and keep its input; `moe_act`, `layernorm` and
// `mla_up_proj` release their output once its consumers have saved it and recompute it just
// before their backward (CheckpointWithoutOutput).
enum RecomputeModule : unsigned {
  core_attn = 1u << 0,
  moe_act = 1u << 1,
  layernorm = 1u << 2,
  mla_up_proj = 1u << 3,
  mlp = 1u << 4,
  moe = 1u << 5,
  shared_experts = 1u << 6,
};

struct RecomputeSettings {
  Recompute granularity = Recompute::none;
  RecomputeMethod method = RecomputeMethod::block;
  // full: block — layers per model chunk recomputed (0 = all); uniform — layers per checkpointed
  // chunk (0 = 1). activation-function: layers per stage (0 = all).
  std::int64_t num_layers = 0;
  // Selective: the modules recomputed (RecomputeModule bits); core attention, Megatron's default.
  unsigned modules = RecomputeModule::core_attn;
  bool recomputes(RecomputeModule m) const { return granularity == Recompute::selective && (modules & m) != 0; }
};

// stowage's own techniques (DESIGN.md).
struct Techniques {
  bool shared_storage = false;  // bf16 weights live inside the fp32 master
  Rounding rounding = Rounding::half_up;
  bool act_fn_recompute = false;  // storage-release recompute of the MLP activation output
  bool swap_attention = false;
  std::int64_t prefetch_window = 1;  // layers whose attention activations stay on the device
  OffloadMode optimizer_offload = OffloadMode::none;
  std::int64_t stream_window_layers = 1;  // streamed offload: layers of optimizer state per buffer
  bool any() const {
    return shared_storage || act_fn_recompute || swap_attention || optimizer_offload != OffloadMode::none;
  }
};

// How a mixture-of-experts layer runs (Megatron's MoE arguments); unused for dense models.
struct MoeSettings {
  MoeDispatcher dispatcher = MoeDispatcher::allgather;  // TransformerConfig's default
  // Bytes of a router probability: the logits' dtype (moe_utils.py topk_routing_with_score_function
  // casts the probs back to it): 2 in bf16/fp16, 4 in fp32 or with --moe-router-dtype fp32, 8
  // with fp64; 0: the activations' (activation_bytes()).
  int probs_bytes = 0;
  // Megatron --moe-shared-expert-overlap: the shared experts run on a side stream inside the
  // all-to-all dispatcher, gathering their sequence-parallel input themselves (shared_experts.py).
  bool shared_expert_overlap = false;
};

struct RunConfig {
  ModelConfig model;
  Training training;
  MoeSettings moe;
  Parallelism parallel;
  RecomputeSettings recompute;
  Techniques techniques;
  Framework framework;
  double allocator_overhead = 0.05;  // reserved − allocated, as a fraction of peak allocated
  // Pipeline stage to report: -1 the most loaded (largest peak), else that stage (0..pp−1).
  // Megatron logs memory from the last rank, which is the last stage.
  std::int64_t stage = -1;
  std::optional<DeepSpeedBatch> deepspeed_batch;  // set by --deepspeed-config
  std::vector<std::string> notes;                 // what the reader of the estimate should know
  std::vector<std::string> warnings;              // settings that change memory but the model does not represent
};

// Whether DeepSpeed wraps the optimizer in its BF16_Optimizer, no ZeRO optimizer (engine.py
// _do_optimizer_sanity_check): bf16 with fp32 gradient accumulation at stage 1 without an
// optimizer offload, or bf16 accumulation (the default) at stage 0 under a pipeline.
bool deepspeed_bf16_optimizer(const RunConfig& c);

// A Hugging Face config's warning that its MTP layers are not counted, dropped when the run trains
// MTP layers (they are counted then).
void drop_trained_mtp_warning(RunConfig& c);

// Derives what follows from the settings once every source is applied (grad accumulation from
// the global batch; drop_trained_mtp_warning). InvalidArgument when the global batch is not a multiple of micro × dp.
void finalize(RunConfig& c);

// InvalidArgument naming the setting for zero/negative sizes and parallel sizes that do not
// divide what they split (TP must divide the heads, PP·VPP the layers, …).
void validate(const RunConfig& c);

// Transformer layers in model chunk `chunk` (0..vpp−1) of pipeline rank `rank`, as Megatron-LM
// builds them (transformer_block.py get_num_layers_to_build): L/(pp·vpp), or the uneven first and
// last stages' own counts with the rest spread evenly, or one layer fewer in the first (last)
// chunk of the first (last) stage when the embedding (loss) counts as a layer. Call after validate.
std::int64_t chunk_layers(const RunConfig& c, std::int64_t rank, std::int64_t chunk);
// The pipeline rank whose last model chunk runs the MTP layers: the layout's, else the last.
std::int64_t mtp_rank(const RunConfig& c);
// Where the decoder's final norm runs: the last rank's last model chunk, or with MTP the chunk of
// the last decoder layer (transformer_block.py has_final_layernorm_in_this_stage).
struct ChunkPlace {
  std::int64_t rank = 0, chunk = 0;
};
ChunkPlace final_norm_place(const RunConfig& c);
// All transformer layers of pipeline rank `rank`.
std::int64_t stage_layers(const RunConfig& c, std::int64_t rank);
// The index of the first layer of that model chunk: chunks hold the layers in order, chunk 0 of
// every rank, then chunk 1, … (transformer_layer.py get_transformer_layer_offset).
std::int64_t chunk_first_layer(const RunConfig& c, std::int64_t rank, std::int64_t chunk);
// The MoE layers of pipeline rank `rank` (all of its layers unless dense layers are mixed in).
std::int64_t stage_moe_layers(const RunConfig& c, std::int64_t rank);

// Parsing of the enum names used on the command line and in JSON ("selective", "mapped", …).
Precision parse_precision(std::string_view s);
Optimizer parse_optimizer(std::string_view s);
MoeDispatcher parse_moe_dispatcher(std::string_view s);
Recompute parse_recompute(std::string_view s);
OffloadMode parse_offload(std::string_view s);
Rounding parse_rounding(std::string_view s);
RecomputeMethod parse_recompute_method(std::string_view s);
// One of Megatron's module names (core_attn, moe_act, layernorm, mla_up_proj, mlp, moe,
// shared_experts); InvalidArgument naming the others.
RecomputeModule parse_recompute_module(std::string_view s);
// The modules' names in Megatron's order, space-separated.
std::string recompute_modules_string(unsigned modules);
Accounting parse_accounting(std::string_view s);
const char* to_string(Precision p);
// Bytes of one saved activation element: the compute dtype (fp32 training keeps 4-byte ones).
double activation_bytes(const RunConfig& c);
const char* to_string(Optimizer o);
const char* to_string(MoeDispatcher d);
const char* to_string(Recompute r);
const char* to_string(OffloadMode m);
const char* to_string(RecomputeMethod m);
const char* to_string(Accounting a);

}  // namespace stowage::estimate
