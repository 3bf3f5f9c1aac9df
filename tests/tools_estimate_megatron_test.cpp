// The estimate's --megatron-args checked against Megatron-LM: recompute, gradient dtypes, experts,
// the values it refuses, virtual pipelines and MindSpeed launch lines. Argument parsing in
// general: tools_estimate_input_test.cpp.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "stowage/error.hpp"
#include "tools/estimate/argument_spelling.hpp"
#include "tools/estimate/megatron_arg_names.hpp"
#include "tools/estimate/megatron_args.hpp"
#include "tools/estimate/mindspeed_arg_names.hpp"
#include "tools/estimate/model_config.hpp"
#include "tools/estimate/nearest_argument.hpp"

#include <nlohmann/json.hpp>
#include "tools_estimate_test_util.hpp"

using namespace stowage;
using namespace stowage::estimate;
using namespace stowage::testing;

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

std::string refusal(const std::string& extra, bool validated = false) {
  RunConfig c;
  try {
    apply_megatron_args(kLlama7b + " " + extra, c);
    if (validated) validate(c);
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
    // The stored activations without the scores, and the last layer's scores rerun in backward
    // (32 heads · s · 5 B per token, above the loss's 814 MiB).
    EXPECT_NE(out.output.find("peak allocated                          132.66 GiB"), std::string::npos) << out.output;
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

// A misspelt argument is matched against both tables: MindSpeed's own names are suggested too.
TEST(EstimateMegatron, TheNearestArgumentComesFromEitherTable) {
  EXPECT_EQ(nearest_launch_argument("--swap-optimzer"), "--swap-optimizer");  // MindSpeed's
  EXPECT_EQ(nearest_launch_argument("hiden-size"), "--hidden-size");          // Megatron-LM's, without "--"
  EXPECT_EQ(nearest_launch_argument("--xyzzy-plugh"), "");                    // nothing within a third
  EXPECT_EQ(without_dashes("--seq-length"), "seq-length");
  EXPECT_EQ(without_dashes("seq-length"), "seq-length");
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

// Megatron-LM's assertions between arguments (arguments.py, optimizer/__init__.py): a line it
// would not launch is refused, naming both arguments; a store_true flag takes no value.
TEST(EstimateMegatron, LinesMegatronRefusesAreRefused) {
  const std::string refused = " (Megatron-LM refuses it too)";
  EXPECT_EQ(refusal("--use-distributed-optimizer --optimizer-cpu-offload --optimizer-offload-fraction 1.0"),
            "megatron-args: --optimizer-cpu-offload needs --use-precision-aware-optimizer (the hybrid device "
            "optimizer runs through its code path)" +
                refused);
  EXPECT_EQ(refusal("--use-distributed-optimizer --overlap-param-gather"),
            "megatron-args: --overlap-param-gather needs --overlap-grad-reduce" + refused);
  EXPECT_EQ(refusal("--bf16=true"),
            "megatron-args: --bf16 is a flag and takes no value (got '--bf16=true'); Megatron-LM's parser refuses it "
            "too");
  // What depends on settings the command line may change is checked with the run (validate()).
  EXPECT_EQ(refusal("--use-precision-aware-optimizer"), "accepted");
  EXPECT_EQ(refusal("--use-precision-aware-optimizer", true),
            "megatron-args: --use-precision-aware-optimizer needs --use-distributed-optimizer" + refused);
  EXPECT_EQ(
      refusal("--overlap-param-gather --overlap-grad-reduce", true),
      "megatron-args: --overlap-param-gather needs --use-distributed-optimizer, Megatron-FSDP or dist_muon" + refused);
  EXPECT_EQ(refusal("--tensor-model-parallel-size 2 --tp-comm-overlap", true),
            "megatron-args: --tp-comm-overlap needs --sequence-parallel with TP > 1 (TP is 2)" + refused);
  EXPECT_EQ(refusal("--sequence-parallel --tp-comm-overlap", true),
            "megatron-args: --tp-comm-overlap needs --sequence-parallel with TP > 1 (TP is 1)" + refused);
  // The command line's options count: --tp 8 on the command line meets --tp-comm-overlap's need.
  RunConfig overridden;
  apply_megatron_args(kLlama7b + " --sequence-parallel --tp-comm-overlap", overridden);
  overridden.parallel.tp = 8;
  EXPECT_NO_THROW(validate(overridden));
  // What Megatron-LM takes is taken.
  EXPECT_EQ(refusal("--use-distributed-optimizer --overlap-param-gather --overlap-grad-reduce", true), "accepted");
  EXPECT_EQ(refusal("--use-megatron-fsdp --use-precision-aware-optimizer", true), "accepted");
  EXPECT_EQ(refusal("--optimizer dist_muon --overlap-param-gather --overlap-grad-reduce", true), "accepted");
  EXPECT_EQ(refusal("--group-query-attention --num-query-groups 4 --tensor-model-parallel-size 8"),
            "accepted");  // parsed; the layout is checked with the run
  RunConfig gqa;
  apply_megatron_args(kLlama7b + " --group-query-attention --num-query-groups 4 --tensor-model-parallel-size 8", gqa);
  EXPECT_THROW(
      {
        try {
          validate(gqa);
        } catch (const InvalidArgument& e) {
          EXPECT_STREQ(e.what(),
                       "tensor-parallel (8) does not divide the 4 query groups, which Megatron-LM splits over TP ranks "
                       "(attention.py)");
          throw;
        }
      },
      InvalidArgument);
}

// --optimizer-cpu-offload steps --optimizer-offload-fraction of the parameters on the host with
// their fp32 master and moments (the hybrid device optimizer): all of them is stowage's mapped
// offload; the default fraction, 0, offloads nothing; a part is warned about.
TEST(EstimateMegatron, OptimizerCpuOffloadIsTheMappedOffloadAtFractionOne) {
  const std::string line = kSmallGpt + "--num-layers 4 --use-distributed-optimizer --use-precision-aware-optimizer ";
  const RunConfig plain = megatron_config(line),
                  all = megatron_config(line + "--optimizer-cpu-offload --optimizer-offload-fraction 1.0"),
                  none = megatron_config(line + "--optimizer-cpu-offload"),
                  part = megatron_config(line + "--optimizer-cpu-offload --optimizer-offload-fraction 0.5");
  EXPECT_TRUE(plain.warnings.empty());
  EXPECT_EQ(all.techniques.optimizer_offload, OffloadMode::mapped);
  EXPECT_TRUE(all.warnings.empty());
  EXPECT_EQ(none.techniques.optimizer_offload, OffloadMode::none);
  EXPECT_EQ(part.techniques.optimizer_offload, OffloadMode::none);
  ASSERT_EQ(part.warnings.size(), 1u);
  EXPECT_NE(part.warnings[0].find("--optimizer-offload-fraction 0.5"), std::string::npos);
  const StageMemory on = estimate_memory(plain), off = estimate_memory(all);
  EXPECT_EQ(off.optimizer_states, 0);
  EXPECT_EQ(off.weights, on.weights);
  EXPECT_EQ(off.gradients, on.gradients);
  EXPECT_EQ(off.host_bytes, on.optimizer_states);
}

}  // namespace
