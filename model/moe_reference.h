// @brief The CPU reference of the MoE layer (model/moe_layer.h's GPU layer is checked against it):
// gate linear, softmax, top-1 / top-2 routing with capacity and dropping (DeepSpeed's top1gating /
// top2gating without noise), every expert's fc1 -> GELU (erf) -> fc2, the weighted combine, the
// load-balancing loss; with use_residual PR-MoE's dense MLP beside it and the learned 2-way mix;
// forward and backward in fp64, written token by token.
#pragma once

#include <cstdint>
#include <vector>

#include "model/moe_config.h"
#include "model/moe_exchange.h"

namespace cutrain::model {

class MoeReference {
 public:
  explicit MoeReference(const MoeConfig& c);

  // Expert parallelism (DeepSpeed's ep_size): null or a group of 1 runs every expert here. Else
  // this rank holds experts [rank·E/ep, (rank+1)·E/ep) of `params` (the others' weights are not
  // read); the forward gates its own tokens as without it, fills the [E, C, H] dispatch buffer (C:
  // the group's largest capacity), exchanges it, runs its experts on every member's slots and
  // exchanges the outputs back; the backward mirrors it. dparams gets only its experts' gradients
  // (from every member's tokens) and the replicated tensors' (from its own).
  void set_exchange(MoeExchange* ex) { ex_ = ex; }

  // y[T,H] from x[T,H] and params (moe_param_layout). Returns l_aux. Keeps what backward needs.
  // `seed` draws the noise of noisy_gate_policy / top2_2nd_expert_sampling (moe_config.h's streams,
  // the GPU layer's draws; the jittered gate input stays fp64 here, the GPU rounds it to bf16).
  double forward(const double* params, const double* x, int tokens, bool train, double* y, std::uint64_t seed = 0);
  // After forward: dx[T,H] written; dparams (moe_param_layout) accumulated. aux_grad = d loss / d l_aux.
  void backward(const double* params, const double* dy, double aux_grad, double* dx, double* dparams);

  int capacity() const { return capacity_; }
  int dropped() const { return dropped_; }
  const std::vector<int>& expert_counts() const { return counts_; }
  const std::vector<int>& kept_counts() const { return kept_; }
  const std::vector<int>& expert() const { return expert_; }      // [T,k]
  const std::vector<int>& position() const { return position_; }  // [T,k], -1 dropped
  const std::vector<double>& weight() const { return weight_; }   // [T,k] combine weights, 0 dropped
  const std::vector<double>& logits() const { return logits_; }   // [T,E]
  // The smallest margin, over tokens and routes, between the chosen key (logit, or logit + Gumbel
  // with noise) and the next: what fp32 on the GPU must not reorder.
  double routing_gap() const { return gap_; }

 private:
  MoeConfig c_;
  MoeParamLayout layout_;
  int T_ = 0, capacity_ = 0, dropped_ = 0;
  double gap_ = 0;
  bool jitter_ = false;
  std::uint64_t seed_ = 0;
  std::vector<double> xg_;  // the gate's input (x, or x jittered)
  std::vector<double> x_, logits_, probs_, weight_, ce_, a1_, h_, o_;
  std::vector<double> ym_, ar_, hr_, yr_, coef_;  // the residual branch: MoE output, MLP, mix
  std::vector<int> expert_, position_, counts_, kept_, offsets_, row_token_, row_expert_;
  std::vector<std::int64_t> row_of_;  // [T,k], -1 dropped
  // Expert parallelism: the exchange, the slots per expert, the rows this rank's experts computed
  // for every member ([ep][E/ep][C] slots: their inputs, fc1 pre-activations, counts).
  MoeExchange* ex_ = nullptr;
  int slots_ = 0;
  std::vector<double> ex_in_, ex_a1_;
  std::vector<int> ex_count_;
  bool exchanged() const { return ex_ && ex_->size() > 1; }
  void experts_forward_exchanged(const double* params, const double* x);
  void experts_backward_exchanged(const double* params, const std::vector<double>& dout, double* dx, double* dparams);
};

}  // namespace cutrain::model
