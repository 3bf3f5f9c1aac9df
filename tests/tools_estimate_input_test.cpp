// The estimate's inputs: Hugging Face config.json, Megatron-LM arguments, byte sizes; their error
// paths; and the command's exit codes and messages. DeepSpeed configs: tools_estimate_deepspeed_test.cpp.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "stowage/byte_size.hpp"
#include "stowage/error.hpp"
#include "tools/estimate/comparison.hpp"
#include "tools/estimate/megatron_arg_names.hpp"
#include "tools/estimate/megatron_args.hpp"
#include "tools/estimate/memory_size.hpp"
#include "tools/estimate/model_config.hpp"

#include <nlohmann/json.hpp>
#include "tools/estimate/report.hpp"
#include "tools_estimate_test_util.hpp"

using namespace stowage;
using namespace stowage::estimate;
using namespace stowage::testing;

namespace {

std::int64_t total_params(const ModelConfig& m) { return count_parameters(m, m.vocab_size).total(); }

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
  EXPECT_THROW(parse_byte_size("-80GiB"), ParseError);
  EXPECT_THROW(parse_byte_size("80 parsecs"), ParseError);
  EXPECT_EQ(parse_byte_size("80GiB"), std::size_t{80} << 30);
  EXPECT_EQ(parse_byte_size("1.5 GB"), 1500000000u);
  EXPECT_EQ(parse_byte_size("0.1 GiB"), 107374182u);  // a fraction of a unit: the nearest byte
  EXPECT_THROW(estimate::parse_byte_count("5000000 TiB", "--x"), InvalidArgument);  // past the model's int64
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
  // Megatron arguments that do not change memory are accepted and counted, not applied.
  ASSERT_EQ(ignored.no_effect.size(), 3u);
  EXPECT_EQ(ignored.no_effect[0], "--lr 3e-4");
  EXPECT_EQ(ignored.no_effect[1], "--data-path /data/my corpus");
  EXPECT_EQ(ignored.no_effect[2], "--use-mcore-models");
  EXPECT_TRUE(ignored.unknown.empty());
  EXPECT_TRUE(c.warnings.empty());
  EXPECT_THROW(apply_megatron_args("--num-layers", c), InvalidArgument);
  EXPECT_THROW(apply_megatron_args("--num-layers x32", c), InvalidArgument);
  EXPECT_THROW(apply_megatron_args("--data-path 'open", c), ParseError);
}

// Values that once read as "not given" (0, -1), and options that contradict each other.
TEST(EstimateCommand, GivenValuesAreCheckedNotTakenForUnset) {
  const std::pair<const char*, const char*> refused[] = {
      {"--zero -1", "--zero must be 0 to 3"},
      {"--swap-attention --prefetch-window -1", "prefetch-window must not be negative"},
      {"--recompute full --recompute-num-layers -1", "recompute-num-layers must not be negative"},
      {"--optimizer-offload streamed --stream-window 0", "--stream-window must be a positive integer"},
      {"--grad-bytes 0", "--grad-bytes must be 2 or 4"},
      {"--model llama2-7b --model-json /dev/null", "--model and --model-json both name the model"},
      {"--model-json /tmp", "it is a directory"},
      {"--global-batch 64 --grad-accum 3 --dp 4", "--global-batch 64 is 16 micro-batches of 1 on 4 data-parallel"},
      {"--megatron-args \"--num-layers 2 --hidden-size 64 --num-attention-heads 4 --bf16 --fp16\"",
       "--bf16 and --fp16 together"},
  };
  for (const auto& [args, message] : refused) {
    const auto r = run_cli(std::string("estimate ") + args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << ": " << r.output;
  }
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
  const std::string zero_heads = temp_file(
      "zero_heads.json",
      R"({"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 0, "intermediate_size": 11008, "vocab_size": 32000})");
  auto heads = run_cli("estimate --model-json " + zero_heads);
  EXPECT_EQ(heads.exit_code, 2);
  EXPECT_NE(heads.output.find("num_attention_heads"), std::string::npos);
  auto megatron = run_cli(
      "estimate --megatron-args \"--num-layers 32 --hidden-size 4096 --num-attention-heads 32 "
      "--seq-length 4096 --bf16 --swiglu --foo 3\"");
  EXPECT_EQ(megatron.exit_code, 2) << megatron.output;
  EXPECT_NE(megatron.output.find("unknown argument '--foo'"), std::string::npos) << megatron.output;
  EXPECT_NE(megatron.output.find("--ignore-unknown-megatron-args"), std::string::npos);
  auto skipped = run_cli(
      "estimate --ignore-unknown-megatron-args --megatron-args \"--num-layers 32 --hidden-size 4096 "
      "--num-attention-heads 32 --seq-length 4096 --bf16 --swiglu --foo 3\"");
  EXPECT_EQ(skipped.exit_code, 0) << skipped.output;
  EXPECT_NE(skipped.output.find("ignored unknown arguments: --foo 3"), std::string::npos) << skipped.output;
  auto fit_run = run_cli("estimate --model llama2-7b --tp 8 --fit 80GiB --json");
  EXPECT_EQ(fit_run.exit_code, 0) << fit_run.output;
  EXPECT_NE(fit_run.output.find("with_stowage"), std::string::npos);
  auto bad_fit = run_cli("estimate --fit 80XB");
  EXPECT_EQ(bad_fit.exit_code, 2);
  EXPECT_NE(bad_fit.output.find("--fit"), std::string::npos);
}

// Issue 23: sizes of 0 are errors (0 used to mean "not given" and was silently ignored), a device
// budget needs a unit, the Megatron text may not be empty. Issue 20: --allocator-overhead -5 and
// nan were accepted. Each of these exited 0 before the fix.
TEST(EstimateCommand, ZeroSizesUnitlessBudgetsAndBadOverheadsAreErrors) {
  for (const char* opt : {"--tp", "--dp", "--pp", "--micro-batch", "--seq", "--cp", "--ep", "--vpp"}) {
    auto r = run_cli(std::string("estimate ") + opt + " 0");
    EXPECT_EQ(r.exit_code, 2) << opt << ": " << r.output;
    EXPECT_NE(r.output.find(std::string(opt) + " must be a positive integer, got 0"), std::string::npos) << r.output;
  }
  auto unitless = run_cli("estimate --model llama2-7b --tp 8 --fit 80");
  EXPECT_EQ(unitless.exit_code, 2);
  EXPECT_NE(unitless.output.find("'80' has no unit"), std::string::npos) << unitless.output;
  EXPECT_EQ(run_cli("estimate --model llama2-7b --tp 8 --fit 80GiB").exit_code, 0);
  auto empty = run_cli("estimate --megatron-args \"\"");
  EXPECT_EQ(empty.exit_code, 2);
  EXPECT_NE(empty.output.find("megatron-args: empty"), std::string::npos) << empty.output;
  auto blank = run_cli("estimate --megatron-args \"   \"");
  EXPECT_EQ(blank.exit_code, 2);
  for (const char* v : {"-5", "nan", "inf", "4.5"}) {
    auto r = run_cli(std::string("estimate --allocator-overhead ") + v);
    EXPECT_EQ(r.exit_code, 2) << v << ": " << r.output;
    EXPECT_NE(r.output.find("--allocator-overhead must be a fraction between 0 and 4"), std::string::npos) << r.output;
  }
  EXPECT_EQ(run_cli("estimate --allocator-overhead 0").exit_code, 0);
}

// One spelling of the shared-storage rounding modes across the tool: the library's (half_up,
// nearest_even), as `stowage demo` prints them.
TEST(EstimateCommand, RoundingUsesTheLibrarySpelling) {
  auto ok = run_cli("estimate --shared-storage --rounding nearest_even --json");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("\"rounding\": \"nearest_even\""), std::string::npos);
  auto old = run_cli("estimate --shared-storage --rounding half-away");
  EXPECT_EQ(old.exit_code, 2);
  EXPECT_NE(old.output.find("expected one of: half_up, nearest_even"), std::string::npos) << old.output;
  EXPECT_EQ(parse_rounding("half_up"), Rounding::half_up);
  // The demo takes the same spelling only (it also took nearest-even, half-up and half-away).
  auto demo = run_cli("demo --rounding half-away --steps 1");
  EXPECT_EQ(demo.exit_code, 2) << demo.output;
  EXPECT_NE(demo.output.find("--rounding must be nearest_even or half_up"), std::string::npos) << demo.output;
}

TEST(EstimateInput, UnknownMegatronArgumentsSuggestKnownOnes) {
  RunConfig c;
  try {
    apply_megatron_args("--num-layers 2 --hiden-size 64", c);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown argument '--hiden-size' (did you mean '--hidden-size'?)"),
              std::string::npos)
        << e.what();
  }
  RunConfig d;
  const auto r = apply_megatron_args("--num-layers 2 --hiden-size 64 --zzzzzzzzzzzz", d, UnknownArguments::ignore);
  ASSERT_EQ(r.unknown.size(), 2u);
  EXPECT_EQ(r.unknown[0], "--hiden-size 64");
  EXPECT_EQ(d.model.num_layers, 2);
  EXPECT_THROW(apply_megatron_args("   ", d), InvalidArgument);
  EXPECT_THROW(apply_megatron_args("num-layers 2", d), InvalidArgument);  // not an argument
  EXPECT_THROW(apply_megatron_args("--hidden-dropout 1.5", d), InvalidArgument);
}

// Known Megatron arguments that change memory but are not modelled warn (config.warnings);
// modelled ones change the estimate.
TEST(EstimateInput, MegatronArgumentsModelledOrWarned) {
  RunConfig c;
  const auto r = apply_megatron_args(
      "--num-layers 4 --hidden-size 512 --num-attention-heads 8 --fp8-format hybrid "
      "--tp-comm-overlap --lr 1e-4",
      c);
  ASSERT_EQ(r.unmodelled.size(), 2u);
  EXPECT_EQ(r.unmodelled[0], "--fp8-format hybrid");
  ASSERT_EQ(c.warnings.size(), 2u);
  EXPECT_NE(c.warnings[0].find("--fp8-format changes memory"), std::string::npos);
  // Megatron-LM arguments.py: SwiGLU without --ffn-hidden-size is int(4h·2/3 / 64)·64.
  RunConfig s;
  apply_megatron_args("--num-layers 2 --hidden-size 512 --num-attention-heads 8 --swiglu", s);
  EXPECT_EQ(s.model.ffn_hidden_size, 1344);  // 4·512·2/3 = 1365.3 → 21·64
  RunConfig g;
  apply_megatron_args("--num-layers 2 --hidden-size 4096 --num-attention-heads 32 --swiglu", g);
  EXPECT_EQ(g.model.ffn_hidden_size, 10880);  // 10922.7 → 170·64
  RunConfig n;
  apply_megatron_args("--num-layers 2 --hidden-size 512 --num-attention-heads 8", n);
  EXPECT_EQ(n.model.ffn_hidden_size, 2048);
  // --recompute-method is read (it was dropped silently before); unfused attention stores s².
  RunConfig u;
  apply_megatron_args(
      "--num-layers 4 --hidden-size 512 --num-attention-heads 8 --recompute-granularity full "
      "--recompute-method uniform --recompute-num-layers 2 --attention-backend unfused",
      u);
  EXPECT_EQ(u.recompute.method, RecomputeMethod::uniform);
  EXPECT_FALSE(u.training.flash_attention);
  RunConfig l;
  apply_megatron_args("--num-layers 4 --hidden-size 512 --num-attention-heads 8 --transformer-impl local", l);
  EXPECT_FALSE(l.training.flash_attention);
  EXPECT_EQ(l.framework.te_workspace, 0);
  RunConfig te;
  apply_megatron_args("--num-layers 4 --hidden-size 512 --num-attention-heads 8 --bf16", te);
  EXPECT_TRUE(te.training.flash_attention);
  EXPECT_EQ(te.framework.te_workspace, std::int64_t{32} << 20);
  // TransformerEngine's flash and fused attention take 16-bit inputs: fp32 training runs its
  // unfused attention under auto, and flash or fused leave it no backend.
  RunConfig fp32;
  apply_megatron_args("--num-layers 4 --hidden-size 512 --num-attention-heads 8", fp32);
  EXPECT_FALSE(fp32.training.flash_attention);
  for (const char* backend : {"flash", "fused"}) {
    RunConfig r;
    EXPECT_THROW(
        apply_megatron_args(
            std::string("--num-layers 4 --hidden-size 512 --num-attention-heads 8 --attention-backend ") + backend, r),
        InvalidArgument)
        << backend;
  }
}

namespace {

// A preset (or a config.json) refined by Megatron arguments keeps what they leave out: the
// arguments' own defaults (tied embeddings, LayerNorm, biases, GeLU) shape only a model they define.
TEST(EstimateInput, MegatronArgumentsRefineAGivenModelWithoutItsDefaults) {
  for (const char* name : {"llama2-7b", "mixtral-8x7b", "gpt3-175b"}) {
    RunConfig c;
    c.model = preset(name);
    const ModelConfig before = c.model;
    apply_megatron_args("--tensor-model-parallel-size 4 --bf16 --lr 1e-4", c);
    EXPECT_EQ(count_parameters(c.model, c.model.vocab_size).total(),
              count_parameters(before, before.vocab_size).total())
        << name;
    EXPECT_EQ(c.model.kv_heads(), before.kv_heads()) << name;
    EXPECT_EQ(c.parallel.tp, 4);
  }
  RunConfig r;  // what is given does change it
  r.model = preset("llama2-7b");
  apply_megatron_args("--untie-embeddings-and-output-weights --num-layers 16 --group-query-attention", r);
  EXPECT_EQ(r.model.num_layers, 16);
  EXPECT_EQ(r.model.kv_heads(), 1);  // arguments.py: --num-query-groups defaults to 1
  EXPECT_TRUE(r.model.gated_mlp && r.model.rms_norm && !r.model.linear_bias() && !r.model.tie_embeddings);
}

// What a launch line decides whatever the checkpoint: dropout (Megatron's 0.1 unless given), and
// the sizes Megatron derives from what the line sets (heads without GQA, an ffn from the hidden size).
TEST(EstimateInput, MegatronArgumentsDecideTheRunsDropoutAndWhatTheyDerive) {
  RunConfig c;
  c.model = preset("llama2-7b");
  apply_megatron_args("--bf16", c);
  EXPECT_TRUE(c.model.dropout && c.model.attention_dropout);
  RunConfig off;
  off.model = preset("llama2-7b");
  apply_megatron_args("--hidden-dropout 0 --attention-dropout 0", off);
  EXPECT_FALSE(off.model.dropout || off.model.attention_dropout);
  RunConfig d;
  d.model = preset("llama2-70b");  // GQA 8, ffn 28672
  apply_megatron_args("--num-attention-heads 32 --hidden-size 4096", d);
  EXPECT_EQ(d.model.kv_heads(), 32);          // heads without --group-query-attention: multi-head
  EXPECT_EQ(d.model.ffn_hidden_size, 10880);  // SwiGLU's ffn for h 4096 (the model stays gated)
}

TEST(EstimateInput, MegatronSizesWhoseZeroWouldMeanUnsetAreRefused) {
  for (const char* args : {"--num-layers 2 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 0",
                           "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --group-query-attention "
                           "--num-query-groups 0",
                           "--num-layers 2 --hidden-size 64 --num-attention-heads 4 "
                           "--recompute-activation-function --recompute-activation-function-num-layers -1"}) {
    RunConfig c;
    EXPECT_THROW(apply_megatron_args(args, c), InvalidArgument) << args;
  }
}

// Its own count is not modelled: the full recompute keeps --recompute-num-layers, and a warning says so.
TEST(EstimateInput, ActivationFunctionRecomputeLayersLeaveFullRecomputesCount) {
  RunConfig c;
  apply_megatron_args(
      "--num-layers 32 --hidden-size 512 --num-attention-heads 8 --recompute-granularity full --recompute-method "
      "block --recompute-num-layers 4 --recompute-activation-function --recompute-activation-function-num-layers 16",
      c);
  EXPECT_EQ(c.recompute.num_layers, 4);
  EXPECT_TRUE(c.techniques.act_fn_recompute);
  ASSERT_FALSE(c.warnings.empty());
  EXPECT_NE(c.warnings.back().find("--recompute-activation-function-num-layers 16"), std::string::npos);
}

TEST(EstimateInput, IntegersFrom2To63UpAreTooLargeNotNegative) {
  try {
    (void)model_from_hf_json(
        R"({"hidden_size": 18446744073709551615, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 64, "vocab_size": 100})",
        "big.json");
    FAIL() << "accepted";
  } catch (const ParseError& e) {
    EXPECT_NE(std::string(e.what()).find("big.json: field 'hidden_size' is too large"), std::string::npos) << e.what();
  }
}

}  // namespace

namespace {

nlohmann::json hf_configs() {
  std::ifstream in(std::string(STOWAGE_SOURCE_DIR) + "/tests/data/hf_configs.json");
  return nlohmann::json::parse(in);
}

// Released checkpoints' config.json files: each family's architecture (the biases, norms and
// tying its config does not spell out) gives the checkpoint's exact parameter count, with no warning.
TEST(EstimateInput, HuggingFaceConfigsCountTheirCheckpointsParametersExactly) {
  const nlohmann::json all = hf_configs();
  ASSERT_GE(all.at("counted").size(), 18u);
  for (const auto& c : all.at("counted")) {
    const std::string name = c.at("name").get<std::string>();
    std::vector<std::string> warnings;
    const ModelConfig m = model_from_hf_json(c.at("config").dump(), name, &warnings);
    EXPECT_EQ(count_parameters(m, m.vocab_size).total(), c.at("parameters").get<std::int64_t>()) << name;
    EXPECT_TRUE(warnings.empty()) << name << ": " << (warnings.empty() ? "" : warnings[0]);
  }
}

// DeepSeek-MoE 16B (modeling_deepseek.py DeepseekDecoderLayer): layer i is MoE when i >=
// first_k_dense_replace and i % moe_layer_freq == 0, else a dense MLP of intermediate_size. Its
// first layer is dense: 16375728128 parameters, the released checkpoint's (hf_configs.json).
TEST(EstimateInput, DeepSeekMoeDenseFirstLayerIsCounted) {
  const nlohmann::json all = hf_configs();
  bool found = false;
  for (const auto& c : all.at("counted")) {
    if (c.at("name") != "deepseek-moe-16b") continue;
    found = true;
    const ModelConfig m = model_from_hf_json(c.at("config").dump(), "deepseek-moe-16b");
    ASSERT_EQ(m.moe_layer_pattern.size(), 28u);
    EXPECT_EQ(m.moe_layer_pattern[0], 0);
    EXPECT_EQ(m.moe_layers(0, 28), 27);
    EXPECT_TRUE(m.mixed_layers());
    const ParameterCounts p = count_parameters(m, m.vocab_size);
    const std::int64_t h = 2048;
    EXPECT_EQ(p.dense_layers, 1);
    EXPECT_EQ(p.dense_mlp, 3 * h * 10944);
    EXPECT_EQ(p.mlp_experts, 64 * 3 * h * 1408);
    EXPECT_EQ(p.mlp_shared, 3 * h * 2 * 1408);
    // One dense layer, 27 MoE layers, untied embedding and output, the final norm.
    const std::int64_t attention = 4 * h * h, norms = 2 * h;
    EXPECT_EQ(p.total(), (attention + 3 * h * 10944 + norms) +
                             27 * (attention + 64 * h + 64 * 3 * h * 1408 + 3 * h * 2816 + norms) + 2 * 102400 * h + h);
  }
  EXPECT_TRUE(found);
}

// Qwen2-MoE (transformers modeling_qwen2_moe.py): each MoE layer has routed experts of
// moe_intermediate_size, one shared expert MLP of shared_expert_intermediate_size and its
// Linear(h, 1) gate, without biases; q, k and v keep theirs.
TEST(EstimateInput, Qwen2MoeSharedExpertAndGateAreCounted) {
  const nlohmann::json all = hf_configs();
  for (const auto& c : all.at("counted")) {
    if (c.at("name") != "qwen1.5-moe-a2.7b") continue;
    const ModelConfig m = model_from_hf_json(c.at("config").dump(), "qwen1.5-moe-a2.7b");
    EXPECT_EQ(m.num_experts, 60);
    EXPECT_EQ(m.experts_per_token, 4);
    EXPECT_EQ(m.expert_ffn(), 1408);
    EXPECT_EQ(m.shared_expert_ffn_hidden_size, 5632);
    EXPECT_TRUE(m.shared_expert_gate);
    const ParameterCounts p = count_parameters(m, m.vocab_size);
    const std::int64_t h = 2048;
    EXPECT_EQ(p.mlp_shared, 3 * h * 5632);
    EXPECT_EQ(p.shared_gate, h);
    EXPECT_EQ(p.mlp_experts, 60 * 3 * h * 1408);
    EXPECT_EQ(p.mlp_dense, 60 * h);  // the router
    EXPECT_EQ(p.attention, 4 * h * h + 3 * h);
  }
  // Qwen2MoeDecoderLayer: layer i is MoE when it is not in mlp_only_layers and (i + 1) %
  // decoder_sparse_step == 0; the others are a dense MLP of intermediate_size.
  const std::string base = R"({"model_type": "qwen2_moe", "hidden_size": 64, "num_hidden_layers": 4,
      "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100, "num_experts": 4,
      "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64)";
  const ModelConfig all_moe = model_from_hf_json(base + R"(, "decoder_sparse_step": 1, "mlp_only_layers": []})");
  EXPECT_TRUE(all_moe.moe_layer_pattern.empty());
  const ModelConfig every_second = model_from_hf_json(base + R"(, "decoder_sparse_step": 2})");
  EXPECT_EQ(every_second.moe_layer_pattern, (std::vector<std::uint8_t>{0, 1, 0, 1}));
  const ModelConfig listed = model_from_hf_json(base + R"(, "mlp_only_layers": [0, 3]})");
  EXPECT_EQ(listed.moe_layer_pattern, (std::vector<std::uint8_t>{0, 1, 1, 0}));
  // A dense layer: q, k, v (with biases) and o, a SwiGLU MLP of 128, two RMSNorms; an MoE layer adds
  // the router, 4 experts of 32, the shared expert of 64 and its gate instead of that MLP.
  const std::int64_t h = 64, attention = 4 * h * h + 3 * h, norms = 2 * h;
  const std::int64_t dense = attention + 3 * h * 128 + norms;
  const std::int64_t moe = attention + 4 * h + 4 * 3 * h * 32 + 3 * h * 64 + h + norms;
  EXPECT_EQ(count_parameters(every_second, 100).total(), 2 * dense + 2 * moe + 2 * 100 * h + h);
  EXPECT_EQ(count_parameters(all_moe, 100).total(), 4 * moe + 2 * 100 * h + h);
  EXPECT_THROW((void)model_from_hf_json(base + R"(, "decoder_sparse_step": 0})"), ParseError);
  EXPECT_THROW((void)model_from_hf_json(base + R"(, "mlp_only_layers": [0.5]})"), ParseError);
}

// DeepSeek-MoE's layout (n_routed_experts, n_shared_experts × moe_intermediate_size in one MLP,
// no gate) when every layer is MoE; MLA (kv_lora_rank, DeepSeek-V2/V3) is refused.
TEST(EstimateInput, DeepSeekSharedExpertsAreOneMlpOfTheirTotalWidth) {
  const std::string base = R"({"model_type": "deepseek", "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100, "n_routed_experts": 8,
      "num_experts_per_tok": 2, "moe_intermediate_size": 16, "n_shared_experts": 2, "first_k_dense_replace": 0,
      "rms_norm_eps": 1e-6)";
  std::vector<std::string> warnings;
  const ModelConfig m = model_from_hf_json(base + R"(, "moe_layer_freq": 1})", "deepseek.json", &warnings);
  EXPECT_EQ(m.num_experts, 8);
  EXPECT_EQ(m.shared_expert_ffn_hidden_size, 32);
  EXPECT_FALSE(m.shared_expert_gate);
  const std::int64_t h = 64;
  // Per layer: attention 4h², router 8h, 8 experts of 3·h·16, shared 3·h·32, two RMSNorms.
  const std::int64_t layer = 4 * h * h + 8 * h + 8 * 3 * h * 16 + 3 * h * 32 + 2 * h;
  EXPECT_EQ(count_parameters(m, 100).total(), 2 * layer + 2 * 100 * h + h);
  EXPECT_THROW((void)model_from_hf_json(base + R"(, "kv_lora_rank": 512})"), ParseError);
  EXPECT_TRUE(warnings.empty());
  // first_k_dense_replace 1 and moe_layer_freq 2: layer 0 is below it, layers 1 and 3 are odd.
  const std::string four = R"({"model_type": "deepseek", "hidden_size": 64, "num_hidden_layers": 4,
      "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100, "n_routed_experts": 8,
      "num_experts_per_tok": 2, "moe_intermediate_size": 16, "n_shared_experts": 2, "rms_norm_eps": 1e-6)";
  EXPECT_EQ(model_from_hf_json(four + R"(, "first_k_dense_replace": 1, "moe_layer_freq": 2})").moe_layer_pattern,
            (std::vector<std::uint8_t>{0, 0, 1, 0}));
  EXPECT_EQ(model_from_hf_json(four + R"(, "first_k_dense_replace": 3})").moe_layer_pattern,
            (std::vector<std::uint8_t>{0, 0, 0, 1}));
  EXPECT_THROW((void)model_from_hf_json(four + R"(, "first_k_dense_replace": -1})"), ParseError);
}

TEST(EstimateInput, ZeroKeyValueHeadsAreRefusedNotReadAsMultiHead) {
  EXPECT_THROW((void)model_from_hf_json(
                   R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "num_key_value_heads": 0, "intermediate_size": 128, "vocab_size": 100})"),
               ParseError);
}

TEST(EstimateInput, AnUnknownModelTypeIsReadWithAWarningThatSaysHow) {
  std::vector<std::string> warnings;
  const ModelConfig m = model_from_hf_json(
      R"({"model_type": "newarch", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "intermediate_size": 128, "vocab_size": 100, "hidden_act": "gelu", "layer_norm_eps": 1e-5})",
      "new.json", &warnings);
  EXPECT_FALSE(m.gated_mlp);
  EXPECT_FALSE(m.rms_norm);  // layer_norm_eps, as GPT-NeoX and Phi spell it
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("model_type 'newarch' is not one the estimate knows"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("a plain MLP, LayerNorm, untied embeddings"), std::string::npos) << warnings[0];
}

}  // namespace

// Checks of --megatron-args against Megatron-LM d98e8a6 (arguments.py, transformer_config.py,
// recompute.py) and MindSpeed 028de58; each case was accepted or misread before the fix.
namespace {

// Llama 2 7B as a Megatron launch line.
const std::string kLlama7b =
    "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 --max-position-embeddings 4096 "
    "--micro-batch-size 1 --bf16 --vocab-size 32000 --swiglu --ffn-hidden-size 11008 --normalization RMSNorm "
    "--disable-bias-linear --position-embedding-type rope --untie-embeddings-and-output-weights";

CommandResult estimate_line(const std::string& extra, const std::string& options = "--dp 8") {
  return run_cli("estimate --megatron-args \"" + kLlama7b + " " + extra + "\" " + options);
}

std::string refusal(const std::string& extra) {
  RunConfig c;
  try {
    apply_megatron_args(kLlama7b + " " + extra, c);
    return "accepted";
  } catch (const InvalidArgument& e) {
    return e.what();
  }
}

// arguments.py: --recompute-activations sets recompute_granularity = 'selective'.
TEST(EstimateMegatron, RecomputeActivationsIsSelectiveRecompute) {
  RunConfig c;
  const auto r = apply_megatron_args(kLlama7b + " --recompute-activations", c);
  EXPECT_EQ(c.recompute.granularity, Recompute::selective);
  EXPECT_TRUE(r.no_effect.empty());
  for (const char* line : {"--transformer-impl local --recompute-activations",
                           "--transformer-impl local --recompute-granularity selective"}) {
    const auto out = estimate_line(line);
    ASSERT_EQ(out.exit_code, 0) << out.output;
    EXPECT_NE(out.output.find("peak allocated                          130.90 GiB"), std::string::npos) << out.output;
    EXPECT_EQ(out.output.find("core_attention"), std::string::npos) << out.output;  // no row left for it
  }
}

// recompute.py: block recomputes layers with index < n, so n = 0 recomputes none (stowage's own
// --recompute-num-layers 0 means all of them); TransformerConfig refuses the incomplete lines.
TEST(EstimateMegatron, RecomputeFollowsMegatronsRules) {
  RunConfig c;
  apply_megatron_args(kLlama7b + " --recompute-granularity full --recompute-method block --recompute-num-layers 0", c);
  EXPECT_EQ(c.recompute.granularity, Recompute::none);
  ASSERT_FALSE(c.notes.empty());
  EXPECT_EQ(c.notes.front(),
            "megatron-args: --recompute-method block --recompute-num-layers 0 recomputes no layer (Megatron-LM); "
            "estimated without recompute");
  RunConfig four;
  apply_megatron_args(kLlama7b + " --recompute-granularity full --recompute-method block --recompute-num-layers 4",
                      four);
  EXPECT_EQ(four.recompute.granularity, Recompute::full);
  EXPECT_EQ(four.recompute.num_layers, 4);
  const std::pair<const char*, const char*> refused[] = {
      {"--recompute-granularity full",
       "megatron-args: --recompute-granularity full needs --recompute-method block or uniform (Megatron-LM refuses "
       "it without)"},
      {"--recompute-granularity full --recompute-method block",
       "megatron-args: --recompute-granularity full needs --recompute-num-layers (Megatron-LM refuses it without)"},
      {"--recompute-granularity full --recompute-method uniform --recompute-num-layers 0",
       "megatron-args: --recompute-method uniform with --recompute-num-layers 0: a chunk needs at least 1 layer"},
      {"--recompute-granularity selective --recompute-num-layers 2",
       "megatron-args: --recompute-num-layers 2 with --recompute-granularity selective: Megatron-LM takes no layer "
       "count for selective recompute"},
      {"--recompute-granularity selective --recompute-method uniform",
       "megatron-args: --recompute-method uniform with --recompute-granularity selective: Megatron-LM takes no "
       "method for selective recompute"},
      {"--recompute-activations --recompute-granularity full --recompute-method block --recompute-num-layers 2",
       "megatron-args: --recompute-method block with --recompute-activations: Megatron-LM takes no method for "
       "selective recompute"},
      {"--recompute-granularity none", "megatron-args: --recompute-granularity 'none' is not one of full, selective"},
      {"--recompute-granularity full --recompute-method block --recompute-num-layers -1",
       "megatron-args: --recompute-num-layers must not be negative, got -1"},
  };
  for (const auto& [line, message] : refused) EXPECT_EQ(refusal(line), message) << line;
  const auto cli = estimate_line("--recompute-granularity full");
  EXPECT_EQ(cli.exit_code, 2) << cli.output;
  // stowage's own option keeps 0 = every layer of the chunk.
  const auto own = run_cli("estimate --model llama2-7b --recompute full --recompute-num-layers 0 --json");
  ASSERT_EQ(own.exit_code, 0) << own.output;
  EXPECT_NE(own.output.find("\"granularity\": \"full\""), std::string::npos) << own.output;
}

// arguments.py: with --bf16, --grad-reduce-in-bf16 sets accumulate_allreduce_grads_in_fp32 = False,
// even when the line asks for it, so the gradient buffers are bf16.
TEST(EstimateMegatron, GradReduceInBf16KeepsTwoByteGradients) {
  const std::pair<const char*, int> cases[] = {
      {"--grad-reduce-in-bf16", 2},
      {"--accumulate-allreduce-grads-in-fp32 --grad-reduce-in-bf16", 2},
      {"", 4},
  };
  for (const auto& [line, bytes] : cases) {
    RunConfig c;
    apply_megatron_args(kLlama7b + " " + line, c);
    EXPECT_EQ(c.training.grad_bytes, bytes) << line;
  }
  RunConfig fp16;  // the bf16 branch alone reads it
  apply_megatron_args(
      "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --fp16 --accumulate-allreduce-grads-in-fp32 "
      "--grad-reduce-in-bf16",
      fp16);
  EXPECT_EQ(fp16.training.grad_bytes, 4);
  const auto out = estimate_line("--grad-reduce-in-bf16");
  ASSERT_EQ(out.exit_code, 0) << out.output;
  EXPECT_NE(out.output.find("gradients                                12.55 GiB"), std::string::npos) << out.output;
}

// TransformerConfig: moe_router_topk defaults to 2; errors name Megatron's arguments.
TEST(EstimateMegatron, ExpertsWithoutTopkRouteToTwo) {
  RunConfig c;
  apply_megatron_args(kLlama7b + " --num-experts 8", c);
  EXPECT_EQ(c.model.num_experts, 8);
  EXPECT_EQ(c.model.experts_per_token, 2);
  const auto out = estimate_line("--num-experts 8");
  EXPECT_EQ(out.exit_code, 0) << out.output;
  EXPECT_NE(out.output.find("8 experts top-2"), std::string::npos) << out.output;
  EXPECT_EQ(refusal("--num-experts 8 --moe-router-topk 9"),
            "megatron-args: --moe-router-topk 9 is more than --num-experts 8");
  EXPECT_EQ(refusal("--num-experts 0"), "megatron-args: --num-experts must be positive, got 0");
}

TEST(EstimateMegatron, ValuesMegatronRefusesExitTwoNamingThem) {
  const std::pair<const char*, const char*> refused[] = {
      {"--position-embedding-type foo",
       "megatron-args: --position-embedding-type 'foo' is not one of learned_absolute, rope, yarn, mrope, relative, "
       "none"},
      {"--normalization rmsnorm", "megatron-args: --normalization 'rmsnorm' is not one of LayerNorm, RMSNorm"},
      {"--normalization foo", "megatron-args: --normalization 'foo' is not one of LayerNorm, RMSNorm"},
      {"--kv-channels 0", "megatron-args: --kv-channels must be positive, got 0"},
      {"--vocab-size 0", "megatron-args: --vocab-size must be positive, got 0"},
      {"--max-position-embeddings 0", "megatron-args: --max-position-embeddings must be positive, got 0"},
      {"--max-position-embeddings 2048",
       "megatron-args: --max-position-embeddings 2048 is smaller than --seq-length 4096 (Megatron-LM refuses it)"},
      {"--global-batch-size 0", "megatron-args: --global-batch-size must be positive, got 0"},
      {"--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 0",
       "megatron-args: --decoder-first-pipeline-num-layers must be positive, got 0"},
      {"--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 0",
       "megatron-args: --num-layers-per-virtual-pipeline-stage must be positive, got 0"},
      {"--context-parallel-size 3",
       "megatron-args: --seq-length 4096 is not a multiple of 2 × --context-parallel-size 3 (Megatron-LM refuses it)"},
  };
  for (const auto& [line, message] : refused) {
    EXPECT_EQ(refusal(line), message) << line;
    const auto out = estimate_line(line);
    EXPECT_EQ(out.exit_code, 2) << line << ": " << out.output;
    EXPECT_NE(out.output.find(message), std::string::npos) << line << ": " << out.output;
  }
  for (const char* kind : {"learned_absolute", "rope", "yarn", "mrope", "relative", "none"})
    EXPECT_EQ(refusal(std::string("--position-embedding-type ") + kind), "accepted") << kind;
  EXPECT_EQ(refusal("--context-parallel-size 2"), "accepted");
}

// arguments.py: at most one of the virtual-pipeline arguments, and layers per virtual stage not
// with an uneven first/last stage. --virtual-pipeline-model-parallel-size is no flag of its parser.
TEST(EstimateMegatron, VirtualPipelineArgumentsAsMegatronTakesThem) {
  EXPECT_EQ(refusal("--pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 2 "
                    "--num-layers-per-virtual-pipeline-stage 2"),
            "megatron-args: give one of --num-layers-per-virtual-pipeline-stage, "
            "--num-virtual-stages-per-pipeline-rank and --pipeline-model-parallel-layout (Megatron-LM refuses more "
            "than one)");
  EXPECT_EQ(refusal("--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 2 "
                    "--decoder-first-pipeline-num-layers 4"),
            "megatron-args: --num-layers-per-virtual-pipeline-stage with --decoder-first/last-pipeline-num-layers: "
            "Megatron-LM needs --num-virtual-stages-per-pipeline-rank for an uneven pipeline");
  EXPECT_EQ(refusal("--pipeline-model-parallel-size 4 --virtual-pipeline-model-parallel-size 2"),
            "megatron-args: unknown argument '--virtual-pipeline-model-parallel-size' (Megatron-LM has no such flag; "
            "use '--num-virtual-stages-per-pipeline-rank'); --ignore-unknown-megatron-args skips arguments neither "
            "Megatron-LM nor MindSpeed has");
  EXPECT_FALSE(is_megatron_argument("--virtual-pipeline-model-parallel-size"));
  EXPECT_EQ(megatron_argument_names().size(), 949u);  // docs/estimate.md cites the count
  for (const char* line : {"--pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 2",
                           "--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 4"}) {
    RunConfig c;
    apply_megatron_args(kLlama7b + " " + line, c);
    EXPECT_EQ(c.parallel.vpp, 2) << line;
  }
}

// A MindSpeed launch line reads: its own arguments are known, and those that change memory the
// estimate does not model are named in warnings.
TEST(EstimateMegatron, MindSpeedLaunchLinesReadWithWarningsForWhatIsNotModelled) {
  RunConfig c;
  const auto r = apply_megatron_args(
      kLlama7b +
          " --swap-optimizer --recompute-norm --noop-layers 31 --recompute-in-bubble --adaptive-recompute-device-swap "
          "--use-mc2 --tokenizer-name-or-path /models/llama --context-parallel-algo ulysses_cp_algo "
          "--swap-attention --swap-modules input_norm,self_attention",
      c);
  ASSERT_EQ(r.no_effect.size(), 2u);
  EXPECT_EQ(r.no_effect[0], "--use-mc2");
  EXPECT_EQ(r.no_effect[1], "--tokenizer-name-or-path /models/llama");
  EXPECT_EQ(r.unmodelled.size(), 5u);
  ASSERT_EQ(c.warnings.size(), 7u);
  EXPECT_EQ(
      c.warnings[0],
      "--swap-optimizer changes memory (optimizer states swapped to host memory); the estimate does not model it");
  EXPECT_EQ(c.warnings[2],
            "--noop-layers changes memory (layers without weights or activations); the estimate does not model it");
  EXPECT_EQ(c.warnings[5],
            "--context-parallel-algo ulysses_cp_algo changes memory (context-parallel attention other than "
            "Megatron's ring); the estimate models megatron_cp_algo");
  EXPECT_EQ(c.warnings[6],
            "--swap-modules input_norm,self_attention changes memory (other modules swapped); the estimate swaps "
            "input_norm,self_attention,post_attention_norm");
  EXPECT_TRUE(c.techniques.swap_attention);
  EXPECT_TRUE(is_mindspeed_argument("--swap-optimizer"));
  EXPECT_EQ(mindspeed_argument_names().size(), 216u);  // as mindspeed_arg_names.cpp counts them
  EXPECT_FALSE(is_megatron_argument("--swap-optimizer"));
}

// Megatron reads --num-query-groups only with --group-query-attention: the note says so.
TEST(EstimateMegatron, QueryGroupsWithoutGroupedQueryAttentionAreNoted) {
  RunConfig c;
  c.model = preset("llama2-70b");
  apply_megatron_args("--num-query-groups 4", c);
  EXPECT_EQ(c.model.kv_heads(), 8);
  ASSERT_FALSE(c.notes.empty());
  EXPECT_EQ(
      c.notes.front(),
      "megatron-args: --num-query-groups 4 without --group-query-attention is ignored, as Megatron-LM ignores it");
  RunConfig g;
  g.model = preset("llama2-70b");
  apply_megatron_args("--group-query-attention --num-query-groups 4", g);
  EXPECT_EQ(g.model.kv_heads(), 4);
}

}  // namespace
