// @brief The vocabulary-parallel cross-entropy's passes (see vocab_parallel_loss.cuh): one block
// per row for the row passes (the slice is 1/T of the vocabulary, read from HBM by each pass: the
// all-reduces between passes make a single fused pass impossible), one block for the label count
// and one for the fixed-order mean.
#include "kernels/vocab_parallel_loss.cuh"

#include <algorithm>
#include <climits>
#include <cmath>

#include "kernels/common/reduce.cuh"
#include "kernels/common/vec.cuh"
#include "runtime/check.h"

namespace cutrain::kernels {

namespace {

// Threads of the row passes and of the single-block passes.
struct VpTile {
  static constexpr int kRowThreads = 256;
  static constexpr int kSmallThreads = 1024;
};

struct VpHeader {
  int n_valid;
  int pad[3];
};
constexpr std::size_t kRowLossOffset = sizeof(VpHeader);

__device__ __forceinline__ int real_cols(int ld, int col_begin, int vocab) {
  return max(0, min(ld, vocab - col_begin));
}
__device__ __forceinline__ bool label_valid(int32_t label, int vocab, int ignore_index) {
  return label != ignore_index && label >= 0 && label < vocab;
}

__global__ void __launch_bounds__(VpTile::kRowThreads)
    vp_max_kernel(const bf16* logits, int ld, int col_begin, int vocab, float* row_max) {
  __shared__ float red[VpTile::kRowThreads / kWarpSize];
  const std::size_t r = blockIdx.x;
  const bf16* row = logits + r * std::size_t(ld);
  const int n = real_cols(ld, col_begin, vocab);
  float m = -INFINITY;
  for (int j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, to_f32(row[j]));
  m = block_max(m, red);
  if (threadIdx.x == 0) row_max[r] = m;
}

__global__ void __launch_bounds__(VpTile::kRowThreads)
    vp_sums_kernel(const bf16* logits, const int32_t* labels, int rows, int ld, int col_begin, int vocab,
                   const float* row_max, float* stats, int ignore_index) {
  __shared__ float red[VpTile::kRowThreads / kWarpSize];
  const std::size_t r = blockIdx.x;
  const bf16* row = logits + r * std::size_t(ld);
  const int n = real_cols(ld, col_begin, vocab);
  const float m = row_max[r];
  float sum = 0.f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) sum += expf(to_f32(row[j]) - m);
  sum = block_sum(sum, red);
  if (threadIdx.x == 0) {
    const int32_t label = labels[r];
    const bool here = label_valid(label, vocab, ignore_index) && label >= col_begin && label < col_begin + n;
    stats[r] = sum;
    stats[std::size_t(rows) + r] = here ? to_f32(row[label - col_begin]) : 0.f;
  }
}

// The non-ignored rows (the mean's denominator, needed before any gradient) and the first bad label.
__global__ void __launch_bounds__(VpTile::kSmallThreads)
    vp_count_kernel(const int32_t* labels, int rows, int vocab, int ignore_index, VpHeader* header, int* status) {
  __shared__ int valid, first_bad;
  if (threadIdx.x == 0) {
    valid = 0;
    first_bad = INT_MAX;
  }
  __syncthreads();
  int mine = 0, bad = INT_MAX;
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    const int32_t label = labels[r];
    if (label_valid(label, vocab, ignore_index)) ++mine;
    else if (label != ignore_index) bad = min(bad, r);
  }
  atomicAdd(&valid, mine);  // integer: the count does not depend on the order
  atomicMin(&first_bad, bad);
  __syncthreads();
  if (threadIdx.x == 0) {
    header->n_valid = valid;
    if (status) *status = first_bad == INT_MAX ? 0 : first_bad + 1;
  }
}

__global__ void __launch_bounds__(VpTile::kRowThreads)
    vp_row_kernel(bf16* logits, const int32_t* labels, int rows, int ld, int col_begin, int vocab,
                  const float* row_max, const float* stats, float* row_loss_scratch, float* row_loss,
                  const VpHeader* header, bool grad, int ignore_index, float grad_scale,
                  const float* device_grad_scale) {
  const std::size_t r = blockIdx.x;
  const int32_t label = labels[r];
  const bool valid = label_valid(label, vocab, ignore_index);
  const float m = row_max[r], sum = stats[r], target = stats[std::size_t(rows) + r];
  if (threadIdx.x == 0) {
    const float loss = valid ? logf(sum) + m - target : 0.f;
    row_loss_scratch[r] = loss;
    if (row_loss) row_loss[r] = loss;
  }
  if (!grad) return;
  const int n_valid = header->n_valid;
  float scale = grad_scale * (device_grad_scale ? *device_grad_scale : 1.f);
  scale = valid && n_valid > 0 ? scale / float(n_valid) : 0.f;
  const float inv_sum = 1.f / sum;
  const int n = real_cols(ld, col_begin, vocab);
  bf16* row = logits + r * std::size_t(ld);
  for (int j = threadIdx.x; j < ld; j += blockDim.x) {
    float g = 0.f;
    if (j < n && scale != 0.f) {
      const float p = expf(to_f32(row[j]) - m) * inv_sum;
      g = (p - (col_begin + j == label ? 1.f : 0.f)) * scale;
    }
    row[j] = from_f32<bf16>(g);
  }
}

// The mean of the row losses over the non-ignored rows, summed in a fixed order.
__global__ void __launch_bounds__(VpTile::kSmallThreads)
    vp_mean_kernel(const float* row_loss, int rows, const VpHeader* header, float* loss_mean) {
  __shared__ float red[VpTile::kSmallThreads / kWarpSize];
  float sum = 0.f;
  for (int r = threadIdx.x; r < rows; r += blockDim.x) sum += row_loss[r];
  sum = block_sum(sum, red);
  if (threadIdx.x == 0) *loss_mean = header->n_valid > 0 ? sum / float(header->n_valid) : 0.f;
}

void check_shape(const char* what, int rows, int ld, int col_begin, int vocab) {
  CUTRAIN_CHECK(rows > 0 && ld > 0, what, ": expected rows > 0 and a slice width > 0, found rows ", rows, ", width ",
                ld);
  CUTRAIN_CHECK(vocab > 0 && col_begin >= 0, what, ": expected vocab > 0 and a slice start >= 0, found vocab ", vocab,
                ", start ", col_begin);
}

}  // namespace

void vocab_parallel_ce_max(cudaStream_t s, const bf16* logits, int rows, int ld, int col_begin, int vocab,
                           float* row_max) {
  check_shape("vocab_parallel_ce_max", rows, ld, col_begin, vocab);
  vp_max_kernel<<<rows, VpTile::kRowThreads, 0, s>>>(logits, ld, col_begin, vocab, row_max);
  CUTRAIN_CUDA_CHECK(cudaGetLastError());
}

void vocab_parallel_ce_sums(cudaStream_t s, const bf16* logits, const int32_t* labels, int rows, int ld,
                            int col_begin, int vocab, const float* row_max, float* stats, int ignore_index) {
  check_shape("vocab_parallel_ce_sums", rows, ld, col_begin, vocab);
  vp_sums_kernel<<<rows, VpTile::kRowThreads, 0, s>>>(logits, labels, rows, ld, col_begin, vocab, row_max, stats,
                                                      ignore_index);
  CUTRAIN_CUDA_CHECK(cudaGetLastError());
}

std::size_t vocab_parallel_ce_scratch_bytes(int rows) {
  return kRowLossOffset + std::size_t(std::max(rows, 0)) * sizeof(float);
}

void vocab_parallel_ce_finish(cudaStream_t s, bf16* logits, const int32_t* labels, int rows, int ld, int col_begin,
                              int vocab, const float* row_max, const float* stats, float* loss_mean, float* row_loss,
                              int* status, void* scratch, bool grad, int ignore_index, float grad_scale,
                              const float* device_grad_scale) {
  check_shape("vocab_parallel_ce_finish", rows, ld, col_begin, vocab);
  CUTRAIN_CHECK(scratch && is_aligned16(scratch), "vocab_parallel_ce_finish: expected a 16-byte aligned scratch of ",
                vocab_parallel_ce_scratch_bytes(rows), " bytes");
  auto* header = static_cast<VpHeader*>(scratch);
  auto* losses = reinterpret_cast<float*>(static_cast<char*>(scratch) + kRowLossOffset);
  vp_count_kernel<<<1, VpTile::kSmallThreads, 0, s>>>(labels, rows, vocab, ignore_index, header, status);
  CUTRAIN_CUDA_CHECK(cudaGetLastError());
  vp_row_kernel<<<rows, VpTile::kRowThreads, 0, s>>>(logits, labels, rows, ld, col_begin, vocab, row_max, stats,
                                                     losses, row_loss, header, grad, ignore_index, grad_scale,
                                                     device_grad_scale);
  CUTRAIN_CUDA_CHECK(cudaGetLastError());
  vp_mean_kernel<<<1, VpTile::kSmallThreads, 0, s>>>(losses, rows, header, loss_mean);
  CUTRAIN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cutrain::kernels
