// @brief Test launchers of kernels/common/fast_math.cuh's exponentials, element by element.
#pragma once

#include <cstddef>

namespace cutrain::test {
// y[i] = fast_ex2(x[i]) and z[i] = poly_ex2(x[i]) on the default stream, n elements (device
// pointers); synchronous.
void run_ex2(const float* x, float* y, float* z, std::size_t n);
}  // namespace cutrain::test
