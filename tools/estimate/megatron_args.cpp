#include "tools/estimate/megatron_args.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "stowage/error.hpp"
#include "tools/estimate/megatron_arg_names.hpp"
#include "tools/estimate/megatron_arg_rules.hpp"
#include "tools/estimate/megatron_arg_values.hpp"
#include "tools/estimate/megatron_recompute.hpp"
#include "tools/estimate/megatron_unmodelled.hpp"
#include "tools/estimate/mindspeed_arg_names.hpp"
#include "tools/estimate/moe_layer_freq.hpp"
#include "tools/estimate/nearest_argument.hpp"
#include "tools/estimate/pipeline_layout.hpp"

namespace stowage::estimate {

std::vector<std::string> split_arguments(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  bool in_token = false;
  char quote = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (quote) {
      if (ch == quote) quote = 0;
      else cur += ch;
    } else if (ch == '\'' || ch == '"') {
      quote = ch;
      in_token = true;
    } else if (ch == '\\' && i + 1 < text.size() && (text[i + 1] == '\n' || text[i + 1] == '\r')) {
      ++i;  // line continuation
    } else if (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r') {
      if (in_token) out.push_back(std::move(cur));
      cur.clear();
      in_token = false;
    } else {
      cur += ch;
      in_token = true;
    }
  }
  if (quote) throw ParseError(fmt::format("megatron-args: unterminated {} quote", quote));
  if (in_token) out.push_back(std::move(cur));
  return out;
}

namespace {

// Names Megatron-LM's parser does not have but launch lines still carry, with the one it has.
constexpr std::pair<std::string_view, std::string_view> kRenamed[] = {
    // arguments.py derives virtual_pipeline_model_parallel_size; its ArgumentGroupFactory
    // excludes the field, so there is no flag (there was one for a few days in 2021).
    {"--virtual-pipeline-model-parallel-size", "--num-virtual-stages-per-pipeline-rank"},
};

std::string_view renamed(std::string_view name) {
  for (const auto& r : kRenamed)
    if (r.first == name) return r.second;
  return {};
}

// Virtual pipeline stages (arguments.py): at most one of --num-layers-per-virtual-pipeline-stage,
// --num-virtual-stages-per-pipeline-rank and --pipeline-model-parallel-layout; layers per virtual
// stage do not combine with an uneven first or last stage.
struct LineVirtualStages {
  std::optional<std::int64_t> stages, layers_per_stage;
  std::optional<std::string> layout;
};

void apply_virtual_stages(const LineVirtualStages& v, RunConfig& c) {
  auto& p = c.parallel;
  if (int(v.stages.has_value()) + int(v.layers_per_stage.has_value()) + int(v.layout.has_value()) > 1)
    throw InvalidArgument(
        "megatron-args: give one of --num-layers-per-virtual-pipeline-stage, --num-virtual-stages-per-pipeline-rank "
        "and --pipeline-model-parallel-layout (Megatron-LM refuses more than one)");
  if (v.stages) p.vpp = *v.stages;
  if (v.layout) {
    if (p.uneven_rules())
      throw InvalidArgument(
          "megatron-args: --pipeline-model-parallel-layout places every layer itself; Megatron-LM refuses it with "
          "--decoder-first/last-pipeline-num-layers and --account-for-embedding/loss-in-pipeline-split");
    const PipelineLayout l = parse_pipeline_layout(*v.layout, p.pp, c.model.num_layers, c.model.mtp_layers);
    p.vpp = l.vpp;
    p.layout_layers = l.decoder;
    p.layout_mtp_rank = l.mtp_rank;
  }
  if (!v.layers_per_stage) return;
  if (p.own_end_stages())
    throw InvalidArgument(
        "megatron-args: --num-layers-per-virtual-pipeline-stage with --decoder-first/last-pipeline-num-layers: "
        "Megatron-LM needs --num-virtual-stages-per-pipeline-rank for an uneven pipeline");
  // Layers per pipeline rank (the embedding and loss counted when asked) ÷ this.
  const std::int64_t layers = c.model.num_layers + (p.embedding_as_layer ? 1 : 0) + (p.loss_as_layer ? 1 : 0);
  if (layers % (p.pp * *v.layers_per_stage) != 0)
    throw InvalidArgument(
        fmt::format("megatron-args: --num-layers-per-virtual-pipeline-stage {} does not divide the {} layers of each "
                    "of {} pipeline stages",
                    *v.layers_per_stage, layers / p.pp, p.pp));
  p.vpp = layers / (p.pp * *v.layers_per_stage);
}

// --overlap-moe-expert-parallel-comm runs the combined 1F1B schedule; TransformerConfig's
// requirements (transformer_config.py __post_init__).
void check_combined_1f1b(const LineRecompute& r, const RunConfig& c) {
  auto refuse = [](std::string_view why) {
    throw InvalidArgument(
        fmt::format("megatron-args: --overlap-moe-expert-parallel-comm {} (Megatron-LM refuses it otherwise)", why));
  };
  const auto& p = c.parallel;
  if (p.ep <= 1) refuse("needs --expert-model-parallel-size above 1");
  if (c.moe.dispatcher == MoeDispatcher::allgather) refuse("needs the alltoall or flex token dispatcher");
  if (c.recompute.granularity == Recompute::full || r.method || r.num_layers)
    refuse("excludes full recompute, --recompute-method and --recompute-num-layers");
  if (r.modules && std::find(r.modules->begin(), r.modules->end(), "moe") != r.modules->end())
    refuse("excludes moe in --recompute-modules");
  if (c.training.precision == Precision::fp32) refuse("needs --bf16 or --fp16");
  if (c.moe.shared_expert_overlap) refuse("excludes --moe-shared-expert-overlap");
  if (c.model.mtp_layers > 1) refuse("takes at most one MTP layer");
  if (p.pp > 1 && p.vpp == 1 && !p.has_layout()) refuse("needs virtual pipeline stages under a pipeline");
}

// arguments.py asserts max_position_embeddings >= seq_length, and with context parallelism a
// sequence that splits into 2·CP chunks (each rank takes one from each end, for causal balance).
void check_sequence(const RunConfig& c, std::optional<std::int64_t> max_positions, bool seq_given, bool cp_given) {
  const std::int64_t s = c.training.seq_length, cp = c.parallel.cp;
  if (max_positions && seq_given && *max_positions < s)
    throw InvalidArgument(fmt::format(
        "megatron-args: --max-position-embeddings {} is smaller than --seq-length {} (Megatron-LM refuses it)",
        *max_positions, s));
  if (seq_given && c.model.learned_positions > 0 && c.model.learned_positions < s)
    throw InvalidArgument(
        fmt::format("megatron-args: --seq-length {} is longer than the model's learned position "
                    "embedding ({} rows; Megatron-LM refuses it)",
                    s, c.model.learned_positions));
  if (cp_given && cp > 1 && s % (2 * cp) != 0)
    throw InvalidArgument(
        fmt::format("megatron-args: --seq-length {} is not a multiple of 2 × --context-parallel-size {} (Megatron-LM "
                    "refuses it)",
                    s, cp));
}

// What MoE and Muon settings allocate beyond the model's shape.
void apply_moe_runtime(RunConfig& c, bool te_grouped_gemm, std::optional<int> router_dtype_bytes) {
  // TEGroupedMLP (--moe-grouped-gemm with TransformerEngine; the local implementation builds a
  // SequentialMLP, models/backends.py) runs TE's GroupedLinear, whose GEMMs take 4 workspaces.
  c.framework.te_grouped_gemm_workspaces = te_grouped_gemm && c.model.moe() ? 4 : 0;
  // Router probabilities are in the logits' dtype: the parameters' unless --moe-router-dtype.
  c.moe.probs_bytes = router_dtype_bytes.value_or(0);
  if (c.training.optimizer == Optimizer::muon && c.parallel.zero_stage >= 1)
    c.warnings.push_back(
        "--optimizer muon with the distributed optimizer runs Megatron-LM's LayerWiseDistributedOptimizer, which "
        "gives whole parameters to data-parallel ranks; the estimate spreads the states evenly (a rank holding "
        "the embedding holds more)");
  if (c.training.optimizer == Optimizer::muon)
    c.notes.push_back(
        "muon: 2-D weights but the embedding and output layer keep an fp32 master and a momentum, the rest the "
        "scalar optimizer's states (emerging_optimizers.py); the Newton-Schulz temporaries of the step are not "
        "counted");
}

// Megatron-LM's moe_router_topk defaults to 2 (TransformerConfig). Without --num-experts no MoE
// layer is built, so shared experts are not either.
void apply_experts(ModelConfig& m, bool topk_given, std::vector<std::string>& notes) {
  if (m.num_experts <= 0 && m.shared_expert_ffn_hidden_size > 0) {
    notes.push_back(fmt::format(
        "megatron-args: --moe-shared-expert-intermediate-size {} without --num-experts is ignored, as Megatron-LM "
        "builds no MoE layer",
        m.shared_expert_ffn_hidden_size));
    m.shared_expert_ffn_hidden_size = 0;
  }
  if (m.shared_expert_ffn_hidden_size == 0) m.shared_expert_gate = false;  // only effective with shared experts
  if (m.num_experts <= 0) return;
  if (!topk_given && m.experts_per_token == 0) m.experts_per_token = 2;
  if (m.experts_per_token > m.num_experts)
    throw InvalidArgument(fmt::format("megatron-args: --moe-router-topk {} is more than --num-experts {}",
                                      m.experts_per_token, m.num_experts));
}

// --moe-layer-freq: which layers get the experts (gpt_layer_specs.py get_gpt_decoder_layer_specs).
// Without --num-experts Megatron-LM builds a dense layer spec and never reads it (gpt_builders.py).
void apply_moe_layer_freq(const std::optional<std::string>& freq, ModelConfig& m, std::vector<std::string>& notes) {
  if (!freq) return;
  if (m.num_experts <= 0) {
    notes.push_back(fmt::format(
        "megatron-args: --moe-layer-freq {} without --num-experts is ignored, as Megatron-LM builds no MoE layer",
        *freq));
    m.moe_layer_pattern.clear();
    return;
  }
  m.moe_layer_pattern = moe_layer_freq_pattern(*freq, m.num_layers);
  if (std::all_of(m.moe_layer_pattern.begin(), m.moe_layer_pattern.end(), [](std::uint8_t v) { return v == 1; }))
    m.moe_layer_pattern.clear();  // every layer MoE: the plain layout
}

}  // namespace

MegatronArgsReport apply_megatron_args(const std::string& text, RunConfig& c, UnknownArguments unknown) {
  const auto args = split_arguments(text);
  if (args.empty())
    throw InvalidArgument(
        "megatron-args: empty; pass Megatron-LM's launch arguments, e.g. \"--num-layers 32 "
        "--hidden-size 4096 --num-attention-heads 32 --seq-length 4096 --bf16\"");
  auto& m = c.model;
  auto& t = c.training;
  auto& p = c.parallel;
  // Megatron-LM's defaults where a launch line leaves something out (arguments.py): LayerNorm,
  // GeLU, tied embeddings, biases, learned absolute positions, dropout 0.1, TransformerEngine.
  // They shape the model only when the arguments define it: a model already given (a preset, a
  // config.json) is refined by the arguments given, and keeps what they leave out.
  const bool model_given = m.hidden_size > 0;
  if (m.name.empty()) m.name = "megatron-args";
  bool gqa = false, untie = false, swiglu = false, no_bias = false, qkv_bias = false, megatron_fsdp = false;
  bool hidden_given = false, ffn_given = false, heads_given = false;
  std::string sharding = "no_shard";  // --data-parallel-sharding-strategy (arguments.py's default)
  std::optional<bool> rmsnorm, rope;
  std::string position_type;  // as given; empty: not given
  bool bf16 = false, fp16 = false, fp32_grads = false, bf16_grads = false, local_impl = false, flash = false;
  bool gpt2_bpe = false, seq_given = false, cp_given = false, topk_given = false;
  std::string tokenizer;  // --tokenizer-type
  std::string attention_backend = "auto", ce_impl = "native";
  bool grouped_gemm = false;              // --moe-grouped-gemm
  std::optional<int> router_dtype_bytes;  // --moe-router-dtype
  bool ce_fusion = false, defer_wgrad = false;
  std::int64_t wgrad_limit = 0;
  std::optional<double> attn_dropout, hidden_dropout;
  bool cpu_offload = false;     // --optimizer-cpu-offload
  double offload_fraction = 0;  // --optimizer-offload-fraction (OptimizerConfig's default 0.0)
  std::optional<std::int64_t> max_positions;
  std::int64_t query_groups = 0, global_batch = 0;
  std::optional<std::string> moe_layer_freq;
  // Multi-latent attention (arguments.py L3548-3557): --kv-lora-rank defaults to 32, the head dims
  // to 128 / 64 / 128, --q-lora-rank to None (queries projected directly).
  bool mla = false;
  std::optional<std::int64_t> q_lora, kv_lora, qk_head, qk_pos, v_head;
  LineRecompute recompute;
  LineVirtualStages virtual_stages;
  MegatronArgsReport report;

  using Handler = std::function<void(const std::string& arg, const std::string& value)>;
  const std::map<std::string, Handler> with_value{
      {"--num-layers", [&](auto& a, auto& v) { m.num_layers = to_positive(a, v); }},
      {"--hidden-size",
       [&](auto& a, auto& v) {
         m.hidden_size = to_positive(a, v);
         hidden_given = true;
       }},
      {"--ffn-hidden-size",
       [&](auto& a, auto& v) {
         m.ffn_hidden_size = to_positive(a, v);
         ffn_given = true;
       }},
      {"--num-attention-heads",
       [&](auto& a, auto& v) {
         m.num_heads = to_positive(a, v);
         heads_given = true;
       }},
      {"--num-query-groups", [&](auto& a, auto& v) { query_groups = to_positive(a, v); }},
      {"--kv-channels", [&](auto& a, auto& v) { m.head_dim = to_positive(a, v); }},
      {"--vocab-size", [&](auto& a, auto& v) { m.vocab_size = to_positive(a, v); }},
      {"--padded-vocab-size",
       [&](auto& a, auto& v) {
         m.vocab_size = to_positive(a, v);
         t.vocab_divisor = 1;
       }},
      {"--make-vocab-size-divisible-by", [&](auto& a, auto& v) { t.vocab_divisor = to_positive(a, v); }},
      {"--tokenizer-type",
       [&](auto&, auto& v) {
         gpt2_bpe = v == "GPT2BPETokenizer";
         tokenizer = v;
       }},
      {"--vocab-file", [&](auto&, auto&) { gpt2_bpe = true; }},
      {"--max-position-embeddings", [&](auto& a, auto& v) { max_positions = to_positive(a, v); }},
      // learned_absolute adds a table of positions; the rotary kinds, relative and none do not.
      {"--position-embedding-type",
       [&](auto& a, auto& v) {
         position_type = one_of(a, v, {"learned_absolute", "rope", "yarn", "mrope", "relative", "none"});
         rope = position_type != "learned_absolute";
       }},
      {"--normalization",
       [&](auto& a, auto& v) {
         rmsnorm = one_of(a, v, {"LayerNorm", "RMSNorm"}) == "RMSNorm";
       }},
      {"--num-experts", [&](auto& a, auto& v) { m.num_experts = to_positive(a, v); }},
      {"--mtp-num-layers", [&](auto& a, auto& v) { m.mtp_layers = to_positive(a, v); }},
      {"--moe-layer-freq", [&](auto&, auto& v) { moe_layer_freq = v; }},
      {"--q-lora-rank", [&](auto& a, auto& v) { q_lora = to_positive(a, v); }},
      {"--kv-lora-rank", [&](auto& a, auto& v) { kv_lora = to_positive(a, v); }},
      {"--qk-head-dim", [&](auto& a, auto& v) { qk_head = to_positive(a, v); }},
      {"--qk-pos-emb-head-dim", [&](auto& a, auto& v) { qk_pos = to_int(a, v); }},
      {"--v-head-dim", [&](auto& a, auto& v) { v_head = to_positive(a, v); }},
      {"--moe-router-topk",
       [&](auto& a, auto& v) {
         m.experts_per_token = to_positive(a, v);
         topk_given = true;
       }},
      {"--seq-length",
       [&](auto& a, auto& v) {
         t.seq_length = to_positive(a, v);
         seq_given = true;
       }},
      {"--micro-batch-size", [&](auto& a, auto& v) { t.micro_batch = to_positive(a, v); }},
      {"--global-batch-size", [&](auto& a, auto& v) { global_batch = to_positive(a, v); }},
      {"--optimizer-offload-fraction", [&](auto& a, auto& v) { offload_fraction = to_double(a, v); }},

      {"--tensor-model-parallel-size", [&](auto& a, auto& v) { p.tp = to_positive(a, v); }},
      {"--pipeline-model-parallel-size", [&](auto& a, auto& v) { p.pp = to_positive(a, v); }},
      {"--num-virtual-stages-per-pipeline-rank", [&](auto& a, auto& v) { virtual_stages.stages = to_positive(a, v); }},
      {"--pipeline-model-parallel-layout", [&](auto&, auto& v) { virtual_stages.layout = v; }},
      {"--num-layers-per-virtual-pipeline-stage",
       [&](auto& a, auto& v) { virtual_stages.layers_per_stage = to_positive(a, v); }},
      {"--microbatch-group-size-per-virtual-pipeline-stage",
       [&](auto& a, auto& v) { p.microbatch_group = to_positive(a, v); }},
      {"--context-parallel-size",
       [&](auto& a, auto& v) {
         p.cp = to_positive(a, v);
         cp_given = true;
       }},
      {"--expert-model-parallel-size", [&](auto& a, auto& v) { p.ep = to_positive(a, v); }},
      {"--expert-tensor-parallel-size", [&](auto& a, auto& v) { p.etp = to_positive(a, v); }},
      {"--moe-ffn-hidden-size", [&](auto& a, auto& v) { m.moe_ffn_hidden_size = to_positive(a, v); }},
      // TransformerConfig raises for a size <= 0 (transformer_config.py).
      {"--moe-shared-expert-intermediate-size",
       [&](auto& a, auto& v) { m.shared_expert_ffn_hidden_size = to_positive(a, v); }},
      {"--moe-token-dispatcher-type",
       [&](auto& a, auto& v) {
         c.moe.dispatcher = parse_moe_dispatcher(one_of(a, v, {"allgather", "alltoall", "flex"}));
         if (c.moe.dispatcher == MoeDispatcher::flex)
           c.warnings.push_back(
               fmt::format("{} flex changes memory (DeepEP / HybridEP communication buffers); the estimate counts the "
                           "all-to-all dispatcher's",
                           a));
       }},
      {"--moe-router-dtype",
       [&](auto& a, auto& v) {
         router_dtype_bytes = one_of(a, v, {"fp32", "fp64"}) == "fp32" ? 4 : 8;
       }},
      {"--muon-scalar-optimizer",
       [&](auto& a, auto& v) {
         t.muon_scalar = one_of(a, v, {"adam", "lion"}) == "adam" ? Optimizer::adam : Optimizer::sgd;
       }},
      {"--recompute-granularity",
       [&](auto& a, auto& v) {
         recompute.granularity = parse_recompute(one_of(a, v, {"full", "selective"}));
       }},
      {"--recompute-method",
       [&](auto& a, auto& v) {
         recompute.method = parse_recompute_method(one_of(a, v, {"uniform", "block"}));
       }},
      {"--recompute-num-layers", [&](auto& a, auto& v) { recompute.num_layers = to_int(a, v); }},
      {"--recompute-activation-function-num-layers",
       [&](auto& a, auto& v) {
         (void)to_positive(a, v);  // checked; the estimate recomputes the activation function in every layer
         c.warnings.push_back(
             fmt::format("{} {}: the activation function is taken as recomputed in every layer", a, v));
       }},
      {"--attention-dropout", [&](auto& a, auto& v) { attn_dropout = to_double(a, v); }},
      {"--hidden-dropout", [&](auto& a, auto& v) { hidden_dropout = to_double(a, v); }},
      {"--optimizer",
       [&](auto& a, auto& v) {
         // arguments.py's choices; dist_muon is muon with the layer-wise distributed optimizer.
         const std::string o = one_of(a, v, {"adam", "sgd", "muon", "dist_muon", "lion", "soap", "adaptive_muon"});
         if (o == "lion" || o == "soap" || o == "adaptive_muon")
           throw InvalidArgument(
               fmt::format("megatron-args: {} {}: the estimate models adam, sgd and muon only", a, o));
         if (o == "dist_muon") p.zero_stage = std::max(p.zero_stage, 1);
         t.optimizer = o == "dist_muon" ? Optimizer::muon : parse_optimizer(o);
       }},
      {"--data-parallel-sharding-strategy", [&](auto&, auto& v) { sharding = v; }},
      {"--transformer-impl", [&](auto&, auto& v) { local_impl = v == "local"; }},
      {"--attention-backend", [&](auto&, auto& v) { attention_backend = v; }},
      {"--cross-entropy-fusion-impl", [&](auto&, auto& v) { ce_impl = v; }},
      {"--wgrad-deferral-limit", [&](auto& a, auto& v) { wgrad_limit = to_int(a, v); }},
      {"--num-distributed-optimizer-instances", [&](auto& a, auto& v) { p.optimizer_instances = to_int(a, v); }},
      // TransformerConfig: num_layers_in_first/last_pipeline_stage must be larger than 0.
      {"--decoder-first-pipeline-num-layers", [&](auto& a, auto& v) { p.first_stage_layers = to_positive(a, v); }},
      {"--decoder-last-pipeline-num-layers", [&](auto& a, auto& v) { p.last_stage_layers = to_positive(a, v); }},
      // MindSpeed: Ulysses (its default in mindspeed/arguments.py) and hybrid context parallelism
      // exchange heads by all-to-all instead of the ring's key/value chunks.
      {"--context-parallel-algo",
       [&](auto& a, auto& v) {
         if (v != "megatron_cp_algo")
           c.warnings.push_back(
               fmt::format("{} {} changes memory (context-parallel attention other than Megatron's "
                           "ring); the estimate models megatron_cp_algo",
                           a, v));
       }},
      // MindSpeed swap-attention's default modules are what the estimate swaps.
      {"--swap-modules",
       [&](auto& a, auto& v) {
         if (v != "input_norm,self_attention,post_attention_norm")
           c.warnings.push_back(
               fmt::format("{} {} changes memory (other modules swapped); the estimate swaps "
                           "input_norm,self_attention,post_attention_norm",
                           a, v));
       }},
  };
  const std::map<std::string, std::function<void()>> flags{
      {"--group-query-attention", [&] { gqa = true; }},
      {"--untie-embeddings-and-output-weights", [&] { untie = true; }},
      {"--swiglu", [&] { swiglu = true; }},
      {"--disable-bias-linear", [&] { no_bias = true; }},
      {"--use-megatron-fsdp", [&] { megatron_fsdp = true; }},
      {"--add-qkv-bias", [&] { qkv_bias = true; }},
      {"--use-rotary-position-embeddings", [&] { rope = true; }},
      {"--sequence-parallel", [&] { p.sequence_parallel = true; }},
      {"--use-distributed-optimizer", [&] { p.zero_stage = std::max(p.zero_stage, 1); }},
      {"--optimizer-cpu-offload", [&] { cpu_offload = true; }},
      {"--use-precision-aware-optimizer", [] {}},  // fp32 states unless the *-dtype arguments say otherwise
      {"--bf16", [&] { bf16 = true; }},
      {"--fp16", [&] { fp16 = true; }},
      {"--accumulate-allreduce-grads-in-fp32", [&] { fp32_grads = true; }},
      {"--grad-reduce-in-bf16", [&] { bf16_grads = true; }},
      {"--recompute-activations", [&] { recompute.activations = true; }},
      {"--use-flash-attn", [&] { flash = true; }},
      {"--no-bias-swiglu-fusion", [&] { t.fused_swiglu = false; }},
      {"--recompute-activation-function", [&] { c.techniques.act_fn_recompute = true; }},
      {"--swap-attention", [&] { c.techniques.swap_attention = true; }},
      {"--reuse-fp32-param", [&] { c.techniques.shared_storage = true; }},
      {"--cross-entropy-loss-fusion", [&] { ce_fusion = true; }},
      {"--defer-embedding-wgrad-compute", [&] { defer_wgrad = true; }},
      {"--qk-layernorm", [&] { m.qk_layernorm = true; }},
      {"--multi-latent-attention", [&] { mla = true; }},
      {"--moe-grouped-gemm", [&] { grouped_gemm = true; }},
      {"--moe-shared-expert-gate", [&] { m.shared_expert_gate = true; }},
      {"--moe-router-enable-expert-bias", [&] { m.router_expert_bias = true; }},
      {"--moe-shared-expert-overlap", [&] { c.moe.shared_expert_overlap = true; }},
      {"--account-for-embedding-in-pipeline-split", [&] { p.embedding_as_layer = true; }},
      {"--account-for-loss-in-pipeline-split", [&] { p.loss_as_layer = true; }},
      {"--overlap-moe-expert-parallel-comm", [&] { p.combined_1f1b = true; }},
  };
  // The values that follow an argument the estimate does not read: everything up to the next "--".
  auto skip_values = [&](std::size_t& i, bool inline_value) {
    std::string skipped = args[i];
    while (!inline_value && i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) skipped += " " + args[++i];
    return skipped;
  };
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    std::string name = arg, value;
    const bool inline_value = arg.rfind("--", 0) == 0 && arg.find('=') != std::string::npos;
    if (inline_value) {
      name = arg.substr(0, arg.find('='));
      value = arg.substr(arg.find('=') + 1);
    }
    if (name.rfind("--", 0) != 0)
      throw InvalidArgument(fmt::format("megatron-args: '{}' is not an argument (arguments start with --)", arg));
    if (name == "--recompute-modules") {  // nargs '+': the values up to the next argument
      std::vector<std::string> names;
      if (inline_value) names.push_back(value);
      while (!inline_value && i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) names.push_back(args[++i]);
      if (names.empty()) throw InvalidArgument("megatron-args: --recompute-modules needs at least one module");
      recompute.modules = std::move(names);
      report.modelled.push_back(name);
    } else if (auto it = with_value.find(name); it != with_value.end()) {
      if (!inline_value) {
        if (i + 1 >= args.size() || args[i + 1].rfind("--", 0) == 0)
          throw InvalidArgument(fmt::format("megatron-args: {} needs a value", name));
        value = args[++i];
      }
      it->second(name, value);
      report.modelled.push_back(name);
    } else if (auto f = flags.find(name); f != flags.end()) {
      if (inline_value)  // argparse's store_true takes no value
        throw InvalidArgument(
            fmt::format("megatron-args: {} is a flag and takes no value (got '{}'); "
                        "Megatron-LM's parser refuses it too",
                        name, arg));
      f->second();
      report.modelled.push_back(name);
    } else if (const auto why = unmodelled_argument(name); !why.empty()) {
      report.unmodelled.push_back(skip_values(i, inline_value));
      c.warnings.push_back(fmt::format("{} changes memory ({}); the estimate does not model it", name, why));
    } else if (is_megatron_argument(name) || is_mindspeed_argument(name)) {
      report.no_effect.push_back(skip_values(i, inline_value));
    } else if (unknown == UnknownArguments::ignore) {
      report.unknown.push_back(skip_values(i, inline_value));
    } else {
      const std::string_view now = renamed(name);
      const std::string near = now.empty() ? nearest_launch_argument(name) : std::string(now);
      throw InvalidArgument(
          fmt::format("megatron-args: unknown argument '{}'{}; --ignore-unknown-megatron-args skips arguments "
                      "neither Megatron-LM nor MindSpeed has",
                      name,
                      !now.empty()   ? fmt::format(" (Megatron-LM has no such flag; use '{}')", now)
                      : near.empty() ? ""
                                     : fmt::format(" (did you mean '{}'?)", near)));
    }
  }
  check_megatron_rules(args, p);
  // The batch grows during training (values of their own, read as no effect on memory): the
  // estimate takes one step's micro-batches.
  t.batch_schedule = std::any_of(args.begin(), args.end(), [](const std::string& a) {
    const std::string name = a.substr(0, a.find('='));
    return name == "--rampup-batch-size" || name == "--step-batch-size-schedule";
  });
  if (t.batch_schedule)
    c.notes.push_back(
        fmt::format("megatron-args: a batch-size schedule changes the micro-batches per step; estimated "
                    "at {} a step (pass --grad-accum for another step)",
                    t.grad_accumulation));
  // The hybrid device optimizer (optimizer/__init__.py) steps that fraction of the parameters on the
  // host, their fp32 master and moments there: all of them is stowage's mapped offload (the
  // device keeps the 16-bit weights and the main gradients).
  if (cpu_offload && offload_fraction == 1.0) {
    c.techniques.optimizer_offload = OffloadMode::mapped;
  } else if (cpu_offload && offload_fraction > 0.0) {
    c.warnings.push_back(
        fmt::format("--optimizer-offload-fraction {} changes memory (part of the optimizer states "
                    "on the host); the estimate models 0 and 1 only",
                    offload_fraction));
  } else if (cpu_offload) {
    c.notes.push_back(
        "megatron-args: --optimizer-cpu-offload with --optimizer-offload-fraction 0 (the default) "
        "keeps every optimizer state on the device");
  }
  if (gqa) m.num_kv_heads = query_groups > 0 ? query_groups : 1;  // arguments.py: --num-query-groups defaults to 1
  else if (query_groups > 0)  // Megatron-LM reads it only with --group-query-attention
    c.notes.push_back(fmt::format(
        "megatron-args: --num-query-groups {} without --group-query-attention is ignored, as Megatron-LM ignores it",
        query_groups));
  // Dropout is the run's, not the checkpoint's: Megatron trains with 0.1 unless the line says.
  m.dropout = hidden_dropout.value_or(0.1) > 0;
  m.attention_dropout = attn_dropout.value_or(0.1) > 0;
  if (model_given) {  // only what the arguments say
    // A line that sets the heads without grouped-query attention is multi-head in Megatron, and
    // one that sets the hidden size or SwiGLU without an ffn size gets Megatron's (below).
    if (heads_given && !gqa) m.num_kv_heads = 0;
    if ((hidden_given || swiglu) && !ffn_given) m.ffn_hidden_size = 0;
    if (untie) m.tie_embeddings = false;
    if (swiglu) m.gated_mlp = true;
    if (rmsnorm) m.rms_norm = *rmsnorm;
    if (no_bias) m.set_linear_bias(false);
    if (rope) m.learned_positions = *rope ? 0 : max_positions.value_or(m.learned_positions);
    else if (max_positions && m.learned_positions > 0) m.learned_positions = *max_positions;
  } else {
    if (!gqa) m.num_kv_heads = 0;
    m.tie_embeddings = !untie;
    m.gated_mlp = swiglu;
    m.rms_norm = rmsnorm.value_or(false);
    m.set_linear_bias(!no_bias);
    m.learned_positions = rope.value_or(false) ? 0 : max_positions.value_or(0);
  }
  if (qkv_bias) m.qkv_bias = true;  // with --disable-bias-linear, q, k and v keep theirs (Qwen2)
  // arguments.py: MTP takes rope or none (learned_absolute, Megatron's default, is refused by the
  // model's own check).
  if (m.mtp_layers > 0 && !position_type.empty() && position_type != "rope" && position_type != "none" &&
      position_type != "learned_absolute")
    throw InvalidArgument(fmt::format(
        "megatron-args: --mtp-num-layers with --position-embedding-type {} (Megatron-LM supports rope and none only)",
        position_type));
  // Megatron-FSDP shards what its strategy names across the data-parallel ranks, as ZeRO's stages
  // do (its documentation: optim_grads_params is ZeRO-3), gathering each layer's weights in turn.
  if (megatron_fsdp) {
    static const std::map<std::string, int> stages{
        {"no_shard", 0}, {"optim", 1}, {"optim_grads", 2}, {"optim_grads_params", 3}};
    const auto it = stages.find(sharding);
    if (it == stages.end())
      throw InvalidArgument(
          fmt::format("megatron-args: --data-parallel-sharding-strategy '{}' is not no_shard, optim, "
                      "optim_grads or optim_grads_params",
                      sharding));
    p.zero_stage = std::max(p.zero_stage, it->second);
  }
  // Megatron-LM arguments.py: without --ffn-hidden-size, 4h, or for SwiGLU int(4h·2/3 / 64)·64
  // (two fc1 projections; a multiple of 64 keeps parameters near the 4h MLP's).
  if (m.ffn_hidden_size == 0 && m.hidden_size > 0)
    m.ffn_hidden_size = m.gated_mlp ? static_cast<std::int64_t>(4.0 * double(m.hidden_size) * 2.0 / 3.0 / 64.0) * 64
                                    : 4 * m.hidden_size;
  if (mla) {  // a model given keeps its own latent sizes unless the line sets them
    const bool had = m.mla;
    m.mla = true;
    m.q_lora_rank = q_lora.value_or(had ? m.q_lora_rank : 0);
    m.kv_lora_rank = kv_lora.value_or(had ? m.kv_lora_rank : 32);
    m.qk_head_dim = qk_head.value_or(had ? m.qk_head_dim : 128);
    m.qk_rope_head_dim = qk_pos.value_or(had ? m.qk_rope_head_dim : 64);
    m.v_head_dim = v_head.value_or(had ? m.v_head_dim : 128);
    // mla_qk_norm_config.py: --qk-layernorm fuses a norm into linear_q_proj without --q-lora-rank.
    m.mla_q_input_norm = m.qk_layernorm && m.q_lora_rank == 0;
    // The local spec builds the down projections column-parallel (gpt_layer_specs.py
    // get_gpt_layer_local_spec), TransformerEngine's duplicates them on every TP rank.
    if (local_impl)
      c.warnings.push_back(
          "megatron-args: --multi-latent-attention with --transformer-impl local splits the down projections by "
          "TP; estimated as TransformerEngine's, whole on every rank");
  } else if (q_lora || kv_lora || qk_head || qk_pos || v_head) {
    c.notes.push_back(
        "megatron-args: MLA sizes without --multi-latent-attention are ignored, as Megatron-LM builds standard "
        "attention");
  }
  apply_virtual_stages(virtual_stages, c);
  apply_recompute(recompute, grouped_gemm, c);
  apply_experts(m, topk_given, c.notes);
  apply_moe_layer_freq(moe_layer_freq, m, c.notes);
  check_sequence(c, max_positions, seq_given, cp_given);
  if (fp16 && bf16) throw InvalidArgument("megatron-args: --bf16 and --fp16 together (Megatron-LM refuses them too)");
  if (fp16) t.precision = Precision::fp16;
  if (bf16) t.precision = Precision::bf16;
  if (!bf16 && !fp16) t.precision = Precision::fp32;
  // Megatron-LM turns on accumulate_allreduce_grads_in_fp32 with --bf16 unless --grad-reduce-in-bf16
  // turns it off (arguments.py, even when the line asks for it), so its gradient buffers hold fp32
  // main grads: 4 B/param, or bf16's 2; fp16 keeps 2-byte grads unless asked.
  const bool fp32_main_grads = bf16 ? !bf16_grads : fp32_grads;
  t.grad_bytes = (fp32_main_grads || t.precision == Precision::fp32) ? 4 : 2;
  p.accounting = Accounting::megatron;
  // Attention: TransformerEngine (the default implementation) picks flash or cuDNN fused
  // attention (--attention-backend auto/flash/fused): no s² scores. `unfused` and `local`, and
  // the local implementation without --use-flash-attn (MindSpeed's fused attention), store the
  // s×s softmax (and dropout).
  // TransformerEngine's flash and cuDNN fused attention take 16-bit inputs only: fp32 training
  // runs its unfused attention under `auto`, and no backend is left under `flash` or `fused`.
  const bool te_fused = !local_impl && t.precision != Precision::fp32;
  if (!local_impl && t.precision == Precision::fp32 && (attention_backend == "flash" || attention_backend == "fused"))
    throw InvalidArgument(fmt::format(
        "megatron-args: --attention-backend {} in fp32 training (neither --bf16 nor --fp16): TransformerEngine "
        "has no fp32 {} attention kernel; use auto or unfused",
        attention_backend, attention_backend));
  const bool unfused_backend = attention_backend == "unfused" || attention_backend == "local";
  t.flash_attention = !unfused_backend && (local_impl ? flash : te_fused);
  // TransformerEngine's own cuBLAS workspace (32 MiB on Hopper); the local implementation has none.
  c.framework.te_workspace = local_impl ? 0 : std::int64_t{32} << 20;
  t.fused_norms = !local_impl;
  apply_moe_runtime(c, grouped_gemm && !local_impl, router_dtype_bytes);
  if (p.combined_1f1b) check_combined_1f1b(recompute, c);
  if (global_batch > 0) t.global_batch = global_batch;
  if (ce_fusion && ce_impl == "native") t.loss_bytes_per_logit = 10.0;
  else if (ce_fusion)
    c.warnings.push_back(
        fmt::format("--cross-entropy-fusion-impl {}: the estimate models the native fused loss only", ce_impl));
  if (wgrad_limit < 0) throw InvalidArgument("megatron-args: --wgrad-deferral-limit must not be negative");
  // 0 defers every micro-batch of the step; the global batch fixes how many that is (finalize).
  if (defer_wgrad) t.deferred_wgrad_microbatches = wgrad_limit > 0 ? wgrad_limit : std::int64_t{1} << 30;
  if (m.vocab_size == 0 && gpt2_bpe) {
    m.vocab_size = 50257;  // GPT-2's byte-pair vocabulary (Radford et al. 2019)
    c.notes.push_back("megatron-args: GPT-2 BPE tokenizer, vocabulary 50257");
  } else if (m.vocab_size == 0 && !tokenizer.empty()) {
    // A tokenizer's vocabulary (Llama 3's 128256, Qwen's 151936 ...) sizes the embedding, the output
    // layer and the loss's logits: a guess there is a memory the estimate does not know.
    m.vocab_size = 32000;
    c.warnings.push_back(fmt::format(
        "--tokenizer-type {} gives the vocabulary, which the estimate cannot read; assumed 32000 (pass --vocab-size)",
        tokenizer));
  } else if (m.vocab_size == 0) {
    m.vocab_size = 32000;
    c.notes.push_back("megatron-args give no vocabulary size; assumed 32000 (pass --vocab-size)");
  }
  if (!report.no_effect.empty())
    c.notes.push_back(fmt::format("{} Megatron arguments accepted without effect on memory", report.no_effect.size()));
  if (!report.unknown.empty())
    c.notes.push_back(fmt::format("ignored unknown arguments: {}", fmt::join(report.unknown, " ")));
  return report;
}

}  // namespace stowage::estimate
