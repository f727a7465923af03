// @brief Fused softmax cross-entropy (see cross_entropy.cuh): two launches.
//   1. ce_count_kernel (1 block): validates the labels, counts the non-ignored rows (the mean's
//      denominator must be known before any gradient is written), reports the first bad row. It
//      lets the row kernel start at once (programmatic dependent launch).
//   2. ce_row_kernel: a thread-block cluster of `split` CTAs per row (cross_entropy_ctas_per_row:
//      slices of at most ~32 KiB, up to 8 CTAs). Each CTA brings its slice of the row into shared
//      memory with one TMA bulk copy (kernels/common/bulk_copy.cuh), takes the slice's max (packed
//      16-bit pairs) and then its sum of exponentials from shared memory, the CTAs of the row combine their
//      (max, sum) through distributed shared memory in rank order, and each writes its slice's
//      gradient from shared memory over the logits: HBM sees one read and one write per element.
//      Small slices keep several CTAs on an SM, so one CTA's math overlaps the others' copies and
//      the last wave is short. The log-sum-exp is kept in log2 units. The last CTA to finish takes
//      the mean of the row losses in a fixed order (deterministic).
// Extra memory: the scratch of 16 + 4 * rows bytes.
#include "kernels/cross_entropy.cuh"

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>

#include <cooperative_groups.h>

#include "kernels/common/bulk_copy.cuh"
#include "kernels/common/fast_math.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/cross_entropy_slice.h"
#include "runtime/check.h"
#include "runtime/nvtx.h"

namespace cutrain::kernels {

namespace {

// The row kernel's tile: threads per CTA and the CTAs per SM its registers must allow (six of its
// small slices share an SM). A row is cut into slices of at most kSliceBytes over a cluster of up
// to ce::kMaxSplit CTAs (the portable cluster size; past that a CTA parks what its shared memory
// holds and reads the rest of its slice from global memory in each pass). The count kernel runs
// kCountThreads.
struct CeTile {
  static constexpr int kThreads = 256, kMinBlocksPerSm = 6;
};
constexpr int kSliceBytes = 32 * 1024;
constexpr int kCountThreads = 1024;
constexpr int kSmallThreads = kCountThreads;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct CeHeader {
  int n_valid;
  unsigned done;  // row CTAs finished (zeroed by the count kernel; the last one takes the mean)
  int pad[2];
};
constexpr std::size_t kRowLossOffset = sizeof(CeHeader);

__device__ __forceinline__ bool label_valid(int label, int vocab, int ignore_index) {
  return label != ignore_index && label >= 0 && label < vocab;
}

// ---- log-sum-exp in log2 units: m = max y, s = sum 2^(y - m), y = x * log2(e) ----
// -FLT_MAX (not -inf) is the empty maximum, so combining two empty parts gives 2^0 * 0, not NaN.

__device__ __forceinline__ void lse_combine(float& m, float& s, float m2, float s2) {
  const float mn = fmaxf(m, m2);
  s = s * fast_ex2(m - mn) + s2 * fast_ex2(m2 - mn);
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

// The running maximum of eight 16-bit values in packed pairs of T (one instruction per pair; a NaN
// loses to a number, as with fmaxf: the NaN reaches the sum instead).
template <typename T>
__device__ __forceinline__ pair16_t<T> max8(pair16_t<T> acc, uint4 raw) {
  const pair16_t<T>* h = reinterpret_cast<const pair16_t<T>*>(&raw);
  return __hmax2(acc, __hmax2(__hmax2(h[0], h[1]), __hmax2(h[2], h[3])));
}

// sum 2^(x_i log2e - m) over eight 16-bit values.
template <typename T>
__device__ __forceinline__ float sum_ex2_8(uint4 raw, float m) {
  float f[8];
  unpack8<T>(raw, f);
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = fast_ex2(fmaf(f[i], kLog2e, -m));
  return ((f[0] + f[1]) + (f[2] + f[3])) + ((f[4] + f[5]) + (f[6] + f[7]));
}

// Programmatic dependent launch (sm_90): the count kernel lets the row kernel start at once, and
// the row kernel waits for the count kernel's results (memory visible) only where it needs them.
__device__ __forceinline__ void pdl_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// The cluster barrier in its two halves (every thread of every CTA of the cluster takes part):
// arrive releases this thread's earlier memory accesses, wait acquires the other CTAs'.
// A release arrive is a GPU-scope MEMBAR in every thread that takes it, so only the warp whose
// accesses must be ordered releases (the choice is warp-uniform, as .aligned requires); the
// other warps arrive relaxed.
__device__ __forceinline__ void cluster_arrive(bool release) {
  if (release) asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  else asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
// Orders this thread's earlier writes (a row loss) before its later ones (the done count), and
// the done count's read before the later loss reads; weaker and cheaper than __threadfence's SC.
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

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

// ---- kernel 2: a cluster of CTAs per row ----

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
  int park_vecs;  // 16-byte vectors of its slice a CTA parks in shared memory, at most
  int rows;
  float* loss_mean;  // written by the last CTA
  int split;         // CTAs (one thread-block cluster) per row
};

// The fused finish: every CTA counts itself done; the last one (it sees every other CTA's row
// loss after the fences) takes the mean in a fixed order, so the result stays deterministic.
// Called by every thread of the CTA.
// `wrote_loss`: this CTA's thread 0 wrote a row loss, which its fence orders before the count.
template <class Args>
__device__ __forceinline__ void ce_finish_in_last_block(const Args& a, bool wrote_loss) {
  __shared__ bool is_last;
  __shared__ double sm[32];
  pdl_wait();  // hdr->done and n_valid come from the count kernel
  if (threadIdx.x == 0) {
    if (wrote_loss) fence_acq_rel_gpu();
    is_last = atomicAdd(&a.hdr->done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!is_last) return;
  fence_acq_rel_gpu();
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
// body's elements cost one fma and one ex2 each; the sign of gs goes onto the 16-bit values' sign
// bits (bit 15 of each half, in bf16 and fp16 alike).
struct GradScale {
  float c_scaled;      // c - log2 |gs| (+inf when gs = 0: every element 0)
  float abs_gs;        // |gs|: subtracted at the label's element
  unsigned sign_bits;  // 0x80008000 when gs < 0, else 0
};
__device__ __forceinline__ GradScale grad_scale_of(float c, float gs) {
  return {c - log2f(fabsf(gs)), fabsf(gs), gs < 0.f ? 0x80008000u : 0u};
}

// Eight gradient elements from their raw 16-bit logits, packed as eight T; `off`: the label's
// index within the eight (any other value: not among them).
template <typename T>
__device__ __forceinline__ uint4 grad8(uint4 raw, int off, const GradScale& g) {
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
  return out;
}

// One row per cluster of a.split CTAs (a.split = 1: one CTA, no cluster). The row is cut as
// ce::row_slice says (a scalar head to the first 16-byte boundary, aligned 16-byte vectors, a
// scalar tail); CTA `rank` owns the vectors [v_begin, v_end) of an even split and parks the first
// a.park_vecs of them in shared memory with one bulk copy (all of them unless the row is longer
// than ce::kMaxSplit CTAs can park). Rank 0 also owns the head, the tail, the label's logit, the
// row loss and the padding columns. Each thread walks the vectors v_begin + tid + k * kThreads in
// every pass, so a vector read from global memory (or from the slice) is written back by the
// thread that read it, and a CTA writes only its own elements: the only element read across CTAs
// is the label's logit, which rank 0 reads before the cluster barrier that every gradient write
// follows.
//
// The grid holds rows * a.split CTAs; a CTA past the last row (none at that grid) only counts itself
// done. The cluster's (max, sum) exchange has one slot per CTA (cluster_ms): arrive/wait (the
// slots written, then read in rank order), then an arrive (done reading) whose wait comes just
// before this CTA exits, so no CTA frees a slot another still reads. Validity is per row, so every
// CTA of the cluster takes the exchange or none does.
template <typename T, class Tile, bool kGrad>
__global__ void __launch_bounds__(Tile::kThreads, Tile::kMinBlocksPerSm) ce_row_kernel(RowArgs<T> a) {
  constexpr int kThreads = Tile::kThreads;
  extern __shared__ uint4 slice[];  // a.park_vecs vectors
  __shared__ alignas(8) std::uint64_t landed;
  __shared__ float2 cluster_ms;  // this CTA's (m, s), read by the other CTAs of the row
  __shared__ float2 row_ms;      // the row's (m, s), combined by warp 0 from every CTA's
  const int split = a.split;
  const int rank = static_cast<int>(blockIdx.x % static_cast<unsigned>(split));
  const int row = static_cast<int>(blockIdx.x / static_cast<unsigned>(split));
  const bool owner = rank == 0;
  const int tid = threadIdx.x;

  // Thread 0: the bulk copy of this CTA's parked vectors of the row. It starts before the row's
  // label is known (an ignored row's copy is wasted, but no row waits for its label's latency
  // before its bytes are requested).
  if (tid == 0) {
    mbar_init(&landed);
    if (row < a.rows) {
      const T* xr = a.logits + static_cast<std::size_t>(row) * a.ld;
      const ce::RowSlice cut = ce::row_slice(reinterpret_cast<std::uintptr_t>(xr), a.vocab, split, rank);
      const int parked_end = min(cut.v_end, cut.v_begin + a.park_vecs);
      const auto bytes = static_cast<std::uint32_t>(parked_end - cut.v_begin) * 16u;
      mbar_expect_bytes(&landed, bytes);
      if (bytes > 0) bulk_load(slice, xr + cut.head + static_cast<std::size_t>(cut.v_begin) * 8, bytes, &landed);
    }
  }
  __syncthreads();  // the barrier is initialized before any thread waits on it

  bool exchange_pending = false;  // the exchange's "done reading" arrive awaits its wait
  if (row < a.rows) {
    T* x = a.logits + static_cast<std::size_t>(row) * a.ld;
    const ce::RowSlice cut = ce::row_slice(reinterpret_cast<std::uintptr_t>(x), a.vocab, split, rank);
    const int head = cut.head, tail_start = cut.tail_start, v_begin = cut.v_begin, v_end = cut.v_end;
    const int head_here = owner ? head : 0;
    const int tail_here = owner ? a.vocab - tail_start : 0;
    T* body = x + head;
    const int parked_end = min(v_end, v_begin + a.park_vecs);  // [v_begin, parked_end) in `slice`
    const int label = a.labels[row];
    const bool valid = label_valid(label, a.vocab, a.ignore_index);

    if (!valid) {  // cluster-uniform: ignored (or bad-label) row: no loss, zero gradient
      if (tid == 0 && owner) write_row_loss(a, row, 0.f);
      if constexpr (kGrad) {
        for (int v = v_begin + tid; v < v_end; v += kThreads)
          store16<Store::Streaming>(body + static_cast<std::size_t>(v) * 8, make_uint4(0, 0, 0, 0));
        if (owner) {
          zero_scalar(x, 0, head);
          zero_scalar(x, tail_start, a.ld);  // tail and padding
        }
      }
      mbar_wait(&landed, 0);  // no CTA exits while a copy into its shared memory is in flight
    } else {
      // While the copy is in flight: rank 0's scalars, read before the cluster barrier below
      // (every gradient write of the row comes after it).
      float x_head = 0.f, x_tail = 0.f, x_label = 0.f;
      if (tid < head_here) x_head = to_f32(x[tid]);
      if (tid < tail_here) x_tail = to_f32(x[tail_start + tid]);
      if (tid == 0 && owner) x_label = to_f32(x[label]);
      auto vec_at = [&](int v) {
        return v < parked_end ? slice[v - v_begin] : load16(body + static_cast<std::size_t>(v) * 8);
      };
      mbar_wait(&landed, 0);

      // ---- this thread's maximum, then its sum of exponentials under it (no rescaling) ----
      pair16_t<T> mx2 = pack2_rn<T>(-INFINITY, -INFINITY);
      for (int v = v_begin + tid; v < v_end; v += kThreads) mx2 = max8<T>(mx2, vec_at(v));
      const float2 mxf = to_f32x2(mx2);
      float mx = fmaxf(mxf.x, mxf.y);
      if (tid < head_here) mx = fmaxf(mx, x_head);
      if (tid < tail_here) mx = fmaxf(mx, x_tail);
      float m = fmaxf(mx * kLog2e, -FLT_MAX), s = 0.f;
      if (tid < head_here) s += fast_ex2(fmaf(x_head, kLog2e, -m));
      if (tid < tail_here) s += fast_ex2(fmaf(x_tail, kLog2e, -m));
#pragma unroll 2
      for (int v = v_begin + tid; v < v_end; v += kThreads) s += sum_ex2_8<T>(vec_at(v), m);
      lse_block(m, s);
      if (split > 1) {  // the row's (m, s) from every CTA's, in rank order (the same bits in each CTA)
        namespace cg = cooperative_groups;
        cg::cluster_group cg_cluster = cg::this_cluster();
        // Thread 0 wrote the slot, so warp 0 alone releases; warp 0 alone reads the slots (lane r
        // reads rank r's) and releases again once done, so every remote read is ordered before the
        // arrive that lets the slot's CTA exit. The other warps take both arrives relaxed.
        const bool warp0 = tid < 32;
        if (tid == 0) cluster_ms = make_float2(m, s);
        cluster_arrive(warp0);
        cluster_wait();
        if (warp0) {
          float2 mine = make_float2(-FLT_MAX, 0.f);
          if (tid < split) mine = *cg_cluster.map_shared_rank(&cluster_ms, static_cast<unsigned>(tid));
          float mm = -FLT_MAX, ss = 0.f;
          for (int r = 0; r < split; ++r)
            lse_combine(mm, ss, __shfl_sync(0xffffffffu, mine.x, r), __shfl_sync(0xffffffffu, mine.y, r));
          if (tid == 0) row_ms = make_float2(mm, ss);
        }
        cluster_arrive(warp0);  // done reading the others' cluster_ms; waited on before this CTA exits
        exchange_pending = true;
        __syncthreads();  // row_ms written
        m = row_ms.x, s = row_ms.y;
      }
      const float c = m + log2f(s);  // log2 of the softmax denominator: p_j = 2^(x_j log2e - c)
      if (tid == 0 && owner) write_row_loss(a, row, c * kLn2 - x_label);

      if constexpr (kGrad) {
        // ---- dlogits = (softmax - onehot) * grad_scale / n_valid, over the logits ----
        pdl_wait();  // n_valid from the count kernel, which ran alongside the first copies
        const float gs = (a.device_grad_scale ? a.grad_scale * *a.device_grad_scale : a.grad_scale) /
                         static_cast<float>(max(a.hdr->n_valid, 1));
        if (tid < head_here) x[tid] = grad_of<T>(x_head, tid == label, c, gs);
        if (tid < tail_here) x[tail_start + tid] = grad_of<T>(x_tail, tail_start + tid == label, c, gs);
        const int label_off = label - head;  // the label's position in the body (may lie outside it)
        const GradScale g = grad_scale_of(c, gs);
#pragma unroll 2
        for (int v = v_begin + tid; v < v_end; v += kThreads) {
          const uint4 out = grad8<T>(vec_at(v), label_off - v * 8, g);
          store16<Store::Streaming>(body + static_cast<std::size_t>(v) * 8, out);
        }
        if (owner) zero_scalar(x, a.vocab, a.ld);  // padding columns
      }
    }
  }
  if (split > 1 && exchange_pending) cluster_wait();  // no CTA exits while another may still read its cluster_ms
  ce_finish_in_last_block(a, owner && row < a.rows);  // rank 0 of a real row wrote its loss
}

// The bytes of shared memory a CTA may use: the device's opt-in maximum.
int smem_optin() {
  int dev = 0, optin = 0;
  CUTRAIN_CUDA_CHECK(cudaGetDevice(&dev));
  CUTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return optin;
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
  const long long ctas = static_cast<long long>(rows) * cross_entropy_ctas_per_row(vocab);
  CUTRAIN_CHECK(ctas <= INT_MAX, fn, ": rows * CTAs per row = ", rows, " * ", cross_entropy_ctas_per_row(vocab),
                " exceeds the grid limit ", INT_MAX);
}

// One instance of the row kernel, set up for launch: its shared memory (dynamic size, the largest
// carve-out so several parked slices fit per SM; L1 is not needed) and the static part checked
// against the budget kept out of the parked slice.
template <typename T, bool kGrad>
struct RowKernel {
  static constexpr auto kernel = ce_row_kernel<T, CeTile, kGrad>;

  // The 16-byte vectors a CTA parks (ce::park_vecs); the dynamic shared memory is 16 bytes each.
  static int prepare(int vocab, int split) {
    const int park_vecs = ce::park_vecs(ce::slice_vecs(vocab, split), smem_optin());
    // The static part is the build's, not the call's: checked once per instance (a throw leaves
    // it unchecked, so the next call throws again).
    static const bool static_fits = [] {
      cudaFuncAttributes fa{};
      CUTRAIN_CUDA_CHECK(cudaFuncGetAttributes(&fa, kernel));
      CUTRAIN_CHECK(fa.sharedSizeBytes <= static_cast<std::size_t>(ce::kStaticSmemBytes),
                    "cross-entropy row kernel: static shared memory ", fa.sharedSizeBytes, " bytes exceeds the ",
                    ce::kStaticSmemBytes, " bytes kept out of the slice budget");
      return true;
    }();
    (void)static_fits;
    CUTRAIN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, park_vecs * 16));
    CUTRAIN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                            static_cast<int>(cudaSharedmemCarveoutMaxShared)));
    return park_vecs;
  }
};

// The row kernel is a programmatic dependent of the count kernel (its copies start while the
// labels are counted) and its last CTA takes the mean (no finish launch).
template <bool kGrad, typename T>
void run(cudaStream_t s, T* logits, const int32_t* labels, int rows, int vocab, int ld, float* loss_mean,
         float* row_loss, int* status, void* scratch, int ignore_index, float grad_scale,
         const float* device_grad_scale) {
  using K = RowKernel<T, kGrad>;
  const int split = cross_entropy_ctas_per_row(vocab);
  const int park_vecs = K::prepare(vocab, split);

  auto* hdr = static_cast<CeHeader*>(scratch);
  auto* row_loss_tmp = reinterpret_cast<float*>(static_cast<char*>(scratch) + kRowLossOffset);
  ce_count_kernel<<<1, kSmallThreads, 0, s>>>(labels, rows, vocab, ignore_index, hdr, status);
  CUTRAIN_LAUNCH_CHECK("ce_count_kernel");

  RowArgs<T> a{logits,  labels, vocab, ld,       ignore_index, grad_scale,     device_grad_scale,
               hdr,     row_loss_tmp, row_loss, park_vecs, rows, loss_mean, split};
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(rows) * static_cast<unsigned>(split));
  cfg.blockDim = dim3(CeTile::kThreads);
  cfg.dynamicSmemBytes = static_cast<std::size_t>(park_vecs) * 16;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  attr[1].id = cudaLaunchAttributeClusterDimension;
  attr[1].val.clusterDim.x = static_cast<unsigned>(split);
  attr[1].val.clusterDim.y = 1;
  attr[1].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = split > 1 ? 2 : 1;
  CUTRAIN_CUDA_CHECK(cudaLaunchKernelEx(&cfg, K::kernel, a));
  CUTRAIN_LAUNCH_CHECK(kGrad ? "ce_row_kernel<grad>" : "ce_row_kernel<forward>");
}

}  // namespace

int cross_entropy_ctas_per_row(int vocab) {
  const long long bytes = 2LL * std::max(vocab, 1);
  return static_cast<int>(std::clamp<long long>(ceil_div<long long>(bytes, kSliceBytes), 1, ce::kMaxSplit));
}

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

#define CUTRAIN_CE_INSTANCES(T)                                                                                      \
  template void cross_entropy_forward_backward<T>(cudaStream_t, T*, const int32_t*, int, int, int, float*, float*,   \
                                                  int*, void*, int, float, const float*);                            \
  template void cross_entropy_forward<T>(cudaStream_t, const T*, const int32_t*, int, int, int, float*, float*, int*, \
                                         void*, int);
CUTRAIN_CE_INSTANCES(bf16)
CUTRAIN_CE_INSTANCES(f16)
#undef CUTRAIN_CE_INSTANCES

}  // namespace cutrain::kernels
