// @brief The MoE flags' checks and their resolution into model::MoeDims (train/moe_options.h).
#include "train/moe_options.h"

#include <cmath>
#include <sstream>

#include "kernels/moe_gate.cuh"
#include "runtime/error.h"
#include "runtime/text.h"

namespace cutrain::train {
namespace {

// --moe_layers: every:N or a comma list of distinct block indices in [0, layers).
std::vector<int> moe_blocks(const MoeOptions& o, int layers) {
  CUTRAIN_CHECK(o.moe_layers.empty() || o.expert_interval == 0,
                "train: --moe_layers and --expert_interval both given; expected one");
  std::vector<int> blocks;
  int every = o.expert_interval > 0 ? o.expert_interval : 2;  // Megatron-DeepSpeed's default interval
  CUTRAIN_CHECK(o.expert_interval >= 0, "train: --expert_interval must be >= 1, got ", o.expert_interval);
  if (!o.moe_layers.empty() && o.moe_layers.rfind("every:", 0) != 0) {
    std::stringstream ss(o.moe_layers);
    std::string item;
    while (std::getline(ss, item, ',')) {
      std::size_t used = 0;
      int b = -1;
      try {
        b = std::stoi(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      CUTRAIN_CHECK(used == item.size() && !item.empty(), "train: --moe_layers: expected every:N or a comma list of ",
                    "block indices, found '", item, "' in '", o.moe_layers, "'");
      CUTRAIN_CHECK(b >= 0 && b < layers, "train: --moe_layers: block ", b, " is outside [0, ", layers,
                    ") (--num_layers ", layers, ")");
      for (int x : blocks) CUTRAIN_CHECK(x != b, "train: --moe_layers: block ", b, " is listed twice");
      blocks.push_back(b);
    }
    return blocks;
  }
  if (!o.moe_layers.empty()) {
    const std::string n = o.moe_layers.substr(6);
    std::size_t used = 0;
    every = 0;
    try {
      every = std::stoi(n, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    CUTRAIN_CHECK(used == n.size() && every >= 1, "train: --moe_layers every:N: expected N >= 1, found '",
                  o.moe_layers, "'");
  }
  // As Megatron-DeepSpeed: block numbers 1.. whose number is a multiple of the interval.
  for (int l = 0; l < layers; ++l)
    if ((l + 1) % every == 0) blocks.push_back(l);
  return blocks;
}

}  // namespace

model::MoeDims resolve_moe(const MoeOptions& o, int layers, int tokens) {
  model::MoeDims m;
  if (o.num_experts.empty()) {
    CUTRAIN_CHECK(o.given.empty(), "train: ", join(o.given), " configure MoE blocks: expected --num_experts too");
    return m;
  }
  CUTRAIN_CHECK(o.top_k == 1 || o.top_k == 2, "train: --top_k must be 1 or 2, got ", o.top_k);
  auto factor = [](const char* flag, double v) {
    CUTRAIN_CHECK(v > 0 && std::isfinite(v), "train: ", flag, " must be a finite number > 0, got ", v);
  };
  factor("--moe_train_capacity_factor", o.train_capacity_factor);
  factor("--moe_eval_capacity_factor", o.eval_capacity_factor);
  CUTRAIN_CHECK(o.min_capacity >= 0, "train: --moe_min_capacity must be >= 0, got ", o.min_capacity);
  CUTRAIN_CHECK(o.loss_coeff >= 0 && std::isfinite(o.loss_coeff), "train: --moe_loss_coeff must be a finite number ",
                ">= 0, got ", o.loss_coeff);
  CUTRAIN_CHECK(o.mlp_type == "standard" || o.mlp_type == "residual",
                "train: --mlp_type: expected standard or residual (PR-MoE), found '", o.mlp_type, "'");
  if (o.noisy_gate_policy == "None") m.noisy_gate_policy = model::MoeNoisyGate::None;
  else if (o.noisy_gate_policy == "Jitter") m.noisy_gate_policy = model::MoeNoisyGate::Jitter;
  else if (o.noisy_gate_policy == "RSample") m.noisy_gate_policy = model::MoeNoisyGate::RSample;
  else CUTRAIN_FAIL("train: --moe_noisy_gate_policy: expected None, Jitter or RSample, found '", o.noisy_gate_policy, "'");
  CUTRAIN_CHECK(m.noisy_gate_policy != model::MoeNoisyGate::RSample || o.top_k == 1,
                "train: --moe_noisy_gate_policy RSample routes top-1 only, got --top_k ", o.top_k);
  // DeepSpeed's MoE defaults to use_rts=True and Megatron-DeepSpeed keeps it; its top-2 gating has
  // no random token selection and ignores the argument, which here is an error when given.
  CUTRAIN_CHECK(o.use_rts.empty() || o.use_rts == "true" || o.use_rts == "false",
                "train: --moe_use_rts: expected true or false, found '", o.use_rts, "'");
  CUTRAIN_CHECK(o.use_rts != "true" || o.top_k == 1, "train: --moe_use_rts true (random token selection) is ",
                "top-1's (DeepSpeed's top-2 has none), got --top_k ", o.top_k);
  m.use_rts = o.top_k == 1 && o.use_rts != "false";
  const int ep = o.expert_parallel_size;
  CUTRAIN_CHECK(ep >= 1, "train: --moe_expert_parallel_size must be >= 1, got ", ep);
  for (int e : o.num_experts) {
    CUTRAIN_CHECK(e >= 1 && e <= kernels::kMoeMaxExperts, "train: --num_experts: each count must be in [1, ",
                  kernels::kMoeMaxExperts, "], got ", e);
    CUTRAIN_CHECK(o.top_k <= e, "train: --top_k ", o.top_k, " is more than --num_experts ", e);
    CUTRAIN_CHECK(e % ep == 0, "train: --moe_expert_parallel_size ", ep, " does not divide --num_experts ", e);
  }
  const std::vector<int> blocks = moe_blocks(o, layers);
  CUTRAIN_CHECK(!blocks.empty(), "train: --num_experts given but no block is a MoE block (--num_layers ", layers,
                ", --moe_layers '", o.moe_layers.empty() ? "every:" + std::to_string(o.expert_interval ? o.expert_interval : 2) : o.moe_layers,
                "')");
  CUTRAIN_CHECK(o.num_experts.size() == 1 || o.num_experts.size() == blocks.size(), "train: --num_experts lists ",
                o.num_experts.size(), " counts, expected 1 or one per MoE block (", blocks.size(), ")");
  // Top-1 needs a micro-batch of at least min_capacity tokens (DeepSpeed asserts it).
  CUTRAIN_CHECK(o.top_k != 1 || tokens >= o.min_capacity, "train: --moe_min_capacity ", o.min_capacity,
                " is more than the micro-batch's ", tokens, " tokens (top-1 routing needs at least min_capacity)");
  m.experts.assign(std::size_t(layers), 0);
  for (std::size_t i = 0; i < blocks.size(); ++i)
    m.experts[std::size_t(blocks[i])] = o.num_experts.size() == 1 ? o.num_experts[0] : o.num_experts[i];
  m.k = o.top_k;
  m.capacity_factor = o.train_capacity_factor;
  m.eval_capacity_factor = o.eval_capacity_factor;
  m.min_capacity = o.min_capacity;
  m.drop_tokens = !o.disable_token_dropping;
  m.use_residual = o.mlp_type == "residual";
  m.loss_coeff = o.loss_coeff;
  m.ep_size = ep;
  return m;
}

std::string describe_moe(const model::MoeDims& m) {
  std::ostringstream s;
  std::string blocks, experts;
  for (std::size_t l = 0; l < m.experts.size(); ++l) {
    if (m.experts[l] == 0) continue;
    if (!blocks.empty()) {
      blocks += ',';
      experts += ',';
    }
    blocks += std::to_string(l);
    experts += std::to_string(m.experts[l]);
  }
  const char* noise = m.noisy_gate_policy == model::MoeNoisyGate::Jitter    ? "Jitter"
                      : m.noisy_gate_policy == model::MoeNoisyGate::RSample ? "RSample"
                                                                              : "None";
  s << "MoE blocks " << blocks << ": " << experts << " experts, top-" << m.k << ", capacity factor "
    << m.capacity_factor << " (eval " << m.eval_capacity_factor << "), min capacity " << m.min_capacity << ", "
    << (m.drop_tokens ? "token dropping" : "no token dropping") << ", "
    << (m.use_rts ? "random token selection" : "first tokens kept") << ", "
    << (m.use_residual ? "residual MLP (PR-MoE)" : "standard MLP") << ", noisy gate " << noise << ", loss coeff "
    << m.loss_coeff << ", ep_size " << m.ep_size;
  return s.str();
}

namespace {
const char* noise_name(model::MoeNoisyGate g) {
  return g == model::MoeNoisyGate::Jitter ? "Jitter" : g == model::MoeNoisyGate::RSample ? "RSample" : "None";
}
std::string list(const std::vector<int>& v) {
  std::string s;
  for (int x : v) {
    if (!s.empty()) s += ',';
    s += std::to_string(x);
  }
  return s;
}
}  // namespace

nlohmann::json moe_config_json(const model::MoeDims& m) {
  return {{"num_experts_per_layer", m.experts},
          {"top_k", m.k},
          {"capacity_factor", m.capacity_factor},
          {"eval_capacity_factor", m.eval_capacity_factor},
          {"min_capacity", m.min_capacity},
          {"drop_tokens", m.drop_tokens},
          {"mlp_type", m.use_residual ? "residual" : "standard"},
          {"noisy_gate_policy", noise_name(m.noisy_gate_policy)},
          {"use_rts", m.use_rts},
          {"moe_loss_coeff", m.loss_coeff},
          // The saved experts' layout: every expert of a block in one file, whatever the run's ep_size
          // (an expert-parallel run gathers them), so any ep_size resumes it.
          {"ep_size", 1}};
}

model::MoeDims moe_dims_from_json(const nlohmann::json& j, const std::string& where) {
  auto has = [&](const char* key, bool ok) {
    CUTRAIN_CHECK(j.is_object() && j.contains(key) && ok, where, ": moe.", key, ": missing or of the wrong type (found ",
                  j.is_object() && j.contains(key) ? j[key].dump() : std::string("none"), ")");
  };
  has("num_experts_per_layer", j.is_object() && j.contains("num_experts_per_layer") && j["num_experts_per_layer"].is_array());
  model::MoeDims m;
  for (const auto& e : j["num_experts_per_layer"]) {
    CUTRAIN_CHECK(e.is_number_integer() && e.get<int>() >= 0, where, ": moe.num_experts_per_layer: expected counts ",
                  ">= 0, found ", e.dump());
    m.experts.push_back(e.get<int>());
  }
  auto num = [&](const char* key) {
    has(key, j.is_object() && j.contains(key) && j[key].is_number());
    return j[key].get<double>();
  };
  auto str = [&](const char* key) {
    has(key, j.is_object() && j.contains(key) && j[key].is_string());
    return j[key].get<std::string>();
  };
  m.k = int(num("top_k"));
  m.capacity_factor = num("capacity_factor");
  m.eval_capacity_factor = num("eval_capacity_factor");
  m.min_capacity = int(num("min_capacity"));
  has("drop_tokens", j.is_object() && j.contains("drop_tokens") && j["drop_tokens"].is_boolean());
  m.drop_tokens = j["drop_tokens"].get<bool>();
  const std::string mlp = str("mlp_type"), noise = str("noisy_gate_policy");
  CUTRAIN_CHECK(mlp == "standard" || mlp == "residual", where, ": moe.mlp_type: expected standard or residual, found '",
                mlp, "'");
  m.use_residual = mlp == "residual";
  if (noise == "Jitter") m.noisy_gate_policy = model::MoeNoisyGate::Jitter;
  else if (noise == "RSample") m.noisy_gate_policy = model::MoeNoisyGate::RSample;
  else CUTRAIN_CHECK(noise == "None", where, ": moe.noisy_gate_policy: expected None, Jitter or RSample, found '", noise, "'");
  m.loss_coeff = num("moe_loss_coeff");
  // Absent in checkpoints written before --moe_use_rts existed: those runs kept the first routes.
  if (j.contains("use_rts")) {
    has("use_rts", j["use_rts"].is_boolean());
    m.use_rts = j["use_rts"].get<bool>();
    CUTRAIN_CHECK(!m.use_rts || m.k == 1, where, ": moe.use_rts: true is top-1's, found top_k ", m.k);
  }
  return m;
}

void check_checkpoint_moe(const model::MoeDims& run, const model::MoeDims& ck, const std::string& where) {
  auto per_block = [](const model::MoeDims& m, std::size_t layers) {
    std::vector<int> v = m.experts;
    v.resize(layers, 0);
    return v;
  };
  const std::size_t n = std::max(run.experts.size(), ck.experts.size());
  CUTRAIN_CHECK(per_block(run, n) == per_block(ck, n), "train: --num_experts / --moe_layers give experts per block ",
                list(per_block(run, n)), ", the checkpoint (", where, ") has ", list(per_block(ck, n)),
                " (leave the MoE flags out to take the checkpoint's)");
  CUTRAIN_CHECK(!run.any() || run.use_residual == ck.use_residual, "train: --mlp_type ",
                run.use_residual ? "residual" : "standard", ", the checkpoint (", where, ") has ",
                ck.use_residual ? "residual" : "standard");
}

}  // namespace cutrain::train
