#include "tools/demo/kernels.hpp"

#include <cmath>
#include <cstring>

#include "simd/bf16.hpp"
#include "stowage/activations.hpp"

namespace stowage::demo::kernels {

void linear_forward(const float* x, const bf16* w, float* y, int m, int k, int n) {
  // i-k-j order: the inner loop widens a row of W and vectorises over j.
  for (int i = 0; i < m; ++i) {
    float* yr = y + static_cast<std::size_t>(i) * n;
    std::memset(yr, 0, sizeof(float) * static_cast<std::size_t>(n));
    for (int kk = 0; kk < k; ++kk) {
      const float a = x[static_cast<std::size_t>(i) * k + kk];
      const bf16* wr = w + static_cast<std::size_t>(kk) * n;
      for (int j = 0; j < n; ++j) yr[j] += a * stowage::bf16::to_f32(wr[j]);
    }
  }
}

void transpose_widen(const bf16* w, float* wt, int k, int n) {
  for (int kk = 0; kk < k; ++kk)
    for (int j = 0; j < n; ++j)
      wt[static_cast<std::size_t>(j) * k + kk] = stowage::bf16::to_f32(w[static_cast<std::size_t>(kk) * n + j]);
}

void linear_backward_input(const float* dy, const float* wt, float* dx, int m, int k, int n) {
  for (int i = 0; i < m; ++i) {
    float* dxr = dx + static_cast<std::size_t>(i) * k;
    std::memset(dxr, 0, sizeof(float) * static_cast<std::size_t>(k));
    const float* dyr = dy + static_cast<std::size_t>(i) * n;
    for (int j = 0; j < n; ++j) {
      const float a = dyr[j];
      const float* wr = wt + static_cast<std::size_t>(j) * k;
      for (int kk = 0; kk < k; ++kk) dxr[kk] += a * wr[kk];
    }
  }
}

void linear_backward_weight(const float* x, const float* dy, float* dw, int m, int k, int n) {
  for (int i = 0; i < m; ++i) {
    const float* dyr = dy + static_cast<std::size_t>(i) * n;
    for (int kk = 0; kk < k; ++kk) {
      const float a = x[static_cast<std::size_t>(i) * k + kk];
      float* dwr = dw + static_cast<std::size_t>(kk) * n;
      for (int j = 0; j < n; ++j) dwr[j] += a * dyr[j];
    }
  }
}

void embedding_forward(const std::int32_t* ids, const bf16* table, float* out, int tokens, int h) {
  for (int t = 0; t < tokens; ++t) {
    const bf16* row = table + static_cast<std::size_t>(ids[t]) * h;
    for (int j = 0; j < h; ++j) out[static_cast<std::size_t>(t) * h + j] = stowage::bf16::to_f32(row[j]);
  }
}

void embedding_backward(const std::int32_t* ids, const float* dout, float* dtable, int tokens, int h) {
  for (int t = 0; t < tokens; ++t) {
    float* row = dtable + static_cast<std::size_t>(ids[t]) * h;
    for (int j = 0; j < h; ++j) row[j] += dout[static_cast<std::size_t>(t) * h + j];
  }
}

namespace {
constexpr float kNormEps = 1e-5f;
}

void rmsnorm_forward(const float* x, const bf16* g, float* y, float* inv_rms, int rows, int h) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<std::size_t>(r) * h;
    float ss = 0.0f;
    for (int j = 0; j < h; ++j) ss += xr[j] * xr[j];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(h) + kNormEps);
    inv_rms[r] = inv;
    float* yr = y + static_cast<std::size_t>(r) * h;
    for (int j = 0; j < h; ++j) yr[j] = xr[j] * inv * stowage::bf16::to_f32(g[j]);
  }
}

void rmsnorm_backward(const float* x, const bf16* g, const float* inv_rms, const float* dy, float* dx, float* dg,
                      int rows, int h) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<std::size_t>(r) * h;
    const float* dyr = dy + static_cast<std::size_t>(r) * h;
    float* dxr = dx + static_cast<std::size_t>(r) * h;
    const float inv = inv_rms[r];
    float dot = 0.0f;  // sum_j dy_j g_j x_j
    for (int j = 0; j < h; ++j) {
      const float gj = stowage::bf16::to_f32(g[j]);
      dot += dyr[j] * gj * xr[j];
      dg[j] += dyr[j] * xr[j] * inv;
    }
    const float c = dot * inv * inv * inv / static_cast<float>(h);
    for (int j = 0; j < h; ++j) dxr[j] = dyr[j] * stowage::bf16::to_f32(g[j]) * inv - xr[j] * c;
  }
}

void attention_forward(const float* qkv, float* probs, float* ctx, int b, int s, int h, int heads) {
  const int d = h / heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const std::size_t ld = static_cast<std::size_t>(3) * h;
  for (int bi = 0; bi < b; ++bi) {
    const float* base = qkv + static_cast<std::size_t>(bi) * s * ld;
    for (int hd = 0; hd < heads; ++hd) {
      float* p = probs + (static_cast<std::size_t>(bi) * heads + hd) * s * s;
      for (int i = 0; i < s; ++i) {
        const float* q = base + i * ld + hd * d;
        float* pr = p + static_cast<std::size_t>(i) * s;
        float mx = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          const float* k = base + j * ld + h + hd * d;
          float dot = 0.0f;
          for (int c = 0; c < d; ++c) dot += q[c] * k[c];
          pr[j] = dot * scale;
          mx = std::fmax(mx, pr[j]);
        }
        float sum = 0.0f;
        for (int j = 0; j <= i; ++j) {
          pr[j] = std::exp(pr[j] - mx);
          sum += pr[j];
        }
        const float inv = 1.0f / sum;
        for (int j = 0; j <= i; ++j) pr[j] *= inv;
        for (int j = i + 1; j < s; ++j) pr[j] = 0.0f;
        float* out = ctx + (static_cast<std::size_t>(bi) * s + i) * h + hd * d;
        for (int c = 0; c < d; ++c) out[c] = 0.0f;
        for (int j = 0; j <= i; ++j) {
          const float* v = base + j * ld + 2 * h + hd * d;
          for (int c = 0; c < d; ++c) out[c] += pr[j] * v[c];
        }
      }
    }
  }
}

void attention_backward(const float* qkv, const float* probs, const float* dctx, float* dqkv, float* dp, int b, int s,
                        int h, int heads) {
  const int d = h / heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const std::size_t ld = static_cast<std::size_t>(3) * h;
  std::memset(dqkv, 0, sizeof(float) * static_cast<std::size_t>(b) * s * ld);
  for (int bi = 0; bi < b; ++bi) {
    const float* base = qkv + static_cast<std::size_t>(bi) * s * ld;
    float* dbase = dqkv + static_cast<std::size_t>(bi) * s * ld;
    for (int hd = 0; hd < heads; ++hd) {
      const float* p = probs + (static_cast<std::size_t>(bi) * heads + hd) * s * s;
      for (int i = 0; i < s; ++i) {
        const float* pr = p + static_cast<std::size_t>(i) * s;
        const float* dout = dctx + (static_cast<std::size_t>(bi) * s + i) * h + hd * d;
        float rowdot = 0.0f;  // sum_j p_ij dp_ij
        for (int j = 0; j <= i; ++j) {
          const float* v = base + j * ld + 2 * h + hd * d;
          float* dv = dbase + j * ld + 2 * h + hd * d;
          float acc = 0.0f;
          for (int c = 0; c < d; ++c) {
            acc += dout[c] * v[c];
            dv[c] += pr[j] * dout[c];
          }
          dp[j] = acc;
          rowdot += pr[j] * acc;
        }
        const float* q = base + i * ld + hd * d;
        float* dq = dbase + i * ld + hd * d;
        for (int j = 0; j <= i; ++j) {
          const float ds = pr[j] * (dp[j] - rowdot) * scale;
          const float* k = base + j * ld + h + hd * d;
          float* dk = dbase + j * ld + h + hd * d;
          for (int c = 0; c < d; ++c) {
            dq[c] += ds * k[c];
            dk[c] += ds * q[c];
          }
        }
      }
    }
  }
}

// GeLU comes from the recompute layer's kernels: deterministic, so the forward output and a
// rematerialised one are the same bits.
void gelu_forward(const float* x, float* y, std::int64_t n) {
  cpu::activation_forward(Activation::gelu_tanh, DType::f32, static_cast<std::size_t>(n), x, y);
}

void gelu_backward(const float* x, const float* dy, float* dx, std::int64_t n) {
  cpu::activation_backward(Activation::gelu_tanh, DType::f32, static_cast<std::size_t>(n), x, dy, dx);
}

void add_inplace(float* a, const float* b, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) a[i] += b[i];
}

void add(const float* a, const float* b, float* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

float cross_entropy(const float* logits, const std::int32_t* targets, float* dlogits, int tokens, int vocab) {
  double total = 0.0;  // summed in a fixed order: deterministic
  const float inv_t = 1.0f / static_cast<float>(tokens);
  for (int t = 0; t < tokens; ++t) {
    const float* lr = logits + static_cast<std::size_t>(t) * vocab;
    float* dr = dlogits + static_cast<std::size_t>(t) * vocab;
    float mx = -INFINITY;
    for (int v = 0; v < vocab; ++v) mx = std::fmax(mx, lr[v]);
    float sum = 0.0f;
    for (int v = 0; v < vocab; ++v) {
      dr[v] = std::exp(lr[v] - mx);
      sum += dr[v];
    }
    total += static_cast<double>(std::log(sum) + mx - lr[targets[t]]);
    const float inv = 1.0f / sum;
    for (int v = 0; v < vocab; ++v) dr[v] = dr[v] * inv * inv_t;
    dr[targets[t]] -= inv_t;
  }
  return static_cast<float>(total / tokens);
}

}  // namespace stowage::demo::kernels
