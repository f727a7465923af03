// The layout planner's formulas (parallel/planner.h): the ring collectives' cost, ZeRO's per-rank
// state (1/N of what is partitioned), the 1F1B bubble and the pipeline step, Megatron's per-block
// all-reduce volume and parameter split (against the model's own parameter table), the memory of
// the single-GPU engine, the timing report reader and the bad input, each naming its flag.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "model/transformer_params.h"
#include "parallel/planner.h"
#include "parallel/zero_shard_layout.h"
#include "runtime/error.h"
#include "runtime/timing_report.h"

using namespace cutrain;
using namespace cutrain::parallel;

namespace {

PlanModel small_plan(int layers = 4, int accumulation = 1, bool ckpt = false) {
  PlanModel m;
  m.dims = model::ModelDims{256, layers, 4, 1000, 128};
  m.micro_batch = 2;
  m.seq = 128;
  m.accumulation = accumulation;
  m.checkpointing = ckpt;
  m.state = StateBytes{"bf16_full", 2, 2, 0, 4, 0};
  return m;
}

KernelTimings unit_timings() {
  KernelTimings t;
  t.source = "test";
  t.embed_fwd = 1e-4, t.embed_bwd = 2e-4;
  t.layer_fwd = 1e-3, t.layer_bwd = 2e-3, t.layer_recompute = 1e-3;
  t.layer_replicated_fraction = 0.1;
  t.head_fwd = 5e-4, t.head_bwd = 1e-3;
  t.optimizer_per_elem = 1e-11, t.grad_norm_per_elem = 1e-12;
  return t;
}

Layout zero(int stage, int dp) {
  Layout l;
  l.kind = LayoutKind::Zero;
  l.zero_stage = stage;
  l.dp = dp;
  return l;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Planner, RingCollectivesCostAlphaPlusBytesOverBandwidth) {
  const LinkModel link{100, 5};  // 100 GB/s, 5 us
  const double B = 1e9;
  EXPECT_NEAR(allreduce_seconds(B, 4, link), 2 * 3 * 5e-6 + 2.0 * 3 / 4 * B / 100e9, 1e-12);
  EXPECT_NEAR(reduce_scatter_seconds(B, 8, link), 7 * 5e-6 + 7.0 / 8 * B / 100e9, 1e-12);
  EXPECT_NEAR(all_gather_seconds(B, 2, link), 5e-6 + 0.5 * B / 100e9, 1e-12);
  EXPECT_NEAR(send_recv_seconds(B, link), 5e-6 + B / 100e9, 1e-12);
  EXPECT_EQ(allreduce_seconds(B, 1, link), 0.0);
  // An all-reduce is a reduce-scatter plus an all-gather.
  EXPECT_NEAR(allreduce_seconds(B, 8, link), reduce_scatter_seconds(B, 8, link) + all_gather_seconds(B, 8, link), 1e-12);
}

TEST(Planner, ZeroStatesArePartitionedOneNth) {
  const PlanModel m = small_plan();
  const model::TransformerParams table(m.dims);
  const double n = double(table.flat_size());
  const KernelTimings t = unit_timings();
  const LinkModel link;
  for (int N : {2, 4, 8}) {
    const LayoutPrediction z0 = predict(m, zero(0, N), t, link);
    const LayoutPrediction z1 = predict(m, zero(1, N), t, link);
    const LayoutPrediction z2 = predict(m, zero(2, N), t, link);
    const LayoutPrediction z3 = predict(m, zero(3, N), t, link);
    // Stage 0 keeps everything: n x bytes (each buffer rounded to 512 B).
    EXPECT_NEAR(z0.memory.params, n * 2, 512);
    EXPECT_NEAR(z0.memory.optimizer, n * 4, 2 * 512);
    // Stages 1 and 2: the optimizer state is 1/N (padding to N x a multiple of 8 elements).
    for (const LayoutPrediction* z : {&z1, &z2}) {
      EXPECT_NEAR(z->memory.optimizer, n * 4 / N, 2 * 512 + 8 * 4 * N) << "N " << N;
      EXPECT_NEAR(z->memory.params, n * 2, 512 + 16 * N);
    }
    // Stage 3: params and optimizer state 1/N (per-unit padding), the full gradient buffer plus a 1/N shard.
    const double pad = double(table.units().size()) * 8 * N;
    EXPECT_NEAR(z3.memory.params, n * 2 / N, 512 + pad * 2);
    EXPECT_NEAR(z3.memory.optimizer, n * 4 / N, 2 * 512 + pad * 4);
    EXPECT_NEAR(z3.memory.grads, n * 2 + n * 2 / N, 2 * 512 + pad * 4);
    EXPECT_LT(z3.memory.params + z3.memory.optimizer, z1.memory.params + z1.memory.optimizer);
    // Stage 3's two gather buffers hold the largest unit (here the embedding: vocab x hidden + positions).
    const ShardLayout sl = make_shard_layout([&] {
      std::vector<Range> u;
      for (const auto& p : table.units()) u.push_back({p.begin, p.end});
      return u;
    }(), table.flat_size(), N, m.persistence_threshold);
    EXPECT_GE(z3.memory.buffers - z0.memory.buffers, 2.0 * sl.gather_elems * 2);
    // Comm: stage 0 all-reduces the gradients once.
    EXPECT_NEAR(z0.comm_s, allreduce_seconds(n * 2, N, link), 1e-12);
    EXPECT_NEAR(z0.tokens_per_step, double(N) * m.micro_batch * m.seq, 1e-9);
  }
}

TEST(Planner, OneGpuIsTheSingleProcessEngine) {
  const PlanModel m = small_plan();
  const LayoutPrediction p = predict(m, zero(3, 1), unit_timings(), LinkModel{});
  EXPECT_EQ(p.comm_s, 0.0);
  const MemoryBreakdown s = single_gpu_memory(m);
  EXPECT_DOUBLE_EQ(p.memory.total(), s.total());
  const model::TransformerParams table(m.dims);
  EXPECT_NEAR(s.params + s.grads + s.optimizer, double(table.flat_size()) * 8, 4 * 512);
}

TEST(Planner, StageThreeOnOneRankKeepsTheFullGradientsBesideTheShard) {
  const PlanModel m = small_plan();
  const MemoryBreakdown one = single_gpu_memory(m), z3 = zero_rank_memory(m, 3, 1), z1 = zero_rank_memory(m, 1, 1);
  EXPECT_DOUBLE_EQ(z3.params, one.params);
  EXPECT_DOUBLE_EQ(z3.optimizer, one.optimizer);
  EXPECT_DOUBLE_EQ(z3.grads, 2 * one.grads);
  // Two gather buffers of the largest unit (a block: 12 h^2 + 13 h bf16) and the norm's partial.
  const double h = m.dims.hidden;
  EXPECT_NEAR(z3.buffers - one.buffers, 2 * (12 * h * h + 13 * h) * 2, 3 * 512);
  EXPECT_NEAR(z1.total(), one.total(), 3 * 512);
}

// cutrain.attention_backward fast: the backward's fp32 dQ accumulator (4 bytes per Q element,
// B * S * H * D = M * h) joins the shared scratch, which grows to hold it where it is the largest need.
TEST(Planner, FastAttentionBackwardSizesTheScratchForItsDqAccumulator) {
  PlanModel det = small_plan();
  det.seq = 1024;
  det.dims.max_seq = 1024;
  PlanModel fast = det;
  fast.deterministic_attention = false;
  const double M = double(det.micro_batch) * det.seq, h = det.dims.hidden;
  const double grown = single_gpu_memory(fast).buffers - single_gpu_memory(det).buffers;
  EXPECT_GT(grown, 0.0);
  EXPECT_LE(grown, M * h * 4 + 512);
}

TEST(Planner, ActivationCheckpointingKeepsOneBlockSetAndTheBlockInputs) {
  PlanModel a = small_plan(6), c = small_plan(6, 1, true);
  const double M = double(a.micro_batch) * a.seq, h = a.dims.hidden, F = 4 * h;
  // One block's stored set: qkv (3h), att, s1, x1, s2 (h each), f and g (4h each) in bf16; lse and 4 row stats in fp32.
  const double set = M * (3 * h + 4 * h + 2 * F) * 2 + double(a.micro_batch) * a.dims.heads * a.seq * 4 + 4 * M * 4;
  EXPECT_NEAR(single_gpu_memory(a).activations - single_gpu_memory(c).activations, 5 * set, 64 * 512);
}

TEST(Planner, PipelineBubbleAndStep) {
  const KernelTimings t = unit_timings();
  for (int p : {2, 4}) {
    for (int micro : {1, 4, 8}) {
      const PlanModel m = small_plan(8, micro);
      Layout l;
      l.kind = LayoutKind::Pipeline;
      l.pp = p;
      const LinkModel link;
      const LayoutPrediction r = predict(m, l, t, link);
      EXPECT_DOUBLE_EQ(r.bubble, double(p - 1) / double(micro + p - 1)) << p << " stages, " << micro;
      // (M + S - 1) slots of the slowest stage, each with an activation sent and a gradient received.
      EXPECT_GT(r.compute_s, 0);
      const double act = double(m.micro_batch) * m.seq * m.dims.hidden * 2;
      EXPECT_NEAR(r.comm_s, (micro + p - 1) * 2 * send_recv_seconds(act, link), 1e-12);
      // The slowest stage holds at least 1/p of the blocks' time.
      EXPECT_GE(r.compute_s / (micro + p - 1), 8.0 / p * (t.layer_fwd + t.layer_bwd) - 1e-12);
    }
  }
}

TEST(Planner, PipelineStageZeroHoldsTheMostMicroBatchesInFlight) {
  PlanModel m = small_plan(8, 8);
  m.dims.vocab = 64;  // a tiny head: stage 0's in-flight activations decide
  Layout l;
  l.kind = LayoutKind::Pipeline;
  l.pp = 4;
  const LayoutPrediction r = predict(m, l, unit_timings(), LinkModel{});
  EXPECT_EQ(r.memory_stage, 0);
  const LayoutPrediction one = predict(m, zero(0, 1), unit_timings(), LinkModel{});
  // Stage 0: 2 of 8 blocks, 4 micro-batches in flight: about as much as the whole model's one.
  EXPECT_GT(r.memory.activations, 0.8 * one.memory.activations);
}

TEST(Planner, MegatronAllReduceVolumePerBlock) {
  PlanModel m = small_plan();
  const double act = double(m.micro_batch) * m.seq * m.dims.hidden * 2;
  EXPECT_EQ(tp_allreduce_bytes_per_layer(m, 1), 0.0);
  EXPECT_DOUBLE_EQ(tp_allreduce_bytes_per_layer(m, 2), 4 * act);
  m.checkpointing = true;
  EXPECT_DOUBLE_EQ(tp_allreduce_bytes_per_layer(m, 4), 6 * act);
}

TEST(Planner, MegatronParameterSplitMatchesTheModelAtDegreeOne) {
  for (int layers : {1, 3, 12}) {
    const model::ModelDims d{512, layers, 8, 777, 64};
    const model::TransformerParams table(d);
    EXPECT_EQ(tp_local_params(d, 0, layers + 2, 1), table.num_params());
  }
  const model::ModelDims d{1024, 4, 16, 50000, 512};
  const double full = double(tp_local_params(d, 0, 6, 1)), half = double(tp_local_params(d, 0, 6, 2));
  EXPECT_GT(half, full / 2);         // LayerNorms, row-parallel biases and positions stay whole
  EXPECT_LT(half, full / 2 * 1.01);  // ... and they are small
}

TEST(Planner, TensorParallelStepAddsItsAllReduces) {
  const PlanModel m = small_plan();
  const KernelTimings t = unit_timings();
  const LinkModel link{200, 3};
  Layout l;
  l.kind = LayoutKind::Tensor;
  l.tp = 4;
  const LayoutPrediction r = predict(m, l, t, link);
  const double act = double(m.micro_batch) * m.seq * m.dims.hidden * 2;
  const double per_micro = m.dims.layers * 4 * allreduce_seconds(act, 4, link) + 2 * allreduce_seconds(act, 4, link) +
                           2 * allreduce_seconds(double(m.micro_batch) * m.seq * 4, 4, link);
  EXPECT_NEAR(r.comm_s, per_micro, 1e-12);
  EXPECT_NEAR(r.exposed_comm_s, r.comm_s, 1e-15);
  const double split = t.layer_replicated_fraction + (1 - t.layer_replicated_fraction) / 4;
  EXPECT_NEAR(r.compute_s,
              t.embed_fwd + t.embed_bwd + m.dims.layers * split * (t.layer_fwd + t.layer_bwd) + (t.head_fwd + t.head_bwd) / 4,
              1e-12);
}

TEST(Planner, RooflineIsAtLeastTheGemmFlopsOverThePeak) {
  const model::ModelDims d{1024, 2, 16, 50000, 512};
  DevicePeakRates peaks;
  peaks.device = "test";
  const KernelTimings t = roofline_timings(d, 4, 512, false, 2, 2, false, false, peaks);
  const double M = 4 * 512.0, h = 1024;
  const double gemm_flops = 2 * M * (3 * h * h + h * h + 8 * h * h);
  EXPECT_GE(t.layer_fwd, gemm_flops / (peaks.tflops * 1e12));
  EXPECT_GE(t.layer_bwd, 2 * gemm_flops / (peaks.tflops * 1e12));
  EXPECT_GT(t.layer_replicated_fraction, 0);
  EXPECT_LT(t.layer_replicated_fraction, 0.2);
  // Adam over bf16 params, grads and moments: 2*2 + 2 + 2*2*2 bytes per element.
  EXPECT_NEAR(t.optimizer_per_elem, 14.0 / (peaks.gbps * 1e9), 1e-18);
}

TEST(Planner, TimingReportGivesPerBlockAndPerMicroBatchTimes) {
  // 2 steps of 3 micro-batches of a 4-block model: calls = steps x micro x blocks.
  nlohmann::json j;
  j["steps"] = 2;
  j["device"] = "NVIDIA H200";
  j["model_flops_per_step"] = 1.0;
  j["regions"] = nlohmann::json::array();
  auto add = [&](const std::string& name, double calls, double ms, double gbps = 0) {
    nlohmann::json r = {{"name", name}, {"calls", calls}, {"total_ms", ms}};
    if (gbps > 0) r["gbps"] = gbps;
    j["regions"].push_back(r);
  };
  add("step/fwd/embedding", 6, 0.6);
  for (int l = 0; l < 4; ++l) {
    const std::string n = "layer0" + std::to_string(l);
    add("step/fwd/" + n, 6, 6.0);
    add("step/fwd/" + n + "/attn/ln1", 6, 0.3);
    add("step/fwd/" + n + "/mlp/ln2", 6, 0.3);
    add("step/bwd/" + n, 6, 18.0);
    add("step/bwd/" + n + "/recompute", 6, 6.0);
  }
  add("step/fwd/head", 6, 3.0);
  add("step/bwd/head", 6, 6.0);
  add("step/bwd/embedding", 6, 1.2);
  add("step/optimizer", 2, 1.0, 1000);
  add("step/grad_norm", 2, 0.1, 2000);
  const TimedRun r = timings_from_report(j, "t.json", 2, 2, false, false);
  EXPECT_EQ(r.layers, 4);
  EXPECT_EQ(r.accumulation, 3);
  EXPECT_NEAR(r.timings.embed_fwd, 0.1e-3, 1e-12);
  EXPECT_NEAR(r.timings.layer_fwd, 1e-3, 1e-12);
  EXPECT_NEAR(r.timings.layer_recompute, 1e-3, 1e-12);
  EXPECT_NEAR(r.timings.layer_bwd, 2e-3, 1e-12);
  EXPECT_NEAR(r.timings.layer_replicated_fraction, 0.1e-3 / 3e-3, 1e-9);
  EXPECT_NEAR(r.timings.head_fwd, 0.5e-3, 1e-12);
  EXPECT_NEAR(r.timings.optimizer_per_elem, 14.0 / 1e12, 1e-18);
  EXPECT_NEAR(r.timings.grad_norm_per_elem, 2.0 / 2e12, 1e-18);
  j["regions"].erase(0);  // no embedding forward
  EXPECT_NE(error_of([&] { timings_from_report(j, "t.json", 2, 2, false, false); }).find("t.json: the timing report has no "
                                                                                          "region step/fwd/embedding"),
            std::string::npos);
}

TEST(Planner, ReadsTheRuntimesOwnTimingReportJson) {
  // The report as runtime/timing_report.h writes it (per-layer rows, bytes making GB/s): 3 steps,
  // 2 micro-batches, 2 blocks.
  std::vector<RegionTotals> regions;
  auto add = [&](const std::string& name, std::int64_t calls, double ms, double bytes = 0) {
    RegionTotals r;
    r.name = name;
    r.calls = calls;
    r.total_ms = ms;
    r.bytes = bytes;
    regions.push_back(r);
  };
  add("step", 3, 60);
  add("step/fwd/embedding", 6, 0.6);
  for (int l = 0; l < 2; ++l) {
    add("step/fwd/layer0" + std::to_string(l), 6, 3.0);
    add("step/bwd/layer0" + std::to_string(l), 6, 6.0);
  }
  add("step/fwd/head", 6, 1.2);
  add("step/bwd/head", 6, 2.4);
  add("step/bwd/embedding", 6, 1.8);
  add("step/grad_norm", 3, 3.0, 6e9);    // 2000 GB/s
  add("step/optimizer", 3, 30.0, 3e10);  // 1000 GB/s
  const TimingReport rep = make_timing_report(regions, {20, 20, 20}, DevicePeaks{"NVIDIA H200", 3000, 700, 989.4}, "step",
                                              1e12, "test");
  const TimedRun r = timings_from_report(timing_report_json(rep), "report.json", 2, 2, true, false);
  EXPECT_EQ(r.steps, 3);
  EXPECT_EQ(r.accumulation, 2);
  EXPECT_EQ(r.layers, 2);
  EXPECT_EQ(r.device, "NVIDIA H200");
  EXPECT_NEAR(r.timings.layer_fwd, 0.5e-3, 1e-12);
  EXPECT_NEAR(r.timings.layer_bwd, 1e-3, 1e-12);
  EXPECT_NEAR(r.timings.embed_bwd, 0.3e-3, 1e-12);
  EXPECT_NEAR(r.timings.head_fwd, 0.2e-3, 1e-12);
  // AdamW with an fp32 master: 2*2 + 2 + 2*2*2 + 8 bytes per element at 1000 GB/s.
  EXPECT_NEAR(r.timings.optimizer_per_elem, 22.0 / 1e12, 1e-18);
  EXPECT_NEAR(r.timings.grad_norm_per_elem, 2.0 / 2e12, 1e-18);
}

TEST(Planner, BadInputNamesTheFlag) {
  const PlanModel m = small_plan(6);
  Layout pp;
  pp.kind = LayoutKind::Pipeline;
  pp.pp = 4;
  EXPECT_NE(error_of([&] { check_layout(m, pp, 4); }).find("--pipeline_parallel_size 4 does not divide --num_layers 6"),
            std::string::npos);
  Layout tp;
  tp.kind = LayoutKind::Tensor;
  tp.tp = 3;
  EXPECT_NE(error_of([&] { check_layout(m, tp, 3); }).find("--tensor_parallel_size 3 does not divide --num_heads 4"),
            std::string::npos);
  EXPECT_NE(error_of([&] { make_layouts({"zero4"}, 4, 4, 4); }).find("--layouts: unknown layout 'zero4'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { make_layouts({"pp"}, 4, 3, 4); }).find("--pipeline_parallel_size 3 does not divide --num_gpus 4"),
            std::string::npos);
  EXPECT_NE(error_of([&] { make_layouts({"tp"}, 6, 6, 4); }).find("--tensor_parallel_size 4 does not divide --num_gpus 6"),
            std::string::npos);
  EXPECT_NE(error_of([&] { predict(m, zero(0, 2), unit_timings(), LinkModel{0, 1}); }).find("--link_gbps must be > 0"),
            std::string::npos);
  const std::vector<Layout> all = make_layouts({"zero0", "zero1", "zero2", "zero3", "pp", "tp"}, 4, 2, 4);
  ASSERT_EQ(all.size(), 6u);
  EXPECT_EQ(all[4].name(), "pp2 x dp2");
  EXPECT_EQ(all[5].name(), "tp4");
}
