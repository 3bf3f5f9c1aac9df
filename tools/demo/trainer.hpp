#pragma once
// One training step of the demo transformer: forward layer by layer (activations allocated as
// they are produced), cross-entropy, backward in reverse (each activation freed once used),
// AdamW. Every buffer comes from the context's allocator, tagged by layer.
#include <cstdint>
#include <vector>

#include "tools/demo/corpus.hpp"
#include "tools/demo/hooks.hpp"
#include "tools/demo/model.hpp"

namespace stowage::demo {

class Trainer {
 public:
  Trainer(const Context& ctx, const ModelShape& shape, const ParameterLayout& layout, ParameterStore& params,
          OptimizerStates& states, ActivationHooks& hooks);

  // Runs step `step` (1-based) on `batch` and returns its loss (waits for the compute stream).
  float train_step(const Batch& batch, std::int64_t step);

 private:
  struct LayerActs {
    TensorView x_in, ln1, inv1, qkv, probs, ctx, x_mid, ln2, inv2, fc1, act;
  };
  struct HeadActs {
    TensorView x_final, lnf, invf, logits;
  };

  TensorView forward(const TensorView& ids, std::vector<LayerActs>& acts, HeadActs& head);
  void forward_layer(int l, LayerActs& a, TensorView& x);
  TensorView backward_head(HeadActs& head, const TensorView& targets, float* loss);
  TensorView backward_layer(int l, LayerActs& a, TensorView dy);

  // y[M,N] = x[M,K] · W (bf16 parameter p)
  TensorView linear(const TensorView& x, int p, std::int64_t m, std::int64_t k, std::int64_t n);
  // dx = dy · W^T and dW += x^T · dy
  TensorView linear_backward(const TensorView& x, const TensorView& dy, int p, std::int64_t m, std::int64_t k,
                             std::int64_t n);

  const std::uint16_t* weight(int p) { return params_.bf16() + layout_.params[static_cast<std::size_t>(p)].offset; }
  float* grad(int p) { return f32_ptr(grads_) + layout_.params[static_cast<std::size_t>(p)].offset; }
  const std::string& tag_of(int p) const { return layout_.params[static_cast<std::size_t>(p)].tag; }

  Context ctx_;
  ModelShape shape_;
  const ParameterLayout& layout_;
  ParameterStore& params_;
  OptimizerStates& states_;
  ActivationHooks& hooks_;
  TensorView grads_;  // fp32, flat like the parameters
};

}  // namespace stowage::demo
