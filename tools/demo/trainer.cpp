#include "tools/demo/trainer.hpp"

#include <fmt/format.h>

#include "tools/demo/kernels.hpp"

namespace stowage::demo {

namespace k = kernels;

Trainer::Trainer(const Context& ctx, const ModelShape& shape, const ParameterLayout& layout, ParameterStore& params,
                 OptimizerStates& states, ActivationHooks& hooks)
    : ctx_(ctx), shape_(shape), layout_(layout), params_(params), states_(states), hooks_(hooks) {
  ScopedTag tag("grads");
  grads_ = ctx_.f32({layout_.total});
}

TensorView Trainer::linear(const TensorView& x, int p, std::int64_t m, std::int64_t kk, std::int64_t n) {
  TensorView y = ctx_.f32({m, n});
  const float* xp = f32_ptr(x);
  const auto* w = weight(p);
  float* yp = f32_ptr(y);
  ctx_.launch([=] { k::linear_forward(xp, w, yp, int(m), int(kk), int(n)); });
  return y;
}

TensorView Trainer::linear_backward(const TensorView& x, const TensorView& dy, int p, std::int64_t m, std::int64_t kk,
                                    std::int64_t n) {
  TensorView dx = ctx_.f32({m, kk});
  TensorView wt;
  {
    ScopedTag tag("workspace");
    wt = ctx_.f32({n, kk});  // W widened and transposed; freed on return (stream-ordered)
  }
  const float* xp = f32_ptr(x);
  const float* dyp = f32_ptr(dy);
  const auto* w = weight(p);
  float* wtp = f32_ptr(wt);
  float* dxp = f32_ptr(dx);
  float* dw = grad(p);
  ctx_.launch([=] {
    k::transpose_widen(w, wtp, int(kk), int(n));
    k::linear_backward_input(dyp, wtp, dxp, int(m), int(kk), int(n));
    k::linear_backward_weight(xp, dyp, dw, int(m), int(kk), int(n));
  });
  return dx;
}

void Trainer::forward_layer(int l, LayerActs& a, TensorView& x) {
  const auto& lp = layout_.layers[static_cast<std::size_t>(l)];
  const std::int64_t T = shape_.tokens(), h = shape_.hidden, f = shape_.ffn();
  const int b = shape_.batch, s = shape_.seq, heads = shape_.heads;
  a.x_in = x;
  {
    ScopedTag tag(tag_of(lp.w_qkv));
    a.ln1 = ctx_.f32({T, h});
    a.inv1 = ctx_.f32({T});
    {
      const float* xp = f32_ptr(a.x_in);
      const auto* g = weight(lp.ln1);
      float *y = f32_ptr(a.ln1), *inv = f32_ptr(a.inv1);
      ctx_.launch([=] { k::rmsnorm_forward(xp, g, y, inv, int(T), int(h)); });
    }
    a.qkv = linear(a.ln1, lp.w_qkv, T, h, 3 * h);
    a.probs = ctx_.f32({b, heads, s, s});
    a.ctx = ctx_.f32({T, h});
    {
      const float* q = f32_ptr(a.qkv);
      float *p = f32_ptr(a.probs), *c = f32_ptr(a.ctx);
      ctx_.launch([=] { k::attention_forward(q, p, c, b, s, int(h), heads); });
    }
    TensorView proj = linear(a.ctx, lp.w_o, T, h, h);
    a.x_mid = ctx_.f32({T, h});
    const float *xp = f32_ptr(a.x_in), *pp = f32_ptr(proj);
    float* out = f32_ptr(a.x_mid);
    ctx_.launch([=] { k::add(xp, pp, out, T * h); });
  }
  hooks_.attention_done(l, {&a.ln1, &a.qkv, &a.probs, &a.ctx});
  {
    ScopedTag tag(tag_of(lp.w_fc1));
    a.ln2 = ctx_.f32({T, h});
    a.inv2 = ctx_.f32({T});
    {
      const float* xp = f32_ptr(a.x_mid);
      const auto* g = weight(lp.ln2);
      float *y = f32_ptr(a.ln2), *inv = f32_ptr(a.inv2);
      ctx_.launch([=] { k::rmsnorm_forward(xp, g, y, inv, int(T), int(h)); });
    }
    a.fc1 = linear(a.ln2, lp.w_fc1, T, h, f);
    a.act = ctx_.f32({T, f});
    if (!hooks_.compute_mlp_activation(l, a.fc1, a.act)) {
      const float* in = f32_ptr(a.fc1);
      float* out = f32_ptr(a.act);
      ctx_.launch([=] { k::gelu_forward(in, out, T * f); });
    }
    TensorView fc2 = linear(a.act, lp.w_fc2, T, f, h);
    x = ctx_.f32({T, h});
    const float *xp = f32_ptr(a.x_mid), *pp = f32_ptr(fc2);
    float* out = f32_ptr(x);
    ctx_.launch([=] { k::add(xp, pp, out, T * h); });
  }
  hooks_.mlp_activation_done(l, a.act, a.fc1);
}

TensorView Trainer::forward(const TensorView& ids, std::vector<LayerActs>& acts, HeadActs& head) {
  const std::int64_t T = shape_.tokens(), h = shape_.hidden, V = shape_.vocab;
  TensorView x;
  {
    ScopedTag tag("embedding");
    x = ctx_.f32({T, h});
    const auto* idp = ids.data_as<std::int32_t>();
    const auto* table = weight(layout_.embedding);
    float* out = f32_ptr(x);
    ctx_.launch([=] { k::embedding_forward(idp, table, out, int(T), int(h)); });
  }
  for (int l = 0; l < shape_.layers; ++l) forward_layer(l, acts[static_cast<std::size_t>(l)], x);
  ScopedTag tag("head");
  head.x_final = x;
  head.lnf = ctx_.f32({T, h});
  head.invf = ctx_.f32({T});
  const float* xp = f32_ptr(x);
  const auto* g = weight(layout_.ln_f);
  float *y = f32_ptr(head.lnf), *inv = f32_ptr(head.invf);
  ctx_.launch([=] { k::rmsnorm_forward(xp, g, y, inv, int(T), int(h)); });
  head.logits = linear(head.lnf, layout_.w_out, T, h, V);
  return head.logits;
}

TensorView Trainer::backward_head(HeadActs& head, const TensorView& targets, float* loss) {
  const std::int64_t T = shape_.tokens(), h = shape_.hidden, V = shape_.vocab;
  ScopedTag tag("head");
  TensorView dlogits = ctx_.f32({T, V});
  {
    const float* lg = f32_ptr(head.logits);
    const auto* tp = targets.data_as<std::int32_t>();
    float* dl = f32_ptr(dlogits);
    ctx_.launch([=] { *loss = k::cross_entropy(lg, tp, dl, int(T), int(V)); });
  }
  head.logits = {};
  TensorView dlnf = linear_backward(head.lnf, dlogits, layout_.w_out, T, h, V);
  dlogits = {};
  head.lnf = {};
  TensorView dx = ctx_.f32({T, h});
  const float *xp = f32_ptr(head.x_final), *inv = f32_ptr(head.invf), *dy = f32_ptr(dlnf);
  const auto* g = weight(layout_.ln_f);
  float *dxp = f32_ptr(dx), *dg = grad(layout_.ln_f);
  ctx_.launch([=] { k::rmsnorm_backward(xp, g, inv, dy, dxp, dg, int(T), int(h)); });
  head = {};
  return dx;
}

TensorView Trainer::backward_layer(int l, LayerActs& a, TensorView dy) {
  const auto& lp = layout_.layers[static_cast<std::size_t>(l)];
  const std::int64_t T = shape_.tokens(), h = shape_.hidden, f = shape_.ffn();
  const int b = shape_.batch, s = shape_.seq, heads = shape_.heads;
  hooks_.before_layer_backward(l);
  TensorView d_xmid;
  {
    ScopedTag tag(tag_of(lp.w_fc1));
    TensorView d_act = linear_backward(a.act, dy, lp.w_fc2, T, f, h);
    a.act = {};
    {
      const float* in = f32_ptr(a.fc1);
      float* d = f32_ptr(d_act);
      ctx_.launch([=] { k::gelu_backward(in, d, d, T * f); });  // in place: d_act becomes d_fc1
    }
    a.fc1 = {};
    hooks_.mlp_activation_backward_done(l);
    TensorView d_ln2 = linear_backward(a.ln2, d_act, lp.w_fc1, T, h, f);
    d_act = {};
    a.ln2 = {};
    d_xmid = ctx_.f32({T, h});
    const float *xp = f32_ptr(a.x_mid), *inv = f32_ptr(a.inv2), *dn = f32_ptr(d_ln2), *dyp = f32_ptr(dy);
    const auto* g = weight(lp.ln2);
    float *dx = f32_ptr(d_xmid), *dg = grad(lp.ln2);
    ctx_.launch([=] {
      k::rmsnorm_backward(xp, g, inv, dn, dx, dg, int(T), int(h));
      k::add_inplace(dx, dyp, T * h);  // residual
    });
    a.x_mid = {};
    a.inv2 = {};
    dy = {};
  }
  hooks_.before_attention_backward(l, {&a.ln1, &a.qkv, &a.probs, &a.ctx});
  ScopedTag tag(tag_of(lp.w_qkv));
  TensorView d_ctx = linear_backward(a.ctx, d_xmid, lp.w_o, T, h, h);
  a.ctx = {};
  TensorView dqkv = ctx_.f32({T, 3 * h});
  {
    TensorView dp;
    {
      ScopedTag ws("workspace");
      dp = ctx_.f32({s});
    }
    const float *q = f32_ptr(a.qkv), *p = f32_ptr(a.probs), *dc = f32_ptr(d_ctx);
    float *dq = f32_ptr(dqkv), *dpp = f32_ptr(dp);
    ctx_.launch([=] { k::attention_backward(q, p, dc, dq, dpp, b, s, int(h), heads); });
  }
  a.probs = {};
  d_ctx = {};
  TensorView d_ln1 = linear_backward(a.ln1, dqkv, lp.w_qkv, T, h, 3 * h);
  a.qkv = {};
  a.ln1 = {};
  dqkv = {};
  TensorView dx = ctx_.f32({T, h});
  const float *xp = f32_ptr(a.x_in), *inv = f32_ptr(a.inv1), *dn = f32_ptr(d_ln1), *dm = f32_ptr(d_xmid);
  const auto* g = weight(lp.ln1);
  float *dxp = f32_ptr(dx), *dg = grad(lp.ln1);
  ctx_.launch([=] {
    k::rmsnorm_backward(xp, g, inv, dn, dxp, dg, int(T), int(h));
    k::add_inplace(dxp, dm, T * h);  // residual
  });
  a = {};
  hooks_.after_layer_backward(l);
  return dx;
}

float Trainer::train_step(const Batch& batch, std::int64_t step) {
  const std::int64_t T = shape_.tokens(), h = shape_.hidden;
  TensorView ids, targets;
  {
    ScopedTag tag("tokens");
    ids = TensorView::empty(*ctx_.allocator, DType::i32, {T}, ctx_.compute);
    targets = TensorView::empty(*ctx_.allocator, DType::i32, {T}, ctx_.compute);
    ctx_.device->copy_async(ids.data(), batch.inputs.data(), ids.nbytes(), CopyKind::host_to_device, ctx_.compute);
    ctx_.device->copy_async(targets.data(), batch.targets.data(), targets.nbytes(), CopyKind::host_to_device,
                            ctx_.compute);
  }
  ctx_.device->fill_async(grads_.data(), 0, grads_.nbytes(), ctx_.compute);

  std::vector<LayerActs> acts(static_cast<std::size_t>(shape_.layers));
  HeadActs head;
  forward(ids, acts, head);
  float loss = 0.0f;
  TensorView dx = backward_head(head, targets, &loss);
  for (int l = shape_.layers - 1; l >= 0; --l) dx = backward_layer(l, acts[static_cast<std::size_t>(l)], dx);
  {
    ScopedTag tag("embedding");
    const auto* idp = ids.data_as<std::int32_t>();
    const float* d = f32_ptr(dx);
    float* dt = grad(layout_.embedding);
    ctx_.launch([=] { k::embedding_backward(idp, d, dt, int(T), int(h)); });
  }
  dx = {};
  hooks_.backward_done();

  ScopedTag tag("optimizer");
  params_.step(grads_, states_, step);
  ctx_.sync();  // the loss is read on the host
  return loss;
}

}  // namespace stowage::demo
