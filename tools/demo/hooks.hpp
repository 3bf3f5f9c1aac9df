#pragma once
// The seams where each memory technique plugs into the demo trainer. The baseline implements
// each with the plain behaviour; a configuration swaps in the technique's version.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stowage/optimizers.hpp"
#include "stowage/parameter_bucket.hpp"
#include "stowage/tensor.hpp"
#include "tools/demo/context.hpp"

namespace stowage::demo {

// AdamW's states m and v (fp32, one per parameter element) and the step that uses them: on
// the device, or wherever an offload technique puts them. Steps are queued on the compute stream.
class OptimizerStates {
 public:
  virtual ~OptimizerStates() = default;
  // On a flat fp32 master (host-addressable) with flat fp32 gradients.
  virtual void step_fp32(const TensorView& master, const TensorView& grads, const AdamOptions& options,
                         std::int64_t step) = 0;
  // On split storage (the fused kernels of stowage/bucket_optimizers.hpp).
  virtual void step_bucket(ParameterBucket& weights, const TensorView& grads, const AdamOptions& options,
                           std::int64_t step) = 0;
  virtual std::string describe() const = 0;
};

// How weights are held: the bf16 values forward and backward read, and the fp32 master behind
// them that the optimizer updates.
class ParameterStore {
 public:
  virtual ~ParameterStore() = default;
  // bf16 weights, flat, indexed like ParameterLayout (element offsets).
  virtual const std::uint16_t* bf16() = 0;
  // One AdamW step (step is 1-based), queued on the compute stream.
  virtual void step(const TensorView& grads, OptimizerStates& states, std::int64_t step) = 0;
  // The fp32 master (after synchronising), for checks.
  virtual std::vector<float> master() = 0;
  virtual std::string describe() const = 0;
};

// Activation memory hooks, called on the host in program order.
class ActivationHooks {
 public:
  virtual ~ActivationHooks() = default;
  // Forward: computes `out` = GeLU(`in`) for `layer`'s MLP (`out` is allocated and resident);
  // true when it did. When no hook does, the trainer enqueues the kernel itself.
  virtual bool compute_mlp_activation(int layer, const TensorView& in, TensorView& out) { return false; }
  // Forward: the second MLP matmul that reads `out` is enqueued. A technique may release `out`
  // until before_layer_backward.
  virtual void mlp_activation_done(int layer, TensorView& out, const TensorView& in) {}
  // Forward: `layer`'s attention is done; `saved` are the tensors its backward needs.
  virtual void attention_done(int layer, const std::vector<TensorView*>& saved) {}
  // Backward: `layer`'s GeLU backward is enqueued; its input and output are no longer needed.
  virtual void mlp_activation_backward_done(int layer) {}
  // Backward is about to start on `layer` (MLP first, then attention).
  virtual void before_layer_backward(int layer) {}
  // `layer`'s attention backward is next and needs `saved` resident.
  virtual void before_attention_backward(int layer, const std::vector<TensorView*>& saved) {}
  // `layer`'s backward is complete (its activations are freed).
  virtual void after_layer_backward(int layer) {}
  // The step's backward is complete (all activations freed).
  virtual void backward_done() {}
  // Lines for the report: what the technique did over the run.
  virtual void describe(std::vector<std::string>& lines) const {}
};

// Several hook sets, called in order ("all" configuration).
class HookChain : public ActivationHooks {
 public:
  void add(std::unique_ptr<ActivationHooks> h) { hooks_.push_back(std::move(h)); }
  bool compute_mlp_activation(int layer, const TensorView& in, TensorView& out) override {
    for (auto& h : hooks_)
      if (h->compute_mlp_activation(layer, in, out)) return true;
    return false;
  }
  void mlp_activation_done(int layer, TensorView& out, const TensorView& in) override {
    for (auto& h : hooks_) h->mlp_activation_done(layer, out, in);
  }
  void attention_done(int layer, const std::vector<TensorView*>& saved) override {
    for (auto& h : hooks_) h->attention_done(layer, saved);
  }
  void before_layer_backward(int layer) override {
    for (auto& h : hooks_) h->before_layer_backward(layer);
  }
  void mlp_activation_backward_done(int layer) override {
    for (auto& h : hooks_) h->mlp_activation_backward_done(layer);
  }
  void before_attention_backward(int layer, const std::vector<TensorView*>& saved) override {
    for (auto& h : hooks_) h->before_attention_backward(layer, saved);
  }
  void after_layer_backward(int layer) override {
    for (auto& h : hooks_) h->after_layer_backward(layer);
  }
  void backward_done() override {
    for (auto& h : hooks_) h->backward_done();
  }
  void describe(std::vector<std::string>& lines) const override {
    for (const auto& h : hooks_) h->describe(lines);
  }

 private:
  std::vector<std::unique_ptr<ActivationHooks>> hooks_;
};

}  // namespace stowage::demo
