#pragma once
// What the transformer layers of one micro-batch keep for backward, in bytes per token on one
// device: a layer by kind, a model chunk under full recompute, the MTP layers. memory_model.cpp
// turns these into a stage's peak.
#include <cstdint>

#include "tools/estimate/run_config.hpp"

namespace stowage::estimate {

// Bytes per token of one transformer layer for one micro-batch on this device, by kind.
// Generalises Korthikanti et al. 2022 (Section 4.1) to GQA, gated MLPs, flash attention, MoE and
// fp32 training; with 16-bit activations, MHA, GeLU, ffn = 4h, dropout and no flash it is exactly
// 34·h + 5·a·s (their eq. 1).
// Activations of activation_bytes() each; dropout masks stay 1 byte.
// Selective recompute (RecomputeModule) takes what it rematerialises out of these kinds;
// `rerun` is the most of it alive at once in the layer's backward (not part of the total).
struct LayerBytes {
  double attention = 0, core_attention = 0, mlp = 0, act_output = 0, router = 0;
  double rerun = 0;
  double total() const { return attention + core_attention + mlp + act_output + router; }
};

// One layer's bytes: an MoE layer's (`moe_layer`) or a dense layer's, whose MLP is ffn_hidden_size wide.
LayerBytes layer_bytes_per_token(const RunConfig& c, bool moe_layer);

// One micro-batch through one model chunk of `n` layers from `first_layer` on: the MoE and dense
// layers whose activations stay stored, the layers full recompute rematerialises, the checkpointed
// inputs it keeps, and the bytes per token it rematerialises at once in backward (Megatron-LM
// transformer_block.py _checkpointed_forward: `uniform` checkpoints every group of num_layers
// layers and reruns a group at a time; `block` the first num_layers layers, one at a time).
struct ChunkActivations {
  double moe = 0, dense = 0, recomputed = 0, inputs = 0, working = 0;
};

ChunkActivations chunk_activations(const RunConfig& c, std::int64_t first_layer, std::int64_t n, const LayerBytes& moe,
                                   const LayerBytes& dense);

// One micro-batch through the k MTP layers, bytes per token (multi_token_prediction.py). Each
// layer keeps its transformer layer's activations, the shifted token ids (8 B) its embedding
// keeps and the embedding's dropout mask, enorm's input (h), eh_proj's input (the concatenation,
// 2h) and its final norm's input (h); each output but the last is the next layer's hnorm input
// (h). The decoder's normalised output is the first hnorm's input (h), and the output layers read
// their inputs from the concatenation of it with every MTP output ((1 + k)·h, process_mtp_loss):
// (6k)·h more than the output layer alone keeps. On a rank of their own before the last (a
// pipeline layout's), the concatenation is sent on and freed, and the decoder's normalised output
// is the input the rank received. With sequence parallelism eh_proj's output is
// gathered whole and scattered as a view (mappings.py _split_along_first_dim), which the layer's
// input norm keeps: the whole h, not h/t. Full recompute with the uniform method checkpoints each
// MTP layer (keeping the embedding, h, besides its hidden input) and reruns one in backward, its
// 4h and the whole input included; Megatron-LM does not recompute them with the block method.
struct MtpActivations {
  double stored = 0, working = 0;
};

MtpActivations mtp_activations(const RunConfig& c, const LayerBytes& layer, bool own_rank);

}  // namespace stowage::estimate
