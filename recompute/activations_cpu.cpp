// CPU activation kernels: activation_math.hpp on 8-lane vectors. Every element, the ragged
// tail included, runs the same vector code, so results do not depend on a buffer's address or
// length (a rematerialised tensor lands at another address and must come out bit-identical).
// On x86-64 each entry point is compiled twice, for AVX2 and for the baseline, and the CPU
// picks one at run time (a plain flag, not an ifunc: ifunc resolvers run before sanitizer
// runtimes start). Neither uses FMA, so both give the same bits.
#pragma GCC diagnostic ignored "-Wpsabi"  // 8-lane vectors pass only between inlined functions

#include <vector>

#include "recompute/activation_args.hpp"
#include "recompute/activation_math.hpp"
#include "stowage/activations.hpp"
#include "stowage/error.hpp"
#include "stowage/simd_level.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#define STOWAGE_X86_AVX2 1
#else
#define STOWAGE_X86_AVX2 0
#endif
#define STOWAGE_INLINE inline __attribute__((always_inline))

namespace stowage::cpu {
namespace {

using namespace act_math;
using namespace act_args;
using bf16 = std::uint16_t;

template <Activation A, class T>
STOWAGE_INLINE void unary_fwd(std::size_t n, const T* x, T* y) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) store8(y + i, act_fwd<A>(load8(x + i)));
  if (i < n) store_part(y + i, act_fwd<A>(load_part(x + i, n - i)), n - i);
}

template <Activation A, class T>
STOWAGE_INLINE void unary_bwd(std::size_t n, const T* x, const T* dy, T* dx) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) store8(dx + i, act_grad_times<A>(load8(x + i), load8(dy + i)));
  if (i < n) {
    const std::size_t k = n - i;
    store_part(dx + i, act_grad_times<A>(load_part(x + i, k), load_part(dy + i, k)), k);
  }
}

template <Activation A, class T>
STOWAGE_INLINE void bias_fwd(std::size_t rows, std::size_t cols, const T* x, const T* b, T* y) {
  for (std::size_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    std::size_t c = 0;
    for (; c + 8 <= cols; c += 8) store8(yr + c, act_fwd<A>(load8(xr + c) + load8(b + c)));
    if (c < cols) {
      const std::size_t k = cols - c;
      store_part(yr + c, act_fwd<A>(load_part(xr + c, k) + load_part(b + c, k)), k);
    }
  }
}

template <Activation A, class T>
STOWAGE_INLINE void bias_bwd(std::size_t rows, std::size_t cols, const T* x, const T* b, const T* dy, T* dx, T* dbias) {
  std::vector<float> acc(dbias != nullptr ? cols : 0, 0.0f);  // per-column sums, row order
  for (std::size_t r = 0; r < rows; ++r) {
    const std::size_t o = r * cols;
    std::size_t c = 0;
    for (; c + 8 <= cols; c += 8) {
      const v8f g = act_grad_times<A>(load8(x + o + c) + load8(b + c), load8(dy + o + c));
      store8(dx + o + c, g);
      if (dbias != nullptr) store8(acc.data() + c, load8(acc.data() + c) + g);
    }
    if (c < cols) {
      const std::size_t k = cols - c;
      const v8f g = act_grad_times<A>(load_part(x + o + c, k) + load_part(b + c, k), load_part(dy + o + c, k));
      store_part(dx + o + c, g, k);
      if (dbias != nullptr) store_part(acc.data() + c, load_part(acc.data() + c, k) + g, k);
    }
  }
  if (dbias == nullptr) return;
  std::size_t c = 0;
  for (; c + 8 <= cols; c += 8) store8(dbias + c, load8(acc.data() + c));
  if (c < cols) store_part(dbias + c, load_part(acc.data() + c, cols - c), cols - c);
}

template <Activation A, class T>
STOWAGE_INLINE void gated_fwd(std::size_t rows, std::size_t cols, const T* g, std::size_t gld, const T* u,
                              std::size_t uld, T* y) {
  for (std::size_t r = 0; r < rows; ++r) {
    const T* gr = g + r * gld;
    const T* ur = u + r * uld;
    T* yr = y + r * cols;
    std::size_t c = 0;
    for (; c + 8 <= cols; c += 8) store8(yr + c, act_fwd<A>(load8(gr + c)) * load8(ur + c));
    if (c < cols) {
      const std::size_t k = cols - c;
      store_part(yr + c, act_fwd<A>(load_part(gr + c, k)) * load_part(ur + c, k), k);
    }
  }
}

template <Activation A>
STOWAGE_INLINE void gated_bwd_block(const v8f& gv, const v8f& uv, const v8f& dyv, v8f& dg, v8f& du) {
  dg = act_grad_times<A>(gv, dyv * uv);
  du = dyv * act_fwd<A>(gv);
}

template <Activation A, class T>
STOWAGE_INLINE void gated_bwd(std::size_t rows, std::size_t cols, const T* g, std::size_t gld, const T* u,
                              std::size_t uld, const T* dy, T* dg, T* du) {
  for (std::size_t r = 0; r < rows; ++r) {
    const std::size_t go = r * gld, uo = r * uld, yo = r * cols;
    std::size_t c = 0;
    v8f a, b;
    for (; c + 8 <= cols; c += 8) {
      gated_bwd_block<A>(load8(g + go + c), load8(u + uo + c), load8(dy + yo + c), a, b);
      store8(dg + go + c, a);
      store8(du + uo + c, b);
    }
    if (c < cols) {
      const std::size_t k = cols - c;
      gated_bwd_block<A>(load_part(g + go + c, k), load_part(u + uo + c, k), load_part(dy + yo + c, k), a, b);
      store_part(dg + go + c, a, k);
      store_part(du + uo + c, b, k);
    }
  }
}

// The activation is a switch inside each entry point, so each instruction-set variant holds
// all four instantiations compiled for it.
#define STOWAGE_BY_ACTIVATION(a, kernel, ...)                                      \
  switch (a) {                                                                     \
    case Activation::relu: return kernel<Activation::relu>(__VA_ARGS__);           \
    case Activation::silu: return kernel<Activation::silu>(__VA_ARGS__);           \
    case Activation::gelu_erf: return kernel<Activation::gelu_erf>(__VA_ARGS__);   \
    case Activation::gelu_tanh: return kernel<Activation::gelu_tanh>(__VA_ARGS__); \
  }

#define STOWAGE_UNPAREN(...) __VA_ARGS__
#if STOWAGE_X86_AVX2
// The SIMD level every host kernel dispatches on (STOWAGE_SIMD or set_simd_level() can lower it).
bool have_avx2() { return simd_level() >= SimdLevel::avx2; }
// name_avx2 and name_base hold the same code for two instruction sets; name picks one.
// (params: the entry's parameters, `Activation a` first; args: the kernel's arguments.)
#define STOWAGE_ENTRY(name, params, args, kernel)                                                                    \
  __attribute__((target("avx2"))) void name##_avx2 params { STOWAGE_BY_ACTIVATION(a, kernel, STOWAGE_UNPAREN args) } \
  void name##_base params { STOWAGE_BY_ACTIVATION(a, kernel, STOWAGE_UNPAREN args) }                                 \
  void name params {                                                                                                 \
    if (have_avx2()) name##_avx2(a, STOWAGE_UNPAREN args);                                                           \
    else name##_base(a, STOWAGE_UNPAREN args);                                                                       \
  }
#else
#define STOWAGE_ENTRY(name, params, args, kernel) \
  void name params { STOWAGE_BY_ACTIVATION(a, kernel, STOWAGE_UNPAREN args) }
#endif

#define STOWAGE_DEFINE_KERNELS(T, sfx)                                                                                 \
  STOWAGE_ENTRY(unary_fwd_##sfx, (Activation a, std::size_t n, const T* x, T* y), (n, x, y), unary_fwd)                \
  STOWAGE_ENTRY(unary_bwd_##sfx, (Activation a, std::size_t n, const T* x, const T* dy, T* dx), (n, x, dy, dx),        \
                unary_bwd)                                                                                             \
  STOWAGE_ENTRY(bias_fwd_##sfx, (Activation a, std::size_t rows, std::size_t cols, const T* x, const T* b, T* y),      \
                (rows, cols, x, b, y), bias_fwd)                                                                       \
  STOWAGE_ENTRY(bias_bwd_##sfx,                                                                                        \
                (Activation a, std::size_t rows, std::size_t cols, const T* x, const T* b, const T* dy, T* dx, T* db), \
                (rows, cols, x, b, dy, dx, db), bias_bwd)                                                              \
  STOWAGE_ENTRY(gated_fwd_##sfx,                                                                                       \
                (Activation a, std::size_t rows, std::size_t cols, const T* g, std::size_t gld, const T* u,            \
                 std::size_t uld, T* y),                                                                               \
                (rows, cols, g, gld, u, uld, y), gated_fwd)                                                            \
  STOWAGE_ENTRY(gated_bwd_##sfx,                                                                                       \
                (Activation a, std::size_t rows, std::size_t cols, const T* g, std::size_t gld, const T* u,            \
                 std::size_t uld, const T* dy, T* dg, T* du),                                                          \
                (rows, cols, g, gld, u, uld, dy, dg, du), gated_bwd)

STOWAGE_DEFINE_KERNELS(float, f32)
STOWAGE_DEFINE_KERNELS(bf16, bf16)

}  // namespace

void activation_forward(Activation a, DType dtype, std::size_t n, const void* x, void* y) {
  check_unary("cpu::activation_forward", a, dtype, n, {x, y});
  if (dtype == DType::f32) unary_fwd_f32(a, n, static_cast<const float*>(x), static_cast<float*>(y));
  else unary_fwd_bf16(a, n, static_cast<const bf16*>(x), static_cast<bf16*>(y));
}

void activation_backward(Activation a, DType dtype, std::size_t n, const void* x, const void* dy, void* dx) {
  check_unary("cpu::activation_backward", a, dtype, n, {x, dy, dx});
  if (dtype == DType::f32)
    unary_bwd_f32(a, n, static_cast<const float*>(x), static_cast<const float*>(dy), static_cast<float*>(dx));
  else unary_bwd_bf16(a, n, static_cast<const bf16*>(x), static_cast<const bf16*>(dy), static_cast<bf16*>(dx));
}

void bias_activation_forward(Activation a, DType dtype, std::size_t rows, std::size_t cols, const void* x,
                             const void* bias, void* y) {
  check_bias("cpu::bias_activation_forward", a, dtype, rows, cols, {x, bias, y});
  if (dtype == DType::f32)
    bias_fwd_f32(a, rows, cols, static_cast<const float*>(x), static_cast<const float*>(bias), static_cast<float*>(y));
  else bias_fwd_bf16(a, rows, cols, static_cast<const bf16*>(x), static_cast<const bf16*>(bias), static_cast<bf16*>(y));
}

void bias_activation_backward(Activation a, DType dtype, std::size_t rows, std::size_t cols, const void* x,
                              const void* bias, const void* dy, void* dx, void* dbias) {
  check_bias("cpu::bias_activation_backward", a, dtype, rows, cols, {x, bias, dy, dx});
  if (dtype == DType::f32)
    bias_bwd_f32(a, rows, cols, static_cast<const float*>(x), static_cast<const float*>(bias),
                 static_cast<const float*>(dy), static_cast<float*>(dx), static_cast<float*>(dbias));
  else
    bias_bwd_bf16(a, rows, cols, static_cast<const bf16*>(x), static_cast<const bf16*>(bias),
                  static_cast<const bf16*>(dy), static_cast<bf16*>(dx), static_cast<bf16*>(dbias));
}

void gated_activation_forward(Activation a, DType dtype, std::size_t rows, std::size_t cols, const void* gate,
                              std::size_t gate_ld, const void* up, std::size_t up_ld, void* y) {
  check_gated("cpu::gated_activation_forward", a, dtype, rows, cols, gate_ld, up_ld, {gate, up, y});
  if (dtype == DType::f32)
    gated_fwd_f32(a, rows, cols, static_cast<const float*>(gate), gate_ld, static_cast<const float*>(up), up_ld,
                  static_cast<float*>(y));
  else
    gated_fwd_bf16(a, rows, cols, static_cast<const bf16*>(gate), gate_ld, static_cast<const bf16*>(up), up_ld,
                   static_cast<bf16*>(y));
}

void gated_activation_backward(Activation a, DType dtype, std::size_t rows, std::size_t cols, const void* gate,
                               std::size_t gate_ld, const void* up, std::size_t up_ld, const void* dy, void* dgate,
                               void* dup) {
  check_gated("cpu::gated_activation_backward", a, dtype, rows, cols, gate_ld, up_ld, {gate, up, dy, dgate, dup});
  if (dtype == DType::f32)
    gated_bwd_f32(a, rows, cols, static_cast<const float*>(gate), gate_ld, static_cast<const float*>(up), up_ld,
                  static_cast<const float*>(dy), static_cast<float*>(dgate), static_cast<float*>(dup));
  else
    gated_bwd_bf16(a, rows, cols, static_cast<const bf16*>(gate), gate_ld, static_cast<const bf16*>(up), up_ld,
                   static_cast<const bf16*>(dy), static_cast<bf16*>(dgate), static_cast<bf16*>(dup));
}

}  // namespace stowage::cpu
