#include "tools/estimate/report.hpp"

#include <fmt/format.h>

#include "stowage/byte_size.hpp"

namespace stowage::estimate {

nlohmann::json to_json(const StageMemory& m) {
  nlohmann::json acts = nlohmann::json::object();
  for (const auto& a : m.activations) acts[a.name] = a.bytes;
  return {{"stage", m.stage},
          {"layers", m.layers},
          {"mtp_layers", m.mtp_layers},
          {"microbatches_in_flight", m.microbatches_in_flight},
          {"parameters", m.parameters},
          {"weights", m.weights},
          {"gradients", m.gradients},
          {"optimizer_states", m.optimizer_states},
          {"activations", acts},
          {"activations_total", m.activation_total()},
          {"communication", m.communication},
          {"framework", m.framework},
          {"optimizer_step", m.optimizer_step},
          {"optimizer_step_beyond_activations", m.optimizer_step_beyond_activations},
          {"allocator_overhead", m.allocator_overhead},
          {"peak_allocated", m.peak_allocated},
          {"peak_reserved", m.peak_reserved},
          {"host_bytes", m.host_bytes}};
}

nlohmann::json to_json(const EstimateResult& r) {
  const auto& c = r.config;
  const auto& m = c.model;
  nlohmann::json j;
  j["schema"] = "stowage.estimate/1";
  j["model"] = {{"name", m.name},
                {"hidden_size", m.hidden_size},
                {"num_layers", m.num_layers},
                {"num_attention_heads", m.num_heads},
                {"num_key_value_heads", m.kv_heads()},
                {"ffn_hidden_size", m.ffn_hidden_size},
                {"vocab_size", m.vocab_size},
                {"num_experts", m.num_experts},
                {"experts_per_token", m.experts_per_token},
                {"shared_expert_ffn_hidden_size", m.shared_experts() ? m.shared_expert_ffn_hidden_size : 0},
                {"moe_layers", m.moe_layers(0, m.num_layers)},
                {"mtp_layers", m.mtp_layers},
                {"parameters", count_parameters(m, m.vocab_size).total()}};
  j["training"] = {{"seq_length", c.training.seq_length},
                   {"micro_batch", c.training.micro_batch},
                   {"grad_accumulation", c.training.grad_accumulation},
                   {"precision", to_string(c.training.precision)},
                   {"optimizer", to_string(c.training.optimizer)},
                   {"flash_attention", c.training.flash_attention}};
  j["parallelism"] = {{"tp", c.parallel.tp},
                      {"pp", c.parallel.pp},
                      {"vpp", c.parallel.vpp},
                      {"dp", c.parallel.dp},
                      {"cp", c.parallel.cp},
                      {"ep", c.parallel.ep},
                      {"etp", c.parallel.expert_tp()},
                      {"sequence_parallel", c.parallel.sequence_parallel},
                      {"zero_stage", c.parallel.zero_stage},
                      {"accounting", to_string(c.parallel.accounting)}};
  j["recompute"] = {{"granularity", to_string(c.recompute.granularity)},
                    {"method", to_string(c.recompute.method)},
                    {"num_layers", c.recompute.num_layers}};
  if (c.recompute.granularity == Recompute::selective) {
    nlohmann::json modules = nlohmann::json::array();
    for (unsigned bit = 1; bit <= RecomputeModule::shared_experts; bit <<= 1)
      if ((c.recompute.modules & bit) != 0) modules.push_back(recompute_modules_string(bit));
    j["recompute"]["modules"] = modules;
  }
  j["techniques"] = {{"shared_storage", c.techniques.shared_storage},
                     {"rounding", to_string(c.techniques.rounding)},
                     {"act_fn_recompute", c.techniques.act_fn_recompute},
                     {"swap_attention", c.techniques.swap_attention},
                     {"prefetch_window", c.techniques.prefetch_window},
                     {"optimizer_offload", to_string(c.techniques.optimizer_offload)}};
  j["allocator_overhead_fraction"] = c.allocator_overhead;
  j["framework"] = {{"cublas_workspace", c.framework.cublas_workspace},
                    {"cublas_workspaces", c.framework.cublas_workspaces},
                    {"te_workspace", c.framework.te_workspace},
                    {"te_grouped_gemm_workspaces", c.framework.te_grouped_gemm_workspaces}};
  j["per_device"] = to_json(r.configured);
  j["predicted_peak_allocated_bytes"] = r.configured.peak_allocated;
  j["baseline"] = to_json(r.baseline);
  nlohmann::json savings = nlohmann::json::array();
  for (const auto& v : r.alone)
    savings.push_back({{"technique", v.name}, {"peak_reserved", v.memory.peak_reserved}, {"saving", v.saving}});
  savings.push_back({{"technique", "all"}, {"peak_reserved", r.all.memory.peak_reserved}, {"saving", r.all.saving}});
  j["savings"] = savings;
  j["notes"] = c.notes;
  j["warnings"] = c.warnings;
  return j;
}

std::string to_table(const EstimateResult& r) {
  const auto& c = r.config;
  const auto& m = r.configured;
  std::string out;
  out += fmt::format(
      "model {}: {} layers{}, hidden {}, heads {}/{}, ffn {}, vocab {}{}\n", c.model.name, c.model.num_layers,
      c.model.mtp_layers > 0 ? fmt::format(" + {} MTP", c.model.mtp_layers) : "", c.model.hidden_size,
      c.model.num_heads, c.model.kv_heads(), c.model.ffn_hidden_size, c.model.vocab_size,
      c.model.moe()
          ? fmt::format(
                ", {} experts top-{}{}{}", c.model.num_experts, c.model.experts_per_token,
                c.model.shared_experts() ? fmt::format(", shared experts {}", c.model.shared_expert_ffn_hidden_size)
                                         : "",
                c.model.mixed_layers() ? fmt::format(" in {} of the {} layers (the others dense)",
                                                     c.model.moe_layers(0, c.model.num_layers), c.model.num_layers)
                                       : "")
          : "");
  out += fmt::format(
      "seq {} × micro-batch {}, {} micro-batches; TP {} PP {}{} DP {} CP {} EP {}{}; ZeRO {}; recompute {}\n",
      c.training.seq_length, c.training.micro_batch, c.training.grad_accumulation, c.parallel.tp, c.parallel.pp,
      c.parallel.vpp > 1 ? fmt::format(" (×{} virtual)", c.parallel.vpp) : "", c.parallel.dp, c.parallel.cp,
      c.parallel.ep, c.parallel.sequence_parallel ? " +SP" : "", c.parallel.zero_stage,
      c.recompute.granularity == Recompute::selective
          ? fmt::format("selective ({})", recompute_modules_string(c.recompute.modules))
          : to_string(c.recompute.granularity));
  out += fmt::format("per device, pipeline stage {} ({} layers{}, {:.2f} micro-batches in flight, {} parameters):\n",
                     m.stage, m.layers, m.mtp_layers > 0 ? fmt::format(" + {} MTP", m.mtp_layers) : "",
                     m.microbatches_in_flight, m.parameters);
  auto row = [&](const std::string& name, std::int64_t a, std::int64_t b) {
    out += fmt::format("  {:<36}{:>14}{:>14}\n", name, format_bytes(a), format_bytes(b));
  };
  out += fmt::format("  {:<36}{:>14}{:>14}\n", "", "configured", "no stowage");
  row("weights", m.weights, r.baseline.weights);
  row("gradients", m.gradients, r.baseline.gradients);
  row("optimizer states", m.optimizer_states, r.baseline.optimizer_states);
  for (std::size_t i = 0; i < m.activations.size(); ++i)
    if (m.activations[i].bytes || r.baseline.activations[i].bytes)
      row("activations: " + m.activations[i].name, m.activations[i].bytes, r.baseline.activations[i].bytes);
  row("communication buffers", m.communication, r.baseline.communication);
  row("framework workspaces", m.framework, r.baseline.framework);
  if (m.optimizer_step || r.baseline.optimizer_step)
    row("optimizer step beyond activations", m.optimizer_step_beyond_activations,
        r.baseline.optimizer_step_beyond_activations);
  row("peak allocated", m.peak_allocated, r.baseline.peak_allocated);
  row("allocator overhead", m.allocator_overhead, r.baseline.allocator_overhead);
  row("peak reserved", m.peak_reserved, r.baseline.peak_reserved);
  row("host memory", m.host_bytes, r.baseline.host_bytes);
  out += "saving against no stowage technique (peak reserved):\n";
  for (const auto& v : r.alone) out += fmt::format("  {:<36}{:>14}\n", v.name, format_bytes(v.saving));
  out += fmt::format("  {:<36}{:>14}\n", "all together", format_bytes(r.all.saving));
  for (const auto& n : c.notes) out += "note: " + n + "\n";
  for (const auto& w : c.warnings) out += "warning: " + w + "\n";
  return out;
}

}  // namespace stowage::estimate
