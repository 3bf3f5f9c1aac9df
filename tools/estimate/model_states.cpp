#include "tools/estimate/model_states.hpp"

#include <algorithm>

namespace stowage::estimate {

// ZeRO paper (Rajbhandari et al. 2020, Section 3 / Figure 1): mixed-precision Adam keeps
// 2Ψ (16-bit weights) + 2Ψ (16-bit grads) + KΨ (K = 12: fp32 master, momentum, variance);
// stage 1 shards KΨ, stage 2 also the gradients, stage 3 also the weights (each ÷ N).
// Megatron-LM keeps fp32 main gradients (4 B; 18 B/param, or 6 + 12/d with the distributed
// optimizer — theoretical_memory_usage.py). DeepSpeed (what its ZeRO optimizers allocate,
// stage_1_and_2.py / stage3.py): an fp32 master beside the moments and, inside step() only, an
// fp32 gradient partition; stage 1 keeps every 16-bit gradient (4Ψ + 16Ψ/N with that partition),
// stage 2 frees those of partitions it does not own and copies its own into a 2Ψ/N buffer (2Ψ +
// 18Ψ/N, the estimator since v0.14.3), stage 3 18Ψ/N + 4·largest layer.
States model_states(const RunConfig& c, double params, double n, double largest_layer) {
  const auto& tr = c.training;
  const auto& p = c.parallel;
  const auto& tech = c.techniques;
  const bool mixed = tr.precision != Precision::fp32;
  const double W = mixed ? 2 : 4;
  double G = tr.grad_bytes ? tr.grad_bytes : (mixed ? 2 : 4);
  if (p.accounting == Accounting::megatron && !tr.grad_bytes) G = 4;
  const double master = mixed ? 4 : 0, moments = tr.optimizer == Optimizer::adam ? 8 : 4;
  const double K = master + moments;
  const int z = p.zero_stage;
  States s;
  if (p.accounting == Accounting::deepspeed) {
    // DeepSpeed's BF16_Optimizer (run_config.hpp) partitions the fp32 master and the moments over
    // data parallelism as ZeRO-1 does (bf16_optimizer.py).
    const bool bf16_optimizer = deepspeed_bf16_optimizer(c);
    const double n_opt = z >= 1 || bf16_optimizer ? n : 1;
    // ZeRO-1/2 clone their fp32 master partition even in fp32 training; stage 3 shares it then,
    // and stage 0 in fp32 runs the torch optimizer on the weights (no master, no fp32 grad copy).
    const double ds_master = (z == 1 || z == 2) ? 4 : master;
    const double ds_K = ds_master + moments;
    if (z == 3) {
      s.weights = (p.offload_param_deepspeed ? 0 : W * params / n) + W * largest_layer;
      s.gradients = (p.offload_optimizer_deepspeed ? 0 : 4 * params / n) + W * largest_layer;
    } else {
      s.weights = W * params;
      // Stage 2 keeps only its own partition of the 16-bit gradients (clear_grad_attribute);
      // with offload_optimizer it copies that partition to the host as it is reduced, in
      // backward. Stage 1 reduces after backward (reduce_gradients), offloaded or not, so every
      // 16-bit gradient is alive at the end of backward (stage_1_and_2.py process_gradients).
      const double grads16 = z == 2 ? W * params / n : W * params;
      s.gradients = p.offload_optimizer_deepspeed && z == 2 ? 0 : grads16;
      // The fp32 gradients the optimizer steps on exist only inside step(), after backward has
      // freed the activations. ZeRO-1/2 flatten the partition's gradients, then .to(fp32) (both
      // alive at once; the same tensor in fp32 training) (stage_1_and_2.py step()). At stage 0
      // the unfused optimizer (a client's torch optimizer) gives each parameter an fp32 gradient
      // (fp16/unfused_optimizer.py step()): 4 B/param; the fused one (FP16_Optimizer around
      // DeepSpeed's FusedAdam) converts each gradient to fp32 and flattens the copies into one
      // tensor, both alive until the flat one exists: 8 B/param (fused_optimizer.py step(), a
      // group at a time: one group holding the parameters), or the 16-bit gradients flattened,
      // 2 B/param, with legacy_fusion. The BF16_Optimizer keeps a whole gradient-accumulation
      // buffer (bf16 by default, fp32 at stage 1) and converts its partition to fp32 in step()
      // unless the buffer is fp32 already (bf16_optimizer.py). fp32 at stage 0 steps on the weights.
      if (bf16_optimizer) {
        const bool fp32_buffer = p.grad_accum_deepspeed == Precision::fp32;
        s.gradients += (fp32_buffer ? 4 : W) * params;
        s.step_only = fp32_buffer ? 0 : 4 * params / n_opt;
      } else if (z >= 1 && !p.offload_optimizer_deepspeed) {
        s.step_only = (W + (mixed ? 4 : 0)) * params / n_opt;
      } else if (z == 0 && mixed) {
        using Step = Parallelism::Fp16Step;
        const Step step = p.fp16_step_deepspeed;
        s.step_only = (step == Step::fused ? 8 : step == Step::fused_legacy ? 2 : 4) * params;
      }
    }
    s.optimizer = p.offload_optimizer_deepspeed ? 0 : ds_K * params / n_opt;
    if (p.offload_optimizer_deepspeed) s.host += (ds_K + 4) * params / n_opt;
    if (z == 3 && p.offload_param_deepspeed) s.host += W * params / n;
  } else {
    s.weights = (z >= 3 ? W * params / n : W * params) + (z >= 3 ? W * largest_layer : 0);
    s.gradients = (z >= 2 ? G * params / n : G * params) + (z >= 3 ? G * largest_layer : 0);
    s.optimizer = z >= 1 ? K * params / n : K * params;
  }
  const double local_master = (z >= 1 ? params / n : params);
  // stowage optimizer offload (DESIGN.md; MindSpeed virtual optimizer / swap-optimizer): the
  // optimizer states leave the device. Mapped: kernels address host memory directly, nothing
  // stays; streamed: a double-buffered window of `stream_window_layers` layers' states.
  const bool master_on_host = tech.optimizer_offload != OffloadMode::none || p.offload_optimizer_deepspeed;
  if (tech.optimizer_offload != OffloadMode::none && !p.offload_optimizer_deepspeed) {
    s.host += s.optimizer;
    const double window =
        tech.optimizer_offload == OffloadMode::streamed ? 2.0 * double(tech.stream_window_layers) : 0.0;
    const double stage_layers = double(std::max<std::int64_t>(1, c.model.num_layers / c.parallel.pp));
    s.optimizer = std::min(s.optimizer, window * s.optimizer / stage_layers);
  }
  // Shared fp32/bf16 storage (MindSpeed --reuse-fp32-param): the 16-bit weight of every
  // parameter whose fp32 master is on this device lives inside the master: −2 B per such
  // parameter. Round-to-nearest-even needs one extra bit per parameter (DESIGN.md).
  if (tech.shared_storage && mixed && !master_on_host) {
    s.weights -= W * local_master;
    if (tech.rounding == Rounding::nearest_even) s.weights += local_master / 8.0;
  }
  return s;
}

}  // namespace stowage::estimate
