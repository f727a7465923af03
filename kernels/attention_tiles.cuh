// @brief Internal to the attention family: the cp.async tile loaders, the warp-level tensor-core
// products every attention kernel is built from, the per-(batch, head) slices and the launchers.
//   mma_abt: acc[i][16 x 8*NT] += A_i[16 x D] * B[8*NT x D]^T  (MT m-tiles; B row-major in shared memory)
//   mma_ab:  acc[i][16 x 8*NT] += A_i[16 x K] * B[K x 8*NT]   (MT m-tiles; B read transposed)
//   warp_abt, warp_pb: the same for one m-tile, A from shared memory or from registers (P).
// A fragments come from registers (RegFrags) or from shared memory (SmemFrags).
// Shared-memory rows are padded to D+8 elements (a 16-byte skew per row), so the 8 row addresses of
// every ldmatrix phase fall in 8 different 16-byte bank groups: conflict-free without swizzling.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "kernels/attention.cuh"
#include "kernels/attention_tile_size.h"
#include "kernels/common/mma_sm80.cuh"
#include "kernels/common/vec.cuh"

namespace cutrain::kernels::attn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int D>
constexpr int ld() { return D + 8; }  // shared-memory row stride, elements

// Zeroes a fragment array of any shape.
__device__ __forceinline__ void zero(float& x) { x = 0.f; }
template <typename T, int N>
__device__ __forceinline__ void zero(T (&a)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) zero(a[i]);
}

// One (batch, head)'s slices of qkv [B, S, 3, H, D]: rows `tok` elements apart; `otok` = H*D, the
// row stride of [B, S, H, D] tensors (out, dout) and the distance from q to k to v.
template <typename E, int D>
struct QkvSlices {
  std::size_t tok, otok, qoff;
  const E *q, *k, *v;
  __device__ __forceinline__ QkvSlices(const E* qkv, int b, int head, int S, int H)
      : tok(3ull * H * D),
        otok(static_cast<std::size_t>(H) * D),
        qoff(static_cast<std::size_t>(b) * S * tok + static_cast<std::size_t>(head) * D),
        q(qkv + qoff),
        k(q + otok),
        v(k + otok) {}
};

// The (batch, head) row of an fp32 [B, H, S] vector (lse, rowsum(dO o O)).
template <typename T>
__device__ __forceinline__ T* head_vector(T* v, int b, int head, int S, int H) {
  return v + (static_cast<std::size_t>(b) * H + head) * S;
}

// The backward passes' slices: QkvSlices, dO's rows ([B, S, H, D], row stride otok) and the
// (batch, head) rows of lse and Dvec.
template <typename E, int D>
struct BwdSlices : QkvSlices<E, D> {
  const E* dout;
  const float *lse, *dvec;
  __device__ __forceinline__ BwdSlices(const E* qkv, const E* dout_all, const float* lse_all,
                                       const float* dvec_all, int b, int head, int S, int H)
      : QkvSlices<E, D>(qkv, b, head, S, H),
        dout(dout_all + static_cast<std::size_t>(b) * S * this->otok + static_cast<std::size_t>(head) * D),
        lse(head_vector(lse_all, b, head, S, H)),
        dvec(head_vector(dvec_all, b, head, S, H)) {}
};

// Copies rows [row0, row0+ROWS) of a [S, D] slice whose rows lie `stride` elements apart into
// shared memory (row stride ld<D>()); rows at or past S become zeros. THREADS: the CTA's size.
template <int D, int ROWS, int THREADS, typename E>
__device__ __forceinline__ void load_rows(E* smem, const E* g, int row0, int S, std::size_t stride) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  static_assert((ROWS * kChunks) % THREADS == 0, "tile must split evenly over the CTA");
#pragma unroll
  for (int i = 0; i < ROWS * kChunks / THREADS; ++i) {
    const int idx = threadIdx.x + i * THREADS;
    const int r = idx / kChunks, c = idx % kChunks;
    const bool valid = row0 + r < S;
    const E* src = valid ? g + static_cast<std::size_t>(row0 + r) * stride + c * 8 : g;
    mma::cp_async_16(mma::smem_addr(smem + r * ld<D>() + c * 8), src, valid);
  }
}

// Step j of a K/V stream of n_tiles tiles of BN rows through the double buffers sK, sV
// ([2][BN][ld] each; tile 0 already issued): issues tile j+1 into the other buffer, waits for tile
// j, then syncs the CTA. Tile j lies in buffer j & 1.
template <int D, int BN, int THREADS, typename E>
__device__ __forceinline__ void kv_stream_step(E* sK, E* sV, const E* gk, const E* gv, int j, int n_tiles,
                                               int S, std::size_t tok) {
  const int n0 = j * BN;
  if (j + 1 < n_tiles) {
    const int nb = (j + 1) & 1;
    load_rows<D, BN, THREADS>(sK + nb * BN * ld<D>(), gk, n0 + BN, S, tok);
    load_rows<D, BN, THREADS>(sV + nb * BN * ld<D>(), gv, n0 + BN, S, tok);
    mma::cp_async_commit();
    mma::cp_async_wait<1>();
  } else {
    mma::cp_async_wait<0>();
  }
  __syncthreads();
}

// Lane `lane`'s ldmatrix.x4 row address (elements from the tile start) in a row-major tile of row
// stride LD: lanes 8i..8i+7 address the 8 rows of matrix i.
// A operand, rows row0..row0+15: (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15),
// (rows 8-15, k 8-15).
template <int LD>
__device__ __forceinline__ int frag_a_offset(int lane, int row0) {
  return (row0 + (lane & 15)) * LD + (lane >> 4) * 8;
}
// B operand stored with the n index as rows (K in Q K^T): (n 0-7, k 0-7), (n 0-7, k 8-15),
// (n 8-15, k 0-7), (n 8-15, k 8-15).
template <int LD>
__device__ __forceinline__ int frag_b_nrows_offset(int lane) {
  return ((lane & 7) + (lane >> 4) * 8) * LD + ((lane >> 3) & 1) * 8;
}
// B operand stored with the k index as rows (V in P V), read transposed: (k 0-7, n 0-7),
// (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15).
template <int LD>
__device__ __forceinline__ int frag_b_krows_offset(int lane) {
  return ((lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8;
}

// Where the m-tile products get A fragments: before k-slice k, a_frags.load(i, k, buf[i]) for
// every m-tile i; then a_frags.get(buf, i, k) is m-tile i's fragment.
// From registers: f[i][k] (no copy).
template <int MT, int KS>
struct RegFrags {
  const std::uint32_t (&f)[MT][KS][4];
  __device__ __forceinline__ void load(int, int, std::uint32_t (&)[4]) const {}
  template <class Buf>
  __device__ __forceinline__ const std::uint32_t (&get(const Buf&, int i, int k) const)[4] {
    return f[i][k];
  }
};
// From a row-major shared-memory tile of row stride LD with ldmatrix; `addr`: this lane's
// frag_a_offset address of m-tile 0 (m-tile i lies 16 rows further, k-slice k 16 columns).
template <int LD>
struct SmemFrags {
  std::uint32_t addr;
  __device__ __forceinline__ void load(int i, int k, std::uint32_t (&a)[4]) const {
    mma::ldmatrix_x4(a, addr + (i * 16 * LD + k * 16) * 2);
  }
  template <class Buf>
  __device__ __forceinline__ const std::uint32_t (&get(const Buf& buf, int i, int) const)[4] {
    return buf[i];
  }
};

// acc[i] += A_i B^T for MT m-tiles A_i [16 x D] (from a_frags) against B [8*NT x D], row-major with
// row stride ld<D>() (b_addr: this lane's frag_b_nrows_offset address). Every B fragment feeds MT
// mma.
template <typename E, int D, int MT, int NT, class AFrags>
__device__ __forceinline__ void mma_abt(float (&acc)[MT][NT][4], const AFrags& a_frags, std::uint32_t b_addr) {
  static_assert(NT % 2 == 0, "n-tiles come in pairs (one ldmatrix.x4 feeds two mma)");
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    std::uint32_t a[MT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i) a_frags.load(i, kk, a[i]);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      std::uint32_t b[4];
      mma::ldmatrix_x4(b, b_addr + (np * 16 * ld<D>() + kk * 16) * 2);
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        mma::mma_16816<E>(acc[i][2 * np], a_frags.get(a, i, kk), b[0], b[1]);
        mma::mma_16816<E>(acc[i][2 * np + 1], a_frags.get(a, i, kk), b[2], b[3]);
      }
    }
  }
}

// acc[i] += A_i B for MT m-tiles A_i [16 x K] (from a_frags, one k-slice at a time) and B [K x 8*NT]
// read transposed from a tile of row stride LDB (b_addr: this lane's frag_b_krows_offset address).
// Every B fragment feeds MT mma.
template <typename E, int LDB, int K, int MT, int NT, class AFrags>
__device__ __forceinline__ void mma_ab(float (&acc)[MT][NT][4], const AFrags& a_frags, std::uint32_t b_addr) {
  static_assert(NT % 2 == 0, "n-tiles come in pairs (one ldmatrix.x4 feeds two mma)");
#pragma unroll
  for (int ks = 0; ks < K / 16; ++ks) {
    std::uint32_t a[MT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i) a_frags.load(i, ks, a[i]);
#pragma unroll
    for (int dp = 0; dp < NT / 2; ++dp) {
      std::uint32_t b[4];
      mma::ldmatrix_x4_trans(b, b_addr + (ks * 16 * LDB + dp * 16) * 2);
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        mma::mma_16816<E>(acc[i][2 * dp], a_frags.get(a, i, ks), b[0], b[1]);
        mma::mma_16816<E>(acc[i][2 * dp + 1], a_frags.get(a, i, ks), b[2], b[3]);
      }
    }
  }
}

// One m-tile's [N][4] fragments as the [1][N][4] array the m-tile products take.
template <typename T, int N>
__device__ __forceinline__ auto& one_mtile(T (&f)[N][4]) {
  return reinterpret_cast<T(&)[1][N][4]>(f);
}

// acc = A[a_row0 .. a_row0+16, 0..D) * B[0 .. 8*NT, 0..D)^T (one m-tile, A and B in shared memory).
template <int D, int NT, typename E>
__device__ __forceinline__ void warp_abt(float (&acc)[NT][4], const E* sA, int a_row0, const E* sB) {
  const int lane = threadIdx.x & 31;
  zero(acc);
  const std::uint32_t a_addr = mma::smem_addr(sA + frag_a_offset<ld<D>()>(lane, a_row0));
  const std::uint32_t b_addr = mma::smem_addr(sB + frag_b_nrows_offset<ld<D>()>(lane));
  mma_abt<E, D, 1, NT>(one_mtile(acc), SmemFrags<ld<D>()>{a_addr}, b_addr);
}

// acc += P * B[0..K, 0..D), P given as K/16 A fragments (one m-tile).
template <int D, int K, typename E>
__device__ __forceinline__ void warp_pb(float (&acc)[D / 8][4], const std::uint32_t (&p)[K / 16][4], const E* sB) {
  const int lane = threadIdx.x & 31;
  mma_ab<E, ld<D>(), K, 1, D / 8>(one_mtile(acc), RegFrags<1, K / 16>{one_mtile(p)},
                               mma::smem_addr(sB + frag_b_krows_offset<ld<D>()>(lane)));
}

// C fragments of a 16 x K fp32 tile -> K/16 A fragments of E (n-tiles 2j, 2j+1 form k-slice j).
template <typename E, int K>
__device__ __forceinline__ void to_a_frags(std::uint32_t (&p)[K / 16][4], const float (&c)[K / 8][4]) {
#pragma unroll
  for (int j = 0; j < K / 16; ++j) {
    p[j][0] = mma::pack2<E>(c[2 * j][0], c[2 * j][1]);
    p[j][1] = mma::pack2<E>(c[2 * j][2], c[2 * j][3]);
    p[j][2] = mma::pack2<E>(c[2 * j + 1][0], c[2 * j + 1][1]);
    p[j][3] = mma::pack2<E>(c[2 * j + 1][2], c[2 * j + 1][3]);
  }
}

// Writes a warp's 16 x D fp32 accumulator (times `mul`) as E rows row0.. of a slice with row
// stride `stride`; rows at or past S are skipped. g and stride * sizeof(E) must be 16-byte aligned.
// The accumulator gives lane (gi, t) columns 8j + 2t, +1 of rows gi and gi + 8, so a row's 8
// columns 8j.. lie in the 4 lanes of a quad. Per group of four column blocks 4c.., the quad
// transposes its 4 x 4 packed pairs (two xor-shuffle stages, one per bit of t), after which lane t
// holds all 8 columns of block 4c + t and writes them with one 16-byte store: a warp's store then
// covers 64 contiguous bytes (two whole 32-byte sectors) of each of its 8 rows, where a 4-byte
// store covered 16 bytes of each.
template <int D, typename E>
__device__ __forceinline__ void store_rows(E* g, const float (&acc)[D / 8][4], int row0, int S, std::size_t stride,
                                           float mul) {
  static_assert(D % 32 == 0, "whole groups of four column blocks");
  const int lane = threadIdx.x & 31, gi = lane >> 2, t = lane & 3;
  const bool b0 = t & 1, b1 = t & 2;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + gi + 8 * h;
    E* dst = g + static_cast<std::size_t>(row) * stride;
#pragma unroll
    for (int c = 0; c < D / 32; ++c) {
      std::uint32_t v[4];  // v[k]: columns 8(4c + k) + 2t, +1
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = mma::pack2<E>(acc[4 * c + k][2 * h] * mul, acc[4 * c + k][2 * h + 1] * mul);
      // Bit 0 of t against bit 0 of k: a lane sends the pairs whose k differs in it from t, and
      // puts the partner's pair k ^ 1 in slot k.
      std::uint32_t r0 = __shfl_xor_sync(0xffffffffu, b0 ? v[0] : v[1], 1);
      std::uint32_t r1 = __shfl_xor_sync(0xffffffffu, b0 ? v[2] : v[3], 1);
      v[0] = b0 ? r0 : v[0];
      v[1] = b0 ? v[1] : r0;
      v[2] = b0 ? r1 : v[2];
      v[3] = b0 ? v[3] : r1;
      // Bit 1 likewise; slot k now holds lane k's pair of block 4c + t: columns 8(4c + t) + 2k, +1.
      r0 = __shfl_xor_sync(0xffffffffu, b1 ? v[0] : v[2], 2);
      r1 = __shfl_xor_sync(0xffffffffu, b1 ? v[1] : v[3], 2);
      v[0] = b1 ? r0 : v[0];
      v[1] = b1 ? r1 : v[1];
      v[2] = b1 ? v[2] : r0;
      v[3] = b1 ? v[3] : r1;
      if (row < S) store16(dst + 8 * (4 * c + t), make_uint4(v[0], v[1], v[2], v[3]));
    }
  }
}

// Shape validation shared by the launchers (throws cutrain::Error naming what is wrong).
void check_shape(const AttentionShape& shape, const char* who);

// The backward's small passes (kernels/attention_bwd.cu), around the sm90 dK/dV pass
// (kernels/attention_sm90/bwd.cu) and bench/attention_mma/'s baseline: the bytes of the Dvec part
// of the scratch (fp32 B*H*S rounded up to 256; the fast mode's dQ accumulator follows it);
// dvec = rowsum(dO o O), fp32 [B, H, S] (out and dout 16-byte aligned), and, where dq_acc is
// given, dq_acc = 0 (the fast mode's accumulator, before its reduce-adds); dqkv's q slot =
// dq_acc / sqrt(D) (16-byte aligned), dq_acc the fast mode's unscaled fp32 dS K [B, S, H, D].
std::size_t dvec_bytes(const AttentionShape& shape);
template <typename E>
void row_dot(cudaStream_t s, const E* out, const E* dout, float* dvec, const AttentionShape& shape,
             float* dq_acc = nullptr);
template <typename E>
void dq_convert(cudaStream_t s, const float* dq_acc, E* dqkv, const AttentionShape& shape);

}  // namespace cutrain::kernels::attn
