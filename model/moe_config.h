// @brief The MoE layer's shape and routing options (DeepSpeed's deepspeed.moe.layer.MoE names), their
// validation, and the layout of its parameters in one buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace cutrain::model {

// DeepSpeed's noisy_gate_policy, applied in training only: Jitter multiplies the gate's input by
// U(1 - 0.01, 1 + 0.01) per element; RSample routes top-1 by argmax(logits + Gumbel).
enum class MoeNoisyGate { None, Jitter, RSample };

struct MoeConfig {
  int hidden = 0;   // model dim (DeepSpeed: hidden_size)
  int ffn = 0;      // each expert's fc1 width
  int experts = 0;  // num_experts
  int k = 1;        // routes per token: top-1 or top-2
  double capacity_factor = 1.0;       // training
  double eval_capacity_factor = 1.0;  // evaluation
  int min_capacity = 4;
  bool drop_tokens = true;
  bool use_residual = false;  // PR-MoE: a dense MLP beside the experts, mixed by a learned 2-way softmax
  MoeNoisyGate noisy_gate_policy = MoeNoisyGate::None;
  // Top-2's second expert by argmax(logits + Gumbel) over the others (DeepSpeed's default is true;
  // here false, the deterministic routing). Applied in training and evaluation, as DeepSpeed does.
  bool top2_2nd_expert_sampling = false;
  // Top-1's random token selection over capacity (DeepSpeed's default is true; here false, the
  // first tokens in order). Applied in training and evaluation, as DeepSpeed does.
  bool use_rts = false;
};

constexpr float kMoeJitterEps = 0.01f;  // DeepSpeed's multiplicative_jitter epsilon

// The noise streams of one forward, from its seed: the gate's Gumbel draws and the jitter's.
inline std::uint64_t moe_gumbel_seed(std::uint64_t seed) { return seed; }
inline std::uint64_t moe_jitter_seed(std::uint64_t seed) { return seed ^ 0x6a09e667f3bcc909ULL; }

// Errors (cutrain::Error) that name the field, what was expected and what was found: experts < 1,
// k not 1 or 2, k > experts, a capacity factor <= 0 (or not finite), min_capacity < 0, hidden or
// ffn < 1, and (with tokens > 0) fewer tokens than min_capacity under top-1, as DeepSpeed asserts;
// RSample or use_rts with k = 2 (DeepSpeed's top-2 silently ignores them; here they are errors).
// `where` prefixes the messages (e.g. the config file or the layer's name).
void validate(const MoeConfig& c, int tokens = 0, const std::string& where = "MoE layer");

// The routing capacity of one call: ceil(k · tokens / experts · factor), at least min_capacity,
// with the training or the evaluation factor.
int moe_layer_capacity(const MoeConfig& c, int tokens, bool train);

// Parameters, bf16 or fp32 alike, in one buffer: the gate's wg [E, H] (bias-free, as DeepSpeed's
// TopKGate), then every expert's fc1 weight [E, F, H] and fc2 weight [E, H, F] (bias-free Linear
// layers); with use_residual then the dense MLP's fc1 [F, H] and fc2 [H, F] (the experts' shape)
// and the mix's coefficient Linear(H, 2): weight [2, H], bias [2]. Offsets in elements (the
// residual ones equal `total`'s value before them when absent).
struct MoeParamLayout {
  std::size_t wg = 0, w1 = 0, w2 = 0, r1 = 0, r2 = 0, cw = 0, cb = 0, total = 0;
};
MoeParamLayout moe_param_layout(const MoeConfig& c);

}  // namespace cutrain::model
