// @brief Attention family: shape validation and the FLOP counts the benchmarks report.
#include "kernels/attention.cuh"
#include "kernels/attention_tiles.cuh"
#include "runtime/error.h"

namespace cutrain::kernels {

void attn::check_shape(const AttentionShape& sh, const char* who) {
  CUTRAIN_CHECK(sh.head_dim == 64 || sh.head_dim == 128, who, ": head_dim must be 64 or 128, got ", sh.head_dim);
  CUTRAIN_CHECK(sh.batch >= 1 && sh.seq >= 1 && sh.heads >= 1, who,
                ": batch, seq and heads must be >= 1, got batch=", sh.batch, " seq=", sh.seq, " heads=", sh.heads);
  CUTRAIN_CHECK(sh.heads <= 65535 && sh.batch <= 65535, who,
                ": heads and batch must be <= 65535 (grid y/z), got heads=", sh.heads, " batch=", sh.batch);
}

double attention_forward_flops(const AttentionShape& sh) {
  const double f = 4.0 * sh.batch * sh.heads * static_cast<double>(sh.seq) * sh.seq * sh.head_dim;
  return sh.causal ? f / 2 : f;
}

double attention_backward_flops(const AttentionShape& sh) { return 2.5 * attention_forward_flops(sh); }

}  // namespace cutrain::kernels
