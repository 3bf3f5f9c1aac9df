// Selective recompute of the modules Megatron-LM's --recompute-modules names (d98e8a6,
// transformer_config.py): what each releases and reruns, the launch-line checks and the
// estimate's own option; the combined 1F1B schedule (--overlap-moe-expert-parallel-comm); and the
// CI measurement of a run with both (tests/data/estimate_measured_selective_modules_peaks.json).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "stowage/error.hpp"
#include "tools/estimate/megatron_args.hpp"
#include "tools/estimate/memory_model.hpp"
#include "tools_estimate_test_util.hpp"

using namespace stowage::estimate;
using stowage::testing::activation_of;
using stowage::testing::megatron_config;

namespace {

// Four layers on two pipeline stages: the first stage has no loss, so what recompute reruns in
// backward shows as the working set. The first stage holds 2 layers × 2 micro-batches in flight
// (4 micro-batches a step).
const std::string kGpt =
    "--num-layers 4 --pipeline-model-parallel-size 2 --global-batch-size 8 " + stowage::testing::kSmallGpt;
constexpr double h = 512, F = 1024, heads = 8, s = 1024, T = 2 * 1024, A = 2, units = 4;

StageMemory first_stage(const std::string& line) {
  RunConfig c = megatron_config(line);
  finalize(c);
  return estimate_stage(c, 0);
}

double kind(const StageMemory& m, const char* name) { return activation_of(m, name); }

// Every activation kind but the working set is the same in both.
void expect_same_stored(const StageMemory& a, const StageMemory& b) {
  for (const auto& k : a.activations)
    if (k.name != "recompute_working_set") EXPECT_EQ(k.bytes, std::int64_t(kind(b, k.name.c_str()))) << k.name;
}

const std::string kSelective = "--recompute-granularity selective ";

// The line is refused with a message that says `says`.
void refused(const std::string& line, const std::string& says) {
  try {
    (void)megatron_config(line);
    ADD_FAILURE() << "accepted: " << line;
  } catch (const stowage::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}

}  // namespace

// Selective recompute alone is core_attn's: the unfused scores (a·s per token, bf16, no dropout)
// go and one layer's come back in backward; a list without core_attn keeps them.
TEST(RecomputeModules, CoreAttentionIsTheDefaultAndOnlyWhenListed) {
  const std::string unfused = kGpt + "--attention-backend unfused ";
  const StageMemory none = first_stage(unfused), plain = first_stage(unfused + kSelective),
                    listed = first_stage(unfused + kSelective + "--recompute-modules core_attn"),
                    other = first_stage(unfused + kSelective + "--recompute-modules layernorm");
  const double scores = heads * s * A;  // per token, TP 1
  EXPECT_EQ(kind(none, "core_attention"), T * scores * units);
  EXPECT_EQ(kind(plain, "core_attention"), 0);
  EXPECT_EQ(kind(plain, "recompute_working_set"), T * scores);
  EXPECT_EQ(listed.peak_allocated, plain.peak_allocated);
  // TransformerEngine fuses both norms of a standard-attention dense layer into the linears: no
  // norm module of its own to recompute, so `layernorm` alone is no recompute at all.
  expect_same_stored(other, none);
  EXPECT_EQ(kind(other, "recompute_working_set"), 0);
  EXPECT_EQ(other.peak_allocated, none.peak_allocated);
}

// mlp checkpoints a dense MLP: it keeps the MLP's input (with TE's fused norm, the LN2 input
// already counted with attention) and reruns one layer's fc1 input h, activation input 2F (SwiGLU)
// and fc2 input F.
TEST(RecomputeModules, MlpReleasesTheDenseMlpAndRerunsOneLayer) {
  const StageMemory none = first_stage(kGpt), mlp = first_stage(kGpt + kSelective + "--recompute-modules mlp");
  EXPECT_EQ(kind(none, "mlp"), T * A * (h + 2 * F) * units);
  EXPECT_EQ(kind(none, "mlp_activation_output"), T * A * F * units);
  EXPECT_EQ(kind(mlp, "mlp"), 0);
  EXPECT_EQ(kind(mlp, "mlp_activation_output"), 0);
  EXPECT_EQ(kind(mlp, "attention"), kind(none, "attention"));
  EXPECT_EQ(kind(mlp, "recompute_working_set"), T * A * (h + 2 * F + F));
}

// With Megatron's local implementation every norm is a module: layernorm releases the QKV input
// (LN1's output) and fc1's input (LN2's output), h each per layer, and reruns one at a time.
// mlp then keeps the norm's output as the checkpoint's input, unless layernorm releases it too.
TEST(RecomputeModules, LayernormReleasesTheNormOutputsOfTheLocalImplementation) {
  const std::string local = kGpt + "--transformer-impl local --use-flash-attn ";
  const StageMemory none = first_stage(local), norm = first_stage(local + kSelective + "--recompute-modules layernorm");
  EXPECT_EQ(kind(none, "attention") - kind(norm, "attention"), T * A * h * units);
  EXPECT_EQ(kind(none, "mlp") - kind(norm, "mlp"), T * A * h * units);
  EXPECT_EQ(kind(norm, "recompute_working_set"), T * A * h);
  const StageMemory mlp = first_stage(local + kSelective + "--recompute-modules mlp"),
                    both = first_stage(local + kSelective + "--recompute-modules layernorm mlp");
  EXPECT_EQ(kind(mlp, "mlp"), T * A * h * units);
  EXPECT_EQ(kind(mlp, "recompute_working_set"), T * A * (h + 2 * F + F));
  EXPECT_EQ(kind(both, "mlp"), 0);
  EXPECT_EQ(kind(both, "recompute_working_set"), T * A * (h + 2 * F + F + h));
}

// An MoE layer (4 experts, top-2, expert ffn 256, a shared expert of 256, SwiGLU, TP 1, no SP):
// its pre-MLP norm is a module of its own (TENorm). Per token: moe_act releases the routed
// copies' fc2 inputs (2 copies × 256), layernorm the norm's output the router keeps (h),
// shared_experts the shared MLP's activation input (2·256) and fc2 input (256), moe all of the
// layer but the norm's output it keeps as its input.
TEST(RecomputeModules, MoeModulesReleaseTheirParts) {
  const std::string moe = kGpt +
                          "--num-experts 4 --moe-router-topk 2 --moe-grouped-gemm --moe-ffn-hidden-size 256 "
                          "--moe-shared-expert-intermediate-size 256 ";
  const double Fe = 256, S = 256, copies = 2;
  const StageMemory none = first_stage(moe);
  const StageMemory act = first_stage(moe + kSelective + "--recompute-modules moe_act");
  EXPECT_EQ(kind(none, "mlp_activation_output") - kind(act, "mlp_activation_output"), T * A * copies * Fe * units);
  EXPECT_EQ(kind(act, "mlp"), kind(none, "mlp"));
  EXPECT_EQ(kind(act, "recompute_working_set"), T * A * copies * Fe);
  const StageMemory norm = first_stage(moe + kSelective + "--recompute-modules layernorm");
  EXPECT_EQ(kind(none, "mlp") - kind(norm, "mlp"), T * A * h * units);
  EXPECT_EQ(kind(norm, "attention"), kind(none, "attention"));  // LN1 is fused into QKV
  const StageMemory shared = first_stage(moe + kSelective + "--recompute-modules shared_experts");
  EXPECT_EQ(kind(none, "mlp") - kind(shared, "mlp"), T * A * 2 * S * units);
  EXPECT_EQ(kind(none, "mlp_activation_output") - kind(shared, "mlp_activation_output"), T * A * S * units);
  // moe_act and shared_experts rerun in different parts of the backward, the norm's output
  // through all of it.
  const StageMemory three = first_stage(moe + kSelective + "--recompute-modules moe_act shared_experts layernorm");
  EXPECT_EQ(kind(three, "recompute_working_set"), T * A * (std::max(copies * Fe, 3 * S) + h));
  const StageMemory whole = first_stage(moe + kSelective + "--recompute-modules moe");
  EXPECT_EQ(kind(whole, "mlp"), T * A * h * units);
  EXPECT_EQ(kind(whole, "mlp_activation_output"), 0);
  EXPECT_EQ(kind(whole, "moe_router"), 0);
  const double layer_moe = (kind(none, "mlp") + kind(none, "mlp_activation_output") + kind(none, "moe_router")) / units;
  EXPECT_NEAR(kind(whole, "recompute_working_set"), layer_moe - T * A * h, 1.0);
}

// MLA (8 heads, q_lora 64, kv_lora 32, qk 32 + rope 16, v 32, --qk-layernorm): mla_up_proj keeps
// the latents and releases the normalised copies (64 + 32) and the query (8·48), key (8·48) and
// value (8·32) the core attention saved; one layer's come back.
TEST(RecomputeModules, MlaUpProjReleasesQueryKeyValue) {
  const std::string mla = kGpt +
                          "--multi-latent-attention --q-lora-rank 64 --kv-lora-rank 32 --qk-head-dim 32 "
                          "--qk-pos-emb-head-dim 16 --v-head-dim 32 --qk-layernorm ";
  const StageMemory none = first_stage(mla), up = first_stage(mla + kSelective + "--recompute-modules mla_up_proj");
  const double released = (64 + 32) + 8 * 48 + 8 * 48 + 8 * 32;
  EXPECT_EQ(kind(none, "attention") - kind(up, "attention"), T * A * released * units);
  EXPECT_EQ(kind(up, "recompute_working_set"), T * A * released);
  // MLA's input norm is a module of its own (TENorm): layernorm releases its output too.
  const StageMemory norm = first_stage(mla + kSelective + "--recompute-modules layernorm");
  EXPECT_EQ(kind(none, "attention") - kind(norm, "attention"), T * A * h * units);
}

// The launch line as Megatron-LM reads it: nargs '+', names spelt exactly, and TransformerConfig's
// refusals; the list is read only under selective granularity.
TEST(RecomputeModules, TheLaunchLineIsCheckedAsMegatronChecksIt) {
  const std::string moe = kGpt + "--num-experts 4 --moe-ffn-hidden-size 256 ";
  EXPECT_EQ(megatron_config(kGpt + kSelective + "--recompute-modules mlp layernorm").recompute.modules,
            unsigned(RecomputeModule::mlp | RecomputeModule::layernorm));
  EXPECT_EQ(megatron_config(kGpt + kSelective + "--recompute-modules=mlp").recompute.modules,
            unsigned(RecomputeModule::mlp));
  EXPECT_EQ(megatron_config(kGpt + "--recompute-activations --recompute-modules mlp").recompute.modules,
            unsigned(RecomputeModule::mlp));
  refused(kGpt + kSelective + "--recompute-modules", "needs at least one module");
  refused(kGpt + kSelective + "--recompute-modules core-attn", "invalid module 'core-attn'");
  refused(kGpt + kSelective + "--recompute-modules 'mlp layernorm'", "invalid module 'mlp layernorm'");
  refused(moe + kSelective + "--recompute-modules moe_act", "needs --moe-grouped-gemm");
  refused(kGpt + kSelective + "--recompute-modules mla_up_proj", "needs --multi-latent-attention");
  refused(moe +
              "--moe-shared-expert-intermediate-size 256 --moe-shared-expert-overlap --moe-token-dispatcher-type "
              "alltoall " +
              kSelective + "--recompute-modules shared_experts",
          "--moe-shared-expert-overlap");
  // Not selective: not read (Megatron validates the list only under selective granularity).
  const RunConfig full = megatron_config(
      kGpt +
      "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 --recompute-modules bogus");
  EXPECT_EQ(full.recompute.granularity, Recompute::full);
  EXPECT_TRUE(std::any_of(full.notes.begin(), full.notes.end(), [](const std::string& n) {
    return n.find("--recompute-modules has no effect") != std::string::npos;
  }));
  // Modules of models the estimate does not build are named in a warning and skipped.
  const RunConfig gdn = megatron_config(kGpt + kSelective + "--recompute-modules mlp gdn_norm_out");
  EXPECT_EQ(gdn.recompute.modules, unsigned(RecomputeModule::mlp));
  EXPECT_TRUE(std::any_of(gdn.warnings.begin(), gdn.warnings.end(),
                          [](const std::string& w) { return w.find("gdn_norm_out") != std::string::npos; }));
}

// `stowage estimate --recompute selective --recompute-modules a,b` is the launch line's list.
TEST(RecomputeModules, TheEstimateOptionMatchesTheLaunchLine) {
  using stowage::testing::run_cli;
  const auto run = run_cli(
      "estimate --model llama2-7b --recompute selective --recompute-modules layernorm,mlp --no-flash-attention --json");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto j = nlohmann::json::parse(run.output);
  EXPECT_EQ(j.at("recompute").at("modules"), nlohmann::json({"layernorm", "mlp"}));
  const auto plain = run_cli("estimate --model llama2-7b --recompute selective --no-flash-attention --json");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_EQ(nlohmann::json::parse(plain.output).at("recompute").at("modules"), nlohmann::json({"core_attn"}));
  const auto bad = run_cli("estimate --model llama2-7b --recompute full --recompute-modules mlp");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("needs selective recompute"), std::string::npos) << bad.output;
  const auto unknown = run_cli("estimate --model llama2-7b --recompute selective --recompute-modules attention");
  EXPECT_EQ(unknown.exit_code, 2) << unknown.output;
  EXPECT_NE(unknown.output.find("core_attn moe_act layernorm"), std::string::npos) << unknown.output;
}

// The combined 1F1B schedule keeps the plain schedule's chunk-forwards in flight; each step's
// forward beside a backward holds one layer more, and the first stage's chunks here are equal.
TEST(CombinedOneFOneB, HoldsOneLayerMoreBesideTheBackward) {
  const std::string moe = "--num-layers 8 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2 " +
                          stowage::testing::kSmallGpt +
                          "--num-experts 4 --moe-ffn-hidden-size 256 --expert-model-parallel-size 2 "
                          "--moe-token-dispatcher-type alltoall ";
  auto stage0 = [](const std::string& line) {
    RunConfig c = megatron_config(line);
    c.parallel.dp = 2;
    c.training.global_batch = 16;
    finalize(c);
    return estimate_stage(c, 0);
  };
  const StageMemory plain = stage0(moe), combined = stage0(moe + "--overlap-moe-expert-parallel-comm");
  EXPECT_EQ(combined.microbatches_in_flight, plain.microbatches_in_flight);
  expect_same_stored(combined, plain);
  const double per_layer = (kind(plain, "attention") + kind(plain, "core_attention") + kind(plain, "mlp") +
                            kind(plain, "mlp_activation_output") + kind(plain, "moe_router")) /
                           (plain.microbatches_in_flight * double(plain.layers));
  EXPECT_NEAR(kind(combined, "recompute_working_set"), per_layer, 1.0);
  const std::string flag = "--overlap-moe-expert-parallel-comm ";
  refused(kGpt + "--num-experts 4 --moe-token-dispatcher-type alltoall " + flag, "--expert-model-parallel-size");
  refused(moe + "--moe-token-dispatcher-type allgather " + flag, "alltoall or flex");
  refused(moe + "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 " + flag,
          "excludes full recompute");
  refused(moe + kSelective + "--recompute-modules moe " + flag, "excludes moe");
  refused(kGpt + "--num-experts 4 --expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall " + flag,
          "virtual pipeline stages");
  refused(moe + "--mtp-num-layers 2 " + flag, "at most one MTP layer");
}

// Megatron's CI run with layernorm, mla_up_proj, mlp and moe_act recomputed and the combined 1F1B
// schedule, last rank: the estimate within 5 % of the peak iterations 5-25 hold and of the static
// memory; read as core attention's selective recompute (as before the modules were modelled) it is
// less than half.
TEST(RecomputeModules, MegatronCiRun) {
  std::ifstream in(std::string(STOWAGE_SOURCE_DIR) + "/tests/data/estimate_measured_selective_modules_peaks.json");
  ASSERT_TRUE(in);
  const nlohmann::json cases = nlohmann::json::parse(in);
  ASSERT_EQ(cases.size(), 1u);
  const auto& j = cases[0];
  const std::string args = j.at("megatron_args").get<std::string>();
  const std::string modules = "--recompute-modules layernorm mla_up_proj mlp moe_act ";
  ASSERT_NE(args.find(modules), std::string::npos);
  auto run = [&](const std::string& line) {
    return stowage::testing::estimate_ci_last_rank(line, j.at("gpus").get<std::int64_t>());
  };
  std::string core_only = args;
  core_only.erase(core_only.find(modules), modules.size());
  const StageMemory with = run(args), core = run(core_only);
  EXPECT_EQ(with.stage, 1);
  const double held = j.at("measured_peak_allocated_iterations_5_to_25").get<double>();
  const double statics = j.at("measured_static_allocated").get<double>();
  const double static_est = double(with.model_states() + with.framework + with.communication);
  std::printf(
      "peak: measured %.0f MiB, predicted %.0f MiB (%.0f as core_attn); static: measured %.0f, predicted %.0f\n",
      held / 1048576, double(with.peak_allocated) / 1048576, double(core.peak_allocated) / 1048576, statics / 1048576,
      static_est / 1048576);
  EXPECT_LE(std::abs(double(with.peak_allocated) - held) / held, 0.05);
  EXPECT_LE(std::abs(static_est - statics) / statics, 0.03);
  EXPECT_LE(double(core.peak_allocated), 0.5 * held);
}
