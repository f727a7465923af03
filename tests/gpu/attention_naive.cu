// Naive attention on the GPU: scores -> row softmax -> P V, and the backward from materialized P.
#include "tests/gpu/attention_naive.h"

#include <cmath>

#include "runtime/check.h"

namespace cutrain::test {
namespace {

struct Dims {
  int B, S, H, D;
  bool causal;
  __device__ std::size_t qkv(int b, int t, int w, int h) const {
    return (((static_cast<std::size_t>(b) * S + t) * 3 + w) * H + h) * D;
  }
  __device__ std::size_t o(int b, int t, int h) const { return ((static_cast<std::size_t>(b) * S + t) * H + h) * D; }
  __device__ std::size_t p(int b, int h, int i, int j) const {
    return ((static_cast<std::size_t>(b) * H + h) * S + i) * S + j;
  }
};

__device__ float f(bf16 x) { return __bfloat162float(x); }

// P[b,h,i,j] = scale * q_i . k_j, or -inf where masked.
__global__ void scores(Dims d, const bf16* qkv, float* P, float scale) {
  const std::size_t idx = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  const std::size_t total = static_cast<std::size_t>(d.B) * d.H * d.S * d.S;
  if (idx >= total) return;
  const int j = idx % d.S, i = (idx / d.S) % d.S, h = (idx / d.S / d.S) % d.H, b = idx / d.S / d.S / d.H;
  if (d.causal && j > i) { P[idx] = -INFINITY; return; }
  const bf16* q = qkv + d.qkv(b, i, 0, h);
  const bf16* k = qkv + d.qkv(b, j, 1, h);
  float acc = 0.f;
  for (int e = 0; e < d.D; ++e) acc += f(q[e]) * f(k[e]);
  P[idx] = acc * scale;
}

// One thread per row: softmax in place, lse out.
__global__ void softmax_rows(Dims d, float* P, float* lse) {
  const std::size_t row = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (row >= static_cast<std::size_t>(d.B) * d.H * d.S) return;
  float* p = P + row * d.S;
  float mx = -INFINITY;
  for (int j = 0; j < d.S; ++j) mx = fmaxf(mx, p[j]);
  float sum = 0.f;
  for (int j = 0; j < d.S; ++j) sum += expf(p[j] - mx);
  for (int j = 0; j < d.S; ++j) p[j] = expf(p[j] - mx) / sum;
  lse[row] = mx + logf(sum);
}

// out[b,i,h,e] = sum_j P[b,h,i,j] v[b,j,h,e]
__global__ void pv(Dims d, const float* P, const bf16* qkv, float* out) {
  const std::size_t idx = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (idx >= static_cast<std::size_t>(d.B) * d.S * d.H * d.D) return;
  const int e = idx % d.D, h = (idx / d.D) % d.H, i = (idx / d.D / d.H) % d.S, b = idx / d.D / d.H / d.S;
  float acc = 0.f;
  for (int j = 0; j < d.S; ++j) acc += P[d.p(b, h, i, j)] * f(qkv[d.qkv(b, j, 2, h) + e]);
  out[idx] = acc;
}

// dvec[b,h,i] = dout_i . out_i
__global__ void row_dot(Dims d, const bf16* out, const bf16* dout, float* dvec) {
  const std::size_t row = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (row >= static_cast<std::size_t>(d.B) * d.H * d.S) return;
  const int i = row % d.S, h = (row / d.S) % d.H, b = row / d.S / d.H;
  float acc = 0.f;
  for (int e = 0; e < d.D; ++e) acc += f(out[d.o(b, i, h) + e]) * f(dout[d.o(b, i, h) + e]);
  dvec[row] = acc;
}

// dS = P o (dout_i . v_j - dvec_i)
__global__ void dscores(Dims d, const float* P, const bf16* qkv, const bf16* dout, const float* dvec, float* dS) {
  const std::size_t idx = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (idx >= static_cast<std::size_t>(d.B) * d.H * d.S * d.S) return;
  const int j = idx % d.S, i = (idx / d.S) % d.S, h = (idx / d.S / d.S) % d.H, b = idx / d.S / d.S / d.H;
  const bf16* g = dout + d.o(b, i, h);
  const bf16* v = qkv + d.qkv(b, j, 2, h);
  float acc = 0.f;
  for (int e = 0; e < d.D; ++e) acc += f(g[e]) * f(v[e]);
  dS[idx] = P[idx] * (acc - dvec[(static_cast<std::size_t>(b) * d.H + h) * d.S + i]);
}

// dq_i = scale sum_j dS_ij k_j;  dk_j = scale sum_i dS_ij q_i;  dv_j = sum_i P_ij dout_i
__global__ void grads(Dims d, const float* P, const float* dS, const bf16* qkv, const bf16* dout, float* dqkv,
                      float scale) {
  const std::size_t idx = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (idx >= static_cast<std::size_t>(d.B) * d.S * 3 * d.H * d.D) return;
  const int e = idx % d.D, h = (idx / d.D) % d.H, w = (idx / d.D / d.H) % 3, t = (idx / d.D / d.H / 3) % d.S,
            b = idx / d.D / d.H / 3 / d.S;
  float acc = 0.f;
  if (w == 0) {
    for (int j = 0; j < d.S; ++j) acc += dS[d.p(b, h, t, j)] * f(qkv[d.qkv(b, j, 1, h) + e]);
    acc *= scale;
  } else if (w == 1) {
    for (int i = 0; i < d.S; ++i) acc += dS[d.p(b, h, i, t)] * f(qkv[d.qkv(b, i, 0, h) + e]);
    acc *= scale;
  } else {
    for (int i = 0; i < d.S; ++i) acc += P[d.p(b, h, i, t)] * f(dout[d.o(b, i, h) + e]);
  }
  dqkv[idx] = acc;
}

unsigned blocks(std::size_t n) { return static_cast<unsigned>((n + 255) / 256); }

}  // namespace

NaiveAttention::NaiveAttention(const kernels::AttentionShape& s)
    : shape(s),
      P(static_cast<std::size_t>(s.batch) * s.heads * s.seq * s.seq),
      dS(static_cast<std::size_t>(s.batch) * s.heads * s.seq * s.seq),
      dvec(static_cast<std::size_t>(s.batch) * s.heads * s.seq) {}

void NaiveAttention::forward(const bf16* qkv, float* out, float* lse) {
  const Dims d{shape.batch, shape.seq, shape.heads, shape.head_dim, shape.causal};
  const float scale = 1.f / std::sqrt(static_cast<float>(shape.head_dim));
  scores<<<blocks(P.size()), 256>>>(d, qkv, P.get(), scale);
  CUTRAIN_LAUNCH_CHECK("naive scores");
  softmax_rows<<<blocks(dvec.size()), 256>>>(d, P.get(), lse);
  CUTRAIN_LAUNCH_CHECK("naive softmax_rows");
  pv<<<blocks(dvec.size() * shape.head_dim), 256>>>(d, P.get(), qkv, out);
  CUTRAIN_LAUNCH_CHECK("naive pv");
  CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
}

void NaiveAttention::backward(const bf16* qkv, const bf16* out, const bf16* dout, float* dqkv) {
  const Dims d{shape.batch, shape.seq, shape.heads, shape.head_dim, shape.causal};
  const float scale = 1.f / std::sqrt(static_cast<float>(shape.head_dim));
  row_dot<<<blocks(dvec.size()), 256>>>(d, out, dout, dvec.get());
  CUTRAIN_LAUNCH_CHECK("naive row_dot");
  dscores<<<blocks(dS.size()), 256>>>(d, P.get(), qkv, dout, dvec.get(), dS.get());
  CUTRAIN_LAUNCH_CHECK("naive dscores");
  grads<<<blocks(dvec.size() * 3 * shape.head_dim), 256>>>(d, P.get(), dS.get(), qkv, dout, dqkv, scale);
  CUTRAIN_LAUNCH_CHECK("naive grads");
  CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace cutrain::test
