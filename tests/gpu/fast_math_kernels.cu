// Launches kernels/common/fast_math.cuh's exponentials over an array (test_fast_math_gpu).
#include "tests/gpu/fast_math_kernels.h"

#include "kernels/common/fast_math.cuh"
#include "runtime/check.h"

namespace cutrain::test {

namespace {
__global__ void ex2_both(const float* x, float* y, float* z, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    y[i] = kernels::fast_ex2(x[i]);
    z[i] = kernels::poly_ex2(x[i]);
  }
}
}  // namespace

void run_ex2(const float* x, float* y, float* z, std::size_t n) {
  ex2_both<<<256, 256>>>(x, y, z, n);
  CUTRAIN_LAUNCH_CHECK("ex2_both");
  CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace cutrain::test
