// Flash-style attention forward (FlashAttention-2 schedule) on mma.sync tensor cores.
// One CTA = 64 query rows of one (batch, head), 4 warps x 16 rows. K/V tiles of 64 keys stream
// through a cp.async double buffer; scores, the online softmax (exp2 with the scale folded into
// log2 e) and the output accumulator stay in registers. Only O and the fp32 log-sum-exp are stored.
#include <cmath>

#include "kernels/attention.cuh"
#include "kernels/attention_tiles.cuh"
#include "runtime/check.h"

namespace cutrain::kernels {
namespace attn {
namespace {

template <int D, bool CAUSAL>
__global__ void __launch_bounds__(kThreads) forward_kernel(const bf16* __restrict__ qkv, bf16* __restrict__ out,
                                                           float* __restrict__ lse, int S, int H, float scale_log2) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sK = sQ + kBlock * ld<D>();      // [2][kBlock][ld]
  bf16* sV = sK + 2 * kBlock * ld<D>();  // [2][kBlock][ld]

  // Causal blocks near the end of the sequence do the most work: start them first.
  const int qblock = CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int m0 = qblock * kBlock, head = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gi = lane >> 2, t = lane & 3;
  const std::size_t tok = 3ull * H * D;  // element stride between tokens in qkv
  const bf16* gq = qkv + static_cast<std::size_t>(b) * S * tok + static_cast<std::size_t>(head) * D;
  const bf16* gk = gq + static_cast<std::size_t>(H) * D;
  const bf16* gv = gk + static_cast<std::size_t>(H) * D;

  int n_tiles = (S + kBlock - 1) / kBlock;
  if (CAUSAL) n_tiles = min(n_tiles, (m0 + kBlock - 1) / kBlock + 1);

  load_rows<D, kBlock>(sQ, gq, m0, S, tok);
  mma::cp_async_commit();
  load_rows<D, kBlock>(sK, gk, 0, S, tok);
  load_rows<D, kBlock>(sV, gv, 0, S, tok);
  mma::cp_async_commit();
  mma::cp_async_wait<1>();
  __syncthreads();

  // The warp's Q rows as A fragments, kept for the whole pass.
  std::uint32_t qf[D / 16][4];
  {
    const std::uint32_t a_addr = mma::smem_addr(sQ + (warp * 16 + (lane & 15)) * ld<D>() + (lane >> 4) * 8);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) mma::ldmatrix_x4(qf[kk], a_addr + kk * 32);
  }

  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[i][e] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  const int row_base = m0 + warp * 16 + gi;  // this thread's rows: row_base, row_base + 8

  for (int j = 0; j < n_tiles; ++j) {
    const int n0 = j * kBlock;
    if (j + 1 < n_tiles) {
      const int nb = (j + 1) & 1;
      load_rows<D, kBlock>(sK + nb * kBlock * ld<D>(), gk, n0 + kBlock, S, tok);
      load_rows<D, kBlock>(sV + nb * kBlock * ld<D>(), gv, n0 + kBlock, S, tok);
      mma::cp_async_commit();
      mma::cp_async_wait<1>();
    } else {
      mma::cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* k_tile = sK + (j & 1) * kBlock * ld<D>();
    const bf16* v_tile = sV + (j & 1) * kBlock * ld<D>();

    // S = Q K^T for 16 rows x 64 keys (raw, unscaled).
    float s[kBlock / 8][4];
    {
      const std::uint32_t b_addr =
          mma::smem_addr(k_tile + ((lane & 7) + (lane >> 4) * 8) * ld<D>() + ((lane >> 3) & 1) * 8);
#pragma unroll
      for (int n = 0; n < kBlock / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
        for (int np = 0; np < kBlock / 16; ++np) {
          std::uint32_t bb[4];
          mma::ldmatrix_x4(bb, b_addr + (np * 16 * ld<D>() + kk * 16) * 2);
          mma::mma_bf16_16816(s[2 * np], qf[kk], bb[0], bb[1]);
          mma::mma_bf16_16816(s[2 * np + 1], qf[kk], bb[2], bb[3]);
        }
    }

    // Keys past the end, and (causal) keys after the query, get -inf.
    if (n0 + kBlock > S || (CAUSAL && n0 + kBlock - 1 > m0)) {
#pragma unroll
      for (int n = 0; n < kBlock / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = n0 + n * 8 + 2 * t + (e & 1);
          const int row = row_base + (e >> 1) * 8;
          if (col >= S || (CAUSAL && col > row)) s[n][e] = -INFINITY;
        }
    }

    // Online softmax: each row lives in the 4 lanes of a quad.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < kBlock / 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_run[h], mx * scale_log2);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing unmasked yet
      const float alpha = exp2f(m_run[h] - m_use);
      m_run[h] = m_new;
      float rs = 0.f;
#pragma unroll
      for (int n = 0; n < kBlock / 8; ++n)
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) {
          s[n][e] = exp2f(fmaf(s[n][e], scale_log2, -m_use));
          rs += s[n][e];
        }
      l_run[h] = l_run[h] * alpha + rs;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        o[dt][2 * h] *= alpha;
        o[dt][2 * h + 1] *= alpha;
      }
    }

    std::uint32_t p[kBlock / 16][4];
    to_a_frags<kBlock>(p, s);
    warp_pb<D, kBlock>(o, p, v_tile);
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }

  // Epilogue: finish the row sums across the quad, normalize, store O and the log-sum-exp.
  bf16* gout = out + static_cast<std::size_t>(b) * S * H * D + static_cast<std::size_t>(head) * D;
  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = l_run[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    inv[h] = 1.f / l;
    const int row = row_base + 8 * h;
    if (t == 0 && row < S) lse[(static_cast<std::size_t>(b) * H + head) * S + row] = m_run[h] * kLn2 + logf(l);
  }
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
    o[dt][0] *= inv[0];
    o[dt][1] *= inv[0];
    o[dt][2] *= inv[1];
    o[dt][3] *= inv[1];
  }
  store_rows<D>(gout, o, m0 + warp * 16, S, static_cast<std::size_t>(H) * D, 1.f);
}

template <int D, bool CAUSAL>
void launch_forward(cudaStream_t st, const bf16* qkv, bf16* out, float* lse, const AttentionShape& sh) {
  constexpr int kSmem = 5 * kBlock * ld<D>() * 2;  // Q + 2 K + 2 V tiles
  auto kernel = forward_kernel<D, CAUSAL>;
  CUTRAIN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const dim3 grid((sh.seq + kBlock - 1) / kBlock, sh.heads, sh.batch);
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(D));
  kernel<<<grid, kThreads, kSmem, st>>>(qkv, out, lse, sh.seq, sh.heads, scale_log2);
  CUTRAIN_LAUNCH_CHECK("attention_forward_kernel");
}

}  // namespace
}  // namespace attn

void attention_forward(cudaStream_t s, const bf16* qkv, bf16* out, float* lse, const AttentionShape& shape) {
  attn::check_shape(shape, "attention_forward");
  CUTRAIN_CHECK(qkv && out && lse, "attention_forward: qkv, out and lse must be non-null, got qkv=",
                static_cast<const void*>(qkv), " out=", static_cast<void*>(out), " lse=", static_cast<void*>(lse));
  CUTRAIN_CHECK(reinterpret_cast<std::uintptr_t>(qkv) % 16 == 0 && reinterpret_cast<std::uintptr_t>(out) % 4 == 0,
                "attention_forward: qkv must be 16-byte aligned and out 4-byte aligned, got qkv=",
                static_cast<const void*>(qkv), " out=", static_cast<void*>(out));
  if (const attn::Variant v = attn::current_variant(); v != attn::Variant::V1)
    return attn::forward_v2(s, qkv, out, lse, shape, v);
  const bool c = shape.causal;
  if (shape.head_dim == 64)
    c ? attn::launch_forward<64, true>(s, qkv, out, lse, shape) : attn::launch_forward<64, false>(s, qkv, out, lse, shape);
  else
    c ? attn::launch_forward<128, true>(s, qkv, out, lse, shape)
      : attn::launch_forward<128, false>(s, qkv, out, lse, shape);
}

}  // namespace cutrain::kernels
