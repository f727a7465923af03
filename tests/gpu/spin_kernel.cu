// A kernel that runs for a known wall time (it spins on the global nanosecond timer), so the
// region timer's measurements can be checked against a known duration.
#include "tests/gpu/spin_kernel.h"

#include "runtime/check.h"

namespace cutrain::test {

namespace {
__device__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__global__ void spin(unsigned long long ns, unsigned long long* sink) {
  const unsigned long long t0 = global_ns();
  unsigned long long n = 0;
  while (global_ns() - t0 < ns) ++n;
  if (threadIdx.x == 0 && blockIdx.x == 0) *sink = n;  // keeps the loop
}
}  // namespace

void spin_for(cudaStream_t s, double microseconds, unsigned long long* sink) {
  CUTRAIN_CHECK(microseconds > 0 && sink, "spin_for: expected a positive time and a device sink");
  spin<<<1, 32, 0, s>>>(static_cast<unsigned long long>(microseconds * 1e3), sink);
  CUTRAIN_LAUNCH_CHECK("spin");
}

}  // namespace cutrain::test
