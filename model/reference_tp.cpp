// Tensor parallelism in the CPU reference model (Megatron's layout) for both architectures:
// column-parallel QKV (this rank's heads) and FC1 (its FFN columns), row-parallel out-projection
// and FC2 whose fp64 partial sums are all-reduced before the bias, a vocabulary-parallel
// embedding (rows of this rank's vocabulary slice, the partial lookups all-reduced) and head with
// a vocabulary-parallel cross-entropy that never gathers the logits (an all-reduce of each row's
// max, then one of its sum-exp and target logit). In backward the column-parallel layers' input
// gradients are the all-reduced ones. Domino: every sub-layer runs piece by piece (groups of whole
// sequences), each piece's all-reduce issued right after its compute, and a piece's next sub-layer
// starts with the finish (bias, residual, LayerNorm) of its own reduced result; so every
// reduction comes in the order (sub-layer, piece), which parallel/domino_timeline.h relies on.
#include <algorithm>
#include <cmath>
#include <functional>

#include "model/reference_model.h"
#include "model/reference_ops.h"
#include "runtime/error.h"

namespace cutrain::model {

using namespace ref_ops;

namespace {

// y[M,N] (fp64, no bias) = x[M,K]·W[N,K]ᵀ with W's rows `ldw` apart: a row-parallel layer's part.
template <typename T>
void part_fwd(const T* x, const T* W, std::size_t ldw, double* y, int M, int N, int K) {
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double acc = 0;
      const T* xr = x + std::size_t(i) * K;
      const T* wr = W + std::size_t(j) * ldw;
      for (int k = 0; k < K; ++k) acc += double(xr[k]) * double(wr[k]);
      y[std::size_t(i) * N + j] = acc;
    }
}

// dx[M,K] (fp64) += dy[M,N]·W (rows `ldw` apart): a column-parallel layer's part of its input gradient.
template <typename T>
void part_dx(const T* dy, const T* W, std::size_t ldw, double* dx, int M, int N, int K) {
  for (int i = 0; i < M; ++i) {
    double* dxr = dx + std::size_t(i) * K;
    for (int j = 0; j < N; ++j) {
      const double d = double(dy[std::size_t(i) * N + j]);
      const T* wr = W + std::size_t(j) * ldw;
      for (int k = 0; k < K; ++k) dxr[k] += d * double(wr[k]);
    }
  }
}

// dW[N,K] (rows `lddw` apart) += dyᵀ·x; db[N] += Σ dy (db may be null): a row-parallel weight's columns.
template <typename T>
void part_dw(const T* x, const T* dy, T* dW, std::size_t lddw, T* db, int M, int N, int K) {
  std::vector<double> acc(static_cast<std::size_t>(K));
  for (int j = 0; j < N; ++j) {
    std::fill(acc.begin(), acc.end(), 0.0);
    double bacc = 0;
    for (int i = 0; i < M; ++i) {
      const double d = double(dy[std::size_t(i) * N + j]);
      bacc += d;
      const T* xr = x + std::size_t(i) * K;
      for (int k = 0; k < K; ++k) acc[std::size_t(k)] += d * double(xr[k]);
    }
    T* dwr = dW + std::size_t(j) * lddw;
    for (int k = 0; k < K; ++k) dwr[k] = T(double(dwr[k]) + acc[std::size_t(k)]);
    if (db) db[j] = T(double(db[j]) + bacc);
  }
}

// Runs one sub-layer over the pieces: for each piece, the finish of the previous sub-layer's
// reduced result, this sub-layer's compute into its partial, the partial's all-reduce.
struct PieceLoop {
  TpReducer& r;
  int pieces;
  std::vector<std::vector<double>> part;
  std::function<void(int)> finish;  // of the previous sub-layer, on its piece's reduced part
  void run(const std::function<void(int, std::vector<double>&)>& compute, std::function<void(int)> next_finish) {
    part.resize(std::size_t(pieces));
    std::vector<std::vector<double>> mine(static_cast<std::size_t>(pieces));
    for (int i = 0; i < pieces; ++i) {
      if (finish) finish(i);
      compute(i, mine[std::size_t(i)]);
      r.sum(mine[std::size_t(i)].data(), mine[std::size_t(i)].size());
    }
    part = std::move(mine);
    finish = std::move(next_finish);
  }
  void flush() {
    if (finish)
      for (int i = 0; i < pieces; ++i) finish(i);
    finish = nullptr;
  }
};

// Piece i's rows [i·rows, (i+1)·rows) of a [M, C] buffer.
template <typename T>
std::vector<T> rows_of(const std::vector<T>& v, int i, int rows, int C) {
  const auto a = v.begin() + std::ptrdiff_t(i) * rows * C;
  return std::vector<T>(a, a + std::ptrdiff_t(rows) * C);
}

// The pieces' row blocks, in order, into one [M, C] buffer.
template <typename T>
void join_pieces(const std::vector<std::vector<T>>& pieces, std::vector<T>& out) {
  out.clear();
  for (const std::vector<T>& v : pieces) out.insert(out.end(), v.begin(), v.end());
}

}  // namespace

template <typename T>
void ReferenceModel<T>::set_tensor_parallel(const TpSlice& s) {
  const ModelDims& d = p_.dims();
  CUTRAIN_CHECK(s.size >= 1 && s.rank >= 0 && s.rank < s.size && s.pieces >= 1,
                "reference model: tensor-parallel rank ", s.rank, " of ", s.size, " with ", s.pieces, " pieces");
  CUTRAIN_CHECK(s.size == 1 || s.reducer, "reference model: a tensor-parallel slice without its group's reducer");
  CUTRAIN_CHECK(s.size == 1 || !d.moe.any(), "reference model: tensor parallelism of MoE blocks is not built");
  CUTRAIN_CHECK(0 <= s.head_begin && s.head_begin < s.head_end && s.head_end <= d.heads && 0 <= s.ffn_begin &&
                    s.ffn_begin < s.ffn_end && s.ffn_end <= d.ffn() && 0 <= s.vocab_begin &&
                    s.vocab_begin < s.vocab_end && s.vocab_end <= d.vocab_rows(),
                "reference model: tensor-parallel slice outside the model (heads [", s.head_begin, ", ", s.head_end,
                ") of ", d.heads, ", FFN [", s.ffn_begin, ", ", s.ffn_end, ") of ", d.ffn(), ", vocabulary [",
                s.vocab_begin, ", ", s.vocab_end, ") of ", d.vocab_rows(), ")");
  tp_ = s;
}

template <typename T>
double ReferenceModel<T>::forward_tp(const T* P, const std::int32_t* tokens, const std::int32_t* labels,
                                     const T* x_in, int B, int S, std::vector<T>* x_out) {
  const ModelDims& d = p_.dims();
  const bool gpt2 = d.arch == Arch::Gpt2;
  const int h = d.hidden, D = d.head_dim(), V = d.vocab;
  const int p = tp_.pieces;
  CUTRAIN_CHECK(B % p == 0, "reference model: Domino's ", p, " pieces do not divide the micro-batch of ", B,
                " sequences");
  const int nb = B / p, Mp = nb * S, M = B * S;
  const int Hl = tp_.head_end - tp_.head_begin, hl = Hl * D, q0 = tp_.head_begin * D;
  const int f0 = tp_.ffn_begin, Fl = tp_.ffn_end - tp_.ffn_begin, F = d.ffn();
  const int v0 = tp_.vocab_begin, Vl = tp_.vocab_end - tp_.vocab_begin;
  const bool causal = gpt2 || causal_;
  auto at = [&](int idx) { return P + p_.tensor(idx).offset; };
  B_ = B;
  S_ = S;
  if (span_.head) labels_.assign(labels, labels + M);
  PieceLoop loop{*tp_.reducer, p, {}, nullptr};
  std::vector<std::vector<T>> xs(static_cast<std::size_t>(p));  // each piece's residual stream [Mp, h]
  const T* emb = at(p_.embedding());
  const T* pos = at(p_.pos_embedding());
  if (span_.embedding) {
    tokens_.assign(tokens, tokens + M);
    for (int m = 0; m < M; ++m)
      CUTRAIN_CHECK(tokens[m] >= 0 && tokens[m] < V, "reference model: token ", tokens[m], " at position ", m,
                    " is outside [0, ", V, ")");
    // The vocabulary-parallel lookup: this rank's rows, zeros for the others' tokens.
    loop.run(
        [&](int i, std::vector<double>& y) {
          y.assign(std::size_t(Mp) * h, 0.0);
          for (int r = 0; r < Mp; ++r) {
            const int tok = tokens[i * Mp + r];
            if (tok < v0 || tok >= v0 + Vl) continue;
            for (int c = 0; c < h; ++c) y[std::size_t(r) * h + c] = double(emb[std::size_t(tok) * h + c]);
          }
        },
        [&](int i) {
          const std::vector<double>& y = loop.part[std::size_t(i)];
          xs[std::size_t(i)].resize(std::size_t(Mp) * h);
          for (int r = 0; r < Mp; ++r)
            for (int c = 0; c < h; ++c)
              xs[std::size_t(i)][std::size_t(r) * h + c] =
                  T(y[std::size_t(r) * h + c] + double(pos[std::size_t((i * Mp + r) % S) * h + c]));
        });
  } else {
    for (int i = 0; i < p; ++i) {
      const std::size_t n = std::size_t(Mp) * h;
      xs[std::size_t(i)].assign(x_in + std::size_t(i) * n, x_in + std::size_t(i + 1) * n);
    }
  }

  tp_acts_.assign(std::size_t(d.layers) * p, {});
  auto act = [&](int l, int i) -> LayerActs& { return tp_acts_[std::size_t(l) * p + i]; };
  for (int l = span_.first; l < span_.end; ++l) {
    // Attention: this rank's heads (QKV rows q | k | v of them), the out-projection's columns.
    loop.run(
        [&, l](int i, std::vector<double>& y) {
          const LayerIndex& L = p_.layer(l);
          LayerActs& a = act(l, i);
          a.x_in = xs[std::size_t(i)];
          const T* ain = a.x_in.data();
          if (gpt2) {
            a.x1.resize(std::size_t(Mp) * h);
            a.mean1.resize(Mp);
            a.rstd1.resize(Mp);
            ln_fwd(a.x_in.data(), at(L.norm1_w), at(L.norm1_b), a.x1.data(), a.mean1.data(), a.rstd1.data(), Mp, h);
            ain = a.x1.data();
          }
          a.qkv.resize(std::size_t(Mp) * 3 * hl);
          std::vector<T> blk(std::size_t(Mp) * hl);
          for (int part = 0; part < 3; ++part) {
            const std::size_t row = std::size_t(part) * h + q0;
            linear_fwd(ain, at(L.in_proj_w) + row * h, at(L.in_proj_b) + row, blk.data(), Mp, hl, h);
            for (int r = 0; r < Mp; ++r)
              std::copy(blk.begin() + std::ptrdiff_t(r) * hl, blk.begin() + std::ptrdiff_t(r + 1) * hl,
                        a.qkv.begin() + std::ptrdiff_t(r) * 3 * hl + part * hl);
          }
          attention_fwd(a.qkv, a.probs, a.att, nb, S, Hl, D, causal);
          y.resize(std::size_t(Mp) * h);
          part_fwd(a.att.data(), at(L.out_proj_w) + q0, std::size_t(h), y.data(), Mp, h, hl);
        },
        [&, l](int i) {
          const LayerIndex& L = p_.layer(l);
          LayerActs& a = act(l, i);
          const std::vector<double>& y = loop.part[std::size_t(i)];
          const T* bo = at(L.out_proj_b);
          std::vector<T> o(std::size_t(Mp) * h);
          for (int r = 0; r < Mp; ++r)
            for (int c = 0; c < h; ++c) o[std::size_t(r) * h + c] = T(double(bo[c]) + y[std::size_t(r) * h + c]);
          a.s1.resize(std::size_t(Mp) * h);
          if (gpt2) {
            for (std::size_t k = 0; k < a.s1.size(); ++k) a.s1[k] = T(double(a.x_in[k]) + double(o[k]));
            a.s2.resize(std::size_t(Mp) * h);
            a.mean2.resize(Mp);
            a.rstd2.resize(Mp);
            ln_fwd(a.s1.data(), at(L.norm2_w), at(L.norm2_b), a.s2.data(), a.mean2.data(), a.rstd2.data(), Mp, h);
          } else {
            a.x1.resize(std::size_t(Mp) * h);
            a.mean1.resize(Mp);
            a.rstd1.resize(Mp);
            add_ln_fwd(a.x_in.data(), o.data(), at(L.norm1_w), at(L.norm1_b), a.s1.data(), a.x1.data(),
                       a.mean1.data(), a.rstd1.data(), Mp, h);
          }
        });
    // MLP: FC1's columns [f0, f0 + Fl), FC2's matching columns.
    loop.run(
        [&, l](int i, std::vector<double>& y) {
          const LayerIndex& L = p_.layer(l);
          LayerActs& a = act(l, i);
          const T* min = gpt2 ? a.s2.data() : a.x1.data();
          a.f.resize(std::size_t(Mp) * Fl);
          a.g.resize(std::size_t(Mp) * Fl);
          linear_fwd(min, at(L.ff0_w) + std::size_t(f0) * h, at(L.ff0_b) + f0, a.f.data(), Mp, Fl, h);
          for (std::size_t k = 0; k < a.f.size(); ++k)
            a.g[k] = T(gpt2 ? gelu_tanh(double(a.f[k])) : gelu(double(a.f[k])));
          y.resize(std::size_t(Mp) * h);
          part_fwd(a.g.data(), at(L.ff2_w) + f0, std::size_t(F), y.data(), Mp, h, Fl);
        },
        [&, l](int i) {
          const LayerIndex& L = p_.layer(l);
          LayerActs& a = act(l, i);
          const std::vector<double>& y = loop.part[std::size_t(i)];
          const T* b2 = at(L.ff2_b);
          std::vector<T> o(std::size_t(Mp) * h);
          for (int r = 0; r < Mp; ++r)
            for (int c = 0; c < h; ++c) o[std::size_t(r) * h + c] = T(double(b2[c]) + y[std::size_t(r) * h + c]);
          std::vector<T>& x = xs[std::size_t(i)];
          if (gpt2) {
            for (std::size_t k = 0; k < x.size(); ++k) x[k] = T(double(a.s1[k]) + double(o[k]));
          } else {
            a.s2.resize(std::size_t(Mp) * h);
            a.mean2.resize(Mp);
            a.rstd2.resize(Mp);
            add_ln_fwd(a.x1.data(), o.data(), at(L.norm2_w), at(L.norm2_b), a.s2.data(), x.data(), a.mean2.data(),
                       a.rstd2.data(), Mp, h);
          }
        });
  }
  loop.flush();
  if (!span_.head) {
    join_pieces(xs, *x_out);
    return 0.0;
  }
  // The head on this rank's vocabulary rows; the logits stay here.
  join_pieces(xs, x_final_);
  const T* xh = x_final_.data();
  if (gpt2) {
    x_lnf_.resize(x_final_.size());
    mean_f_.resize(M);
    rstd_f_.resize(M);
    ln_fwd(x_final_.data(), at(p_.final_norm_w()), at(p_.final_norm_b()), x_lnf_.data(), mean_f_.data(),
           rstd_f_.data(), M, h);
    xh = x_lnf_.data();
  }
  logits_.resize(std::size_t(M) * Vl);
  const T* bout = p_.output_b() >= 0 ? at(p_.output_b()) + v0 : nullptr;
  linear_fwd(xh, at(p_.output_w()) + std::size_t(v0) * h, bout, logits_.data(), M, Vl, h);
  // Real vocabulary columns of this slice: [0, vreal).
  const int vreal = std::max(0, std::min(V, v0 + Vl) - v0);
  row_max_.assign(std::size_t(M), -INFINITY);
  row_sum_.assign(std::size_t(M), 0.0);
  // The cross-entropy's reductions, piece by piece: each row's max over the vocabulary, then its
  // sum-exp and target logit in one buffer.
  std::vector<std::vector<double>> mx(static_cast<std::size_t>(p)), st(static_cast<std::size_t>(p));
  for (int i = 0; i < p; ++i) {
    std::vector<double>& v = mx[std::size_t(i)];
    v.assign(std::size_t(Mp), -INFINITY);
    for (int r = 0; r < Mp; ++r) {
      const T* lr = &logits_[std::size_t(i * Mp + r) * Vl];
      for (int c = 0; c < vreal; ++c) v[std::size_t(r)] = std::max(v[std::size_t(r)], double(lr[c]));
    }
    tp_.reducer->max(v.data(), v.size());
  }
  for (int i = 0; i < p; ++i) {
    std::vector<double>& v = st[std::size_t(i)];
    v.assign(std::size_t(2) * Mp, 0.0);
    for (int r = 0; r < Mp; ++r) {
      const int m = i * Mp + r, y = labels_[std::size_t(m)];
      const T* lr = &logits_[std::size_t(m) * Vl];
      const double top = mx[std::size_t(i)][std::size_t(r)];
      for (int c = 0; c < vreal; ++c) v[std::size_t(2 * r)] += std::exp(double(lr[c]) - top);
      if (y >= v0 && y < v0 + vreal) v[std::size_t(2 * r + 1)] = double(lr[y - v0]);
    }
    tp_.reducer->sum(v.data(), v.size());
  }
  double loss = 0;
  n_valid_ = 0;
  for (int i = 0; i < p; ++i)
    for (int r = 0; r < Mp; ++r) {
      const int m = i * Mp + r, y = labels_[std::size_t(m)];
      row_max_[std::size_t(m)] = mx[std::size_t(i)][std::size_t(r)];
      row_sum_[std::size_t(m)] = st[std::size_t(i)][std::size_t(2 * r)];
      if (y == kIgnore) continue;
      CUTRAIN_CHECK(y >= 0 && y < V, "reference model: label ", y, " at position ", m, " is outside [0, ", V, ")");
      const double target = st[std::size_t(i)][std::size_t(2 * r + 1)];
      loss += std::log(row_sum_[std::size_t(m)]) + row_max_[std::size_t(m)] - target;
      ++n_valid_;
    }
  return n_valid_ ? loss / double(n_valid_) : 0.0;
}

template <typename T>
void ReferenceModel<T>::backward_tp(const T* P, T* G, const T* dx_out, double grad_scale, std::vector<T>* dx_in) {
  const ModelDims& d = p_.dims();
  const bool gpt2 = d.arch == Arch::Gpt2;
  const int B = B_, S = S_, h = d.hidden, D = d.head_dim(), V = d.vocab, M = B * S;
  const int p = tp_.pieces, nb = B / p, Mp = nb * S;
  const int Hl = tp_.head_end - tp_.head_begin, hl = Hl * D, q0 = tp_.head_begin * D;
  const int f0 = tp_.ffn_begin, Fl = tp_.ffn_end - tp_.ffn_begin, F = d.ffn();
  const int v0 = tp_.vocab_begin, Vl = tp_.vocab_end - tp_.vocab_begin;
  const bool causal = gpt2 || causal_;
  auto at = [&](int idx) { return P + p_.tensor(idx).offset; };
  auto gat = [&](int idx) { return G + p_.tensor(idx).offset; };
  PieceLoop loop{*tp_.reducer, p, {}, nullptr};
  std::vector<std::vector<T>> dxs(static_cast<std::size_t>(p));  // each piece's gradient of the residual stream
  if (span_.head) {
    const int vreal = std::max(0, std::min(V, v0 + Vl) - v0);
    // dlogits of this rank's columns from the rows' shared max and sum-exp (no communication);
    // the head's input gradient is a vocabulary-parallel partial, all-reduced.
    loop.run(
        [&](int i, std::vector<double>& y) {
          std::vector<T> dl(std::size_t(Mp) * Vl, T(0));
          const double k = n_valid_ ? grad_scale / double(n_valid_) : 0.0;
          for (int r = 0; r < Mp; ++r) {
            const int m = i * Mp + r, lab = labels_[std::size_t(m)];
            if (lab == kIgnore) continue;
            const T* lr = &logits_[std::size_t(m) * Vl];
            const double top = row_max_[std::size_t(m)], sum = row_sum_[std::size_t(m)];
            for (int c = 0; c < vreal; ++c)
              dl[std::size_t(r) * Vl + c] = T((std::exp(double(lr[c]) - top) / sum - (c + v0 == lab ? 1.0 : 0.0)) * k);
          }
          const T* xh = (gpt2 ? x_lnf_.data() : x_final_.data()) + std::size_t(i) * Mp * h;
          T* gb = p_.output_b() >= 0 ? gat(p_.output_b()) + v0 : nullptr;
          linear_bwd(xh, at(p_.output_w()) + std::size_t(v0) * h, dl.data(), static_cast<T*>(nullptr), false,
                     gat(p_.output_w()) + std::size_t(v0) * h, gb, Mp, Vl, h);
          y.assign(std::size_t(Mp) * h, 0.0);
          part_dx(dl.data(), at(p_.output_w()) + std::size_t(v0) * h, std::size_t(h), y.data(), Mp, Vl, h);
        },
        [&](int i) {
          const std::vector<double>& y = loop.part[std::size_t(i)];
          std::vector<T> dn(y.size());
          for (std::size_t k = 0; k < y.size(); ++k) dn[k] = T(y[k]);
          dxs[std::size_t(i)].resize(dn.size());
          if (gpt2) {
            ln_bwd(dn.data(), x_final_.data() + std::size_t(i) * Mp * h, mean_f_.data() + std::size_t(i) * Mp,
                   rstd_f_.data() + std::size_t(i) * Mp, at(p_.final_norm_w()), dxs[std::size_t(i)].data(),
                   gat(p_.final_norm_w()), gat(p_.final_norm_b()), Mp, h);
          } else {
            dxs[std::size_t(i)] = std::move(dn);
          }
        });
  } else {
    for (int i = 0; i < p; ++i)
      dxs[std::size_t(i)].assign(dx_out + std::size_t(i) * Mp * h, dx_out + std::size_t(i + 1) * Mp * h);
  }

  // Per piece: Simple keeps d(x1) between the MLP's and the attention's sub-layers, GPT-2 d(s1).
  std::vector<std::vector<T>> ds(static_cast<std::size_t>(p));
  auto act = [&](int l, int i) -> const LayerActs& { return tp_acts_[std::size_t(l) * p + i]; };
  for (int l = span_.end - 1; l >= span_.first; --l) {
    // MLP: FC2 row-parallel (its input gradient local), FC1 column-parallel (all-reduced).
    loop.run(
        [&, l](int i, std::vector<double>& y) {
          const LayerIndex& L = p_.layer(l);
          const LayerActs& a = act(l, i);
          std::vector<T>& dx = dxs[std::size_t(i)];
          std::vector<T> dy(std::size_t(Mp) * h);  // the gradient of the MLP's output
          if (gpt2) {
            dy = dx;
          } else {
            ds[std::size_t(i)].resize(std::size_t(Mp) * h);
            ln_bwd(dx.data(), a.s2.data(), a.mean2.data(), a.rstd2.data(), at(L.norm2_w), ds[std::size_t(i)].data(),
                   gat(L.norm2_w), gat(L.norm2_b), Mp, h);
            dy = ds[std::size_t(i)];
          }
          std::vector<T> dg(std::size_t(Mp) * Fl);
          std::vector<double> dgd(std::size_t(Mp) * Fl, 0.0);
          part_dx(dy.data(), at(L.ff2_w) + f0, std::size_t(F), dgd.data(), Mp, h, Fl);
          part_dw(a.g.data(), dy.data(), gat(L.ff2_w) + f0, std::size_t(F), gat(L.ff2_b), Mp, h, Fl);
          for (std::size_t k = 0; k < dg.size(); ++k)
            dg[k] = T(double(T(dgd[k])) * (gpt2 ? gelu_tanh_grad(double(a.f[k])) : gelu_grad(double(a.f[k]))));
          const T* min = gpt2 ? a.s2.data() : a.x1.data();
          linear_bwd(min, at(L.ff0_w) + std::size_t(f0) * h, dg.data(), static_cast<T*>(nullptr), false,
                     gat(L.ff0_w) + std::size_t(f0) * h, gat(L.ff0_b) + f0, Mp, Fl, h);
          y.assign(std::size_t(Mp) * h, 0.0);
          part_dx(dg.data(), at(L.ff0_w) + std::size_t(f0) * h, std::size_t(h), y.data(), Mp, Fl, h);
        },
        [&, l](int i) {
          const LayerIndex& L = p_.layer(l);
          const LayerActs& a = act(l, i);
          const std::vector<double>& y = loop.part[std::size_t(i)];
          if (gpt2) {  // d s2 -> through LN2 into d s1 (= dx + that)
            std::vector<T> dln(y.size()), tmp(y.size());
            for (std::size_t k = 0; k < y.size(); ++k) dln[k] = T(y[k]);
            ln_bwd(dln.data(), a.s1.data(), a.mean2.data(), a.rstd2.data(), at(L.norm2_w), tmp.data(), gat(L.norm2_w),
                   gat(L.norm2_b), Mp, h);
            std::vector<T>& dx = dxs[std::size_t(i)];
            for (std::size_t k = 0; k < dx.size(); ++k) dx[k] = T(double(dx[k]) + double(tmp[k]));
          } else {  // d x1 = the residual's share + FC1's input gradient
            std::vector<T>& v = ds[std::size_t(i)];
            for (std::size_t k = 0; k < v.size(); ++k) v[k] = T(double(v[k]) + y[k]);
          }
        });
    // Attention: the out-projection row-parallel (local), QKV column-parallel (all-reduced).
    loop.run(
        [&, l](int i, std::vector<double>& y) {
          const LayerIndex& L = p_.layer(l);
          const LayerActs& a = act(l, i);
          std::vector<T>& dx = dxs[std::size_t(i)];
          if (!gpt2)  // x1 = LN1(x_in + attn): dx becomes d s1
            ln_bwd(ds[std::size_t(i)].data(), a.s1.data(), a.mean1.data(), a.rstd1.data(), at(L.norm1_w), dx.data(),
                   gat(L.norm1_w), gat(L.norm1_b), Mp, h);
          std::vector<T> datt(std::size_t(Mp) * hl), dqkv(std::size_t(Mp) * 3 * hl);
          std::vector<double> dad(std::size_t(Mp) * hl, 0.0);
          part_dx(dx.data(), at(L.out_proj_w) + q0, std::size_t(h), dad.data(), Mp, h, hl);
          for (std::size_t k = 0; k < datt.size(); ++k) datt[k] = T(dad[k]);
          part_dw(a.att.data(), dx.data(), gat(L.out_proj_w) + q0, std::size_t(h), gat(L.out_proj_b), Mp, h, hl);
          attention_bwd(a.qkv, a.probs, datt, dqkv, nb, S, Hl, D, causal);
          const T* ain = gpt2 ? a.x1.data() : a.x_in.data();
          y.assign(std::size_t(Mp) * h, 0.0);
          std::vector<T> blk(std::size_t(Mp) * hl);
          for (int part = 0; part < 3; ++part) {
            const std::size_t row = std::size_t(part) * h + q0;
            for (int r = 0; r < Mp; ++r) {
              const auto from = dqkv.begin() + std::ptrdiff_t(r) * 3 * hl + part * hl;
              std::copy(from, from + hl, blk.begin() + std::ptrdiff_t(r) * hl);
            }
            linear_bwd(ain, at(L.in_proj_w) + row * h, blk.data(), static_cast<T*>(nullptr), false,
                       gat(L.in_proj_w) + row * h, gat(L.in_proj_b) + row, Mp, hl, h);
            part_dx(blk.data(), at(L.in_proj_w) + row * h, std::size_t(h), y.data(), Mp, hl, h);
          }
        },
        [&, l](int i) {
          const LayerIndex& L = p_.layer(l);
          const LayerActs& a = act(l, i);
          const std::vector<double>& y = loop.part[std::size_t(i)];
          std::vector<T>& dx = dxs[std::size_t(i)];
          if (gpt2) {  // x1 = LN1(x_in): through LN1 into d x_in
            std::vector<T> dln(y.size()), tmp(y.size());
            for (std::size_t k = 0; k < y.size(); ++k) dln[k] = T(y[k]);
            ln_bwd(dln.data(), a.x_in.data(), a.mean1.data(), a.rstd1.data(), at(L.norm1_w), tmp.data(),
                   gat(L.norm1_w), gat(L.norm1_b), Mp, h);
            for (std::size_t k = 0; k < dx.size(); ++k) dx[k] = T(double(dx[k]) + double(tmp[k]));
          } else {
            for (std::size_t k = 0; k < dx.size(); ++k) dx[k] = T(double(dx[k]) + y[k]);
          }
        });
  }
  loop.flush();
  if (!span_.embedding) {
    join_pieces(dxs, *dx_in);
    return;
  }
  // The vocabulary-parallel embedding's gradient: this rank's rows; the position table whole.
  T* dwte = gat(p_.embedding());
  T* dwpe = gat(p_.pos_embedding());
  for (int m = 0; m < M; ++m) {
    const std::vector<T>& dx = dxs[std::size_t(m / Mp)];
    const std::size_t r = std::size_t(m % Mp) * h;
    const int tok = tokens_[std::size_t(m)];
    T* pe = dwpe + std::size_t(m % S) * h;
    for (int c = 0; c < h; ++c) {
      const double g = double(dx[r + c]);
      if (tok >= v0 && tok < v0 + Vl) dwte[std::size_t(tok) * h + c] = T(double(dwte[std::size_t(tok) * h + c]) + g);
      pe[c] = T(double(pe[c]) + g);
    }
  }
}

template void ReferenceModel<float>::set_tensor_parallel(const TpSlice&);
template void ReferenceModel<double>::set_tensor_parallel(const TpSlice&);
template double ReferenceModel<float>::forward_tp(const float*, const std::int32_t*, const std::int32_t*, const float*,
                                                  int, int, std::vector<float>*);
template double ReferenceModel<double>::forward_tp(const double*, const std::int32_t*, const std::int32_t*,
                                                   const double*, int, int, std::vector<double>*);
template void ReferenceModel<float>::backward_tp(const float*, float*, const float*, double, std::vector<float>*);
template void ReferenceModel<double>::backward_tp(const double*, double*, const double*, double, std::vector<double>*);

}  // namespace cutrain::model
