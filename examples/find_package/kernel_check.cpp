// Runs cutrain's GELU kernel on a small tensor and compares it with the formula; without a GPU it
// says so and exits 0 (the link against cutrain::kernels is what a CPU machine checks).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/gelu.cuh"
#include "runtime/check.h"
#include "runtime/device.h"
#include "runtime/dtype.h"

int main() {
  std::string why;
  if (!cutrain::gpu_available(&why)) {
    std::printf("kernel_check: no GPU (%s): linked, not run\n", why.c_str());
    return 0;
  }
  try {
    const int rows = 7, cols = 333;
    std::vector<cutrain::bf16> x(rows * cols), y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = cutrain::to_bf16(static_cast<float>(i % 97) / 16.f - 3.f);
    cutrain::bf16 *dx = nullptr, *dy = nullptr;
    CUTRAIN_CUDA_CHECK(cudaMalloc(&dx, x.size() * 2));
    CUTRAIN_CUDA_CHECK(cudaMalloc(&dy, x.size() * 2));
    CUTRAIN_CUDA_CHECK(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
    cutrain::kernels::gelu_forward(nullptr, dx, nullptr, nullptr, dy, rows, cols);
    CUTRAIN_CUDA_CHECK(cudaMemcpy(y.data(), dy, y.size() * 2, cudaMemcpyDeviceToHost));
    cudaFree(dx);
    cudaFree(dy);
    double worst = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double v = cutrain::to_float(x[i]), want = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
      worst = std::fmax(worst, std::fabs(cutrain::to_float(y[i]) - want) / (std::fabs(want) + 1e-2));
    }
    std::printf("kernel_check: GELU on %dx%d, worst relative error %.2e\n", rows, cols, worst);
    return worst < 1e-2 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernel_check: %s\n", e.what());
    return 1;
  }
}
