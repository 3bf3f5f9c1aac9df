// The estimate's inputs: Megatron-LM arguments as pasted, byte sizes; their error paths; and the
// command's exit codes and messages. Hugging Face configs: tools_estimate_hf_config_test.cpp;
// checks against Megatron-LM's rules: tools_estimate_megatron_test.cpp; DeepSpeed configs:
// tools_estimate_deepspeed_test.cpp.
#include <gtest/gtest.h>

#include <string>

#include "stowage/byte_size.hpp"
#include "stowage/error.hpp"
#include "tools/estimate/comparison.hpp"
#include "tools/estimate/megatron_args.hpp"
#include "tools/estimate/memory_size.hpp"
#include "tools/estimate/model_config.hpp"

#include <nlohmann/json.hpp>
#include "tools/estimate/report.hpp"
#include "tools_estimate_test_util.hpp"

using namespace stowage;
using namespace stowage::estimate;
using namespace stowage::testing;

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
      "--tensor-model-parallel-size 2 --sequence-parallel --tp-comm-overlap --lr 1e-4",
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

// Each option that contradicts another source, or a line Megatron-LM would not run, is an error
// (exit 2) naming both; a default that would not hold is adjusted with a note.
TEST(EstimateCommand, ContradictionsAndLimitsOfTheModelAreRefused) {
  auto refused = [](const std::string& args, const std::string& what) {
    const auto r = run_cli("estimate " + args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.output;
    EXPECT_NE(r.output.find(what), std::string::npos) << args << ": " << r.output;
  };
  // GPT-3's learned position table has 2048 rows: the default 4096 is shortened, a longer --seq refused.
  const auto gpt3 = run_cli("estimate --model gpt3-175b --tp 8 --pp 8 --json");
  ASSERT_EQ(gpt3.exit_code, 0) << gpt3.output;
  EXPECT_EQ(nlohmann::json::parse(gpt3.output).at("training").at("seq_length"), 2048);
  refused("--model gpt3-175b --seq 4096",
          "the model's learned position embedding has 2048 rows, fewer than the sequence length 4096; give --seq "
          "2048 or less");
  // --fit --fit-dim seq stops at the table and says so.
  const auto fit = run_cli("estimate --model gpt3-175b --tp 8 --pp 8 --seq 2048 --fit 1000TiB --fit-dim seq --json");
  ASSERT_EQ(fit.exit_code, 0) << fit.output;
  const auto f = nlohmann::json::parse(fit.output);
  EXPECT_EQ(f.at("limit"), 2048);
  EXPECT_EQ(f.at("limit_is_positions"), true);
  EXPECT_EQ(f.at("with_stowage"), 2048);
  // A search step longer than the table (lcm(128, CP·TP) = 2688): nothing the model takes.
  const auto none = run_cli(
      "estimate --model gpt3-175b --tp 3 --sequence-parallel --cp 7 --seq 2016 --pp 8 --fit 80GiB --fit-dim seq "
      "--json");
  ASSERT_EQ(none.exit_code, 0) << none.output;
  EXPECT_EQ(nlohmann::json::parse(none.output).at("with_stowage"), 0);
  // A sequence the launch line states is the line's, not the default: refused beyond the table.
  refused("--model gpt3-175b --megatron-args \"--seq-length 4096\" --tp 8 --pp 8",
          "megatron-args: --seq-length 4096 is longer than the model's learned position embedding (2048 rows");
  // The interleaved schedule needs a group of PP..M micro-batches and no short last group.
  refused("--model llama2-7b --pp 4 --vpp 2 --grad-accum 2",
          "interleaved pipeline: 2 micro-batches a step in groups of 4 per model chunk");
  refused("--model llama2-7b --pp 4 --vpp 2 --grad-accum 6",
          "interleaved pipeline: 6 micro-batches in groups of 4 leave a last group of 2, fewer than "
          "pipeline-parallel (4)");
  EXPECT_EQ(run_cli("estimate --model llama2-7b --pp 4 --vpp 2 --grad-accum 8").exit_code, 0);
  // A batch-size schedule changes the micro-batches per step: the rule is left to the run (a note).
  const auto ramp = run_cli(
      "estimate --model llama2-7b --megatron-args \"--pipeline-model-parallel-size 4 "
      "--num-virtual-stages-per-pipeline-rank 2 --rampup-batch-size 16 16 1000\" --json");
  ASSERT_EQ(ramp.exit_code, 0) << ramp.output;
  EXPECT_NE(ramp.output.find("a batch-size schedule changes the micro-batches per step"), std::string::npos);
  // A global batch from --megatron-args fixes the accumulation.
  refused(
      "--model llama2-7b --megatron-args \"--global-batch-size 64 --micro-batch-size 1 "
      "--pipeline-model-parallel-size 4\" --dp 4 --grad-accum 2",
      "--megatron-args' --global-batch-size 64 is 16 micro-batches of 1 on 4 data-parallel ranks, not "
      "--grad-accum 2");
  // --distributed-optimizer is ZeRO-1: a DeepSpeed config at another stage contradicts it.
  const std::string z2 =
      temp_file("ds_dist_opt_z2.json", R"({"bf16": {"enabled": true}, "zero_optimization": {"stage": 2}})");
  refused("--model llama2-7b --dp 8 --deepspeed-config " + z2 + " --distributed-optimizer",
          "--distributed-optimizer is ZeRO-1 (optimizer states sharded, gradients kept whole), but " + z2 +
              " asks for zero_optimization.stage 2");
  // An uneven stage needs a pipeline.
  refused(
      "--megatron-args \"--num-layers 8 --hidden-size 512 --num-attention-heads 8 --pipeline-model-parallel-size 1 "
      "--decoder-first-pipeline-num-layers 5\"",
      "needs at least 2 pipeline stages, got 1");
  // A tokenizer's vocabulary the estimate cannot read is a warning, not a note.
  const auto tok = run_cli(
      "estimate --megatron-args \"--num-layers 2 --hidden-size 512 --num-attention-heads 8 --tokenizer-type "
      "HuggingFaceTokenizer --tokenizer-model meta-llama/Meta-Llama-3-8B\" --json");
  ASSERT_EQ(tok.exit_code, 0) << tok.output;
  const auto warnings = nlohmann::json::parse(tok.output).at("warnings");
  ASSERT_EQ(warnings.size(), 1u) << tok.output;
  EXPECT_NE(warnings[0].get<std::string>().find("--tokenizer-type HuggingFaceTokenizer gives the vocabulary"),
            std::string::npos);
}
