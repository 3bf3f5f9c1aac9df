#pragma once
// The demo's optimizer settings, and the plain fp32 AdamW the baseline uses: the same float
// operations in the same order as stowage's fused AdamW on split storage (stowage/optimizers.hpp),
// so the two give bit-identical masters.
#include <cstddef>
#include <cstdint>

#include "stowage/optimizers.hpp"

namespace stowage::demo {

inline AdamOptions demo_adam_options() {
  AdamOptions o;
  o.lr = 3e-3f;
  o.beta1 = 0.9f;
  o.beta2 = 0.95f;
  o.eps = 1e-8f;
  o.weight_decay = 0.01f;  // every parameter, norm gains included: one fused call per step
  o.decoupled_weight_decay = true;
  return o;
}

// p, m, v updated in place for elements [0, n); `step` is 1-based.
void adamw_fp32(float* p, const float* grad, float* m, float* v, std::size_t n, const AdamOptions& options,
                std::int64_t step);

}  // namespace stowage::demo
