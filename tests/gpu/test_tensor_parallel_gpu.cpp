// @brief The GPU model's tensor parallelism above one rank (model/transformer_gpu.h's
// set_tensor_parallel) on one GPU: T = 2 and 4 ranks in one process, each a host thread with its
// own GpuTransformer, stream and parameters (the flat layout with the other ranks' slices zero,
// parallel/tensor_parallel_plan.h's make_tp_layout), over a loopback TpDeviceGroup (test-only: each
// all-reduce syncs the rank's stream, meets the other threads at a host barrier and sums the
// ranks' device buffers in rank order on the host, rounding once; the engine's group is NCCL).
// Against the whole model (no group) on the same parameters: the loss (every rank the same bits),
// the gathered gradients (each rank's slices, the replicated tensors from rank 0) within bf16
// tolerances (the partial sums round differently), the replicated gradients bit-equal over the
// ranks, the other ranks' slices left zero, the evaluation loss; seed model and GPT-2 (tied head,
// a padded vocabulary), fp32 and bf16 gradients, accumulation, activation checkpointing, SGD
// steps, Domino's 2 pieces (their all-reduces on the model's second stream, joined by events).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "model/transformer_gpu.h"
#include "parallel/tensor_parallel_plan.h"
#include "runtime/allocator.h"
#include "runtime/check.h"
#include "runtime/device.h"
#include "tests/support/test_support.h"

namespace cutrain {
namespace {

// The meeting point of T loopback ranks: a generation barrier with a timeout (a rank that died
// leaves the others waiting: they fail, naming the barrier, instead of hanging the test).
class LoopbackHub {
 public:
  explicit LoopbackHub(int size) : size_(size), slots_(std::size_t(size)) {}
  int size() const { return size_; }
  void barrier(int rank) {
    std::unique_lock<std::mutex> lock(mu_);
    const long gen = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    const bool ok = cv_.wait_for(lock, std::chrono::seconds(60), [&] { return generation_ != gen; });
    CUTRAIN_CHECK(ok, "loopback tensor-parallel group: rank ", rank, " waited 60 s for the other ranks at a barrier");
  }
  std::vector<float>& slot(int rank) { return slots_[std::size_t(rank)]; }

 private:
  int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  long generation_ = 0;
  std::vector<std::vector<float>> slots_;
};

class LoopbackTpGroup final : public model::TpDeviceGroup {
 public:
  LoopbackTpGroup(LoopbackHub& hub, int rank) : hub_(hub), rank_(rank) {}
  int size() const override { return hub_.size(); }
  int rank() const override { return rank_; }
  void all_reduce_sum(cudaStream_t s, bf16* buf, std::size_t count) override {
    std::vector<bf16> mine(count);
    CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(mine.data(), buf, count * sizeof(bf16), cudaMemcpyDeviceToHost, s));
    CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(s));
    std::vector<float> out = reduce(test::to_float(mine), false);
    const std::vector<bf16> back = test::to_bf16(out);
    CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(buf, back.data(), count * sizeof(bf16), cudaMemcpyHostToDevice, s));
    CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(s));
    ++calls;
  }
  void all_reduce_f32(cudaStream_t s, float* buf, std::size_t count, bool max) override {
    std::vector<float> mine(count);
    CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(mine.data(), buf, count * sizeof(float), cudaMemcpyDeviceToHost, s));
    CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(s));
    const std::vector<float> out = reduce(std::move(mine), max);
    CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(buf, out.data(), count * sizeof(float), cudaMemcpyHostToDevice, s));
    CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(s));
    ++calls;
  }
  int calls = 0;

 private:
  // Every rank reduces the same slots in rank order (fp32), so every rank gets the same bits.
  std::vector<float> reduce(std::vector<float> mine, bool max) {
    hub_.slot(rank_) = std::move(mine);
    hub_.barrier(rank_);
    const std::size_t n = hub_.slot(0).size();
    std::vector<float> out(hub_.slot(0));
    for (int r = 1; r < hub_.size(); ++r) {
      const std::vector<float>& o = hub_.slot(r);
      CUTRAIN_CHECK(o.size() == n, "loopback tensor-parallel group: rank ", r, " reduced ", o.size(),
                    " elements, rank 0 ", n);
      for (std::size_t i = 0; i < n; ++i) out[i] = max ? std::max(out[i], o[i]) : out[i] + o[i];
    }
    hub_.barrier(rank_);  // nobody refills a slot before every rank has read them all
    return out;
  }
  LoopbackHub& hub_;
  int rank_;
};

constexpr int kB = 2, kS = 32;

struct Case {
  model::Arch arch;
  int tp;
  DType grad_type;
  bool checkpointing;
  int micro_batches;  // > 1: accumulated into the same gradients
  int steps = 1;       // > 1: plain SGD steps on the host between them (the params move)
  int pieces = 1;      // Domino's pieces per micro-batch (their all-reduces on the model's second stream)
};
std::string case_name(const ::testing::TestParamInfo<Case>& i) {
  const Case& c = i.param;
  return std::string(c.arch == model::Arch::Gpt2 ? "Gpt2" : "Seed") + "Tp" + std::to_string(c.tp) +
         (c.grad_type == DType::F32 ? "F32" : "Bf16") + (c.checkpointing ? "Ckpt" : "") + "Micro" +
         std::to_string(c.micro_batches) + "Steps" + std::to_string(c.steps) +
         (c.pieces > 1 ? "Domino" + std::to_string(c.pieces) : "");
}

model::ModelDims dims_of(const Case& c) {
  model::ModelDims d{256, 2, 4, 1000, 64};  // head_dim 64, FFN 1024
  d.arch = c.arch;
  if (c.arch == model::Arch::Gpt2) {
    d.vocab = 250;  // padded to 256: the last slice holds padded rows
    d.padded_vocab = 256;
  }
  return d;
}

struct ModelRun {
  std::vector<float> losses;  // per step and micro-batch, then the evaluation loss
  std::vector<float> grads;   // the flat buffer of the last step
  std::vector<float> params;  // the flat params the last step ran with
  int calls = 0;
};
constexpr float kLr = 0.05f;

std::vector<float> download_grads(const void* g, DType t, std::size_t n) {
  if (t == DType::F32) {
    std::vector<float> h(n);
    CUTRAIN_CUDA_CHECK(cudaMemcpy(h.data(), g, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
  }
  std::vector<bf16> h(n);
  CUTRAIN_CUDA_CHECK(cudaMemcpy(h.data(), g, n * sizeof(bf16), cudaMemcpyDeviceToHost));
  return test::to_float(h);
}

// One model (whole: group null) from `params`: per step `micro` forward_backwards accumulated
// (with SGD, p -= kLr g rounded to bf16 on the host, between steps), then a forward_loss of the
// first batch.
ModelRun run_model(const model::TransformerParams& table, const Case& c, std::vector<float> params,
                   const std::vector<std::vector<std::int32_t>>& tokens,
                   const std::vector<std::vector<std::int32_t>>& labels, model::TpDeviceGroup* group,
                   const model::TpSlice& slice) {
  CUTRAIN_CUDA_CHECK(cudaSetDevice(0));
  Stream stream;
  model::GpuTransformer m(table, kB, kS, c.checkpointing, true, device_allocator());
  if (group) m.set_tensor_parallel(group, slice);
  test::DeviceArray<bf16> dp(test::to_bf16(params));
  const std::size_t n = table.flat_size();
  test::DeviceArray<float> g32(c.grad_type == DType::F32 ? n : 0);
  test::DeviceArray<bf16> g16(c.grad_type == DType::F32 ? 0 : n);
  void* g = c.grad_type == DType::F32 ? static_cast<void*>(g32.get()) : static_cast<void*>(g16.get());
  CUTRAIN_CUDA_CHECK(cudaMemsetAsync(g, 0, n * dtype_size(c.grad_type), stream));  // on the model's stream
  const std::size_t passes = std::size_t(c.steps) * std::size_t(c.micro_batches) + 1;
  test::DeviceArray<float> loss(passes);
  test::DeviceArray<std::int32_t> status(std::vector<std::int32_t>(2 * passes, 0));
  std::vector<test::DeviceArray<std::int32_t>> dt, dl;
  for (int k = 0; k < c.micro_batches; ++k) {
    dt.emplace_back(tokens[std::size_t(k)]);
    dl.emplace_back(labels[std::size_t(k)]);
  }
  model::FlatParams flat(table, dp.get());
  ModelRun r;
  for (int step = 0; step < c.steps; ++step) {
    if (step > 0) {
      CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream));
      const std::vector<float> grads = download_grads(g, c.grad_type, n);
      for (std::size_t i = 0; i < n; ++i) params[i] -= kLr * grads[i];
      params = test::round_bf16(params);
      dp.upload(test::to_bf16(params));
    }
    for (int k = 0; k < c.micro_batches; ++k) {
      const std::size_t at = std::size_t(step) * std::size_t(c.micro_batches) + std::size_t(k);
      m.forward_backward(stream, flat, g, c.grad_type, k > 0, dt[std::size_t(k)].get(), dl[std::size_t(k)].get(),
                         1.f / float(c.micro_batches), loss.get() + at, status.get() + 2 * at);
    }
  }
  m.forward_loss(stream, flat, dt[0].get(), dl[0].get(), loss.get() + passes - 1, status.get() + 2 * (passes - 1));
  CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (std::int32_t st : status.download()) EXPECT_EQ(st, 0) << "token / label status";
  r.losses = loss.download();
  r.grads = download_grads(g, c.grad_type, n);
  r.params = std::move(params);
  return r;
}

class TensorParallelGpu : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallelGpu, RanksMatchTheWholeModel) {
  CUTRAIN_REQUIRE_GPU();
  const Case c = GetParam();
  auto rng = test::fresh_rng();
  const model::TransformerParams table(dims_of(c));
  const model::ModelDims& d = table.dims();
  std::vector<float> params(table.flat_size());
  table.init(params.data(), rng());
  params = test::round_bf16(params);
  std::vector<std::vector<std::int32_t>> tokens, labels;
  for (int k = 0; k < c.micro_batches; ++k) {
    tokens.push_back(test::random_ints(std::size_t(kB) * kS, rng, 0, d.vocab - 1));
    labels.push_back(test::random_ints(std::size_t(kB) * kS, rng, 0, d.vocab - 1));
    labels.back()[3] = -100;  // an ignored row
  }
  const ModelRun whole = run_model(table, c, params, tokens, labels, nullptr, {});

  LoopbackHub hub(c.tp);
  std::vector<model::TpSlice> slices;
  std::vector<parallel::TpLayout> layouts;
  for (int r = 0; r < c.tp; ++r) {
    slices.push_back(parallel::make_tp_slice(d, c.tp, r, "--tensor_parallel_size"));
    slices.back().pieces = c.pieces;
    layouts.push_back(parallel::make_tp_layout(table, slices.back()));
  }
  std::vector<ModelRun> ranks(std::size_t(c.tp));
  std::vector<std::exception_ptr> errors(std::size_t(c.tp));
  std::vector<std::thread> threads;
  for (int r = 0; r < c.tp; ++r)
    threads.emplace_back([&, r] {
      try {
        std::vector<float> mine = params;  // the flat layout: the other ranks' slices zero
        for (std::size_t i = 0; i < mine.size(); ++i)
          if (!layouts[std::size_t(r)].held[i]) mine[i] = 0.f;
        LoopbackTpGroup group(hub, r);
        ranks[std::size_t(r)] = run_model(table, c, mine, tokens, labels, &group, slices[std::size_t(r)]);
        ranks[std::size_t(r)].calls = group.calls;
      } catch (...) {
        errors[std::size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);

  // The all-reduces issued: per micro-batch the blocks' 2 + 2 per layer and piece, the embedding's,
  // the loss's 2 and the head's (checkpointing: the blocks' forward ones again); the evaluation's
  // forward.
  const int L = d.layers, B2 = 2 * L * c.pieces;
  const int per_micro = B2 + 3 + B2 + 1 + (c.checkpointing ? B2 : 0);
  for (const ModelRun& r : ranks) EXPECT_EQ(r.calls, c.steps * c.micro_batches * per_micro + B2 + 3);

  for (std::size_t k = 0; k < whole.losses.size(); ++k) {
    for (int r = 0; r < c.tp; ++r)
      EXPECT_EQ(ranks[std::size_t(r)].losses[k], ranks[0].losses[k]) << "rank " << r << ": the loss bits differ";
    EXPECT_NEAR(ranks[0].losses[k], whole.losses[k], 1e-2 * std::fabs(whole.losses[k])) << "loss " << k;
  }
  // Gathered gradients: each element from the rank that holds its slice, replicated ones from rank 0.
  std::vector<float> gathered(table.flat_size(), 0.f);
  for (int r = c.tp - 1; r >= 0; --r)
    for (std::size_t i = 0; i < gathered.size(); ++i)
      if (layouts[std::size_t(r)].counted[i]) gathered[i] = ranks[std::size_t(r)].grads[i];
  EXPECT_EQ(test::count_nan(gathered), 0u);
  for (const auto& t : table.tensors()) {
    std::vector<float> got(gathered.begin() + t.offset, gathered.begin() + t.offset + t.count);
    std::vector<float> want(whole.grads.begin() + t.offset, whole.grads.begin() + t.offset + t.count);
    EXPECT_LE(test::rel_error(got, want), 3e-2) << t.name;
  }
  // After SGD steps: the gathered params the whole model's (within bf16 round-off), the other
  // ranks' slices still zero on every rank.
  std::vector<float> gathered_params(table.flat_size(), 0.f);
  for (int r = c.tp - 1; r >= 0; --r)
    for (std::size_t i = 0; i < gathered_params.size(); ++i)
      if (layouts[std::size_t(r)].counted[i]) gathered_params[i] = ranks[std::size_t(r)].params[i];
  for (const auto& t : table.tensors()) {
    std::vector<float> got(gathered_params.begin() + t.offset, gathered_params.begin() + t.offset + t.count);
    std::vector<float> want(whole.params.begin() + t.offset, whole.params.begin() + t.offset + t.count);
    EXPECT_LE(test::rel_error(got, want), 3e-2) << "params " << t.name;
  }
  for (int r = 0; r < c.tp; ++r) {
    const parallel::TpLayout& lay = layouts[std::size_t(r)];
    for (std::size_t i = 0; i < lay.held.size(); ++i)
      if (!lay.held[i]) ASSERT_EQ(ranks[std::size_t(r)].params[i], 0.f) << "rank " << r << ": param element " << i;
  }
  for (int r = 0; r < c.tp; ++r) {
    const parallel::TpLayout& lay = layouts[std::size_t(r)];
    const std::vector<float>& g = ranks[std::size_t(r)].grads;
    for (const auto& range : lay.replicated)
      for (std::size_t i = range.begin; i < range.end; ++i)
        ASSERT_EQ(g[i], ranks[0].grads[i]) << "rank " << r << ": replicated gradient element " << i
                                           << " differs from rank 0's";
    for (std::size_t i = 0; i < g.size(); ++i)
      if (!lay.held[i]) ASSERT_EQ(g[i], 0.f) << "rank " << r << ": another rank's gradient element " << i << " written";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, TensorParallelGpu,
    ::testing::Values(Case{model::Arch::Simple, 2, DType::F32, false, 1}, Case{model::Arch::Simple, 4, DType::F32, false, 1},
                      Case{model::Arch::Simple, 2, DType::BF16, true, 2}, Case{model::Arch::Gpt2, 2, DType::F32, false, 1},
                      Case{model::Arch::Gpt2, 4, DType::F32, true, 1}, Case{model::Arch::Gpt2, 4, DType::BF16, false, 3},
                      Case{model::Arch::Simple, 4, DType::F32, false, 2, 3}, Case{model::Arch::Gpt2, 2, DType::F32, true, 1, 3},
                      Case{model::Arch::Simple, 2, DType::F32, false, 1, 1, 2},
                      Case{model::Arch::Simple, 4, DType::BF16, true, 2, 2, 2},
                      Case{model::Arch::Gpt2, 2, DType::F32, false, 2, 2, 2},
                      Case{model::Arch::Gpt2, 4, DType::F32, true, 1, 1, 2}),
    case_name);

TEST(TensorParallelGpuRefusals, GroupsItCannotRun) {
  CUTRAIN_REQUIRE_GPU();
  LoopbackHub hub(2);
  LoopbackTpGroup group(hub, 1);
  model::ModelDims d{256, 2, 4, 1000, 64};
  const model::TransformerParams table(d);
  model::GpuTransformer m(table, kB, kS, false, true, device_allocator());
  model::TpSlice wrong = parallel::make_tp_slice(d, 2, 0, "--tensor_parallel_size");
  EXPECT_NE(test::error_of([&] { m.set_tensor_parallel(&group, wrong); }).find("this is rank 1 of 2"),
            std::string::npos);
  model::TpSlice domino = parallel::make_tp_slice(d, 2, 1, "--tensor_parallel_size");
  domino.pieces = 3;  // the micro-batch holds 2 sequences
  EXPECT_NE(test::error_of([&] { m.set_tensor_parallel(&group, domino); }).find("Domino's 3 pieces do not divide"),
            std::string::npos);
  model::TpSlice half = parallel::make_tp_slice(d, 2, 1, "--tensor_parallel_size");
  half.ffn_end = half.ffn_begin + 1;
  EXPECT_NE(test::error_of([&] { m.set_tensor_parallel(&group, half); }).find("does not hold 1/2"), std::string::npos);
  model::GpuTransformerT<f16> m16(table, kB, kS, false, true, device_allocator());
  EXPECT_NE(test::error_of([&] { m16.set_tensor_parallel(&group, parallel::make_tp_slice(d, 2, 1, "x")); })
                .find("bf16 only"),
            std::string::npos);
}

}  // namespace
}  // namespace cutrain
