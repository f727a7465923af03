// @brief The CPU reference models' shared pieces (internal to model/): linear layers, LayerNorm,
// softmax attention and the two GELUs, all accumulating in double over storage type T.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>


namespace cutrain::model::ref_ops {

constexpr double kLnEps = 1e-5;
constexpr int kIgnore = -100;


// y[M,N] = x[M,K] · W[N,K]ᵀ + b[N]
template <typename T>
void linear_fwd(const T* x, const T* W, const T* b, T* y, int M, int N, int K) {
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double acc = b ? double(b[j]) : 0.0;
      const T* xr = x + std::size_t(i) * K;
      const T* wr = W + std::size_t(j) * K;
      for (int k = 0; k < K; ++k) acc += double(xr[k]) * double(wr[k]);
      y[std::size_t(i) * N + j] = T(acc);
    }
}

// dx[M,K] (+)= dy·W; dW[N,K] += dyᵀ·x; db[N] += Σ dy
template <typename T>
void linear_bwd(const T* x, const T* W, const T* dy, T* dx, bool dx_accumulate, T* dW, T* db, int M, int N, int K) {
  if (dx) {
    std::vector<double> acc(K);
    for (int i = 0; i < M; ++i) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int j = 0; j < N; ++j) {
        const double d = double(dy[std::size_t(i) * N + j]);
        const T* wr = W + std::size_t(j) * K;
        for (int k = 0; k < K; ++k) acc[k] += d * double(wr[k]);
      }
      T* dxr = dx + std::size_t(i) * K;
      for (int k = 0; k < K; ++k) dxr[k] = T((dx_accumulate ? double(dxr[k]) : 0.0) + acc[k]);
    }
  }
  for (int j = 0; j < N; ++j) {
    std::vector<double> acc(K, 0.0);
    double bacc = 0;
    for (int i = 0; i < M; ++i) {
      const double d = double(dy[std::size_t(i) * N + j]);
      bacc += d;
      const T* xr = x + std::size_t(i) * K;
      for (int k = 0; k < K; ++k) acc[k] += d * double(xr[k]);
    }
    T* dwr = dW + std::size_t(j) * K;
    for (int k = 0; k < K; ++k) dwr[k] = T(double(dwr[k]) + acc[k]);
    if (db) db[j] = T(double(db[j]) + bacc);
  }
}

// y = LN(a + b) with gamma/beta; s = a + b stored.
template <typename T>
void add_ln_fwd(const T* a, const T* b, const T* gamma, const T* beta, T* s, T* y, double* mean, double* rstd, int M,
                int C) {
  for (int i = 0; i < M; ++i) {
    const std::size_t r = std::size_t(i) * C;
    double mu = 0;
    for (int c = 0; c < C; ++c) {
      s[r + c] = T(double(a[r + c]) + double(b[r + c]));
      mu += double(s[r + c]);
    }
    mu /= C;
    double var = 0;
    for (int c = 0; c < C; ++c) var += (double(s[r + c]) - mu) * (double(s[r + c]) - mu);
    var /= C;
    const double rs = 1.0 / std::sqrt(var + kLnEps);
    mean[i] = mu;
    rstd[i] = rs;
    for (int c = 0; c < C; ++c) y[r + c] = T((double(s[r + c]) - mu) * rs * double(gamma[c]) + double(beta[c]));
  }
}

// ds = LN backward of dy; dgamma, dbeta accumulated.
template <typename T>
void ln_bwd(const T* dy, const T* s, const double* mean, const double* rstd, const T* gamma, T* ds, T* dgamma,
            T* dbeta, int M, int C) {
  std::vector<double> dg(C, 0.0), dbv(C, 0.0), dxhat(C), xhat(C);
  for (int i = 0; i < M; ++i) {
    const std::size_t r = std::size_t(i) * C;
    double m1 = 0, m2 = 0;
    for (int c = 0; c < C; ++c) {
      xhat[c] = (double(s[r + c]) - mean[i]) * rstd[i];
      dxhat[c] = double(dy[r + c]) * double(gamma[c]);
      dg[c] += double(dy[r + c]) * xhat[c];
      dbv[c] += double(dy[r + c]);
      m1 += dxhat[c];
      m2 += dxhat[c] * xhat[c];
    }
    m1 /= C;
    m2 /= C;
    for (int c = 0; c < C; ++c) ds[r + c] = T(rstd[i] * (dxhat[c] - m1 - xhat[c] * m2));
  }
  for (int c = 0; c < C; ++c) {
    dgamma[c] = T(double(dgamma[c]) + dg[c]);
    dbeta[c] = T(double(dbeta[c]) + dbv[c]);
  }
}

inline double gelu(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
inline double gelu_grad(double x) {
  return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
}


// GPT-2's tanh approximation, 0.5·(1 + tanh u) written as the logistic 1/(1 + e^(-2u)).
inline double gelu_tanh(double x) {
  const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
  return x / (1.0 + std::exp(-2.0 * u));
}
inline double gelu_tanh_grad(double x) {
  const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
  const double sg = 1.0 / (1.0 + std::exp(-2.0 * u));
  return sg + 2.0 * x * sg * (1.0 - sg) * std::sqrt(2.0 / M_PI) * (1.0 + 3.0 * 0.044715 * x * x);
}

// y = LN(x) with gamma/beta (no residual).
template <typename T>
void ln_fwd(const T* x, const T* gamma, const T* beta, T* y, double* mean, double* rstd, int M, int C,
            double eps = kLnEps) {
  for (int i = 0; i < M; ++i) {
    const std::size_t r = std::size_t(i) * C;
    double mu = 0;
    for (int c = 0; c < C; ++c) mu += double(x[r + c]);
    mu /= C;
    double var = 0;
    for (int c = 0; c < C; ++c) var += (double(x[r + c]) - mu) * (double(x[r + c]) - mu);
    var /= C;
    const double rs = 1.0 / std::sqrt(var + eps);
    mean[i] = mu;
    rstd[i] = rs;
    for (int c = 0; c < C; ++c) y[r + c] = T((double(x[r + c]) - mu) * rs * double(gamma[c]) + double(beta[c]));
  }
}

// Softmax attention of qkv [B*S, 3h] (q | k | v, heads of D columns) into att [B*S, h], the
// probabilities [B, H, S, S] kept for backward (before dropout). BERT's options
// (kernels/attention.cuh): `key_mask` [B*S] (null: every key; 0: key j not attended; a row
// without any key gets 0) and `drop` [B, H, S, S] (null: none), the multiplier of each
// probability (dropout_multipliers).
template <typename T>
void attention_fwd(const std::vector<T>& qkv, std::vector<T>& probs, std::vector<T>& att, int B, int S, int H, int D,
                   bool causal, const std::uint8_t* key_mask = nullptr, const double* drop = nullptr) {
  const int h = H * D, M = B * S;
  const double scale = 1.0 / std::sqrt(double(D));
  probs.assign(std::size_t(B) * H * S * S, T(0));
  att.assign(std::size_t(M) * h, T(0));
  std::vector<double> sc(S);
  for (int b = 0; b < B; ++b)
    for (int hh = 0; hh < H; ++hh)
      for (int i = 0; i < S; ++i) {
        const T* q = &qkv[(std::size_t(b) * S + i) * 3 * h + hh * D];
        const int jmax = causal ? i + 1 : S;
        auto allowed = [&](int j) { return !key_mask || key_mask[std::size_t(b) * S + j] != 0; };
        double mx = -INFINITY;
        for (int j = 0; j < jmax; ++j) {
          if (!allowed(j)) continue;
          const T* k = &qkv[(std::size_t(b) * S + j) * 3 * h + h + hh * D];
          double dot = 0;
          for (int e = 0; e < D; ++e) dot += double(q[e]) * double(k[e]);
          sc[j] = dot * scale;
          mx = std::max(mx, sc[j]);
        }
        if (mx == -INFINITY) continue;  // no key to attend: probabilities and output stay 0
        double sum = 0;
        for (int j = 0; j < jmax; ++j) sum += (sc[j] = allowed(j) ? std::exp(sc[j] - mx) : 0.0);
        const std::size_t row = ((std::size_t(b) * H + hh) * S + i) * S;
        T* pr = &probs[row];
        for (int j = 0; j < jmax; ++j) pr[j] = T(sc[j] / sum);
        T* o = &att[(std::size_t(b) * S + i) * h + hh * D];
        for (int e = 0; e < D; ++e) {
          double acc = 0;
          for (int j = 0; j < jmax; ++j)
            acc += (sc[j] / sum) * (drop ? drop[row + j] : 1.0) *
                   double(qkv[(std::size_t(b) * S + j) * 3 * h + 2 * h + hh * D + e]);
          o[e] = T(acc);
        }
      }
}

// dqkv = attention backward of datt (dqkv is overwritten); `drop` as the forward's (masked keys
// have probability 0 and need nothing more).
template <typename T>
void attention_bwd(const std::vector<T>& qkv, const std::vector<T>& probs, const std::vector<T>& datt,
                   std::vector<T>& dqkv, int B, int S, int H, int D, bool causal, const double* drop = nullptr) {
  const int h = H * D;
  const double scale = 1.0 / std::sqrt(double(D));
  std::fill(dqkv.begin(), dqkv.end(), T(0));
  std::vector<double> dp(S), dsc(S);
  for (int b = 0; b < B; ++b)
    for (int hh = 0; hh < H; ++hh)
      for (int i = 0; i < S; ++i) {
        const int jmax = causal ? i + 1 : S;
        const std::size_t row = ((std::size_t(b) * H + hh) * S + i) * S;
        const T* pr = &probs[row];
        const double* mr = drop ? drop + row : nullptr;
        const T* dO = &datt[(std::size_t(b) * S + i) * h + hh * D];
        double rowdot = 0;
        for (int j = 0; j < jmax; ++j) {
          const T* v = &qkv[(std::size_t(b) * S + j) * 3 * h + 2 * h + hh * D];
          double acc = 0;
          for (int e = 0; e < D; ++e) acc += double(dO[e]) * double(v[e]);
          dp[j] = acc * (mr ? mr[j] : 1.0);  // d(dropped P) -> dP
          rowdot += double(pr[j]) * dp[j];
        }
        for (int j = 0; j < jmax; ++j) dsc[j] = double(pr[j]) * (dp[j] - rowdot) * scale;
        const T* q = &qkv[(std::size_t(b) * S + i) * 3 * h + hh * D];
        T* dq = &dqkv[(std::size_t(b) * S + i) * 3 * h + hh * D];
        for (int j = 0; j < jmax; ++j) {
          const std::size_t rj = (std::size_t(b) * S + j) * 3 * h + hh * D;
          const T* k = &qkv[rj + h];
          T* dk = &dqkv[rj + h];
          T* dv = &dqkv[rj + 2 * h];
          for (int e = 0; e < D; ++e) {
            dq[e] = T(double(dq[e]) + dsc[j] * double(k[e]));
            dk[e] = T(double(dk[e]) + dsc[j] * double(q[e]));
            dv[e] = T(double(dv[e]) + double(pr[j]) * (mr ? mr[j] : 1.0) * double(dO[e]));
          }
        }
      }
}

}  // namespace cutrain::model::ref_ops
