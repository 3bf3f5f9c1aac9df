#pragma once
// Factories for the technique versions of the trainer's hooks, one file each
// (technique_<name>.cpp), each a thin adaptor over the stowage API that implements it.
#include <cstdint>
#include <memory>
#include <vector>

#include "stowage/optimizers.hpp"
#include "stowage/precision.hpp"
#include "tools/demo/hooks.hpp"

namespace stowage::demo {

// Shared storage (stowage/parameter_bucket.hpp): the fp32 master kept as a bf16 plane that
// forward/backward read and a residual plane (+ a tie bitmap in nearest_even mode); AdamW runs
// fused on the planes (stowage/bucket_optimizers.hpp).
std::unique_ptr<ParameterStore> make_shared_storage_store(const Context& ctx, const std::vector<float>& init,
                                                          Rounding rounding);

// Activation-function recompute (stowage/recompute.hpp): the MLP's GeLU output is registered
// as y = gelu(x), released after the second MLP matmul and rematerialised before the layer's
// backward.
std::unique_ptr<ActivationHooks> make_recompute_hooks(const Context& ctx);

// Swap-attention (stowage/swap.hpp): the attention block's saved tensors (norm output, qkv,
// softmax probabilities, context) go to pinned host memory after forward and are prefetched
// `prefetch_distance` layers ahead of backward. Every such tensor is swapped, whatever its size
// (the demo's tensors are small; the library's default minimum is 512 KiB).
inline constexpr int kSwapPrefetchDistance = 0;
std::unique_ptr<ActivationHooks> make_swap_hooks(const Context& ctx);

// Optimizer offload (stowage/offload.hpp): AdamW's m and v in mapped host memory, none on the
// device; the step runs through stowage::OffloadedAdam. Built when the header is present (it
// arrived last); without it the configuration is left out and Unsupported is thrown here.
#if __has_include("stowage/offload.hpp")
inline constexpr bool kHaveOffload = true;
#else
inline constexpr bool kHaveOffload = false;
#endif
std::unique_ptr<OptimizerStates> make_offloaded_states(const Context& ctx, std::int64_t n);

}  // namespace stowage::demo
