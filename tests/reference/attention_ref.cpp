// CPU reference of attention: materializes the S x S probabilities of one (batch, head) at a time.
#include "tests/reference/attention_ref.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "kernels/dropout.cuh"
#include "runtime/error.h"

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

void check_options(const AttentionRefOptions& o, const kernels::AttentionShape& sh) {
  CUTRAIN_CHECK(o.key_mask.empty() || o.key_mask.size() == static_cast<std::size_t>(sh.batch) * sh.seq,
                "ref::attention: key_mask must hold batch*seq = ", static_cast<std::size_t>(sh.batch) * sh.seq,
                " bytes, got ", o.key_mask.size());
  CUTRAIN_CHECK(o.dropout.step_ptr == nullptr, "ref::attention: dropout.step_ptr must be null on the host");
}

// P[i*S + j] for one (b, h), and the log-sum-exp per row (undropped; -inf for a row with no key).
void probabilities(const std::vector<float>& qkv, const kernels::AttentionShape& sh, const AttentionRefOptions& o,
                   int b, int h, std::vector<double>& P, std::vector<double>& lse_row) {
  const Index ix{sh};
  const int S = sh.seq, D = sh.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  P.assign(static_cast<std::size_t>(S) * S, 0.0);
  lse_row.assign(S, 0.0);
  auto live = [&](int i, int j) {
    return (!sh.causal || j <= i) && (o.key_mask.empty() || o.key_mask[static_cast<std::size_t>(b) * S + j] != 0);
  };
  for (int i = 0; i < S; ++i) {
    double mx = -std::numeric_limits<double>::infinity();
    for (int j = 0; j < S; ++j) {
      if (!live(i, j)) continue;
      double acc = 0;
      for (int d = 0; d < D; ++d) acc += static_cast<double>(qkv[ix.qkv(b, i, 0, h, d)]) * qkv[ix.qkv(b, j, 1, h, d)];
      P[static_cast<std::size_t>(i) * S + j] = acc * scale;
      mx = std::max(mx, acc * scale);
    }
    if (mx == -std::numeric_limits<double>::infinity()) {  // no key left: P row 0
      lse_row[i] = mx;
      continue;
    }
    double sum = 0;
    for (int j = 0; j < S; ++j)
      if (live(i, j)) sum += std::exp(P[static_cast<std::size_t>(i) * S + j] - mx);
    for (int j = 0; j < S; ++j) {
      double& p = P[static_cast<std::size_t>(i) * S + j];
      p = live(i, j) ? std::exp(p - mx) / sum : 0.0;
    }
    lse_row[i] = mx + std::log(sum);
  }
}

// P o Z / (1 - p) for one (b, h) (a copy of P when p = 0).
void dropped(const AttentionRefOptions& o, const kernels::AttentionShape& sh, int b, int h,
             const std::vector<double>& P, std::vector<double>& Pd) {
  Pd = P;
  if (o.dropout_p == 0.f) return;
  const double sc = kernels::dropout_scale(o.dropout_p);
  const int S = sh.seq;
  for (int i = 0; i < S; ++i)
    for (int j = 0; j < S; ++j) {
      double& x = Pd[static_cast<std::size_t>(i) * S + j];
      x = attention_dropout_keep(o, sh, b, h, i, j) ? x * sc : 0.0;
    }
}

}  // namespace

bool attention_dropout_keep(const AttentionRefOptions& o, const kernels::AttentionShape& sh, int b, int h, int i,
                            int j) {
  if (o.dropout_p == 0.f) return true;
  const std::uint64_t e =
      ((static_cast<std::uint64_t>(b) * sh.heads + h) * sh.seq + i) * static_cast<std::uint64_t>(sh.seq) + j;
  const kernels::PhiloxWords r = kernels::dropout_bits(o.dropout, e / 4);
  return kernels::dropout_keep(r.w[e % 4], kernels::dropout_threshold(o.dropout_p));
}

void attention_forward(const std::vector<float>& qkv, const kernels::AttentionShape& sh, std::vector<double>& out,
                       std::vector<double>& lse, const AttentionRefOptions& opts) {
  check_options(opts, sh);
  const Index ix{sh};
  const int S = sh.seq, D = sh.head_dim, H = sh.heads;
  out.assign(static_cast<std::size_t>(sh.batch) * S * H * D, 0.0);
  lse.assign(static_cast<std::size_t>(sh.batch) * H * S, 0.0);
  std::vector<double> P, Pd, lrow;
  for (int b = 0; b < sh.batch; ++b)
    for (int h = 0; h < H; ++h) {
      probabilities(qkv, sh, opts, b, h, P, lrow);
      dropped(opts, sh, b, h, P, Pd);
      for (int i = 0; i < S; ++i) {
        lse[(static_cast<std::size_t>(b) * H + h) * S + i] = lrow[i];
        for (int d = 0; d < D; ++d) {
          double acc = 0;
          for (int j = 0; j < S; ++j) acc += Pd[static_cast<std::size_t>(i) * S + j] * qkv[ix.qkv(b, j, 2, h, d)];
          out[ix.o(b, i, h, d)] = acc;
        }
      }
    }
}

void attention_backward(const std::vector<float>& qkv, const std::vector<float>& out, const std::vector<float>& dout,
                        const kernels::AttentionShape& sh, std::vector<double>& dqkv, const AttentionRefOptions& opts) {
  check_options(opts, sh);
  const Index ix{sh};
  const int S = sh.seq, D = sh.head_dim, H = sh.heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  dqkv.assign(static_cast<std::size_t>(sh.batch) * S * 3 * H * D, 0.0);
  const double drop_scale = opts.dropout_p == 0.f ? 1.0 : kernels::dropout_scale(opts.dropout_p);
  std::vector<double> P, Pd, lrow, dS(static_cast<std::size_t>(S) * S);
  for (int b = 0; b < sh.batch; ++b)
    for (int h = 0; h < H; ++h) {
      probabilities(qkv, sh, opts, b, h, P, lrow);
      dropped(opts, sh, b, h, P, Pd);
      // dL/dP = dP_d o Z/(1-p) with dP_d = dout V^T; Dvec = rowsum(P o dL/dP) = rowsum(dout o out).
      for (int i = 0; i < S; ++i) {
        double dvec = 0;
        for (int d = 0; d < D; ++d) dvec += static_cast<double>(dout[ix.o(b, i, h, d)]) * out[ix.o(b, i, h, d)];
        for (int j = 0; j < S; ++j) {
          double dp = 0;
          for (int d = 0; d < D; ++d) dp += static_cast<double>(dout[ix.o(b, i, h, d)]) * qkv[ix.qkv(b, j, 2, h, d)];
          const std::size_t ij = static_cast<std::size_t>(i) * S + j;
          const double dl_dp = Pd[ij] != 0.0 ? drop_scale * dp : 0.0;  // kept where Pd != 0 (P > 0)
          dS[ij] = P[ij] * (dl_dp - dvec);
        }
      }
      for (int i = 0; i < S; ++i)
        for (int j = 0; j < S; ++j) {
          const std::size_t ij = static_cast<std::size_t>(i) * S + j;
          if (P[ij] == 0.0 && dS[ij] == 0.0) continue;  // masked (or underflowed) pair
          for (int d = 0; d < D; ++d) {
            dqkv[ix.qkv(b, i, 0, h, d)] += scale * dS[ij] * qkv[ix.qkv(b, j, 1, h, d)];
            dqkv[ix.qkv(b, j, 1, h, d)] += scale * dS[ij] * qkv[ix.qkv(b, i, 0, h, d)];
            dqkv[ix.qkv(b, j, 2, h, d)] += Pd[ij] * dout[ix.o(b, i, h, d)];
          }
        }
    }
}

}  // namespace cutrain::ref
