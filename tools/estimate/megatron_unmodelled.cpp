#include "tools/estimate/megatron_unmodelled.hpp"

#include <utility>

namespace stowage::estimate {
namespace {

// Megatron arguments that change what a training step allocates in ways the model does not
// represent: the estimate warns that it ignores them.
constexpr std::pair<std::string_view, std::string_view> kUnmodelled[] = {
    {"--fp8-format", "fp8 keeps 1-byte copies of linear inputs and weights"},
    {"--fp8-param-gather", "fp8 parameter all-gather buffers"},
    {"--fp4-format", "fp4 copies of linear inputs and weights"},
    {"--tp-comm-overlap", "TransformerEngine userbuffers for overlapped TP communication"},
    {"--use-torch-fsdp2", "FSDP shards weights and gradients and gathers them per layer"},
    {"--mla-down-proj-fusion", "MLA's fused q/kv down projection keeps other tensors"},
    {"--experimental-attention-variant", "another attention (DSA's indexer and its scores, gated delta net)"},
    {"--cpu-offloading", "activation offload to host memory"},
    {"--fine-grained-activation-offloading", "activation offload to host memory"},
    {"--main-grads-dtype", "reduced-precision main gradients"},
    {"--main-params-dtype", "reduced-precision main parameters"},
    {"--exp-avg-dtype", "reduced-precision Adam moments"},
    {"--exp-avg-sq-dtype", "reduced-precision Adam moments"},
    {"--mtp-use-repeated-layer", "one MTP layer applied at every depth (its parameters once)"},
    {"--mtp-hsm", "MTP hidden-state mixing keeps the rolled history of hidden states"},
    {"--use-grouped-gemm-for-shared-expert", "the shared experts' fused fp8/fp4 grouped-GEMM path"},
    {"--no-use-layer-wise-param-layout",
     "Muon's layer-wise optimizer without its sharded layout keeps more than a shard"},
    {"--moe-expert-capacity-factor", "expert capacity padding and dropped tokens"},
    {"--moe-pad-expert-input-to-capacity", "expert capacity padding"},
    {"--enable-cuda-graph", "CUDA graphs keep static input and output buffers"},
    {"--cuda-graph-impl", "CUDA graphs keep static input and output buffers"},
    {"--external-cuda-graph", "CUDA graphs keep static input and output buffers"},
    // MindSpeed's (mindspeed/arguments.py and features_manager/ at 028de58).
    {"--swap-optimizer", "optimizer states swapped to host memory"},
    {"--swap-optimizer-times", "optimizer states swapped to host memory"},
    {"--virtual-optimizer", "optimizer states in host memory"},
    {"--recompute-norm", "norm outputs released and recomputed"},
    {"--recompute-norm-num-layers", "norm outputs released and recomputed"},
    {"--recompute-in-bubble", "recompute moved into the pipeline bubbles"},
    {"--recompute-in-advance", "recompute moved ahead of backward"},
    {"--enable-recompute-layers-per-pp-rank", "recomputed layers counted per pipeline rank"},
    {"--adaptive-recompute-device-swap", "recompute and swap chosen at run time"},
    {"--adaptive-recompute-device-size", "recompute and swap chosen at run time"},
    {"--adaptive-memory-optimization", "recompute and swap chosen at run time"},
    {"--smart-swap", "tensors swapped to host memory at run time"},
    {"--swap-layer-input", "layer inputs swapped to host memory"},
    {"--noop-layers", "layers without weights or activations"},
    {"--num-layer-list", "an uneven pipeline split"},
    {"--ulysses-degree-in-cp", "hybrid Ulysses and ring context parallelism"},
    {"--tp-2d", "2-D tensor parallelism"},
    {"--ampipe-degree", "attention and MLP pipelined over sub-sequences"},
    {"--use-nanopipe", "the nano-pipe schedule"},
    {"--use-nanopipe-swap", "the nano-pipe schedule"},
    {"--schedules-method", "another pipeline schedule (dualpipev)"},
    {"--layerzero", "weights sharded and gathered per layer"},
    {"--enable-zero3", "weights sharded and gathered per layer"},
    {"--compress-activation", "compressed activations"},
    {"--compress-optimizer", "compressed optimizer states"},
    {"--compress-dense", "compressed activations"},
    {"--quant-states", "quantised optimizer states"},
    {"--quant-grads", "quantised gradients"},
    {"--moe-zero-memory", "MoE activations released and recomputed"},
    {"--moe-tp-extend-ep", "experts split over TP × EP"},
    {"--moe-unperm2-mem-optim-swap", "MoE activations swapped to host memory"},
    {"--moe-adaptive-recompute-activation", "MoE activations recomputed when routing is unbalanced"},
    {"--use-pipe-experts", "experts pipelined over sub-batches"},
};

}  // namespace

std::string_view unmodelled_argument(std::string_view name) {
  for (const auto& [argument, why] : kUnmodelled)
    if (argument == name) return why;
  return {};
}

}  // namespace stowage::estimate
