#include "tools/estimate/megatron_recompute.hpp"

#include <fmt/format.h>

#include <string_view>

#include "stowage/error.hpp"

namespace stowage::estimate {

namespace {

void refuse_selective_extras(const LineRecompute& r, std::string_view how) {
  if (r.method)
    throw InvalidArgument(
        fmt::format("megatron-args: --recompute-method {} with {}: Megatron-LM takes no method for selective recompute",
                    to_string(*r.method), how));
  if (r.num_layers)
    throw InvalidArgument(fmt::format(
        "megatron-args: --recompute-num-layers {} with {}: Megatron-LM takes no layer count for selective recompute",
        *r.num_layers, how));
}

// Full recompute needs a method and a layer count (TransformerConfig raises ValueError without).
// Megatron's block method recomputes layers with index < n (recompute.py), so n = 0 recomputes
// none; uniform with n = 0 never advances its loop.
void apply_full_recompute(const LineRecompute& r, RunConfig& c) {
  if (!r.method)
    throw InvalidArgument(
        "megatron-args: --recompute-granularity full needs --recompute-method block or uniform (Megatron-LM refuses "
        "it without)");
  if (!r.num_layers)
    throw InvalidArgument(
        "megatron-args: --recompute-granularity full needs --recompute-num-layers (Megatron-LM refuses it without)");
  if (*r.method == RecomputeMethod::uniform && *r.num_layers == 0)
    throw InvalidArgument(
        "megatron-args: --recompute-method uniform with --recompute-num-layers 0: a chunk needs at least 1 layer");
  c.recompute.method = *r.method;
  c.recompute.num_layers = *r.num_layers;
  if (*r.method == RecomputeMethod::block && *r.num_layers == 0) {
    c.recompute.granularity = Recompute::none;  // stowage's own num_layers 0 would mean every layer
    c.notes.push_back(
        "megatron-args: --recompute-method block --recompute-num-layers 0 recomputes no layer (Megatron-LM); "
        "estimated without recompute");
    return;
  }
  c.recompute.granularity = Recompute::full;
}

// --recompute-modules: TransformerConfig checks each name, and what moe_act, mla_up_proj and
// shared_experts need, only under selective granularity; elsewhere the list is not read.
void apply_recompute_modules(const std::vector<std::string>& names, bool grouped_gemm, RunConfig& c) {
  unsigned bits = 0;
  for (const std::string& n : names) {
    if (n == "gdn_norm_out" || n == "gdp_in_proj" || n == "gdp_qkv" || n == "mhc") {
      c.warnings.push_back(fmt::format(
          "--recompute-modules {} recomputes part of a gated delta net or of hyper-connections, which the estimate "
          "does not build; ignored",
          n));
      continue;
    }
    try {
      bits |= parse_recompute_module(n);
    } catch (const InvalidArgument&) {
      throw InvalidArgument(fmt::format(
          "megatron-args: --recompute-modules: invalid module '{}' (Megatron-LM allows {} gdn_norm_out gdp_in_proj "
          "gdp_qkv mhc)",
          n, recompute_modules_string(~0u)));
    }
  }
  if ((bits & RecomputeModule::moe_act) != 0 && !grouped_gemm)
    throw InvalidArgument(
        "megatron-args: --recompute-modules moe_act needs --moe-grouped-gemm (Megatron-LM refuses it without)");
  if ((bits & RecomputeModule::mla_up_proj) != 0 && !c.model.mla)
    throw InvalidArgument(
        "megatron-args: --recompute-modules mla_up_proj needs --multi-latent-attention (Megatron-LM refuses it "
        "without)");
  if ((bits & RecomputeModule::shared_experts) != 0 && c.model.shared_expert_ffn_hidden_size > 0 &&
      c.moe.shared_expert_overlap)
    throw InvalidArgument(
        "megatron-args: --recompute-modules shared_experts with --moe-shared-expert-overlap (Megatron-LM refuses "
        "them together)");
  c.recompute.modules = bits;
}

}  // namespace

void apply_recompute(const LineRecompute& r, bool grouped_gemm, RunConfig& c) {
  if (r.num_layers && *r.num_layers < 0)
    throw InvalidArgument(
        fmt::format("megatron-args: --recompute-num-layers must not be negative, got {}", *r.num_layers));
  // arguments.py: --recompute-activations sets selective granularity, whatever else the line says.
  const std::optional<Recompute> g = r.activations ? Recompute::selective : r.granularity;
  if (!g) {  // no granularity: Megatron recomputes nothing; the counts still feed MindSpeed's act-fn recompute
    if (r.method) c.recompute.method = *r.method;
    if (r.num_layers) c.recompute.num_layers = *r.num_layers;
    if (r.modules)
      c.notes.push_back(
          "megatron-args: --recompute-modules has no effect without selective recompute (Megatron-LM reads it only "
          "then)");
    return;
  }
  if (*g == Recompute::selective) {
    refuse_selective_extras(r, r.activations ? "--recompute-activations" : "--recompute-granularity selective");
    c.recompute.granularity = Recompute::selective;
    if (r.modules) apply_recompute_modules(*r.modules, grouped_gemm, c);
    return;
  }
  if (r.modules)
    c.notes.push_back(
        "megatron-args: --recompute-modules has no effect without selective recompute (Megatron-LM reads it only "
        "then)");
  apply_full_recompute(r, c);
}

}  // namespace stowage::estimate
