// `stowage plan` with a pipeline size that does not divide the layers: an uneven first and last
// stage (Megatron --decoder-first/last-pipeline-num-layers), the slowest stage timed, the launch
// line Megatron-LM takes and that estimates the same again.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <tuple>

#include "stowage/error.hpp"
#include "tools/estimate/megatron_args.hpp"
#include "tools/estimate/memory_model.hpp"
#include "tools/plan/plan_report.hpp"
#include "tools/plan/search.hpp"
#include "tools/plan/time_model.hpp"

using namespace stowage;
using namespace stowage::plan;
using estimate::RunConfig;

namespace {

// A GPT of h 4096, 32 heads, vocabulary 32000: a layer's 2·12h² FLOPs per token (402 M) outweigh
// the output layer's 2·h·V (262 M).
RunConfig gpt(std::int64_t layers) {
  RunConfig c;
  estimate::apply_megatron_args(
      "--num-layers " + std::to_string(layers) +
          " --hidden-size 4096 --num-attention-heads 32 --seq-length 2048 "
          "--max-position-embeddings 2048 --position-embedding-type rope --vocab-size 32000 --bf16 "
          "--global-batch-size 64",
      c);
  return c;
}

}  // namespace

// 30 layers on 16 GPUs: PP 4, 8 and 16 do not divide them. The middle stages take ⌈30/PP⌉ each,
// the first and last the rest, the last the smaller half: 7|8|8|7, 3|4…4|3, 1|2…2|1.
TEST(PlanUneven, PipelineSizesThatDoNotDivideTheLayersSplitUnevenly) {
  PlanRequest r;
  r.base = gpt(30);
  r.cluster.gpus = 16;
  std::set<std::tuple<std::int64_t, std::int64_t, std::int64_t>> seen;  // (pp, first, last)
  for_each_candidate(r, [&](const RunConfig& c) {
    const auto& p = c.parallel;
    seen.insert({p.pp, p.first_stage_layers, p.last_stage_layers});
    if (30 % p.pp == 0) {
      EXPECT_EQ(p.first_stage_layers + p.last_stage_layers, 0) << p.pp;
    } else {
      // 7|8|8|7, 3|4…|3 and 1|2…|1 share no divisor above 1: no virtual stages.
      EXPECT_EQ(p.vpp, 1) << p.pp;
      EXPECT_EQ(estimate::stage_layers(c, 0) + estimate::stage_layers(c, p.pp - 1) +
                    (p.pp - 2) * estimate::stage_layers(c, 1),
                30);
    }
  });
  EXPECT_TRUE(seen.count({4, 7, 7}));
  EXPECT_TRUE(seen.count({8, 3, 3}));
  EXPECT_TRUE(seen.count({16, 1, 1}));
  EXPECT_TRUE(seen.count({2, 0, 0}));
}

// The launch line carries the split, with virtual stages per rank (Megatron-LM refuses layers per
// virtual stage with an uneven split), and parses back to the same configuration and memory.
TEST(PlanUneven, TheLaunchLineCarriesTheSplitAndParsesBack) {
  RunConfig c = gpt(30);
  c.parallel.pp = 4;
  c.parallel.vpp = 1;
  c.parallel.first_stage_layers = c.parallel.last_stage_layers = 7;
  const std::string line = megatron_arguments(c);
  EXPECT_NE(line.find("--decoder-first-pipeline-num-layers 7 --decoder-last-pipeline-num-layers 7"), std::string::npos)
      << line;
  RunConfig back;
  estimate::apply_megatron_args(line, back);
  EXPECT_EQ(back.parallel.first_stage_layers, 7);
  EXPECT_EQ(back.parallel.last_stage_layers, 7);
  EXPECT_EQ(estimate::estimate_memory(back).peak_allocated, estimate::estimate_memory(c).peak_allocated);
  // Virtual stages must divide every stage's layers: 6|10|10|6 takes 2.
  RunConfig w = gpt(32);
  w.parallel.pp = 4;
  w.parallel.vpp = 2;
  w.parallel.first_stage_layers = w.parallel.last_stage_layers = 6;  // 6|10|10|6
  const std::string wl = megatron_arguments(w);
  EXPECT_NE(wl.find("--num-virtual-stages-per-pipeline-rank 2"), std::string::npos) << wl;
  EXPECT_EQ(wl.find("--num-layers-per-virtual-pipeline-stage"), std::string::npos) << wl;
  EXPECT_NO_THROW(estimate::apply_megatron_args(wl, back));
}

// The step is paced by the slowest stage: with 7|8|8|7 a middle stage (8 layers, 3216 M FLOPs per
// token) is slower than the last (7 layers and the output layer, 3076 M), so the compute is that of
// any split whose slowest stage is 8 layers without the output layer (8|8|8|6), and less than the
// even 8|8|8|8, whose last stage also runs the output layer.
TEST(PlanUneven, TheSlowestStagePacesTheStep) {
  Cluster cl;
  cl.gpus = 4;
  auto compute = [&](std::int64_t layers, std::int64_t first, std::int64_t last, std::int64_t mtp = 0) {
    RunConfig c = gpt(layers);
    c.model.mtp_layers = mtp;
    c.parallel.pp = 4;
    c.parallel.first_stage_layers = first;
    c.parallel.last_stage_layers = last;
    c.training.grad_accumulation = 8;
    return step_time(c, cl, estimate::estimate_memory(c)).compute;
  };
  const double uneven = compute(30, 7, 7);
  EXPECT_DOUBLE_EQ(uneven, compute(30, 8, 6));
  EXPECT_LT(uneven, compute(32, 0, 0));
  // An MTP layer (a layer, eh_proj, one more output layer) runs on the last stage: with 9|8|8|5
  // the first stage stays the slowest and the step is unchanged; with 7|8|8|7 it makes the last
  // stage (7 layers, 2 output layers and the MTP layer: 3805 M) the slowest.
  EXPECT_DOUBLE_EQ(compute(30, 9, 5, 1), compute(30, 9, 5, 0));
  EXPECT_GT(compute(30, 7, 7, 1), uneven);
}
