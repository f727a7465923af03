// The GPU pipeline's multi-rank code (train/gpu_pipeline.h over ranks: one stage per rank, its
// 1F1B program, the exchanges of parallel/pipeline_transfers.h on the stage models' hand-over
// buffers, the last stage's losses broadcast and the status words summed) for 2-4 stages on ONE
// GPU: NCCL refuses two ranks on one device, so the S ranks are S GpuPipeline objects of this
// process, each with its own stage models, gradient buffer, loss and status words, host thread and stream,
// joined by a loopback transport (a test transport: a send is a device copy into a mailbox with an
// event, a receive waits for the message and its event and copies it out, the two collectives are
// performed when the last rank calls them).
// Every stage's gradient range, every stage's losses and the status words must equal one whole
// model's forward_backward over the same micro-batches bit for bit (the same kernels on the same
// inputs, each stage's backwards in micro-batch order), and every stage leaves the rest of its
// gradient buffer untouched. The real transport (grouped NCCL send / recv between GPUs) and its
// freedom from deadlock are checked elsewhere: `e2e_pipeline_cuda_cli_cuda` (2 GPUs) and the CPU
// test test_pipeline_transfers.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <deque>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "model/transformer_gpu.h"
#include "parallel/pipeline_plan.h"
#include "runtime/allocator.h"
#include "runtime/check.h"
#include "runtime/comm/communicator.h"
#include "tests/support/test_support.h"
#include "train/gpu_pipeline.h"

using namespace cutrain;

namespace {

// The S endpoints' shared state: the messages in flight per (from, to), in order, each with the
// event its copy recorded on the sender's stream, and the collectives' buffers until the last rank
// arrives. Each rank runs on its own host thread and stream, as a rank of a real run would: a
// receive waits (host) until its message is posted, then (device) on the sender's event, so the
// grouped exchanges rendezvous as NCCL's grouped send / recv do. A wait longer than a minute is a
// deadlock and fails the test instead of hanging it.
struct Message {
  void* buf = nullptr;
  std::size_t bytes = 0;
  cudaEvent_t ready = nullptr;
};
struct LoopbackHub {
  int world = 1;
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::pair<int, int>, std::deque<Message>> mail;
  std::vector<Message> owned;
  std::map<std::string, std::vector<void*>> arrived;
  std::map<std::string, int> generation;
  ~LoopbackHub() {
    cudaDeviceSynchronize();
    for (const Message& m : owned) {
      cudaFree(m.buf);
      cudaEventDestroy(m.ready);
    }
  }
  template <class Pred>
  void wait(std::unique_lock<std::mutex>& lock, Pred ready, const std::string& what) {
    CUTRAIN_CHECK(cv.wait_for(lock, std::chrono::seconds(60), ready), "loopback: ", what,
                  " waited 60 s: the stages wait on each other");
  }
  // The collective `op` with this rank's `buf` (its stream already synchronized): the last rank to
  // arrive runs `complete` over every rank's buffer; the others wait for it.
  void collective(const std::string& op, int rank, void* buf, const std::function<void(std::vector<void*>&)>& complete) {
    std::unique_lock<std::mutex> lock(mu);
    std::vector<void*>& v = arrived[op];
    if (v.empty()) v.assign(std::size_t(world), nullptr);
    CUTRAIN_CHECK(v[std::size_t(rank)] == nullptr, "loopback: rank ", rank, " called ", op, " twice");
    v[std::size_t(rank)] = buf;
    const int gen = generation[op];
    bool last = true;
    for (void* p : v) last = last && p;
    if (last) {
      complete(v);
      CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
      v.clear();
      ++generation[op];
      cv.notify_all();
      return;
    }
    wait(lock, [&] { return generation[op] != gen; }, "rank " + std::to_string(rank) + "'s " + op);
  }
};

comm::LaunchEnv endpoint_env(int rank, int world) {
  comm::LaunchEnv e;
  e.rank = rank;
  e.world_size = world;
  e.local_rank = 0;
  e.local_world_size = world;
  e.source = "loopback";
  return e;
}

class LoopbackLink final : public comm::Communicator {
 public:
  LoopbackLink(LoopbackHub& hub, int rank) : Communicator(endpoint_env(rank, hub.world), 0), hub_(hub) {}
  const char* backend_name() const override { return "loopback (test transport)"; }

  // Every send of the group is posted before any receive waits, as in an NCCL group.
  void send_recv(const std::vector<comm::P2POp>& ops, DType t, cudaStream_t s) override {
    const std::size_t es = dtype_size(t);
    for (const comm::P2POp& o : ops) {
      if (o.kind != comm::P2POp::Send) continue;
      Message m;
      m.bytes = o.count * es;
      CUTRAIN_CUDA_CHECK(cudaMalloc(&m.buf, m.bytes));
      CUTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&m.ready, cudaEventDisableTiming));
      CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(m.buf, o.buf, m.bytes, cudaMemcpyDeviceToDevice, s));
      CUTRAIN_CUDA_CHECK(cudaEventRecord(m.ready, s));
      std::lock_guard<std::mutex> lock(hub_.mu);
      hub_.owned.push_back(m);
      hub_.mail[{rank(), o.peer}].push_back(m);
      hub_.cv.notify_all();
    }
    for (const comm::P2POp& o : ops) {
      if (o.kind != comm::P2POp::Recv) continue;
      Message m;
      {
        std::unique_lock<std::mutex> lock(hub_.mu);
        auto& q = hub_.mail[{o.peer, rank()}];
        hub_.wait(lock, [&] { return !q.empty(); },
                  "rank " + std::to_string(rank()) + "'s receive from rank " + std::to_string(o.peer));
        m = q.front();
        q.pop_front();
      }
      CUTRAIN_CHECK(m.bytes == o.count * es, "loopback: rank ", rank(), " receives ", o.count * es,
                    " bytes from rank ", o.peer, ", which sent ", m.bytes);
      CUTRAIN_CUDA_CHECK(cudaStreamWaitEvent(s, m.ready, 0));
      CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(o.buf, m.buf, m.bytes, cudaMemcpyDeviceToDevice, s));
    }
  }
  void broadcast(void* buf, std::size_t n, DType t, int root, cudaStream_t s) override {
    CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(s));
    hub_.collective("broadcast", rank(), buf, [&](std::vector<void*>& v) {
      for (int r = 0; r < world_size(); ++r)
        if (r != root)
          CUTRAIN_CUDA_CHECK(cudaMemcpy(v[std::size_t(r)], v[std::size_t(root)], n * dtype_size(t),
                                        cudaMemcpyDeviceToDevice));
    });
  }
  void all_reduce(void* buf, std::size_t n, DType t, comm::ReduceOp op, cudaStream_t s) override {
    CUTRAIN_CHECK(t == DType::I32 && op == comm::ReduceOp::Sum, "loopback: all_reduce of int32 sums only");
    CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(s));
    hub_.collective("all_reduce", rank(), buf, [&](std::vector<void*>& v) {
      std::vector<int> sum(n, 0), one(n);
      for (void* p : v) {
        CUTRAIN_CUDA_CHECK(cudaMemcpy(one.data(), p, n * 4, cudaMemcpyDeviceToHost));
        for (std::size_t i = 0; i < n; ++i) sum[i] += one[i];
      }
      for (void* p : v) CUTRAIN_CUDA_CHECK(cudaMemcpy(p, sum.data(), n * 4, cudaMemcpyHostToDevice));
    });
  }
  void reduce_scatter(const void*, void*, std::size_t, DType, comm::ReduceOp, cudaStream_t) override { refuse(); }
  void all_gather(const void*, void*, std::size_t, DType, cudaStream_t) override { refuse(); }
  void all_to_all(const void*, void*, std::size_t, DType, cudaStream_t) override { refuse(); }
  void all_reduce_sum_f64(double*, std::size_t, cudaStream_t) override { refuse(); }
  void send(const void*, std::size_t, DType, int, cudaStream_t) override { refuse(); }
  void recv(void*, std::size_t, DType, int, cudaStream_t) override { refuse(); }
  void barrier(cudaStream_t) override { refuse(); }

 private:
  [[noreturn]] static void refuse() { CUTRAIN_FAIL("loopback: not an operation of a pipeline stage's step"); }
  LoopbackHub& hub_;
};

struct DeviceBuf {
  void* p = nullptr;
  std::size_t bytes = 0;
  explicit DeviceBuf(std::size_t b) : bytes(b) {
    CUTRAIN_CUDA_CHECK(cudaMalloc(&p, b));
    CUTRAIN_CUDA_CHECK(cudaMemset(p, 0, b));
  }
  ~DeviceBuf() { cudaFree(p); }
  std::vector<unsigned char> bytes_of(std::size_t from, std::size_t count) const {
    std::vector<unsigned char> v(count);
    CUTRAIN_CUDA_CHECK(cudaMemcpy(v.data(), static_cast<const char*>(p) + from, count, cudaMemcpyDeviceToHost));
    return v;
  }
};

struct Case {
  int stages = 2;
  int micro = 4;
  DType grads = DType::F32;
  bool checkpointing = false;
};
std::string case_name(const ::testing::TestParamInfo<Case>& i) {
  const Case& c = i.param;
  return "s" + std::to_string(c.stages) + "_m" + std::to_string(c.micro) + "_" +
         (c.grads == DType::F32 ? "f32" : "bf16") + (c.checkpointing ? "_ckpt" : "");
}
void PrintTo(const Case& c, std::ostream* os) { *os << case_name({c, 0}); }

class PipelineGpuStageRanks : public ::testing::TestWithParam<Case> {};

}  // namespace

TEST_P(PipelineGpuStageRanks, RanksOfOneProcessEqualTheWholeModelBitForBit) {
  CUTRAIN_REQUIRE_GPU();
  const Case c = GetParam();
  auto rng = test::fresh_rng();
  model::ModelDims dims{128, 4, 2, 1000, 64};  // 6 pipeline layers
  const model::TransformerParams table(dims);
  const int B = 2, S = 64, M = c.micro;
  const std::size_t per = std::size_t(B) * S, n = table.flat_size(), gs = dtype_size(c.grads);
  CachingAllocator& A = device_allocator();
  cudaStream_t stream = nullptr;
  CUTRAIN_CUDA_CHECK(cudaStreamCreate(&stream));

  // The weights (bf16) and the step's micro-batches.
  std::vector<float> init(n);
  table.init(init.data(), rng());
  std::vector<std::uint16_t> w(n);
  for (std::size_t i = 0; i < n; ++i) w[i] = f32_to_bf16_bits(init[i]);
  DeviceBuf params(n * 2), tokens(M * per * 4), labels(M * per * 4);
  CUTRAIN_CUDA_CHECK(cudaMemcpy(params.p, w.data(), n * 2, cudaMemcpyHostToDevice));
  std::vector<std::int32_t> tok = test::random_ints(M * per, rng, 0, dims.vocab - 1);
  std::vector<std::int32_t> lab = test::random_ints(M * per, rng, 0, dims.vocab - 1);
  lab[std::size_t(M - 1) * per + 5] = dims.vocab + 3;  // a bad label in the last micro-batch: the last stage finds it
  CUTRAIN_CUDA_CHECK(cudaMemcpy(tokens.p, tok.data(), tok.size() * 4, cudaMemcpyHostToDevice));
  CUTRAIN_CUDA_CHECK(cudaMemcpy(labels.p, lab.data(), lab.size() * 4, cudaMemcpyHostToDevice));
  model::FlatParams P(table, params.p, DType::BF16);
  const auto* tk = static_cast<const std::int32_t*>(tokens.p);
  const auto* lb = static_cast<const std::int32_t*>(labels.p);
  auto make = [&] { return model::make_gpu_transformer(DType::BF16, table, B, S, c.checkpointing, true, A); };

  // The whole model, micro-batch by micro-batch.
  DeviceBuf ref_grads(n * gs), ref_loss(M * 4), ref_status(2 * M * 4);
  {
    auto whole = make();
    for (int a = 0; a < M; ++a)
      whole->forward_backward(stream, P, ref_grads.p, c.grads, a > 0, tk + a * per, lb + a * per, 1.f / float(M),
                              static_cast<float*>(ref_loss.p) + a, static_cast<int*>(ref_status.p) + 2 * a);
    CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream));
  }

  // The S ranks: a pipeline object each, over the loopback transport.
  const parallel::PipelinePlan plan = parallel::make_pipeline_plan(
      parallel::pipeline_layers(table), parallel::parse_partition_method("uniform"), c.stages, M);
  LoopbackHub hub;
  hub.world = c.stages;
  std::vector<std::unique_ptr<train::GpuPipeline>> rank;
  std::vector<std::unique_ptr<DeviceBuf>> grads, loss, status;
  for (int s = 0; s < c.stages; ++s) {
    rank.push_back(std::make_unique<train::GpuPipeline>(table, plan, std::make_shared<LoopbackLink>(hub, s), nullptr,
                                                        make));
    ASSERT_EQ(rank.back()->rank_stage(), s);
    grads.push_back(std::make_unique<DeviceBuf>(n * gs));
    loss.push_back(std::make_unique<DeviceBuf>(M * 4));
    status.push_back(std::make_unique<DeviceBuf>(2 * M * 4));
    rank.back()->begin_step({&P, grads.back()->p, c.grads, tk, lb, per, 1.f / float(M),
                             static_cast<float*>(loss.back()->p), static_cast<int*>(status.back()->p), {}});
  }
  // Each rank runs its program on its own thread and stream, as the ranks of a run would.
  std::vector<cudaStream_t> streams(std::size_t(c.stages), nullptr);
  for (cudaStream_t& st : streams) CUTRAIN_CUDA_CHECK(cudaStreamCreate(&st));
  std::vector<std::string> failed(std::size_t(c.stages));
  std::vector<std::thread> threads;
  for (int s = 0; s < c.stages; ++s)
    threads.emplace_back([&, s] {
      try {
        CUTRAIN_CUDA_CHECK(cudaSetDevice(0));
        while (rank[std::size_t(s)]->advance(streams[std::size_t(s)])) {
        }
        rank[std::size_t(s)]->end_step(streams[std::size_t(s)]);
        CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(streams[std::size_t(s)]));
      } catch (const std::exception& e) {
        failed[std::size_t(s)] = e.what();
      }
    });
  for (std::thread& t : threads) t.join();
  for (int s = 0; s < c.stages; ++s) ASSERT_EQ(failed[std::size_t(s)], "") << "rank " << s;
  for (cudaStream_t st : streams) CUTRAIN_CUDA_CHECK(cudaStreamDestroy(st));
  for (const auto& [channel, q] : hub.mail)
    EXPECT_TRUE(q.empty()) << "rank " << channel.first << " sent rank " << channel.second << " a message never received";

  // Each stage's range of its gradients is the whole model's; the rest stays zero.
  const std::vector<unsigned char> want = ref_grads.bytes_of(0, n * gs);
  const std::vector<unsigned char> want_loss = ref_loss.bytes_of(0, M * 4);
  const std::vector<unsigned char> want_status = ref_status.bytes_of(0, 2 * M * 4);
  std::vector<int> st(2 * std::size_t(M));
  std::memcpy(st.data(), want_status.data(), want_status.size());
  ASSERT_GT(st[2 * std::size_t(M - 1) + 1], 0) << "the whole model reports the bad label";
  for (int s = 0; s < c.stages; ++s) {
    const parallel::PipelineStage& part = plan.parts[std::size_t(s)];
    const std::size_t lo = table.units().at(std::size_t(part.first)).begin;
    const std::size_t hi = table.units().at(std::size_t(part.end - 1)).end;
    const std::vector<unsigned char> got = grads[std::size_t(s)]->bytes_of(0, n * gs);
    EXPECT_EQ(0, std::memcmp(got.data() + lo * gs, want.data() + lo * gs, (hi - lo) * gs))
        << "stage " << s << ": gradients of flat [" << lo << ", " << hi << ")";
    bool untouched = true;
    for (std::size_t i = 0; i < n * gs; ++i)
      if ((i < lo * gs || i >= hi * gs) && got[i] != 0) untouched = false;
    EXPECT_TRUE(untouched) << "stage " << s << " wrote gradients outside its layers";
    EXPECT_EQ(loss[std::size_t(s)]->bytes_of(0, M * 4), want_loss) << "stage " << s << ": the broadcast losses";
    EXPECT_EQ(status[std::size_t(s)]->bytes_of(0, 2 * M * 4), want_status) << "stage " << s << ": the status words";
  }
  CUTRAIN_CUDA_CHECK(cudaStreamDestroy(stream));
}

INSTANTIATE_TEST_SUITE_P(Stages, PipelineGpuStageRanks,
                         ::testing::Values(Case{2, 1, DType::F32}, Case{2, 4, DType::BF16}, Case{3, 4, DType::F32, true},
                                           Case{4, 7, DType::BF16}, Case{4, 4, DType::F32}, Case{3, 2, DType::BF16, true}),
                         case_name);
