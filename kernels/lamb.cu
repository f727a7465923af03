// @brief LAMB's two passes over the tensor table (kernels/lamb.cuh), one template instance per
// parameter type (bf16; fp16 with the Baseline layout only) and
// (layout, gradient type, compensated or not, width). Memory-bound: a block takes one chunk of one
// tensor at a time (grid-stride over the chunks), each thread W = 4 consecutive elements per
// iteration (fp32 as float4, bf16 as 8 bytes), W = 1 for misaligned buffers and chunk tails.
// Pass 1 ends each chunk with a block reduction of (w^2, u^2); the block that completes a tensor
// (an atomic count per tensor, after a fence) reduces the tensor's partials in chunk order in fp64
// and writes its trust ratio, then resets the count for the next launch.
#include "kernels/lamb.cuh"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/common/chunk_io.cuh"
#include "kernels/common/reduce.cuh"
#include "kernels/common/stochastic_round.cuh"
#include "kernels/common/vec.cuh"
#include "runtime/check.h"
#include "runtime/nvtx.h"

namespace cutrain::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocksPerSm = 8;

struct LambConsts {
  float beta1, beta2, one_minus_beta1, one_minus_beta2;
  float eps, wd, step_size, max_coeff, min_coeff;
  float grad_scale;
  bool eps_inside, sr;
  std::uint64_t seed, step;
};

template <typename P>
struct LambPtrs {
  P* params;  // the 16-bit model copy (bf16 or fp16)
  const void* grads;
  float* master;
  void* m;
  void* v;
  const float* device_scale;
  const int* skip;
  P* comp;  // compensated bf16 instances only
};

// The workspace's parts (lamb.cuh: LambDeviceTable).
struct Workspace {
  float2* partials;  // [num_chunks]: (sum w^2, sum u^2) of each chunk
  float* ratios;     // [num_tensors]
  float2* norms;     // [num_tensors]: (|w|, |u|)
  unsigned* counters;  // [num_tensors]: chunks done in this launch
};
__host__ __device__ inline Workspace workspace_of(void* base, std::uint32_t tensors, std::uint32_t chunks) {
  char* p = static_cast<char*>(base);
  Workspace w;
  w.partials = reinterpret_cast<float2*>(p);
  p += sizeof(float2) * chunks;
  w.norms = reinterpret_cast<float2*>(p);
  p += sizeof(float2) * tensors;
  w.ratios = reinterpret_cast<float*>(p);
  p += sizeof(float) * tensors;
  w.counters = reinterpret_cast<unsigned*>(p);
  return w;
}

__device__ __forceinline__ float lamb_direction(const LambConsts& c, float m, float v, float w, float wd) {
  const float denom = c.eps_inside ? sqrtf(v + c.eps) : sqrtf(v) + c.eps;
  return fmaf(wd, w, m / denom);
}

// The SR keys of the current 2^32-element window (recomputed only when it changes).
struct SrState {
  std::uint32_t hi0 = 0xffffffffu, key0 = 0, key1 = 0;
};
// The draws of W consecutive elements from `i` (sr_draws' assignment): pass 1 needs m's and v's,
// pass 2 the parameter's.
template <int W, bool kParam>
__device__ __forceinline__ void draws(const LambConsts& c, std::size_t i, SrState& st, std::uint32_t r0[W],
                                      std::uint32_t r1[W]) {
  const std::uint32_t hi = static_cast<std::uint32_t>(i >> 32), lo = static_cast<std::uint32_t>(i);
  if (hi != st.hi0) {
    st.key0 = sr_key(c.seed, c.step, 0, hi);
    st.key1 = sr_key(c.seed, c.step, 1, hi);
    st.hi0 = hi;
  }
#pragma unroll
  for (int k = 0; k < W; ++k) {
    if constexpr (kParam) {
      r0[k] = sr_pair_half(sr_bits(st.key0, (lo + k) >> 1), lo + k);
    } else {
      const std::uint32_t h = sr_bits(st.key1, lo + k);
      r0[k] = h & 0xffffu;
      r1[k] = h >> 16;
    }
  }
}

template <OptimizerLayout L, bool K, int W, typename P>
__device__ __forceinline__ void load_weight(const LambPtrs<P>& a, std::size_t i, float w[W]) {
  if constexpr (L == OptimizerLayout::Baseline) {
    load_c<W>(a.master + i, w);
  } else {
    load_c<W>(a.params + i, w);
    if constexpr (K) {
      float k_[W];
      load_c<W>(a.comp + i, k_);
#pragma unroll
      for (int k = 0; k < W; ++k) w[k] += k_[k];
    }
  }
}

// Pass 1 on W elements from `i`: m, v updated and stored; (w^2, u^2) added to `acc`.
template <OptimizerLayout L, typename G, bool K, int W, typename P>
__device__ __forceinline__ void pass1_elems(const LambConsts& c, const LambPtrs<P>& a, float scale, float wd,
                                            std::size_t i, SrState& st, float2& acc) {
  constexpr bool kFull = L == OptimizerLayout::Bf16Full;
  using Moment = std::conditional_t<kFull, bf16, float>;
  float g[W], w[W], m[W], v[W];
  load_c<W>(static_cast<const G*>(a.grads) + i, g);
  load_weight<L, K, W>(a, i, w);
  load_c<W>(static_cast<const Moment*>(a.m) + i, m);
  load_c<W>(static_cast<const Moment*>(a.v) + i, v);
#pragma unroll
  for (int k = 0; k < W; ++k) {
    const float gk = g[k] * scale;
    m[k] = fmaf(c.beta1, m[k], c.one_minus_beta1 * gk);
    v[k] = fmaf(c.beta2, v[k], c.one_minus_beta2 * gk * gk);
  }
  if constexpr (kFull) {
    std::uint32_t rm[W], rv[W];
    if (c.sr) draws<W, false>(c, i, st, rm, rv);
#pragma unroll
    for (int k = 0; k < W; ++k) {  // pass 2 sees the rounded moments: the norms use them too
      m[k] = __bfloat162float(c.sr ? bf16_round_stochastic(m[k], rm[k]) : __float2bfloat16_rn(m[k]));
      v[k] = __bfloat162float(c.sr ? bf16_round_stochastic(v[k], rv[k]) : __float2bfloat16_rn(v[k]));
    }
    store_c<W>(static_cast<bf16*>(a.m) + i, m, false, rm);  // already bf16 values: exact
    store_c<W>(static_cast<bf16*>(a.v) + i, v, false, rv);
  } else {
    store_c<W>(static_cast<float*>(a.m) + i, m);
    store_c<W>(static_cast<float*>(a.v) + i, v);
  }
#pragma unroll
  for (int k = 0; k < W; ++k) {
    const float u = lamb_direction(c, m[k], v[k], w[k], wd);
    acc.x = fmaf(w[k], w[k], acc.x);
    acc.y = fmaf(u, u, acc.y);
  }
}

// Pass 2 on W elements from `i`: w -= step * u, stored in the layout's way.
template <OptimizerLayout L, bool K, int W, typename P>
__device__ __forceinline__ void pass2_elems(const LambConsts& c, const LambPtrs<P>& a, float step, float wd,
                                            std::size_t i, SrState& st) {
  constexpr bool kFull = L == OptimizerLayout::Bf16Full;
  using Moment = std::conditional_t<kFull, bf16, float>;
  float w[W], m[W], v[W];
  load_weight<L, K, W>(a, i, w);
  load_c<W>(static_cast<const Moment*>(a.m) + i, m);
  load_c<W>(static_cast<const Moment*>(a.v) + i, v);
#pragma unroll
  for (int k = 0; k < W; ++k) w[k] = fmaf(-step, lamb_direction(c, m[k], v[k], w[k], wd), w[k]);
  std::uint32_t rp[W], unused[W];
  if (c.sr) draws<W, true>(c, i, st, rp, unused);
  if constexpr (L == OptimizerLayout::Baseline) store_c<W>(a.master + i, w);
  if constexpr (K) {
    float k_[W];
#pragma unroll
    for (int k = 0; k < W; ++k) {  // w' rounded, then the exact residual x - w' to bf16
      const float x = w[k];
      w[k] = __bfloat162float(c.sr ? bf16_round_stochastic(x, rp[k]) : __float2bfloat16_rn(x));
      k_[k] = x - w[k];
    }
    store_c<W>(a.comp + i, k_, false, rp);
    store_c<W>(a.params + i, w, false, rp);
  } else {
    store_c<W>(a.params + i, w, c.sr, rp);
  }
}

__device__ __forceinline__ const LambTensorInfo* tensors_of(const LambDeviceTable& t) {
  return static_cast<const LambTensorInfo*>(t.table);
}
__device__ __forceinline__ const LambChunk* chunks_of(const LambDeviceTable& t) {
  return reinterpret_cast<const LambChunk*>(tensors_of(t) + t.num_tensors);
}

// The last block of tensor `ti`: its partials summed in chunk order (fp64, fixed per-thread
// strides and a fixed tree), the ratio written, the count reset.
__device__ void finish_tensor(const LambConsts& c, const LambTensorInfo& info, std::uint32_t ti, const Workspace& ws) {
  __shared__ double red[2][kThreads / 32];
  __threadfence();  // the other blocks' partials, published before their count increments
  double sw = 0, su = 0;
  for (std::uint32_t j = threadIdx.x; j < info.num_chunks; j += blockDim.x) {
    const float2 p = __ldcg(ws.partials + info.first_chunk + j);
    sw += p.x;
    su += p.y;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    sw += __shfl_xor_sync(kFullMask, sw, o);
    su += __shfl_xor_sync(kFullMask, su, o);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) red[0][warp] = sw, red[1][warp] = su;
  __syncthreads();
  if (threadIdx.x == 0) {
    double tw = 0, tu = 0;
    for (int k = 0; k < static_cast<int>(blockDim.x / 32); ++k) tw += red[0][k], tu += red[1][k];
    const float wn = static_cast<float>(::sqrt(tw)), un = static_cast<float>(::sqrt(tu));
    float ratio = 1.f;
    if (wn != 0.f && un != 0.f) ratio = fminf(fmaxf(wn / un, c.min_coeff), c.max_coeff);
    ws.ratios[ti] = ratio;
    ws.norms[ti] = make_float2(wn, un);
    ws.counters[ti] = 0;
  }
}

template <OptimizerLayout L, typename G, bool K, int W, typename P>
__global__ void __launch_bounds__(kThreads) lamb_pass1(LambConsts c, LambPtrs<P> a, LambDeviceTable t) {
  if (a.skip != nullptr && *a.skip != 0) return;
  __shared__ float red[2 * kThreads / 32];
  __shared__ bool last;
  const float scale = c.grad_scale * (a.device_scale != nullptr ? *a.device_scale : 1.f);
  const LambTensorInfo* tensors = tensors_of(t);
  const LambChunk* chunks = chunks_of(t);
  const Workspace ws = workspace_of(t.workspace, t.num_tensors, t.num_chunks);
  SrState st;
  for (std::uint32_t ci = blockIdx.x; ci < t.num_chunks; ci += gridDim.x) {
    const LambChunk ch = chunks[ci];
    const float wd = c.wd * tensors[ch.tensor].decay;
    float2 acc = make_float2(0.f, 0.f);
    const std::uint32_t body = ch.count / W * W;
    for (std::uint32_t k = threadIdx.x * W; k < body; k += blockDim.x * W)
      pass1_elems<L, G, K, W>(c, a, scale, wd, ch.begin + k, st, acc);
    if constexpr (W > 1)
      for (std::uint32_t k = body + threadIdx.x; k < ch.count; k += blockDim.x)
        pass1_elems<L, G, K, 1>(c, a, scale, wd, ch.begin + k, st, acc);
    const float2 s = block_sum2(acc, red);
    if (threadIdx.x == 0) {
      ws.partials[ci] = s;
      __threadfence();  // the partial is visible before the count says so
      last = atomicAdd(ws.counters + ch.tensor, 1u) + 1 == tensors[ch.tensor].num_chunks;
    }
    __syncthreads();
    if (last) finish_tensor(c, tensors[ch.tensor], ch.tensor, ws);
    __syncthreads();
  }
}

template <OptimizerLayout L, bool K, int W, typename P>
__global__ void __launch_bounds__(kThreads) lamb_pass2(LambConsts c, LambPtrs<P> a, LambDeviceTable t) {
  if (a.skip != nullptr && *a.skip != 0) return;
  const LambTensorInfo* tensors = tensors_of(t);
  const LambChunk* chunks = chunks_of(t);
  const Workspace ws = workspace_of(t.workspace, t.num_tensors, t.num_chunks);
  SrState st;
  for (std::uint32_t ci = blockIdx.x; ci < t.num_chunks; ci += gridDim.x) {
    const LambChunk ch = chunks[ci];
    const float wd = c.wd * tensors[ch.tensor].decay;
    const float step = c.step_size * ws.ratios[ch.tensor];
    const std::uint32_t body = ch.count / W * W;
    for (std::uint32_t k = threadIdx.x * W; k < body; k += blockDim.x * W)
      pass2_elems<L, K, W>(c, a, step, wd, ch.begin + k, st);
    if constexpr (W > 1)
      for (std::uint32_t k = body + threadIdx.x; k < ch.count; k += blockDim.x)
        pass2_elems<L, K, 1>(c, a, step, wd, ch.begin + k, st);
  }
}

template <typename Kernel>
unsigned resident_blocks(Kernel kernel, std::uint32_t chunks) {
  int dev = 0, sms = 0, per_sm = 0;
  CUTRAIN_CUDA_CHECK(cudaGetDevice(&dev));
  CUTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CUTRAIN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
  per_sm = std::max(1, std::min(per_sm, kMaxBlocksPerSm));
  return static_cast<unsigned>(std::min<std::size_t>(chunks, static_cast<std::size_t>(sms) * per_sm));
}

template <OptimizerLayout L, typename G, bool K, int W, typename P>
void launch(cudaStream_t s, const LambConsts& c, const LambPtrs<P>& a, const LambDeviceTable& t) {
  auto k1 = lamb_pass1<L, G, K, W, P>;
  k1<<<resident_blocks(k1, t.num_chunks), kThreads, 0, s>>>(c, a, t);
  CUTRAIN_LAUNCH_CHECK("lamb_pass1");
  auto k2 = lamb_pass2<L, K, W, P>;
  k2<<<resident_blocks(k2, t.num_chunks), kThreads, 0, s>>>(c, a, t);
  CUTRAIN_LAUNCH_CHECK("lamb_pass2");
}

template <OptimizerLayout L, typename G, bool K, typename P>
void launch_width(cudaStream_t s, const LambConsts& c, const LambPtrs<P>& a, const LambDeviceTable& t, bool vec) {
  if (vec) launch<L, G, K, 4>(s, c, a, t);
  else launch<L, G, K, 1>(s, c, a, t);
}

template <OptimizerLayout L, bool K, typename P>
void launch_grad_type(cudaStream_t s, DType gt, const LambConsts& c, const LambPtrs<P>& a, const LambDeviceTable& t,
                      bool vec) {
  if (gt == DType::F32) launch_width<L, float, K>(s, c, a, t, vec);
  else launch_width<L, P, K>(s, c, a, t, vec);  // the parameters' own type (checked by lamb_step)
}

template <OptimizerLayout L>
void launch_bf16_master(cudaStream_t s, DType gt, const LambConsts& c, const LambPtrs<bf16>& a, const LambDeviceTable& t,
                        bool vec) {
  if (a.comp != nullptr) launch_grad_type<L, true>(s, gt, c, a, t, vec);
  else launch_grad_type<L, false>(s, gt, c, a, t, vec);
}

}  // namespace

LambPlan LambPlan::make(const std::vector<LambTensor>& in, std::uint32_t chunk_elems) {
  CUTRAIN_CHECK(chunk_elems > 0 && chunk_elems % 4 == 0, "LambPlan: chunk_elems must be a positive multiple of 4, got ",
                chunk_elems);
  std::vector<std::size_t> order(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return in[x].begin < in[y].begin; });
  for (std::size_t k = 0; k < order.size(); ++k) {
    const LambTensor& t = in[order[k]];
    CUTRAIN_CHECK(t.count > 0 && t.count < (std::size_t(1) << 32), "LambPlan: tensor ", order[k], " has ", t.count,
                  " elements; expected 1 to 2^32 - 1");
    if (k > 0) {
      const LambTensor& p = in[order[k - 1]];
      CUTRAIN_CHECK(p.begin + p.count <= t.begin, "LambPlan: tensors ", order[k - 1], " [", p.begin, ", ",
                    p.begin + p.count, ") and ", order[k], " [", t.begin, ", ", t.begin + t.count, ") overlap");
    }
  }
  LambPlan plan;
  for (std::size_t ti = 0; ti < in.size(); ++ti) {  // tensor index = the caller's order
    const LambTensor& t = in[ti];
    LambTensorInfo info{static_cast<std::uint32_t>(plan.chunks.size()), 0, t.decay ? 1.f : 0.f, 0};
    for (std::size_t off = 0; off < t.count; off += chunk_elems) {
      const auto n = static_cast<std::uint32_t>(std::min<std::size_t>(chunk_elems, t.count - off));
      plan.chunks.push_back({t.begin + off, n, static_cast<std::uint32_t>(ti)});
      ++info.num_chunks;
    }
    CUTRAIN_CHECK(plan.chunks.size() < (std::size_t(1) << 32), "LambPlan: more than 2^32 chunks");
    plan.tensors.push_back(info);
    plan.aligned4 = plan.aligned4 && t.begin % 4 == 0;
  }
  return plan;
}

std::size_t LambPlan::table_bytes() const {
  return tensors.size() * sizeof(LambTensorInfo) + chunks.size() * sizeof(LambChunk);
}
void LambPlan::pack(void* dst) const {
  char* p = static_cast<char*>(dst);
  std::copy_n(reinterpret_cast<const char*>(tensors.data()), tensors.size() * sizeof(LambTensorInfo), p);
  std::copy_n(reinterpret_cast<const char*>(chunks.data()), chunks.size() * sizeof(LambChunk),
              p + tensors.size() * sizeof(LambTensorInfo));
}
std::size_t LambPlan::workspace_bytes() const {
  return chunks.size() * sizeof(float2) + tensors.size() * (sizeof(float2) + sizeof(float) + sizeof(unsigned));
}
std::size_t LambPlan::end() const {
  std::size_t e = 0;
  for (const LambChunk& c : chunks) e = std::max<std::size_t>(e, c.begin + c.count);
  return e;
}

LambDeviceTable lamb_device_table(const LambPlan& plan, const void* table, void* workspace) {
  return {table, workspace, static_cast<std::uint32_t>(plan.tensors.size()),
          static_cast<std::uint32_t>(plan.chunks.size()), plan.aligned4};
}
const float* lamb_trust_ratios(const LambDeviceTable& t) {
  return workspace_of(t.workspace, t.num_tensors, t.num_chunks).ratios;
}
const float* lamb_norms(const LambDeviceTable& t) {
  return reinterpret_cast<const float*>(workspace_of(t.workspace, t.num_tensors, t.num_chunks).norms);
}

double lamb_bytes_per_param(OptimizerLayout layout, DType grad_type, bool compensated) {
  const double g = static_cast<double>(dtype_size(grad_type));
  const double k = compensated && layout != OptimizerLayout::Baseline ? 6 : 0;  // read twice, write once
  switch (layout) {
    case OptimizerLayout::Baseline: return g + 4 + 16 + (4 + 8 + 6);  // pass 1: grad, master, r/w m v; pass 2
    case OptimizerLayout::Bf16MasterWG: return g + 2 + 16 + (2 + 8 + 2) + k;
    case OptimizerLayout::Bf16Full: return g + 2 + 8 + (2 + 4 + 2) + k;
  }
  return 0;
}

template <typename P>
void lamb_step(cudaStream_t s, OptimizerLayout layout, const LambParams& p, const LambDeviceTable& t, P* params,
               const void* grads, DType grad_type, float* master, void* m, void* v, const float* device_scale,
               const int* skip, nondeduced_t<P>* compensation) {
  constexpr DType kParamType = dtype_of<P>();
  CUTRAIN_CHECK(grad_type == kParamType || grad_type == DType::F32, "lamb_step: grad_type must be ",
                dtype_name(kParamType), " (the parameters' type) or float32, got ", dtype_name(grad_type));
  CUTRAIN_CHECK(kParamType == DType::BF16 || layout == OptimizerLayout::Baseline, "lamb_step: ",
                dtype_name(kParamType), " parameters need the fp32 master weights (layout Baseline)");
  CUTRAIN_CHECK(kParamType == DType::BF16 || !p.stochastic_rounding,
                "lamb_step: stochastic rounding is for bf16 parameters, got ", dtype_name(kParamType));
  CUTRAIN_CHECK(p.step >= 1, "lamb_step: step is 1-based (bias correction), got ", p.step);
  CUTRAIN_CHECK(p.beta1 >= 0.f && p.beta1 < 1.f && p.beta2 >= 0.f && p.beta2 < 1.f,
                "lamb_step: betas must lie in [0, 1), got (", p.beta1, ", ", p.beta2, ")");
  CUTRAIN_CHECK(std::isfinite(p.lr) && std::isfinite(p.eps) && std::isfinite(p.weight_decay) &&
                    std::isfinite(p.grad_scale),
                "lamb_step: lr, eps, weight_decay and grad_scale must be finite, got lr=", p.lr, " eps=", p.eps,
                " weight_decay=", p.weight_decay, " grad_scale=", p.grad_scale);
  CUTRAIN_CHECK(p.min_coeff >= 0.f && p.min_coeff <= p.max_coeff && std::isfinite(p.max_coeff),
                "lamb_step: expected 0 <= min_coeff <= max_coeff (finite), got min_coeff=", p.min_coeff,
                " max_coeff=", p.max_coeff);
  if (t.num_chunks == 0) return;
  CUTRAIN_CHECK(t.table && t.workspace, "lamb_step: the device table and workspace must be non-null");
  CUTRAIN_CHECK(params && grads && m && v, "lamb_step: params, grads, m and v must be non-null");
  CUTRAIN_CHECK(layout != OptimizerLayout::Baseline || master != nullptr,
                "lamb_step: layout Baseline needs the fp32 master weights, got master = null");
  CUTRAIN_CHECK(layout != OptimizerLayout::Baseline || compensation == nullptr,
                "lamb_step: a compensation buffer belongs to bf16 master weights (Bf16MasterWG, Bf16Full); layout "
                "Baseline keeps an fp32 master, pass compensation = null");
  NvtxRange range("lamb_step");

  LambConsts c{};
  c.beta1 = p.beta1;
  c.beta2 = p.beta2;
  c.one_minus_beta1 = 1.f - p.beta1;
  c.one_minus_beta2 = 1.f - p.beta2;
  c.eps = p.eps;
  c.wd = p.weight_decay;
  const double bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), p.step);
  const double bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), p.step);
  c.step_size = static_cast<float>(p.bias_correction ? p.lr * std::sqrt(bc2) / bc1 : p.lr);
  c.max_coeff = p.max_coeff;
  c.min_coeff = p.min_coeff;
  c.grad_scale = p.grad_scale;
  c.eps_inside = p.eps_inside_sqrt;
  c.sr = p.stochastic_rounding;
  c.seed = p.seed;
  c.step = static_cast<std::uint64_t>(p.step);
  const LambPtrs<P> a{params, grads, layout == OptimizerLayout::Baseline ? master : nullptr, m, v, device_scale, skip,
                   compensation};
  const bool vec = t.aligned4 && is_aligned16(params) && is_aligned16(grads) && is_aligned16(m) && is_aligned16(v) &&
                   (layout != OptimizerLayout::Baseline || is_aligned16(master)) &&
                   (compensation == nullptr || is_aligned16(compensation));
  if constexpr (kParamType != DType::BF16) {
    launch_grad_type<OptimizerLayout::Baseline, false>(s, grad_type, c, a, t, vec);  // the only layout (checked above)
  } else {
    switch (layout) {
      case OptimizerLayout::Baseline: launch_grad_type<OptimizerLayout::Baseline, false>(s, grad_type, c, a, t, vec); break;
      case OptimizerLayout::Bf16MasterWG: launch_bf16_master<OptimizerLayout::Bf16MasterWG>(s, grad_type, c, a, t, vec); break;
      case OptimizerLayout::Bf16Full: launch_bf16_master<OptimizerLayout::Bf16Full>(s, grad_type, c, a, t, vec); break;
    }
  }
}

template void lamb_step<bf16>(cudaStream_t, OptimizerLayout, const LambParams&, const LambDeviceTable&, bf16*,
                              const void*, DType, float*, void*, void*, const float*, const int*, bf16*);
template void lamb_step<f16>(cudaStream_t, OptimizerLayout, const LambParams&, const LambDeviceTable&, f16*,
                             const void*, DType, float*, void*, void*, const float*, const int*, f16*);

}  // namespace cutrain::kernels
