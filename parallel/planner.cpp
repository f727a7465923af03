#include "parallel/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "kernels/attention.cuh"
#include "kernels/cross_entropy.cuh"
#include "kernels/gemm.cuh"
#include "kernels/layernorm.cuh"
#include "parallel/pipeline_plan.h"
#include "parallel/zero_plan.h"
#include "parallel/zero_shard_layout.h"
#include "runtime/error.h"

namespace cutrain::parallel {

namespace {

// The bytes a buffer takes from a fresh caching allocator (runtime/allocator.h's rules): 512 B
// rounding; a request of 10 MiB or more gets a segment of its own rounded to 2 MiB, which is
// split only when more than 1 MiB would remain (else the block is the whole segment). Smaller
// large-pool requests split a 20 MiB segment and keep their rounded size.
double alloc_bytes(double bytes) {
  const double r = std::ceil(bytes / 512.0) * 512.0;
  constexpr double MiB = 1 << 20;
  if (r < 10 * MiB) return r;
  const double segment = std::ceil(r / (2 * MiB)) * 2 * MiB;
  return segment - r > MiB ? r : segment;
}

// kernels::Gemm's workspace (its constructor's default, which the GPU model uses).
constexpr double kGemmWorkspace = 32.0 * (1 << 20);
// kernels/reduce.cu: grad_norm_scratch_bytes (kMaxBlocks doubles).
constexpr double kNormScratch = 1024 * 8;

// One reduction scratch shared by the model's kernels (transformer_gpu.cpp: the largest need).
// The embedding backward's radix sort asks cub for its temp size on the device; here its four
// key/value arrays and an equal double buffer stand for it (it is never the largest at these shapes).
double scratch_bytes(const PlanModel& m, int tp) {
  const model::ModelDims& d = m.dims;
  const int M = m.micro_batch * m.seq, h = d.hidden, F = d.ffn() / tp, V = (d.vocab_rows() + tp - 1) / tp;
  double sc = 0;
  for (int n : {3 * h / tp, h, F, V}) sc = std::max(sc, double(kernels::bias_grad_scratch_bytes(M, n)));
  sc = std::max(sc, double(kernels::layernorm_backward_scratch_bytes(M, h)));
  sc = std::max(sc, 8.0 * std::ceil(M * 4.0 / 256) * 256);
  const kernels::AttentionShape a{m.micro_batch, m.seq, d.heads / tp, d.head_dim(), m.causal};
  sc = std::max(sc, double(kernels::attention_backward_scratch_bytes(a, m.deterministic_attention)));
  sc = std::max(sc, double(kernels::cross_entropy_scratch_bytes(M)));
  return alloc_bytes(std::max(sc, 256.0));
}

// Activations of `blocks` blocks (and the logits when the GPU holds the head) with `in_flight`
// micro-batches' stored activations, at tensor-parallel degree tp: GpuTransformer::allocate's
// buffers.
double activation_bytes(const PlanModel& m, int blocks, bool head, int in_flight, int tp) {
  const model::ModelDims& d = m.dims;
  const double M = double(m.micro_batch) * m.seq, h = d.hidden, F = double(d.ffn()) / tp;
  const double V = std::ceil(double(d.vocab_rows()) / tp), H = double(d.heads) / tp;
  const double act_set = alloc_bytes(M * 3 * h / tp * 2) + alloc_bytes(M * h / tp * 2) + 3 * alloc_bytes(M * h * 2) + 2 * alloc_bytes(M * F * 2) +
                         alloc_bytes(m.micro_batch * H * m.seq * 4) + 4 * alloc_bytes(M * 4);
  const double xs = (blocks + 1) * alloc_bytes(M * h * 2);
  const double sets = m.checkpointing ? 1 : double(blocks) * in_flight;
  const double stored = in_flight * xs + sets * act_set;
  const double logits = head ? alloc_bytes(M * V * 2) : 0;
  const double grads = 2 * alloc_bytes(M * h * 2) + alloc_bytes(M * F * 2) + alloc_bytes(M * 3 * h / tp * 2);
  return stored + logits + grads;
}

// The engine's fixed buffers beside the model's: token and label staging of a step, the flags,
// the norm's scratch, the GEMM workspace, the model's reduction scratch.
double fixed_buffers(const PlanModel& m, int tp) {
  const double per_step = double(m.accumulation) * m.micro_batch * m.seq;
  const double flags = (m.accumulation + 3 + 2.0 * m.accumulation) * 4;
  return 2 * alloc_bytes(per_step * 4) + alloc_bytes(flags) + alloc_bytes(kNormScratch) + kGemmWorkspace + scratch_bytes(m, tp);
}

// Persistent state of `elems` elements per buffer, unpartitioned.
void add_full_state(MemoryBreakdown& mem, const StateBytes& s, double elems) {
  mem.params += alloc_bytes(elems * s.params);
  mem.grads += alloc_bytes(elems * s.grads);
  mem.optimizer += (s.master > 0 ? alloc_bytes(elems * s.master) : 0) +
                   (s.compensation > 0 ? alloc_bytes(elems * s.compensation) : 0) + 2 * alloc_bytes(elems * s.moments / 2);
}

std::vector<Range> unit_ranges(const model::TransformerParams& t) {
  std::vector<Range> u;
  for (const model::ParamUnit& p : t.units()) u.push_back({p.begin, p.end});
  return u;
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// One micro-batch's forward + backward of pipeline layers [first, end) at TP degree tp.
double micro_compute(const PlanModel& m, const KernelTimings& t, int first, int end, int tp) {
  const int L = m.dims.layers;
  const double split = t.layer_replicated_fraction + (1 - t.layer_replicated_fraction) / tp;
  const double recompute = m.checkpointing ? (t.layer_recompute > 0 ? t.layer_recompute : t.layer_fwd) : 0;
  double s = 0;
  for (int i = first; i < end; ++i) {
    if (i == 0) s += t.embed_fwd + t.embed_bwd;
    else if (i <= L) s += split * (t.layer_fwd + t.layer_bwd + recompute);
    else s += (t.head_fwd + t.head_bwd) / tp;
  }
  return s;
}

// The backward part of a whole model's micro-batch (what stage 3's overlapped reduce-scatter hides behind).
double micro_backward(const PlanModel& m, const KernelTimings& t) {
  const double recompute = m.checkpointing ? (t.layer_recompute > 0 ? t.layer_recompute : t.layer_fwd) : 0;
  return t.embed_bwd + t.head_bwd + m.dims.layers * (t.layer_bwd + recompute);
}

}  // namespace

std::string Layout::name() const {
  std::string n;
  switch (kind) {
    case LayoutKind::Zero: return "zero" + std::to_string(zero_stage);
    case LayoutKind::Pipeline: n = "pp" + std::to_string(pp); break;
    case LayoutKind::Tensor: n = "tp" + std::to_string(tp); break;
  }
  if (dp > 1) n += " x dp" + std::to_string(dp);
  return n;
}

double allreduce_seconds(double bytes, int n, const LinkModel& l) {
  if (n <= 1) return 0;
  return 2.0 * (n - 1) * l.latency_us * 1e-6 + 2.0 * (n - 1) / n * bytes / (l.gbps * 1e9);
}
double reduce_scatter_seconds(double bytes, int n, const LinkModel& l) {
  if (n <= 1) return 0;
  return (n - 1) * l.latency_us * 1e-6 + double(n - 1) / n * bytes / (l.gbps * 1e9);
}
double all_gather_seconds(double bytes, int n, const LinkModel& l) { return reduce_scatter_seconds(bytes, n, l); }
double send_recv_seconds(double bytes, const LinkModel& l) { return l.latency_us * 1e-6 + bytes / (l.gbps * 1e9); }

int tp_allreduces_per_layer(const PlanModel& m, int tp) { return tp <= 1 ? 0 : (m.checkpointing ? 6 : 4); }

double tp_allreduce_bytes_per_layer(const PlanModel& m, int tp) {
  return tp_allreduces_per_layer(m, tp) * double(m.micro_batch) * m.seq * m.dims.hidden * 2;
}

std::size_t tp_local_params(const model::ModelDims& d, int first, int end, int tp) {
  const std::size_t h = d.hidden, F = d.ffn(), V = (std::size_t(d.vocab_rows()) + tp - 1) / tp, S = d.max_seq;
  const std::size_t T = std::size_t(tp);
  const std::size_t block = (3 * h * h + 3 * h) / T + (h * h) / T + h + (F * h + F) / T + (h * F) / T + h + 4 * h;
  std::size_t n = 0;
  for (int i = first; i < end; ++i) {
    if (i == 0) n += V * h + S * h;
    else if (i <= d.layers) n += block;
    else n += V * h + V;
  }
  return n;
}

void check_layout(const PlanModel& m, const Layout& l, int num_gpus) {
  const model::ModelDims& d = m.dims;
  CUTRAIN_CHECK(num_gpus >= 1, "plan: --num_gpus must be >= 1, got ", num_gpus);
  CUTRAIN_CHECK(d.arch == model::Arch::Simple && !d.moe.any(),
                "plan: the planner models the BF16 example's model (dense blocks, --model simple)");
  CUTRAIN_CHECK(d.hidden % d.heads == 0, "plan: --num_heads ", d.heads, " does not divide --hidden_dim ", d.hidden);
  CUTRAIN_CHECK(d.head_dim() == 64 || d.head_dim() == 128, "plan: --hidden_dim ", d.hidden, " / --num_heads ",
                d.heads, " = head_dim ", d.head_dim(), "; the GPU model's attention takes 64 or 128");
  CUTRAIN_CHECK(m.micro_batch >= 1 && m.seq >= 1 && m.accumulation >= 1, "plan: --batch_size, --seq_length and "
                "gradient_accumulation_steps must be >= 1, got ", m.micro_batch, ", ", m.seq, ", ", m.accumulation);
  CUTRAIN_CHECK(l.dp * l.pp * l.tp == num_gpus, "plan: layout ", l.name(), " uses ", l.dp * l.pp * l.tp,
                " GPUs, --num_gpus is ", num_gpus);
  if (l.kind == LayoutKind::Zero)
    CUTRAIN_CHECK(l.zero_stage >= 0 && l.zero_stage <= 3, "plan: ZeRO stage ", l.zero_stage, " is not 0-3");
  if (l.kind == LayoutKind::Pipeline)
    CUTRAIN_CHECK(d.layers % l.pp == 0, "plan: --pipeline_parallel_size ", l.pp, " does not divide --num_layers ",
                  d.layers);
  if (l.kind == LayoutKind::Tensor)
    CUTRAIN_CHECK(d.heads % l.tp == 0, "plan: --tensor_parallel_size ", l.tp, " does not divide --num_heads ", d.heads,
                  " (Megatron splits the attention by heads)");
}

MemoryBreakdown single_gpu_memory(const PlanModel& m) {
  const model::TransformerParams table(m.dims);
  MemoryBreakdown mem;
  add_full_state(mem, m.state, double(table.flat_size()));
  mem.activations = activation_bytes(m, m.dims.layers, true, 1, 1);
  mem.buffers = fixed_buffers(m, 1);
  return mem;
}

MemoryBreakdown zero_rank_memory(const PlanModel& m, int stage, int world) {
  CUTRAIN_CHECK(stage >= 0 && stage <= 3 && world >= 1, "plan: no ZeRO stage ", stage, " at world size ", world);
  const model::TransformerParams table(m.dims);
  const StateBytes& s = m.state;
  MemoryBreakdown mem;
  mem.activations = activation_bytes(m, m.dims.layers, true, 1, 1);
  mem.buffers = fixed_buffers(m, 1) + alloc_bytes(8);  // ZeroComm's fp64 norm partial
  if (stage == 0) {
    add_full_state(mem, s, double(table.flat_size()));
  } else if (stage < 3) {
    const ZeroPlan z = make_zero_plan(stage, table.flat_size(), world, 0, true);
    mem.params = alloc_bytes(double(z.flat_elems()) * s.params);
    mem.grads = alloc_bytes(double(z.flat_elems()) * s.grads);
    MemoryBreakdown st;
    add_full_state(st, s, double(z.state_elems()));
    mem.optimizer = st.optimizer;
  } else {
    const ShardLayout sl = make_shard_layout(unit_ranges(table), table.flat_size(), world, m.persistence_threshold);
    const double shard = double(sl.shard_elems);
    mem.params = alloc_bytes(shard * s.params);
    // The full gradient buffer (backward writes one flat buffer) and the reduced shard.
    mem.grads = alloc_bytes(double(sl.padded_elems) * s.grads) + alloc_bytes(shard * s.grads);
    MemoryBreakdown st;
    add_full_state(st, s, shard);
    mem.optimizer = st.optimizer;
    // Two gather buffers (the unit in use and the prefetched one) and the persistent units.
    mem.buffers += 2 * alloc_bytes(double(sl.gather_elems) * 2) + (sl.persistent_elems ? alloc_bytes(sl.persistent_elems * 2.0) : 0);
  }
  return mem;
}

LayoutPrediction predict(const PlanModel& m, const Layout& l, const KernelTimings& t, const LinkModel& link) {
  CUTRAIN_CHECK(link.gbps > 0, "plan: --link_gbps must be > 0, got ", link.gbps);
  CUTRAIN_CHECK(link.latency_us >= 0, "plan: --link_latency_us must be >= 0, got ", link.latency_us);
  const model::TransformerParams table(m.dims);
  const StateBytes& s = m.state;
  const int L = m.dims.layers, A = m.accumulation;
  const double n = double(table.flat_size());
  const double micro_tokens = double(m.micro_batch) * m.seq;
  const double act_bytes = micro_tokens * m.dims.hidden * 2;  // one [M, hidden] bf16 tensor
  LayoutPrediction p;
  p.layout = l;
  p.tokens_per_step = double(l.dp) * A * micro_tokens;
  double state_elems = n, norm_elems = n;

  if (l.kind == LayoutKind::Zero) {
    const double micro = micro_compute(m, t, 0, L + 2, 1);
    p.compute_s = A * micro;
    p.local_params = table.num_params();
    const double G = n * s.grads;
    p.memory = l.dp > 1 ? zero_rank_memory(m, l.zero_stage, l.dp) : single_gpu_memory(m);
    if (l.dp == 1) {
      p.note = "one GPU, no collectives";
    } else if (l.zero_stage == 0) {
      p.comm_s = p.exposed_comm_s = allreduce_seconds(G, l.dp, link);
      p.note = "grads all-reduced after the backward";
    } else if (l.zero_stage < 3) {
      const ZeroPlan z = make_zero_plan(l.zero_stage, table.flat_size(), l.dp, 0, true);
      const double flat = double(z.flat_elems()), part = double(z.state_elems());
      state_elems = norm_elems = part;
      p.comm_s = p.exposed_comm_s = reduce_scatter_seconds(flat * s.grads, l.dp, link) +
                                    all_gather_seconds(flat * 2, l.dp, link) + allreduce_seconds(8, l.dp, link);
      p.note = "grads reduce-scattered, bf16 params all-gathered after the optimizer";
    } else {
      const ShardLayout sl = make_shard_layout(unit_ranges(table), table.flat_size(), l.dp, m.persistence_threshold);
      const double shard = double(sl.shard_elems);
      state_elems = norm_elems = shard;
      // Per micro-batch: each non-persistent unit gathered for its forward, the blocks again for their
      // backward (the head is kept from its forward, the embedding backward reads no params).
      double gather = 0, reduce = 0, first = 0, refresh = 0;
      for (std::size_t u = 0; u < sl.units.size(); ++u) {
        const double bytes = double(sl.units[u].padded_size(l.dp)) * 2;
        reduce += reduce_scatter_seconds(double(sl.units[u].padded_size(l.dp)) * s.grads, l.dp, link);
        if (sl.units[u].persistent) {
          refresh += all_gather_seconds(bytes, l.dp, link);
          continue;
        }
        const bool block = u >= 1 && u <= std::size_t(L);
        gather += (block ? 2 : 1) * all_gather_seconds(bytes, l.dp, link);
        if (u == 0) first = all_gather_seconds(bytes, l.dp, link);
      }
      const double hidden_reduce = m.overlap_comm ? std::max(0.0, reduce - micro_backward(m, t)) : reduce;
      p.comm_s = A * gather + reduce + refresh + allreduce_seconds(8, l.dp, link);
      p.exposed_comm_s = A * (std::max(0.0, gather - micro) + first) + hidden_reduce + refresh +
                         allreduce_seconds(8, l.dp, link);
      p.note = std::string("params gathered per unit (prefetched behind compute), grads reduce-scattered") +
               (m.overlap_comm ? " during the last backward" : " after the backward");
    }
  } else if (l.kind == LayoutKind::Pipeline) {
    const std::vector<PipelineLayer> layers = pipeline_layers(table);
    const PipelinePlan plan = make_pipeline_plan(layers, parse_partition_method("parameters"), l.pp, A);
    p.bubble = plan.bubble_fraction();
    double slowest = 0, most = -1;
    for (int st = 0; st < l.pp; ++st) {
      const PipelineStage& part = plan.parts[std::size_t(st)];
      slowest = std::max(slowest, micro_compute(m, t, part.first, part.end, 1));
      int blocks = 0;
      for (int i = part.first; i < part.end; ++i) blocks += (i >= 1 && i <= L);
      const bool head = part.end == L + 2;
      const int in_flight = std::min(l.pp - st, A);
      const double local = double(tp_local_params(m.dims, part.first, part.end, 1));
      MemoryBreakdown mem;
      add_full_state(mem, s, local);
      mem.activations = activation_bytes(m, blocks, head, in_flight, 1);
      // Send and receive buffers of the activation and its gradient (one each way per neighbour).
      mem.buffers = fixed_buffers(m, 1) + (l.pp > 1 ? 2 * alloc_bytes(act_bytes) : 0);
      if (mem.total() > most) {
        most = mem.total();
        p.memory = mem;
        p.memory_stage = st;
        p.local_params = std::size_t(local);
        state_elems = norm_elems = local;
      }
    }
    const double slots = double(A + l.pp - 1);
    const double p2p = l.pp > 1 ? 2 * send_recv_seconds(act_bytes, link) : 0;
    p.compute_s = slots * slowest;
    const double dp_reduce = allreduce_seconds(state_elems * s.grads, l.dp, link);
    p.comm_s = p.exposed_comm_s = slots * p2p + dp_reduce;
    p.note = "1F1B over " + std::to_string(A) + " micro-batches, bubble " + fmt("%.3f", p.bubble) +
             "; activations sent to the next stage, gradients back" + (l.dp > 1 ? "; stage grads all-reduced" : "");
  } else {
    const int tp = l.tp;
    const double micro = micro_compute(m, t, 0, L + 2, tp);
    p.compute_s = A * micro;
    const double local = double(tp_local_params(m.dims, 0, L + 2, tp));
    p.local_params = std::size_t(local);
    state_elems = norm_elems = local;
    add_full_state(p.memory, s, local);
    p.memory.activations = activation_bytes(m, L, true, 1, tp);
    p.memory.buffers = fixed_buffers(m, tp);
    // Per micro-batch: the blocks' all-reduces, the vocabulary-parallel embedding's output and
    // the head's input gradient, the cross-entropy's row max and sum (fp32 per row).
    const double per_micro = L * tp_allreduces_per_layer(m, tp) * allreduce_seconds(act_bytes, tp, link) +
                             2 * allreduce_seconds(act_bytes, tp, link) +
                             2 * allreduce_seconds(micro_tokens * 4, tp, link);
    const double dp_reduce = allreduce_seconds(local * s.grads, l.dp, link);
    p.comm_s = p.exposed_comm_s = A * per_micro + dp_reduce;
    p.note = std::to_string(tp_allreduces_per_layer(m, tp)) + " all-reduces of " +
             fmt("%.1f", act_bytes / (1 << 20)) + " MiB per block and micro-batch, not overlapped" +
             (l.dp > 1 ? "; grads all-reduced over dp" : "");
  }
  p.optimizer_s = state_elems * t.optimizer_per_elem + norm_elems * t.grad_norm_per_elem;
  p.step_s = p.compute_s + p.exposed_comm_s + p.optimizer_s;
  return p;
}

std::vector<Layout> make_layouts(const std::vector<std::string>& names, int N, int pp, int tp) {
  CUTRAIN_CHECK(N >= 1, "plan: --num_gpus must be >= 1, got ", N);
  std::vector<Layout> out;
  for (const std::string& name : names) {
    Layout l;
    if (name.size() == 5 && name.compare(0, 4, "zero") == 0 && name[4] >= '0' && name[4] <= '3') {
      l.kind = LayoutKind::Zero;
      l.zero_stage = name[4] - '0';
      l.dp = N;
    } else if (name == "pp") {
      CUTRAIN_CHECK(pp >= 1 && N % pp == 0, "plan: --pipeline_parallel_size ", pp, " does not divide --num_gpus ", N);
      l.kind = LayoutKind::Pipeline;
      l.pp = pp;
      l.dp = N / pp;
    } else if (name == "tp") {
      CUTRAIN_CHECK(tp >= 1 && N % tp == 0, "plan: --tensor_parallel_size ", tp, " does not divide --num_gpus ", N);
      l.kind = LayoutKind::Tensor;
      l.tp = tp;
      l.dp = N / tp;
    } else {
      CUTRAIN_FAIL("plan: --layouts: unknown layout '", name, "'; expected zero0, zero1, zero2, zero3, pp or tp");
    }
    out.push_back(l);
  }
  CUTRAIN_CHECK(!out.empty(), "plan: --layouts: no layout given");
  return out;
}

std::string format_plan_table(const std::vector<LayoutPrediction>& rows, double gpu_memory_gb) {
  std::ostringstream os;
  const double GB = 1024.0 * 1024 * 1024;
  char line[512];
  std::snprintf(line, sizeof line, "| %-10s | %-12s | %7s | %7s | %7s | %7s | %7s | %8s | %4s | %9s | %9s | %8s | %10s |\n",
                "layout", "dp x pp x tp", "params", "grads", "optim", "activ", "buffers", "total GB", "fits",
                "compute s", "comm s", "step s", "tokens/s");
  os << line;
  os << "|------------|--------------|--------:|--------:|--------:|--------:|--------:|---------:|------|----------:|"
        "----------:|---------:|-----------:|\n";
  for (const LayoutPrediction& r : rows) {
    const MemoryBreakdown& m = r.memory;
    const std::string grid = std::to_string(r.layout.dp) + " x " + std::to_string(r.layout.pp) + " x " +
                             std::to_string(r.layout.tp);
    const std::string comm = fmt("%.4f", r.exposed_comm_s) + (r.comm_s > r.exposed_comm_s * 1.0001 + 1e-9 ? "*" : "");
    std::snprintf(line, sizeof line,
                  "| %-10s | %-12s | %7.2f | %7.2f | %7.2f | %7.2f | %7.2f | %8.2f | %-4s | %9.4f | %9s | %8.4f | %10.0f |\n",
                  r.layout.name().c_str(), grid.c_str(), m.params / GB, m.grads / GB, m.optimizer / GB,
                  m.activations / GB, m.buffers / GB, m.total() / GB,
                  gpu_memory_gb > 0 ? (m.total() / GB <= gpu_memory_gb ? "yes" : "no") : "-", r.compute_s, comm.c_str(),
                  r.step_s, r.step_s > 0 ? r.tokens_per_step / r.step_s : 0.0);
    os << line;
  }
  return os.str();
}

}  // namespace cutrain::parallel
