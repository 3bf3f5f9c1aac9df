#pragma once
// Helpers for the estimate's tests: a preset's or a Megatron launch line's run configuration, a
// model's parameter count, an activation kind's bytes and input files written where the build
// keeps its scratch files; the command itself through tools_cli_test_util.hpp.
#include <cstdint>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "tools/estimate/megatron_args.hpp"
#include "tools/estimate/memory_model.hpp"
#include "tools/estimate/model_config.hpp"
#include "tools/estimate/run_config.hpp"
#include "tools_cli_test_util.hpp"

namespace stowage::testing {

// A preset model with no allocator overhead, so expectations are the model's bytes alone.
inline estimate::RunConfig config_for(const std::string& name) {
  estimate::RunConfig c;
  c.model = estimate::preset(name);
  c.allocator_overhead = 0.0;
  return c;
}

// A small Llama-style GPT as a Megatron launch line, its layer count left out: hidden 512, ffn 1024
// (SwiGLU), 8 heads, RMSNorm, RoPE, no biases, no dropout, untied, sequence 1024, micro-batch 2,
// vocabulary 50304, bf16, TP 1.
inline const std::string kSmallGpt =
    "--hidden-size 512 --ffn-hidden-size 1024 --num-attention-heads 8 --seq-length 1024 --max-position-embeddings 1024 "
    "--position-embedding-type rope --micro-batch-size 2 --vocab-size 50304 --bf16 --swiglu --normalization RMSNorm "
    "--disable-bias-linear --hidden-dropout 0 --attention-dropout 0 --untie-embeddings-and-output-weights ";

// A Megatron launch line's run configuration, with no allocator overhead.
inline estimate::RunConfig megatron_config(const std::string& args) {
  estimate::RunConfig c;
  estimate::apply_megatron_args(args, c);
  c.allocator_overhead = 0.0;
  return c;
}

// A Megatron-LM CI case's launch line on `gpus` GPUs (DP from the rest), as the case logs its
// memory: the last pipeline stage (rank world_size − 1). Every argument must be known.
inline estimate::StageMemory estimate_ci_last_rank(const std::string& args, std::int64_t gpus) {
  estimate::RunConfig c;
  estimate::apply_megatron_args(args, c, estimate::UnknownArguments::error);
  c.parallel.dp = gpus / (c.parallel.tp * c.parallel.pp * c.parallel.cp);
  c.stage = c.parallel.pp - 1;
  estimate::finalize(c);
  return estimate::estimate_memory(c);
}

// The bytes of one activation kind of a stage's estimate (a failure when the kind is unknown).
inline double activation_of(const estimate::StageMemory& m, const std::string& kind) {
  for (const auto& a : m.activations)
    if (a.name == kind) return double(a.bytes);
  ADD_FAILURE() << "no activation kind " << kind;
  return -1;
}

// The model's parameters, its vocabulary's embedding and output layer included.
inline std::int64_t total_params(const estimate::ModelConfig& m) {
  return estimate::count_parameters(m, m.vocab_size).total();
}

// Writes `text` to a file in the build folder and returns its path.
inline std::string temp_file(const std::string& name, const std::string& text) {
  const std::string path = std::string(STOWAGE_BINARY_DIR) + "/tools_estimate_test_" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

}  // namespace stowage::testing
