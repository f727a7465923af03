// @brief Attention family: the entry points (the sm90 pair of kernels/attention_sm90/ with the
// production schedules), shape and option validation, the key mask from tokens, and the FLOP
// counts the benchmarks report.
#include <cmath>

#include "kernels/attention.cuh"
#include "kernels/attention_options.cuh"
#include "kernels/attention_sm90/attention_sm90.h"
#include "kernels/attention_sm90/production.h"
#include "kernels/attention_tiles.cuh"
#include "kernels/dropout.cuh"
#include "runtime/check.h"
#include "runtime/error.h"

namespace cutrain::kernels {

void attn::check_shape(const AttentionShape& sh, const char* who) {
  CUTRAIN_CHECK(sh.head_dim == 64 || sh.head_dim == 128, who, ": head_dim must be 64 or 128, got ", sh.head_dim);
  CUTRAIN_CHECK(sh.batch >= 1 && sh.seq >= 1 && sh.heads >= 1, who,
                ": batch, seq and heads must be >= 1, got batch=", sh.batch, " seq=", sh.seq, " heads=", sh.heads);
  CUTRAIN_CHECK(sh.heads <= 65535 && sh.batch <= 65535, who,
                ": heads and batch must be <= 65535 (grid y/z), got heads=", sh.heads, " batch=", sh.batch);
}

attn::OptionArgs attn::option_args(const AttentionOptions& o) {
  OptionArgs a;
  a.key_mask = o.key_mask;
  a.key = o.dropout;
  CUTRAIN_CHECK(std::isfinite(o.dropout_p) && o.dropout_p >= 0.f && o.dropout_p < 1.f,
                "attention: options.dropout_p must lie in [0, 1), got ", o.dropout_p);
  a.threshold = dropout_threshold(o.dropout_p);
  a.drop_scale = dropout_scale(o.dropout_p);
  return a;
}

namespace {
__global__ void key_mask_kernel(const std::int32_t* __restrict__ tokens, std::int32_t pad_id,
                                std::uint8_t* __restrict__ mask, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) mask[i] = tokens[i] != pad_id;
}
}  // namespace

void attention_key_mask_from_tokens(cudaStream_t s, const std::int32_t* tokens, std::int32_t pad_id,
                                    std::uint8_t* key_mask, std::size_t n) {
  CUTRAIN_CHECK(tokens && key_mask, "attention_key_mask_from_tokens: tokens and key_mask must be non-null");
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>((n + 255) / 256);
  key_mask_kernel<<<blocks, 256, 0, s>>>(tokens, pad_id, key_mask, n);
  CUTRAIN_LAUNCH_CHECK("attention_key_mask_from_tokens");
}

template <typename E>
void attention_forward(cudaStream_t s, const E* qkv, E* out, float* lse, const AttentionShape& shape,
                       const AttentionOptions& options) {
  attn::check_shape(shape, "attention_forward");  // the shape first, as attention_backward
  sm90::attention_forward<E>(s, qkv, out, lse, shape, options);  // production_forward's tile
}

template <typename E>
void attention_backward(cudaStream_t s, const E* qkv, const E* out, const E* dout, const float* lse, E* dqkv,
                        void* scratch, const AttentionShape& shape, bool deterministic,
                        const AttentionOptions& options) {
  attn::check_shape(shape, "attention_backward");
  // The plan's two-pass algorithm needs no dQ accumulator, so the scratch of
  // attention_backward_scratch_bytes(shape, deterministic) covers it either way.
  const sm90::BackwardPlan plan = sm90::production_backward(shape, deterministic);
  sm90::attention_backward<E>(s, qkv, out, dout, lse, dqkv, scratch, shape, plan.schedule, options, plan.two_pass,
                              plan.dq);
}

bool attention_backward_adds_dq(const AttentionShape& shape) {
  attn::check_shape(shape, "attention_backward_adds_dq");
  return !sm90::production_backward(shape, false).two_pass;
}

template void attention_forward<bf16>(cudaStream_t, const bf16*, bf16*, float*, const AttentionShape&,
                                      const AttentionOptions&);
template void attention_forward<f16>(cudaStream_t, const f16*, f16*, float*, const AttentionShape&,
                                     const AttentionOptions&);
template void attention_backward<bf16>(cudaStream_t, const bf16*, const bf16*, const bf16*, const float*, bf16*, void*,
                                       const AttentionShape&, bool, const AttentionOptions&);
template void attention_backward<f16>(cudaStream_t, const f16*, const f16*, const f16*, const float*, f16*, void*,
                                      const AttentionShape&, bool, const AttentionOptions&);

double attention_forward_flops(const AttentionShape& sh) {
  const double f = 4.0 * sh.batch * sh.heads * static_cast<double>(sh.seq) * sh.seq * sh.head_dim;
  return sh.causal ? f / 2 : f;
}

double attention_backward_flops(const AttentionShape& sh) { return 2.5 * attention_forward_flops(sh); }

}  // namespace cutrain::kernels
