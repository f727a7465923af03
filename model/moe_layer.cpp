// @brief The GPU MoE layer (model/moe_layer.h) as a list of kernel calls. Buffers are sized once
// for max_tokens (rows of the permuted buffer: E x the largest capacity in the slot layout, at
// most k · max_tokens packed; with an expert-parallel group the experts' rows: at most the group's
// members times what one member can send); the backward reuses the fc2 output gradient's buffer
// for the expert input gradient once fc2's GEMMs have read it. Each phase is a timing region
// (gate, counts, permute, experts, unpermute, residual) inside the model's "moe" (no range of the
// layer's own, so the paths read step/fwd/layer01/moe/experts).
#include "model/moe_layer.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "kernels/gelu.cuh"
#include "kernels/gemm.cuh"
#include "kernels/moe_gate.cuh"
#include "kernels/moe_grouped_gemm.cuh"
#include "kernels/moe_jitter.cuh"
#include "kernels/moe_permute.cuh"
#include "kernels/moe_residual.cuh"
#include "model/kernel_costs.h"
#include "model/moe_dispatch_plan.h"
#include "runtime/check.h"
#include "runtime/timing.h"

namespace cutrain::model {

namespace {

// A phase of the layer as a timing region with what it computes and moves (model/kernel_costs.h).
struct Phase : TimedRegion {
  Phase(const char* name, cudaStream_t s, cost::Cost c) : TimedRegion(name, s, c.flops, c.bytes) {}
};

}  // namespace

int MoeForwardStats::min_load() const {
  return kept_counts.empty() ? 0 : *std::min_element(kept_counts.begin(), kept_counts.end());
}
int MoeForwardStats::max_load() const {
  return kept_counts.empty() ? 0 : *std::max_element(kept_counts.begin(), kept_counts.end());
}

struct MoeLayerGpu::Impl {
  MoeConfig c;
  MoeParamLayout layout;
  int max_tokens;
  kernels::Gemm gemm;
  kernels::GroupedGemm grouped;
  // The gate's small results, contiguous on both sides for one copy: kept_counts [E],
  // expert_counts [E], stats [2], l_aux [1]; with an expert-parallel group then the counts it
  // received [P][E/P]. The packed layout reads them on the host every forward.
  Buffer small;
  std::int32_t* host_small = nullptr;
  // The step's routing figures (kernels::MoeStepFigures), merged on the device, and their pinned
  // host copy.
  Buffer figures;
  kernels::MoeStepFigures* host_figures = nullptr;
  // The slot layout (model/moe_layer.h): token dropping without a group; C of the last forward.
  bool slotted = false;
  int C = 0;
  Buffer logits, probs, expert, position, weight, offsets, ce, gate_ws;  // per token / expert
  Buffer xp, a1, h, o;                                                   // per permuted row
  Buffer dlogits, dweight, dout, dh;                                     // backward
  // Expert parallelism: the group, this forward's exchange, the experts' rows (input, output) as
  // they arrived from every member, and the gradient of their output (then of their input).
  comm::Communicator* ep = nullptr;
  MoeDispatchPlan plan;
  Buffer ex_x, ex_o, ex_d;
  // PR-MoE's residual branch: the MoE output, the MLP (pre-GELU, GELU, output), the mix's logits
  // and coefficients; their gradients.
  Buffer ym, ar, hr, yr, clog, coef, dym, dyr, dclog, dhr, bias_scratch;
  // Jitter: the gate's jittered input and its input gradient before the jitter.
  Buffer xj, dxg;
  // The last forward.
  int T = 0, R = 0;
  std::vector<int> rows;
  bool jitter = false;
  std::uint64_t seed = 0;
  const std::uint64_t* seed_word = nullptr;

  Impl(const MoeConfig& cfg, int max_t, CachingAllocator& alloc, comm::Communicator* group, bool packed)
      : c(cfg), layout(moe_param_layout(cfg)), max_tokens(max_t), gemm(&alloc), grouped(cfg.experts), ep(group) {
    slotted = c.drop_tokens && !ep && !packed;
    const std::size_t E = c.experts, H = c.hidden, F = c.ffn, T = max_t, K = c.k;
    // Slots: E x the larger of the two capacities at max_tokens (a capacity grows with the tokens).
    const std::size_t R = slotted ? E * std::size_t(std::max(moe_layer_capacity(c, max_t, true),
                                                             moe_layer_capacity(c, max_t, false)))
                                  : K * T;
    const std::size_t P = ep ? std::size_t(ep->world_size()) : 0;
    small = Buffer(alloc, (2 * E + 3 + P * (E / std::max<std::size_t>(P, 1))) * 4);
    figures = Buffer(alloc, sizeof(kernels::MoeStepFigures));
    CUTRAIN_CUDA_CHECK(cudaMemset(figures.get(), 0, figures.bytes()));  // no forward merged yet
    CUTRAIN_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_small), small.bytes(), cudaHostAllocDefault));
    CUTRAIN_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_figures), sizeof(*host_figures),
                                     cudaHostAllocDefault));
    *host_figures = {};
    // The experts' rows: every member's at most (model/moe_dispatch_plan.h); fc1 / GELU on them.
    const std::size_t RE =
        ep ? P * std::size_t(moe_dispatch_max_rows(c.experts, int(P), c.k, max_t, c.drop_tokens,
                                                   std::max(moe_layer_capacity(c, max_t, true),
                                                            moe_layer_capacity(c, max_t, false))))
           : R;
    logits = Buffer(alloc, T * E * 4);
    probs = Buffer(alloc, T * E * 4);
    expert = Buffer(alloc, T * K * 4);
    position = Buffer(alloc, T * K * 4);
    weight = Buffer(alloc, T * K * 4);
    offsets = Buffer(alloc, (E + 1) * 4);
    ce = Buffer(alloc, E * 4);
    gate_ws = Buffer(alloc, kernels::moe_gate_workspace_bytes(max_t, c.experts, c.k));
    xp = Buffer(alloc, R * H * 2);
    a1 = Buffer(alloc, RE * F * 2);
    h = Buffer(alloc, RE * F * 2);
    o = Buffer(alloc, R * H * 2);
    dlogits = Buffer(alloc, T * E * 2);
    dweight = Buffer(alloc, T * K * 4);
    dout = Buffer(alloc, R * H * 2);
    dh = Buffer(alloc, RE * F * 2);
    if (ep) {
      ex_x = Buffer(alloc, RE * H * 2);
      ex_o = Buffer(alloc, RE * H * 2);
      ex_d = Buffer(alloc, RE * H * 2);
    }
    if (c.noisy_gate_policy == MoeNoisyGate::Jitter) {
      xj = Buffer(alloc, T * H * 2);
      dxg = Buffer(alloc, T * H * 2);
    }
    if (c.use_residual) {
      ym = Buffer(alloc, T * H * 2);
      ar = Buffer(alloc, T * F * 2);
      hr = Buffer(alloc, T * F * 2);
      yr = Buffer(alloc, T * H * 2);
      clog = Buffer(alloc, T * 2 * 4);
      coef = Buffer(alloc, T * 2 * 4);
      dym = Buffer(alloc, T * H * 2);
      dyr = Buffer(alloc, T * H * 2);
      dclog = Buffer(alloc, T * 2 * 2);
      dhr = Buffer(alloc, T * F * 2);
      bias_scratch = Buffer(alloc, std::max<std::size_t>(16, kernels::bias_grad_scratch_bytes(max_t, 2)));
    }
  }
  ~Impl() {
    if (host_small) cudaFreeHost(host_small);
    if (host_figures) cudaFreeHost(host_figures);
  }

  kernels::MoeRouting routing() const {
    return {expert.as<std::int32_t>(), position.as<std::int32_t>(), offsets.as<std::int32_t>(), T, c.k,
            slotted ? C : 0};
  }
  const std::int32_t* kept_counts() const { return small.as<std::int32_t>(); }
};

MoeLayerGpu::MoeLayerGpu(const MoeConfig& c, int max_tokens, CachingAllocator& alloc, comm::Communicator* ep_group,
                         bool packed) {
  validate(c);
  CUTRAIN_CHECK(max_tokens >= 1, "MoE layer: max_tokens must be >= 1, got ", max_tokens);
  if (ep_group) {
    CUTRAIN_CHECK(ep_group->device() >= 0, "MoE layer: the expert-parallel group must be a device communicator "
                  "(NCCL), found ", ep_group->backend_name());
    CUTRAIN_CHECK(c.experts % ep_group->world_size() == 0, "MoE layer: ep_size ", ep_group->world_size(),
                  " does not divide num_experts ", c.experts);
  }
  impl_ = std::make_unique<Impl>(c, max_tokens, alloc, ep_group, packed);
}

MoeLayerGpu::~MoeLayerGpu() = default;

const MoeConfig& MoeLayerGpu::config() const { return impl_->c; }

void MoeLayerGpu::forward(cudaStream_t s, const bf16* params, const bf16* x, bf16* y, int tokens, bool train,
                          std::uint64_t seed, const std::uint64_t* seed_word) {
  Impl& m = *impl_;
  validate(m.c, tokens);
  CUTRAIN_CHECK(tokens <= m.max_tokens, "MoE layer: ", tokens, " tokens is more than max_tokens = ", m.max_tokens);
  CUTRAIN_CHECK(params && x && y, "MoE layer forward: params, x and y must be non-null");
  const int E = m.c.experts, H = m.c.hidden, F = m.c.ffn, K = m.c.k;
  m.T = tokens;
  const bf16* wg = params + m.layout.wg;
  const bf16* w1 = params + m.layout.w1;
  const bf16* w2 = params + m.layout.w2;

  m.jitter = train && m.c.noisy_gate_policy == MoeNoisyGate::Jitter;
  m.seed = seed_word ? 0 : seed;  // with a word the derivations XOR onto its value on the device
  m.seed_word = seed_word;
  std::int32_t* small = m.small.as<std::int32_t>();
  m.C = m.c.drop_tokens ? moe_layer_capacity(m.c, tokens, train) : 0;
  {
    Phase rg("gate", s, cost::moe_gate_forward(tokens, H, E, K));
    const bf16* gate_in = x;
    if (m.jitter) {
      kernels::moe_jitter_forward(s, x, m.xj.as<bf16>(), std::size_t(tokens) * H, kMoeJitterEps,
                                  moe_jitter_seed(m.seed), seed_word);
      gate_in = m.xj.as<bf16>();
    }
    m.gemm.forward_fp32(s, gate_in, wg, m.logits.as<float>(), tokens, E, H);
    kernels::MoeGateOutputs out{m.probs.as<float>(), m.expert.as<std::int32_t>(), m.position.as<std::int32_t>(),
                                m.weight.as<float>(), small + E, small, m.offsets.as<std::int32_t>(),
                                m.ce.as<float>(), reinterpret_cast<float*>(small + 2 * E + 2), small + 2 * E};
    kernels::MoeGateShape shape{tokens, E, K, m.c.drop_tokens, m.C};
    shape.noise.rsample = train && m.c.noisy_gate_policy == MoeNoisyGate::RSample;
    shape.noise.second_sampling = m.c.top2_2nd_expert_sampling && K == 2;
    shape.noise.rts = m.c.use_rts;
    shape.noise.seed = moe_gumbel_seed(m.seed);
    shape.noise.seed_word = seed_word;
    kernels::moe_gate_forward(s, m.logits.as<float>(), shape, out, m.gate_ws.get());
  }
  const auto rt = m.routing();
  const std::size_t Hs = std::size_t(H);
  if (m.slotted) {  // [E, C] slots: every shape from the host's capacity, the counts stay on the device
    const int C = m.C;
    {
      Phase rp("permute", s, cost::moe_permute(tokens, std::size_t(E) * C, H, K));
      kernels::moe_permute(s, x, rt, m.xp.as<bf16>(), H);
      kernels::moe_zero_empty_slots(s, m.xp.as<bf16>(), m.kept_counts(), E, C, H);
    }
    {
      Phase re("experts", s, cost::moe_experts_forward(std::size_t(E) * C, H, F, E));
      m.gemm.forward_batched(s, m.xp.as<bf16>(), w1, m.a1.as<bf16>(), E, C, F, H);
      kernels::gelu_forward(s, m.a1.as<bf16>(), nullptr, nullptr, m.h.as<bf16>(), std::size_t(E) * C, F,
                            kernels::GeluKind::Erf);
      m.gemm.forward_batched(s, m.h.as<bf16>(), w2, m.o.as<bf16>(), E, C, H, F);
    }
  } else {
    const int P = m.ep ? m.ep->world_size() : 0, El = m.ep ? E / P : 0;
    {
      // The counts to the host: each member's kept counts of this rank's experts (the kept counts'
      // chunk j is member j's experts) beside the gate's results, one copy and one synchronization.
      TimedRegion rc("counts", s);
      if (m.ep) m.ep->all_to_all(small, small + 2 * E + 3, std::size_t(El), DType::I32, s);
      CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(m.host_small, small, m.small.bytes(), cudaMemcpyDeviceToHost, s));
      CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(s));
    }
    m.rows.assign(m.host_small, m.host_small + E);
    m.R = std::accumulate(m.rows.begin(), m.rows.end(), 0);
    {
      Phase rp("permute", s, cost::moe_permute(tokens, m.R, H, K));
      kernels::moe_permute(s, x, rt, m.xp.as<bf16>(), H);
    }
    if (m.ep) {  // this rank's experts on every member's rows, the outputs back in the permuted order
      m.plan = make_moe_dispatch_plan(E, P, m.ep->rank(), m.rows,
                                      std::vector<int>(m.host_small + 2 * E + 3, m.host_small + 2 * E + 3 + P * El),
                                      "MoE layer");
      const std::size_t first = std::size_t(m.plan.first_expert);
      const auto sends = MoeDispatchPlan::scaled(m.plan.sends, Hs);
      const auto recvs = MoeDispatchPlan::scaled(m.plan.recvs, Hs);
      Phase re("experts", s, cost::moe_experts_forward(m.plan.recv_rows, H, F, El));
      m.ep->all_to_all_v(m.xp.get(), sends, m.ex_x.get(), recvs, DType::BF16, s);
      const int* lr = m.plan.local_rows.data();
      m.grouped.forward(s, m.ex_x.as<bf16>(), w1 + first * F * H, m.a1.as<bf16>(), lr, El, F, H);
      if (m.plan.recv_rows > 0)  // no member may have routed a token to this rank's experts
        kernels::gelu_forward(s, m.a1.as<bf16>(), nullptr, nullptr, m.h.as<bf16>(), std::size_t(m.plan.recv_rows), F,
                              kernels::GeluKind::Erf);
      m.grouped.forward(s, m.h.as<bf16>(), w2 + first * H * F, m.ex_o.as<bf16>(), lr, El, H, F);
      m.ep->all_to_all_v(m.ex_o.get(), recvs, m.o.get(), sends, DType::BF16, s);
    } else {
      Phase re("experts", s, cost::moe_experts_forward(m.R, H, F, E));
      m.grouped.forward(s, m.xp.as<bf16>(), w1, m.a1.as<bf16>(), m.rows.data(), E, F, H);
      kernels::gelu_forward(s, m.a1.as<bf16>(), nullptr, nullptr, m.h.as<bf16>(), std::size_t(m.R), F,
                            kernels::GeluKind::Erf);
      m.grouped.forward(s, m.h.as<bf16>(), w2, m.o.as<bf16>(), m.rows.data(), E, H, F);
    }
  }
  bf16* y_moe = m.c.use_residual ? m.ym.as<bf16>() : y;
  {
    Phase ru("unpermute", s, cost::moe_unpermute(tokens, m.slotted ? std::size_t(E) * m.C : m.R, H, K, false));
    kernels::moe_unpermute(s, m.o.as<bf16>(), m.weight.as<float>(), rt, y_moe, H);
  }
  if (m.c.use_residual) {  // the dense MLP beside the experts, then the learned mix
    Phase rr("residual", s, cost::moe_residual(tokens, H, F, false));
    m.gemm.forward(s, x, params + m.layout.r1, nullptr, m.ar.as<bf16>(), tokens, F, H);
    kernels::gelu_forward(s, m.ar.as<bf16>(), nullptr, nullptr, m.hr.as<bf16>(), std::size_t(tokens), F,
                          kernels::GeluKind::Erf);
    m.gemm.forward(s, m.hr.as<bf16>(), params + m.layout.r2, nullptr, m.yr.as<bf16>(), tokens, H, F);
    m.gemm.forward_fp32(s, x, params + m.layout.cw, m.clog.as<float>(), tokens, 2, H);
    kernels::moe_residual_mix_forward(s, y_moe, m.yr.as<bf16>(), m.clog.as<float>(), params + m.layout.cb, y,
                                      m.coef.as<float>(), tokens, H);
  }
}

MoeForwardStats MoeLayerGpu::last_stats(cudaStream_t s) const {
  const Impl& m = *impl_;
  CUTRAIN_CHECK(m.T > 0, "MoE layer last_stats: call forward first");
  const int E = m.c.experts;
  CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(m.host_small, m.small.get(), std::size_t(2 * E + 3) * 4, cudaMemcpyDeviceToHost, s));
  CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(s));
  MoeForwardStats st;
  st.kept_counts.assign(m.host_small, m.host_small + E);
  st.expert_counts.assign(m.host_small + E, m.host_small + 2 * E);
  st.capacity = m.host_small[2 * E];
  st.dropped = m.host_small[2 * E + 1];
  std::memcpy(&st.l_aux, m.host_small + 2 * E + 2, 4);
  return st;
}

void MoeLayerGpu::merge_step_stats(cudaStream_t s, bool first) {
  const Impl& m = *impl_;
  CUTRAIN_CHECK(m.T > 0, "MoE layer merge_step_stats: call forward first");
  const int E = m.c.experts;
  const std::int32_t* small = m.small.as<std::int32_t>();
  kernels::moe_step_figures_merge(s, small, small + 2 * E, reinterpret_cast<const float*>(small + 2 * E + 2), E,
                                  m.figures.as<kernels::MoeStepFigures>(), first);
}

void MoeLayerGpu::stage_step_stats(cudaStream_t s) const {
  const Impl& m = *impl_;
  CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(m.host_figures, m.figures.get(), sizeof(kernels::MoeStepFigures),
                                     cudaMemcpyDeviceToHost, s));
}

MoeBlockStats MoeLayerGpu::staged_step_stats() const {
  const kernels::MoeStepFigures& f = *impl_->host_figures;
  CUTRAIN_CHECK(f.forwards > 0, "MoE layer step stats: no forward was merged (merge_step_stats)");
  MoeBlockStats b;
  b.l_aux = double(f.l_aux_sum) / f.forwards;
  b.capacity = f.capacity;
  b.dropped = f.dropped;
  b.min_load = f.min_load;
  b.max_load = f.max_load;
  return b;
}

MoeBlockStats MoeLayerGpu::read_step_stats(cudaStream_t s) const {
  stage_step_stats(s);
  CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(s));
  return staged_step_stats();
}

const char* MoeLayerGpu::eager_reason(const MoeConfig& c, bool expert_parallel, bool seed_words) {
  if (!c.drop_tokens) return "without token dropping the largest expert count, read on the host, sizes the work";
  if (expert_parallel) return "the expert-parallel exchange reads the routing counts on the host";
  if (!seed_words && (c.noisy_gate_policy != MoeNoisyGate::None || c.use_rts || c.top2_2nd_expert_sampling))
    return "the gate noise's seed is a host value of each step";
  return nullptr;
}

const char* MoeLayerGpu::eager_reason(bool seed_words) const {
  if (const char* why = eager_reason(impl_->c, impl_->ep != nullptr, seed_words)) return why;
  return impl_->slotted ? nullptr : "the packed layout reads the routing counts on the host";
}
bool MoeLayerGpu::capturable(bool seed_words) const { return eager_reason(seed_words) == nullptr; }

void MoeLayerGpu::backward(cudaStream_t s, const bf16* params, const bf16* x, const bf16* dy, float aux_grad,
                           bf16* dx, void* grads, DType grad_type, bool accumulate, bool dx_accumulate) {
  Impl& m = *impl_;
  CUTRAIN_CHECK(m.T > 0, "MoE layer backward: call forward first");
  CUTRAIN_CHECK(params && x && dy && dx && grads, "MoE layer backward: every pointer must be non-null");
  CUTRAIN_CHECK(grad_type == DType::BF16 || grad_type == DType::F32,
                "MoE layer backward: gradients must be bf16 or fp32, got ", dtype_name(grad_type));
  const int E = m.c.experts, H = m.c.hidden, F = m.c.ffn, K = m.c.k, T = m.T;
  const bf16* wg = params + m.layout.wg;
  const bf16* w1 = params + m.layout.w1;
  const bf16* w2 = params + m.layout.w2;
  char* g = static_cast<char*>(grads);
  const std::size_t es = dtype_size(grad_type);
  const auto rt = m.routing();
  bf16* dout = m.dout.as<bf16>();
  bf16* dh = m.dh.as<bf16>();
  const bf16* dy_in = dy;
  if (m.c.use_residual) {  // the MoE branch sees c0·dy
    kernels::moe_residual_mix_backward(s, dy_in, m.ym.as<bf16>(), m.yr.as<bf16>(), m.coef.as<float>(),
                                       m.dym.as<bf16>(), m.dyr.as<bf16>(), m.dclog.as<bf16>(), T, H);
    dy = m.dym.as<bf16>();
  }

  const std::size_t Hs = std::size_t(H);
  const std::size_t rows = m.slotted ? std::size_t(E) * m.C : std::size_t(m.R);  // the permuted rows
  {
    Phase ru("unpermute", s, cost::moe_unpermute(T, rows, H, K, true));
    kernels::moe_unpermute_backward(s, dy, m.o.as<bf16>(), m.weight.as<float>(), rt, dout, m.dweight.as<float>(), H);
    if (m.slotted) kernels::moe_zero_empty_slots(s, dout, m.kept_counts(), E, m.C, H);
  }
  bf16* dxp = dout;  // fc2's GEMMs below have read dout (or the exchange has sent it) by its reuse
  if (m.slotted) {  // the [E, C] slots as strided batches; the zeroed slots add exact zeros to dW
    const int C = m.C;
    Phase re("experts", s, cost::moe_experts_backward(rows, H, F, E, es, accumulate));
    m.gemm.grad_weight_batched(s, dout, m.h.as<bf16>(), g + m.layout.w2 * es, grad_type, E, C, H, F, accumulate);
    m.gemm.grad_input_batched(s, dout, w2, dh, E, C, H, F);
    kernels::gelu_backward(s, dh, m.a1.as<bf16>(), dh, std::size_t(E) * C * F, kernels::GeluKind::Erf);
    m.gemm.grad_weight_batched(s, dh, m.xp.as<bf16>(), g + m.layout.w1 * es, grad_type, E, C, F, H, accumulate);
    m.gemm.grad_input_batched(s, dh, w1, dxp, E, C, F, H);
  } else if (m.ep) {  // the rows' output gradients to the experts' owners, their input gradients back
    const int El = m.plan.local_experts;
    const std::size_t first = std::size_t(m.plan.first_expert);
    const auto sends = MoeDispatchPlan::scaled(m.plan.sends, Hs);
    const auto recvs = MoeDispatchPlan::scaled(m.plan.recvs, Hs);
    const int* lr = m.plan.local_rows.data();
    bf16* ed = m.ex_d.as<bf16>();
    Phase re("experts", s, cost::moe_experts_backward(m.plan.recv_rows, H, F, El, es, accumulate));
    m.ep->all_to_all_v(dout, sends, ed, recvs, DType::BF16, s);
    m.grouped.grad_weight(s, ed, m.h.as<bf16>(), g + (m.layout.w2 + first * H * F) * es, grad_type, lr, El, H, F,
                          accumulate);
    m.grouped.grad_input(s, ed, w2 + first * H * F, dh, lr, El, H, F);
    if (m.plan.recv_rows > 0)
      kernels::gelu_backward(s, dh, m.a1.as<bf16>(), dh, std::size_t(m.plan.recv_rows) * F, kernels::GeluKind::Erf);
    m.grouped.grad_weight(s, dh, m.ex_x.as<bf16>(), g + (m.layout.w1 + first * F * H) * es, grad_type, lr, El, F, H,
                          accumulate);
    m.grouped.grad_input(s, dh, w1 + first * F * H, ed, lr, El, F, H);  // fc2's GEMMs above have read ed
    m.ep->all_to_all_v(ed, recvs, dxp, sends, DType::BF16, s);
    if (!accumulate) {  // the experts held elsewhere: no gradient here (their owners have it)
      const std::size_t fh = std::size_t(F) * H, last = first + std::size_t(El);
      for (std::size_t w : {m.layout.w1, m.layout.w2}) {
        if (first > 0) CUTRAIN_CUDA_CHECK(cudaMemsetAsync(g + w * es, 0, first * fh * es, s));
        if (last < std::size_t(E))
          CUTRAIN_CUDA_CHECK(cudaMemsetAsync(g + (w + last * fh) * es, 0, (std::size_t(E) - last) * fh * es, s));
      }
    }
  } else {
    Phase re("experts", s, cost::moe_experts_backward(rows, H, F, E, es, accumulate));
    m.grouped.grad_weight(s, dout, m.h.as<bf16>(), g + m.layout.w2 * es, grad_type, m.rows.data(), E, H, F,
                          accumulate);
    m.grouped.grad_input(s, dout, w2, dh, m.rows.data(), E, H, F);
    kernels::gelu_backward(s, dh, m.a1.as<bf16>(), dh, std::size_t(m.R) * F, kernels::GeluKind::Erf);
    m.grouped.grad_weight(s, dh, m.xp.as<bf16>(), g + m.layout.w1 * es, grad_type, m.rows.data(), E, F, H,
                          accumulate);
    m.grouped.grad_input(s, dh, w1, dxp, m.rows.data(), E, F, H);
  }
  {
    Phase rp("permute", s, cost::moe_permute(T, rows, H, K));
    kernels::moe_permute_backward(s, dxp, rt, dx, H, dx_accumulate);  // dx's first write: dy is read by now
  }
  Phase rg("gate", s, cost::moe_gate_backward(T, H, E, K, es, accumulate));
  kernels::moe_gate_backward(s, m.probs.as<float>(), m.expert.as<std::int32_t>(), m.position.as<std::int32_t>(),
                             m.dweight.as<float>(), m.ce.as<float>(), aux_grad, T, E, K, m.dlogits.as<bf16>());
  if (m.jitter) {  // logits = (x ⊙ u)·Wgᵀ
    m.gemm.grad_input(s, m.dlogits.as<bf16>(), wg, m.dxg.as<bf16>(), T, E, H);
    kernels::moe_jitter_backward(s, m.dxg.as<bf16>(), dx, std::size_t(T) * H, kMoeJitterEps, moe_jitter_seed(m.seed),
                                 m.seed_word);
    m.gemm.grad_weight(s, m.dlogits.as<bf16>(), m.xj.as<bf16>(), g + m.layout.wg * es, grad_type, T, E, H,
                       accumulate);
  } else {
    m.gemm.grad_input(s, m.dlogits.as<bf16>(), wg, dx, T, E, H, 1.f);
    m.gemm.grad_weight(s, m.dlogits.as<bf16>(), x, g + m.layout.wg * es, grad_type, T, E, H, accumulate);
  }
  if (!m.c.use_residual) return;
  Phase rr("residual", s, cost::moe_residual(T, H, F, true));
  const bf16* dclog = m.dclog.as<bf16>();
  m.gemm.grad_input(s, dclog, params + m.layout.cw, dx, T, 2, H, 1.f);
  m.gemm.grad_weight(s, dclog, x, g + m.layout.cw * es, grad_type, T, 2, H, accumulate);
  kernels::bias_grad(s, dclog, g + m.layout.cb * es, grad_type, T, 2, accumulate, m.bias_scratch.get());
  bf16* dhr = m.dhr.as<bf16>();
  m.gemm.grad_weight(s, m.dyr.as<bf16>(), m.hr.as<bf16>(), g + m.layout.r2 * es, grad_type, T, H, F, accumulate);
  m.gemm.grad_input(s, m.dyr.as<bf16>(), params + m.layout.r2, dhr, T, H, F);
  kernels::gelu_backward(s, dhr, m.ar.as<bf16>(), dhr, std::size_t(T) * F, kernels::GeluKind::Erf);
  m.gemm.grad_weight(s, dhr, x, g + m.layout.r1 * es, grad_type, T, F, H, accumulate);
  m.gemm.grad_input(s, dhr, params + m.layout.r1, dx, T, F, H, 1.f);
}

}  // namespace cutrain::model
