#include "tools/estimate/megatron_args.hpp"

#include <fmt/format.h>

#include <charconv>
#include <functional>
#include <map>

#include "stowage/error.hpp"

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

std::int64_t to_int(const std::string& arg, const std::string& value) {
  std::int64_t v = 0;
  const char* end = value.data() + value.size();
  auto [ptr, ec] = std::from_chars(value.data(), end, v);
  if (ec != std::errc() || ptr != end)
    throw InvalidArgument(fmt::format("megatron-args: {} expects an integer, got '{}'", arg, value));
  return v;
}

double to_double(const std::string& arg, const std::string& value) {
  try {
    std::size_t used = 0;
    double v = std::stod(value, &used);
    if (used == value.size()) return v;
  } catch (const std::exception&) {
  }
  throw InvalidArgument(fmt::format("megatron-args: {} expects a number, got '{}'", arg, value));
}

}  // namespace

std::vector<std::string> apply_megatron_args(const std::string& text, RunConfig& c) {
  const auto args = split_arguments(text);
  auto& m = c.model;
  auto& t = c.training;
  auto& p = c.parallel;
  // Megatron-LM's defaults where a launch line leaves something out (arguments.py): LayerNorm,
  // GeLU, tied embeddings, biases, learned absolute positions, dropout 0.1.
  if (m.name.empty()) m.name = "megatron-args";
  bool gqa = false, untie = false, swiglu = false, rmsnorm = false, no_bias = false, rope = false;
  bool bf16 = false, fp16 = false, fp32_grads = false, dropout_set = false, local_impl = false, flash = false;
  double attn_dropout = 0.1, hidden_dropout = 0.1;
  std::int64_t query_groups = 0, global_batch = 0, layers_per_virtual = 0, max_positions = 0;
  std::vector<std::string> ignored;

  using Handler = std::function<void(const std::string& arg, const std::string& value)>;
  const std::map<std::string, Handler> with_value{
      {"--num-layers", [&](auto& a, auto& v) { m.num_layers = to_int(a, v); }},
      {"--hidden-size", [&](auto& a, auto& v) { m.hidden_size = to_int(a, v); }},
      {"--ffn-hidden-size", [&](auto& a, auto& v) { m.ffn_hidden_size = to_int(a, v); }},
      {"--num-attention-heads", [&](auto& a, auto& v) { m.num_heads = to_int(a, v); }},
      {"--num-query-groups", [&](auto& a, auto& v) { query_groups = to_int(a, v); }},
      {"--kv-channels", [&](auto& a, auto& v) { m.head_dim = to_int(a, v); }},
      {"--vocab-size", [&](auto& a, auto& v) { m.vocab_size = to_int(a, v); }},
      {"--padded-vocab-size", [&](auto& a, auto& v) { m.vocab_size = to_int(a, v); t.vocab_divisor = 1; }},
      {"--make-vocab-size-divisible-by", [&](auto& a, auto& v) { t.vocab_divisor = to_int(a, v); }},
      {"--max-position-embeddings", [&](auto& a, auto& v) { max_positions = to_int(a, v); }},
      {"--position-embedding-type", [&](auto&, auto& v) { rope = v == "rope" || v == "none"; }},
      {"--normalization", [&](auto&, auto& v) { rmsnorm = v == "RMSNorm"; }},
      {"--num-experts", [&](auto& a, auto& v) { m.num_experts = to_int(a, v); }},
      {"--moe-router-topk", [&](auto& a, auto& v) { m.experts_per_token = to_int(a, v); }},
      {"--seq-length", [&](auto& a, auto& v) { t.seq_length = to_int(a, v); }},
      {"--micro-batch-size", [&](auto& a, auto& v) { t.micro_batch = to_int(a, v); }},
      {"--global-batch-size", [&](auto& a, auto& v) { global_batch = to_int(a, v); }},
      {"--tensor-model-parallel-size", [&](auto& a, auto& v) { p.tp = to_int(a, v); }},
      {"--pipeline-model-parallel-size", [&](auto& a, auto& v) { p.pp = to_int(a, v); }},
      {"--virtual-pipeline-model-parallel-size", [&](auto& a, auto& v) { p.vpp = to_int(a, v); }},
      {"--num-layers-per-virtual-pipeline-stage", [&](auto& a, auto& v) { layers_per_virtual = to_int(a, v); }},
      {"--context-parallel-size", [&](auto& a, auto& v) { p.cp = to_int(a, v); }},
      {"--expert-model-parallel-size", [&](auto& a, auto& v) { p.ep = to_int(a, v); }},
      {"--recompute-granularity", [&](auto&, auto& v) { c.recompute.granularity = parse_recompute(v); }},
      {"--recompute-method", [&](auto&, auto&) {}},
      {"--recompute-num-layers", [&](auto& a, auto& v) { c.recompute.num_layers = to_int(a, v); }},
      {"--recompute-activation-function-num-layers", [&](auto& a, auto& v) { c.recompute.num_layers = to_int(a, v); }},
      {"--attention-dropout", [&](auto& a, auto& v) { attn_dropout = to_double(a, v); dropout_set = true; }},
      {"--hidden-dropout", [&](auto& a, auto& v) { hidden_dropout = to_double(a, v); dropout_set = true; }},
      {"--optimizer", [&](auto&, auto& v) { t.optimizer = parse_optimizer(v); }},
      {"--transformer-impl", [&](auto&, auto& v) { local_impl = v == "local"; }},
  };
  const std::map<std::string, std::function<void()>> flags{
      {"--group-query-attention", [&] { gqa = true; }},
      {"--untie-embeddings-and-output-weights", [&] { untie = true; }},
      {"--swiglu", [&] { swiglu = true; }},
      {"--disable-bias-linear", [&] { no_bias = true; }},
      {"--use-rotary-position-embeddings", [&] { rope = true; }},
      {"--sequence-parallel", [&] { p.sequence_parallel = true; }},
      {"--use-distributed-optimizer", [&] { p.zero_stage = std::max(p.zero_stage, 1); }},
      {"--bf16", [&] { bf16 = true; }},
      {"--fp16", [&] { fp16 = true; }},
      {"--accumulate-allreduce-grads-in-fp32", [&] { fp32_grads = true; }},
      {"--use-flash-attn", [&] { flash = true; }},
      {"--no-bias-swiglu-fusion", [&] { t.fused_swiglu = false; }},
      {"--recompute-activation-function", [&] { c.techniques.act_fn_recompute = true; }},
      {"--swap-attention", [&] { c.techniques.swap_attention = true; }},
      {"--reuse-fp32-param", [&] { c.techniques.shared_storage = true; }},
  };
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    std::string name = arg, value;
    const bool inline_value = arg.rfind("--", 0) == 0 && arg.find('=') != std::string::npos;
    if (inline_value) {
      name = arg.substr(0, arg.find('='));
      value = arg.substr(arg.find('=') + 1);
    }
    if (auto it = with_value.find(name); it != with_value.end()) {
      if (!inline_value) {
        if (i + 1 >= args.size() || args[i + 1].rfind("--", 0) == 0)
          throw InvalidArgument(fmt::format("megatron-args: {} needs a value", name));
        value = args[++i];
      }
      it->second(name, value);
    } else if (auto f = flags.find(name); f != flags.end()) {
      f->second();
    } else {
      // Unknown: skip it and the values that follow it.
      std::string skipped = arg;
      while (!inline_value && i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) skipped += " " + args[++i];
      ignored.push_back(skipped);
    }
  }
  if (gqa && query_groups > 0) m.num_kv_heads = query_groups;
  else if (!gqa) m.num_kv_heads = 0;
  m.tie_embeddings = !untie;
  m.gated_mlp = swiglu;
  m.rms_norm = rmsnorm;
  m.linear_bias = !no_bias;
  m.learned_positions = rope ? 0 : max_positions;
  m.dropout = dropout_set ? (attn_dropout > 0 || hidden_dropout > 0) : true;
  if (m.ffn_hidden_size == 0 && m.hidden_size > 0) m.ffn_hidden_size = 4 * m.hidden_size;  // Megatron default
  if (layers_per_virtual > 0 && p.pp > 0) {
    if (layers_per_virtual <= 0 || m.num_layers % (p.pp * layers_per_virtual) != 0)
      throw InvalidArgument("megatron-args: --num-layers-per-virtual-pipeline-stage does not divide the layers per stage");
    p.vpp = m.num_layers / (p.pp * layers_per_virtual);
  }
  if (fp16) t.precision = Precision::fp16;
  if (bf16) t.precision = Precision::bf16;
  if (!bf16 && !fp16) t.precision = Precision::fp32;
  // Megatron-LM turns on accumulate_allreduce_grads_in_fp32 with --bf16 (arguments.py), so its
  // gradient buffers hold fp32 main grads: 4 B/param.
  t.grad_bytes = (bf16 || fp32_grads || t.precision == Precision::fp32) ? 4 : 2;
  p.accounting = Accounting::megatron;
  // Transformer Engine (the default) and --use-flash-attn use fused attention: no s² scores.
  t.flash_attention = flash || !local_impl;
  if (global_batch > 0) t.global_batch = global_batch;
  if (m.vocab_size == 0) {
    m.vocab_size = 32000;
    c.notes.push_back("megatron-args give no vocabulary size; assumed 32000 (pass --vocab-size)");
  }
  if (!ignored.empty()) c.notes.push_back(fmt::format("ignored megatron arguments: {}", fmt::join(ignored, " ")));
  return ignored;
}

}  // namespace stowage::estimate
