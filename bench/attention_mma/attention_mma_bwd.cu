// @brief The mma.sync baseline's backward launcher: the library's row_dot, this folder's dK/dV pass,
// then this folder's dQ pass (deterministic) or the library's dQ convert of the atomic accumulator
// (fast), on the production scratch layout.
#include <cstdint>

#include "bench/attention_mma/attention_mma.h"
#include "kernels/attention_options.cuh"
#include "kernels/attention_tiles.cuh"
#include "kernels/common/vec.cuh"
#include "runtime/check.h"

namespace cutrain::bench::mma_attention {

template <typename E>
void attention_backward(cudaStream_t s, const E* qkv, const E* out, const E* dout, const float* lse, E* dqkv,
                        void* scratch, const kernels::AttentionShape& sh, bool deterministic,
                        const kernels::AttentionOptions& options) {
  namespace attn = kernels::attn;
  attn::check_shape(sh, "mma_attention::attention_backward");
  const attn::OptionArgs opt = attn::option_args(options);
  CUTRAIN_CHECK(qkv && out && dout && lse && dqkv && scratch,
                "mma_attention::attention_backward: qkv, out, dout, lse, dqkv and scratch must all be non-null");
  CUTRAIN_CHECK(kernels::is_aligned16(out) && kernels::is_aligned16(dout) && kernels::is_aligned16(dqkv) &&
                    kernels::is_aligned16(scratch),
                "mma_attention::attention_backward: out, dout, dqkv and scratch must be 16-byte aligned (the family's "
                "row_dot and dQ convert move 16-byte pieces)");
  float* dvec = static_cast<float*>(scratch);
  float* dq_acc = reinterpret_cast<float*>(static_cast<char*>(scratch) + attn::dvec_bytes(sh));
  attn::row_dot<E>(s, out, dout, dvec, sh, deterministic ? nullptr : dq_acc);  // fast: also zeroes the accumulator
  if (deterministic) {
    dkdv<E>(s, qkv, dout, lse, dvec, dqkv, nullptr, sh, opt);
    dq<E>(s, qkv, dout, lse, dvec, dqkv, sh, opt);
  } else {
    dkdv<E>(s, qkv, dout, lse, dvec, dqkv, dq_acc, sh, opt);
    attn::dq_convert<E>(s, dq_acc, dqkv, sh);
  }
}

template void attention_backward<bf16>(cudaStream_t, const bf16*, const bf16*, const bf16*, const float*, bf16*, void*,
                                       const kernels::AttentionShape&, bool, const kernels::AttentionOptions&);
template void attention_backward<f16>(cudaStream_t, const f16*, const f16*, const f16*, const float*, f16*, void*,
                                      const kernels::AttentionShape&, bool, const kernels::AttentionOptions&);

}  // namespace cutrain::bench::mma_attention
