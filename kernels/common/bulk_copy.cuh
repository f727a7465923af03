// @brief sm_90 bulk copies global -> shared (the TMA's one-dimensional form) completed through a
// shared-memory mbarrier: one thread starts a copy of many kilobytes that needs no registers and
// no further instructions, so a block computes on one buffer while the next one fills.
//
// Use: one thread calls mbar_init once (then a __syncthreads), and per fill
// mbar_expect_bytes(bar, n) followed by bulk_load(dst, src, n, bar) (n may be 0: the phase then
// completes at once); every thread that reads the buffer first calls mbar_wait(bar, parity) with
// the parity of that fill (0 for a barrier's first fill, then alternating).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cutrain::kernels {

__device__ __forceinline__ std::uint32_t shared_addr(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// `bar`: 8-byte aligned shared memory. One arrival (the thread that sets the expected bytes).
__device__ __forceinline__ void mbar_init(std::uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_addr(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// The arrival of this phase, with the bytes the copies of this phase will deliver.
__device__ __forceinline__ void mbar_expect_bytes(std::uint64_t* bar, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_addr(bar)), "r"(bytes)
               : "memory");
}

// dst, src 16-byte aligned; bytes a multiple of 16 (and > 0).
__device__ __forceinline__ void bulk_load(void* dst, const void* src, std::uint32_t bytes, std::uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   shared_addr(dst)),
               "l"(src), "r"(bytes), "r"(shared_addr(bar))
               : "memory");
}

// Blocks until the phase of `parity` has completed (its bytes have landed and are visible).
__device__ __forceinline__ void mbar_wait(std::uint64_t* bar, std::uint32_t parity) {
  asm volatile(
      "{\n"
      "  .reg .pred done;\n"
      "  mbar_wait_retry:\n"
      "  mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "  @!done bra mbar_wait_retry;\n"
      "}\n" ::"r"(shared_addr(bar)),
      "r"(parity)
      : "memory");
}

}  // namespace cutrain::kernels
