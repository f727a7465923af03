// GPU tests of the NCCL communicator through the interface parallel/ takes
// (runtime/comm/communicator.h), on a one-rank communicator (the lent machine has one GPU and NCCL
// refuses two ranks on one device): all-to-all (a group of self send / recv), all-reduce,
// reduce-scatter, all-gather, broadcast, the fp64 sum and the barrier (and the all-to-all of
// variable pieces and a split, the grouped send_recv), each output poisoned first
// and checked against the input (world size 1: the reductions are the identity, Avg included).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "runtime/check.h"
#include "runtime/comm/communicator.h"
#include "tests/support/test_support.h"

using namespace cutrain;

namespace {
struct DeviceBuf {
  void* p = nullptr;
  explicit DeviceBuf(std::size_t bytes) { CUTRAIN_CUDA_CHECK(cudaMalloc(&p, bytes)); }
  ~DeviceBuf() { cudaFree(p); }
};
std::vector<float> download(const DeviceBuf& b, std::size_t n) {
  std::vector<float> v(n);
  CUTRAIN_CUDA_CHECK(cudaMemcpy(v.data(), b.p, n * 4, cudaMemcpyDeviceToHost));
  return v;
}
}  // namespace

TEST(NcclCommunicator, EveryOperationOnOneRank) {
  CUTRAIN_REQUIRE_GPU();
  if (!comm::nccl_available()) GTEST_SKIP() << "cutrain was built without NCCL";
  comm::LaunchEnv env;
  auto c = comm::Communicator::create(env, /*device=*/0);
  EXPECT_STREQ(c->backend_name(), "nccl");
  EXPECT_EQ(c->device(), 0);
  auto rng = test::fresh_rng();
  const std::size_t n = 1001;
  const std::vector<float> x = test::random_normal(n, rng);
  DeviceBuf a(n * 4), b(n * 4);
  auto reset = [&] {
    CUTRAIN_CUDA_CHECK(cudaMemcpy(a.p, x.data(), n * 4, cudaMemcpyHostToDevice));
    CUTRAIN_CUDA_CHECK(cudaMemset(b.p, 0xff, n * 4));  // NaN poison
  };
  cudaStream_t s = nullptr;
  reset();
  c->all_to_all(a.p, b.p, n, DType::F32, s);
  c->barrier(s);
  EXPECT_EQ(download(b, n), x) << "all_to_all";
  reset();
  c->all_reduce(a.p, n, DType::F32, comm::ReduceOp::Avg, s);
  c->all_reduce(a.p, n, DType::F32, comm::ReduceOp::Max, s);  // the vocabulary-parallel loss's row max
  c->reduce_scatter(a.p, b.p, n, DType::F32, comm::ReduceOp::Sum, s);
  c->barrier(s);
  EXPECT_EQ(download(b, n), x) << "all_reduce (avg, max) + reduce_scatter";
  reset();
  c->all_gather(a.p, b.p, n, DType::F32, s);
  c->broadcast(b.p, n, DType::F32, 0, s);
  c->barrier(s);
  EXPECT_EQ(download(b, n), x) << "all_gather + broadcast";
  std::vector<double> d = {1.5, -2.25};
  DeviceBuf dd(16);
  CUTRAIN_CUDA_CHECK(cudaMemcpy(dd.p, d.data(), 16, cudaMemcpyHostToDevice));
  c->all_reduce_sum_f64(static_cast<double*>(dd.p), 2, s);
  c->barrier(s);
  std::vector<double> back(2);
  CUTRAIN_CUDA_CHECK(cudaMemcpy(back.data(), dd.p, 16, cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, d);
}

// The all-to-all of variable pieces on one rank (every piece to itself, reordered, an empty one
// listed on both sides) and a split of the world into itself: pieces land where listed, and the
// split's communicator moves data too.
TEST(NcclCommunicator, PiecesAndSplitOnOneRank) {
  CUTRAIN_REQUIRE_GPU();
  if (!comm::nccl_available()) GTEST_SKIP() << "cutrain was built without NCCL";
  comm::LaunchEnv env;
  auto c = comm::Communicator::create(env, /*device=*/0);
  auto rng = test::fresh_rng();
  const std::size_t n = 301;
  const std::vector<float> x = test::random_normal(n, rng);
  DeviceBuf a(n * 4), b(n * 4);
  CUTRAIN_CUDA_CHECK(cudaMemcpy(a.p, x.data(), n * 4, cudaMemcpyHostToDevice));
  CUTRAIN_CUDA_CHECK(cudaMemset(b.p, 0xff, n * 4));
  // Send [0, 100), nothing, [100, 301); receive the first at [201, 301), the second at [0, 201).
  const std::vector<comm::Piece> sends = {{0, 0, 100}, {0, 100, 0}, {0, 100, 201}};
  const std::vector<comm::Piece> recvs = {{0, 201, 100}, {0, 0, 0}, {0, 0, 201}};
  cudaStream_t s = nullptr;
  c->all_to_all_v(a.p, sends, b.p, recvs, DType::F32, s);
  c->barrier(s);
  std::vector<float> want(x.begin() + 100, x.end());
  want.insert(want.end(), x.begin(), x.begin() + 100);
  EXPECT_EQ(download(b, n), want);
  std::unique_ptr<comm::Communicator> sub = c->split(/*color=*/0, /*key=*/0);
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->world_size(), 1);
  EXPECT_EQ(sub->rank(), 0);
  EXPECT_STREQ(sub->backend_name(), "nccl");
  CUTRAIN_CUDA_CHECK(cudaMemset(b.p, 0xff, n * 4));
  sub->all_to_all(a.p, b.p, n, DType::F32, s);
  sub->barrier(s);
  EXPECT_EQ(download(b, n), x);
}

// Communicator::send_recv (the pipeline's exchanges): the transfers posted as one NCCL group, here
// to this rank itself, the k-th send matched by the k-th receive.
TEST(NcclCommunicator, GroupedSendRecvOnOneRank) {
  CUTRAIN_REQUIRE_GPU();
  if (!comm::nccl_available()) GTEST_SKIP() << "cutrain was built without NCCL";
  comm::LaunchEnv env;
  auto c = comm::Communicator::create(env, /*device=*/0);
  auto rng = test::fresh_rng();
  const std::size_t n = 301;
  const std::vector<float> x = test::random_normal(n, rng);
  DeviceBuf a(n * 4), b(n * 4);
  CUTRAIN_CUDA_CHECK(cudaMemcpy(a.p, x.data(), n * 4, cudaMemcpyHostToDevice));
  CUTRAIN_CUDA_CHECK(cudaMemset(b.p, 0xff, n * 4));
  float* af = static_cast<float*>(a.p);
  float* bf = static_cast<float*>(b.p);
  cudaStream_t s = nullptr;
  // Send [0, 100) then [100, 301); the first lands at [201, 301), the second at [0, 201).
  c->send_recv({{comm::P2POp::Recv, bf + 201, 100, 0},
                {comm::P2POp::Send, af, 100, 0},
                {comm::P2POp::Send, af + 100, 201, 0},
                {comm::P2POp::Recv, bf, 201, 0}},
               DType::F32, s);
  c->barrier(s);
  std::vector<float> want(x.begin() + 100, x.end());
  want.insert(want.end(), x.begin(), x.begin() + 100);
  EXPECT_EQ(download(b, n), want);
  c->send_recv({}, DType::F32, s);  // nothing to move
  EXPECT_NE(test::error_of([&] { c->send_recv({{comm::P2POp::Send, af, 1, 1}}, DType::F32, s); })
                .find("send_recv: a transfer names rank 1, outside a world of 1"),
            std::string::npos);
}
