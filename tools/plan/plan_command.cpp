// `stowage plan`: which parallel layout and memory techniques train this model fastest on this
// cluster, within its memory?
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>

#include "stowage/error.hpp"
#include "tools/command.hpp"
#include "tools/common/json_input.hpp"
#include "tools/estimate/megatron_args.hpp"
#include "tools/estimate/memory_size.hpp"
#include "tools/plan/plan_report.hpp"

namespace stowage::plan {
namespace {

struct Options {
  std::string model, model_json, precision;
  std::optional<std::string> megatron_args;
  std::optional<std::int64_t> seq, global_batch, gpus, gpus_per_node, top, max_vpp, threads;
  std::string gpu_memory, host_memory;
  std::optional<double> intra, inter, host_link, hbm, peak, efficiency, margin;
  bool no_techniques = false, no_fsdp = false, no_flash = false, json = false, progress = false, quiet = false;
  std::string svg;
};

std::int64_t positive(const std::optional<std::int64_t>& v, const char* option) {
  if (*v <= 0) throw InvalidArgument(fmt::format("{} must be a positive integer, got {}", option, *v));
  return *v;
}

PlanRequest build_request(const Options& o) {
  PlanRequest r;
  auto& c = r.base;
  if (!o.model_json.empty() && !o.model.empty())
    throw InvalidArgument("plan: --model and --model-json both name the model: give one");
  if (!o.model_json.empty())
    c.model = estimate::model_from_hf_json(tools::read_file(o.model_json), o.model_json, &c.warnings);
  else if (!o.model.empty()) c.model = estimate::preset(o.model);
  else if (!o.megatron_args) throw InvalidArgument("plan: give the model: --model, --model-json or --megatron-args");
  if (o.megatron_args) {
    // Only the model and training shape are taken; the layout is what the search chooses.
    estimate::RunConfig parsed = c;
    estimate::apply_megatron_args(*o.megatron_args, parsed);
    c.model = parsed.model;
    c.training = parsed.training;
    c.framework = parsed.framework;
    c.warnings = parsed.warnings;
    estimate::drop_trained_mtp_warning(c);
  } else {
    c.framework.te_workspace = std::int64_t{32} << 20;  // Megatron with TransformerEngine
  }
  // Megatron's bookkeeping: fp32 main gradients with bf16 (grad_bytes 0 → 4 B), the parsed size
  // with Megatron arguments (2 B for --fp16 without --accumulate-allreduce-grads-in-fp32).
  c.parallel.accounting = estimate::Accounting::megatron;
  if (o.seq) c.training.seq_length = positive(o.seq, "--seq");
  if (o.global_batch) c.training.global_batch = positive(o.global_batch, "--global-batch");
  if (c.training.global_batch <= 0) throw InvalidArgument("plan: --global-batch is required (sequences per step)");
  // A learned position table sizes the longest sequence the model takes (Megatron-LM asserts it).
  const std::int64_t rows = c.model.learned_positions, seq = c.training.seq_length;
  if (rows > 0 && rows < seq)
    throw InvalidArgument(
        fmt::format("plan: the model's learned position embedding has {} rows, fewer than the sequence length {}; give "
                    "--seq {} or less",
                    rows, seq, rows));
  if (!o.precision.empty()) c.training.precision = estimate::parse_precision(o.precision);
  if (o.no_flash) c.training.flash_attention = false;
  auto& cl = r.cluster;
  if (o.gpus) cl.gpus = positive(o.gpus, "--gpus");
  if (o.gpus_per_node) cl.gpus_per_node = positive(o.gpus_per_node, "--gpus-per-node");
  if (!o.gpu_memory.empty()) cl.gpu_memory = estimate::parse_memory_size(o.gpu_memory, "--gpu-memory");
  if (!o.host_memory.empty()) cl.host_memory_per_node = estimate::parse_memory_size(o.host_memory, "--host-memory");
  if (o.intra) cl.intra_node_gbps = *o.intra;
  if (o.inter) cl.inter_node_gbps = *o.inter;
  if (o.host_link) cl.host_link_gbps = *o.host_link;
  if (o.hbm) cl.hbm_gbps = *o.hbm;
  if (o.peak) cl.peak_tflops = *o.peak;
  if (o.efficiency) cl.efficiency = *o.efficiency;
  validate(cl);
  if (o.margin) r.margin = *o.margin;
  if (o.top) r.top = positive(o.top, "--top");
  if (o.max_vpp) r.space.max_vpp = positive(o.max_vpp, "--max-vpp");
  if (o.threads) r.threads = int(std::min<std::int64_t>(positive(o.threads, "--threads"), 64));
  r.space.techniques = !o.no_techniques;
  r.space.zero3 = !o.no_fsdp;
  return r;
}

int run(const Options& o) {
  const PlanRequest r = build_request(o);
  const bool show_progress = o.progress || (!o.quiet && isatty(STDERR_FILENO));
  auto progress = [&](std::int64_t done, std::int64_t total) {
    std::fprintf(stderr, "\rplan: %lld of %lld candidates (%.0f %%)", (long long)done, (long long)total,
                 total ? 100.0 * double(done) / double(total) : 100.0);
  };
  const SearchResult res = search(r, show_progress ? std::function<void(std::int64_t, std::int64_t)>(progress)
                                                   : std::function<void(std::int64_t, std::int64_t)>());
  if (show_progress) std::fprintf(stderr, "\n");
  if (!o.svg.empty()) {
    std::ofstream out(o.svg, std::ios::binary);
    if (!out || !(out << to_svg(r, res))) throw InvalidArgument(fmt::format("--svg: cannot write '{}'", o.svg));
  }
  if (o.json) std::cout << to_json(r, res).dump(2) << "\n";
  else {
    std::cout << to_table(r, res);
    for (const auto& w : r.base.warnings) std::cout << "warning: " << w << "\n";
  }
  return res.plans.empty() ? 3 : 0;
}

void setup(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<Options>();
  auto* cmd =
      app.add_subcommand("plan", "Search parallel layouts and memory techniques for the fastest plan that fits");
  cmd->add_option("--model", o->model,
                  "preset (required unless --model-json or --megatron-args): " +
                      fmt::format("{}", fmt::join(estimate::preset_names(), ", ")));
  cmd->add_option("--model-json", o->model_json, "a Hugging Face config.json");
  cmd->add_option("--megatron-args", o->megatron_args, "Megatron-LM arguments (the model and training shape are read)");
  cmd->add_option("--seq", o->seq, "sequence length (default 4096 or from --megatron-args)");
  cmd->add_option("--global-batch", o->global_batch, "sequences per step (required unless in --megatron-args)");
  cmd->add_option("--precision", o->precision, "bf16 (default), fp16 or fp32");
  cmd->add_flag("--no-flash-attention", o->no_flash, "attention stores the s² scores");
  cmd->add_option("--gpus", o->gpus, "GPUs in all (default 8)");
  cmd->add_option("--gpus-per-node", o->gpus_per_node, "GPUs per node (default 8)");
  cmd->add_option("--gpu-memory", o->gpu_memory, "memory per GPU (default 80GiB)");
  cmd->add_option("--host-memory", o->host_memory, "host memory per node (default 2TiB)");
  cmd->add_option("--intra-node-bw", o->intra, "GB/s one way per GPU inside a node (default 450, NVLink 4)");
  cmd->add_option("--inter-node-bw", o->inter, "GB/s one way per GPU between nodes (default 50, 400 Gb/s)");
  cmd->add_option("--host-link-bw", o->host_link, "GB/s one way per GPU to host memory (default 64, PCIe 5 x16)");
  cmd->add_option("--hbm-bw", o->hbm, "GB/s of GPU memory (default 3350, H100 SXM)");
  cmd->add_option("--peak-tflops", o->peak, "dense 16-bit TFLOP/s per GPU (default 989, H100 SXM)");
  cmd->add_option("--efficiency", o->efficiency, "fraction of peak the GEMMs reach (default 0.6; see docs/plan.md)");
  cmd->add_option("--margin", o->margin, "fraction of GPU memory kept free (default 0.05)");
  cmd->add_option("--top", o->top, "plans to show (default 5)");
  cmd->add_option("--max-vpp", o->max_vpp, "largest virtual pipeline size tried (default 8)");
  cmd->add_option("--threads", o->threads, "search threads (default 2)");
  cmd->add_flag("--no-techniques", o->no_techniques,
                "only Megatron's own choices: no swap, offload, shared storage, act-fn recompute");
  cmd->add_flag("--no-fsdp", o->no_fsdp, "leave out ZeRO-3 / FSDP layouts");
  cmd->add_flag("--json", o->json, "JSON output (schema stowage.plan/1, docs/plan.md)");
  cmd->add_option("--svg", o->svg, "write a chart of the top plans' step times to this file");
  cmd->add_flag("--progress", o->progress, "report progress on stderr (default when stderr is a terminal)");
  cmd->add_flag("--quiet", o->quiet, "no progress");
  cmd->callback([o, &exit_code] { exit_code = run(*o); });
}

STOWAGE_COMMAND(25, setup);

}  // namespace
}  // namespace stowage::plan
