// LayerNorm backward, version 2 (see layernorm_bwd_v2.h and layernorm.cuh).
//
// Why a second version: v1's block-per-row path (cols > 1024) loads a row, waits on two block
// barriers, stores, and only then loads the next row, so each block has one row in flight and
// its SM idles between rows (0.56 of copy bandwidth at 16384x4096). v2:
// - a row belongs to a team of TW warps, 2 vectors of 8 per thread (TW = 8 at 4096 columns);
//   teams are packed RPB to a 256-thread block, so narrow rows do not mean few warps per SM;
// - every team loads row k+U into registers before it reduces and stores row k: two rows in
//   flight per team, the load latency hidden behind the reduction and the stores;
// - one team-local named barrier per row (double-buffered slots), never a block barrier in the
//   row loop; gamma stays packed in registers for the whole kernel.
// dgamma/dbeta: fp32 accumulators per thread, combined over the block's teams in team order in
// shared memory, one partial row per block; a finalize kernel sums the partials in block order.
// The grid is a function of (rows, cols) only, so the bits do not depend on the device.
#include "kernels/layernorm_bwd_v2.h"

#include <algorithm>

#include "kernels/common/reduce.cuh"
#include "kernels/common/vec.cuh"
#include "runtime/check.h"

namespace cutrain::kernels::detail {
namespace {

// Per version: vectors per thread, warps per block (teams are packed up to this), rows prefetched,
// and the residency the grid aims for. v2: 2 vectors, 256-thread blocks, 1 row ahead, 16 warps/SM
// (2 blocks at <= 128 registers). v3: 1 vector, 512-thread blocks, 2 rows ahead, 32 warps/SM
// (2 blocks at <= 64 registers): the same registers per SM, twice the rows in flight.
struct Cfg {
  int vpt, block_warps, depth, warps_per_sm, max_team_warps;
};
constexpr Cfg kV2{2, 8, 1, 16, 16};  // 16 warps x 32 lanes x 2 vectors x 8 = 8192 columns
constexpr Cfg kV3{1, 16, 2, 32, 16}; // 16 x 32 x 1 x 8 = 4096 columns (wider rows: v2)
constexpr int kGridSms = 132;     // H100/H200 SM count: sizes the grid only (bits are device-independent)
constexpr int kFinalLanes = 32;   // finalize: partial rows summed in parallel per column

int team_warps(const Cfg& g, int cols) {
  const int need = ceil_div(cols / kBf16PerVec, g.vpt * kWarpSize);
  int tw = 1;
  while (tw < need) tw *= 2;
  return tw;
}
int teams_per_block(const Cfg& g, int tw) { return std::min(8, std::max(1, g.block_warps / tw)); }
int grid_blocks(const Cfg& g, int rows, int cols) {
  const int tw = team_warps(g, cols), rpb = teams_per_block(g, tw);
  const int target = kGridSms * g.warps_per_sm / (tw * rpb);
  // At least DEPTH + 1 rows per team, so the prefetch has something to overlap.
  return std::max(1, std::min(target, ceil_div(rows, (g.depth + 1) * rpb)));
}
bool fits(const Cfg& g, int cols) { return cols <= g.max_team_warps * kWarpSize * g.vpt * kBf16PerVec; }

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

__device__ __forceinline__ void unpack8(const uint4& raw, float f[8]) {
  load_bf16x8(reinterpret_cast<const bf16*>(&raw), f);  // register-to-register: no memory access
}

// VPT vectors per thread, DEPTH rows prefetched ahead (v2: 2 and 1; v3: 1 and 2, twice the warps
// at half the registers each), MINB blocks per SM for the register budget.
template <int TW, int RPB, int kVpt, int DEPTH, int MINB>
__global__ void __launch_bounds__(TW * RPB * kWarpSize, MINB)
    ln_bwd_team(const bf16* dy, const bf16* __restrict__ sum, const float* __restrict__ mean,
                const float* __restrict__ rstd, const bf16* __restrict__ gamma, const bf16* __restrict__ d_extra,
                bf16* d_sum, float* __restrict__ partial, int rows, int cols) {
  // dy and d_sum may alias: a thread reads each element (of this row or the next) before it
  // writes the same element, so neither is __restrict__.
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
  uint4 graw[kVpt];
#pragma unroll
  for (int i = 0; i < kVpt; ++i) {
    const int vi = t + i * TT;
    on[i] = vi < nvec;
    off[i] = vi * kBf16PerVec;
    graw[i] = on[i] ? load16<Load::ReadOnly>(gamma + off[i]) : make_uint4(0, 0, 0, 0);
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
        qx[d][i] = load16<Load::Streaming>(sum + base + off[i]);
      }
    }
    qm[d] = mean[r];
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
        float g[8], d[8], xv[8];
        unpack8(graw[i], g);
        unpack8(dyc[i], d);
        unpack8(xc[i], xv);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          const float xh = (xv[k] - m) * r;
          const float dxh = d[k] * g[k];
          s1 += dxh;
          s2 += dxh * xh;
          acc_g[i][k] += d[k] * xh;
          acc_b[i][k] += d[k];
        }
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
        float g[8], d[8], xv[8], e[8], o[8];
        unpack8(graw[i], g);
        unpack8(dyc[i], d);
        unpack8(xc[i], xv);
        unpack8(er[i], e);  // zeros without d_extra
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          const float xh = (xv[k] - m) * r;
          o[k] = r * (d[k] * g[k] - a - xh * b);
          if (d_extra) o[k] += e[k];
        }
        store_bf16x8(d_sum + base + off[i], o);
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

// dgamma[c] (+)= Σ_p partial_g[p][c] in p order, likewise dbeta. Block (32, 32): lane ty sums
// partials ty, ty + 32, ...; the 32 lane sums are then combined in ty order. Wider than v1's
// finalize (16 lanes) so that a 1024-column shape keeps more loads in flight.
template <typename TParam>
__global__ void __launch_bounds__(kWarpSize * kFinalLanes)
    ln_param_finalize_v2(const float* __restrict__ partial, int P, int cols, TParam* __restrict__ dgamma,
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

// V3 selects the v3 configuration (VPT 1, DEPTH 2), otherwise v2's.
template <bool V3, int TW>
void launch_team(cudaStream_t s, int blocks, const bf16* dy, const bf16* sum, const float* mean, const float* rstd,
                 const bf16* gamma, const bf16* d_extra, bf16* d_sum, float* partial, int rows, int cols) {
  constexpr Cfg g = V3 ? kV3 : kV2;
  constexpr int RPB = TW >= g.block_warps ? 1 : (g.block_warps / TW > 8 ? 8 : g.block_warps / TW);
  constexpr int kThreadsPerBlock = TW * RPB * kWarpSize;
  // Two blocks per SM: <= 128 registers at 256 threads, <= 64 at 512; v2's 512-thread teams
  // (TW = 16) keep 128 registers and one block per SM.
  constexpr int MINB = kThreadsPerBlock <= 256 || V3 ? 2 : 1;
  ln_bwd_team<TW, RPB, g.vpt, g.depth, MINB><<<blocks, kThreadsPerBlock, 0, s>>>(dy, sum, mean, rstd, gamma, d_extra,
                                                                               d_sum, partial, rows, cols);
  CUTRAIN_LAUNCH_CHECK(V3 ? "ln_bwd_team (v3)" : "ln_bwd_team (v2)");
}

template <bool V3>
void launch_main(cudaStream_t s, int P, int tw, const bf16* dy, const bf16* sum, const float* mean, const float* rstd,
                 const bf16* gamma, const bf16* d_extra, bf16* d_sum, float* partial, int rows, int cols) {
  switch (tw) {
    case 1: launch_team<V3, 1>(s, P, dy, sum, mean, rstd, gamma, d_extra, d_sum, partial, rows, cols); break;
    case 2: launch_team<V3, 2>(s, P, dy, sum, mean, rstd, gamma, d_extra, d_sum, partial, rows, cols); break;
    case 4: launch_team<V3, 4>(s, P, dy, sum, mean, rstd, gamma, d_extra, d_sum, partial, rows, cols); break;
    case 8: launch_team<V3, 8>(s, P, dy, sum, mean, rstd, gamma, d_extra, d_sum, partial, rows, cols); break;
    default: launch_team<V3, 16>(s, P, dy, sum, mean, rstd, gamma, d_extra, d_sum, partial, rows, cols); break;
  }
}

}  // namespace

bool ln_bwd_v2_supported(int cols) { return fits(kV2, cols); }

std::size_t ln_bwd_v2_scratch_bytes(int rows, int cols) {
  const int P = std::max(grid_blocks(kV2, rows, cols), grid_blocks(kV3, rows, cols));
  return 2 * static_cast<std::size_t>(P) * cols * sizeof(float);
}

void ln_bwd_v2(cudaStream_t s, const bf16* dy, const bf16* sum, const float* mean, const float* rstd,
               const bf16* gamma, const bf16* d_extra, bf16* d_sum, void* dgamma, void* dbeta, DType param_grad_type,
               bool accumulate, float* partial, int rows, int cols, bool v3) {
  CUTRAIN_CHECK(ln_bwd_v2_supported(cols) && cols % kBf16PerVec == 0,
                "layernorm_backward v2: needs cols % 8 == 0 and cols <= 8192, got ", cols);
  v3 = v3 && fits(kV3, cols);
  const Cfg& g = v3 ? kV3 : kV2;
  const int P = grid_blocks(g, rows, cols);
  if (v3) launch_main<true>(s, P, team_warps(g, cols), dy, sum, mean, rstd, gamma, d_extra, d_sum, partial, rows, cols);
  else launch_main<false>(s, P, team_warps(g, cols), dy, sum, mean, rstd, gamma, d_extra, d_sum, partial, rows, cols);
  const dim3 grid(ceil_div(cols, kWarpSize)), block(kWarpSize, kFinalLanes);
  if (param_grad_type == DType::F32) {
    ln_param_finalize_v2<float><<<grid, block, 0, s>>>(partial, P, cols, static_cast<float*>(dgamma),
                                                       static_cast<float*>(dbeta), accumulate);
  } else {
    ln_param_finalize_v2<bf16><<<grid, block, 0, s>>>(partial, P, cols, static_cast<bf16*>(dgamma),
                                                      static_cast<bf16*>(dbeta), accumulate);
  }
  CUTRAIN_LAUNCH_CHECK("ln_param_finalize_v2");
}

}  // namespace cutrain::kernels::detail
