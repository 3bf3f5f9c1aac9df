#pragma once
// The demo transformer's CPU kernels, forward and backward. Plain loops in a fixed order, so a
// given input always gives bit-identical output (no threads, no reassociation). Activations
// and gradients are fp32; weights are read as bf16 and widened exactly to fp32.
#include <cstdint>

namespace stowage::demo::kernels {

using bf16 = std::uint16_t;

// y[M,N] = x[M,K] · W[K,N]
void linear_forward(const float* x, const bf16* w, float* y, int m, int k, int n);
// Widens W[K,N] into wt[N,K] (fp32, transposed) for linear_backward_input.
void transpose_widen(const bf16* w, float* wt, int k, int n);
// dx[M,K] = dy[M,N] · W^T, with wt from transpose_widen.
void linear_backward_input(const float* dy, const float* wt, float* dx, int m, int k, int n);
// dW[K,N] += x^T · dy
void linear_backward_weight(const float* x, const float* dy, float* dw, int m, int k, int n);

// out[t,:] = E[ids[t],:]
void embedding_forward(const std::int32_t* ids, const bf16* table, float* out, int tokens, int h);
void embedding_backward(const std::int32_t* ids, const float* dout, float* dtable, int tokens, int h);

// y = x / rms(x) * g, one row of h per token; inv_rms saved for backward.
void rmsnorm_forward(const float* x, const bf16* g, float* y, float* inv_rms, int rows, int h);
// dx = (dy through the norm); dx is written (not accumulated); dg accumulated.
void rmsnorm_backward(const float* x, const bf16* g, const float* inv_rms, const float* dy, float* dx, float* dg,
                      int rows, int h);

// Causal self-attention over qkv[B*S, 3H] (q | k | v, heads of H/heads each):
// probs[B, heads, S, S] (softmax, zero above the diagonal) and ctx[B*S, H].
void attention_forward(const float* qkv, float* probs, float* ctx, int b, int s, int h, int heads);
// dqkv[B*S, 3H] from dctx (written, not accumulated); dp is a workspace of S floats.
void attention_backward(const float* qkv, const float* probs, const float* dctx, float* dqkv, float* dp, int b, int s,
                        int h, int heads);

// GeLU, tanh approximation, elementwise (stowage/activations.hpp; dx may be dy).
void gelu_forward(const float* x, float* y, std::int64_t n);
void gelu_backward(const float* x, const float* dy, float* dx, std::int64_t n);

// a += b
void add_inplace(float* a, const float* b, std::int64_t n);
// out = a + b
void add(const float* a, const float* b, float* out, std::int64_t n);

// Mean cross-entropy of logits[T,V] against targets; writes dlogits = d(loss)/d(logits).
float cross_entropy(const float* logits, const std::int32_t* targets, float* dlogits, int tokens, int vocab);

}  // namespace stowage::demo::kernels
