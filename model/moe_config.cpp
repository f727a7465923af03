// @brief MoE configuration checks and parameter layout (model/moe_config.h).
#include "model/moe_config.h"

#include <cmath>

#include "kernels/moe_gate.cuh"
#include "runtime/error.h"

namespace cutrain::model {

void validate(const MoeConfig& c, int tokens, const std::string& where) {
  CUTRAIN_CHECK(c.hidden >= 1, where, ": hidden must be >= 1, got ", c.hidden);
  CUTRAIN_CHECK(c.ffn >= 1, where, ": ffn must be >= 1, got ", c.ffn);
  CUTRAIN_CHECK(c.experts >= 1 && c.experts <= kernels::kMoeMaxExperts, where, ": num_experts must be in [1, ",
                kernels::kMoeMaxExperts, "], got ", c.experts);
  CUTRAIN_CHECK(c.k == 1 || c.k == 2, where, ": k must be 1 (top-1) or 2 (top-2), got ", c.k);
  CUTRAIN_CHECK(c.k <= c.experts, where, ": k = ", c.k, " is more than num_experts = ", c.experts);
  CUTRAIN_CHECK(c.capacity_factor > 0 && std::isfinite(c.capacity_factor), where,
                ": capacity_factor must be a finite number > 0, got ", c.capacity_factor);
  CUTRAIN_CHECK(c.eval_capacity_factor > 0 && std::isfinite(c.eval_capacity_factor), where,
                ": eval_capacity_factor must be a finite number > 0, got ", c.eval_capacity_factor);
  CUTRAIN_CHECK(c.min_capacity >= 0, where, ": min_capacity must be >= 0, got ", c.min_capacity);
  CUTRAIN_CHECK(c.noisy_gate_policy != MoeNoisyGate::RSample || c.k == 1, where,
                ": noisy_gate_policy RSample routes top-1 only, got k = ", c.k, " (use Jitter or None)");
  CUTRAIN_CHECK(!c.use_rts || c.k == 1, where, ": use_rts (random token selection) is top-1's, got k = ", c.k);
  if (tokens > 0 && c.k == 1)
    CUTRAIN_CHECK(tokens >= c.min_capacity, where, ": top-1 routing needs at least min_capacity = ", c.min_capacity,
                  " tokens per call, got ", tokens, " (lower min_capacity or raise the batch)");
}

int moe_layer_capacity(const MoeConfig& c, int tokens, bool train) {
  return kernels::moe_capacity(tokens, c.experts, c.k, train ? c.capacity_factor : c.eval_capacity_factor,
                               c.min_capacity);
}

MoeParamLayout moe_param_layout(const MoeConfig& c) {
  MoeParamLayout l;
  const std::size_t E = c.experts, H = c.hidden, F = c.ffn;
  l.wg = 0;
  l.w1 = E * H;
  l.w2 = l.w1 + E * F * H;
  l.r1 = l.w2 + E * H * F;
  l.r2 = l.r1 + (c.use_residual ? F * H : 0);
  l.cw = l.r2 + (c.use_residual ? H * F : 0);
  l.cb = l.cw + (c.use_residual ? 2 * H : 0);
  l.total = l.cb + (c.use_residual ? 2 : 0);
  return l;
}

}  // namespace cutrain::model
