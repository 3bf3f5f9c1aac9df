#include "tools/plan/time_model.hpp"

#include <algorithm>
#include <cmath>

namespace stowage::plan {

using estimate::Recompute;
using estimate::RunConfig;

namespace {

// Matrix-multiply FLOPs per token of one layer's forward, on the whole layer (before TP):
// 2 per weight of QKV, output projection and MLP (the routed experts of a token for MoE), and
// causal attention's QKᵀ and PV, 2·a·d·s (half of the full 4·a·d·s).
struct LayerFlops {
  double linear = 0, attention = 0;
  double replicated = 0;  // MLA's down projections: whole on every TP rank (÷ TP only with SP's token split)
  double total() const { return linear + attention + replicated; }
};

// `moe_layer`: an MoE layer's, else a dense layer's (an MoE model's dense layers have a dense MLP).
LayerFlops layer_forward_flops(const RunConfig& c, bool moe_layer) {
  const auto& m = c.model;
  const double h = double(m.hidden_size), q = double(m.num_heads * m.head_size()),
               kv = double(m.kv_heads() * m.head_size());
  // An MoE token runs k experts of the experts' own width (--moe-ffn-hidden-size).
  const double F = double(moe_layer ? m.expert_ffn() : m.ffn_hidden_size),
               k = moe_layer ? double(m.experts_per_token) : 1.0;
  // Every token also runs the shared experts, an MLP of their total width.
  const double S = double(moe_layer && m.shared_experts() ? m.shared_expert_ffn_hidden_size : 0);
  LayerFlops f;
  f.linear = 2.0 * (h * (q + 2 * kv) + q * h + k * double(m.mlp_weights(std::int64_t(F))) +
                    double(m.mlp_weights(std::int64_t(S))));
  f.attention = 2.0 * q * double(c.training.seq_length);
  if (m.mla) {
    // MLA: 2 per weight of every projection (model_config.cpp count_parameters); causal QKᵀ over
    // query/key heads of qk_head_dim + qk_pos_emb_head_dim and PV over value heads of v_head_dim.
    const estimate::ParameterCounts pc = estimate::count_parameters(m, m.vocab_size);
    const double attn_weights = double(pc.attention - pc.attention_replicated) - (m.proj_bias ? h : 0.0);
    f.linear += 2.0 * (attn_weights - (h * (q + 2 * kv) + q * h));
    f.replicated = 2.0 * double(pc.attention_replicated);
    f.attention = double(m.query_width() + m.value_width()) * double(c.training.seq_length);
  }
  return f;
}

// The stage that takes longest per micro-batch: its layers and, of them, the MoE ones. Evenly split
// models have alike stages and the last one (the output layer) is the slowest; with dense layers
// mixed in, or stages of their own sizes, each stage's own layers (and the last one's output layer)
// decide.
struct SlowStage {
  double layers = 0, moe = 0;
  bool last = true;  // it runs the output layer, the loss and the MTP layers
};

// Forward FLOPs per token of the last stage's work beyond its layers: the output layer (2·h·V) and
// each MTP layer, a layer of the last layer's kind, eh_proj (2h → h) and one more output layer
// (training.py num_floating_point_operations).
double tail_flops(const RunConfig& c, const LayerFlops& fm, const LayerFlops& fd) {
  const auto& m = c.model;
  const double h = double(m.hidden_size), logits = 2.0 * h * double(estimate::padded_vocab(c));
  const LayerFlops& fk = m.mtp_moe() ? fm : fd;
  return logits + double(m.mtp_layers) * (fk.total() + 2.0 * 2.0 * h * h + logits);
}

SlowStage slow_stage(const RunConfig& c) {
  const auto& m = c.model;
  const auto& p = c.parallel;
  SlowStage s{double(m.num_layers) / double(p.pp), m.moe() ? double(m.num_layers) / double(p.pp) : 0.0};
  if (!m.mixed_layers() && !p.uneven_rules() && !p.has_layout()) return s;
  const LayerFlops fm = layer_forward_flops(c, true), fd = layer_forward_flops(c, false);
  const double tail = tail_flops(c, fm, fd);
  double slowest = -1;
  for (std::int64_t r = 0; r < p.pp; ++r) {
    const double moe = double(estimate::stage_moe_layers(c, r)), layers = double(estimate::stage_layers(c, r));
    const bool last = r == p.pp - 1;
    const double flops = moe * fm.total() + (layers - moe) * fd.total() + (last ? tail : 0.0);
    if (flops >= slowest) {  // ties: the later stage
      slowest = flops;
      s = {layers, moe, last};
    }
  }
  return s;
}

double seconds(double bytes, double gbps) { return bytes / (gbps * 1e9); }

// Ring collectives (NCCL): all-gather and reduce-scatter move (n−1)/n of the full buffer per
// rank, all-reduce twice that.
double ring_fraction(double n) { return n > 1 ? (n - 1) / n : 0.0; }

}  // namespace

double model_flops_per_step(const RunConfig& c) {
  const auto& m = c.model;
  const LayerFlops fm = layer_forward_flops(c, true), fd = layer_forward_flops(c, false);
  const double moe = double(m.moe_layers(0, m.num_layers)), dense = double(m.num_layers) - moe;
  const double tokens = double(c.training.seq_length) * double(c.training.micro_batch) *
                        double(c.training.grad_accumulation) * double(c.parallel.dp);
  return 3.0 * tokens * (moe * fm.total() + dense * fd.total() + tail_flops(c, fm, fd));
}

StepTime step_time(const RunConfig& c, const Cluster& cl, const estimate::StageMemory& memory) {
  const auto& m = c.model;
  const auto& p = c.parallel;
  const auto& tr = c.training;
  StepTime st;
  const double rate = cl.peak_tflops * 1e12 * cl.efficiency;                       // FLOP/s one GPU reaches
  const double T = double(tr.micro_batch) * double(tr.seq_length) / double(p.cp);  // tokens per rank
  const double t = double(p.tp), h = double(m.hidden_size);
  const SlowStage slow = slow_stage(c);
  const double layers = slow.layers;
  const double moe_share = slow.layers > 0 ? slow.moe / slow.layers : 0.0;  // of its layers, the MoE ones
  const double M = double(tr.grad_accumulation);
  // Its average layer: MoE and dense layers in their share.
  const LayerFlops fm = layer_forward_flops(c, true), fd = layer_forward_flops(c, false);
  const LayerFlops f{moe_share * fm.linear + (1 - moe_share) * fd.linear,
                     moe_share * fm.attention + (1 - moe_share) * fd.attention,
                     moe_share * fm.replicated + (1 - moe_share) * fd.replicated};
  const double vocab = double(estimate::padded_vocab(c));

  // One micro-batch through one stage: forward, backward (2× forward: dgrad + wgrad), on the
  // slowest stage (slow_stage: the last, with the output layer, unless the stages differ).
  const double layer_fwd = T * ((f.linear + f.attention) / t + f.replicated / (p.sequence_parallel ? t : 1.0)) / rate;
  const double logits_fwd = T * 2.0 * h * vocab / t / rate;
  // The last stage also runs the MTP layers, each a layer of the last layer's kind, eh_proj and
  // one more output layer; their terms below count only when the slowest stage is the last.
  const LayerFlops& fk = m.mtp_moe() ? fm : fd;
  const double mtp = slow.last ? double(m.mtp_layers) : 0.0;
  const double mtp_layer_fwd =
      T * ((fk.linear + fk.attention + 4.0 * h * h) / t + fk.replicated / (p.sequence_parallel ? t : 1.0)) / rate;
  const double mtp_fwd = mtp * (mtp_layer_fwd + logits_fwd);
  const double stage_fwd = layers * layer_fwd + (slow.last ? logits_fwd + mtp_fwd : 0.0);
  const double stage_bwd = 2.0 * stage_fwd;

  // Recompute: full reruns each recomputed layer's forward; selective reruns core attention;
  // activation-function recompute reruns an elementwise op, bound by HBM (read its input,
  // write its output).
  const double chunk_layers = layers / double(p.vpp);
  double recomputed_layers = 0;
  if (c.recompute.granularity == Recompute::full) {
    const double n = double(c.recompute.num_layers);
    recomputed_layers = c.recompute.method == estimate::RecomputeMethod::uniform || n <= 0
                            ? layers
                            : std::min(n, chunk_layers) * double(p.vpp);
  }
  // Full recompute with the uniform method reruns the MTP layers too (multi_token_prediction.py).
  const double mtp_rerun =
      c.recompute.granularity == Recompute::full && c.recompute.method == estimate::RecomputeMethod::uniform ? mtp
                                                                                                             : 0.0;
  double stage_recompute = recomputed_layers * layer_fwd + mtp_rerun * mtp_layer_fwd;
  // (The plan's search recomputes no other module selectively.)
  if (c.recompute.recomputes(estimate::RecomputeModule::core_attn) && !tr.flash_attention)
    stage_recompute += layers * T * f.attention / t / rate;
  // It covers the layers full recompute leaves stored (the others rerun their activation in the
  // forward counted above), or the first num_layers without full recompute, as the memory model.
  if (c.techniques.act_fn_recompute || c.recompute.granularity == Recompute::activation_function) {
    const double S = double(m.shared_experts() ? m.shared_expert_ffn_hidden_size : 0) / t;
    const double moe_width = double(m.experts_per_token) * double(m.expert_ffn()) / t + S;
    const double width = moe_share * moe_width + (1 - moe_share) * double(m.ffn_hidden_size) / t;
    double act_layers = std::max(0.0, layers - recomputed_layers);
    if (recomputed_layers == 0 && c.recompute.num_layers > 0)
      act_layers = std::min(double(c.recompute.num_layers), layers);
    stage_recompute += act_layers * T * width * 2.0 * (m.gated_mlp ? 3.0 : 2.0) / (cl.hbm_gbps * 1e9);
  }

  // TP: with SP each layer all-gathers its two inputs and reduce-scatters its two outputs in
  // forward and again in backward; without SP, two all-reduces each way (Korthikanti §4.2.2:
  // the same bytes). Recomputed layers repeat their forward collectives. NVLink within a node.
  // Each is h wide, except MLA's attention input under SP (Megatron's MultiLatentAttention with
  // TE's linears): its down projections run duplicated on the sequence shard, and the
  // column-parallel up projections gather their inputs, the query latent (the hidden state where
  // queries project from it directly) and the key/value latent, with the rotary key.
  const double tp_bw = p.tp <= cl.gpus_per_node ? cl.intra_node_gbps : cl.inter_node_gbps;
  const double act_bytes = T * h * 2.0;
  const bool mla_sp = m.mla && p.sequence_parallel && p.tp > 1;
  const double q_input = double(m.q_lora_rank > 0 ? m.q_lora_rank : m.hidden_size);
  const double attention_input = mla_sp ? q_input + double(m.kv_lora_rank + m.qk_rope_head_dim) : h;
  const double tp_layer = ring_fraction(t) * T * 2.0 * (3.0 * h + attention_input) / (tp_bw * 1e9);
  const double stage_tp = tp_layer * (2.0 * (layers + mtp) + recomputed_layers + mtp_rerun);
  // Those duplicated down projections are marked sequence-parallel, so once a step their
  // gradients (fp32 in Megatron, as the DP term's) are all-reduced over TP, after backward
  // (finalize_model_grads: each rank saw its own sequence shard).
  double mla_grad_allreduce = 0;
  if (mla_sp) {
    const double down = h * (double(m.q_lora_rank) + double(m.kv_lora_rank + m.qk_rope_head_dim));
    const double grad_width = tr.grad_bytes ? double(tr.grad_bytes) : 4.0;
    mla_grad_allreduce = 2.0 * ring_fraction(t) * layers * down * grad_width / (tp_bw * 1e9);
  }

  // CP: ring attention passes K and V (forward) and their gradients (backward) around the
  // ring, cp − 1 hops, overlapped with the attention blocks; what is longer is exposed.
  double stage_cp = 0;
  if (p.cp > 1) {
    const double cp_bw = p.tp * p.cp <= cl.gpus_per_node ? cl.intra_node_gbps : cl.inter_node_gbps;
    const double kv_bytes = T * double(m.key_width() + m.value_width()) / t * 2.0;
    const double fwd = double(p.cp - 1) * kv_bytes / (cp_bw * 1e9), bwd = 2.0 * fwd;
    const double attn = T * f.attention / t / rate;
    stage_cp = layers * (std::max(0.0, fwd - attn) + std::max(0.0, bwd - 2.0 * attn));
  }

  // EP: every MoE layer sends each token's hidden state to its k experts and back (dispatch and
  // combine all-to-alls, (ep − 1)/ep of the k·T·h·2 bytes leave the rank), in forward and again in
  // backward; recomputed layers repeat the forward ones. On NVLink while TP·CP·EP ranks fit in a
  // node (Megatron orders ranks tp-cp-ep-dp-pp).
  double stage_ep = 0;
  if (m.moe() && p.ep > 1) {
    const double bw = p.tp * p.cp * p.ep <= cl.gpus_per_node ? cl.intra_node_gbps : cl.inter_node_gbps;
    const double bytes = double(m.experts_per_token) * act_bytes / t * ring_fraction(double(p.ep));
    stage_ep = 2.0 * bytes / (bw * 1e9) *
               ((2.0 * layers + recomputed_layers) * moe_share + (m.mtp_moe() ? 2.0 * mtp + mtp_rerun : 0.0));
  }

  // Swap-attention: each micro-batch's swapped activations go to the host after its forward
  // and come back before its backward, on the GPU's host link, overlapped with that compute.
  // Only the swapped activations: offloaded optimizer states are host bytes too, but move once
  // per step (the optimizer term).
  double stage_swap = 0;
  if (c.techniques.swap_attention && memory.swapped_bytes > 0) {
    const double per_mb = double(memory.swapped_bytes) / std::max(1.0, memory.microbatches_in_flight);
    const double link = seconds(per_mb, cl.host_link_gbps);
    stage_swap = std::max(0.0, link - stage_fwd) + std::max(0.0, link - stage_bwd);
  }

  const double per_mb = stage_fwd + stage_bwd + stage_recompute + stage_tp + stage_cp + stage_ep + stage_swap;
  st.compute = M * (stage_fwd + stage_bwd);
  st.recompute = M * stage_recompute;
  st.tp_comm = M * stage_tp + mla_grad_allreduce;
  st.cp_comm = M * stage_cp;
  st.ep_comm = M * stage_ep;
  st.swap = M * stage_swap;
  // Pipeline bubble: (p − 1)/v micro-batch slots of fill and drain (Narayanan et al. 2021 §2.2:
  // bubble fraction (p − 1)/(v·m)).
  st.pp_bubble = double(p.pp - 1) / double(p.vpp) * per_mb;
  // Pipeline sends: one activation (÷ t, Megatron's scatter/gather over TP) each way per
  // micro-batch and model chunk; the fill and drain ones are on the critical path, and the
  // interleaved schedule sends v times as many.
  if (p.pp > 1) {
    const bool cross_node = p.tp * p.cp * p.dp >= cl.gpus_per_node;
    const double bw = cross_node ? cl.inter_node_gbps : cl.intra_node_gbps;
    const double msg = seconds(act_bytes / t, bw);
    st.pp_comm = 2.0 * double(p.vpp) * double(p.pp - 1) * msg;
  }

  // Data parallelism: gradients (fp32 in Megatron, 4 B) reduced over DP·CP. The distributed
  // optimizer reduce-scatters them and all-gathers the 16-bit parameters after the step; else an
  // all-reduce. Overlapped (--overlap-grad-reduce/--overlap-param-gather) with the last
  // micro-batch's backward and the next step's first forward. ZeRO-3 gathers the weights for
  // every micro-batch's forward and backward and reduce-scatters its gradients, prefetched under
  // that micro-batch's compute.
  const double n = double(p.dp * p.cp);
  const double params = double(memory.parameters);
  if (n > 1) {
    const bool cross_node = p.tp * p.cp * p.dp > cl.gpus_per_node;
    const double bw = (cross_node ? cl.inter_node_gbps : cl.intra_node_gbps) * 1e9;
    const double grad_bytes = (tr.grad_bytes ? double(tr.grad_bytes) : 4.0) * params;
    if (p.zero_stage >= 3) {
      const double per_mb_comm = (2.0 * 2.0 * params + grad_bytes) * ring_fraction(n) / bw;
      st.dp_comm = M * std::max(0.0, per_mb_comm - (stage_fwd + stage_bwd));
    } else if (p.zero_stage >= 1) {
      const double rs = grad_bytes * ring_fraction(n) / bw, ag = 2.0 * params * ring_fraction(n) / bw;
      st.dp_comm = std::max(0.0, rs - stage_bwd) + std::max(0.0, ag - stage_fwd);
    } else {
      st.dp_comm = std::max(0.0, 2.0 * grad_bytes * ring_fraction(n) / bw - stage_bwd);
    }
  }

  // Optimizer step (Adam): read master, moments, gradient; write master, moments, 16-bit
  // weight: 30 B per local parameter, on HBM — or on the host link when the states are offloaded
  // (the 16-bit weight is written on the device).
  const double local = p.zero_stage >= 1 ? params / n : params;
  if (c.techniques.optimizer_offload != estimate::OffloadMode::none)
    st.optimizer = seconds(28.0 * local, cl.host_link_gbps) + seconds(2.0 * local, cl.hbm_gbps);
  else st.optimizer = seconds(30.0 * local, cl.hbm_gbps);
  return st;
}

}  // namespace stowage::plan
