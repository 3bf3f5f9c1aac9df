#include "tools/demo/estimate_bridge.hpp"

#include "tools/demo/techniques.hpp"
#include "tools/estimate/memory_model.hpp"

namespace stowage::demo {

namespace {

estimate::RunConfig demo_run(const ModelShape& s) {
  estimate::RunConfig c;
  c.model.name = "stowage demo";
  c.model.hidden_size = s.hidden;
  c.model.num_layers = s.layers;
  c.model.num_heads = s.heads;
  c.model.ffn_hidden_size = s.ffn();
  c.model.vocab_size = s.vocab;
  c.model.gated_mlp = false;  // GeLU MLP
  c.model.rms_norm = true;
  c.training.seq_length = s.seq;
  c.training.micro_batch = s.batch;
  c.training.flash_attention = false;  // the demo stores the softmax probabilities
  c.training.grad_bytes = 4;           // fp32 gradients
  c.training.vocab_divisor = 1;
  c.training.precision = estimate::Precision::bf16;
  return c;
}

}  // namespace

std::int64_t estimated_saving(const Techniques& t, const ModelShape& shape, Rounding rounding) {
  estimate::RunConfig base = demo_run(shape);
  estimate::RunConfig with = base;
  with.techniques.shared_storage = t.shared_storage;
  with.techniques.rounding =
      rounding == Rounding::nearest_even ? estimate::Rounding::nearest_even : estimate::Rounding::half_up;
  with.techniques.act_fn_recompute = t.recompute;
  with.techniques.swap_attention = t.swap_attention;
  with.techniques.prefetch_window = 1 + kSwapPrefetchDistance;  // the layer in backward, plus the distance
  if (t.offload_optimizer) with.techniques.optimizer_offload = estimate::OffloadMode::mapped;
  estimate::finalize(base);
  estimate::finalize(with);
  return estimate::estimate_memory(base).peak_allocated - estimate::estimate_memory(with).peak_allocated;
}

}  // namespace stowage::demo
