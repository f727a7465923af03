// @brief Internal to the attention family: the online softmax (running max, rescale, row sums),
// the exp2 of scaled scores, and the causal / sequence-end mask, on mma C fragments.
// C fragment layout (kernels/common/mma_sm80.cuh): lane = 4*gi + t; element e of n-tile n is at
// row gi + 8*(e >> 1), column 8*n + 2*t + (e & 1). A row of a 16-row m-tile lives in the 4 lanes
// of a quad; h = e >> 1 picks the thread's row gi or gi + 8.
#pragma once

#include <cmath>

#include "kernels/attention_tiles.cuh"
#include "kernels/common/fast_math.cuh"

namespace cutrain::kernels::attn {

// Reductions over the 4 lanes of a quad (one fragment row).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
  return x;
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}

// exp2(s * scale_log2 - m): a raw score s's softmax numerator against m, a row max or a
// log-sum-exp, both in the log2 domain of the scaled scores. One MUFU (fast_ex2): at d64 the
// forward issues as many exponentials as tensor-core cycles allow, so the four-instruction exp2f
// would cost issue slots the softmax cannot spare.
__device__ __forceinline__ float scaled_exp2(float s, float scale_log2, float m) {
  return fast_ex2(fmaf(s, scale_log2, -m));
}

// The score entries that do not exist: keys at or past the sequence end, and (causal) keys after
// their query (rows are queries, columns keys).
template <bool CAUSAL>
struct Mask {
  int seq;
  // Forward: dead scores of a warp's MT m-tiles (rows row0 + 16i.., keys n0..) become -inf.
  template <int MT, int NT>
  __device__ __forceinline__ void apply(float (&s)[MT][NT][4], int row0, int n0) const {
    if (n0 + NT * 8 > seq || (CAUSAL && n0 + NT * 8 - 1 > row0)) {
      const int lane = threadIdx.x & 31, gi = lane >> 2, t = lane & 3;
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = n0 + n * 8 + 2 * t + (e & 1);
            const int row = row0 + i * 16 + gi + (e >> 1) * 8;
            if (col >= seq || (CAUSAL && col > row)) s[i][n][e] = -INFINITY;
          }
    }
  }
};

// Online softmax of a warp's MT m-tiles over state the kernel holds: per thread row (i, h) the
// running max of the scaled scores (log2 domain, m_run) and this thread's share of the row sum of
// exp2(score - max) (l_run). start() sets the empty state.
template <int MT>
struct Softmax {
  float (&m_run)[MT][2];
  float (&l_run)[MT][2];

  __device__ __forceinline__ void start() {
#pragma unroll
    for (int i = 0; i < MT; ++i) m_run[i][0] = m_run[i][1] = -INFINITY, l_run[i][0] = l_run[i][1] = 0.f;
  }

  // Folds a new tile of raw scores s (m-tile i) in: updates the max, turns s into exp2(scaled
  // score - max), adds the row sums, and rescales that m-tile's output accumulator o.
  template <int NT, int D>
  __device__ __forceinline__ void update(int i, float (&s)[NT][4], float (&o)[D / 8][4], float scale_log2) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < NT; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
      mx = quad_max(mx);
      const float m_new = fmaxf(m_run[i][h], mx * scale_log2);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing unmasked yet
      const float alpha = fast_ex2(m_run[i][h] - m_use);
      m_run[i][h] = m_new;
      float rs = 0.f;
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) {
          s[n][e] = scaled_exp2(s[n][e], scale_log2, m_use);
          rs += s[n][e];
        }
      l_run[i][h] = l_run[i][h] * alpha + rs;
#pragma unroll
      for (int d = 0; d < D / 8; ++d) {
        o[d][2 * h] *= alpha;
        o[d][2 * h + 1] *= alpha;
      }
    }
  }

  // update() in two halves, for a schedule whose output accumulator is still being written by a
  // tensor-core batch while the next tile's scores are folded in: fold() is update() without the
  // rescale of o and hands back each thread row's factor (alpha[h]); rescale() applies it once the
  // batch is done.
  template <int NT>
  __device__ __forceinline__ void fold(int i, float (&s)[NT][4], float (&alpha)[2], float scale_log2) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < NT; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
      mx = quad_max(mx);
      const float m_new = fmaxf(m_run[i][h], mx * scale_log2);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing unmasked yet
      alpha[h] = fast_ex2(m_run[i][h] - m_use);
      m_run[i][h] = m_new;
      float rs = 0.f;
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) {
          s[n][e] = scaled_exp2(s[n][e], scale_log2, m_use);
          rs += s[n][e];
        }
      l_run[i][h] = l_run[i][h] * alpha[h] + rs;
    }
  }
  template <int D>
  __device__ __forceinline__ static void rescale(float (&o)[D / 8][4], const float (&alpha)[2]) {
#pragma unroll
    for (int d = 0; d < D / 8; ++d) {
      o[d][0] *= alpha[0];
      o[d][1] *= alpha[0];
      o[d][2] *= alpha[1];
      o[d][3] *= alpha[1];
    }
  }

  // The finished row sum of row (i, h) (all four lanes of the quad get it).
  __device__ __forceinline__ float row_sum(int i, int h) const { return quad_sum(l_run[i][h]); }
  // Natural-log log-sum-exp of the scaled scores of row (i, h), given its row sum l.
  __device__ __forceinline__ float lse(int i, int h, float l) const { return m_run[i][h] * kLn2 + logf(l); }
};

}  // namespace cutrain::kernels::attn
