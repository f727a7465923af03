// @brief The Hopper attention forward (issue #24's experiment): warp-specialized, TMA + mbarrier
// pipeline, wgmma tensor cores. Built for sm_90a only (bench/attention_hopper/CMakeLists.txt).
//
// CTA = one (batch, head) and FwdConfig::kBlockM = 128 query rows; 2 consumer warpgroups (warps
// 0-3, 4-7) own 64 rows each, one producer warp (warp 8) feeds them:
//   producer (lane 0 only): Q once (q_full), then per K/V tile j of kBlockN keys, into ring stage
//     j % kStages after both consumers released that stage's previous tile (kv_empty): K
//     (k_full[s]) and V (v_full[s]), each as D/64 TMA boxes of 128-byte swizzled rows.
//   consumers: S = Q K^T (wgmma, both operands from shared memory, K-major), the causal / sequence
//     -end mask and the online softmax in registers (the production kernel's Softmax, Mask and
//     to_a_frags: the wgmma accumulator is the mma.sync C fragment per 8 columns), then
//     O += P V (wgmma, P from registers, V read transposed from shared memory), then each consumer
//     warp arrives on kv_empty[s]. The epilogue normalizes O and stores it and the log-sum-exp
//     exactly as the production kernel does.
// Causal: tiles past the CTA's last query are never loaded; a warpgroup whose rows all precede a
// tile skips its math but still waits for the tile and releases it, so the ring's phases stay in
// step for both consumers.
// No intra-warpgroup overlap of softmax and wgmma yet (each batch is waited for at once); the two
// consumer warpgroups overlap each other's softmax with their wgmma.
#include <cuda.h>

#include <cmath>

#include "bench/attention_hopper/attention_hopper.h"
#include "bench/attention_hopper/hopper_layout.h"
#include "bench/attention_hopper/hopper_sm90a.cuh"
#include "bench/attention_hopper/tensor_map.h"
#include "kernels/attention_softmax.cuh"
#include "kernels/attention_tiles.cuh"
#include "runtime/check.h"
#include "runtime/error.h"

namespace cutrain::bench::hopper {
namespace {

namespace attn = kernels::attn;

// The mbarriers after the tiles: q_full, k_full[kStages], v_full[kStages], kv_empty[kStages].
template <class Cfg>
struct Barriers {
  std::uint32_t base;
  __device__ __forceinline__ std::uint32_t q_full() const { return base; }
  __device__ __forceinline__ std::uint32_t k_full(int s) const { return base + 8 * (1 + s); }
  __device__ __forceinline__ std::uint32_t v_full(int s) const { return base + 8 * (1 + Cfg::kStages + s); }
  __device__ __forceinline__ std::uint32_t kv_empty(int s) const { return base + 8 * (1 + 2 * Cfg::kStages + s); }
};

// The consumer warpgroups' whole part: the K/V loop and the epilogue.
template <class Cfg>
__device__ __forceinline__ void consume(std::uint32_t sQ, std::uint32_t sK, std::uint32_t sV, const Barriers<Cfg>& bar,
                                        bf16* __restrict__ out, float* __restrict__ lse, int S, int H,
                                        float scale_log2, int m0, int n_tiles, int head, int b) {
  constexpr int D = Cfg::kHeadDim, BN = Cfg::kBlockN, ST = Cfg::kStages;
  constexpr bool CAUSAL = Cfg::kCausal;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wg = warp >> 2;
  const int wg_row0 = m0 + 64 * wg, row0 = wg_row0 + 16 * (warp & 3);  // row0: this warp's first row
  float o[D / 8][4];
  attn::zero(o);
  float m_run[1][2], l_run[1][2];
  attn::Softmax<1> softmax{m_run, l_run};
  softmax.start();
  const attn::Mask<CAUSAL> mask{S};

  mbar_wait(bar.q_full(), 0);
  for (int j = 0; j < n_tiles; ++j) {
    const int s = j % ST;
    const std::uint32_t phase = (j / ST) & 1;
    const std::uint32_t k_tile = sK + s * Cfg::kKVBytes, v_tile = sV + s * Cfg::kKVBytes;
    // Causal: a warpgroup whose last row precedes the tile's first key has nothing to add from it.
    // Uniform over the warpgroup, as wgmma requires.
    const bool active = Cfg::tile_active(j, wg_row0);
    std::uint32_t p[BN / 16][4];

    mbar_wait(bar.k_full(s), phase);
    if (active) {
      float sc[BN / 8][4];  // raw scores; the first k16 step overwrites
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        wgmma_ss<BN>(sc, smem_desc(sQ + Cfg::q_slice(wg, kk), kUnusedLbo, Cfg::kSbo),
                     smem_desc(k_tile + Cfg::k_slice(kk), kUnusedLbo, Cfg::kSbo), kk > 0);
      wgmma_commit();
      wgmma_wait<0>();
      operand_fence(sc);
      mask.apply(attn::one_mtile(sc), row0, j * BN);
      softmax.template update<BN / 8, D>(0, sc, o, scale_log2);
      attn::to_a_frags<BN>(p, sc);
    }
    mbar_wait(bar.v_full(s), phase);
    if (active) {
      operand_fence(o);
      operand_fence(p);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < BN / 16; ++ks)
        wgmma_rs<D>(o, p[ks], smem_desc(v_tile + Cfg::v_slice(ks), Cfg::kVLbo, Cfg::kSbo), 1);
      wgmma_commit();
      wgmma_wait<0>();
      operand_fence(o);
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(bar.kv_empty(s));  // this warp's reads of stage s are complete
  }

  // Epilogue, as the production forward: finish the row sums across the quad, normalize, store O
  // and the log-sum-exp (rows at or past S are skipped).
  const int gi = lane >> 2, t = lane & 3;
  bf16* gout = out + static_cast<std::size_t>(b) * S * H * D + static_cast<std::size_t>(head) * D;
  float* glse = lse + (static_cast<std::size_t>(b) * H + head) * S;
  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float l = softmax.row_sum(0, h);
    inv[h] = 1.f / l;
    const int row = row0 + gi + 8 * h;
    if (t == 0 && row < S) glse[row] = softmax.lse(0, h, l);
  }
#pragma unroll
  for (int d = 0; d < D / 8; ++d) {
    o[d][0] *= inv[0];
    o[d][1] *= inv[0];
    o[d][2] *= inv[1];
    o[d][3] *= inv[1];
  }
  attn::store_rows<D>(gout, o, row0, S, static_cast<std::size_t>(H) * D, 1.f);
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    forward_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap kv_map,
                   bf16* __restrict__ out, float* __restrict__ lse, int S, int H, float scale_log2) {
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN, ST = Cfg::kStages;
  constexpr bool CAUSAL = Cfg::kCausal;
  extern __shared__ unsigned char smem_raw[];
  // Shared-window addresses; the TMA's 128-byte swizzle and wgmma's need 1024-aligned tiles.
  const std::uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const std::uint32_t sQ = base + Cfg::kQOff, sK = base + Cfg::kKOff, sV = base + Cfg::kVOff;
  const Barriers<Cfg> bar{base + Cfg::kBarOff};

  const int qblock = CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x;  // causal: heaviest first
  const int m0 = qblock * BM, head = blockIdx.y, b = blockIdx.z;
  const int n_tiles = Cfg::kv_tiles(S, m0);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  if (threadIdx.x == 0) {
    mbar_init(bar.q_full(), 1);
#pragma unroll
    for (int s = 0; s < ST; ++s) {
      mbar_init(bar.k_full(s), 1);
      mbar_init(bar.v_full(s), 1);
      mbar_init(bar.kv_empty(s), 4 * Cfg::kConsumers);  // every consumer warp releases
    }
    mbar_init_fence();
  }
  __syncthreads();  // the last CTA-wide barrier: the producer's idle threads leave below

  if (warp == Cfg::kProducerWarp) {
    if (lane == 0) {
      mbar_arrive_expect_tx(bar.q_full(), Cfg::kQBytes);
#pragma unroll
      for (int c = 0; c < Cfg::kColBlocks; ++c)
        tma_load_5d(sQ + c * BM * 128, &q_map, 64 * c, head, 0, m0, b, bar.q_full());
      for (int j = 0; j < n_tiles; ++j) {
        const int s = j % ST;
        if (j >= ST) mbar_wait(bar.kv_empty(s), ((j / ST) - 1) & 1);
        mbar_arrive_expect_tx(bar.k_full(s), Cfg::kKVBytes);
#pragma unroll
        for (int c = 0; c < Cfg::kColBlocks; ++c)
          tma_load_5d(sK + s * Cfg::kKVBytes + c * BN * 128, &kv_map, 64 * c, head, 1, j * BN, b, bar.k_full(s));
        mbar_arrive_expect_tx(bar.v_full(s), Cfg::kKVBytes);
#pragma unroll
        for (int c = 0; c < Cfg::kColBlocks; ++c)
          tma_load_5d(sV + s * Cfg::kKVBytes + c * BN * 128, &kv_map, 64 * c, head, 2, j * BN, b, bar.v_full(s));
      }
    }
  } else {
    consume<Cfg>(sQ, sK, sV, bar, out, lse, S, H, scale_log2, m0, n_tiles, head, b);
  }
}

template <int D, bool CAUSAL>
void launch(cudaStream_t st, const bf16* qkv, bf16* out, float* lse, const kernels::AttentionShape& sh) {
  using Cfg = FwdConfig<D, CAUSAL>;
  const CUtensorMap q_map = encode_qkv_map(qkv, sh, Cfg::kBlockM);
  const CUtensorMap kv_map = encode_qkv_map(qkv, sh, Cfg::kBlockN);
  auto kernel = forward_kernel<Cfg>;
  CUTRAIN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
  const dim3 grid((sh.seq + Cfg::kBlockM - 1) / Cfg::kBlockM, sh.heads, sh.batch);
  const float scale_log2 = attn::kLog2e / std::sqrt(static_cast<float>(D));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, st>>>(q_map, kv_map, out, lse, sh.seq, sh.heads, scale_log2);
  CUTRAIN_LAUNCH_CHECK("attention_hopper forward_kernel");
}

// The sm_90a code runs on compute capability 9.0 only; say so instead of a bare launch error.
void check_device(std::uint32_t smem_bytes) {
  int dev = 0, major = 0, minor = 0, optin = 0;
  CUTRAIN_CUDA_CHECK(cudaGetDevice(&dev));
  CUTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CUTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  CUTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  CUTRAIN_CHECK(major == 9 && minor == 0, "attention_hopper_forward: needs a compute capability 9.0 device (sm_90a "
                "code: H100/H200), device ", dev, " is ", major, ".", minor);
  CUTRAIN_CHECK(static_cast<std::uint32_t>(optin) >= smem_bytes, "attention_hopper_forward: needs ", smem_bytes,
                " bytes of shared memory per block, device ", dev, " offers ", optin);
}

}  // namespace

void attention_forward(cudaStream_t s, const bf16* qkv, bf16* out, float* lse, const kernels::AttentionShape& sh) {
  check_forward_args(qkv, out, lse, sh);
  check_device(sh.head_dim == 64 ? FwdConfig<64, false>::kSmemBytes : FwdConfig<128, false>::kSmemBytes);
  const bool c = sh.causal;
  if (sh.head_dim == 64)
    c ? launch<64, true>(s, qkv, out, lse, sh) : launch<64, false>(s, qkv, out, lse, sh);
  else
    c ? launch<128, true>(s, qkv, out, lse, sh) : launch<128, false>(s, qkv, out, lse, sh);
}

}  // namespace cutrain::bench::hopper
