// @brief LayerNorm backward (see layernorm.cuh): d_sum and the deterministic dgamma/dbeta, from the
// LayerNorm input (layernorm_backward) or from its output (layernorm_backward_from_output).
//
// Every kernel is templated on the storage type T (bf16 or fp16, one instance each; fp32 math) and
// takes the source of x_hat as a template parameter (Src): the input `sum` with the
// row's mean and rstd, x_hat = (sum - mean) * rstd, or the output `y` with beta and gamma,
// x_hat = (y - beta) / gamma. The rest (row sums, d_sum, partials, finalize) is shared.
//
// Three paths, chosen by shape and alignment (layernorm_tiles.cuh):
// - BwdTeam (vector path, cols <= 8192): a row belongs to a team of TW warps, 2 vectors of 8 per
//   thread; teams are packed to a 256-thread block, so narrow rows do not mean few warps per SM.
//   Every team loads row k+U into registers before it reduces and stores row k (two rows in
//   flight per team, the load latency hidden behind the reduction and the stores); one
//   team-local named barrier per row (double-buffered slots), never a block barrier in the row
//   loop; gamma stays packed in registers for the whole kernel.
// - BlockRow (vector path, wider rows): a row per block of up to 512 threads, 4 vectors each.
//   (At these widths a 16-warp team would need more registers than a 512-thread block has.)
// - Scalar (cols % 8 != 0 or misaligned): a parameter-partials kernel, then one block per row.
// dgamma/dbeta: each block (unit) of the main grid owns a fixed set of rows and writes one fp32
// partial row per column to scratch ([2][P][cols]: dgamma partials then dbeta partials); a
// finalize kernel sums the partials in block order. P is a function of (rows, cols) only, so the
// bits do not depend on the device.
#include <algorithm>

#include "kernels/layernorm.cuh"
#include "kernels/layernorm_tiles.cuh"
#include "runtime/error.h"

namespace cutrain::kernels {
namespace {

using namespace ln;

constexpr int kGridSms = 132;  // H100/H200 SM count: sizes the team grid only (bits are device-independent)

// Partials of the BlockRow and Scalar paths: bounded so the finalize stays small.
int max_partials(int cols) { return cols <= 4096 ? 512 : 256; }
int row_partials(int rows, int cols) { return std::min(rows, max_partials(cols)); }

// BwdTeam: warps per team (a power of two), teams per block, blocks in the grid.
int team_warps(int cols) {
  const int need = ceil_div(cols / kBf16PerVec, BwdTeam::kVpt * kWarpSize);
  int tw = 1;
  while (tw < need) tw *= 2;
  return tw;
}
int teams_per_block(int tw) { return std::min(8, std::max(1, BwdTeam::kBlockWarps / tw)); }
int team_partials(int rows, int cols) {
  const int tw = team_warps(cols), rpb = teams_per_block(tw);
  const int target = kGridSms * BwdTeam::kWarpsPerSm / (tw * rpb);
  // At least kDepth + 1 rows per team, so the prefetch has something to overlap.
  return std::max(1, std::min(target, ceil_div(rows, (BwdTeam::kDepth + 1) * rpb)));
}

// Barrier of team `team` of RPB (TT threads each): bar.sync on barrier 1 + team (0 is
// __syncthreads). Immediate ids, so ptxas reserves RPB + 1 barriers, not all 16 (on Hopper 64
// barriers per SM are shared by its blocks: 16 per block would cap residency at 4 blocks).
template <int RPB, int TT>
__device__ __forceinline__ void team_barrier(int team) {
  static_assert(RPB <= 8, "team_barrier: at most 8 teams per block");
  if constexpr (RPB == 1) {
    __syncthreads();
  } else {
    switch (team) {
      case 0: asm volatile("bar.sync 1, %0;" ::"n"(TT) : "memory"); break;
      case 1: asm volatile("bar.sync 2, %0;" ::"n"(TT) : "memory"); break;
      case 2: asm volatile("bar.sync 3, %0;" ::"n"(TT) : "memory"); break;
      case 3: asm volatile("bar.sync 4, %0;" ::"n"(TT) : "memory"); break;
      case 4: asm volatile("bar.sync 5, %0;" ::"n"(TT) : "memory"); break;
      case 5: asm volatile("bar.sync 6, %0;" ::"n"(TT) : "memory"); break;
      case 6: asm volatile("bar.sync 7, %0;" ::"n"(TT) : "memory"); break;
      default: asm volatile("bar.sync 8, %0;" ::"n"(TT) : "memory"); break;
    }
  }
}

template <typename T>
__device__ __forceinline__ void unpack8(const uint4& raw, float f[8]) {
  load_x8(reinterpret_cast<const T*>(&raw), f);  // register-to-register: no memory access
}

// Where x_hat comes from: the LayerNorm input (with the row's mean), or the output (with beta;
// DeepSpeed's normalize_invertible). Mean is not read for Output, beta not for Input.
enum class Src { Input, Output };

// x_hat of one value: v is the LayerNorm input (Input: m, r the row's mean and rstd) or output
// (Output: g, bt its column's gamma and beta). The output's division is the fast one (about 2 ulp
// of fp32, two instructions instead of IEEE division's sequence): y is T, whose rounding is
// (or fp16) 2^13 or more times coarser. (With IEEE division ptxas spills in the team kernels at 128 registers.)
template <Src S>
__device__ __forceinline__ float xhat1(float v, float g, float bt, float m, float r) {
  if constexpr (S == Src::Input) return (v - m) * r;
  else return __fdividef(v - bt, g);
}

// The per-element math every vector path shares, for one vector of 8 (g: gamma, d: dy, xv: the
// input or output by S, bt: beta (Output only), m, r: the row's mean (Input only) and rstd).
// Pass 1: the row sums s1 = sum(dy gamma), s2 = sum(dy gamma xhat) and the dgamma/dbeta
// accumulators of the vector.
template <Src S>
__device__ __forceinline__ void bwd_accumulate8(const float g[8], const float d[8], const float xv[8],
                                                const float bt[8], float m, float r, float& s1, float& s2,
                                                float acc_g[8], float acc_b[8]) {
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float xh = xhat1<S>(xv[k], g[k], bt[k], m, r);
    const float dxh = d[k] * g[k];
    s1 += dxh;
    s2 += dxh * xh;
    acc_g[k] += d[k] * xh;
    acc_b[k] += d[k];
  }
}
// Pass 2: the input gradient o = rstd (dy gamma - a - xhat b) (+ e, the d_extra vector, when
// `extra`), with a = s1 / cols and b = s2 / cols.
template <Src S>
__device__ __forceinline__ void bwd_dx8(const float g[8], const float d[8], const float xv[8], const float bt[8],
                                        const float e[8], float m, float r, float a, float b, bool extra, float o[8]) {
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float xh = xhat1<S>(xv[k], g[k], bt[k], m, r);
    o[k] = r * (d[k] * g[k] - a - xh * b);
    if (extra) o[k] += e[k];
  }
}

// Tile::kVpt vectors per thread, Tile::kDepth rows prefetched ahead; TW warps per team, RPB teams
// per block, MINB blocks per SM for the register budget. `xs` is the LayerNorm input (S = Input,
// with `mean`) or output (S = Output, with `beta`); the pointer S does not read may be null.
template <Src S, class Tile, typename T, int TW, int RPB, int MINB>
__global__ void __launch_bounds__(TW * RPB * kWarpSize, MINB)
    ln_bwd_team(const T* dy, const T* __restrict__ xs, const float* __restrict__ mean,
                const float* __restrict__ rstd, const T* __restrict__ gamma, const T* __restrict__ beta,
                const T* __restrict__ d_extra, T* d_sum, float* __restrict__ partial, int rows, int cols) {
  // dy and d_sum may alias: a thread reads each element (of this row or the next) before it
  // writes the same element, so neither is __restrict__.
  constexpr int kVpt = Tile::kVpt, DEPTH = Tile::kDepth;
  constexpr int TT = TW * kWarpSize;
  // Team sums: [team][parity][warp][s1, s2]. Two parities, so the slot written for row k+1
  // cannot be one a slower thread of the team is still reading for row k (one barrier per row).
  __shared__ float red[RPB * 2 * TW * 2];
  constexpr int kCombine = RPB > 1 ? TW * kVpt * kWarpSize * kBf16PerVec : 1;  // widest row for this TW
  __shared__ float sg[kCombine], sb[kCombine];

  const int team = threadIdx.x / TT, t = threadIdx.x % TT;
  const int warp = t / kWarpSize, lane = t % kWarpSize;
  const int nvec = cols / kBf16PerVec;
  const int U = gridDim.x * RPB;  // teams in the grid; team u owns rows u, u + U, ...

  bool on[kVpt];
  int off[kVpt];  // column of the vector within a row (32-bit: fewer registers)
  uint4 graw[kVpt], braw[kVpt];  // gamma, and beta for Output (unused, so not kept, for Input)
#pragma unroll
  for (int i = 0; i < kVpt; ++i) {
    const int vi = t + i * TT;
    on[i] = vi < nvec;
    off[i] = vi * kBf16PerVec;
    graw[i] = on[i] ? load16<Load::ReadOnly>(gamma + off[i]) : make_uint4(0, 0, 0, 0);
    braw[i] = S == Src::Output && on[i] ? load16<Load::ReadOnly>(beta + off[i]) : make_uint4(0, 0, 0, 0);
  }
  float acc_g[kVpt][8], acc_b[kVpt][8];
#pragma unroll
  for (int i = 0; i < kVpt; ++i)
#pragma unroll
    for (int k = 0; k < 8; ++k) acc_g[i][k] = acc_b[i][k] = 0.f;

  // Rows in flight: slot d holds row + d*U (loaded DEPTH rows ahead of its use).
  uint4 qdy[DEPTH][kVpt], qx[DEPTH][kVpt];
  float qm[DEPTH], qr[DEPTH];
#pragma unroll
  for (int d = 0; d < DEPTH; ++d) {
    qm[d] = qr[d] = 0.f;
#pragma unroll
    for (int i = 0; i < kVpt; ++i) qdy[d][i] = qx[d][i] = make_uint4(0, 0, 0, 0);
  }
  auto fetch = [&](int d, int r) {
    const std::size_t base = static_cast<std::size_t>(r) * cols;
#pragma unroll
    for (int i = 0; i < kVpt; ++i) {
      if (on[i]) {
        qdy[d][i] = load16(dy + base + off[i]);
        qx[d][i] = load16<Load::Streaming>(xs + base + off[i]);
      }
    }
    qm[d] = S == Src::Input ? mean[r] : 0.f;
    qr[d] = rstd[r];
  };

  int row = blockIdx.x * RPB + team;
#pragma unroll
  for (int d = 0; d < DEPTH; ++d)
    if (row + d * U < rows) fetch(d, row + d * U);
  int parity = 0;
  for (; row < rows; row += U) {
    uint4 dyc[kVpt], xc[kVpt], er[kVpt];
#pragma unroll
    for (int i = 0; i < kVpt; ++i) {
      dyc[i] = qdy[0][i];
      xc[i] = qx[0][i];
    }
    const float m = qm[0], r = qr[0];
#pragma unroll
    for (int d = 0; d + 1 < DEPTH; ++d) {
      qm[d] = qm[d + 1];
      qr[d] = qr[d + 1];
#pragma unroll
      for (int i = 0; i < kVpt; ++i) {
        qdy[d][i] = qdy[d + 1][i];
        qx[d][i] = qx[d + 1][i];
      }
    }
    const std::size_t base = static_cast<std::size_t>(row) * cols;
    if (row + DEPTH * U < rows) fetch(DEPTH - 1, row + DEPTH * U);  // team-uniform
#pragma unroll
    for (int i = 0; i < kVpt; ++i)
      er[i] = (d_extra && on[i]) ? load16<Load::Streaming>(d_extra + base + off[i]) : make_uint4(0, 0, 0, 0);

    float s1 = 0.f, s2 = 0.f;
#pragma unroll
    for (int i = 0; i < kVpt; ++i) {
      if (on[i]) {
        float g[8], d[8], xv[8], bt[8];
        unpack8<T>(graw[i], g);
        unpack8<T>(dyc[i], d);
        unpack8<T>(xc[i], xv);
        unpack8<T>(braw[i], bt);
        bwd_accumulate8<S>(g, d, xv, bt, m, r, s1, s2, acc_g[i], acc_b[i]);
      }
    }
    s1 = warp_sum(s1);
    s2 = warp_sum(s2);
    if constexpr (TW > 1) {
      float* slot = red + (team * 2 + parity) * TW * 2;
      if (lane == 0) {
        slot[2 * warp] = s1;
        slot[2 * warp + 1] = s2;
      }
      team_barrier<RPB, TT>(team);
      s1 = s2 = 0.f;
#pragma unroll
      for (int w = 0; w < TW; ++w) {  // warp order: the same bits in every thread
        s1 += slot[2 * w];
        s2 += slot[2 * w + 1];
      }
      parity ^= 1;
    }
    const float a = s1 / cols, b = s2 / cols;
#pragma unroll
    for (int i = 0; i < kVpt; ++i) {
      if (on[i]) {
        float g[8], d[8], xv[8], bt[8], e[8], o[8];
        unpack8<T>(graw[i], g);
        unpack8<T>(dyc[i], d);
        unpack8<T>(xc[i], xv);
        unpack8<T>(braw[i], bt);
        unpack8<T>(er[i], e);  // zeros without d_extra
        bwd_dx8<S>(g, d, xv, bt, e, m, r, a, b, d_extra != nullptr, o);
        store_x8(d_sum + base + off[i], o);
      }
    }
  }

  float* pg = partial;
  float* pb = partial + static_cast<std::size_t>(gridDim.x) * cols;
  const std::size_t prow = static_cast<std::size_t>(blockIdx.x) * cols;
  if constexpr (RPB == 1) {
#pragma unroll
    for (int i = 0; i < kVpt; ++i) {
      if (on[i]) {
        store_f32x4(pg + prow + off[i], acc_g[i]);
        store_f32x4(pg + prow + off[i] + 4, acc_g[i] + 4);
        store_f32x4(pb + prow + off[i], acc_b[i]);
        store_f32x4(pb + prow + off[i] + 4, acc_b[i] + 4);
      }
    }
  } else {
    // Teams in order 0..RPB-1 (fixed), then one coalesced partial row per block.
    for (int w = 0; w < RPB; ++w) {
      if (team == w) {
#pragma unroll
        for (int i = 0; i < kVpt; ++i) {
          if (on[i]) {
#pragma unroll
            for (int k = 0; k < 8; ++k) {
              const int c = off[i] + k;
              sg[c] = w == 0 ? acc_g[i][k] : sg[c] + acc_g[i][k];
              sb[c] = w == 0 ? acc_b[i][k] : sb[c] + acc_b[i][k];
            }
          }
        }
      }
      __syncthreads();
    }
    for (int c = threadIdx.x * 4; c < cols; c += blockDim.x * 4) {
      store_f32x4(pg + prow + c, sg + c);
      store_f32x4(pb + prow + c, sb + c);
    }
  }
}

// BlockRow: unit (block) u handles rows u, u + U, ... and accumulates dgamma/dbeta for its
// columns in registers; one partial row per block. xs, mean, beta: as ln_bwd_team. (The Output
// instance is at the 128-register cap with about 100 bytes spilled to L1, ptxas sm_90; Input has
// none. Only rows wider than 8192 columns come here.)
template <Src S, class Tile, typename T>
__global__ void __launch_bounds__(Tile::kMaxThreads, 1)
    ln_bwd_block_row(const T* dy, const T* __restrict__ xs, const float* __restrict__ mean,
                     const float* __restrict__ rstd, const T* __restrict__ gamma, const T* __restrict__ beta,
                     const T* __restrict__ d_extra, T* d_sum, float* __restrict__ partial, int rows, int cols) {
  // dy and d_sum may alias (each element is read before the same thread writes it): no __restrict__.
  constexpr int VPT = Tile::kVpt;
  __shared__ float red[2 * 32];
  const int team = blockDim.x;
  const int t = threadIdx.x;
  const int unit = blockIdx.x;
  const int units = gridDim.x;
  const int nvec = cols / kBf16PerVec;

  float acc_g[VPT][8], acc_b[VPT][8];
#pragma unroll
  for (int i = 0; i < VPT; ++i)
#pragma unroll
    for (int k = 0; k < 8; ++k) acc_g[i][k] = acc_b[i][k] = 0.f;

  for (int row = unit; row < rows; row += units) {
    const std::size_t base = static_cast<std::size_t>(row) * cols;
    const T* dy_row = dy + base;
    const T* x_row = xs + base;
    const float m = S == Src::Input ? mean[row] : 0.f, r = rstd[row];
    uint4 dy_raw[VPT], x_raw[VPT];  // kept packed: half the registers of fp32
    float s1 = 0.f, s2 = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int vi = t + i * team;
      if (vi < nvec) {
        const int off = vi * kBf16PerVec;  // within the row: 32-bit math keeps registers free
        dy_raw[i] = load16(dy_row + off);
        x_raw[i] = load16<Load::Streaming>(x_row + off);
        float g[8], d[8], xv[8], bt[8] = {};
        load_x8<T, Load::ReadOnly>(gamma + off, g);
        if constexpr (S == Src::Output) load_x8<T, Load::ReadOnly>(beta + off, bt);
        load_x8(reinterpret_cast<const T*>(&dy_raw[i]), d);
        load_x8(reinterpret_cast<const T*>(&x_raw[i]), xv);
        bwd_accumulate8<S>(g, d, xv, bt, m, r, s1, s2, acc_g[i], acc_b[i]);
      }
    }
    const float2 tot = block_sum2(make_float2(s1, s2), red);
    const float mean_dxh = tot.x / cols, mean_dxh_xh = tot.y / cols;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int vi = t + i * team;
      if (vi < nvec) {
        const int off = vi * kBf16PerVec;
        float g[8], d[8], xv[8], bt[8] = {}, e[8];
        load_x8<T, Load::ReadOnly>(gamma + off, g);
        if constexpr (S == Src::Output) load_x8<T, Load::ReadOnly>(beta + off, bt);
        load_x8(reinterpret_cast<const T*>(&dy_raw[i]), d);
        load_x8(reinterpret_cast<const T*>(&x_raw[i]), xv);
        if (d_extra) load_x8<T, Load::Streaming>(d_extra + base + off, e);
        float o[8];
        bwd_dx8<S>(g, d, xv, bt, e, m, r, mean_dxh, mean_dxh_xh, d_extra != nullptr, o);
        store_x8(d_sum + base + off, o);
      }
    }
  }

  float* pg = partial;
  float* pb = partial + static_cast<std::size_t>(gridDim.x) * cols;
  const std::size_t prow = static_cast<std::size_t>(blockIdx.x) * cols;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int vi = t + i * team;
    if (vi < nvec) {
      const std::size_t off = prow + static_cast<std::size_t>(vi) * kBf16PerVec;
      store_f32x4(pg + off, acc_g[i]);
      store_f32x4(pg + off + 4, acc_g[i] + 4);
      store_f32x4(pb + off, acc_b[i]);
      store_f32x4(pb + off + 4, acc_b[i] + 4);
    }
  }
}

// Backward, scalar path, parameter gradients: partial p sums rows [p*chunk, (p+1)*chunk) for 32
// columns; block (32, 8): ty strides the rows, then the 8 lanes are combined in ty order.
// Runs BEFORE ln_bwd_scalar_rows because d_sum may overwrite dy. xs, mean, beta: as ln_bwd_team.
template <Src S, typename T>
__global__ void __launch_bounds__(kWarpSize * Scalar::kPartialRows)
    ln_bwd_scalar_params(const T* __restrict__ dy, const T* __restrict__ xs, const float* __restrict__ mean,
                         const float* __restrict__ rstd, const T* __restrict__ gamma,
                         const T* __restrict__ beta, float* __restrict__ partial, int rows, int cols) {
  __shared__ float sg[Scalar::kPartialRows][kWarpSize], sb[Scalar::kPartialRows][kWarpSize];
  const int c = blockIdx.x * kWarpSize + threadIdx.x;
  const int p = blockIdx.y, P = gridDim.y;
  const int chunk = ceil_div(rows, P);
  const int r0 = p * chunk, r1 = min(rows, r0 + chunk);
  float g = 0.f, b = 0.f;
  if (c < cols) {
    const float gc = S == Src::Output ? to_f32(gamma[c]) : 0.f;
    const float bc = S == Src::Output ? to_f32(beta[c]) : 0.f;
    for (int row = r0 + threadIdx.y; row < r1; row += Scalar::kPartialRows) {
      const std::size_t i = static_cast<std::size_t>(row) * cols + c;
      const float d = to_f32(dy[i]);
      const float m = S == Src::Input ? mean[row] : 0.f;
      g += d * xhat1<S>(to_f32(xs[i]), gc, bc, m, rstd[row]);
      b += d;
    }
  }
  sg[threadIdx.y][threadIdx.x] = g;
  sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    for (int k = 1; k < Scalar::kPartialRows; ++k) {
      g += sg[k][threadIdx.x];
      b += sb[k][threadIdx.x];
    }
    partial[static_cast<std::size_t>(p) * cols + c] = g;
    partial[static_cast<std::size_t>(P + p) * cols + c] = b;
  }
}

// Backward, scalar path, input gradient: one block per row, two passes. xs, mean, beta: as ln_bwd_team.
template <Src S, typename T>
__global__ void __launch_bounds__(Scalar::kThreads)
    ln_bwd_scalar_rows(const T* dy, const T* __restrict__ xs, const float* __restrict__ mean,
                       const float* __restrict__ rstd, const T* __restrict__ gamma, const T* __restrict__ beta,
                       const T* __restrict__ d_extra, T* d_sum, int rows, int cols) {
  __shared__ float red[2 * 32];
  const int row = blockIdx.x;
  const std::size_t base = static_cast<std::size_t>(row) * cols;
  const float m = S == Src::Input ? mean[row] : 0.f, r = rstd[row];
  auto xhat = [&](int c) {
    const float bc = S == Src::Output ? to_f32(beta[c]) : 0.f;
    return xhat1<S>(to_f32(xs[base + c]), to_f32(gamma[c]), bc, m, r);
  };
  float s1 = 0.f, s2 = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const float dxh = to_f32(dy[base + c]) * to_f32(gamma[c]);
    s1 += dxh;
    s2 += dxh * xhat(c);
  }
  const float2 tot = block_sum2(make_float2(s1, s2), red);
  const float a = tot.x / cols, b = tot.y / cols;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const float xh = xhat(c);
    float o = r * (to_f32(dy[base + c]) * to_f32(gamma[c]) - a - xh * b);
    if (d_extra) o += to_f32(d_extra[base + c]);
    d_sum[base + c] = from_f32<T>(o);
  }
}

// Finalize: dgamma[c] (+)= Σ_p partial_g[p][c] in p order, likewise dbeta. Block (32, kFinalLanes):
// lane ty sums partials ty, ty + kFinalLanes, ...; the lane sums are then combined in ty order.
template <int kFinalLanes, typename TParam>
__global__ void __launch_bounds__(kWarpSize * kFinalLanes)
    ln_param_finalize(const float* __restrict__ partial, int P, int cols, TParam* __restrict__ dgamma,
                      TParam* __restrict__ dbeta, bool accumulate) {
  __shared__ float sg[kFinalLanes][kWarpSize], sb[kFinalLanes][kWarpSize];
  const int c = blockIdx.x * kWarpSize + threadIdx.x;
  float g = 0.f, b = 0.f;
  if (c < cols) {
#pragma unroll 4
    for (int p = threadIdx.y; p < P; p += kFinalLanes) {
      g += partial[static_cast<std::size_t>(p) * cols + c];
      b += partial[static_cast<std::size_t>(P + p) * cols + c];
    }
  }
  sg[threadIdx.y][threadIdx.x] = g;
  sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    for (int k = 1; k < kFinalLanes; ++k) {
      g += sg[k][threadIdx.x];
      b += sb[k][threadIdx.x];
    }
    if (accumulate) {
      g += to_f32(dgamma[c]);
      b += to_f32(dbeta[c]);
    }
    dgamma[c] = from_f32<TParam>(g);
    dbeta[c] = from_f32<TParam>(b);
  }
}

template <class Tile, typename TParam>
void launch_finalize(cudaStream_t s, const float* partial, int P, int cols, void* dgamma, void* dbeta,
                     bool accumulate) {
  ln_param_finalize<Tile::kFinalLanes, TParam><<<dim3(ceil_div(cols, kWarpSize)), dim3(kWarpSize, Tile::kFinalLanes),
                                                 0, s>>>(partial, P, cols, static_cast<TParam*>(dgamma),
                                                         static_cast<TParam*>(dbeta), accumulate);
  CUTRAIN_LAUNCH_CHECK("ln_param_finalize");
}
template <class Tile>
void launch_finalize(cudaStream_t s, DType type, const float* partial, int P, int cols, void* dgamma, void* dbeta,
                     bool accumulate) {
  if (type == DType::F32) launch_finalize<Tile, float>(s, partial, P, cols, dgamma, dbeta, accumulate);
  else if (type == DType::F16) launch_finalize<Tile, __half>(s, partial, P, cols, dgamma, dbeta, accumulate);
  else launch_finalize<Tile, __nv_bfloat16>(s, partial, P, cols, dgamma, dbeta, accumulate);
}

template <Src S, int TW, typename T>
void launch_team(cudaStream_t s, int blocks, const T* dy, const T* xs, const float* mean, const float* rstd,
                 const T* gamma, const T* beta, const T* d_extra, T* d_sum, float* partial, int rows,
                 int cols) {
  using BT = BwdTeam;
  constexpr int RPB = TW >= BT::kBlockWarps ? 1 : (BT::kBlockWarps / TW > 8 ? 8 : BT::kBlockWarps / TW);
  constexpr int kThreadsPerBlock = TW * RPB * kWarpSize;
  // Two blocks per SM (<= 128 registers) at 256 threads; 512-thread teams (TW = 16) keep 128
  // registers and one block per SM.
  constexpr int MINB = kThreadsPerBlock <= 256 ? 2 : 1;
  ln_bwd_team<S, BT, T, TW, RPB, MINB><<<blocks, kThreadsPerBlock, 0, s>>>(dy, xs, mean, rstd, gamma, beta, d_extra,
                                                                       d_sum, partial, rows, cols);
  CUTRAIN_LAUNCH_CHECK("ln_bwd_team");
}

// Both public entries: checks (named after `what`), then the path by shape and alignment.
// `xs` is `sum` (Input) or `y` (Output); mean is read for Input only, beta for Output only.
template <Src S, typename T>
void backward(const char* what, cudaStream_t s, const T* dy, const T* xs, const float* mean, const float* rstd,
              const T* gamma, const T* beta, const T* d_extra, T* d_sum, void* dgamma, void* dbeta,
              DType param_grad_type, bool accumulate, void* scratch, int rows, int cols) {
  check_shape(what, rows, cols);
  if constexpr (S == Src::Input) {
    CUTRAIN_CHECK(dy && xs && mean && rstd && gamma && d_sum && dgamma && dbeta && scratch, what,
                  ": dy, sum, mean, rstd, gamma, d_sum, dgamma, dbeta and scratch must be non-null");
  } else {
    CUTRAIN_CHECK(dy && xs && rstd && gamma && beta && d_sum && dgamma && dbeta && scratch, what,
                  ": dy, y, rstd, gamma, beta, d_sum, dgamma, dbeta and scratch must be non-null");
  }
  CUTRAIN_CHECK(param_grad_type == DType::BF16 || param_grad_type == DType::F16 ||
                    param_grad_type == DType::F32,
                what, ": dgamma/dbeta must be bfloat16, float16 or float32, got ", dtype_name(param_grad_type));
  CUTRAIN_CHECK(is_aligned16(scratch), what, ": scratch must be 16-byte aligned");
  float* partial = static_cast<float*>(scratch);
  // beta is null for Input (all_aligned skips null pointers).
  const bool vec = cols % kBf16PerVec == 0 && all_aligned({dy, xs, gamma, beta, d_extra, d_sum});
  if (vec && use_bwd_team(cols)) {
    const int P = team_partials(rows, cols);
    switch (team_warps(cols)) {
      case 1: launch_team<S, 1>(s, P, dy, xs, mean, rstd, gamma, beta, d_extra, d_sum, partial, rows, cols); break;
      case 2: launch_team<S, 2>(s, P, dy, xs, mean, rstd, gamma, beta, d_extra, d_sum, partial, rows, cols); break;
      case 4: launch_team<S, 4>(s, P, dy, xs, mean, rstd, gamma, beta, d_extra, d_sum, partial, rows, cols); break;
      case 8: launch_team<S, 8>(s, P, dy, xs, mean, rstd, gamma, beta, d_extra, d_sum, partial, rows, cols); break;
      default:
        launch_team<S, 16>(s, P, dy, xs, mean, rstd, gamma, beta, d_extra, d_sum, partial, rows, cols);
        break;
    }
    launch_finalize<BwdTeam>(s, param_grad_type, partial, P, cols, dgamma, dbeta, accumulate);
    return;
  }
  const int P = row_partials(rows, cols);
  if (vec) {
    ln_bwd_block_row<S, BlockRow, T><<<P, block_row_threads(cols), 0, s>>>(dy, xs, mean, rstd, gamma, beta, d_extra,
                                                                       d_sum, partial, rows, cols);
    CUTRAIN_LAUNCH_CHECK("ln_bwd_block_row");
    launch_finalize<BlockRow>(s, param_grad_type, partial, P, cols, dgamma, dbeta, accumulate);
  } else {
    ln_bwd_scalar_params<S, T><<<dim3(ceil_div(cols, kWarpSize), P), dim3(kWarpSize, Scalar::kPartialRows), 0, s>>>(
        dy, xs, mean, rstd, gamma, beta, partial, rows, cols);
    CUTRAIN_LAUNCH_CHECK("ln_bwd_scalar_params");
    ln_bwd_scalar_rows<S, T><<<rows, Scalar::kThreads, 0, s>>>(dy, xs, mean, rstd, gamma, beta, d_extra, d_sum, rows,
                                                            cols);
    CUTRAIN_LAUNCH_CHECK("ln_bwd_scalar_rows");
    launch_finalize<Scalar>(s, param_grad_type, partial, P, cols, dgamma, dbeta, accumulate);
  }
}

}  // namespace

std::size_t layernorm_backward_scratch_bytes(int rows, int cols) {
  check_shape("layernorm_backward_scratch_bytes", rows, cols);
  // The vector path's partials, or the scalar path's (pointer alignment is not known here).
  const int vec = use_bwd_team(cols) ? team_partials(rows, cols) : row_partials(rows, cols);
  const int P = std::max(vec, row_partials(rows, cols));
  return 2 * static_cast<std::size_t>(P) * cols * sizeof(float);
}

template <typename T>
void layernorm_backward(cudaStream_t s, const T* dy, const nondeduced_t<T>* sum, const float* mean,
                        const float* rstd, const nondeduced_t<T>* gamma, const nondeduced_t<T>* d_extra, T* d_sum, void* dgamma, void* dbeta,
                        DType param_grad_type, bool accumulate, void* scratch, int rows, int cols) {
  backward<Src::Input, T>("layernorm_backward", s, dy, sum, mean, rstd, gamma, nullptr, d_extra, d_sum, dgamma, dbeta,
                       param_grad_type, accumulate, scratch, rows, cols);
}

template <typename T>
void layernorm_backward_from_output(cudaStream_t s, const T* dy, const nondeduced_t<T>* y, const float* rstd,
                                    const nondeduced_t<T>* gamma, const nondeduced_t<T>* beta,
                                    const nondeduced_t<T>* d_extra, T* d_sum,
                                    void* dgamma, void* dbeta, DType param_grad_type, bool accumulate, void* scratch,
                                    int rows, int cols) {
  backward<Src::Output, T>("layernorm_backward_from_output", s, dy, y, nullptr, rstd, gamma, beta, d_extra, d_sum,
                        dgamma, dbeta, param_grad_type, accumulate, scratch, rows, cols);
}

template void layernorm_backward<bf16>(cudaStream_t, const bf16*, const bf16*, const float*, const float*, const bf16*,
                                       const bf16*, bf16*, void*, void*, DType, bool, void*, int, int);
template void layernorm_backward_from_output<bf16>(cudaStream_t, const bf16*, const bf16*, const float*, const bf16*,
                                                   const bf16*, const bf16*, bf16*, void*, void*, DType, bool, void*,
                                                   int, int);
template void layernorm_backward<f16>(cudaStream_t, const f16*, const f16*, const float*, const float*, const f16*,
                                       const f16*, f16*, void*, void*, DType, bool, void*, int, int);
template void layernorm_backward_from_output<f16>(cudaStream_t, const f16*, const f16*, const float*, const f16*,
                                                   const f16*, const f16*, f16*, void*, void*, DType, bool, void*,
                                                   int, int);

}  // namespace cutrain::kernels
