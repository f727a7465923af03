// @brief kernels/moe_jitter.cuh: elementwise, a grid-stride loop of single elements (the draw per
// element costs more than the access; the gate's input is small next to the experts' GEMMs).
#include "kernels/moe_jitter.cuh"

#include <algorithm>

#include "kernels/common/counter_uniform.cuh"
#include "runtime/check.h"
#include "runtime/nvtx.h"

namespace cutrain::kernels {
namespace {

__device__ __forceinline__ float jitter(float eps, std::uint64_t seed, std::size_t i) {
  return 1.f - eps + 2.f * eps * counter_uniform(seed, i);
}

// The seed: seed_xor, or *seed_word ^ seed_xor.
__device__ __forceinline__ std::uint64_t seed_of(std::uint64_t seed_xor, const std::uint64_t* seed_word) {
  return seed_word ? *seed_word ^ seed_xor : seed_xor;
}

__global__ void jitter_forward_kernel(const bf16* __restrict__ x, bf16* __restrict__ xj, std::size_t n, float eps,
                                      std::uint64_t seed_xor, const std::uint64_t* seed_word) {
  const std::uint64_t seed = seed_of(seed_xor, seed_word);
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    xj[i] = __float2bfloat16_rn(__bfloat162float(x[i]) * jitter(eps, seed, i));
}

__global__ void jitter_backward_kernel(const bf16* __restrict__ g, bf16* __restrict__ dx, std::size_t n, float eps,
                                       std::uint64_t seed_xor, const std::uint64_t* seed_word) {
  const std::uint64_t seed = seed_of(seed_xor, seed_word);
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    dx[i] = __float2bfloat16_rn(__bfloat162float(dx[i]) + __bfloat162float(g[i]) * jitter(eps, seed, i));
}

unsigned grid_of(std::size_t n) { return static_cast<unsigned>(std::min<std::size_t>((n + 255) / 256, 132u * 16u)); }

void check(const char* fn, const void* a, const void* b, std::size_t n, float eps) {
  CUTRAIN_CHECK(a && b, fn, ": pointers must be non-null");
  CUTRAIN_CHECK(n > 0, fn, ": n must be > 0");
  CUTRAIN_CHECK(eps >= 0.f && eps < 1.f, fn, ": eps must be in [0, 1), got ", eps);
}

}  // namespace

void moe_jitter_forward(cudaStream_t s, const bf16* x, bf16* xj, std::size_t n, float eps, std::uint64_t seed,
                        const std::uint64_t* seed_word) {
  check("moe_jitter_forward", x, xj, n, eps);
  NvtxRange range("moe_jitter_fwd");
  jitter_forward_kernel<<<grid_of(n), 256, 0, s>>>(x, xj, n, eps, seed, seed_word);
  CUTRAIN_LAUNCH_CHECK("jitter_forward_kernel");
}

void moe_jitter_backward(cudaStream_t s, const bf16* g, bf16* dx, std::size_t n, float eps, std::uint64_t seed,
                         const std::uint64_t* seed_word) {
  check("moe_jitter_backward", g, dx, n, eps);
  NvtxRange range("moe_jitter_bwd");
  jitter_backward_kernel<<<grid_of(n), 256, 0, s>>>(g, dx, n, eps, seed, seed_word);
  CUTRAIN_LAUNCH_CHECK("jitter_backward_kernel");
}

}  // namespace cutrain::kernels
