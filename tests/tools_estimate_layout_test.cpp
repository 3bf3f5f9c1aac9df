// Megatron-LM's --pipeline-model-parallel-layout (d98e8a6, transformer/pipeline_parallel_layer_layout.py):
// the parser and Megatron's checks, the layers each virtual stage builds, a layout that writes out a
// rule-based split estimating as the rule does, and MTP on a rank of its own.
#include <gtest/gtest.h>

#include <string>

#include "stowage/error.hpp"
#include "tools/estimate/megatron_args.hpp"
#include "tools/estimate/memory_model.hpp"
#include "tools/estimate/pipeline_layout.hpp"
#include "tools_estimate_test_util.hpp"

using namespace stowage::estimate;
using stowage::testing::activation_of;
using stowage::testing::megatron_config;

namespace {

const std::string kGpt = stowage::testing::kSmallGpt;
constexpr double h = 512, V = 50304, T = 2 * 1024, H = 2 * h;

}  // namespace

// DeepSeek-V3's recipe layout on 16 ranks: 32 stages, 2 virtual stages per rank; stage i is rank
// i mod 16's virtual stage i / 16, so the MTP stage (30) is rank 14's second.
TEST(PipelineLayout, ParsesMegatronsNotation) {
  const PipelineLayout l = parse_pipeline_layout("Et*3|(tt|)*29,m|L", 16, 61, 1);
  EXPECT_EQ(l.vpp, 2);
  ASSERT_EQ(l.decoder.size(), 32u);
  EXPECT_EQ(l.decoder[0], 3);
  for (std::size_t i = 1; i < 30; ++i) EXPECT_EQ(l.decoder[i], 2) << i;
  EXPECT_EQ(l.decoder[30], 0);
  EXPECT_EQ(l.decoder[31], 0);
  EXPECT_EQ(l.mtp_rank, 14);
  // Groups hold '|', x*n repeats one letter, commas are cosmetic.
  const PipelineLayout g = parse_pipeline_layout("E,(t|t|)*2,tL", 5, 5, 0);
  EXPECT_EQ(g.decoder, (std::vector<std::int64_t>{1, 1, 1, 1, 1}));
  EXPECT_EQ(g.mtp_rank, -1);
}

// validate_layer_layout's refusals, and the parser's own.
TEST(PipelineLayout, RefusesWhatMegatronRefuses) {
  auto refused = [](const char* text, std::int64_t pp, std::int64_t layers, std::int64_t mtp) {
    EXPECT_THROW(parse_pipeline_layout(text, pp, layers, mtp), stowage::InvalidArgument) << text;
  };
  refused("Et|tx|L", 3, 2, 0);                   // an unknown layer
  refused("tE|tL", 2, 2, 0);                     // the embedding not first
  refused("Et|tL|L", 3, 2, 0);                   // the loss twice
  refused("Et|t|L", 2, 2, 0);                    // 3 stages over 2 ranks
  refused("Et|ttL", 2, 2, 0);                    // 3 decoder layers for 2
  refused("Et|tmL", 2, 2, 0);                    // an MTP layer without MTP
  refused("Et|mtL", 2, 2, 1);                    // a decoder layer after MTP
  refused("Et|tm||L", 2, 2, 1);                  // MTP outside its rank's last virtual stage
  refused("Et|m|mL", 3, 1, 2);                   // MTP layers split over two stages
  refused("Et| tL", 2, 2, 0);                    // a space (parse_str_to_list keeps it, and refuses it)
  refused("(t)*1048576(t)*1048576|L", 2, 2, 0);  // groups together too long
  refused("Et*|tL", 2, 2, 0);                    // a repeat without its count
  refused("E(tt|L", 2, 2, 0);                    // a group not closed
  refused("E(t|)*99999999L", 2, 2, 0);           // too long once written out
  EXPECT_NO_THROW(parse_pipeline_layout("Et|tmL", 2, 2, 1));
}

// Each virtual stage builds its own count; layers are numbered stage by stage in Megatron's order
// (get_layer_offset): virtual stage 0 of every rank, then 1.
TEST(PipelineLayout, EachVirtualStageBuildsItsLayers) {
  const RunConfig c = megatron_config(kGpt +
                                      "--num-layers 8 --pipeline-model-parallel-size 2 "
                                      "--pipeline-model-parallel-layout 'Ettt|t|tt|ttL'");
  EXPECT_EQ(c.parallel.vpp, 2);
  EXPECT_EQ(chunk_layers(c, 0, 0), 3);
  EXPECT_EQ(chunk_layers(c, 1, 0), 1);
  EXPECT_EQ(chunk_layers(c, 0, 1), 2);
  EXPECT_EQ(chunk_layers(c, 1, 1), 2);
  EXPECT_EQ(chunk_first_layer(c, 1, 0), 3);
  EXPECT_EQ(chunk_first_layer(c, 0, 1), 4);
  EXPECT_EQ(chunk_first_layer(c, 1, 1), 6);
  EXPECT_EQ(stage_layers(c, 0), 5);
  EXPECT_EQ(stage_layers(c, 1), 3);
  // Megatron-LM refuses a layout beside the other ways of splitting.
  EXPECT_THROW(
      megatron_config(kGpt + "--num-layers 8 --pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 3 "
                             "--pipeline-model-parallel-layout 'Ettt|t|tt|ttL'"),
      stowage::InvalidArgument);
  EXPECT_THROW(
      megatron_config(kGpt + "--num-layers 8 --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 "
                             "--pipeline-model-parallel-layout 'Ettt|t|tt|ttL'"),
      stowage::InvalidArgument);
}

// A layout that writes out what the rules split estimates exactly as the rules do, stage by stage:
// the even split, and an uneven first and last stage.
TEST(PipelineLayout, WritingOutARuleSplitChangesNothing) {
  const std::string base = kGpt + "--num-layers 6 --pipeline-model-parallel-size 3 ";
  const std::pair<std::string, std::string> same[] = {
      {"", "--pipeline-model-parallel-layout 'Ett|tt|ttL'"},
      {"--decoder-first-pipeline-num-layers 1 --decoder-last-pipeline-num-layers 3",
       "--pipeline-model-parallel-layout 'Et|tt|tttL'"}};
  for (const auto& [rules, layout] : same) {
    RunConfig a = megatron_config(base + rules), b = megatron_config(base + layout);
    a.training.grad_accumulation = b.training.grad_accumulation = 4;
    for (std::int64_t r = 0; r < 3; ++r) {
      const StageMemory x = estimate_stage(a, r), y = estimate_stage(b, r);
      EXPECT_EQ(x.parameters, y.parameters) << layout << " " << r;
      EXPECT_EQ(x.peak_allocated, y.peak_allocated) << layout << " " << r;
    }
    EXPECT_EQ(estimate_memory(a).peak_allocated, estimate_memory(b).peak_allocated) << layout;
  }
}

// MTP on a rank of its own ("Ett|tt|m|L"): rank 2 holds the MTP layer, eh_proj, its norms and an
// embedding; it keeps the received decoder output as hnorm's input and sends the concatenation on
// (freed). The final norm sits with the last decoder layer (rank 1); the last rank holds the output
// layer, receives the (1 + k)-fold concatenation and keeps it for the output layers, and runs the
// losses. Rank 2 has 2 micro-batches in flight at accumulation 4 (1F1B: pp − r).
TEST(PipelineLayout, MtpOnARankOfItsOwn) {
  const std::string model = kGpt + "--num-layers 4 ";
  const StageMemory one_stage = estimate_stage(megatron_config(model), 0);
  double layer = 0;  // bytes per token of one decoder layer
  for (const char* kind : {"attention", "core_attention", "mlp", "mlp_activation_output"})
    layer += activation_of(one_stage, kind) / (T * 4);
  RunConfig c = megatron_config(model +
                                "--mtp-num-layers 1 --pipeline-model-parallel-size 4 "
                                "--pipeline-model-parallel-layout 'Ett|tt|m|L'");
  c.training.grad_accumulation = 4;
  EXPECT_EQ(mtp_rank(c), 2);
  EXPECT_EQ(final_norm_place(c).rank, 1);
  const ParameterCounts pc = count_parameters(c.model, c.model.vocab_size);
  const StageMemory r1 = estimate_stage(c, 1), r2 = estimate_stage(c, 2), r3 = estimate_stage(c, 3);
  EXPECT_EQ(r2.parameters, pc.mtp + std::int64_t(V * h));
  EXPECT_EQ(r3.parameters, std::int64_t(V * h));
  EXPECT_EQ(r1.parameters, 2 * pc.per_layer() + pc.final_norm);
  EXPECT_NEAR(activation_of(r2, "mtp"), 2 * T * (layer + 8 + 4 * H + H), 2.0);
  EXPECT_EQ(activation_of(r2, "output_logits"), 0);
  // The final norm keeps its input for each of rank 1's 3 micro-batches in flight.
  EXPECT_NEAR(activation_of(r1, "output_logits"), 3 * T * H, 1.0);
  EXPECT_NEAR(activation_of(r3, "output_logits"), T * 2 * H + T * V * (6 + 4), 1.0);
  EXPECT_EQ(activation_of(r3, "mtp"), 0);
  // The pipeline receives carry its (1 + k)-fold output after MTP, and its gradient on its rank.
  EXPECT_NEAR(double(r3.communication), 2 * T * H, 1.0);
  EXPECT_NEAR(double(r2.communication), 2 * T * H, 1.0);
  EXPECT_NEAR(double(r1.communication), T * H, 1.0);
}

// MTP in the first rank's last virtual stage ("Et|t|m|L" on 2 ranks): that model chunk is a model
// of its own and builds its own embedding beside the first chunk's.
TEST(PipelineLayout, MtpInTheFirstRanksLastVirtualStageBuildsAnEmbedding) {
  RunConfig c = megatron_config(kGpt +
                                "--num-layers 2 --mtp-num-layers 1 --pipeline-model-parallel-size 2 "
                                "--pipeline-model-parallel-layout 'Et|t|m|L'");
  c.training.grad_accumulation = 2;  // the interleaved schedule runs at least PP micro-batches
  EXPECT_EQ(c.parallel.vpp, 2);
  EXPECT_EQ(mtp_rank(c), 0);
  const ParameterCounts pc = count_parameters(c.model, c.model.vocab_size);
  EXPECT_EQ(estimate_stage(c, 0).parameters, 2 * std::int64_t(V * h) + pc.per_layer() + pc.mtp);
}

// A hand-built configuration whose layout does not fit is refused, not read out of range.
TEST(PipelineLayout, AConfigurationsLayoutIsChecked) {
  RunConfig c = megatron_config(kGpt + "--num-layers 2 --pipeline-model-parallel-size 2");
  c.parallel.layout_layers = {1, std::int64_t{1} << 41};
  EXPECT_THROW(estimate_memory(c), stowage::InvalidArgument);
  c.parallel.layout_layers = {3, -1};
  EXPECT_THROW(estimate_memory(c), stowage::InvalidArgument);
  c.parallel.layout_layers = {1, 1, 0};
  EXPECT_THROW(estimate_memory(c), stowage::InvalidArgument);
  c.parallel.layout_layers = {1, 1};
  EXPECT_NO_THROW(estimate_memory(c));
}

// On the command line, --mtp-layers may not contradict the MTP layers a layout places, and --pp
// may not leave the layout's stages over.
TEST(PipelineLayout, CommandLineOptionsDoNotContradictTheLayout) {
  const std::string line = "estimate --megatron-args \"" + kGpt +
                           "--num-layers 2 --mtp-num-layers 1 --pipeline-model-parallel-size 2 "
                           "--pipeline-model-parallel-layout 'Et|tmL'\"";
  EXPECT_EQ(stowage::testing::run_cli(line).exit_code, 0);
  const auto mtp = stowage::testing::run_cli(line + " --mtp-layers 2");
  EXPECT_EQ(mtp.exit_code, 2);
  EXPECT_NE(mtp.output.find("--mtp-layers 2 differs from the 1 MTP layers the pipeline layout places"),
            std::string::npos)
      << mtp.output;
  const auto pp = stowage::testing::run_cli(line + " --pp 4");
  EXPECT_EQ(pp.exit_code, 2);
  EXPECT_NE(pp.output.find("pipeline layout: 2 virtual stages"), std::string::npos) << pp.output;
}
