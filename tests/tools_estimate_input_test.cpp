// The estimate's inputs: Hugging Face config.json, Megatron-LM arguments, DeepSpeed config,
// byte sizes; their error paths; and the command's exit codes and messages.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <string>

#include "stowage/error.hpp"
#include "tools/common/byte_size.hpp"
#include "tools/estimate/comparison.hpp"
#include "tools/estimate/deepspeed_config.hpp"
#include "tools/estimate/megatron_args.hpp"
#include "tools/estimate/report.hpp"

using namespace stowage;
using namespace stowage::estimate;

namespace {

RunConfig config_for(const std::string& name) {
  RunConfig c;
  c.model = preset(name);
  c.allocator_overhead = 0.0;
  return c;
}

std::int64_t total_params(const ModelConfig& m) { return count_parameters(m, m.vocab_size).total(m.num_layers); }

struct CommandResult {
  int exit_code;
  std::string output;
};

CommandResult run_cli(const std::string& args) {
  const std::string cmd = std::string(STOWAGE_CLI) + " " + args + " 2>&1";
  CommandResult r{-1, {}};
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), buf.size(), pipe)) r.output += buf.data();
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string temp_file(const std::string& name, const std::string& text) {
  const std::string path = std::string(STOWAGE_BINARY_DIR) + "/tools_estimate_test_" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

}  // namespace

// Published parameter counts of the released checkpoints (sum of tensor sizes in the
// Hugging Face safetensors indexes).
TEST(EstimateInput, HuggingFaceConfigWithMoeFields) {
  const std::string mixtral = R"({"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000, "tie_word_embeddings": false,
    "num_local_experts": 8, "num_experts_per_tok": 2, "hidden_act": "silu", "rms_norm_eps": 1e-5})";
  const ModelConfig m = model_from_hf_json(mixtral, "mixtral.json");
  EXPECT_EQ(m.num_experts, 8);
  EXPECT_EQ(m.experts_per_token, 2);
  EXPECT_EQ(total_params(m), total_params(preset("mixtral-8x7b")));
}

TEST(EstimateInput, BadModelsNameTheField) {
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string base = R"({"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": HEADS,
    "intermediate_size": 11008, "vocab_size": 32000})";
  auto with_heads = [&](const std::string& heads) {
    std::string s = base;
    return s.replace(s.find("HEADS"), 5, heads);
  };
  EXPECT_NE(message([&] { model_from_hf_json(with_heads("0")); }).find("num_attention_heads"), std::string::npos);
  EXPECT_NE(message([&] { model_from_hf_json(with_heads("\"32\"")); }).find("num_attention_heads"), std::string::npos);
  EXPECT_NE(message([&] { model_from_hf_json(with_heads("-4")); }).find("num_attention_heads"), std::string::npos);
  EXPECT_THROW(model_from_hf_json(with_heads("32").substr(0, 40)), ParseError);  // truncated
  EXPECT_NE(message([&] { model_from_hf_json("{\"hidden_size\": 4096,, }"); }).find("byte"), std::string::npos);
  EXPECT_NE(message([&] { model_from_hf_json(std::string(200, '[') + std::string(200, ']')); }).find("nesting"),
            std::string::npos);
  EXPECT_NE(message([&] { model_from_hf_json("{\"hidden_size\": 1}"); }).find("num_hidden_layers"), std::string::npos);

  RunConfig c = config_for("llama2-7b");
  c.parallel.tp = 3;
  EXPECT_NE(message([&] { estimate_memory(c); }).find("tensor-parallel (3)"), std::string::npos);
  c = config_for("llama2-7b");
  c.training.seq_length = -5;
  EXPECT_NE(message([&] { estimate_memory(c); }).find("seq-length"), std::string::npos);
  c = config_for("llama2-7b");
  c.parallel.pp = 5;
  EXPECT_NE(message([&] { estimate_memory(c); }).find("num_layers"), std::string::npos);
  c = config_for("llama2-7b");  // within every bound, but beyond any device: refused, no overflow
  c.model.hidden_size = c.model.ffn_hidden_size = 1 << 22;
  c.model.num_layers = 1 << 14;
  c.training.seq_length = 1 << 24;
  c.training.micro_batch = 1 << 20;
  c.training.flash_attention = false;
  EXPECT_NE(message([&] { estimate_memory(c); }).find("2^62"), std::string::npos);
  EXPECT_THROW(tools::parse_byte_size("-80GiB"), InvalidArgument);
  EXPECT_THROW(tools::parse_byte_size("80 parsecs"), InvalidArgument);
  EXPECT_EQ(tools::parse_byte_size("80GiB"), std::int64_t{80} << 30);
  EXPECT_EQ(tools::parse_byte_size("1.5 GB"), 1500000000);
}

TEST(EstimateInput, MegatronArgumentsAsPasted) {
  RunConfig c;
  const auto ignored = apply_megatron_args(
      "--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 \\\n"
      " --group-query-attention --num-query-groups 8 --seq-length 8192 --micro-batch-size 2 "
      "--tensor-model-parallel-size 4 --use-distributed-optimizer --bf16 --swiglu --normalization RMSNorm "
      "--recompute-granularity selective --untie-embeddings-and-output-weights --disable-bias-linear "
      "--position-embedding-type rope --attention-dropout 0.0 --hidden-dropout 0.0 --vocab-size 128256 "
      "--lr 3e-4 --data-path '/data/my corpus' --use-mcore-models",
      c);
  EXPECT_EQ(c.model.num_layers, 32);
  EXPECT_EQ(c.model.kv_heads(), 8);
  EXPECT_EQ(c.training.seq_length, 8192);
  EXPECT_EQ(c.training.micro_batch, 2);
  EXPECT_EQ(c.parallel.tp, 4);
  EXPECT_EQ(c.parallel.zero_stage, 1);
  EXPECT_EQ(c.training.grad_bytes, 4);  // Megatron: bf16 → fp32 main grads
  EXPECT_EQ(c.recompute.granularity, Recompute::selective);
  EXPECT_FALSE(c.model.dropout);
  EXPECT_EQ(total_params(c.model), total_params(preset("llama3-8b")));
  ASSERT_EQ(ignored.size(), 3u);
  EXPECT_EQ(ignored[0], "--lr 3e-4");
  EXPECT_EQ(ignored[1], "--data-path /data/my corpus");
  EXPECT_EQ(ignored[2], "--use-mcore-models");
  EXPECT_THROW(apply_megatron_args("--num-layers", c), InvalidArgument);
  EXPECT_THROW(apply_megatron_args("--num-layers x32", c), InvalidArgument);
  EXPECT_THROW(apply_megatron_args("--data-path 'open", c), ParseError);
}

TEST(EstimateInput, DeepSpeedConfig) {
  RunConfig c = config_for("llama2-7b");
  apply_deepspeed_config(R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": "auto",
    "bf16": {"enabled": true}, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
    "offload_param": {"device": "none"}, "reduce_bucket_size": 2e8}})",
                         c);
  EXPECT_EQ(c.training.micro_batch, 4);
  EXPECT_EQ(c.parallel.zero_stage, 3);
  EXPECT_TRUE(c.parallel.offload_optimizer_deepspeed);
  EXPECT_FALSE(c.parallel.offload_param_deepspeed);
  EXPECT_EQ(c.parallel.reduce_bucket_elements, 200000000);
  EXPECT_EQ(c.parallel.accounting, Accounting::deepspeed);
  try {
    apply_deepspeed_config(R"({"zero_optimization": {"stage": "two"}})", c);
    FAIL();
  } catch (const ParseError& e) {
    EXPECT_NE(std::string(e.what()).find("zero_optimization"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("stage"), std::string::npos);
  }
  EXPECT_THROW(apply_deepspeed_config(R"({"zero_optimization": {"stage": 7}})", c), ParseError);
  EXPECT_THROW(apply_deepspeed_config(R"({"zero_optimization": {"offload_optimizer": {"device": "gpu"}}})", c), ParseError);
  EXPECT_THROW(apply_deepspeed_config("[1, 2", c), ParseError);
}

TEST(EstimateCommand, ExitCodesAndMessages) {
  auto ok = run_cli("estimate --model llama2-7b --tp 4 --dp 2 --distributed-optimizer --json");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("predicted_peak_allocated_bytes"), std::string::npos);
  auto bad_tp = run_cli("estimate --model llama2-7b --tp 3");
  EXPECT_EQ(bad_tp.exit_code, 2);
  EXPECT_NE(bad_tp.output.find("tensor-parallel"), std::string::npos);
  auto negative = run_cli("estimate --seq -4");
  EXPECT_EQ(negative.exit_code, 2);
  EXPECT_NE(negative.output.find("seq"), std::string::npos);
  const std::string bad_json = temp_file("bad.json", "{\"hidden_size\": 4096, \"num_hidden_layers\": ");
  auto malformed = run_cli("estimate --model-json " + bad_json);
  EXPECT_EQ(malformed.exit_code, 2);
  EXPECT_NE(malformed.output.find("byte"), std::string::npos);
  const std::string zero_heads = temp_file("zero_heads.json",
      R"({"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 0, "intermediate_size": 11008, "vocab_size": 32000})");
  auto heads = run_cli("estimate --model-json " + zero_heads);
  EXPECT_EQ(heads.exit_code, 2);
  EXPECT_NE(heads.output.find("num_attention_heads"), std::string::npos);
  auto megatron = run_cli("estimate --megatron-args \"--num-layers 32 --hidden-size 4096 --num-attention-heads 32 "
                          "--seq-length 4096 --bf16 --swiglu --foo 3\"");
  EXPECT_EQ(megatron.exit_code, 0) << megatron.output;
  EXPECT_NE(megatron.output.find("ignored megatron arguments: --foo 3"), std::string::npos);
  auto fit_run = run_cli("estimate --model llama2-7b --tp 8 --fit 80GiB --json");
  EXPECT_EQ(fit_run.exit_code, 0) << fit_run.output;
  EXPECT_NE(fit_run.output.find("with_stowage"), std::string::npos);
  auto bad_fit = run_cli("estimate --fit 80XB");
  EXPECT_EQ(bad_fit.exit_code, 2);
  EXPECT_NE(bad_fit.output.find("--fit"), std::string::npos);
}
