#include "train/cpu_backend.h"

#include <cmath>
#include <iostream>

#include "model/reference_model.h"
#include "runtime/error.h"

namespace cutrain::train {
namespace {

class CpuBackend final : public TrainBackend {
 public:
  CpuBackend(const BackendOptions& o, const TrainConfig& c)
      : opt_(o), cfg_(c), table_(o.dims), model_(table_, o.causal) {
    const std::size_t n = table_.flat_size();
    params_.resize(n);
    table_.init(params_.data(), o.seed);
    grads_.assign(n, 0.f);
    m_.assign(n, 0.f);
    v_.assign(n, 0.f);
  }
  const model::TransformerParams& table() const override { return table_; }

  StepStats step(const std::int32_t* tokens, const std::int32_t* labels, int step, float lr) override {
    const int accum = cfg_.accumulation();
    const std::size_t per = std::size_t(opt_.batch) * opt_.seq;
    std::fill(grads_.begin(), grads_.end(), 0.f);
    StepStats st;
    for (int a = 0; a < accum; ++a) {
      model_.set_moe_mode(true, model::moe_forward_seed(opt_.seed, step, a));
      st.loss += model_.forward(params_.data(), tokens + a * per, labels + a * per, opt_.batch, opt_.seq) / accum;
      model_.backward(params_.data(), grads_.data(), 1.0 / accum);
      merge_moe(st, a);
    }
    double sq = 0;
    for (float g : grads_) sq += double(g) * g;
    st.grad_norm = std::sqrt(sq);
    if (!std::isfinite(st.grad_norm)) {
      st.skipped = true;
      return st;
    }
    double scale = 1.0;
    if (cfg_.gradient_clipping > 0) scale = std::min(1.0, cfg_.gradient_clipping / (st.grad_norm + 1e-6));
    const auto& o = cfg_.optimizer;
    for (const model::DecayRun& r : table_.decay_runs())  // GPT-2: no decay for biases and LayerNorm
      model::reference_adam_step(params_.data() + r.begin, grads_.data() + r.begin, m_.data() + r.begin,
                                 v_.data() + r.begin, r.end - r.begin, lr, o.beta1, o.beta2, o.eps,
                                 r.decay ? o.weight_decay : 0.0, o.adam_w_mode, step, scale);
    return st;
  }

  double eval_loss(const std::int32_t* tokens, const std::int32_t* labels) override {
    model_.set_moe_mode(false);  // MoE blocks: eval_capacity_factor, no gate noise
    return model_.forward(params_.data(), tokens, labels, opt_.batch, opt_.seq);
  }

  MemoryStats memory() const override {
    // The training state on the host (params, grads, two moments), fp32.
    const auto bytes = std::int64_t(4 * 4 * params_.size());
    return {bytes, bytes, bytes};
  }
  void reset_peak() override {}
  HostState save_state() const override { return {params_, {}, m_, v_, {}, DType::F32}; }
  void load_state(const HostState& s) override {
    CUTRAIN_CHECK(s.params.size() == params_.size() && s.exp_avg.size() == m_.size() && s.exp_avg_sq.size() == v_.size(),
                  "cpu backend: state of ", s.params.size(), " params does not fit the model's ", params_.size());
    params_ = s.params;
    m_ = s.exp_avg;
    v_ = s.exp_avg_sq;
  }
  const char* describe() const override { return "cpu (fp32 reference model)"; }

 private:
  void merge_moe(StepStats& st, int micro) const {  // the MoE blocks' routing of micro-batch `micro`
    const auto& m = model_.moe_stats();
    st.moe.resize(m.size());
    for (std::size_t i = 0; i < m.size(); ++i) model::merge_moe_stats(st.moe[i], m[i], micro);
  }
  BackendOptions opt_;
  TrainConfig cfg_;
  model::TransformerParams table_;
  model::ReferenceModel<float> model_;
  std::vector<float> params_, grads_, m_, v_;
};

}  // namespace

std::unique_ptr<TrainBackend> make_cpu_backend(const BackendOptions& o, const TrainConfig& c) {
  return std::make_unique<CpuBackend>(o, c);
}

}  // namespace cutrain::train
