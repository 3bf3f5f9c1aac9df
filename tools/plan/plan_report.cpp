#include "tools/plan/plan_report.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "stowage/byte_size.hpp"
#include "tools/common/svg.hpp"
#include "tools/estimate/moe_layer_freq.hpp"

namespace stowage::plan {

using estimate::OffloadMode;
using estimate::Recompute;
using estimate::RunConfig;

namespace {

struct Component {
  const char* name;
  const char* color;
  double StepTime::*field;
};
const Component kComponents[] = {
    {"compute", "#4e79a7", &StepTime::compute}, {"recompute", "#f28e2b", &StepTime::recompute},
    {"tp_comm", "#e15759", &StepTime::tp_comm}, {"cp_comm", "#76b7b2", &StepTime::cp_comm},
    {"ep_comm", "#86bcb6", &StepTime::ep_comm}, {"pp_bubble", "#59a14f", &StepTime::pp_bubble},
    {"pp_comm", "#edc948", &StepTime::pp_comm}, {"dp_comm", "#b07aa1", &StepTime::dp_comm},
    {"swap", "#ff9da7", &StepTime::swap},       {"optimizer", "#9c755f", &StepTime::optimizer},
};

std::string layout(const RunConfig& c) {
  const auto& p = c.parallel;
  std::string s = fmt::format("TP{} PP{}", p.tp, p.pp);
  if (p.vpp > 1) s += fmt::format("x{}", p.vpp);
  if (p.own_end_stages()) s += fmt::format(" first{} last{}", p.first_stage_layers, p.last_stage_layers);
  s += fmt::format(" DP{}", p.dp);
  if (p.cp > 1) s += fmt::format(" CP{}", p.cp);
  if (p.ep > 1) s += fmt::format(" EP{}", p.ep);
  if (p.etp > 0 && p.etp != p.tp) s += fmt::format(" ETP{}", p.etp);
  s += p.zero_stage == 0 ? "" : p.zero_stage == 3 ? " FSDP" : " DistOpt";
  s += fmt::format(" mb{}", c.training.micro_batch);
  return s;
}

std::string techniques(const RunConfig& c) {
  std::vector<std::string> t;
  const std::int64_t chunk = c.model.num_layers / (c.parallel.pp * c.parallel.vpp);
  if (c.recompute.granularity == Recompute::full)
    t.push_back(
        fmt::format("full recompute {}/{} layers", c.recompute.num_layers ? c.recompute.num_layers : chunk, chunk));
  if (c.recompute.granularity == Recompute::selective) t.push_back("selective recompute");
  if (c.techniques.act_fn_recompute) t.push_back("act-fn recompute");
  if (c.techniques.swap_attention) t.push_back(fmt::format("swap attention (keep {})", c.techniques.prefetch_window));
  if (c.techniques.optimizer_offload != OffloadMode::none) t.push_back("optimizer offload");
  if (c.techniques.shared_storage) t.push_back("shared storage");
  if (t.empty()) return "-";
  std::string s;
  for (const auto& x : t) s += (s.empty() ? "" : ", ") + x;
  return s;
}

nlohmann::json plan_json(const Plan& p) {
  const auto& c = p.config;
  nlohmann::json time = nlohmann::json::object();
  for (const auto& k : kComponents) time[k.name] = p.time.*k.field;
  time["total"] = p.time.total();
  return {{"tp", c.parallel.tp},
          {"pp", c.parallel.pp},
          {"vpp", c.parallel.vpp},
          {"dp", c.parallel.dp},
          {"cp", c.parallel.cp},
          {"ep", c.parallel.ep},
          {"sequence_parallel", c.parallel.sequence_parallel},
          {"zero_stage", c.parallel.zero_stage},
          {"micro_batch", c.training.micro_batch},
          {"grad_accumulation", c.training.grad_accumulation},
          {"recompute",
           {{"granularity", to_string(c.recompute.granularity)},
            {"method", to_string(c.recompute.method)},
            {"num_layers", c.recompute.num_layers}}},
          {"act_fn_recompute", c.techniques.act_fn_recompute},
          {"swap_attention", c.techniques.swap_attention},
          {"swap_resident_layers", c.techniques.swap_attention ? c.techniques.prefetch_window : 0},
          {"optimizer_offload", to_string(c.techniques.optimizer_offload)},
          {"shared_storage", c.techniques.shared_storage},
          {"memory",
           {{"stage", p.memory.stage},
            {"weights", p.memory.weights},
            {"gradients", p.memory.gradients},
            {"optimizer_states", p.memory.optimizer_states},
            {"activations", p.memory.activation_total()},
            {"communication", p.memory.communication},
            {"framework", p.memory.framework},
            {"peak_allocated", p.memory.peak_allocated},
            {"peak_reserved", p.memory.peak_reserved},
            {"host_bytes", p.memory.host_bytes}}},
          {"time_seconds", time},
          {"model_tflops_per_gpu", p.model_tflops_per_gpu},
          {"megatron_args", megatron_arguments(c)}};
}

}  // namespace

std::string megatron_arguments(const RunConfig& c) {
  const auto& m = c.model;
  const auto& p = c.parallel;
  std::vector<std::string> a{
      fmt::format("--num-layers {}", m.num_layers),
      fmt::format("--hidden-size {}", m.hidden_size),
      fmt::format("--ffn-hidden-size {}", m.ffn_hidden_size),
      fmt::format("--num-attention-heads {}", m.num_heads),
  };
  if (m.kv_heads() != m.num_heads)
    a.push_back(fmt::format("--group-query-attention --num-query-groups {}", m.kv_heads()));
  if (m.head_dim > 0) a.push_back(fmt::format("--kv-channels {}", m.head_dim));
  if (m.gated_mlp) a.push_back("--swiglu");
  if (m.rms_norm) a.push_back("--normalization RMSNorm");
  if (m.qk_layernorm) a.push_back("--qk-layernorm");
  if (m.mla) {
    a.push_back(
        fmt::format("--multi-latent-attention --kv-lora-rank {} --qk-head-dim {} --qk-pos-emb-head-dim {} "
                    "--v-head-dim {}",
                    m.kv_lora_rank, m.qk_head_dim, m.qk_rope_head_dim, m.v_head_dim));
    if (m.q_lora_rank > 0) a.push_back(fmt::format("--q-lora-rank {}", m.q_lora_rank));
  }
  if (!m.linear_bias()) a.push_back("--disable-bias-linear");
  if (!m.linear_bias() && m.qkv_bias) a.push_back("--add-qkv-bias");
  if (!m.tie_embeddings) a.push_back("--untie-embeddings-and-output-weights");
  // Megatron-LM requires --max-position-embeddings, at least the sequence; with RoPE it sizes
  // nothing that the estimate counts.
  if (m.learned_positions) a.push_back(fmt::format("--max-position-embeddings {}", m.learned_positions));
  else a.push_back(fmt::format("--position-embedding-type rope --max-position-embeddings {}", c.training.seq_length));
  if (!m.dropout) a.push_back("--hidden-dropout 0.0");
  if (!m.attention_dropout) a.push_back("--attention-dropout 0.0");
  if (m.moe()) a.push_back(fmt::format("--num-experts {} --moe-router-topk {}", m.num_experts, m.experts_per_token));
  if (m.moe() && m.moe_ffn_hidden_size > 0) a.push_back(fmt::format("--moe-ffn-hidden-size {}", m.moe_ffn_hidden_size));
  if (m.moe() && !m.moe_layer_pattern.empty())
    a.push_back("--moe-layer-freq " + estimate::moe_layer_freq_argument(m.moe_layer_pattern));
  if (m.shared_experts())
    a.push_back(fmt::format("--moe-shared-expert-intermediate-size {}", m.shared_expert_ffn_hidden_size));
  if (m.shared_experts() && m.shared_expert_gate) a.push_back("--moe-shared-expert-gate");
  // Megatron refuses the expert bias with its default softmax scores (transformer_config.py);
  // the models that have the bias (DeepSeek-V3, Kimi K2) score with a sigmoid.
  if (m.moe() && m.router_expert_bias)
    a.push_back("--moe-router-score-function sigmoid --moe-router-enable-expert-bias");
  if (m.moe() && c.moe.dispatcher != estimate::MoeDispatcher::allgather)
    a.push_back(fmt::format("--moe-token-dispatcher-type {}", to_string(c.moe.dispatcher)));
  if (m.shared_experts() && c.moe.shared_expert_overlap) a.push_back("--moe-shared-expert-overlap");
  if (m.mtp_layers > 0) a.push_back(fmt::format("--mtp-num-layers {}", m.mtp_layers));
  a.push_back(fmt::format("--vocab-size {}", m.vocab_size));
  a.push_back(fmt::format("--seq-length {}", c.training.seq_length));
  a.push_back(fmt::format("--micro-batch-size {}", c.training.micro_batch));
  if (c.training.global_batch > 0) a.push_back(fmt::format("--global-batch-size {}", c.training.global_batch));
  a.push_back(c.training.precision == estimate::Precision::fp16   ? "--fp16"
              : c.training.precision == estimate::Precision::bf16 ? "--bf16"
                                                                  : "");
  a.push_back(fmt::format("--tensor-model-parallel-size {}", p.tp));
  if (p.sequence_parallel) a.push_back("--sequence-parallel");
  a.push_back(fmt::format("--pipeline-model-parallel-size {}", p.pp));
  // Megatron-LM takes an uneven first/last stage with virtual stages per rank, not layers per
  // virtual stage (arguments.py).
  if (p.first_stage_layers > 0)
    a.push_back(fmt::format("--decoder-first-pipeline-num-layers {}", p.first_stage_layers));
  if (p.last_stage_layers > 0) a.push_back(fmt::format("--decoder-last-pipeline-num-layers {}", p.last_stage_layers));
  if (p.vpp > 1 && p.own_end_stages()) a.push_back(fmt::format("--num-virtual-stages-per-pipeline-rank {}", p.vpp));
  else if (p.vpp > 1)
    a.push_back(fmt::format("--num-layers-per-virtual-pipeline-stage {}", m.num_layers / (p.pp * p.vpp)));
  if (p.cp > 1) a.push_back(fmt::format("--context-parallel-size {}", p.cp));
  if (p.ep > 1) a.push_back(fmt::format("--expert-model-parallel-size {}", p.ep));
  if (p.etp > 0) a.push_back(fmt::format("--expert-tensor-parallel-size {}", p.etp));
  if (p.zero_stage == 3) a.push_back("--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params");
  // --overlap-param-gather needs --overlap-grad-reduce, which needs data parallelism to reduce over.
  else if (p.zero_stage >= 1)
    a.push_back(p.dp * p.cp > 1 ? "--use-distributed-optimizer --overlap-param-gather" : "--use-distributed-optimizer");
  if (p.dp * p.cp > 1) a.push_back("--overlap-grad-reduce");
  if (c.recompute.granularity == Recompute::full)
    a.push_back(fmt::format("--recompute-granularity full --recompute-method {} --recompute-num-layers {}",
                            to_string(c.recompute.method), c.recompute.num_layers));
  else if (c.recompute.granularity == Recompute::selective) a.push_back("--recompute-granularity selective");
  // stowage's techniques, as MindSpeed spells them (and Megatron's optimizer offload).
  if (c.techniques.act_fn_recompute) a.push_back("--recompute-activation-function");
  if (c.techniques.swap_attention) a.push_back("--swap-attention");
  if (c.techniques.shared_storage) a.push_back("--reuse-fp32-param");
  if (c.techniques.optimizer_offload != OffloadMode::none)
    a.push_back("--use-precision-aware-optimizer --optimizer-cpu-offload --optimizer-offload-fraction 1.0");
  std::string out;
  for (const auto& x : a)
    if (!x.empty()) out += (out.empty() ? "" : " ") + x;
  return out;
}

std::vector<std::string> megatron_cannot_say(const estimate::ModelConfig& m) {
  std::vector<std::string> out;
  if (!m.norm_weights)
    out.push_back(fmt::format("norms without parameters (Megatron's {} has a weight{})",
                              m.rms_norm ? "RMSNorm" : "LayerNorm", m.rms_norm ? "" : " and a bias"));
  if (m.norms_per_layer != 2)
    out.push_back(fmt::format("{} norm{} a layer (Megatron's layer has 2)", m.norms_per_layer,
                              m.norms_per_layer == 1 ? "" : "s"));
  if (!m.linear_bias() && (m.proj_bias || m.mlp_bias))
    out.push_back(
        "biases on some linear layers only (Megatron: on all of them, on none, or on q, k and v alone with "
        "--add-qkv-bias)");
  if (m.output_bias) out.push_back("a bias on the output layer (Megatron's has none)");
  // mla_qk_norm_config.py: --qk-layernorm without --q-lora-rank also fuses a norm into linear_q_proj.
  if (m.mla && m.qk_layernorm && m.q_lora_rank == 0 && !m.mla_q_input_norm)
    out.push_back(
        "a key/value latent norm without a norm on the query projection's input (Megatron's --qk-layernorm "
        "without --q-lora-rank normalises both)");
  return out;
}

std::string why_best(const Plan& best, const Plan& runner) {
  struct Gain {
    const char* name;
    double gain;
  };
  std::vector<Gain> gains;
  for (const auto& k : kComponents) gains.push_back({k.name, runner.time.*k.field - best.time.*k.field});
  std::sort(gains.begin(), gains.end(),
            [](const Gain& a, const Gain& b) { return std::abs(a.gain) > std::abs(b.gain); });
  const double total = runner.time.total() - best.time.total();
  std::string out = fmt::format("{} beats {} by {:.3f} s per step ({:.1f} %):", layout(best.config),
                                layout(runner.config), total, 100.0 * total / runner.time.total());
  int shown = 0;
  for (const auto& g : gains) {
    if (shown == 3 || std::abs(g.gain) < 1e-4) break;
    out += fmt::format(" {} {} {:.3f} s;", g.name, g.gain > 0 ? "saves" : "costs", std::abs(g.gain));
    ++shown;
  }
  if (shown == 0) out += " the same modelled time; the tie goes to the smaller layout.";
  else out.back() = '.';
  if (techniques(best.config) != techniques(runner.config))
    out += fmt::format(" Memory techniques: {} against {}.", techniques(best.config), techniques(runner.config));
  return out;
}

std::string to_table(const PlanRequest& r, const SearchResult& res) {
  const auto& cl = r.cluster;
  std::string out = fmt::format(
      "model {}: {} layers, hidden {}; seq {}, global batch {}; {} GPUs ({} per node, {} each), {:.0f} TFLOP/s at "
      "efficiency {:.2f}\n",
      r.base.model.name, r.base.model.num_layers, r.base.model.hidden_size, r.base.training.seq_length,
      r.base.training.global_batch, cl.gpus, cl.gpus_per_node, format_bytes(cl.gpu_memory), cl.peak_tflops,
      cl.efficiency);
  out += fmt::format(
      "searched {} candidates ({} layouts × technique sets, {} estimator calls) in {:.2f} s; {} fit {} "
      "(margin {:.0f} %)\n",
      res.stats.candidates, res.stats.layouts, res.stats.evaluations, res.stats.seconds, res.stats.fitting,
      format_bytes(memory_budget(r)), 100 * r.margin);
  if (res.plans.empty()) return out + "no plan fits; add GPUs, memory, or allow stowage's techniques\n";
  std::size_t width = 34;  // the layout column: as wide as its widest entry (an uneven split is longer)
  for (const Plan& p : res.plans) width = std::max(width, layout(p.config).size());
  out += fmt::format("{:>2}  {:<{}} {:>10} {:>10} {:>8}  {}\n", "#", "layout", width, "peak", "step (s)", "TFLOP/s",
                     "memory techniques");
  for (std::size_t i = 0; i < res.plans.size(); ++i) {
    const Plan& p = res.plans[i];
    out +=
        fmt::format("{:>2}  {:<{}} {:>10} {:>10.3f} {:>8.1f}  {}\n", i + 1, layout(p.config), width,
                    format_bytes(p.memory.peak_reserved), p.time.total(), p.model_tflops_per_gpu, techniques(p.config));
  }
  out += "\ntime per step (s)\n";
  out += fmt::format("{:>2}", "#");
  for (const auto& k : kComponents) out += fmt::format(" {:>9}", k.name);
  out += "\n";
  for (std::size_t i = 0; i < res.plans.size(); ++i) {
    out += fmt::format("{:>2}", i + 1);
    for (const auto& k : kComponents) out += fmt::format(" {:>9.3f}", res.plans[i].time.*k.field);
    out += "\n";
  }
  out += "\nmemory per GPU (most loaded stage)\n";
  out += fmt::format("{:>2} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}\n", "#", "weights", "gradients", "optimizer",
                     "activations", "other", "host");
  for (std::size_t i = 0; i < res.plans.size(); ++i) {
    const auto& m = res.plans[i].memory;
    out += fmt::format("{:>2} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}\n", i + 1, format_bytes(m.weights),
                       format_bytes(m.gradients), format_bytes(m.optimizer_states), format_bytes(m.activation_total()),
                       format_bytes(m.communication + m.framework + m.allocator_overhead), format_bytes(m.host_bytes));
  }
  if (res.plans.size() > 1) out += "\n" + why_best(res.plans[0], res.plans[1]) + "\n";
  out += "\nMegatron-LM arguments for #1:\n  " + megatron_arguments(res.plans[0].config) + "\n";
  const auto differences = megatron_cannot_say(r.base.model);
  if (!differences.empty()) {
    out += "  Megatron-LM has no arguments for:";
    for (std::size_t i = 0; i < differences.size(); ++i) out += (i == 0 ? " " : "; ") + differences[i];
    out += ". The line builds the nearest model Megatron can; the plan's memory is this model's.\n";
  }
  return out;
}

nlohmann::json to_json(const PlanRequest& r, const SearchResult& res) {
  const auto& cl = r.cluster;
  nlohmann::json plans = nlohmann::json::array();
  for (const auto& p : res.plans) plans.push_back(plan_json(p));
  nlohmann::json j{{"schema", "stowage.plan/1"},
                   {"model",
                    {{"name", r.base.model.name},
                     {"num_layers", r.base.model.num_layers},
                     {"hidden_size", r.base.model.hidden_size},
                     {"megatron_cannot_say", megatron_cannot_say(r.base.model)}}},
                   {"seq_length", r.base.training.seq_length},
                   {"global_batch", r.base.training.global_batch},
                   {"cluster",
                    {{"gpus", cl.gpus},
                     {"gpus_per_node", cl.gpus_per_node},
                     {"gpu_memory", cl.gpu_memory},
                     {"host_memory_per_node", cl.host_memory_per_node},
                     {"intra_node_gbps", cl.intra_node_gbps},
                     {"inter_node_gbps", cl.inter_node_gbps},
                     {"host_link_gbps", cl.host_link_gbps},
                     {"hbm_gbps", cl.hbm_gbps},
                     {"peak_tflops", cl.peak_tflops},
                     {"efficiency", cl.efficiency}}},
                   {"margin", r.margin},
                   {"memory_budget", memory_budget(r)},
                   {"search",
                    {{"layouts", res.stats.layouts},
                     {"candidates", res.stats.candidates},
                     {"evaluations", res.stats.evaluations},
                     {"fitting", res.stats.fitting},
                     {"seconds", res.stats.seconds}}},
                   {"plans", plans}};
  if (res.plans.size() > 1) j["why_best"] = why_best(res.plans[0], res.plans[1]);
  return j;
}

std::string to_svg(const PlanRequest& r, const SearchResult& res) {
  double top = 1e-9;
  for (const auto& p : res.plans) top = std::max(top, p.time.total());
  const double left = 80, plot_h = 300, plot_top = 50, bar_w = 60, gap = 40;
  const double n = double(std::max<std::size_t>(1, res.plans.size()));
  const double width = left + n * (bar_w + gap) + 160, height = plot_top + plot_h + 80;
  tools::SvgWriter svg(width, height);
  svg.text(left, 25,
           fmt::format("{} on {} GPUs: modelled step time of the top plans", r.base.model.name, r.cluster.gpus), 15);
  const double scale = plot_h / top;
  for (int i = 0; i <= 4; ++i) {
    const double y = plot_top + plot_h - plot_h * i / 4.0;
    svg.line(left - 5, y, left + n * (bar_w + gap), y, "#dddddd");
    svg.text(left - 8, y + 4, fmt::format("{:.2f} s", top * i / 4.0), 10, "end");
  }
  for (std::size_t b = 0; b < res.plans.size(); ++b) {
    const Plan& p = res.plans[b];
    const double x = left + gap / 2 + double(b) * (bar_w + gap);
    double y = plot_top + plot_h;
    for (const auto& k : kComponents) {
      const double h = p.time.*k.field * scale;
      if (h <= 0) continue;
      y -= h;
      svg.rect(x, y, bar_w, h, k.color, fmt::format("{}: {:.3f} s", k.name, p.time.*k.field));
    }
    svg.text(x + bar_w / 2, y - 5, fmt::format("{:.2f} s", p.time.total()), 10, "middle");
    svg.text(x + bar_w / 2, plot_top + plot_h + 16, fmt::format("#{}", b + 1), 10, "middle");
    svg.text(x + bar_w / 2, plot_top + plot_h + 30,
             fmt::format("TP{} PP{}x{}", p.config.parallel.tp, p.config.parallel.pp, p.config.parallel.vpp), 9,
             "middle");
    svg.text(x + bar_w / 2, plot_top + plot_h + 42,
             fmt::format("DP{} mb{}", p.config.parallel.dp, p.config.training.micro_batch), 9, "middle");
  }
  const double lx = left + n * (bar_w + gap) + 20;
  for (std::size_t i = 0; i < std::size(kComponents); ++i) {
    svg.rect(lx, plot_top + 18.0 * double(i), 12, 12, kComponents[i].color);
    svg.text(lx + 18, plot_top + 18.0 * double(i) + 10, kComponents[i].name, 11);
  }
  return svg.finish();
}

}  // namespace stowage::plan
