#include "train/precision.h"

#include <sstream>

#include "runtime/error.h"

namespace cutrain::train {

std::vector<BufferSpec> PrecisionPlan::buffers() const {
  std::vector<BufferSpec> b{{"params", param}, {"grads", grad}};
  if (has_master) b.push_back({"master", DType::F32});
  if (compensation) b.push_back({"compensation", DType::BF16});
  b.push_back({"exp_avg", moment});
  b.push_back({"exp_avg_sq", moment});
  return b;
}

std::size_t PrecisionPlan::bytes_per_param() const {
  std::size_t n = 0;
  for (const auto& b : buffers()) n += dtype_size(b.dtype);
  return n;
}

const char* PrecisionPlan::name() const {
  switch (layout) {
    case OptimizerLayout::Baseline: return param == DType::F16 ? "fp16" : "baseline";
    case OptimizerLayout::Bf16MasterWG: return "bf16_master_wg";
    case OptimizerLayout::Bf16Full: return "bf16_full";
  }
  return "?";
}

std::string PrecisionPlan::label() const { return std::string(name()) + (compensation ? "+compensation" : ""); }

PrecisionPlan plan_for(OptimizerLayout layout, int accumulation, bool compensation) {
  CUTRAIN_CHECK(!compensation || layout != OptimizerLayout::Baseline,
                "precision: the compensation buffer belongs to bf16 master weights; the baseline layout keeps an fp32 "
                "master (set bf16.bf16_master_weights_and_grads to use bf16.bf16_master_compensation)");
  PrecisionPlan p;
  p.compensation = compensation;
  p.layout = layout;
  p.has_master = layout == OptimizerLayout::Baseline;
  p.moment = layout == OptimizerLayout::Bf16Full ? DType::BF16 : DType::F32;
  // Baseline accumulates micro-batch gradients straight into an fp32 buffer (the GEMMs and
  // reductions write fp32 with accumulate), which replaces the bf16 gradient buffer.
  p.grad = (layout == OptimizerLayout::Baseline && accumulation > 1) ? DType::F32 : DType::BF16;
  return p;
}

PrecisionPlan plan_for_fp16(int accumulation) {
  PrecisionPlan p = plan_for(OptimizerLayout::Baseline, accumulation);
  p.param = DType::F16;
  if (p.grad != DType::F32) p.grad = DType::F16;
  return p;
}

PrecisionPlan plan_from_config(const TrainConfig& c) {
  if (c.fp16.enabled) {
    // fp16 needs the fp32 master (the bf16 master layouts need bf16.enabled, which fp16 refuses).
    CUTRAIN_CHECK(!c.bf16.bf16_master_weights_and_grads && !c.bf16.bf16_optimizer_states,
                  "precision: fp16.enabled needs fp32 master weights; bf16.bf16_master_weights_and_grads and "
                  "bf16.bf16_optimizer_states select a bf16 master: set them false");
    return plan_for_fp16(c.accumulation());
  }
  OptimizerLayout l = OptimizerLayout::Baseline;
  if (c.bf16.bf16_optimizer_states) l = OptimizerLayout::Bf16Full;
  else if (c.bf16.bf16_master_weights_and_grads) l = OptimizerLayout::Bf16MasterWG;
  return plan_for(l, c.accumulation(), c.bf16.bf16_master_compensation);
}

std::string bytes_per_param_table() {
  std::ostringstream os;
  os << "Layout              | buffers (dtype)                                          | bytes/param | BF16 example README\n";
  auto row = [&](const PrecisionPlan& p, const char* label, const char* theirs) {
    std::ostringstream b;
    bool first = true;
    for (const auto& s : p.buffers()) {
      b << (first ? "" : " + ") << s.name << " " << dtype_size(s.dtype);
      first = false;
    }
    os << label;
    for (std::size_t i = std::string(label).size(); i < 20; ++i) os << ' ';
    std::string bs = b.str();
    os << "| " << bs;
    for (std::size_t i = bs.size(); i < 57; ++i) os << ' ';
    const std::string n = std::to_string(p.bytes_per_param());
    os << "| " << n << std::string(12 - n.size(), ' ') << "| " << theirs << "\n";
  };
  row(plan_for(OptimizerLayout::Baseline, 1), "baseline", "20 (counts fp32 master grads too)");
  row(plan_for(OptimizerLayout::Baseline, 2), "baseline, accum>1", "20");
  row(plan_for(OptimizerLayout::Bf16MasterWG, 1), "bf16_master_wg", "-");
  row(plan_for(OptimizerLayout::Bf16Full, 1), "bf16_full", "12 (counts 2 for each of 6 buffers)");
  row(plan_for(OptimizerLayout::Bf16MasterWG, 1, true), "bf16_master_wg+comp", "-");
  row(plan_for(OptimizerLayout::Bf16Full, 1, true), "bf16_full+comp", "-");
  return os.str();
}

}  // namespace cutrain::train
