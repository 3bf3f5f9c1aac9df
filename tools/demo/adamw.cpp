#include "tools/demo/adamw.hpp"

#include <cmath>

namespace stowage::demo {

void adamw_fp32(float* p, const float* grad, float* m, float* v, std::size_t n, const AdamOptions& options,
                std::int64_t step) {
  // Scalars from the library so both paths round them identically.
  const AdamScalars s = adam_scalars(options, step);
  for (std::size_t i = 0; i < n; ++i) {
    float g = (grad[i] * s.inv_loss_scale) * s.clip_coef;
    float w = p[i];
    if (s.weight_decay != 0.0f) {
      if (s.decoupled) w = w * s.decay;
      else g = g + w * s.weight_decay;
    }
    const float mi = m[i] * s.beta1 + g * s.one_minus_beta1;
    const float vi = v[i] * s.beta2 + (g * g) * s.one_minus_beta2;
    const float denom = std::sqrt(vi) / s.bias_correction2_sqrt + s.eps;
    w = w - (mi / denom) * s.step_size;
    m[i] = mi;
    v[i] = vi;
    p[i] = w;
  }
}

}  // namespace stowage::demo
