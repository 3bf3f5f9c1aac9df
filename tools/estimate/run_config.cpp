#include "tools/estimate/run_config.hpp"

#include <iterator>

#include <fmt/format.h>

#include "stowage/error.hpp"

namespace stowage::estimate {

void drop_trained_mtp_warning(RunConfig& c) {
  if (c.model.mtp_layers > 0)
    std::erase_if(c.warnings, [](const std::string& w) { return w.find(kMtpNotCounted) != std::string::npos; });
}

void finalize(RunConfig& c) {
  drop_trained_mtp_warning(c);
  auto& t = c.training;
  if (t.global_batch < 0) throw InvalidArgument("global-batch must not be negative");
  if (t.global_batch == 0) return;
  const std::int64_t per_step = t.micro_batch * c.parallel.dp;
  if (per_step <= 0 || t.global_batch % per_step != 0)
    throw InvalidArgument(fmt::format("global-batch ({}) is not a multiple of micro-batch × data-parallel ({})",
                                      t.global_batch, per_step));
  t.grad_accumulation = t.global_batch / per_step;
}

bool deepspeed_bf16_optimizer(const RunConfig& c) {
  const auto& p = c.parallel;
  if (p.accounting != Accounting::deepspeed || c.training.precision != Precision::bf16) return false;
  const Precision accumulation = p.grad_accum_deepspeed.value_or(Precision::bf16);
  return (p.zero_stage == 1 && accumulation == Precision::fp32 && !p.offload_optimizer_deepspeed) ||
         (p.zero_stage == 0 && accumulation == Precision::bf16 && p.pp > 1);
}

namespace {

// Megatron-LM's requirements of launch-line settings the command line may have changed since
// (megatron_arg_rules.hpp): the distributed optimizer, sequence parallelism at TP > 1.
void check_megatron_settings(const Parallelism& p) {
  auto refuse = [](const std::string& what) {
    throw InvalidArgument("megatron-args: " + what + " (Megatron-LM refuses it too)");
  };
  // The distributed optimizer: --use-distributed-optimizer, dist_muon, Megatron-FSDP (v1).
  const bool distributed = p.zero_stage >= 1 || p.megatron_fsdp;
  if (p.precision_aware_optimizer && !distributed)
    refuse("--use-precision-aware-optimizer needs --use-distributed-optimizer");
  if (p.overlap_param_gather && !distributed)
    refuse("--overlap-param-gather needs --use-distributed-optimizer, Megatron-FSDP or dist_muon");
  // Sequence parallelism is turned off at TP 1, before this check.
  if (p.tp_comm_overlap && !(p.sequence_parallel && p.tp > 1))
    refuse(fmt::format("--tp-comm-overlap needs --sequence-parallel with TP > 1 (TP is {})", p.tp));
}

}  // namespace

void validate(const RunConfig& c) {
  validate(c.model);
  const auto& t = c.training;
  const auto& p = c.parallel;
  auto positive = [](std::int64_t v, const char* field) {
    if (v <= 0) throw InvalidArgument(fmt::format("{} must be positive, got {}", field, v));
  };
  positive(t.seq_length, "seq-length");
  positive(t.micro_batch, "micro-batch");
  positive(t.grad_accumulation, "grad-accumulation");
  positive(p.tp, "tensor-parallel");
  positive(p.pp, "pipeline-parallel");
  positive(p.vpp, "virtual-stages");
  positive(p.dp, "data-parallel");
  positive(p.cp, "context-parallel");
  positive(p.ep, "expert-parallel");
  if (p.etp < 0) throw InvalidArgument(fmt::format("expert-tensor-parallel must not be negative, got {}", p.etp));
  if (t.seq_length > (std::int64_t{1} << 24) || t.micro_batch > (std::int64_t{1} << 20) ||
      t.grad_accumulation > (std::int64_t{1} << 24))
    throw InvalidArgument("seq-length, micro-batch or grad-accumulation is implausibly large");
  for (auto v : {p.tp, p.pp, p.vpp, p.dp, p.cp, p.ep, p.etp})
    if (v > (1 << 20)) throw InvalidArgument("a parallel size is implausibly large");
  if (t.grad_bytes != 0 && t.grad_bytes != 2 && t.grad_bytes != 4)
    throw InvalidArgument(fmt::format("grad-bytes must be 2 or 4, got {}", t.grad_bytes));
  if (t.vocab_divisor <= 0) throw InvalidArgument("make-vocab-size-divisible-by must be positive");
  const auto& m = c.model;
  if (m.num_heads % p.tp != 0)
    throw InvalidArgument(
        fmt::format("tensor-parallel ({}) does not divide num_attention_heads ({})", p.tp, m.num_heads));
  if (m.kv_heads() % p.tp != 0 && p.tp % m.kv_heads() != 0)
    throw InvalidArgument(
        fmt::format("tensor-parallel ({}) and num_key_value_heads ({}) do not divide one another", p.tp, m.kv_heads()));
  // Megatron-LM splits the query groups over TP (attention.py: divide(num_query_groups, tp)); it
  // does not replicate a group on several ranks.
  if (p.accounting == Accounting::megatron && m.kv_heads() % p.tp != 0)
    throw InvalidArgument(
        fmt::format("tensor-parallel ({}) does not divide the {} query groups, which Megatron-LM "
                    "splits over TP ranks (attention.py)",
                    p.tp, m.kv_heads()));
  if (m.ffn_hidden_size % p.tp != 0)
    throw InvalidArgument(
        fmt::format("tensor-parallel ({}) does not divide ffn_hidden_size ({})", p.tp, m.ffn_hidden_size));
  const bool uneven = p.own_end_stages();
  const bool layout = p.has_layout();
  if (layout && p.uneven_rules())
    throw InvalidArgument(
        "a pipeline layout places every layer itself: it excludes uneven first/last stages and counting the embedding "
        "or loss as a layer (as in Megatron-LM)");
  if (layout) {
    std::int64_t sum = 0;
    for (std::int64_t n : p.layout_layers) {
      if (n < 0 || n > m.num_layers)
        throw InvalidArgument(
            fmt::format("pipeline layout: a virtual stage of {} layers in a model of {}", n, m.num_layers));
      sum += n;
    }
    if (std::ssize(p.layout_layers) != p.pp * p.vpp || sum != m.num_layers)
      throw InvalidArgument(fmt::format(
          "pipeline layout: {} virtual stages holding {} layers for pipeline-parallel × virtual-stages {} × {} and {} "
          "layers",
          p.layout_layers.size(), sum, p.pp, p.vpp, m.num_layers));
    if (p.layout_mtp_rank < -1 || p.layout_mtp_rank >= p.pp)
      throw InvalidArgument(fmt::format("pipeline layout: MTP rank {} outside 0..{}", p.layout_mtp_rank, p.pp - 1));
    if ((p.layout_mtp_rank >= 0) != (m.mtp_layers > 0))
      throw InvalidArgument("pipeline layout: MTP layers placed without multi-token prediction, or not placed");
  }
  if (p.first_stage_layers < 0 || p.last_stage_layers < 0)
    throw InvalidArgument("first/last pipeline stage layers must not be negative");
  if (uneven && (p.embedding_as_layer || p.loss_as_layer))
    throw InvalidArgument(
        "an uneven first/last pipeline stage and counting the embedding or loss as a layer exclude each other (as in "
        "Megatron-LM)");
  if (uneven) {
    std::int64_t left = m.num_layers, stages = p.pp;
    if (p.first_stage_layers > 0) left -= p.first_stage_layers, --stages;
    if (p.last_stage_layers > 0) left -= p.last_stage_layers, --stages;
    if (stages < 0 || p.pp == 1)
      throw InvalidArgument(fmt::format(
          "uneven pipeline: a first ({}) or a last ({}) stage of its own needs at least 2 pipeline stages, got {}",
          p.first_stage_layers, p.last_stage_layers, p.pp));
    if (left < 0 || (stages > 0 && left % stages != 0) || (stages == 0 && left != 0))
      throw InvalidArgument(
          fmt::format("uneven pipeline: the {} layers left after the first ({}) and last ({}) stages do not "
                      "divide over the {} other stages",
                      left, p.first_stage_layers, p.last_stage_layers, stages));
    for (std::int64_t n : {p.first_stage_layers, p.last_stage_layers, stages > 0 ? left / stages : 0})
      if (n % p.vpp != 0)
        throw InvalidArgument(
            fmt::format("uneven pipeline: virtual-stages ({}) does not divide a stage's {} layers", p.vpp, n));
  } else if (!layout) {
    const std::int64_t total = m.num_layers + (p.embedding_as_layer ? 1 : 0) + (p.loss_as_layer ? 1 : 0);
    if (total % (p.pp * p.vpp) != 0)
      throw InvalidArgument(
          fmt::format("pipeline-parallel × virtual-stages ({} × {}) does not divide num_layers ({}{})", p.pp, p.vpp,
                      m.num_layers, total != m.num_layers ? " with the embedding/loss counted" : ""));
  }
  if (p.vpp > 1 && p.pp == 1) throw InvalidArgument("virtual-stages > 1 needs pipeline-parallel > 1");
  // Each CP rank takes one chunk from each end of the sequence (causal balance; Megatron-LM and
  // TransformerEngine split it into 2·CP chunks).
  if (p.cp > 1 && t.seq_length % (2 * p.cp) != 0)
    throw InvalidArgument(fmt::format("context-parallel ({}) needs a seq-length that splits into 2 × {} chunks, got {}",
                                      p.cp, p.cp, t.seq_length));
  if (p.sequence_parallel && (t.seq_length / p.cp) % p.tp != 0)
    throw InvalidArgument(fmt::format("sequence parallel: tensor-parallel ({}) does not divide the local sequence ({})",
                                      p.tp, t.seq_length / p.cp));
  if (p.ep > 1 && !m.moe()) throw InvalidArgument("expert-parallel > 1 needs a mixture-of-experts model");
  if (m.moe() && m.num_experts % p.ep != 0)
    throw InvalidArgument(fmt::format("expert-parallel ({}) does not divide num_experts ({})", p.ep, m.num_experts));
  // MoE parallel folding (parallel_state.py initialize_model_parallel): the experts' grid is
  // ETP × EP × expert-DP × PP over the same world, so ETP·EP·PP need only divide it. Megatron
  // builds that grid for dense models too (an ETP given there splits nothing).
  if ((m.moe() || p.etp > 0) && (p.tp * p.cp * p.dp) % (p.expert_tp() * p.ep) != 0)
    throw InvalidArgument(fmt::format(
        "expert-tensor × expert-parallel ({} × {}) does not divide tensor × context × data parallel ({} × {} × {}): "
        "Megatron-LM needs world size ÷ (ETP·EP·PP) whole",
        p.expert_tp(), p.ep, p.tp, p.cp, p.dp));
  if (m.moe() && m.expert_ffn() % p.expert_tp() != 0)
    throw InvalidArgument(fmt::format("expert-tensor-parallel ({}) does not divide the experts' ffn size ({})",
                                      p.expert_tp(), m.expert_ffn()));
  if (m.shared_experts() && m.shared_expert_ffn_hidden_size % p.tp != 0)
    throw InvalidArgument(fmt::format("tensor-parallel ({}) does not divide the shared experts' ffn size ({})", p.tp,
                                      m.shared_expert_ffn_hidden_size));
  // TransformerConfig: moe_shared_expert_overlap only works with the alltoall or flex dispatcher.
  if (m.shared_experts() && c.moe.shared_expert_overlap && c.moe.dispatcher == MoeDispatcher::allgather)
    throw InvalidArgument(
        "shared-expert overlap needs the alltoall or flex token dispatcher (Megatron-LM raises otherwise)");
  if (c.moe.probs_bytes != 0 && c.moe.probs_bytes != 2 && c.moe.probs_bytes != 4 && c.moe.probs_bytes != 8)
    throw InvalidArgument(fmt::format("router probability bytes must be 2, 4 or 8, got {}", c.moe.probs_bytes));
  if (c.framework.te_grouped_gemm_workspaces < 0 || c.framework.te_grouped_gemm_workspaces > 64)
    throw InvalidArgument("TransformerEngine grouped-GEMM workspaces must be 0..64");
  if (p.zero_stage < 0 || p.zero_stage > 3)
    throw InvalidArgument(fmt::format("zero-stage must be 0..3, got {}", p.zero_stage));
  // Without ZeRO, DeepSpeed accumulates gradients only in the weights' dtype (engine.py
  // _do_optimizer_sanity_check: "unsupported mix of model_dtype and grad_accum_dtype").
  if (p.accounting == Accounting::deepspeed && p.zero_stage == 0 && p.grad_accum_deepspeed &&
      *p.grad_accum_deepspeed != t.precision)
    throw InvalidArgument(fmt::format(
        "data_types.grad_accum_dtype {} with {} weights at ZeRO stage 0: DeepSpeed refuses the mix (it accumulates in "
        "the weights' dtype without ZeRO); use ZeRO stage 1 or more, or accumulate in {}",
        to_string(*p.grad_accum_deepspeed), to_string(t.precision), to_string(t.precision)));
  if (c.recompute.num_layers < 0) throw InvalidArgument("recompute-num-layers must not be negative");
  // multi_token_prediction.py asserts it: the MTP layers are checkpointed one at a time.
  if (m.mtp_layers > 0 && c.recompute.granularity == Recompute::full &&
      c.recompute.method == RecomputeMethod::uniform && c.recompute.num_layers > 1)
    throw InvalidArgument(fmt::format(
        "full recompute, uniform, of {} layers per chunk with multi-token prediction: Megatron-LM recomputes MTP "
        "layers one at a time (recompute-num-layers must be 1)",
        c.recompute.num_layers));
  if (c.techniques.prefetch_window < 0) throw InvalidArgument("prefetch-window must not be negative");
  if (c.techniques.stream_window_layers <= 0) throw InvalidArgument("stream-window must be positive");
  if (!(c.allocator_overhead >= 0.0 && c.allocator_overhead <= 4.0))
    throw InvalidArgument(
        fmt::format("allocator-overhead must be a fraction between 0 and 4, got {}", c.allocator_overhead));
  if (c.framework.cublas_workspace < 0 || c.framework.cublas_workspaces < 0 || c.framework.te_workspace < 0 ||
      c.framework.cublas_workspace > (std::int64_t{1} << 40) || c.framework.te_workspace > (std::int64_t{1} << 40) ||
      c.framework.cublas_workspaces > 1024)
    throw InvalidArgument("framework workspaces must be between 0 and 1 TiB (count 0..1024)");
  if (c.stage < -1 || c.stage >= p.pp)
    throw InvalidArgument(fmt::format("stage must be 0..{} (pipeline-parallel {}), got {}", p.pp - 1, p.pp, c.stage));
  if (p.microbatch_group < 0) throw InvalidArgument("microbatch-group-size must not be negative");
  check_megatron_settings(p);
  // The interleaved schedule runs the micro-batches in groups of N per model chunk (N = PP by
  // default): Megatron-LM raises for N outside [PP, M] and for a last group of 1..PP−1
  // (schedules.py forward_backward_pipelining_with_interleaving).
  if (p.vpp > 1 && p.pp > 1 && !t.batch_schedule) {
    const std::int64_t n = p.microbatch_group > 0 ? p.microbatch_group : p.pp, mb = t.grad_accumulation;
    if (n > mb || n < p.pp)
      throw InvalidArgument(fmt::format(
          "interleaved pipeline: {} micro-batches a step in groups of {} per model chunk; the group must be from "
          "pipeline-parallel ({}) to the micro-batches ({}) (Megatron-LM refuses it); give more micro-batches",
          mb, n, p.pp, mb));
    if (const std::int64_t rest = mb % n; rest > 0 && rest < p.pp)
      throw InvalidArgument(
          fmt::format("interleaved pipeline: {} micro-batches in groups of {} leave a last group of {}, fewer than "
                      "pipeline-parallel ({}) (Megatron-LM refuses it)",
                      mb, n, rest, p.pp));
  }
  if (p.optimizer_instances <= 0 || (p.dp * p.cp) % p.optimizer_instances != 0)
    throw InvalidArgument(fmt::format("distributed-optimizer instances ({}) must divide data × context parallel ({})",
                                      p.optimizer_instances, p.dp * p.cp));
  if (m.moe() && p.expert_dp() % p.optimizer_instances != 0)
    throw InvalidArgument(
        fmt::format("distributed-optimizer instances ({}) must divide the expert data-parallel size ({}), as "
                    "Megatron-LM asserts (parallel_state.py)",
                    p.optimizer_instances, p.expert_dp()));
  if (!(t.loss_bytes_per_logit >= 0.0 && t.loss_bytes_per_logit <= 64.0))
    throw InvalidArgument("loss bytes per logit must be between 0 and 64");
  if (t.deferred_wgrad_microbatches < 0) throw InvalidArgument("deferred wgrad micro-batches must not be negative");
}

std::int64_t chunk_layers(const RunConfig& c, std::int64_t rank, std::int64_t chunk) {
  const auto& p = c.parallel;
  if (p.has_layout()) return p.layout_layers[std::size_t(chunk * p.pp + rank)];
  std::int64_t per_rank = 0;
  if (p.own_end_stages()) {
    std::int64_t left = c.model.num_layers, stages = p.pp;
    if (p.first_stage_layers > 0) left -= p.first_stage_layers, --stages;
    if (p.last_stage_layers > 0) left -= p.last_stage_layers, --stages;
    per_rank = stages > 0 ? left / stages : 0;
    if (rank == 0 && p.first_stage_layers > 0) per_rank = p.first_stage_layers;
    if (rank == p.pp - 1 && p.last_stage_layers > 0) per_rank = p.last_stage_layers;
  } else {
    per_rank = (c.model.num_layers + (p.embedding_as_layer ? 1 : 0) + (p.loss_as_layer ? 1 : 0)) / p.pp;
  }
  std::int64_t n = per_rank / p.vpp;
  if (p.embedding_as_layer && rank == 0 && chunk == 0) --n;
  if (p.loss_as_layer && rank == p.pp - 1 && chunk == p.vpp - 1) --n;
  return n;
}

std::int64_t mtp_rank(const RunConfig& c) {
  return c.parallel.layout_mtp_rank >= 0 ? c.parallel.layout_mtp_rank : c.parallel.pp - 1;
}

ChunkPlace final_norm_place(const RunConfig& c) {
  const auto& p = c.parallel;
  if (c.model.mtp_layers > 0)
    for (std::int64_t chunk = p.vpp - 1; chunk >= 0; --chunk)
      for (std::int64_t rank = p.pp - 1; rank >= 0; --rank)
        if (chunk_layers(c, rank, chunk) > 0) return {rank, chunk};
  return {p.pp - 1, p.vpp - 1};
}

std::int64_t stage_layers(const RunConfig& c, std::int64_t rank) {
  std::int64_t n = 0;
  for (std::int64_t k = 0; k < c.parallel.vpp; ++k) n += chunk_layers(c, rank, k);
  return n;
}

std::int64_t chunk_first_layer(const RunConfig& c, std::int64_t rank, std::int64_t chunk) {
  std::int64_t offset = 0;
  for (std::int64_t k = 0; k <= chunk; ++k)
    for (std::int64_t r = 0; r < (k < chunk ? c.parallel.pp : rank); ++r) offset += chunk_layers(c, r, k);
  return offset;
}

std::int64_t stage_moe_layers(const RunConfig& c, std::int64_t rank) {
  std::int64_t n = 0;
  for (std::int64_t k = 0; k < c.parallel.vpp; ++k)
    n += c.model.moe_layers(chunk_first_layer(c, rank, k), chunk_layers(c, rank, k));
  return n;
}

namespace {
template <typename E, std::size_t N>
E parse_enum(std::string_view s, const char* field, const std::pair<const char*, E> (&names)[N]) {
  std::string norm(s);
  for (auto& ch : norm)
    if (ch == '_') ch = '-';
  for (const auto& [name, value] : names)
    if (norm == name) return value;
  std::string known;
  for (const auto& [name, value] : names) known += (known.empty() ? "" : ", ") + std::string(name);
  throw InvalidArgument(fmt::format("{}: unknown value '{}' (expected one of: {})", field, s, known));
}
}  // namespace

Precision parse_precision(std::string_view s) {
  static const std::pair<const char*, Precision> n[] = {
      {"bf16", Precision::bf16}, {"fp16", Precision::fp16}, {"fp32", Precision::fp32}};
  return parse_enum(s, "precision", n);
}
Optimizer parse_optimizer(std::string_view s) {
  static const std::pair<const char*, Optimizer> n[] = {
      {"adam", Optimizer::adam}, {"adamw", Optimizer::adam}, {"sgd", Optimizer::sgd}, {"muon", Optimizer::muon}};
  return parse_enum(s, "optimizer", n);
}
MoeDispatcher parse_moe_dispatcher(std::string_view s) {
  static const std::pair<const char*, MoeDispatcher> n[] = {
      {"allgather", MoeDispatcher::allgather}, {"alltoall", MoeDispatcher::alltoall}, {"flex", MoeDispatcher::flex}};
  return parse_enum(s, "moe-token-dispatcher", n);
}
Recompute parse_recompute(std::string_view s) {
  static const std::pair<const char*, Recompute> n[] = {{"none", Recompute::none},
                                                        {"selective", Recompute::selective},
                                                        {"full", Recompute::full},
                                                        {"activation-function", Recompute::activation_function}};
  return parse_enum(s, "recompute", n);
}
OffloadMode parse_offload(std::string_view s) {
  static const std::pair<const char*, OffloadMode> n[] = {
      {"none", OffloadMode::none}, {"mapped", OffloadMode::mapped}, {"streamed", OffloadMode::streamed}};
  return parse_enum(s, "optimizer-offload", n);
}
Rounding parse_rounding(std::string_view s) {
  // The library's spelling (stowage::to_string(Rounding)), the same in every subcommand.
  for (Rounding r : {Rounding::half_up, Rounding::nearest_even})
    if (s == stowage::to_string(r)) return r;
  throw InvalidArgument(
      fmt::format("shared-storage rounding: unknown value '{}' (expected one of: half_up, nearest_even)", s));
}
RecomputeMethod parse_recompute_method(std::string_view s) {
  static const std::pair<const char*, RecomputeMethod> n[] = {{"block", RecomputeMethod::block},
                                                              {"uniform", RecomputeMethod::uniform}};
  return parse_enum(s, "recompute-method", n);
}
namespace {
constexpr std::pair<const char*, RecomputeModule> kRecomputeModules[] = {
    {"core_attn", RecomputeModule::core_attn},
    {"moe_act", RecomputeModule::moe_act},
    {"layernorm", RecomputeModule::layernorm},
    {"mla_up_proj", RecomputeModule::mla_up_proj},
    {"mlp", RecomputeModule::mlp},
    {"moe", RecomputeModule::moe},
    {"shared_experts", RecomputeModule::shared_experts}};
}  // namespace
RecomputeModule parse_recompute_module(std::string_view s) {
  for (const auto& [name, bit] : kRecomputeModules)  // spelt exactly, as TransformerConfig checks them
    if (s == name) return bit;
  throw InvalidArgument(
      fmt::format("recompute module: unknown value '{}' (expected one of: {})", s, recompute_modules_string(~0u)));
}
std::string recompute_modules_string(unsigned modules) {
  std::string out;
  for (const auto& [name, bit] : kRecomputeModules)
    if ((modules & bit) != 0) out += (out.empty() ? "" : " ") + std::string(name);
  return out;
}
Accounting parse_accounting(std::string_view s) {
  static const std::pair<const char*, Accounting> n[] = {
      {"zero-paper", Accounting::zero_paper}, {"deepspeed", Accounting::deepspeed}, {"megatron", Accounting::megatron}};
  return parse_enum(s, "accounting", n);
}

double activation_bytes(const RunConfig& c) { return c.training.precision == Precision::fp32 ? 4.0 : 2.0; }

const char* to_string(Precision p) { return p == Precision::bf16 ? "bf16" : p == Precision::fp16 ? "fp16" : "fp32"; }
const char* to_string(Optimizer o) { return o == Optimizer::adam ? "adam" : o == Optimizer::sgd ? "sgd" : "muon"; }
const char* to_string(MoeDispatcher d) {
  return d == MoeDispatcher::allgather ? "allgather" : d == MoeDispatcher::alltoall ? "alltoall" : "flex";
}
const char* to_string(Recompute r) {
  switch (r) {
    case Recompute::none: return "none";
    case Recompute::selective: return "selective";
    case Recompute::full: return "full";
    case Recompute::activation_function: return "activation-function";
  }
  return "?";
}
const char* to_string(OffloadMode m) {
  return m == OffloadMode::none ? "none" : m == OffloadMode::mapped ? "mapped" : "streamed";
}
const char* to_string(RecomputeMethod m) { return m == RecomputeMethod::block ? "block" : "uniform"; }
const char* to_string(Accounting a) {
  return a == Accounting::zero_paper ? "zero-paper" : a == Accounting::deepspeed ? "deepspeed" : "megatron";
}

}  // namespace stowage::estimate
