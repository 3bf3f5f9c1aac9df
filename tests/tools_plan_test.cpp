// `stowage plan`: the time model's terms hand-derived, the per-layer choices of the search, its
// determinism across threads, the Megatron arguments it prints (parsed back), its outputs and
// its input errors.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "stowage/error.hpp"
#include "tools/estimate/megatron_args.hpp"
#include "tools/estimate/model_config.hpp"
#include "tools/plan/plan_report.hpp"
#include "tools_cli_test_util.hpp"

using namespace stowage;
using namespace stowage::plan;
using estimate::RunConfig;
using stowage::testing::run_cli;

namespace {

RunConfig gpt(std::int64_t tp, std::int64_t pp, std::int64_t vpp, std::int64_t dp, std::int64_t micro_batches) {
  RunConfig c;
  estimate::apply_megatron_args(
      "--num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 "
      "--max-position-embeddings 2048 --vocab-size 51200 --bf16 --use-distributed-optimizer",
      c);
  c.parallel.tp = tp;
  c.parallel.pp = pp;
  c.parallel.vpp = vpp;
  c.parallel.dp = dp;
  c.parallel.sequence_parallel = tp > 1;
  c.training.grad_accumulation = micro_batches;
  return c;
}

}  // namespace

// Narayanan et al. 2021 §2.2: the bubble is (p − 1)/v micro-batch slots; the interleaved
// schedule with v chunks divides it by v.
TEST(PlanTimeModel, PipelineBubble) {
  Cluster cl;
  cl.gpus = 4;
  RunConfig c = gpt(1, 4, 1, 1, 8);
  const StepTime t = step_time(c, cl, estimate::estimate_memory(c));
  const double per_mb = (t.compute + t.recompute + t.tp_comm + t.cp_comm + t.ep_comm + t.swap) / 8;
  EXPECT_NEAR(t.pp_bubble, 3.0 * per_mb, 1e-12);
  RunConfig v = gpt(1, 4, 2, 1, 8);
  const StepTime tv = step_time(v, cl, estimate::estimate_memory(v));
  EXPECT_NEAR(tv.pp_bubble, t.pp_bubble / 2, 1e-12);
  EXPECT_GT(tv.pp_comm, t.pp_comm);  // twice the sends
}

// Compute: 6 FLOPs per weight per token plus causal attention 6·a·d·s and the output layer
// 6·h·V, spread over TP and run at peak × efficiency; TP with SP: per layer 4 collectives of
// (t−1)/t × s·b·h·2 bytes each way.
TEST(PlanTimeModel, ComputeAndTensorParallelCollectives) {
  Cluster cl;
  cl.gpus = 2;
  RunConfig c = gpt(2, 1, 1, 1, 1);
  const StepTime t = step_time(c, cl, estimate::estimate_memory(c));
  const double h = 2048, s = 2048, L = 24, V = 51200;
  const double flops = 3.0 * s * (L * 2.0 * (12 * h * h + h * s) + 2.0 * h * V);
  EXPECT_NEAR(model_flops_per_step(c), flops, flops * 1e-12);
  EXPECT_NEAR(t.compute, flops / 2 / (cl.peak_tflops * 1e12 * cl.efficiency), 1e-12);
  const double tp = 4.0 * 0.5 * s * h * 2 / (cl.intra_node_gbps * 1e9) * 2 * L;
  EXPECT_NEAR(t.tp_comm, tp, 1e-12);
}

// MLA (Megatron's MultiLatentAttention with TE's linears) under SP: the attention's input-side
// collective gathers the latents the column-parallel up projections read, q_lora_rank +
// kv_lora_rank, and the rotary key (qk_pos_emb_head_dim), not the hidden state; without a query
// latent queries project from the hidden state, which is gathered as before. The duplicated down
// projections' fp32 gradients are all-reduced over TP once a step (finalize_model_grads). Without
// SP every collective stays h wide and nothing is all-reduced.
TEST(PlanTimeModel, MlaGathersItsLatentsNotTheHiddenStateUnderSequenceParallelism) {
  Cluster cl;
  cl.gpus = 2;
  const std::string mla =
      "--num-layers 2 --hidden-size 512 --num-attention-heads 8 --multi-latent-attention --kv-lora-rank 64 "
      "--qk-head-dim 16 --qk-pos-emb-head-dim 8 --v-head-dim 16 --seq-length 1024 --max-position-embeddings 1024 "
      "--position-embedding-type rope --micro-batch-size 4 --vocab-size 50176 --bf16 --swiglu --ffn-hidden-size "
      "1024 --normalization RMSNorm --disable-bias-linear --tensor-model-parallel-size 2 ";
  const double T = 1024.0 * 4, h = 512, L = 2, bw = cl.intra_node_gbps * 1e9;
  struct Case {
    std::string args;
    double attention_input, down_projections;
  };
  for (const Case& k :
       {Case{mla + "--sequence-parallel --q-lora-rank 192", 192 + 64 + 8, h * (192 + 64 + 8)},
        Case{mla + "--sequence-parallel", h + 64 + 8, h * (64 + 8)}, Case{mla + "--q-lora-rank 192", h, 0}}) {
    RunConfig c;
    estimate::apply_megatron_args(k.args, c);
    ASSERT_TRUE(c.model.mla && c.parallel.tp == 2) << k.args;
    const StepTime t = step_time(c, cl, estimate::estimate_memory(c));
    const double tp =
        0.5 * T * 2 * (3 * h + k.attention_input) / bw * 2 * L + 2 * 0.5 * L * k.down_projections * 4 / bw;
    EXPECT_NEAR(t.tp_comm, tp, tp * 1e-12) << k.args;
  }
}

// The distributed optimizer's reduce-scatter (4 B fp32 gradients) and all-gather (2 B weights)
// are exposed beyond the backward and forward of the micro-batch they overlap.
TEST(PlanTimeModel, DataParallelReduceOverlapsBackward) {
  Cluster cl;
  cl.gpus = 16;
  cl.inter_node_gbps = 1;  // slow enough to be exposed
  RunConfig c = gpt(1, 1, 1, 16, 1);
  const auto m = estimate::estimate_memory(c);
  const StepTime t = step_time(c, cl, m);
  const double P = double(m.parameters), f = 15.0 / 16.0;
  const double fwd = t.compute / 3, bwd = 2 * t.compute / 3;
  EXPECT_NEAR(t.dp_comm, (4 * P * f / 1e9 - bwd) + (2 * P * f / 1e9 - fwd), 1e-9);
  cl.inter_node_gbps = 1e6;  // fast: hidden
  EXPECT_EQ(step_time(c, cl, m).dp_comm, 0.0);
}

// Per-layer choice: the search keeps the fewest full-recompute layers that fit.
TEST(PlanSearch, FewestRecomputedLayersThatFit) {
  PlanRequest r;
  r.base = gpt(1, 1, 1, 1, 1);
  r.base.training.global_batch = 8;
  r.base.training.seq_length = 8192;
  r.base.model.learned_positions = 0;
  r.cluster.gpus = 1;
  r.cluster.gpu_memory = std::int64_t{32} << 30;  // states 22 GiB: the activations need recompute
  r.space.techniques = false;
  r.top = 50;
  const SearchResult res = search(r);
  ASSERT_FALSE(res.plans.empty());
  const std::int64_t budget = memory_budget(r);
  bool saw_partial = false;
  for (const Plan& p : res.plans) {
    EXPECT_LE(p.memory.peak_reserved, budget);
    if (p.config.recompute.granularity != estimate::Recompute::full) continue;
    const std::int64_t n = p.config.recompute.num_layers;
    if (n <= 1) continue;
    saw_partial = true;
    RunConfig fewer = p.config;
    fewer.recompute.num_layers = n - 1;
    EXPECT_GT(estimate::estimate_memory(fewer).peak_reserved, budget) << n;
  }
  EXPECT_TRUE(saw_partial);
}

TEST(PlanSearch, SameResultOnOneOrTwoThreads) {
  PlanRequest r;
  r.base.model = estimate::preset("llama2-13b");
  r.base.training.global_batch = 64;
  r.cluster.gpus = 32;
  r.top = 8;
  r.threads = 1;
  const SearchResult one = search(r);
  r.threads = 2;
  const SearchResult two = search(r);
  ASSERT_EQ(one.plans.size(), two.plans.size());
  for (std::size_t i = 0; i < one.plans.size(); ++i) {
    EXPECT_EQ(megatron_arguments(one.plans[i].config), megatron_arguments(two.plans[i].config)) << i;
    EXPECT_EQ(one.plans[i].time.total(), two.plans[i].time.total());
  }
  EXPECT_EQ(one.stats.candidates, two.stats.candidates);
  EXPECT_EQ(one.stats.fitting, two.stats.fitting);
  for (std::size_t i = 1; i < one.plans.size(); ++i)
    EXPECT_LE(one.plans[i - 1].time.total(), one.plans[i].time.total());
}

// The printed launch line parses back into the same layout.
TEST(PlanReport, MegatronArgumentsParseBack) {
  PlanRequest r;
  r.base.model = estimate::preset("llama2-70b");
  r.base.training.global_batch = 128;
  r.cluster.gpus = 64;
  r.top = 3;
  const SearchResult res = search(r);
  ASSERT_EQ(res.plans.size(), 3u);
  for (const Plan& p : res.plans) {
    RunConfig back;
    estimate::apply_megatron_args(megatron_arguments(p.config), back);
    EXPECT_EQ(back.parallel.tp, p.config.parallel.tp);
    EXPECT_EQ(back.parallel.pp, p.config.parallel.pp);
    EXPECT_EQ(back.parallel.vpp, p.config.parallel.vpp);
    EXPECT_EQ(back.parallel.cp, p.config.parallel.cp);
    EXPECT_EQ(back.parallel.zero_stage >= 1, p.config.parallel.zero_stage >= 1);
    EXPECT_EQ(back.training.micro_batch, p.config.training.micro_batch);
    EXPECT_EQ(back.recompute.granularity, p.config.recompute.granularity);
    EXPECT_EQ(back.recompute.num_layers, p.config.recompute.num_layers);
    EXPECT_EQ(back.model.ffn_hidden_size, 28672);
    EXPECT_EQ(back.model.kv_heads(), 8);
  }
  const std::string why = why_best(res.plans[0], res.plans[1]);
  EXPECT_NE(why.find("beats"), std::string::npos);
}

// Queries' and keys' norms (Qwen3) are on the launch line, so it parses back to the same model.
TEST(PlanReport, QkNormsAreOnTheLaunchLine) {
  RunConfig c;
  c.model = estimate::preset("llama2-7b");
  c.model.qk_layernorm = true;
  const std::string line = megatron_arguments(c);
  EXPECT_NE(line.find("--qk-layernorm"), std::string::npos) << line;
  RunConfig back;
  estimate::apply_megatron_args(line, back);
  EXPECT_TRUE(back.model.qk_layernorm);
}

// Every released checkpoint's shape (tests/data/hf_configs.json): the launch line parses back to a
// model of the same parameter count exactly when megatron_cannot_say names nothing, and each
// phrase names what differs.
TEST(PlanReport, WhatTheLaunchLineCannotSayIsNamedAndNothingElseDiffers) {
  std::ifstream in(std::string(STOWAGE_SOURCE_DIR) + "/tests/data/hf_configs.json");
  const nlohmann::json all = nlohmann::json::parse(in);
  std::map<std::string, std::vector<std::string>> named;
  for (const auto& entry : all.at("counted")) {
    const std::string name = entry.at("name").get<std::string>();
    RunConfig c;
    c.model = estimate::model_from_hf_json(entry.at("config").dump(), name, nullptr);
    if (c.model.learned_positions) c.training.seq_length = c.model.learned_positions;  // the longest it takes
    const auto differences = megatron_cannot_say(c.model);
    RunConfig back;
    estimate::apply_megatron_args(megatron_arguments(c), back);
    const auto params = [](const estimate::ModelConfig& m) {
      return estimate::count_parameters(m, m.vocab_size).total();
    };
    EXPECT_EQ(params(back.model) == params(c.model), differences.empty()) << name;
    if (!differences.empty()) named[name] = differences;
  }
  const std::string some_only = "biases on some linear layers only";
  const std::map<std::string, std::vector<std::string>> want{
      {"llama2-7b-attnbias",
       {some_only + " (Megatron: on all of them, on none, or on q, k and v alone with --add-qkv-bias)"}},
      {"olmo-1b", {"norms without parameters (Megatron's LayerNorm has a weight and a bias)"}},
      {"olmo-7b", {"norms without parameters (Megatron's LayerNorm has a weight and a bias)"}},
      {"phi-2", {"1 norm a layer (Megatron's layer has 2)", "a bias on the output layer (Megatron's has none)"}},
      {"gemma2-2b", {"4 norms a layer (Megatron's layer has 2)"}},
      {"deepseek-v2-lite",
       {"a key/value latent norm without a norm on the query projection's input (Megatron's --qk-layernorm "
        "without --q-lora-rank normalises both)"}},
  };
  EXPECT_EQ(named, want);
}

// The table says so under the launch line, and the JSON carries the list.
TEST(PlanCommand, TheLaunchLineOfAModelMegatronCannotBuildSaysWhatDiffers) {
  const std::string path = std::string(STOWAGE_BINARY_DIR) + "/tools_plan_test_phi.json";
  {
    std::ifstream in(std::string(STOWAGE_SOURCE_DIR) + "/tests/data/hf_configs.json");
    const nlohmann::json all = nlohmann::json::parse(in);  // kept: a range over a temporary's member would dangle
    for (const auto& entry : all.at("counted"))
      if (entry.at("name") == "phi-2") std::ofstream(path) << entry.at("config").dump();
  }
  const auto table = run_cli("plan --model-json " + path + " --gpus 8 --global-batch 64 --quiet");
  ASSERT_EQ(table.exit_code, 0) << table.output;
  EXPECT_NE(table.output.find("Megatron-LM has no arguments for: 1 norm a layer (Megatron's layer has 2); a bias "
                              "on the output layer (Megatron's has none). The line builds the nearest model"),
            std::string::npos)
      << table.output;
  const auto json = run_cli("plan --model-json " + path + " --gpus 8 --global-batch 64 --quiet --json");
  ASSERT_EQ(json.exit_code, 0) << json.output;
  EXPECT_EQ(nlohmann::json::parse(json.output).at("model").at("megatron_cannot_say").size(), 2u);
  const auto llama = run_cli("plan --model llama2-7b --gpus 8 --global-batch 64 --quiet");
  EXPECT_EQ(llama.output.find("has no arguments"), std::string::npos);
  std::remove(path.c_str());
}

// Megatron-LM's interleaved schedule takes micro-batches in groups of PP (schedules.py refuses a
// count that is not a multiple), and context parallelism cuts the sequence into 2·CP chunks.
TEST(PlanSearch, EveryLayoutIsOneMegatronRuns) {
  for (const auto& [gbs, seq] : {std::pair<std::int64_t, std::int64_t>{7, 4096}, {24, 4096}, {64, 4104}}) {
    PlanRequest r;
    r.base.model = estimate::preset(gbs == 24 ? "llama2-70b" : "llama2-7b");
    r.base.training.global_batch = gbs;
    r.base.training.seq_length = seq;
    r.cluster.gpus = gbs == 24 ? 64 : 8;
    r.top = 1000;
    const SearchResult res = search(r);
    ASSERT_FALSE(res.plans.empty()) << gbs;
    for (const Plan& p : res.plans) {
      const auto& l = p.config.parallel;
      const std::int64_t micro_batches = gbs / (p.config.training.micro_batch * l.dp);
      if (l.vpp > 1) EXPECT_EQ(micro_batches % l.pp, 0) << megatron_arguments(p.config);
      if (l.cp > 1) EXPECT_EQ(seq % (2 * l.cp), 0) << megatron_arguments(p.config);
      RunConfig back;  // and its line is one the parser (Megatron-LM's checks) takes
      EXPECT_NO_THROW(estimate::apply_megatron_args(megatron_arguments(p.config), back))
          << megatron_arguments(p.config);
    }
  }
}

// --max-position-embeddings is required by Megatron-LM and at least the sequence; a model whose
// learned position table is shorter than the sequence is refused before the search.
TEST(PlanCommand, TheLaunchLineCarriesMaxPositionsAndAShortPositionTableIsRefused) {
  const auto rope = run_cli("plan --model llama2-7b --gpus 8 --global-batch 64 --seq 2048 --json --quiet");
  ASSERT_EQ(rope.exit_code, 0) << rope.output;
  const std::string line = nlohmann::json::parse(rope.output).at("plans").at(0).at("megatron_args");
  EXPECT_NE(line.find("--position-embedding-type rope --max-position-embeddings 2048"), std::string::npos) << line;
  const auto short_table = run_cli("plan --model gpt3-175b --gpus 64 --global-batch 64 --seq 4096 --quiet");
  EXPECT_EQ(short_table.exit_code, 2) << short_table.output;
  EXPECT_NE(short_table.output.find("learned position embedding has 2048 rows, fewer than the sequence length "
                                    "4096; give --seq 2048 or less"),
            std::string::npos)
      << short_table.output;
}

// A plan's launch line, given back to `stowage estimate` with the data-parallel size, predicts
// what the plan printed: Megatron-FSDP's sharding strategy (optim_grads_params: ZeRO-3) included.
TEST(PlanCommand, EveryPlansLaunchLineEstimatesTheSameAgainFsdpIncluded) {
  const auto planned = run_cli("plan --model llama2-7b --gpus 8 --global-batch 64 --json --quiet");
  ASSERT_EQ(planned.exit_code, 0) << planned.output;
  int fsdp = 0;
  const auto plans = nlohmann::json::parse(planned.output).at("plans");
  ASSERT_EQ(plans.size(), 5u);
  for (const auto& p : plans) {
    const std::string args = p.at("megatron_args").get<std::string>();
    const auto back =
        run_cli("estimate --megatron-args '" + args + "' --dp " + std::to_string(p.at("dp").get<int>()) + " --json");
    ASSERT_EQ(back.exit_code, 0) << back.output;
    const auto e = nlohmann::json::parse(back.output);
    EXPECT_EQ(e.at("parallelism").at("zero_stage"), p.at("zero_stage")) << args;
    EXPECT_EQ(e.at("baseline").at("peak_reserved"), p.at("memory").at("peak_reserved")) << args;
    fsdp += p.at("zero_stage").get<int>() == 3 ? 1 : 0;
  }
  EXPECT_GE(fsdp, 1);  // the layout that did not round-trip before
}

TEST(PlanCommand, OutputsAndErrors) {
  auto ok = run_cli("plan --model llama2-7b --gpus 8 --global-batch 64 --json --quiet");
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  const auto j = nlohmann::json::parse(ok.output);
  EXPECT_EQ(j["schema"], "stowage.plan/1");
  EXPECT_EQ(j["plans"].size(), 5u);
  EXPECT_GT(j["search"]["candidates"].get<std::int64_t>(), 1000);
  EXPECT_LE(j["plans"][0]["memory"]["peak_reserved"].get<std::int64_t>(), j["memory_budget"].get<std::int64_t>());
  const std::string svg_path = std::string(STOWAGE_BINARY_DIR) + "/tools_plan_test.svg";
  auto table = run_cli("plan --model llama2-7b --gpus 8 --global-batch 64 --progress --svg " + svg_path);
  EXPECT_EQ(table.exit_code, 0) << table.output;
  EXPECT_NE(table.output.find("plan: "), std::string::npos);  // progress on stderr
  EXPECT_NE(table.output.find("Megatron-LM arguments for #1"), std::string::npos);
  EXPECT_NE(table.output.find("beats"), std::string::npos);
  if (std::system("command -v xmllint >/dev/null 2>&1") == 0)
    EXPECT_EQ(std::system(("xmllint --noout " + svg_path).c_str()), 0);
  auto none = run_cli("plan --model llama2-70b --gpus 1 --global-batch 8 --quiet");
  EXPECT_EQ(none.exit_code, 3);
  EXPECT_NE(none.output.find("no plan fits"), std::string::npos);
  const std::pair<const char*, const char*> bad[] = {
      {"plan --model llama2-7b --gpus 0 --global-batch 8", "--gpus must be a positive integer, got 0"},
      {"plan --model llama2-7b --gpus 8", "--global-batch is required"},
      {"plan --model llama2-7b --global-batch 8 --gpu-memory 80", "'80' has no unit"},
      {"plan --model llama2-7b --global-batch 8 --efficiency 1.5", "--efficiency must be in (0, 1]"},
      {"plan --model llama2-7b --global-batch 8 --margin 1", "--margin must be in [0, 1)"},
      {"plan --model llama2-7b --global-batch 8 --gpus 12", "whole nodes"},
      {"plan --global-batch 8", "give the model"},
      {"plan --model llama2-7b --global-batch 8 --inter-node-bw -1", "--inter-node-bw must be positive"},
  };
  for (const auto& [args, message] : bad) {
    auto r = run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << ": " << r.output;
  }
}

// With unfused attention the s×s scores dominate at long sequences; selective recompute (core
// attention only) is then offered, and beats full recompute on time when it fits.
TEST(PlanSearch, SelectiveRecomputeWithUnfusedAttention) {
  PlanRequest r;
  r.base = gpt(1, 1, 1, 1, 1);
  r.base.training.global_batch = 8;
  r.base.training.seq_length = 4096;
  r.base.model.learned_positions = 0;
  r.base.training.flash_attention = false;
  r.cluster.gpus = 1;
  r.cluster.gpu_memory = std::int64_t{40} << 30;
  r.space.techniques = false;
  r.top = 1;
  const SearchResult res = search(r);
  ASSERT_EQ(res.plans.size(), 1u);
  const Plan& best = res.plans[0];
  EXPECT_EQ(best.config.recompute.granularity, estimate::Recompute::selective);
  RunConfig none = best.config;
  none.recompute.granularity = estimate::Recompute::none;
  EXPECT_GT(estimate::estimate_memory(none).peak_reserved, memory_budget(r));  // it needs the recompute
  EXPECT_GT(best.time.recompute, 0.0);
  r.base.training.flash_attention = true;  // the same run with flash attention: never selective
  for (const Plan& p : search(r).plans) EXPECT_NE(p.config.recompute.granularity, estimate::Recompute::selective);
}

// MoE: dispatch and combine all-to-alls per MoE layer, forward and backward, (ep − 1)/ep of the
// k routed copies of each token's hidden state.
TEST(PlanTimeModel, ExpertParallelAllToAll) {
  Cluster cl;
  cl.gpus = 8;
  RunConfig c;
  c.model = estimate::preset("mixtral-8x7b");
  c.training.seq_length = 4096;
  c.parallel.dp = 8;
  c.parallel.ep = 4;
  c.parallel.zero_stage = 1;
  const StepTime t = step_time(c, cl, estimate::estimate_memory(c));
  const double bytes = 2.0 * 4096 * 4096 * 2 * 0.75;  // k = 2, T·h·2 bytes, 3/4 leave the rank
  EXPECT_NEAR(t.ep_comm, 2.0 * bytes / (cl.intra_node_gbps * 1e9) * 2 * 32, 1e-12);
  c.parallel.ep = 1;
  EXPECT_EQ(step_time(c, cl, estimate::estimate_memory(c)).ep_comm, 0.0);
}
