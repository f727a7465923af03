// @brief The MoE flags of `cutrain train` (Megatron-DeepSpeed's --num-experts, --expert-interval,
// --moe-* and DeepSpeed's MoE layer arguments) and their resolution into the model's MoE blocks,
// every bad value named by its flag before any work.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/transformer_params.h"

namespace cutrain::train {

struct MoeOptions {
  std::vector<int> num_experts;  // --num_experts: one count for every MoE block, or one per MoE block (PR-MoE's pyramid)
  std::string moe_layers;        // --moe_layers every:N | a comma list of 0-based blocks (empty: the interval)
  int expert_interval = 0;       // --expert_interval N: blocks N-1, 2N-1, ... (0: not given; the default is 2)
  int top_k = 1;                 // --top_k
  double loss_coeff = 0.01;      // --moe_loss_coeff
  double train_capacity_factor = 1.0, eval_capacity_factor = 1.0;
  int min_capacity = 4;          // --moe_min_capacity
  bool disable_token_dropping = false;
  std::string mlp_type = "standard";      // standard | residual (PR-MoE)
  std::string noisy_gate_policy = "None"; // None | Jitter | RSample
  // --moe_use_rts true|false: top-1's random token selection over capacity. Empty (not given):
  // DeepSpeed's MoE default, true for top-1 (its top-2 has no such selection, so off there).
  std::string use_rts;
  int expert_parallel_size = 1;           // --moe_expert_parallel_size (ep_size)
  std::vector<std::string> given;         // the MoE flags the command line gave (for the errors)
};

// The model's MoE blocks for a model of `layers` blocks and `tokens` tokens per micro-batch; no
// --num_experts: a dense model (any other MoE flag given is then an error). Throws cutrain::Error
// naming the flag, what was expected and what was found.
model::MoeDims resolve_moe(const MoeOptions& o, int layers, int tokens);

// "MoE blocks 1, 3: 8, 16 experts, top-1, capacity factor 1 (eval 1), min capacity 4, token
// dropping, random token selection, standard MLP, noisy gate None, loss coeff 0.01"
std::string describe_moe(const model::MoeDims& m);

// A checkpoint's config.json "moe" object (written only for a model with MoE blocks): the experts
// per block and every routing option, and its inverse (errors name `where` and the key).
nlohmann::json moe_config_json(const model::MoeDims& m);
model::MoeDims moe_dims_from_json(const nlohmann::json& j, const std::string& where);

// --resume: a run that gives --num_experts must have the checkpoint's MoE blocks (experts per
// block, --mlp_type); its routing options may differ. Errors name the flag and both values.
void check_checkpoint_moe(const model::MoeDims& run, const model::MoeDims& ck, const std::string& where);

}  // namespace cutrain::train
