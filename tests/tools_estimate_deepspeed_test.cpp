// The estimate's DeepSpeed input: a DeepSpeed config read as DeepSpeed runs it (its ZeRO stage,
// offloads, buckets, batch sizes and precision), what it refuses, and how it meets the options.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "stowage/error.hpp"
#include "tools/estimate/deepspeed_config.hpp"
#include "tools/estimate/memory_model.hpp"

#include <nlohmann/json.hpp>
#include "tools_estimate_test_util.hpp"

using namespace stowage;
using namespace stowage::estimate;
using namespace stowage::testing;

namespace {
// The message of the ParseError or InvalidArgument `f` throws ("" when it throws nothing).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

RunConfig with_deepspeed(const std::string& json, std::int64_t dp = 1) {
  RunConfig c = config_for("llama2-7b");
  c.parallel.dp = dp;
  apply_deepspeed_config(json, c, "ds.json");
  resolve_deepspeed_batch(c);
  return c;
}
}  // namespace

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
  EXPECT_THROW(apply_deepspeed_config(R"({"zero_optimization": {"offload_optimizer": {"device": "gpu"}}})", c),
               ParseError);
  EXPECT_THROW(apply_deepspeed_config("[1, 2", c), ParseError);
}

// Old spellings DeepSpeed still maps (zero/config.py): cpu_offload, cpu_offload_param, and
// "zero_optimization": true (stage 1).
TEST(EstimateDeepSpeed, DeprecatedSpellingsAsDeepSpeedMapsThem) {
  RunConfig c =
      with_deepspeed(R"({"zero_optimization": {"stage": 3, "cpu_offload": true, "cpu_offload_param": true}})");
  EXPECT_TRUE(c.parallel.offload_optimizer_deepspeed);
  EXPECT_TRUE(c.parallel.offload_param_deepspeed);
  c = with_deepspeed(R"({"zero_optimization": {"stage": 2, "cpu_offload": false}})");
  EXPECT_FALSE(c.parallel.offload_optimizer_deepspeed);
  c = with_deepspeed(R"({"zero_optimization": true})");
  EXPECT_EQ(c.parallel.zero_stage, 1);
  c = with_deepspeed(R"({"zero_optimization": false})");
  EXPECT_EQ(c.parallel.zero_stage, 0);
  EXPECT_EQ(error_of([] {
              with_deepspeed(R"({"zero_optimization": {"stage": 2, "cpu_offload": true,
                "offload_optimizer": {"device": "cpu"}}})");
            }),
            "ds.json.zero_optimization: 'cpu_offload' and 'offload_optimizer' both given; DeepSpeed takes one");
}

// config.py _set_batch_related_parameters / _batch_assertion with the data-parallel size.
TEST(EstimateDeepSpeed, BatchSizesDerivedAsDeepSpeedDoes) {
  RunConfig c = with_deepspeed(R"({"train_batch_size": 256})", 8);
  EXPECT_EQ(c.training.micro_batch, 32);
  EXPECT_EQ(c.training.grad_accumulation, 1);
  c = with_deepspeed(R"({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 4})", 8);
  EXPECT_EQ(c.training.micro_batch, 4);
  EXPECT_EQ(c.training.grad_accumulation, 8);
  c = with_deepspeed(R"({"train_batch_size": 256, "gradient_accumulation_steps": 2})", 8);
  EXPECT_EQ(c.training.micro_batch, 16);
  EXPECT_EQ(c.training.grad_accumulation, 2);
  c = with_deepspeed(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2})", 8);
  EXPECT_EQ(c.training.micro_batch, 2);
  EXPECT_EQ(c.training.grad_accumulation, 1);
  EXPECT_EQ(error_of([] {
              with_deepspeed(
                  R"({"train_batch_size": 100, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})",
                  8);
            }),
            "ds.json: train_batch_size (100) is not train_micro_batch_size_per_gpu (4) × gradient_accumulation_steps "
            "(2) × data-parallel size (8); DeepSpeed refuses it");
  EXPECT_EQ(error_of([] { with_deepspeed(R"({"train_batch_size": 100, "train_micro_batch_size_per_gpu": 3})", 1); }),
            "ds.json: train_batch_size (100) is not train_micro_batch_size_per_gpu (3) × gradient_accumulation_steps "
            "(derived) × data-parallel size (1); DeepSpeed refuses it");
  EXPECT_EQ(error_of([] { with_deepspeed(R"({"train_batch_size": -8})"); }),
            "ds.json: field 'train_batch_size' must be a positive whole number or \"auto\", got -8");
  EXPECT_EQ(error_of([] { with_deepspeed(R"({"train_batch_size": "lots"})"); }),
            "ds.json: field 'train_batch_size' must be a positive whole number or \"auto\", got \"lots\"");
  EXPECT_EQ(error_of([] { with_deepspeed(R"({"train_micro_batch_size_per_gpu": 2.5})"); }),
            "ds.json: field 'train_micro_batch_size_per_gpu' must be a positive whole number or \"auto\", got 2.5");
  // Through the command: the key and the file are named, exit 2; --dp takes part in the check.
  const std::string zero_micro = temp_file("ds_mbs0.json", R"({"train_micro_batch_size_per_gpu": 0})");
  auto r = run_cli("estimate --deepspeed-config " + zero_micro);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find(zero_micro + ": field 'train_micro_batch_size_per_gpu' must be a positive whole number or "
                                       "\"auto\", got 0"),
            std::string::npos)
      << r.output;
  const std::string tbs = temp_file("ds_tbs.json", R"({"bf16": {"enabled": true}, "train_batch_size": 256,
    "zero_optimization": {"stage": 2}})");
  r = run_cli("estimate --deepspeed-config " + tbs + " --dp 8 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["training"]["micro_batch"], 32);
  EXPECT_EQ(j["training"]["grad_accumulation"], 1);
  r = run_cli("estimate --deepspeed-config " + tbs + " --dp 8 --micro-batch 4 --grad-accum 4");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find(tbs + ": train_batch_size (256) is not --micro-batch (4) × --grad-accum (4) × "
                                "data-parallel size (8)"),
            std::string::npos)
      << r.output;
}

// engine.py builds no ZeRO optimizer at stage 0 (config.py zero_enabled = stage > 0).
TEST(EstimateDeepSpeed, OptimizerOffloadAtStageZeroDoesNothing) {
  const RunConfig c = with_deepspeed(R"({"bf16": {"enabled": true},
    "zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}})");
  EXPECT_FALSE(c.parallel.offload_optimizer_deepspeed);
  ASSERT_EQ(c.notes.size(), 2u);
  EXPECT_EQ(c.notes[0], "deepspeed offload_optimizer does nothing at ZeRO stage 0 (no ZeRO optimizer); ignored");
  EXPECT_NE(c.notes[1].find("ds.json: no optimizer section, so the client's optimizer is counted"), std::string::npos);
  const StageMemory m = estimate_memory(c);
  EXPECT_EQ(m.host_bytes, 0);
  EXPECT_EQ(m.model_states(), 16 * std::int64_t{6738415616});  // 2 + 2 + 12
  EXPECT_EQ(m.optimizer_step, 4 * std::int64_t{6738415616});   // fp32 grads, in step() only
}

// DeepSpeed's zero config forbids unknown keys (config_utils.py extra="forbid"); its top level
// ignores them; ratio < 1 needs stage 3; the sizes are Field(ge=0); bf16 and fp16 exclude each other.
TEST(EstimateDeepSpeed, UnknownKeysAndValuesDeepSpeedRefuses) {
  EXPECT_EQ(
      error_of([] { with_deepspeed(R"({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_sise": 5e7}})"); }),
      "ds.json.zero_optimization: unknown key 'stage3_prefetch_bucket_sise' (did you mean "
      "'stage3_prefetch_bucket_size'?) (DeepSpeed refuses unknown keys here)");
  EXPECT_EQ(error_of([] {
              with_deepspeed(R"({"zero_optimization": {"offload_param": {"device": "cpu", "bufer_count": 4}}})");
            }),
            "ds.json.zero_optimization.offload_param: unknown key 'bufer_count' (did you mean 'buffer_count'?) "
            "(DeepSpeed refuses unknown keys here)");
  const RunConfig c = with_deepspeed(R"({"zero_optimisation": {"stage": 3}, "steps_per_print": 10})");
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_EQ(c.warnings[0],
            "ds.json: unknown top-level key 'zero_optimisation' ignored (as DeepSpeed does): did you mean "
            "'zero_optimization'?");
  EXPECT_EQ(c.parallel.zero_stage, 0);
  EXPECT_EQ(
      error_of([] {
        with_deepspeed(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.3}}})");
      }),
      "ds.json.zero_optimization.offload_optimizer: field 'ratio' 0.3 (partial offload) needs stage 3, got stage 2");
  // A ratio that is not a number 0..1 is named, whatever it is.
  EXPECT_EQ(error_of([] {
              with_deepspeed(
                  R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": "half"}}})");
            }),
            "ds.json.zero_optimization.offload_optimizer: field 'ratio' must be 0..1, got \"half\"");
  EXPECT_EQ(
      error_of([] {
        with_deepspeed(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 1.5}}})");
      }),
      "ds.json.zero_optimization.offload_optimizer: field 'ratio' must be 0..1, got 1.5");
  EXPECT_EQ(
      error_of([] { with_deepspeed(R"({"zero_optimization": {"stage": 3, "stage3_max_live_parameters": -1}})"); }),
      "ds.json.zero_optimization: field 'stage3_max_live_parameters' must be 0 or more, got -1");
  EXPECT_EQ(error_of([] { with_deepspeed(R"({"bf16": {"enabled": true}, "fp16": {"enabled": true}})"); }),
            "ds.json: bf16.enabled and fp16.enabled are both true; DeepSpeed allows one");
  EXPECT_EQ(error_of([] { with_deepspeed(R"({"zero_optimization": {"stage": 2, "reduce_bucket_size": 1.5}})"); }),
            "ds.json.zero_optimization: field 'reduce_bucket_size' must be a whole number, got 1.5");
}

// DeepSpeed trains in fp32 unless bf16 or fp16 is enabled (both default to false).
TEST(EstimateDeepSpeed, PrecisionFollowsDeepSpeed) {
  RunConfig c = with_deepspeed(R"({"fp16": {"enabled": false}, "bf16": {"enabled": false}})");
  EXPECT_EQ(c.training.precision, Precision::fp32);
  ASSERT_EQ(c.notes.size(), 1u);
  EXPECT_EQ(c.notes[0],
            "ds.json: neither bf16 nor fp16 is enabled, so DeepSpeed trains in fp32; estimated in fp32 (--precision "
            "overrides)");
  EXPECT_EQ(with_deepspeed(R"({"zero_optimization": {"stage": 2}})").training.precision, Precision::fp32);
  EXPECT_EQ(with_deepspeed(R"({"bfloat16": {"enabled": true}})").training.precision, Precision::bf16);
  EXPECT_EQ(with_deepspeed(R"({"fp16": {"enabled": true}})").training.precision, Precision::fp16);
  c = config_for("llama2-7b");
  c.training.precision = Precision::fp16;
  apply_deepspeed_config(R"({"bf16": {"enabled": "auto"}})", c);  // Hugging Face fills it: the command's
  EXPECT_EQ(c.training.precision, Precision::fp16);
  // fp32 at stage 2: 4-byte weights, own 4-byte gradient partition, master clone and moments:
  // 4Ψ + (4 + 4 + 8)Ψ/N; the step's flattened fp32 gradient partition 4Ψ/N.
  c = with_deepspeed(R"({"zero_optimization": {"stage": 2}})", 4);
  EXPECT_EQ(estimate_memory(c).model_states(), 4 * std::int64_t{6738415616} + 4 * std::int64_t{6738415616});
  EXPECT_EQ(estimate_memory(c).optimizer_step, std::int64_t{6738415616});
}

// Buffers DeepSpeed allocates: ZeRO-1/2 one reduce bucket (two with overlap_comm) and no
// all-gather bucket; ZeRO-3 the reduce and prefetch buckets; stage 0 none. "auto" sizes as
// Hugging Face's Trainer fills them (h = 4096).
TEST(EstimateDeepSpeed, CommunicationBuffersAsAllocated) {
  RunConfig c = with_deepspeed(R"({"bf16": {"enabled": true}, "zero_optimization": {"stage": 3,
    "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto"}})");
  EXPECT_EQ(c.parallel.reduce_bucket_elements, 16777216);
  EXPECT_EQ(c.parallel.allgather_bucket_elements, 15099494);
  EXPECT_EQ(estimate_memory(c).communication, 2 * (16777216 + 15099494));
  c = with_deepspeed(R"({"bf16": {"enabled": true}, "zero_optimization": {"stage": 2}})");
  EXPECT_EQ(estimate_memory(c).communication, 1000000000);
  c = with_deepspeed(R"({"bf16": {"enabled": true}, "zero_optimization": {"stage": 2, "overlap_comm": true}})");
  EXPECT_EQ(estimate_memory(c).communication, 2000000000);
  c = with_deepspeed(
      R"({"bf16": {"enabled": true}, "zero_optimization": {"stage": 1, "contiguous_gradients": false}})");
  EXPECT_EQ(estimate_memory(c).communication, 0);
  c = with_deepspeed(R"({"bf16": {"enabled": true}, "zero_optimization": {"stage": 0}})");
  EXPECT_EQ(estimate_memory(c).communication, 0);
  // An optimizer offload turns contiguous gradients back on at ZeRO-1/2 (stage_1_and_2.py).
  c = with_deepspeed(R"({"bf16": {"enabled": true}, "zero_optimization": {"stage": 2, "contiguous_gradients": false,
    "offload_optimizer": {"device": "cpu"}}})");
  EXPECT_EQ(estimate_memory(c).communication, 1000000000);
  c = with_deepspeed(R"({"bf16": {"enabled": true}, "zero_optimization": {"stage": 3,
    "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"}}})");
  ASSERT_EQ(c.notes.size(), 1u);
  EXPECT_EQ(c.notes[0],
            "deepspeed offload to nvme: the offloaded states are counted in host memory, but live on NVMe (DeepSpeed "
            "keeps pinned host staging buffers)");
}

// Hugging Face's Trainer fills "auto" under three keys only (integrations/deepspeed.py
// trainer_config_finalize: reduce_bucket_size, stage3_prefetch_bucket_size,
// stage3_param_persistence_threshold). Under DeepSpeed's other spelling of one, or under any other
// size, "auto" reaches DeepSpeed unfilled and its config validation refuses it.
TEST(EstimateDeepSpeed, AutoOnlyWhereHuggingFaceFillsIt) {
  EXPECT_EQ(error_of([] { with_deepspeed(R"({"zero_optimization": {"stage": 3, "prefetch_bucket_size": "auto"}})"); }),
            "ds.json.zero_optimization: field 'prefetch_bucket_size' is \"auto\", but Hugging Face's Trainer fills "
            "only 'stage3_prefetch_bucket_size'; under this spelling DeepSpeed gets \"auto\" and refuses it");
  EXPECT_EQ(
      error_of([] { with_deepspeed(R"({"zero_optimization": {"stage": 3, "param_persistence_threshold": "auto"}})"); }),
      "ds.json.zero_optimization: field 'param_persistence_threshold' is \"auto\", but Hugging Face's Trainer fills "
      "only 'stage3_param_persistence_threshold'; under this spelling DeepSpeed gets \"auto\" and refuses it");
  // Below stage 3 the prefetch bucket is not used, but DeepSpeed validates it all the same.
  EXPECT_NE(error_of([] { with_deepspeed(R"({"zero_optimization": {"stage": 2, "prefetch_bucket_size": "auto"}})"); }),
            "");
  EXPECT_EQ(error_of([] { with_deepspeed(R"({"zero_optimization": {"stage": 3, "sub_group_size": "auto"}})"); }),
            "ds.json.zero_optimization: field 'sub_group_size' is \"auto\", which Hugging Face's Trainer does not "
            "fill (it fills reduce_bucket_size, stage3_prefetch_bucket_size and stage3_param_persistence_threshold); "
            "DeepSpeed refuses it");
  // The spellings it fills are filled (h = 4096).
  const RunConfig c = with_deepspeed(R"({"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
    "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto"}})");
  EXPECT_EQ(c.parallel.reduce_bucket_elements, 16777216);
  EXPECT_EQ(c.parallel.allgather_bucket_elements, 15099494);
}

// Found by a review: batch products that wrap divided by zero (SIGFPE); an option stage other
// than the config's mixed two setups; DeepSpeed's pipeline engine refuses ZeRO-2/3 and turns
// overlap_comm off.
TEST(EstimateDeepSpeed, OptionsThatContradictTheConfigAndHugeBatchesAreRefused) {
  const std::string huge = temp_file("ds_huge.json", R"({"train_batch_size": 1,
    "train_micro_batch_size_per_gpu": 562949953421312})");
  auto r = run_cli("estimate --model llama2-7b --deepspeed-config " + huge + " --dp 32768");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("train_micro_batch_size_per_gpu × gradient_accumulation_steps × data-parallel size "
                          "(32768) is beyond any batch"),
            std::string::npos)
      << r.output;
  const std::string z3 = temp_file("ds_z3.json", R"({"bf16": {"enabled": true}, "zero_optimization": {"stage": 3}})");
  r = run_cli("estimate --model llama2-7b --deepspeed-config " + z3 + " --dp 8 --zero 2");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("zero_optimization.stage is 3, but the options ask for stage 2"), std::string::npos)
      << r.output;
  EXPECT_EQ(run_cli("estimate --model llama2-7b --deepspeed-config " + z3 + " --dp 8 --zero 3").exit_code, 0);
  const std::string z2 = temp_file("ds_z2.json", R"({"bf16": {"enabled": true}, "zero_optimization": {"stage": 2}})");
  r = run_cli("estimate --model llama2-7b --deepspeed-config " + z2 + " --dp 8 --pp 2");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("ZeRO stage 2 with --pp 2: DeepSpeed's pipeline engine refuses ZeRO-2 and ZeRO-3"),
            std::string::npos)
      << r.output;
  const std::string z1 = temp_file("ds_z1.json", R"({"bf16": {"enabled": true}, "zero_optimization": {"stage": 1,
    "overlap_comm": true}})");
  const auto one = nlohmann::json::parse(
      run_cli("estimate --model llama2-7b --deepspeed-config " + z1 + " --dp 8 --pp 2 --json").output);
  EXPECT_EQ(one.at("baseline").at("communication").get<std::int64_t>() -
                2 * 4096 * 4096,  // the pipeline's receive buffer: seq 4096 × micro-batch 1 × h × 2 B
            1000000000)
      << one.dump(1);
}

// Stage 0 in 16 bits: the optimizer section decides the step (engine.py _configure_basic_optimizer,
// _configure_fp16_optimizer). FusedAdam (Adam/AdamW, the 1-bit Adams) runs in FP16_Optimizer,
// whose step() holds every gradient's fp32 copy and their flattened concatenation at once
// (fused_optimizer.py); torch_adam, another optimizer or a client's runs unfused: one fp32
// gradient per parameter (unfused_optimizer.py); legacy_fusion flattens the 16-bit gradients.
TEST(EstimateDeepSpeed, StageZeroStepFollowsTheOptimizerSection) {
  const std::int64_t P = 6738415616;
  auto step = [](const std::string& optimizer) {
    return estimate_memory(
               with_deepspeed(R"({"fp16": {"enabled": true}, "zero_optimization": {"stage": 0})" + optimizer + "}"))
        .optimizer_step;
  };
  EXPECT_EQ(step(""), 4 * P);
  // Without a section the class of the client's optimizer decides, which no config shows: said.
  const RunConfig client = with_deepspeed(R"({"fp16": {"enabled": true}})");
  ASSERT_EQ(client.notes.size(), 1u);
  EXPECT_EQ(client.notes[0],
            "ds.json: no optimizer section, so the client's optimizer is counted as DeepSpeed runs a torch one "
            "(unfused: 4 B/param of fp32 gradients in step()); a FusedAdam given as the client's (DeepSpeed's or "
            "apex's, as Megatron-DeepSpeed passes) runs FP16_Optimizer, 8 B/param: add \"optimizer\": {\"type\": "
            "\"AdamW\"} to count that");
  EXPECT_TRUE(with_deepspeed(R"({"fp16": {"enabled": true}, "optimizer": {"type": "AdamW"}})").notes.empty());
  EXPECT_EQ(step(R"(, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}})"), 8 * P);
  EXPECT_EQ(step(R"(, "optimizer": {"type": "Adam"})"), 8 * P);
  EXPECT_EQ(step(R"(, "optimizer": {"type": "OneBitAdam"})"), 8 * P);
  EXPECT_EQ(step(R"(, "optimizer": {"type": "AdamW", "params": {"torch_adam": true}})"), 4 * P);
  EXPECT_EQ(step(R"(, "optimizer": {"type": "Lamb"})"), 4 * P);
  EXPECT_EQ(step(R"(, "optimizer": {"type": "Adam", "legacy_fusion": true})"), 2 * P);
  // The same section in bf16: DDP_BFLOAT16 takes the same wrappers; ZeRO's step is its own.
  EXPECT_EQ(
      estimate_memory(with_deepspeed(R"({"bf16": {"enabled": true}, "optimizer": {"type": "AdamW"}})")).optimizer_step,
      8 * P);
  EXPECT_EQ(estimate_memory(with_deepspeed(R"({"bf16": {"enabled": true}, "optimizer": {"type": "AdamW"},
    "zero_optimization": {"stage": 1}})"))
                .optimizer_step,
            6 * P);
  EXPECT_EQ(error_of([] { with_deepspeed(R"({"optimizer": {"type": 3}})"); }),
            "ds.json.optimizer: field 'type' must be a string, got 3");
}

// data_types.grad_accum_dtype fp32 with bf16 weights at stage 1 (no optimizer offload) runs the
// BF16_Optimizer, not ZeRO-1 (engine.py _do_optimizer_sanity_check): every 16-bit gradient plus a
// whole fp32 accumulation buffer, the fp32 master and moments partitioned, the step on the
// buffer's own partition (no conversion), and no ZeRO reduce bucket (bf16_optimizer.py).
TEST(EstimateDeepSpeed, Bf16WithFp32AccumulationAtStageOneRunsTheBf16Optimizer) {
  const std::int64_t P = 6738415616;
  const RunConfig zero1 = with_deepspeed(R"({"bf16": {"enabled": true}, "zero_optimization": {"stage": 1}})", 8);
  const RunConfig bf16 = with_deepspeed(R"({"bf16": {"enabled": true}, "zero_optimization": {"stage": 1},
    "data_types": {"grad_accum_dtype": "fp32"}})",
                                        8);
  EXPECT_FALSE(deepspeed_bf16_optimizer(zero1));
  ASSERT_TRUE(deepspeed_bf16_optimizer(bf16));
  EXPECT_TRUE(bf16.warnings.empty());
  const StageMemory z = estimate_memory(zero1), b = estimate_memory(bf16);
  EXPECT_EQ(z.gradients, 2 * P);
  EXPECT_EQ(b.gradients, 2 * P + 4 * P);
  EXPECT_EQ(b.optimizer_states, z.optimizer_states);
  EXPECT_EQ(z.optimizer_step, (2 * P + 4 * P) / 8);
  EXPECT_EQ(b.optimizer_step, 0);
  EXPECT_EQ(z.communication, 2 * 500000000);
  EXPECT_EQ(b.communication, 0);
  // With an optimizer offload, or at stage 2, ZeRO runs and accumulates separately: warned.
  for (const char* zero : {R"({"stage": 1, "offload_optimizer": {"device": "cpu"}})", R"({"stage": 2})"}) {
    const RunConfig c = with_deepspeed(std::string(R"({"bf16": {"enabled": true}, "zero_optimization": )") + zero +
                                           R"(, "data_types": {"grad_accum_dtype": "float32"}})",
                                       8);
    EXPECT_FALSE(deepspeed_bf16_optimizer(c));
    ASSERT_EQ(c.warnings.size(), 1u) << zero;
    EXPECT_NE(c.warnings[0].find("data_types.grad_accum_dtype fp32 with bf16 weights at ZeRO stage"), std::string::npos)
        << c.warnings[0];
  }
  // The accumulation dtype the weights have changes nothing.
  const RunConfig same = with_deepspeed(R"({"bf16": {"enabled": true}, "zero_optimization": {"stage": 1},
    "data_types": {"grad_accum_dtype": "bf16"}})",
                                        8);
  EXPECT_TRUE(same.warnings.empty());
  EXPECT_EQ(estimate_memory(same).model_states(), z.model_states());
}

// Without ZeRO, DeepSpeed accumulates only in the weights' dtype and raises on another; a
// spelling DtypeEnum does not know is refused as DeepSpeed refuses it.
TEST(EstimateDeepSpeed, GradientAccumulationDtypesDeepSpeedRefuses) {
  const RunConfig c = with_deepspeed(R"({"bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "fp32"}})");
  EXPECT_EQ(error_of([&] { validate(c); }),
            "data_types.grad_accum_dtype fp32 with bf16 weights at ZeRO stage 0: DeepSpeed refuses the mix (it "
            "accumulates in the weights' dtype without ZeRO); use ZeRO stage 1 or more, or accumulate in bf16");
  EXPECT_EQ(error_of([] { with_deepspeed(R"({"data_types": {"grad_accum_dtype": "int8"}})"); }),
            "ds.json.data_types: field 'grad_accum_dtype' must be fp32, bf16 or fp16 (or DeepSpeed's other spellings "
            "of them), got \"int8\"");
  EXPECT_EQ(error_of([] { with_deepspeed(R"({"data_types": {"grad_accum_dtype": "FP32"}})"); }).empty(), false);
  EXPECT_EQ(error_of([] { with_deepspeed(R"({"data_types": 1})"); }),
            "ds.json: field 'data_types' must be an object, got 1");
}
