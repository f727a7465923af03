// Flash-style attention backward on mma.sync tensor cores, deterministic by construction:
//   1. row_dot:  Dvec[i] = sum_d dO[i,d] * O[i,d]                     (fp32 scratch, B*H*S)
//   2. dkdv:     one CTA per 64 keys, walking the query tiles: P^T and dP^T recomputed from
//                lse, dV += P^T dO, dK += dS^T Q                       (each warp: 16 keys)
//   3. dq:       one CTA per 64 queries, walking the key tiles: dQ += dS K (each warp: 16 queries)
// Deterministic mode: no atomics, the same bits every run; the price is recomputing Q K^T and
// dO V^T once more in the dQ pass (7 instead of 5 matmuls). Fast mode: step 3 is replaced by
// fp32 atomics of dS K from inside the dK/dV pass into a scratch accumulator, then a conversion.
// With P = exp(scale*S - lse), dP = dO V^T, dS = P o (dP - Dvec):
//   dV = P^T dO,  dK = scale * dS^T Q,  dQ = scale * dS K.
#include <cmath>

#include "kernels/attention.cuh"
#include "kernels/attention_tiles.cuh"
#include "runtime/check.h"

namespace cutrain::kernels {
namespace attn {
namespace {

// One warp per (token, head) row.
template <int D>
__global__ void __launch_bounds__(256) row_dot_kernel(const bf16* __restrict__ out, const bf16* __restrict__ dout,
                                                      float* __restrict__ dvec, int B, int S, int H) {
  const long long row = static_cast<long long>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= static_cast<long long>(B) * S * H) return;
  const __nv_bfloat162* o = reinterpret_cast<const __nv_bfloat162*>(out + row * D);
  const __nv_bfloat162* d = reinterpret_cast<const __nv_bfloat162*>(dout + row * D);
  float acc = 0.f;
#pragma unroll
  for (int i = lane; i < D / 2; i += 32) {
    const float2 a = __bfloat1622float2(o[i]), c = __bfloat1622float2(d[i]);
    acc = fmaf(a.x, c.x, fmaf(a.y, c.y, acc));
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) {
    const long long h = row % H, bs = row / H, s = bs % S, b = bs / S;
    dvec[(b * H + h) * S + s] = acc;
  }
}

// Query tile of the dK/dV pass: 64 rows for D=64; 32 for D=128 to stay clear of spills.
template <int D>
constexpr int dkdv_qtile() { return D == 64 ? 64 : 32; }

// Fast mode: the dK/dV pass also adds this key block's share of dQ (dS K, unscaled) into an fp32
// accumulator [B, S, H, D] with atomics, via dS^T parked in shared memory; warp w takes query rows
// 16*(w % (QT/16)).. and D/dq_split columns of them (KB=64: all D when QT=64, half when QT=32).
// KB: keys per CTA, one warp per 16 (v1: 64; the v2 variants: 128, which halves both the Q/dO
// re-reads from L2 and the number of dQ atomics).
template <int D, int KB>
constexpr int dq_split() { return (KB / 16) / (dkdv_qtile<D>() / 16); }

template <int D, bool ATOMIC_DQ, int KB>
constexpr int dkdv_smem() {
  constexpr int QT = dkdv_qtile<D>();
  return (2 * KB + 4 * QT) * ld<D>() * 2 + 4 * QT * 4 + (ATOMIC_DQ ? KB * (QT + 8) * 2 : 0);
}

template <int D, bool CAUSAL, bool ATOMIC_DQ, int KB>
__global__ void __launch_bounds__(KB * 2) dkdv_kernel(const bf16* __restrict__ qkv, const bf16* __restrict__ dout,
                                                        const float* __restrict__ lse, const float* __restrict__ dvec,
                                                        bf16* __restrict__ dqkv, float* __restrict__ dq_acc, int S,
                                                        int H, float scale_log2, float scale) {
  constexpr int QT = dkdv_qtile<D>(), kT = KB * 2;  // kT: threads (KB / 16 warps)
  constexpr int kLdS = QT + 8;  // dS^T row stride (keys x queries), 16-byte skew per row
  static_assert(D / dq_split<D, KB>() % 32 == 0, "dQ columns per warp must be a multiple of 32");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sK = reinterpret_cast<bf16*>(smem_raw);
  bf16* sV = sK + KB * ld<D>();
  bf16* sQ = sV + KB * ld<D>();       // [2][QT][ld]
  bf16* sdO = sQ + 2 * QT * ld<D>();  // [2][QT][ld]
  float* sL = reinterpret_cast<float*>(sdO + 2 * QT * ld<D>());  // [2][QT] lse * log2 e
  float* sDv = sL + 2 * QT;                                       // [2][QT]
  bf16* sdS = reinterpret_cast<bf16*>(sDv + 2 * QT);               // [KB][kLdS], ATOMIC_DQ only

  const int n0 = blockIdx.x * KB, head = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gi = lane >> 2, t = lane & 3;
  const std::size_t tok = 3ull * H * D, otok = static_cast<std::size_t>(H) * D;
  const std::size_t qoff = static_cast<std::size_t>(b) * S * tok + static_cast<std::size_t>(head) * D;
  const bf16* gq = qkv + qoff;
  const bf16* gk = gq + otok;
  const bf16* gv = gk + otok;
  const bf16* gdo = dout + static_cast<std::size_t>(b) * S * otok + static_cast<std::size_t>(head) * D;
  const float* glse = lse + (static_cast<std::size_t>(b) * H + head) * S;
  const float* gdv = dvec + (static_cast<std::size_t>(b) * H + head) * S;

  const int q_first = CAUSAL ? n0 / QT : 0;  // causal: queries before the first key see none of it
  const int q_tiles = (S + QT - 1) / QT;

  auto load_q_tile = [&](int qt, int buf) {
    load_rows<D, QT, kT>(sQ + buf * QT * ld<D>(), gq, qt * QT, S, tok);
    load_rows<D, QT, kT>(sdO + buf * QT * ld<D>(), gdo, qt * QT, S, otok);
    for (int i = threadIdx.x; i < QT; i += kT) {
      const int q = qt * QT + i;
      sL[buf * QT + i] = q < S ? glse[q] * kLog2e : 0.f;
      sDv[buf * QT + i] = q < S ? gdv[q] : 0.f;
    }
  };
  load_rows<D, KB, kT>(sK, gk, n0, S, tok);
  load_rows<D, KB, kT>(sV, gv, n0, S, tok);
  load_q_tile(q_first, 0);
  mma::cp_async_commit();

  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.f;
  const int key_base = n0 + warp * 16 + gi;  // this thread's keys: key_base, key_base + 8

  for (int qt = q_first; qt < q_tiles; ++qt) {
    const int buf = (qt - q_first) & 1, m0 = qt * QT;
    if (qt + 1 < q_tiles) {
      load_q_tile(qt + 1, buf ^ 1);
      mma::cp_async_commit();
      mma::cp_async_wait<1>();
    } else {
      mma::cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* q_tile = sQ + buf * QT * ld<D>();
    const bf16* do_tile = sdO + buf * QT * ld<D>();
    const float* l_tile = sL + buf * QT;
    const float* dv_tile = sDv + buf * QT;

    // P^T = exp2(scale_log2 * K Q^T - lse_log2[q]) for 16 keys x QT queries.
    float p[QT / 8][4];
    warp_abt<D, QT / 8>(p, sK, warp * 16, q_tile);
    const bool mask = m0 + QT > S || (CAUSAL && m0 < n0 + KB - 1);
#pragma unroll
    for (int n = 0; n < QT / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qi = n * 8 + 2 * t + (e & 1);
        const int key = key_base + (e >> 1) * 8;
        const bool dead = mask && (m0 + qi >= S || (CAUSAL && m0 + qi < key));
        p[n][e] = dead ? 0.f : exp2f(fmaf(p[n][e], scale_log2, -l_tile[qi]));
      }
    // Keys past S: their zero K rows give P = exp2(-lse), inf for a row whose lse < -88.7, and
    // inf * 0 would poison the fast mode's dQ. Zero them (the last key block only).
    if (n0 + KB > S) {
#pragma unroll
      for (int n = 0; n < QT / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (key_base + (e >> 1) * 8 >= S) p[n][e] = 0.f;
    }
    std::uint32_t pf[QT / 16][4];
    to_a_frags<QT>(pf, p);
    warp_pb<D, QT>(dv, pf, do_tile);

    // dS^T = P^T o (V dO^T - Dvec[q]).
    float ds[QT / 8][4];
    warp_abt<D, QT / 8>(ds, sV, warp * 16, do_tile);
#pragma unroll
    for (int n = 0; n < QT / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) ds[n][e] = p[n][e] * (ds[n][e] - dv_tile[n * 8 + 2 * t + (e & 1)]);
    to_a_frags<QT>(pf, ds);
    warp_pb<D, QT>(dk, pf, q_tile);
    if constexpr (ATOMIC_DQ) {
      // Key rows past S carry dS = 0 (dead above) and zero-filled K rows.
      // Park dS^T (bf16, the values the dK product used), then dQ[q, d0..] += dS[q, keys] K[keys, d0..].
#pragma unroll
      for (int n = 0; n < QT / 8; ++n)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          *reinterpret_cast<std::uint32_t*>(sdS + (warp * 16 + gi + 8 * h) * kLdS + n * 8 + 2 * t) =
              mma::pack_bf16(ds[n][2 * h], ds[n][2 * h + 1]);
      __syncthreads();
      constexpr int DN = D / dq_split<D, KB>(), DC = 32;  // columns per warp, done 32 at a time (registers)
      const int q0 = (warp % (QT / 16)) * 16, d0 = (warp / (QT / 16)) * DN;
      // A = dS (queries x keys) read transposed out of dS^T: matrices (q 0-7, k 0-7), (q 8-15, k 0-7),
      // (q 0-7, k 8-15), (q 8-15, k 8-15) live at (keys 0-7 | 8-15) x (queries 0-7 | 8-15) of dS^T.
      const std::uint32_t a_addr =
          mma::smem_addr(sdS + ((lane & 7) + (lane >> 4) * 8) * kLdS + q0 + ((lane >> 3) & 1) * 8);
#pragma unroll
      for (int dc = d0; dc < d0 + DN; dc += DC) {
        float acc[DC / 8][4];
#pragma unroll
        for (int i = 0; i < DC / 8; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[i][e] = 0.f;
        const std::uint32_t b_addr =
            mma::smem_addr(sK + ((lane & 7) + ((lane >> 3) & 1) * 8) * ld<D>() + dc + (lane >> 4) * 8);
#pragma unroll
        for (int ks = 0; ks < KB / 16; ++ks) {
          std::uint32_t a[4];
          mma::ldmatrix_x4_trans(a, a_addr + ks * 16 * kLdS * 2);
#pragma unroll
          for (int dp = 0; dp < DC / 16; ++dp) {
            std::uint32_t bb[4];
            mma::ldmatrix_x4_trans(bb, b_addr + (ks * 16 * ld<D>() + dp * 16) * 2);
            mma::mma_bf16_16816(acc[2 * dp], a, bb[0], bb[1]);
            mma::mma_bf16_16816(acc[2 * dp + 1], a, bb[2], bb[3]);
          }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int q = m0 + q0 + gi + 8 * h;
          if (q >= S) continue;
          float* dst =
              dq_acc + (static_cast<std::size_t>(b) * S + q) * otok + static_cast<std::size_t>(head) * D + dc + 2 * t;
#pragma unroll
          for (int dt = 0; dt < DC / 8; ++dt) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            atomicAdd(reinterpret_cast<float2*>(dst + dt * 8), make_float2(acc[dt][2 * h], acc[dt][2 * h + 1]));
#else
            atomicAdd(dst + dt * 8, acc[dt][2 * h]);
            atomicAdd(dst + dt * 8 + 1, acc[dt][2 * h + 1]);
#endif
          }
        }
      }
    }
    __syncthreads();  // every warp is done with this buffer (and sdS) before it is refilled
  }

  bf16* gdk = dqkv + qoff + otok;
  store_rows<D>(gdk, dk, n0 + warp * 16, S, tok, scale);
  store_rows<D>(gdk + otok, dv, n0 + warp * 16, S, tok, 1.f);
}

template <int D, bool CAUSAL>
__global__ void __launch_bounds__(kThreads) dq_kernel(const bf16* __restrict__ qkv, const bf16* __restrict__ dout,
                                                      const float* __restrict__ lse, const float* __restrict__ dvec,
                                                      bf16* __restrict__ dqkv, int S, int H, float scale_log2,
                                                      float scale) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sdO = sQ + kBlock * ld<D>();
  bf16* sK = sdO + kBlock * ld<D>();     // [2][kBlock][ld]
  bf16* sV = sK + 2 * kBlock * ld<D>();  // [2][kBlock][ld]

  const int qblock = CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x;  // heaviest first
  const int m0 = qblock * kBlock, head = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gi = lane >> 2, t = lane & 3;
  const std::size_t tok = 3ull * H * D, otok = static_cast<std::size_t>(H) * D;
  const std::size_t qoff = static_cast<std::size_t>(b) * S * tok + static_cast<std::size_t>(head) * D;
  const bf16* gq = qkv + qoff;
  const bf16* gk = gq + otok;
  const bf16* gv = gk + otok;
  const bf16* gdo = dout + static_cast<std::size_t>(b) * S * otok + static_cast<std::size_t>(head) * D;
  const float* glse = lse + (static_cast<std::size_t>(b) * H + head) * S;
  const float* gdv = dvec + (static_cast<std::size_t>(b) * H + head) * S;

  int n_tiles = (S + kBlock - 1) / kBlock;
  if (CAUSAL) n_tiles = min(n_tiles, (m0 + kBlock - 1) / kBlock + 1);

  const int row_base = m0 + warp * 16 + gi;  // this thread's rows: row_base, row_base + 8
  float l2[2], dd[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row_base + 8 * h;
    l2[h] = r < S ? glse[r] * kLog2e : 0.f;
    dd[h] = r < S ? gdv[r] : 0.f;
  }

  load_rows<D, kBlock>(sQ, gq, m0, S, tok);
  load_rows<D, kBlock>(sdO, gdo, m0, S, otok);
  load_rows<D, kBlock>(sK, gk, 0, S, tok);
  load_rows<D, kBlock>(sV, gv, 0, S, tok);
  mma::cp_async_commit();

  float dq[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dq[i][e] = 0.f;

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

    float p[kBlock / 8][4];
    warp_abt<D, kBlock / 8>(p, sQ, warp * 16, k_tile);
    const bool mask = n0 + kBlock > S || (CAUSAL && n0 + kBlock - 1 > m0);
#pragma unroll
    for (int n = 0; n < kBlock / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = n0 + n * 8 + 2 * t + (e & 1);
        const int row = row_base + (e >> 1) * 8;
        const bool dead = mask && (col >= S || (CAUSAL && col > row));
        p[n][e] = dead ? 0.f : exp2f(fmaf(p[n][e], scale_log2, -l2[e >> 1]));
      }

    float ds[kBlock / 8][4];
    warp_abt<D, kBlock / 8>(ds, sdO, warp * 16, v_tile);
#pragma unroll
    for (int n = 0; n < kBlock / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) ds[n][e] = p[n][e] * (ds[n][e] - dd[e >> 1]);
    std::uint32_t sf[kBlock / 16][4];
    to_a_frags<kBlock>(sf, ds);
    warp_pb<D, kBlock>(dq, sf, k_tile);
    __syncthreads();
  }

  store_rows<D>(dqkv + qoff, dq, m0 + warp * 16, S, tok, scale);
}

// dqkv's q slot = scale * dq_acc (the fast mode's fp32 accumulator, [B, S, H, D]); one thread per
// element pair.
template <int D>
__global__ void __launch_bounds__(256) dq_convert_kernel(const float* __restrict__ dq_acc, bf16* __restrict__ dqkv,
                                                         std::size_t rows, int H, float scale) {
  const std::size_t i = (blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x) * 2;
  if (i >= rows * D) return;
  const std::size_t row = i / D, d = i % D;  // row = (b*S + s)*H + h
  const std::size_t dst = ((row / H) * 3 * H + row % H) * D + d;
  const float2 v = *reinterpret_cast<const float2*>(dq_acc + i);
  *reinterpret_cast<__nv_bfloat162*>(dqkv + dst) = __floats2bfloat162_rn(v.x * scale, v.y * scale);
}

template <int D>
constexpr int dq_smem() { return 6 * kBlock * ld<D>() * 2; }

std::size_t dvec_bytes(const AttentionShape& sh) {
  const std::size_t n = static_cast<std::size_t>(sh.batch) * sh.heads * sh.seq * sizeof(float);
  return (n + 255) / 256 * 256;
}

template <int D, bool CAUSAL, int KB>
void launch_backward(cudaStream_t st, const bf16* qkv, const bf16* out, const bf16* dout, const float* lse,
                     bf16* dqkv, void* scratch, const AttentionShape& sh, bool deterministic, bool kv32) {
  // kv32 (v2_m128k32, D=64, fast mode): the dK/dV pass with 32 keys per warp (attention_bwd_dkdv_v2.cu).
  const bool kv_v2 = kv32 && D == 64 && KB == 128;
  float* dvec = static_cast<float*>(scratch);
  float* dq_acc = reinterpret_cast<float*>(static_cast<char*>(scratch) + dvec_bytes(sh));
  const std::size_t rows = static_cast<std::size_t>(sh.batch) * sh.seq * sh.heads;
  row_dot_kernel<D><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, st>>>(out, dout, dvec, sh.batch, sh.seq,
                                                                           sh.heads);
  CUTRAIN_LAUNCH_CHECK("attention_row_dot_kernel");

  const float scale = 1.f / std::sqrt(static_cast<float>(D)), scale_log2 = scale * kLog2e;
  const dim3 grid((sh.seq + kBlock - 1) / kBlock, sh.heads, sh.batch);
  const dim3 kv_grid((sh.seq + KB - 1) / KB, sh.heads, sh.batch);
  if (deterministic) {
    auto kv = dkdv_kernel<D, CAUSAL, false, KB>;  // (dkdv_v2 has no deterministic form: it spills)
    constexpr int kSmem = dkdv_smem<D, false, KB>();
    CUTRAIN_CUDA_CHECK(cudaFuncSetAttribute(kv, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    kv<<<kv_grid, KB * 2, kSmem, st>>>(qkv, dout, lse, dvec, dqkv, nullptr, sh.seq, sh.heads, scale_log2, scale);
    CUTRAIN_LAUNCH_CHECK("attention_dkdv_kernel");
    if constexpr (KB == 128) {  // the v2 variants
      dq_v2(st, qkv, dout, lse, dvec, dqkv, sh);
    } else {
      auto q = dq_kernel<D, CAUSAL>;
      CUTRAIN_CUDA_CHECK(cudaFuncSetAttribute(q, cudaFuncAttributeMaxDynamicSharedMemorySize, dq_smem<D>()));
      q<<<grid, kThreads, dq_smem<D>(), st>>>(qkv, dout, lse, dvec, dqkv, sh.seq, sh.heads, scale_log2, scale);
      CUTRAIN_LAUNCH_CHECK("attention_dq_kernel");
    }
  } else {
    CUTRAIN_CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, rows * D * sizeof(float), st));
    if (kv_v2) {
      dkdv_v2(st, qkv, dout, lse, dvec, dqkv, dq_acc, sh);
    } else {
      auto kv = dkdv_kernel<D, CAUSAL, true, KB>;
      constexpr int kSmem = dkdv_smem<D, true, KB>();
      CUTRAIN_CUDA_CHECK(cudaFuncSetAttribute(kv, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
      kv<<<kv_grid, KB * 2, kSmem, st>>>(qkv, dout, lse, dvec, dqkv, dq_acc, sh.seq, sh.heads, scale_log2, scale);
      CUTRAIN_LAUNCH_CHECK("attention_dkdv_kernel(atomic dq)");
    }
    dq_convert_kernel<D><<<static_cast<unsigned>((rows * D / 2 + 255) / 256), 256, 0, st>>>(dq_acc, dqkv, rows,
                                                                                             sh.heads, scale);
    CUTRAIN_LAUNCH_CHECK("attention_dq_convert_kernel");
  }
}

// v1 and v2_m128n32: 64 keys per dK/dV CTA and the v1 dQ pass; v2_m128 and v2_m128w8: 128 keys and
// the v2 dQ pass (attention_bwd_dq_v2.cu); v2_m128k32: as v2_m128 with 4 warps x 32 keys for D=64.
template <int D, bool CAUSAL>
void launch_backward_variant(cudaStream_t st, const bf16* qkv, const bf16* out, const bf16* dout, const float* lse,
                             bf16* dqkv, void* scratch, const AttentionShape& sh, bool deterministic) {
  const Variant v = current_variant();
  if (v == Variant::V2_M128 || v == Variant::V2_M128W8 || v == Variant::V2_M128K32)
    launch_backward<D, CAUSAL, 128>(st, qkv, out, dout, lse, dqkv, scratch, sh, deterministic,
                                    v == Variant::V2_M128K32);
  else
    launch_backward<D, CAUSAL, 64>(st, qkv, out, dout, lse, dqkv, scratch, sh, deterministic, false);
}

}  // namespace
}  // namespace attn

std::size_t attention_backward_scratch_bytes(const AttentionShape& shape, bool deterministic) {
  attn::check_shape(shape, "attention_backward_scratch_bytes");
  // Dvec (fp32 B*H*S, rounded up to 256 bytes); the fast mode adds its fp32 dQ accumulator (B*S*H*D).
  const std::size_t acc = static_cast<std::size_t>(shape.batch) * shape.seq * shape.heads * shape.head_dim * 4;
  return attn::dvec_bytes(shape) + (deterministic ? 0 : acc);
}

void attention_backward(cudaStream_t s, const bf16* qkv, const bf16* out, const bf16* dout, const float* lse,
                        bf16* dqkv, void* scratch, const AttentionShape& shape, bool deterministic) {
  attn::check_shape(shape, "attention_backward");
  CUTRAIN_CHECK(qkv && out && dout && lse && dqkv && scratch,
                "attention_backward: qkv, out, dout, lse, dqkv and scratch must all be non-null");
  CUTRAIN_CHECK(reinterpret_cast<std::uintptr_t>(qkv) % 16 == 0 && reinterpret_cast<std::uintptr_t>(dout) % 16 == 0 &&
                    reinterpret_cast<std::uintptr_t>(out) % 4 == 0 && reinterpret_cast<std::uintptr_t>(dqkv) % 4 == 0 &&
                    reinterpret_cast<std::uintptr_t>(scratch) % 16 == 0,
                "attention_backward: qkv, dout and scratch must be 16-byte aligned, out and dqkv 4-byte aligned");
  const bool c = shape.causal, det = deterministic;
  if (shape.head_dim == 64)
    c ? attn::launch_backward_variant<64, true>(s, qkv, out, dout, lse, dqkv, scratch, shape, det)
      : attn::launch_backward_variant<64, false>(s, qkv, out, dout, lse, dqkv, scratch, shape, det);
  else
    c ? attn::launch_backward_variant<128, true>(s, qkv, out, dout, lse, dqkv, scratch, shape, det)
      : attn::launch_backward_variant<128, false>(s, qkv, out, dout, lse, dqkv, scratch, shape, det);
}

}  // namespace cutrain::kernels
