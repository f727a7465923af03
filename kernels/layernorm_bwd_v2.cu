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

constexpr int kVpt = 2;           // 16-byte vectors per thread per row
constexpr int kBlockWarps = 8;    // 256-thread blocks (TW <= 8); TW = 16 runs 512-thread blocks
constexpr int kMaxTeamWarps = 16; // 16 warps x 32 lanes x 2 vectors x 8 = 8192 columns
constexpr int kGridSms = 132;     // H100/H200 SM count: sizes the grid only (bits are device-independent)
constexpr int kWarpsPerSm = 16;   // residency the grid aims for (2 x 256 threads at <= 128 registers)
constexpr int kFinalLanes = 32;   // finalize: partial rows summed in parallel per column

int team_warps(int cols) {
  const int need = ceil_div(cols / kBf16PerVec, kVpt * kWarpSize);
  int tw = 1;
  while (tw < need) tw *= 2;
  return tw;
}
int teams_per_block(int tw) { return std::max(1, kBlockWarps / tw); }
int grid_blocks(int rows, int cols) {
  const int tw = team_warps(cols), rpb = teams_per_block(tw);
  const int target = kGridSms * kWarpsPerSm / (tw * rpb);
  // At least two rows per team, so the prefetch has something to overlap.
  return std::max(1, std::min(target, ceil_div(rows, 2 * rpb)));
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

__device__ __forceinline__ void unpack8(const uint4& raw, float f[8]) {
  load_bf16x8(reinterpret_cast<const bf16*>(&raw), f);  // register-to-register: no memory access
}

template <int TW, int RPB>
__global__ void __launch_bounds__(TW * RPB * kWarpSize, TW * RPB <= kBlockWarps ? 2 : 1)
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

  uint4 dyn[kVpt], xn[kVpt];
  float mn = 0.f, rn = 0.f;
  auto fetch = [&](int r) {
    const std::size_t base = static_cast<std::size_t>(r) * cols;
#pragma unroll
    for (int i = 0; i < kVpt; ++i) {
      if (on[i]) {
        dyn[i] = load16(dy + base + off[i]);
        xn[i] = load16<Load::Streaming>(sum + base + off[i]);
      }
    }
    mn = mean[r];
    rn = rstd[r];
  };

  int row = blockIdx.x * RPB + team;
  if (row < rows) fetch(row);
  int parity = 0;
  for (; row < rows; row += U) {
    uint4 dyc[kVpt], xc[kVpt], er[kVpt];
#pragma unroll
    for (int i = 0; i < kVpt; ++i) {
      dyc[i] = dyn[i];
      xc[i] = xn[i];
    }
    const float m = mn, r = rn;
    const std::size_t base = static_cast<std::size_t>(row) * cols;
    if (row + U < rows) fetch(row + U);  // team-uniform
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

template <int TW>
void launch_team(cudaStream_t s, int blocks, const bf16* dy, const bf16* sum, const float* mean, const float* rstd,
                 const bf16* gamma, const bf16* d_extra, bf16* d_sum, float* partial, int rows, int cols) {
  constexpr int RPB = TW >= kBlockWarps ? 1 : kBlockWarps / TW;
  ln_bwd_team<TW, RPB><<<blocks, TW * RPB * kWarpSize, 0, s>>>(dy, sum, mean, rstd, gamma, d_extra, d_sum, partial,
                                                              rows, cols);
  CUTRAIN_LAUNCH_CHECK("ln_bwd_team");
}

}  // namespace

bool ln_bwd_v2_supported(int cols) { return cols <= kMaxTeamWarps * kWarpSize * kVpt * kBf16PerVec; }

std::size_t ln_bwd_v2_scratch_bytes(int rows, int cols) {
  return 2 * static_cast<std::size_t>(grid_blocks(rows, cols)) * cols * sizeof(float);
}

void ln_bwd_v2(cudaStream_t s, const bf16* dy, const bf16* sum, const float* mean, const float* rstd,
               const bf16* gamma, const bf16* d_extra, bf16* d_sum, void* dgamma, void* dbeta, DType param_grad_type,
               bool accumulate, float* partial, int rows, int cols) {
  CUTRAIN_CHECK(ln_bwd_v2_supported(cols) && cols % kBf16PerVec == 0,
                "layernorm_backward v2: needs cols % 8 == 0 and cols <= 8192, got ", cols);
  const int P = grid_blocks(rows, cols);
  switch (team_warps(cols)) {
    case 1: launch_team<1>(s, P, dy, sum, mean, rstd, gamma, d_extra, d_sum, partial, rows, cols); break;
    case 2: launch_team<2>(s, P, dy, sum, mean, rstd, gamma, d_extra, d_sum, partial, rows, cols); break;
    case 4: launch_team<4>(s, P, dy, sum, mean, rstd, gamma, d_extra, d_sum, partial, rows, cols); break;
    case 8: launch_team<8>(s, P, dy, sum, mean, rstd, gamma, d_extra, d_sum, partial, rows, cols); break;
    default: launch_team<16>(s, P, dy, sum, mean, rstd, gamma, d_extra, d_sum, partial, rows, cols); break;
  }
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
