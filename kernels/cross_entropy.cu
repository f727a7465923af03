// @brief Fused softmax cross-entropy (see cross_entropy.cuh): two launches.
//   1. ce_count_kernel (1 block): validates the labels, counts the non-ignored rows (the mean's
//      denominator must be known before any gradient is written), reports the first bad row. It
//      lets the row kernel start at once (programmatic dependent launch).
//   2. The row kernel, by path:
//      - gradient, rows that fit twice in a CTA's shared memory (up to ~57k columns):
//        ce_pipelined_kernel, one persistent CTA per SM with two row buffers filled by bulk
//        copies (kernels/common/bulk_copy.cuh): the next row loads while this one's
//        log-sum-exp and gradient are computed from shared memory, so HBM sees one read and one
//        write per element and the reads never wait for the math;
//      - gradient, longer rows: ce_row_kernel over a thread-block cluster of up to 8 CTAs per row,
//        each parking one slice of the row in shared memory (up to ~450k-column rows read once);
//      - forward only: ce_row_kernel, one block per row streaming it once.
//      The online (max, sum 2^(y - max)) is kept in log2 units. The last block to finish takes
//      the mean of the row losses in a fixed order (deterministic).
// Extra memory: the scratch of 16 + 4 * rows bytes.
#include "kernels/cross_entropy.cuh"

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>

#include <cooperative_groups.h>

#include "kernels/common/bulk_copy.cuh"
#include "kernels/common/vec.cuh"
#include "runtime/check.h"
#include "runtime/nvtx.h"

namespace cutrain::kernels {

namespace {

// The row kernel's tile: threads per block (two blocks per SM), 16-byte loads in flight per
// thread per iteration in pass 1 (nothing else in flight) and pass 2, CTAs per row at most (the
// portable cluster size). The count kernel runs kCountThreads.
struct CeTile {
  static constexpr int kThreads = 512, kPass1Loads = 8, kPass2Loads = 4, kMaxSplit = 8;
  static constexpr int kCountThreads = 1024;
  // The pipelined gradient kernel: one CTA per SM, shared-memory vectors per thread in flight.
  static constexpr int kPipeThreads = 1024, kPipeLoads = 4;
};
constexpr int kThreads = CeTile::kThreads;
constexpr int kSmallThreads = CeTile::kCountThreads;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct CeHeader {
  int n_valid;
  unsigned done;  // row blocks finished (zeroed by the count kernel; the last one takes the mean)
  int pad[2];
};
constexpr std::size_t kRowLossOffset = sizeof(CeHeader);

__device__ __forceinline__ float fast_ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ bool label_valid(int label, int vocab, int ignore_index) {
  return label != ignore_index && label >= 0 && label < vocab;
}

// ---- online log-sum-exp in log2 units: m = max y, s = sum 2^(y - m), y = x * log2(e) ----

__device__ __forceinline__ void lse_combine(float& m, float& s, float m2, float s2) {
  const float mn = fmaxf(m, m2);
  s = s * fast_ex2(m - mn) + s2 * fast_ex2(m2 - mn);
  m = mn;
}

__device__ __forceinline__ void lse_add8(float& m, float& s, const float f[8]) {
  float vmax = fmaxf(fmaxf(fmaxf(f[0], f[1]), fmaxf(f[2], f[3])), fmaxf(fmaxf(f[4], f[5]), fmaxf(f[6], f[7])));
  const float mn = fmaxf(m, vmax * kLog2e);
  float add = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) add += fast_ex2(fmaf(f[i], kLog2e, -mn));
  s = fmaf(s, fast_ex2(m - mn), add);
  m = mn;
}

__device__ __forceinline__ void lse_add1(float& m, float& s, float x) {
  const float mn = fmaxf(m, x * kLog2e);
  s = fmaf(s, fast_ex2(m - mn), fast_ex2(fmaf(x, kLog2e, -mn)));
  m = mn;
}

// Block-wide (m, s) combination; every thread gets the result. Fixed order: deterministic.
__device__ __forceinline__ void lse_block(float& m, float& s) {
  __shared__ float sm_m[32], sm_s[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
    lse_combine(m, s, m2, s2);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  if (lane == 0) {
    sm_m[warp] = m;
    sm_s[warp] = s;
  }
  __syncthreads();
  m = lane < nwarps ? sm_m[lane] : -FLT_MAX;
  s = lane < nwarps ? sm_s[lane] : 0.f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
    lse_combine(m, s, m2, s2);
  }
}

template <typename T>
__device__ __forceinline__ void unpack8(uint4 raw, float f[8]) {
  const pair16_t<T>* h = reinterpret_cast<const pair16_t<T>*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 v = to_f32x2(h[i]);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}

// Programmatic dependent launch (sm_90): the count kernel lets the row kernel start at once, and
// the row kernel waits for the count kernel's results (memory visible) only where it needs them.
__device__ __forceinline__ void pdl_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// ---- kernel 1: labels -> n_valid, first bad row ----

__global__ void __launch_bounds__(kSmallThreads) ce_count_kernel(const int32_t* __restrict__ labels, int rows, int vocab,
                                                                int ignore_index, CeHeader* hdr, int* status) {
  pdl_launch_dependents();
  __shared__ int sm_count[32], sm_bad[32];
  int count = 0, bad = INT_MAX;
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    const int l = labels[r];
    if (label_valid(l, vocab, ignore_index)) ++count;
    else if (l != ignore_index) bad = min(bad, r);
  }
  count = __reduce_add_sync(0xffffffffu, count);
  bad = static_cast<int>(__reduce_min_sync(0xffffffffu, static_cast<unsigned>(bad)));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    sm_count[warp] = count;
    sm_bad[warp] = bad;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int c = 0, b = INT_MAX;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) {
      c += sm_count[w];
      b = min(b, sm_bad[w]);
    }
    hdr->n_valid = c;
    hdr->done = 0;
    if (status) *status = b == INT_MAX ? 0 : b + 1;
  }
}

// ---- kernel 2: one row per block ----

template <typename T>
struct RowArgs {
  T* logits;
  const int32_t* labels;
  int vocab, ld, ignore_index;
  float grad_scale;
  const float* device_grad_scale;  // may be null; multiplied into grad_scale (fp16 loss scaling)
  CeHeader* hdr;
  float* row_loss_tmp;
  float* row_loss;
  int cache_vecs;  // 16-byte vectors of the row body parked in shared memory
  int rows;
  float* loss_mean;  // written by the last row block
  int split;         // long rows: CTAs (one thread-block cluster) per row; 1 otherwise
};

// The fused finish: every block counts itself done; the last one (it sees every other block's
// row loss after the fences) takes the mean in a fixed order, so the result stays deterministic.
// Called by every thread of the block.
template <class Args>
__device__ __forceinline__ void ce_finish_in_last_block(const Args& a) {
  __shared__ bool is_last;
  __shared__ double sm[32];
  pdl_wait();  // hdr->done and n_valid come from the count kernel
  if (threadIdx.x == 0) {
    __threadfence();  // this block's row loss (written by this thread) before the count
    is_last = atomicAdd(&a.hdr->done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  // This sum sits at the kernel's end, on the critical path: four loads in flight per thread
  // (the per-thread order r, r + B, r + 2B, ... is the plain loop's, so the result is the same).
  double acc = 0;
  const int nb = static_cast<int>(blockDim.x);
  int r = threadIdx.x;
  for (; r + 3 * nb < a.rows; r += 4 * nb) {
    const float l0 = __ldcg(a.row_loss_tmp + r), l1 = __ldcg(a.row_loss_tmp + r + nb);
    const float l2 = __ldcg(a.row_loss_tmp + r + 2 * nb), l3 = __ldcg(a.row_loss_tmp + r + 3 * nb);
    acc += static_cast<double>(l0);
    acc += static_cast<double>(l1);
    acc += static_cast<double>(l2);
    acc += static_cast<double>(l3);
  }
  for (; r < a.rows; r += nb) acc += static_cast<double>(__ldcg(a.row_loss_tmp + r));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) sm[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) t += sm[w];
    const int nv = __ldcg(&a.hdr->n_valid);
    *a.loss_mean = nv > 0 ? static_cast<float>(t / nv) : 0.f;
  }
}

// Zeros [begin, end) of a row with scalar stores (the padding, the misaligned head/tail).
template <typename T>
__device__ __forceinline__ void zero_scalar(T* x, int begin, int end) {
  const T z = from_f32<T>(0.f);
  for (int j = begin + threadIdx.x; j < end; j += blockDim.x) x[j] = z;
}

template <class Args>
__device__ __forceinline__ void write_row_loss(const Args& a, int row, float loss) {
  a.row_loss_tmp[row] = loss;
  if (a.row_loss) a.row_loss[row] = loss;
}

// One gradient element: (p_j - [j == label]) * gs with p_j = 2^(x log2e - c).
template <typename T>
__device__ __forceinline__ T grad_of(float x, bool is_label, float c, float gs) {
  return from_f32<T>((fast_ex2(fmaf(x, kLog2e, -c)) - (is_label ? 1.f : 0.f)) * gs);
}

// The gradient scale folded into the exponent: p_j * |gs| = 2^(x_j log2e - c_scaled), so the
// body's elements cost one fma and one ex2 each; the sign of gs goes onto the 16-bit values' sign bits
// (bit 15 of each half, in T and fp16 alike).
struct GradScale {
  float c_scaled;      // c - log2 |gs| (+inf when gs = 0: every element 0)
  float abs_gs;        // |gs|: subtracted at the label's element
  unsigned sign_bits;  // 0x80008000 when gs < 0, else 0
};
__device__ __forceinline__ GradScale grad_scale_of(float c, float gs) {
  return {c - log2f(fabsf(gs)), fabsf(gs), gs < 0.f ? 0x80008000u : 0u};
}

// Eight gradient elements from their raw 16-bit logits to dst (16-byte aligned); `off`: the
// label's index within the eight (any other value: not among them).
template <typename T>
__device__ __forceinline__ void grad8(uint4 raw, int off, const GradScale& g, T* dst) {
  float f[8];
  unpack8<T>(raw, f);
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = fast_ex2(fmaf(f[i], kLog2e, -g.c_scaled));
  if (static_cast<unsigned>(off) < 8u) {  // one vector of the row: the -1 of the one-hot
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (i == off) f[i] -= g.abs_gs;
  }
  uint4 out;
  unsigned* w = reinterpret_cast<unsigned*>(&out);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const pair16_t<T> h = pack2_rn<T>(f[2 * i], f[2 * i + 1]);
    w[i] = *reinterpret_cast<const unsigned*>(&h) ^ g.sign_bits;
  }
  store16<Store::Streaming>(dst, out);
}

// kCluster (rows longer than one CTA can park): a cluster of a.split CTAs per row, each
// parking and streaming one contiguous slice of the row's vectors; the CTAs exchange their
// (max, sum) through distributed shared memory and combine them in rank order (deterministic).
// Rank 0 owns the scalar head/tail, the label's logit, the row loss and the padding.
template <typename T, class Tile, bool kGrad, bool kCluster>
__global__ void __launch_bounds__(Tile::kThreads, 2) ce_row_kernel(RowArgs<T> a) {
  constexpr int kThreads = Tile::kThreads, kUnroll1 = Tile::kPass1Loads, kUnroll = Tile::kPass2Loads;
  extern __shared__ uint4 cache[];
  const int split = kCluster ? a.split : 1;
  const int rank = kCluster ? static_cast<int>(blockIdx.x % static_cast<unsigned>(split)) : 0;
  const bool owner = rank == 0;
  const int row = kCluster ? static_cast<int>(blockIdx.x / static_cast<unsigned>(split)) : blockIdx.x;
  const int tid = threadIdx.x;
  T* x = a.logits + static_cast<std::size_t>(row) * a.ld;
  const int label = a.labels[row];
  const bool valid = label_valid(label, a.vocab, a.ignore_index);

  // Split [0, vocab) into a scalar head up to the first 16-byte boundary, aligned vectors, a tail.
  const int head = min(a.vocab, static_cast<int>(((16u - (reinterpret_cast<std::uintptr_t>(x) & 15u)) & 15u) >> 1));
  const int nvec = (a.vocab - head) / 8;
  const int tail_start = head + nvec * 8;
  const int tail = owner ? a.vocab - tail_start : 0;
  const int head_here = owner ? head : 0;
  T* body = x + head;
  // This CTA's slice of the vectors (the whole row unless split).
  const int per = kCluster ? (nvec + split - 1) / split : nvec;
  const int v_begin = kCluster ? min(nvec, rank * per) : 0;
  const int v_end = kCluster ? min(nvec, v_begin + per) : nvec;

  if (!valid) {  // block-uniform (cluster-uniform): ignored (or bad-label) row: no loss, zero gradient
    if (tid == 0 && owner) write_row_loss(a, row, 0.f);
    if constexpr (kGrad) {
      for (int v = v_begin + tid; v < v_end; v += blockDim.x)
        store16<Store::Streaming>(body + static_cast<std::size_t>(v) * 8, make_uint4(0, 0, 0, 0));
      if (owner) {
        zero_scalar(x, 0, head);
        zero_scalar(x, tail_start, a.ld);  // tail and padding
      }
    }
    ce_finish_in_last_block(a);
    return;
  }

  // ---- pass 1: online log-sum-exp over the row ----
  float m = -FLT_MAX, s = 0.f;
  float x_head = 0.f, x_tail = 0.f;
  if (tid < head_here) {
    x_head = to_f32(x[tid]);
    lse_add1(m, s, x_head);
  }
  if (tid < tail) {
    x_tail = to_f32(x[tail_start + tid]);
    lse_add1(m, s, x_tail);
  }
  // Vectors v in [v_begin, cache_end) are parked at cache[v - v_begin].
  const int cache_end = kGrad ? v_begin + min(a.cache_vecs, v_end - v_begin) : v_begin;
  for (int v0 = v_begin + tid; v0 < v_end; v0 += kUnroll1 * kThreads) {
    uint4 r[kUnroll1];
#pragma unroll
    for (int k = 0; k < kUnroll1; ++k) {
      const int v = v0 + k * kThreads;
      if (v < v_end) r[k] = load16(body + static_cast<std::size_t>(v) * 8);
    }
#pragma unroll
    for (int k = 0; k < kUnroll1; ++k) {
      const int v = v0 + k * kThreads;
      if (v < v_end) {
        if (v < cache_end) cache[v - v_begin] = r[k];
        float f[8];
        unpack8<T>(r[k], f);
        lse_add8(m, s, f);
      }
    }
  }
  float x_label = 0.f;
  if (tid == 0 && owner) x_label = to_f32(x[label]);  // before any CTA of the row writes
  lse_block(m, s);
  if constexpr (kCluster) {
    __shared__ float2 cl_ms;
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    if (tid == 0) cl_ms = make_float2(m, s);
    cluster.sync();  // every slice's (m, s) written; also: no CTA writes gradients before all read x
    float mm = -FLT_MAX, ss = 0.f;
    for (int r = 0; r < split; ++r) {
      const float2 o = *cluster.map_shared_rank(&cl_ms, static_cast<unsigned>(r));
      lse_combine(mm, ss, o.x, o.y);
    }
    m = mm, s = ss;
    cluster.sync();  // no CTA exits while a peer may still read its cl_ms
  }
  const float c = m + log2f(s);  // log2 of the softmax denominator: p_j = 2^(x_j log2e - c)
  if (tid == 0 && owner) write_row_loss(a, row, c * kLn2 - x_label);
  if constexpr (!kGrad) {
    ce_finish_in_last_block(a);
    return;
  }

  // ---- pass 2: dlogits = (softmax - onehot) * grad_scale / n_valid, in place ----
  pdl_wait();  // n_valid from the count kernel, which ran alongside pass 1
  const float gs = (a.device_grad_scale ? a.grad_scale * *a.device_grad_scale : a.grad_scale) /
                   static_cast<float>(max(a.hdr->n_valid, 1));
  if (tid < head_here) x[tid] = grad_of<T>(x_head, tid == label, c, gs);
  if (tid < tail) x[tail_start + tid] = grad_of<T>(x_tail, tail_start + tid == label, c, gs);
  const int label_off = label - head;  // label's position in the body (may be outside it)
  const GradScale g = grad_scale_of(c, gs);
  for (int v0 = v_begin + tid; v0 < v_end; v0 += kUnroll * kThreads) {
    uint4 r[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int v = v0 + k * kThreads;
      if (v < v_end) r[k] = v < cache_end ? cache[v - v_begin] : load16(body + static_cast<std::size_t>(v) * 8);
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int v = v0 + k * kThreads;
      if (v < v_end) grad8(r[k], label_off - v * 8, g, body + static_cast<std::size_t>(v) * 8);
    }
  }
  if (owner) zero_scalar(x, a.vocab, a.ld);  // padding columns
  ce_finish_in_last_block(a);
}

// The gradient path for rows that fit twice in one CTA's shared memory (up to ~57k columns on an
// H100/H200): a persistent CTA per SM walks rows blockIdx.x, + gridDim.x, ... with two row
// buffers. While it computes a row from one buffer (the log-sum-exp, then the gradient written
// over the logits), a bulk copy fills the other with its next row, so HBM reads never wait for
// the math and the gradient's stores overlap the next row's load.
template <typename T, class Tile>
__global__ void __launch_bounds__(Tile::kPipeThreads, 1) ce_pipelined_kernel(RowArgs<T> a) {
  constexpr int kThreads = Tile::kPipeThreads, kUnroll = Tile::kPipeLoads;
  extern __shared__ uint4 buffers[];  // two buffers of a.cache_vecs vectors
  __shared__ alignas(8) std::uint64_t full[2];
  const int tid = threadIdx.x;
  auto body_of = [&](int row, int& head, int& nvec) {
    T* x = a.logits + static_cast<std::size_t>(row) * a.ld;
    head = min(a.vocab, static_cast<int>(((16u - (reinterpret_cast<std::uintptr_t>(x) & 15u)) & 15u) >> 1));
    nvec = (a.vocab - head) / 8;
    return x;
  };
  auto fill = [&](int row, int buf) {  // one thread
    int head, nvec;
    T* x = body_of(row, head, nvec);
    const auto bytes = static_cast<std::uint32_t>(nvec) * 16u;
    mbar_expect_bytes(&full[buf], bytes);
    if (bytes > 0) bulk_load(buffers + static_cast<std::size_t>(buf) * a.cache_vecs, x + head, bytes, &full[buf]);
  };
  if (tid == 0) {
    mbar_init(&full[0]);
    mbar_init(&full[1]);
    if (static_cast<int>(blockIdx.x) < a.rows) fill(blockIdx.x, 0);
  }
  __syncthreads();

  int iter = 0;
  for (int row = blockIdx.x; row < a.rows; row += gridDim.x, ++iter) {
    const int buf = iter & 1;
    // The other buffer was last read by the previous row, which every thread has finished.
    if (tid == 0 && row + static_cast<int>(gridDim.x) < a.rows) fill(row + gridDim.x, buf ^ 1);
    int head, nvec;
    T* x = body_of(row, head, nvec);
    T* body = x + head;
    const uint4* cache = buffers + static_cast<std::size_t>(buf) * a.cache_vecs;
    const int tail_start = head + nvec * 8;
    const int tail = a.vocab - tail_start;
    const int label = a.labels[row];
    const bool valid = label_valid(label, a.vocab, a.ignore_index);
    float x_head = 0.f, x_tail = 0.f, x_label = 0.f;
    if (valid) {
      if (tid < head) x_head = to_f32(x[tid]);
      if (tid < tail) x_tail = to_f32(x[tail_start + tid]);
      if (tid == 0) x_label = to_f32(x[label]);
    }
    mbar_wait(&full[buf], static_cast<std::uint32_t>(iter >> 1) & 1u);

    if (!valid) {  // block-uniform: no loss, zero gradient (the copy has landed: the buffer is free)
      if (tid == 0) write_row_loss(a, row, 0.f);
      for (int v = tid; v < nvec; v += kThreads)
        store16<Store::Streaming>(body + static_cast<std::size_t>(v) * 8, make_uint4(0, 0, 0, 0));
      zero_scalar(x, 0, head);
      zero_scalar(x, tail_start, a.ld);  // tail and padding
      __syncthreads();
      continue;
    }

    // ---- the row's log-sum-exp, from shared memory ----
    float m = -FLT_MAX, s = 0.f;
    if (tid < head) lse_add1(m, s, x_head);
    if (tid < tail) lse_add1(m, s, x_tail);
    for (int v0 = tid; v0 < nvec; v0 += kUnroll * kThreads) {
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int v = v0 + k * kThreads;
        if (v < nvec) {
          float f[8];
          unpack8<T>(cache[v], f);
          lse_add8(m, s, f);
        }
      }
    }
    lse_block(m, s);
    const float c = m + log2f(s);
    if (tid == 0) write_row_loss(a, row, c * kLn2 - x_label);

    // ---- dlogits = (softmax - onehot) * grad_scale / n_valid, over the logits ----
    pdl_wait();  // n_valid from the count kernel (returns at once after the first row)
    const float gs = (a.device_grad_scale ? a.grad_scale * *a.device_grad_scale : a.grad_scale) /
                   static_cast<float>(max(a.hdr->n_valid, 1));
    if (tid < head) x[tid] = grad_of<T>(x_head, tid == label, c, gs);
    if (tid < tail) x[tail_start + tid] = grad_of<T>(x_tail, tail_start + tid == label, c, gs);
    const int label_off = label - head;
    const GradScale g = grad_scale_of(c, gs);
    for (int v0 = tid; v0 < nvec; v0 += kUnroll * kThreads) {
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int v = v0 + k * kThreads;
        if (v < nvec) grad8(cache[v], label_off - v * 8, g, body + static_cast<std::size_t>(v) * 8);
      }
    }
    zero_scalar(x, a.vocab, a.ld);  // padding columns
    __syncthreads();  // every thread is done with this buffer before it is filled again
  }
  ce_finish_in_last_block(a);
}

// Shared-memory budget for parking a row: two blocks per SM (so one block's reduction overlaps
// the other's streaming), less the per-block reservation and the static reduction buffers.
int cache_budget_vecs() {
  int dev = 0, per_sm = 0, optin = 0;
  CUTRAIN_CUDA_CHECK(cudaGetDevice(&dev));
  CUTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  CUTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return std::max(0, std::min(optin - 1024, per_sm / 2 - 2048) / 16);
}
int row_vecs(int vocab) { return ceil_div(vocab, 8) + 1; }  // vectors of a row body, at most

// Vectors per buffer of the pipelined kernel: two buffers in one CTA's shared memory (one CTA per
// SM), less the static reduction buffers and barriers.
int pipeline_budget_vecs() {
  int dev = 0, per_sm = 0, optin = 0;
  CUTRAIN_CUDA_CHECK(cudaGetDevice(&dev));
  CUTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  CUTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return std::max(0, std::min(optin, per_sm - 1024) - 1024) / 32;
}
int sm_count() {
  int dev = 0, n = 0;
  CUTRAIN_CUDA_CHECK(cudaGetDevice(&dev));
  CUTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  return n;
}

constexpr int kMaxSplit = CeTile::kMaxSplit;

// CTAs per row so that each slice fits the per-CTA budget (1 for rows that already fit).
int split_for(int vocab) {
  const int budget = std::max(1, cache_budget_vecs());
  return std::min(kMaxSplit, std::max(1, ceil_div(row_vecs(vocab), budget)));
}

void check_common(const char* fn, const void* logits, const int32_t* labels, int rows, int vocab, int ld,
                  const float* loss_mean, const void* scratch) {
  CUTRAIN_CHECK(rows > 0, fn, ": rows must be positive, got ", rows);
  CUTRAIN_CHECK(vocab > 0, fn, ": vocab must be positive, got ", vocab);
  CUTRAIN_CHECK(ld >= vocab, fn, ": ld (row stride of the logits) must be >= vocab = ", vocab, ", got ", ld);
  CUTRAIN_CHECK(logits != nullptr && labels != nullptr, fn, ": logits and labels must be non-null");
  CUTRAIN_CHECK(loss_mean != nullptr, fn, ": loss_mean (device fp32) must be non-null");
  CUTRAIN_CHECK(scratch != nullptr && is_aligned16(scratch), fn, ": scratch of cross_entropy_scratch_bytes(", rows,
                ") = ", cross_entropy_scratch_bytes(rows), " bytes must be non-null and 16-byte aligned");
  CUTRAIN_CHECK((reinterpret_cast<std::uintptr_t>(logits) & 1u) == 0, fn, ": logits must be 2-byte aligned");
}

// The row kernel is a programmatic dependent of the count kernel (starts streaming its rows while
// the labels are counted) and its last block takes the mean (no finish launch): at few rows
// (2048 x 50k moves only ~200 MB each way) launch gaps and serial one-block kernels are most of
// the gap to the copy bandwidth.
template <bool kGrad, typename T>
void run(cudaStream_t s, T* logits, const int32_t* labels, int rows, int vocab, int ld, float* loss_mean,
         float* row_loss, int* status, void* scratch, int ignore_index, float grad_scale,
         const float* device_grad_scale) {
  auto* hdr = static_cast<CeHeader*>(scratch);
  auto* row_loss_tmp = reinterpret_cast<float*>(static_cast<char*>(scratch) + kRowLossOffset);
  ce_count_kernel<<<1, kSmallThreads, 0, s>>>(labels, rows, vocab, ignore_index, hdr, status);
  CUTRAIN_LAUNCH_CHECK("ce_count_kernel");

  RowArgs<T> a{logits, labels,    vocab,    ld, ignore_index, grad_scale, device_grad_scale,
               hdr,    row_loss_tmp, row_loss, 0,  rows,         loss_mean,  1};
  cudaLaunchAttribute pdl;
  pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl.val.programmaticStreamSerializationAllowed = 1;
  if constexpr (kGrad) {
    if (const int pipe = pipeline_budget_vecs(); row_vecs(vocab) <= pipe) {
      a.cache_vecs = row_vecs(vocab);
      const std::size_t smem = 2 * static_cast<std::size_t>(a.cache_vecs) * 16;
      auto kernel = ce_pipelined_kernel<T, CeTile>;
      CUTRAIN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(static_cast<unsigned>(std::min(rows, sm_count())));
      cfg.blockDim = dim3(CeTile::kPipeThreads);
      cfg.dynamicSmemBytes = smem;
      cfg.stream = s;
      cfg.attrs = &pdl;
      cfg.numAttrs = 1;
      CUTRAIN_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, a));
      CUTRAIN_LAUNCH_CHECK("ce_pipelined_kernel<grad>");
      return;
    }
  }
  // Rows longer than one CTA can park are split over a cluster (gradient pass only: the forward
  // keeps nothing in shared memory).
  if constexpr (kGrad) a.split = split_for(vocab);
  CUTRAIN_CHECK(static_cast<long long>(rows) * a.split <= INT_MAX, "cross_entropy: rows * split = ", rows, " * ",
                a.split, " exceeds the grid limit");
  auto kernel = a.split > 1 ? ce_row_kernel<T, CeTile, kGrad, true> : ce_row_kernel<T, CeTile, kGrad, false>;
  std::size_t smem = 0;
  if constexpr (kGrad) {
    a.cache_vecs = std::min(cache_budget_vecs(), ceil_div(row_vecs(vocab), a.split));
    smem = static_cast<std::size_t>(a.cache_vecs) * 16;
    CUTRAIN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    // Ask for the largest shared-memory split so two parked rows fit per SM (L1 is not needed).
    CUTRAIN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                            static_cast<int>(cudaSharedmemCarveoutMaxShared)));
  }
  const char* what = kGrad ? (a.split > 1 ? "ce_row_kernel<grad,cluster>" : "ce_row_kernel<grad>")
                           : "ce_row_kernel<forward>";
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(rows * a.split));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  attr[1].id = cudaLaunchAttributeClusterDimension;
  attr[1].val.clusterDim.x = static_cast<unsigned>(a.split);
  attr[1].val.clusterDim.y = 1;
  attr[1].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = a.split > 1 ? 2 : 1;
  CUTRAIN_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, a));
  CUTRAIN_LAUNCH_CHECK(what);
}

}  // namespace

std::size_t cross_entropy_scratch_bytes(int rows) {
  const std::size_t b = kRowLossOffset + sizeof(float) * static_cast<std::size_t>(rows > 0 ? rows : 0);
  return ceil_div<std::size_t>(b, 256) * 256;
}

template <typename T>
void cross_entropy_forward_backward(cudaStream_t s, T* logits, const int32_t* labels, int rows, int vocab, int ld,
                                    float* loss_mean, float* row_loss, int* status, void* scratch, int ignore_index,
                                    float grad_scale, const float* device_grad_scale) {
  check_common("cross_entropy_forward_backward", logits, labels, rows, vocab, ld, loss_mean, scratch);
  CUTRAIN_CHECK(std::isfinite(grad_scale), "cross_entropy_forward_backward: grad_scale must be finite, got ", grad_scale);
  NvtxRange range("cross_entropy_fwdbwd");
  run<true>(s, logits, labels, rows, vocab, ld, loss_mean, row_loss, status, scratch, ignore_index, grad_scale,
            device_grad_scale);
}

template <typename T>
void cross_entropy_forward(cudaStream_t s, const T* logits, const int32_t* labels, int rows, int vocab, int ld,
                           float* loss_mean, float* row_loss, int* status, void* scratch, int ignore_index) {
  check_common("cross_entropy_forward", logits, labels, rows, vocab, ld, loss_mean, scratch);
  NvtxRange range("cross_entropy_fwd");
  // The forward instance never writes through the pointer.
  T* x = const_cast<T*>(logits);
  run<false>(s, x, labels, rows, vocab, ld, loss_mean, row_loss, status, scratch, ignore_index, 1.f, nullptr);
}

template void cross_entropy_forward_backward<bf16>(cudaStream_t, bf16*, const int32_t*, int, int, int, float*, float*, int*,
                                                   void*, int, float, const float*);
template void cross_entropy_forward<bf16>(cudaStream_t, const bf16*, const int32_t*, int, int, int, float*, float*, int*,
                                          void*, int);
template void cross_entropy_forward_backward<f16>(cudaStream_t, f16*, const int32_t*, int, int, int, float*, float*, int*,
                                                   void*, int, float, const float*);
template void cross_entropy_forward<f16>(cudaStream_t, const f16*, const int32_t*, int, int, int, float*, float*, int*,
                                          void*, int);

}  // namespace cutrain::kernels
