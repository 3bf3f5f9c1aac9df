// `stowage estimate`: will this configuration fit, and what does each technique save?
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <vector>

#include "stowage/byte_size.hpp"
#include "stowage/error.hpp"
#include "tools/command.hpp"
#include "tools/common/json_input.hpp"
#include "tools/estimate/chart.hpp"
#include "tools/estimate/deepspeed_config.hpp"
#include "tools/estimate/fit.hpp"
#include "tools/estimate/megatron_args.hpp"
#include "tools/estimate/memory_size.hpp"
#include "tools/estimate/report.hpp"

namespace stowage::estimate {
namespace {

struct Options {
  std::string model, model_json, deepspeed_config;
  std::optional<std::string> megatron_args;
  std::optional<std::int64_t> seq, micro_batch, grad_accum, global_batch, tp, pp, vpp, dp, cp, ep, stage;
  std::string precision, optimizer, recompute, recompute_method, accounting, offload, rounding;
  // Optional, so that a value given (0, -1) reaches the checks instead of reading as "not given".
  std::optional<std::int64_t> recompute_layers, zero, grad_bytes, mtp_layers;
  std::vector<std::string> recompute_modules;
  bool sp = false, no_flash = false, unfused_swiglu = false, dist_opt = false, ignore_unknown = false;
  bool shared = false, act_fn = false, swap = false;
  std::optional<std::int64_t> prefetch_window, stream_window;
  std::optional<double> overhead;
  std::string cublas_workspace, te_workspace;
  bool json = false;
  std::string svg, fit, fit_dim = "micro-batch";
};

// A size given on the command line must be positive: 0 is not "unset".
std::int64_t positive(const std::optional<std::int64_t>& v, const char* option) {
  if (*v <= 0) throw InvalidArgument(fmt::format("{} must be a positive integer, got {}", option, *v));
  return *v;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  if (!out || !(out << text)) throw InvalidArgument(fmt::format("--svg: cannot write '{}'", path));
}

RunConfig build_config(const Options& o) {
  RunConfig c;
  if (!o.model_json.empty() && !o.model.empty())
    throw InvalidArgument("--model and --model-json both name the model: give one");
  if (!o.model_json.empty()) c.model = model_from_hf_json(tools::read_file(o.model_json), o.model_json, &c.warnings);
  else if (!o.model.empty()) c.model = preset(o.model);
  else if (!o.megatron_args) c.model = preset("llama2-7b");
  if (o.megatron_args)
    apply_megatron_args(*o.megatron_args, c, o.ignore_unknown ? UnknownArguments::ignore : UnknownArguments::error);
  if (!o.deepspeed_config.empty()) apply_deepspeed_config(tools::read_file(o.deepspeed_config), c, o.deepspeed_config);
  // Explicit options win over both files.
  if (o.mtp_layers) {
    if (*o.mtp_layers < 0) throw InvalidArgument(fmt::format("--mtp-layers must be 0 or more, got {}", *o.mtp_layers));
    if (c.parallel.has_layout() && *o.mtp_layers != c.model.mtp_layers)
      throw InvalidArgument(fmt::format("--mtp-layers {} differs from the {} MTP layers the pipeline layout places",
                                        *o.mtp_layers, c.model.mtp_layers));
    c.model.mtp_layers = *o.mtp_layers;
  }
  auto& t = c.training;
  auto& p = c.parallel;
  if (o.seq) t.seq_length = positive(o.seq, "--seq");
  // A learned position table sizes the longest sequence the model takes (Megatron-LM asserts it;
  // GPT-2 and GPT-3 have one): an explicit longer sequence is refused, the default one shortened.
  if (const std::int64_t rows = c.model.learned_positions; rows > 0 && rows < t.seq_length) {
    if (o.seq || t.seq_length != Training{}.seq_length)
      throw InvalidArgument(fmt::format(
          "the model's learned position embedding has {} rows, fewer than the sequence length {}; give --seq {} or "
          "less",
          rows, t.seq_length, rows));
    c.notes.push_back(fmt::format(
        "sequence length {}: the model's learned position embedding (the default {} is longer)", rows, t.seq_length));
    t.seq_length = rows;
  }
  if (o.micro_batch) t.micro_batch = positive(o.micro_batch, "--micro-batch");
  if (o.grad_accum) t.grad_accumulation = positive(o.grad_accum, "--grad-accum");
  if (o.global_batch) t.global_batch = positive(o.global_batch, "--global-batch");
  if (!o.precision.empty()) t.precision = parse_precision(o.precision);
  if (!o.optimizer.empty()) t.optimizer = parse_optimizer(o.optimizer);
  if (o.grad_bytes) {
    if (*o.grad_bytes != 2 && *o.grad_bytes != 4)
      throw InvalidArgument(fmt::format("--grad-bytes must be 2 or 4, got {}", *o.grad_bytes));
    t.grad_bytes = static_cast<int>(*o.grad_bytes);
  }
  if (o.no_flash) t.flash_attention = false;
  if (o.unfused_swiglu) t.fused_swiglu = false;
  if (o.tp) p.tp = positive(o.tp, "--tp");
  if (o.pp) p.pp = positive(o.pp, "--pp");
  if (o.vpp) p.vpp = positive(o.vpp, "--vpp");
  if (o.dp) p.dp = positive(o.dp, "--dp");
  if (o.cp) p.cp = positive(o.cp, "--cp");
  if (o.ep) p.ep = positive(o.ep, "--ep");
  if (o.sp) p.sequence_parallel = true;
  const int config_stage = p.zero_stage;
  if (o.zero) {
    if (*o.zero < 0 || *o.zero > 3) throw InvalidArgument(fmt::format("--zero must be 0 to 3, got {}", *o.zero));
    p.zero_stage = static_cast<int>(*o.zero);
  }
  // Megatron's distributed optimizer shards the optimizer states and keeps every gradient: ZeRO-1.
  if (o.dist_opt && o.zero && *o.zero != 1)
    throw InvalidArgument(fmt::format(
        "--distributed-optimizer is ZeRO-1 (optimizer states sharded, gradients kept whole), but --zero {} asks "
        "for stage {}; give one of the two",
        *o.zero, *o.zero));
  if (o.dist_opt) p.zero_stage = std::max(p.zero_stage, 1);
  if (o.dist_opt && !o.deepspeed_config.empty() && config_stage != 1)
    throw InvalidArgument(fmt::format(
        "--distributed-optimizer is ZeRO-1 (optimizer states sharded, gradients kept whole), but {} asks for "
        "zero_optimization.stage {}; give one of the two",
        o.deepspeed_config, config_stage));
  if (!o.deepspeed_config.empty()) {
    // The config's buckets and offloads are its stage's: another stage would mix two setups.
    if (p.zero_stage != config_stage)
      throw InvalidArgument(
          fmt::format("{}: zero_optimization.stage is {}, but the options ask for stage {}; change "
                      "the one that is wrong",
                      o.deepspeed_config, config_stage, p.zero_stage));
    // DeepSpeed's pipeline engine refuses ZeRO-2/3 and turns overlap_comm off (pipe/engine.py,
    // engine.py).
    if (o.pp && *o.pp > 1) {
      if (p.zero_stage >= 2)
        throw InvalidArgument(
            fmt::format("{}: ZeRO stage {} with --pp {}: DeepSpeed's pipeline engine refuses ZeRO-2 "
                        "and ZeRO-3",
                        o.deepspeed_config, p.zero_stage, *o.pp));
      p.reduce_buffers = 1;
    }
  }
  if (!o.accounting.empty()) p.accounting = parse_accounting(o.accounting);
  if (!o.recompute.empty()) c.recompute.granularity = parse_recompute(o.recompute);
  if (!o.recompute_method.empty()) c.recompute.method = parse_recompute_method(o.recompute_method);
  if (o.recompute_layers) c.recompute.num_layers = *o.recompute_layers;
  if (!o.recompute_modules.empty()) {
    if (c.recompute.granularity != Recompute::selective)
      throw InvalidArgument("--recompute-modules needs selective recompute (--recompute selective)");
    c.recompute.modules = 0;
    for (const std::string& name : o.recompute_modules) c.recompute.modules |= parse_recompute_module(name);
  }
  auto& k = c.techniques;
  if (o.shared) k.shared_storage = true;
  if (!o.rounding.empty()) k.rounding = parse_rounding(o.rounding);
  if (o.act_fn) k.act_fn_recompute = true;
  if (o.swap) k.swap_attention = true;
  if (o.prefetch_window) k.prefetch_window = *o.prefetch_window;
  if (!o.offload.empty()) k.optimizer_offload = parse_offload(o.offload);
  if (o.stream_window) k.stream_window_layers = positive(o.stream_window, "--stream-window");
  if (o.overhead) {
    if (!std::isfinite(*o.overhead) || *o.overhead < 0.0 || *o.overhead > 4.0)
      throw InvalidArgument(
          fmt::format("--allocator-overhead must be a fraction between 0 and 4, got {}", *o.overhead));
    c.allocator_overhead = *o.overhead;
  }
  if (!o.cublas_workspace.empty())
    c.framework.cublas_workspace = parse_byte_count(o.cublas_workspace, "--cublas-workspace");
  if (!o.te_workspace.empty()) c.framework.te_workspace = parse_byte_count(o.te_workspace, "--te-workspace");
  if (o.stage) {
    if (*o.stage < 0) throw InvalidArgument(fmt::format("--stage must be 0 or more, got {}", *o.stage));
    c.stage = *o.stage;
  }
  if (k.shared_storage && k.optimizer_offload != OffloadMode::none)
    c.notes.push_back("shared storage needs the fp32 master on the device; with optimizer offload it saves nothing");
  if (k.shared_storage && t.precision == Precision::fp32)
    c.notes.push_back(
        "shared storage keeps the 16-bit weight inside the fp32 master; fp32 training has no 16-bit "
        "copy, so it saves nothing");
  // The options replace the DeepSpeed config's batch keys before DeepSpeed's derivation.
  if (auto& b = c.deepspeed_batch) {
    if (o.micro_batch) b->micro = t.micro_batch, b->micro_name = "--micro-batch";
    if (o.grad_accum) b->accumulation = t.grad_accumulation, b->accumulation_name = "--grad-accum";
    if (o.global_batch) b->train = t.global_batch, b->train_name = "--global-batch";
    resolve_deepspeed_batch(c);
    t.global_batch = 0;
  }
  finalize(c);
  // A global batch from --megatron-args fixes the accumulation as one from the options does.
  if (o.grad_accum && t.global_batch > 0 && t.grad_accumulation != *o.grad_accum)
    throw InvalidArgument(
        fmt::format("{} {} is {} micro-batches of {} on {} data-parallel ranks, not "
                    "--grad-accum {}: give one of the two",
                    o.global_batch ? "--global-batch" : "--megatron-args' --global-batch-size", t.global_batch,
                    t.grad_accumulation, t.micro_batch, p.dp, *o.grad_accum));
  validate(c);
  return c;
}

int run(const Options& o) {
  const RunConfig c = build_config(o);
  if (!o.fit.empty()) {
    const auto budget = parse_memory_size(o.fit, "--fit");
    FitDim dim;
    if (o.fit_dim == "micro-batch" || o.fit_dim == "batch") dim = FitDim::micro_batch;
    else if (o.fit_dim == "seq" || o.fit_dim == "seq-length") dim = FitDim::seq_length;
    else throw InvalidArgument(fmt::format("--fit-dim: expected micro-batch or seq, got '{}'", o.fit_dim));
    const FitResult f = fit(c, budget, dim);
    const char* what = dim == FitDim::micro_batch ? "micro_batch" : "seq_length";
    if (o.json) {
      nlohmann::json j{{"schema", "stowage.fit/1"},
                       {"dimension", what},
                       {"budget", f.budget},
                       {"step", f.step},
                       {"limit", f.limit},
                       {"limit_is_positions", f.limit_is_positions},
                       {"without_stowage", f.without_stowage},
                       {"with_stowage", f.with_stowage}};
      if (f.without_stowage) j["peak_reserved_without"] = f.memory_without.peak_reserved;
      if (f.with_stowage) j["peak_reserved_with"] = f.memory_with.peak_reserved;
      std::cout << j.dump(2) << "\n";
    } else {
      auto value = [&](std::int64_t v) {
        if (v == 0 || v != f.limit) return std::to_string(v);
        return fmt::format("{} ({})", v,
                           f.limit_is_positions ? "the learned position table's length: the model takes no longer"
                                                : "the largest searched; more may fit");
      };
      std::cout << fmt::format(
          "largest {} that fits {}:\n  without stowage's techniques: {}\n  with all of them:            {}\n", what,
          format_bytes(f.budget), value(f.without_stowage), value(f.with_stowage));
    }
    return 0;
  }
  const EstimateResult r = run_estimate(c);
  if (!o.svg.empty()) write_file(o.svg, to_svg(r));
  if (o.json) std::cout << to_json(r).dump(2) << "\n";
  else std::cout << to_table(r);
  return 0;
}

void setup(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "estimate", "Predict per-device memory for a training configuration and what each technique saves");
  cmd->add_option("--model", o->model,
                  "preset (default llama2-7b): " + fmt::format("{}", fmt::join(preset_names(), ", ")));
  cmd->add_option("--model-json", o->model_json, "a Hugging Face config.json");
  cmd->add_option("--megatron-args", o->megatron_args, "Megatron-LM launch arguments, as pasted");
  cmd->add_flag("--ignore-unknown-megatron-args", o->ignore_unknown,
                "skip arguments Megatron-LM does not have (default: error)");
  cmd->add_option("--deepspeed-config", o->deepspeed_config, "DeepSpeed config JSON (ZeRO stage, offload)");
  cmd->add_option("--mtp-layers", o->mtp_layers,
                  "multi-token-prediction layers trained on the last stage (Megatron --mtp-num-layers; default 0)");
  cmd->add_option("--seq", o->seq, "sequence length (default 4096, or from --megatron-args)");
  cmd->add_option("--micro-batch", o->micro_batch, "micro-batch size (default 1)");
  cmd->add_option("--grad-accum", o->grad_accum, "micro-batches per step, in flight for pipeline stages (default 1)");
  cmd->add_option("--global-batch", o->global_batch,
                  "global batch: sets grad-accum = global / (micro × dp) (default: unset)");
  cmd->add_option("--precision", o->precision, "bf16, fp16 or fp32 (default bf16)");
  cmd->add_option("--optimizer", o->optimizer, "adam or sgd (default adam)");
  cmd->add_option("--grad-bytes", o->grad_bytes,
                  "bytes per gradient: 2 or 4 (default 2 for bf16/fp16, 4 for fp32 or megatron accounting)");
  cmd->add_flag("--no-flash-attention", o->no_flash, "attention stores the s² scores");
  cmd->add_flag("--unfused-swiglu", o->unfused_swiglu, "SwiGLU keeps silu(x1) too");
  cmd->add_option("--tp", o->tp, "tensor parallel size (default 1)");
  cmd->add_option("--pp", o->pp, "pipeline parallel size (default 1)");
  cmd->add_option("--vpp", o->vpp, "virtual pipeline stages per rank (default 1)");
  cmd->add_option("--dp", o->dp, "data parallel size (default 1)");
  cmd->add_option("--cp", o->cp, "context parallel size (default 1)");
  cmd->add_option("--ep", o->ep, "expert parallel size (default 1)");
  cmd->add_flag("--sequence-parallel", o->sp, "Megatron sequence parallelism");
  cmd->add_option("--zero", o->zero, "ZeRO stage 0-3 (default 0)");
  cmd->add_flag("--distributed-optimizer", o->dist_opt, "Megatron distributed optimizer (ZeRO-1)");
  cmd->add_option("--accounting", o->accounting,
                  "zero-paper, deepspeed or megatron model-state bookkeeping (default zero-paper)");
  cmd->add_option("--recompute", o->recompute, "none, selective, full or activation-function (default none)");
  cmd->add_option("--recompute-method", o->recompute_method,
                  "full recompute: block (first n layers) or uniform (chunks of n) (default block)");
  cmd->add_option("--recompute-num-layers", o->recompute_layers,
                  "block: layers per model chunk recomputed (0 = all, unlike Megatron's 0 = none); uniform: layers per "
                  "chunk (default 0)");
  cmd->add_option("--recompute-modules", o->recompute_modules,
                  "selective: the modules recomputed, Megatron's names (core_attn, moe_act, layernorm, mla_up_proj, "
                  "mlp, moe, shared_experts; default core_attn)")
      ->delimiter(',');
  cmd->add_flag("--shared-storage", o->shared, "bf16 weights inside the fp32 master");
  cmd->add_option("--rounding", o->rounding, "shared storage rounding: half_up or nearest_even (default half_up)");
  cmd->add_flag("--act-fn-recompute", o->act_fn, "release and recompute the MLP activation output");
  cmd->add_flag("--swap-attention", o->swap, "move attention activations to host memory");
  cmd->add_option("--prefetch-window", o->prefetch_window, "layers prefetched ahead of backward (default 1)");
  cmd->add_option("--optimizer-offload", o->offload, "none, mapped or streamed (default none)");
  cmd->add_option("--stream-window", o->stream_window, "streamed offload: layers per buffer (default 1)");
  cmd->add_option("--allocator-overhead", o->overhead,
                  "reserved − allocated as a fraction of peak allocated, 0..4 (default 0.05)");
  cmd->add_option("--cublas-workspace", o->cublas_workspace,
                  "PyTorch's cuBLAS workspace per thread (default 32MiB, Hopper)");
  cmd->add_option("--te-workspace", o->te_workspace,
                  "TransformerEngine's cuBLAS workspace (default 32MiB with Megatron's TE, else 0)");
  cmd->add_option("--stage", o->stage, "pipeline stage to report (default: the most loaded; Megatron logs the last)");
  cmd->add_flag("--json", o->json, "JSON output (schema in docs/estimate.md)");
  cmd->add_option("--svg", o->svg, "write a stacked-bar chart to this file");
  cmd->add_option("--fit", o->fit, "device memory, e.g. 80GiB: largest micro-batch (or --fit-dim seq) that fits");
  cmd->add_option("--fit-dim", o->fit_dim, "micro-batch or seq (default micro-batch)");
  cmd->callback([o, &exit_code] { exit_code = run(*o); });
}

STOWAGE_COMMAND(20, setup);

}  // namespace
}  // namespace stowage::estimate
