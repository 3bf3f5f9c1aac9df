#pragma once
// Megatron-LM's --pipeline-model-parallel-layout (transformer/pipeline_parallel_layer_layout.py):
// the layers of every pipeline stage, written out. Stages are separated by '|' in Megatron's order,
// virtual stage 0 of every rank, then virtual stage 1, …; in a stage, E is the embedding, t a
// decoder layer, m a multi-token-prediction layer, L the loss. "(…)*n" and "x*n" repeat, commas
// are cosmetic (Megatron refuses spaces): "Et*3|(tt|)*29,m|L".
#include <cstdint>
#include <string_view>
#include <vector>

namespace stowage::estimate {

struct PipelineLayout {
  std::int64_t vpp = 1;               // stages ÷ pipeline ranks
  std::vector<std::int64_t> decoder;  // decoder layers of stage chunk·pp + rank
  std::int64_t mtp_rank = -1;         // the rank whose last virtual stage runs the MTP layers; -1: none
};

// InvalidArgument naming what Megatron-LM refuses (validate_layer_layout): a stage count that pp
// does not divide, an unknown letter, E not first or L not last (or either not exactly once), a
// decoder count other than `num_layers`, an MTP count other than `mtp_layers`, a decoder layer
// after an MTP layer, MTP layers outside one rank's last virtual stage.
PipelineLayout parse_pipeline_layout(std::string_view text, std::int64_t pp, std::int64_t num_layers,
                                     std::int64_t mtp_layers);

}  // namespace stowage::estimate
