// @brief Knowledge distillation's KL loss and its gradient (kernels/kd_loss.cuh).
#include "kernels/kd_loss.cuh"

#include <cmath>

#include "kernels/common/reduce.cuh"
#include "runtime/check.h"

namespace cutrain::kernels {
namespace {

// The one tile shape: a block of 512 threads walks a row (50k columns: ~100 per thread).
struct KdTile {
  static constexpr int kThreads = 512;
  static constexpr int kWarps = kThreads / kWarpSize;
  static constexpr int kMeanThreads = 256;  // the mean's single block
};

// Online statistics of one row: the running max and sum of exp of student / T (ms, zs) and of
// teacher / T (mt, zt), and the cross term a = sum exp(t - mt) * (t - s) at the teacher's max.
struct RowStats {
  float ms, zs, mt, zt, a;
};

__device__ __forceinline__ RowStats empty_stats() { return {-INFINITY, 0.f, -INFINITY, 0.f, 0.f}; }

// x's statistics and y's combined at the larger maxima (an empty side has max -inf and adds 0).
__device__ __forceinline__ RowStats combine(RowStats x, const RowStats& y) {
  const float ms = fmaxf(x.ms, y.ms), mt = fmaxf(x.mt, y.mt);
  const float fxs = x.ms == -INFINITY ? 0.f : __expf(x.ms - ms), fys = y.ms == -INFINITY ? 0.f : __expf(y.ms - ms);
  const float fxt = x.mt == -INFINITY ? 0.f : __expf(x.mt - mt), fyt = y.mt == -INFINITY ? 0.f : __expf(y.mt - mt);
  return {ms, x.zs * fxs + y.zs * fys, mt, x.zt * fxt + y.zt * fyt, x.a * fxt + y.a * fyt};
}

__device__ __forceinline__ RowStats shfl_xor(const RowStats& v, int o) {
  return {__shfl_xor_sync(kFullMask, v.ms, o), __shfl_xor_sync(kFullMask, v.zs, o),
          __shfl_xor_sync(kFullMask, v.mt, o), __shfl_xor_sync(kFullMask, v.zt, o),
          __shfl_xor_sync(kFullMask, v.a, o)};
}

// The block's statistics in every thread, combined in a fixed order (deterministic).
__device__ RowStats block_combine(RowStats v, RowStats* smem) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = combine(v, shfl_xor(v, o));
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  RowStats t = lane < KdTile::kWarps ? smem[lane] : empty_stats();
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) t = combine(t, shfl_xor(t, o));
  return t;
}

template <bool kAccumulate>
__global__ void __launch_bounds__(KdTile::kThreads)
    kd_row_kernel(const bf16* student, int ld_s, const bf16* teacher, int ld_t, int vocab,
                  float inv_temp, float grad_mult, float* row_kl, bf16* dstudent, int ld_d) {
  __shared__ RowStats smem[KdTile::kWarps];
  const std::size_t row = blockIdx.x;
  // Not __restrict__: dstudent may be the student's or the teacher's buffer (in place).
  const bf16* s_row = student + row * std::size_t(ld_s);
  const bf16* t_row = teacher + row * std::size_t(ld_t);
  RowStats st = empty_stats();
  for (int v = threadIdx.x; v < vocab; v += KdTile::kThreads) {
    const float s = __bfloat162float(s_row[v]) * inv_temp, t = __bfloat162float(t_row[v]) * inv_temp;
    if (s > st.ms) {
      st.zs = st.zs * __expf(st.ms - s) + 1.f;
      st.ms = s;
    } else {
      st.zs += __expf(s - st.ms);
    }
    if (t > st.mt) {
      const float f = __expf(st.mt - t);
      st.zt = st.zt * f + 1.f;
      st.a = st.a * f + (t - s);
      st.mt = t;
    } else {
      const float e = __expf(t - st.mt);
      st.zt += e;
      st.a += e * (t - s);
    }
  }
  const RowStats r = block_combine(st, smem);
  const float log_zs = r.ms + logf(r.zs), log_zt = r.mt + logf(r.zt);
  if (row_kl && threadIdx.x == 0) row_kl[row] = r.a / r.zt - log_zt + log_zs;
  if (!dstudent) return;
  bf16* d_row = dstudent + row * std::size_t(ld_d);
  for (int v = threadIdx.x; v < vocab; v += KdTile::kThreads) {
    const float s = __bfloat162float(s_row[v]) * inv_temp, t = __bfloat162float(t_row[v]) * inv_temp;
    float g = grad_mult * (__expf(s - log_zs) - __expf(t - log_zt));
    if constexpr (kAccumulate) g += __bfloat162float(d_row[v]);
    d_row[v] = __float2bfloat16(g);
  }
  if constexpr (!kAccumulate)
    for (int v = vocab + threadIdx.x; v < ld_d; v += KdTile::kThreads) d_row[v] = __float2bfloat16(0.f);
}

// T^2 * mean of row_kl: each thread sums its strided rows in order, then one fixed-order block sum.
__global__ void __launch_bounds__(KdTile::kMeanThreads)
    kd_mean_kernel(const float* __restrict__ row_kl, int rows, float scale, float* loss_mean) {
  __shared__ float smem[KdTile::kMeanThreads / kWarpSize];
  float acc = 0.f;
  for (int m = threadIdx.x; m < rows; m += KdTile::kMeanThreads) acc += row_kl[m];
  const float total = block_sum(acc, smem);
  if (threadIdx.x == 0) *loss_mean = rows > 0 ? total * scale : 0.f;
}

// One block per row: dlogits += kd over the row's first `vocab` columns.
__global__ void __launch_bounds__(KdTile::kThreads)
    kd_add_kernel(bf16* __restrict__ dlogits, int ld, const bf16* __restrict__ kd, int ld_k, int vocab) {
  bf16* d = dlogits + std::size_t(blockIdx.x) * ld;
  const bf16* k = kd + std::size_t(blockIdx.x) * ld_k;
  for (int v = threadIdx.x; v < vocab; v += KdTile::kThreads)
    d[v] = __float2bfloat16(__bfloat162float(d[v]) + __bfloat162float(k[v]));
}

}  // namespace

void kd_add_grad(cudaStream_t s, bf16* dlogits, int ld, const bf16* kd, int ld_k, int rows, int vocab) {
  CUTRAIN_CHECK(rows >= 0 && vocab >= 1 && ld >= vocab && ld_k >= vocab, "kd_add_grad: expected rows >= 0 and ",
                "leading dimensions (", ld, ", ", ld_k, ") >= vocab ", vocab, " >= 1, got rows ", rows);
  CUTRAIN_CHECK(static_cast<const void*>(dlogits) != static_cast<const void*>(kd), "kd_add_grad: the two buffers alias");
  if (rows == 0) return;
  kd_add_kernel<<<rows, KdTile::kThreads, 0, s>>>(dlogits, ld, kd, ld_k, vocab);
  CUTRAIN_CUDA_CHECK(cudaGetLastError());
}

std::size_t kd_loss_scratch_bytes(int rows) { return (std::size_t(rows > 0 ? rows : 0) * sizeof(float) + 15) / 16 * 16; }

void kd_loss_forward_backward(cudaStream_t s, const bf16* student, int ld_s, const bf16* teacher, int ld_t, int rows,
                              int vocab, float temperature, float grad_scale, float* row_kl, float* loss_mean,
                              bf16* dstudent, int ld_d, bool accumulate, void* scratch) {
  CUTRAIN_CHECK(temperature > 0.f && std::isfinite(temperature), "kd_loss: temperature must be finite and > 0, got ",
                temperature);
  CUTRAIN_CHECK(rows >= 0 && vocab >= 1, "kd_loss: expected rows >= 0 and vocab >= 1, got rows ", rows, ", vocab ",
                vocab);
  CUTRAIN_CHECK(ld_s >= vocab && ld_t >= vocab && (!dstudent || ld_d >= vocab), "kd_loss: leading dimensions (student ",
                ld_s, ", teacher ", ld_t, ", gradient ", ld_d, ") must be >= vocab ", vocab);
  CUTRAIN_CHECK(!accumulate || !dstudent ||
                    (static_cast<const void*>(dstudent) != static_cast<const void*>(student) &&
                     static_cast<const void*>(dstudent) != static_cast<const void*>(teacher)),
                "kd_loss: accumulate needs a gradient buffer apart from the student's and the teacher's logits");
  CUTRAIN_CHECK(!dstudent || static_cast<const void*>(dstudent) != static_cast<const void*>(teacher) || ld_d == ld_t,
                "kd_loss: a gradient written over the teacher's logits needs their leading dimension ", ld_t,
                ", got ", ld_d);
  CUTRAIN_CHECK(!dstudent || static_cast<const void*>(dstudent) != static_cast<const void*>(student) || ld_d == ld_s,
                "kd_loss: a gradient written over the student's logits needs their leading dimension ", ld_s,
                ", got ", ld_d);
  if (rows == 0) {
    if (loss_mean) CUTRAIN_CUDA_CHECK(cudaMemsetAsync(loss_mean, 0, sizeof(float), s));
    return;
  }
  float* kl = row_kl;
  if (!kl && loss_mean) {
    CUTRAIN_CHECK(scratch != nullptr, "kd_loss: loss_mean without row_kl needs kd_loss_scratch_bytes(rows) of scratch");
    kl = static_cast<float*>(scratch);
  }
  const float inv_temp = 1.f / temperature;
  const float grad_mult = grad_scale * temperature / float(rows);
  if (accumulate)
    kd_row_kernel<true><<<rows, KdTile::kThreads, 0, s>>>(student, ld_s, teacher, ld_t, vocab, inv_temp, grad_mult, kl,
                                                          dstudent, ld_d);
  else
    kd_row_kernel<false><<<rows, KdTile::kThreads, 0, s>>>(student, ld_s, teacher, ld_t, vocab, inv_temp, grad_mult,
                                                           kl, dstudent, ld_d);
  CUTRAIN_CUDA_CHECK(cudaGetLastError());
  if (loss_mean) {
    kd_mean_kernel<<<1, KdTile::kMeanThreads, 0, s>>>(kl, rows, temperature * temperature / float(rows), loss_mean);
    CUTRAIN_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace cutrain::kernels
