// CPU reference of attention: materializes the S x S probabilities of one (batch, head) at a time.
#include "tests/reference/attention_ref.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

namespace cutrain::ref {
namespace {

struct Index {
  const kernels::AttentionShape& s;
  // qkv element (b, token, which of q/k/v, head, d)
  std::size_t qkv(int b, int t, int which, int h, int d) const {
    return ((((static_cast<std::size_t>(b) * s.seq + t) * 3 + which) * s.heads + h) * s.head_dim) + d;
  }
  std::size_t o(int b, int t, int h, int d) const {
    return ((static_cast<std::size_t>(b) * s.seq + t) * s.heads + h) * s.head_dim + d;
  }
};

// P[i*S + j] for one (b, h), and the log-sum-exp per row.
void probabilities(const std::vector<float>& qkv, const kernels::AttentionShape& sh, int b, int h,
                   std::vector<double>& P, std::vector<double>& lse_row) {
  const Index ix{sh};
  const int S = sh.seq, D = sh.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  P.assign(static_cast<std::size_t>(S) * S, 0.0);
  lse_row.assign(S, 0.0);
  for (int i = 0; i < S; ++i) {
    const int last = sh.causal ? i : S - 1;
    double mx = -std::numeric_limits<double>::infinity();
    for (int j = 0; j <= last; ++j) {
      double acc = 0;
      for (int d = 0; d < D; ++d) acc += static_cast<double>(qkv[ix.qkv(b, i, 0, h, d)]) * qkv[ix.qkv(b, j, 1, h, d)];
      P[static_cast<std::size_t>(i) * S + j] = acc * scale;
      mx = std::max(mx, acc * scale);
    }
    double sum = 0;
    for (int j = 0; j <= last; ++j) sum += std::exp(P[static_cast<std::size_t>(i) * S + j] - mx);
    for (int j = 0; j <= last; ++j) {
      double& p = P[static_cast<std::size_t>(i) * S + j];
      p = std::exp(p - mx) / sum;
    }
    lse_row[i] = mx + std::log(sum);
  }
}

}  // namespace

void attention_forward(const std::vector<float>& qkv, const kernels::AttentionShape& sh, std::vector<double>& out,
                       std::vector<double>& lse) {
  const Index ix{sh};
  const int S = sh.seq, D = sh.head_dim, H = sh.heads;
  out.assign(static_cast<std::size_t>(sh.batch) * S * H * D, 0.0);
  lse.assign(static_cast<std::size_t>(sh.batch) * H * S, 0.0);
  std::vector<double> P, lrow;
  for (int b = 0; b < sh.batch; ++b)
    for (int h = 0; h < H; ++h) {
      probabilities(qkv, sh, b, h, P, lrow);
      for (int i = 0; i < S; ++i) {
        lse[(static_cast<std::size_t>(b) * H + h) * S + i] = lrow[i];
        for (int d = 0; d < D; ++d) {
          double acc = 0;
          for (int j = 0; j < S; ++j) acc += P[static_cast<std::size_t>(i) * S + j] * qkv[ix.qkv(b, j, 2, h, d)];
          out[ix.o(b, i, h, d)] = acc;
        }
      }
    }
}

void attention_backward(const std::vector<float>& qkv, const std::vector<float>& out, const std::vector<float>& dout,
                        const kernels::AttentionShape& sh, std::vector<double>& dqkv) {
  const Index ix{sh};
  const int S = sh.seq, D = sh.head_dim, H = sh.heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  dqkv.assign(static_cast<std::size_t>(sh.batch) * S * 3 * H * D, 0.0);
  std::vector<double> P, lrow, dS(static_cast<std::size_t>(S) * S);
  for (int b = 0; b < sh.batch; ++b)
    for (int h = 0; h < H; ++h) {
      probabilities(qkv, sh, b, h, P, lrow);
      for (int i = 0; i < S; ++i) {
        double dvec = 0;
        for (int d = 0; d < D; ++d) dvec += static_cast<double>(dout[ix.o(b, i, h, d)]) * out[ix.o(b, i, h, d)];
        for (int j = 0; j < S; ++j) {
          double dp = 0;
          for (int d = 0; d < D; ++d) dp += static_cast<double>(dout[ix.o(b, i, h, d)]) * qkv[ix.qkv(b, j, 2, h, d)];
          const std::size_t ij = static_cast<std::size_t>(i) * S + j;
          dS[ij] = P[ij] * (dp - dvec);
        }
      }
      for (int i = 0; i < S; ++i)
        for (int j = 0; j < S; ++j) {
          const std::size_t ij = static_cast<std::size_t>(i) * S + j;
          if (P[ij] == 0.0 && dS[ij] == 0.0) continue;  // masked (or underflowed) pair
          for (int d = 0; d < D; ++d) {
            dqkv[ix.qkv(b, i, 0, h, d)] += scale * dS[ij] * qkv[ix.qkv(b, j, 1, h, d)];
            dqkv[ix.qkv(b, j, 1, h, d)] += scale * dS[ij] * qkv[ix.qkv(b, i, 0, h, d)];
            dqkv[ix.qkv(b, j, 2, h, d)] += P[ij] * dout[ix.o(b, i, h, d)];
          }
        }
    }
}

}  // namespace cutrain::ref
