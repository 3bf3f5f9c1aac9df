#pragma once
// The host kernel bodies, written once over an operations struct O (ops_*.hpp) and compiled
// once per instruction-set level. Included inside an anonymous namespace after the ops structs,
// with floating-point contraction off: every multiply and add below is its own rounding, so the
// results equal a plain scalar loop doing the same operations (docs/precision.md).

// Runs body<Ops>(i) over [begin, end): single lanes up to a multiple of 8 (tie bytes), then
// groups of O::W lanes, then single lanes for the tail.
template <class O, class Body>
inline void for_each_group(std::size_t begin, std::size_t end, Body&& body) {
  std::size_t i = begin;
  if constexpr (O::W > 1) {
    std::size_t head = (begin + 7) & ~std::size_t{7};
    if (head > end) head = end;
    for (; i < head; ++i) body.template operator()<ScalarOps>(i);
    for (; i + O::W <= end; i += O::W) body.template operator()<O>(i);
  }
  for (; i < end; ++i) body.template operator()<ScalarOps>(i);
}

// Always inlined: the portable ops pass 64-byte lane arrays, which GCC would otherwise
// hand to an out-of-line copy through the stack on every group.
// fp32 master of elements i.. from the planes: ((bf16 + tie) << 16 | residual) - 0x8000.
template <class P, bool RNE>
[[gnu::always_inline]] inline typename P::F load_master(const SplitPlanes& w, std::size_t i) {
  typename P::U hi = P::load_u16(w.bf16 + i);
  if constexpr (RNE) {
    if constexpr (requires { P::add_ties(hi, w.ties, i); }) hi = P::add_ties(hi, w.ties, i);  // mask registers
    else hi = P::add(hi, P::load_ties(w.ties, i));
  }
  return P::as_f(P::sub(P::or_(P::shl16(hi), P::load_u16(w.residual + i)), P::set1(0x8000)));
}

// t = bits + 0x8000; bf16 = t >> 16, residual = t & 0xFFFF; in nearest_even mode an exact tie
// whose half_up result is odd (residual 0, bf16 odd) is stored one lower with its tie bit set.
template <class P, bool RNE, bool Stream = false>
[[gnu::always_inline]] inline void store_master(const SplitPlanes& w, std::size_t i, typename P::F x) {
  const typename P::U t = P::add(P::as_u(x), P::set1(0x8000));
  typename P::U hi = P::shr16(t);
  const typename P::U lo = P::and_(t, P::set1(0xFFFF));
  if constexpr (RNE) {
    if constexpr (requires { P::round_ties(hi, lo, w.ties, i); }) {
      hi = P::round_ties(hi, lo, w.ties, i);  // mask registers
    } else {
      const typename P::U tie = P::and_(P::eq(lo, P::set1(0)), P::and_(hi, P::set1(1)));
      hi = P::sub(hi, tie);
      P::store_ties(w.ties, i, tie);
    }
  }
  if constexpr (Stream) {
    P::stream_u16(w.bf16 + i, hi);
    P::stream_u16(w.residual + i, lo);
  } else {
    P::store_u16(w.bf16 + i, hi);
    P::store_u16(w.residual + i, lo);
  }
}

template <class P, bool BF16>
inline typename P::F load_grad(const void* g, std::size_t i) {
  if constexpr (BF16) {
    return P::as_f(P::shl16(P::load_u16(static_cast<const std::uint16_t*>(g) + i)));
  } else {
    return P::load_f32(static_cast<const float*>(g) + i);
  }
}

// Large splits and merges bypass the cache with non-temporal stores (no read-for-ownership of
// the destination) when every vector store is aligned; a fence makes them visible on return.
inline constexpr std::size_t kStreamingElements = std::size_t{1} << 20;

template <class O, bool RNE>
void split_range(const float* src, const SplitPlanes& w, std::size_t b, std::size_t e) {
  const std::size_t first_group = (b + 7) & ~std::size_t{7};
  const bool stream = O::W > 1 && e - b >= kStreamingElements &&
                      reinterpret_cast<std::uintptr_t>(w.bf16 + first_group) % (O::W * 2) == 0 &&
                      reinterpret_cast<std::uintptr_t>(w.residual + first_group) % (O::W * 2) == 0;
  if (stream) {
    for_each_group<O>(b, e, [&]<class P>(std::size_t i) { store_master<P, RNE, true>(w, i, P::load_f32(src + i)); });
    O::fence();
  } else {
    for_each_group<O>(b, e, [&]<class P>(std::size_t i) { store_master<P, RNE>(w, i, P::load_f32(src + i)); });
  }
}
template <class O, bool RNE>
void merge_range(const SplitPlanes& w, float* dst, std::size_t b, std::size_t e) {
  const std::size_t first_group = (b + 7) & ~std::size_t{7};
  const bool stream =
      O::W > 1 && e - b >= kStreamingElements && reinterpret_cast<std::uintptr_t>(dst + first_group) % (O::W * 4) == 0;
  if (stream) {
    for_each_group<O>(b, e, [&]<class P>(std::size_t i) { P::stream_f32(dst + i, load_master<P, RNE>(w, i)); });
    O::fence();
  } else {
    for_each_group<O>(b, e, [&]<class P>(std::size_t i) { P::store_f32(dst + i, load_master<P, RNE>(w, i)); });
  }
}
template <class O>
void split_kernel(const float* src, const SplitPlanes& w, std::size_t b, std::size_t e) {
  if (w.rounding == Rounding::nearest_even) split_range<O, true>(src, w, b, e);
  else split_range<O, false>(src, w, b, e);
}
template <class O>
void merge_kernel(const SplitPlanes& w, float* dst, std::size_t b, std::size_t e) {
  if (w.rounding == Rounding::nearest_even) merge_range<O, true>(w, dst, b, e);
  else merge_range<O, false>(w, dst, b, e);
}

template <class O, bool BF16>
bool nonfinite_range(const void* g, std::size_t b, std::size_t e) {
  bool found = false;
  for_each_group<O>(b, e, [&]<class P>(std::size_t i) {
    const typename P::U exp = P::set1(0x7F800000u);
    found |= P::any(P::eq(P::and_(P::as_u(load_grad<P, BF16>(g, i)), exp), exp));
  });
  return found;
}
template <class O>
bool nonfinite_kernel(const void* g, bool bf16, std::size_t b, std::size_t e) {
  return bf16 ? nonfinite_range<O, true>(g, b, e) : nonfinite_range<O, false>(g, b, e);
}

// Adam / AdamW; the operation order is the contract with the reference (docs/precision.md).
// Master is SplitMaster (fused on split storage) or Fp32Master (a plain fp32 array).
template <class P, class Master, class GradLoad>
inline void adam_element(const AdamScalars& s, const Master& master, GradLoad&& grad, float* mp, float* vp,
                         std::size_t i) {
  using F = typename P::F;
  F g = grad.template operator()<P>(i);
  g = P::fmul(P::fmul(g, P::fset1(s.inv_loss_scale)), P::fset1(s.clip_coef));
  F p = master.template load<P>(i);
  if (s.weight_decay != 0.0f) {
    if (s.decoupled) p = P::fmul(p, P::fset1(s.decay));
    else g = P::fadd(g, P::fmul(p, P::fset1(s.weight_decay)));
  }
  const F m = P::fadd(P::fmul(P::load_f32(mp + i), P::fset1(s.beta1)), P::fmul(g, P::fset1(s.one_minus_beta1)));
  const F v =
      P::fadd(P::fmul(P::load_f32(vp + i), P::fset1(s.beta2)), P::fmul(P::fmul(g, g), P::fset1(s.one_minus_beta2)));
  const F denom = P::fadd(P::fdiv(P::fsqrt(v), P::fset1(s.bias_correction2_sqrt)), P::fset1(s.eps));
  p = P::fsub(p, P::fmul(P::fdiv(m, denom), P::fset1(s.step_size)));
  P::store_f32(mp + i, m);
  P::store_f32(vp + i, v);
  master.template store<P>(i, p);
}

template <bool RNE>
struct SplitMaster {
  const SplitPlanes& w;
  template <class P>
  typename P::F load(std::size_t i) const {
    return load_master<P, RNE>(w, i);
  }
  template <class P>
  void store(std::size_t i, typename P::F x) const {
    store_master<P, RNE>(w, i, P::quiet_nan(x));  // a NaN result must read as NaN in the bf16 plane
  }
};
struct Fp32Master {
  float* p;
  template <class P>
  typename P::F load(std::size_t i) const {
    return P::load_f32(p + i);
  }
  template <class P>
  void store(std::size_t i, typename P::F x) const {
    P::store_f32(p + i, P::quiet_nan(x));  // as SplitMaster: the two paths stay bit-identical
  }
};

template <class O, bool RNE, bool BF16>
void adam_range(const AdamArgs& a, std::size_t b, std::size_t e) {
  const AdamScalars s = a.s;
  const SplitMaster<RNE> master{a.w};
  auto grad = [&]<class P>(std::size_t i) { return load_grad<P, BF16>(a.grad, i); };
  for_each_group<O>(b, e, [&]<class P>(std::size_t i) { adam_element<P>(s, master, grad, a.m, a.v, i); });
}
template <class O>
void adam_fp32_kernel(const AdamArgs& a, float* params, std::size_t b, std::size_t e) {
  const AdamScalars s = a.s;
  const Fp32Master master{params};
  if (a.grad_bf16) {
    auto grad = [&]<class P>(std::size_t i) { return load_grad<P, true>(a.grad, i); };
    for_each_group<O>(b, e, [&]<class P>(std::size_t i) { adam_element<P>(s, master, grad, a.m, a.v, i); });
  } else {
    auto grad = [&]<class P>(std::size_t i) { return load_grad<P, false>(a.grad, i); };
    for_each_group<O>(b, e, [&]<class P>(std::size_t i) { adam_element<P>(s, master, grad, a.m, a.v, i); });
  }
}
template <class O>
void adam_kernel(const AdamArgs& a, std::size_t b, std::size_t e) {
  const bool rne = a.w.rounding == Rounding::nearest_even;
  if (rne && a.grad_bf16) adam_range<O, true, true>(a, b, e);
  else if (rne) adam_range<O, true, false>(a, b, e);
  else if (a.grad_bf16) adam_range<O, false, true>(a, b, e);
  else adam_range<O, false, false>(a, b, e);
}

// SGD with momentum / Nesterov / L2 weight decay (PyTorch's formulation).
template <class O, bool RNE, bool BF16>
void sgd_range(const SgdArgs& a, std::size_t b, std::size_t e) {
  const SgdScalars s = a.s;
  for_each_group<O>(b, e, [&]<class P>(std::size_t i) {
    using F = typename P::F;
    F g = load_grad<P, BF16>(a.grad, i);
    g = P::fmul(P::fmul(g, P::fset1(s.inv_loss_scale)), P::fset1(s.clip_coef));
    F p = load_master<P, RNE>(a.w, i);
    if (s.weight_decay != 0.0f) g = P::fadd(g, P::fmul(p, P::fset1(s.weight_decay)));
    if (s.momentum != 0.0f) {
      F buf = g;
      if (!s.first_step) {
        buf =
            P::fadd(P::fmul(P::load_f32(a.buf + i), P::fset1(s.momentum)), P::fmul(g, P::fset1(s.one_minus_dampening)));
      }
      P::store_f32(a.buf + i, buf);
      g = s.nesterov ? P::fadd(g, P::fmul(buf, P::fset1(s.momentum))) : buf;
    }
    p = P::fsub(p, P::fmul(g, P::fset1(s.lr)));
    store_master<P, RNE>(a.w, i, P::quiet_nan(p));
  });
}
template <class O>
void sgd_kernel(const SgdArgs& a, std::size_t b, std::size_t e) {
  const bool rne = a.w.rounding == Rounding::nearest_even;
  if (rne && a.grad_bf16) sgd_range<O, true, true>(a, b, e);
  else if (rne) sgd_range<O, true, false>(a, b, e);
  else if (a.grad_bf16) sgd_range<O, false, true>(a, b, e);
  else sgd_range<O, false, false>(a, b, e);
}

template <class O>
KernelTable make_table() {
  return KernelTable{&split_kernel<O>, &merge_kernel<O>, &nonfinite_kernel<O>,
                     &adam_kernel<O>,  &sgd_kernel<O>,   &adam_fp32_kernel<O>};
}
