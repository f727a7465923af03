// @brief CPU references (fp64) of kernels/moe_gate, kernels/moe_permute and kernels/moe_grouped_gemm,
// written the direct way (DeepSpeed's top1gating / top2gating without noise, positions counted
// token by token, one dense GEMM per expert).
#pragma once

#include <cstdint>
#include <vector>

namespace cutrain::ref {

int moe_capacity(int tokens, int experts, int k, double capacity_factor, int min_capacity);

struct MoeGateRef {
  int tokens = 0, experts = 0, k = 1;
  std::vector<double> probs;           // [T,E]
  std::vector<std::int32_t> expert;    // [T,k]
  std::vector<std::int32_t> position;  // [T,k], -1 dropped
  std::vector<double> weight;          // [T,k]
  std::vector<std::int32_t> expert_counts, kept_counts, offsets;  // [E], [E], [E+1]
  std::vector<double> ce;              // [E]
  double l_aux = 0;
  int capacity = 0, dropped = 0;
};

// logits [T,E]; capacity used only with drop_tokens. rsample / second_sampling: the arg-max of
// route 0 (top-1) / route 1 (top-2) reads float(logit) + kernels::counter_gumbel(seed, s·E + e).
// rts (top-1 with dropping): an expert over capacity keeps its `capacity` tokens of largest
// kernels::moe_rts_key, numbered in token order.
MoeGateRef moe_gate_forward(const std::vector<float>& logits, int tokens, int experts, int k, bool drop_tokens,
                            int capacity, bool rsample = false, bool second_sampling = false,
                            std::uint64_t seed = 0, bool rts = false);
// d loss / d logits [T,E] from dweight [T,k] and the gradient of l_aux.
std::vector<double> moe_gate_backward(const MoeGateRef& g, const std::vector<double>& dweight, double aux_grad);

// Row of route (s, r) in the permuted buffer, -1 when dropped.
std::int64_t moe_row(const MoeGateRef& g, int s, int r);
// xp [offsets[E], H]
std::vector<double> moe_permute(const std::vector<float>& x, const MoeGateRef& g, int hidden);
// dx [T,H] = Σ_r dxp[row(s,r)]
std::vector<double> moe_permute_backward(const std::vector<float>& dxp, const MoeGateRef& g, int hidden);
// y [T,H] = Σ_r weight·yp[row(s,r)]; `weight` [T,k] as the GPU holds it (fp32).
std::vector<double> moe_unpermute(const std::vector<float>& yp, const std::vector<float>& weight,
                                  const MoeGateRef& g, int hidden);
// dyp [offsets[E], H] and dweight [T,k].
void moe_unpermute_backward(const std::vector<float>& dy, const std::vector<float>& yp,
                            const std::vector<float>& weight, const MoeGateRef& g, int hidden,
                            std::vector<double>& dyp, std::vector<double>& dweight);

// The slot layout (kernels/moe_permute.cuh's `slots`): the same routing with offsets[e] = e · C,
// so the references above index the [E, C] buffer (its unowned rows NaN where they fill a buffer).
MoeGateRef moe_slot_layout(const MoeGateRef& g, int capacity);
// `buf` [E·C, width] with the rows j >= kept[e] of each expert e set to 0.
std::vector<double> moe_zero_empty_slots(std::vector<double> buf, const std::vector<std::int32_t>& kept, int capacity,
                                         int width);

// The grouped GEMMs, group g owning rows[g] consecutive rows; weights [G,N,K]. grad_weight's
// dw_init (may be null) is added.
std::vector<double> grouped_gemm_forward(const std::vector<float>& x, const std::vector<float>& w,
                                         const std::vector<int>& rows, int N, int K);
std::vector<double> grouped_gemm_grad_input(const std::vector<float>& dy, const std::vector<float>& w,
                                            const std::vector<int>& rows, int N, int K, double beta = 0,
                                            const std::vector<float>* dx_init = nullptr);
std::vector<double> grouped_gemm_grad_weight(const std::vector<float>& dy, const std::vector<float>& x,
                                             const std::vector<int>& rows, int N, int K,
                                             const std::vector<float>* dw_init = nullptr);

// The jitter factor of element i (kernels/moe_jitter.cuh): 1 - eps + 2·eps·counter_uniform(seed, i).
double moe_jitter_factor(float eps, std::uint64_t seed, std::uint64_t i);

// PR-MoE's residual mix: c = softmax(logits + bias) per token, y = c0·y_moe + c1·y_mlp.
void moe_residual_mix_forward(const std::vector<float>& y_moe, const std::vector<float>& y_mlp,
                              const std::vector<float>& logits, const float bias[2], int tokens, int hidden,
                              std::vector<double>& y, std::vector<double>& coef);
// dy_moe = c0·dy, dy_mlp = c1·dy, dlogits [T,2]; `coef` as the forward wrote it.
void moe_residual_mix_backward(const std::vector<float>& dy, const std::vector<float>& y_moe,
                               const std::vector<float>& y_mlp, const std::vector<float>& coef, int tokens,
                               int hidden, std::vector<double>& dy_moe, std::vector<double>& dy_mlp,
                               std::vector<double>& dlogits);

}  // namespace cutrain::ref
