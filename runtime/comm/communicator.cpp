#include "runtime/comm/communicator.h"

#include <cstdlib>
#include <cstring>
#include <vector>

#include "runtime/check.h"
#include "runtime/comm/rendezvous.h"

#if CUTRAIN_HAVE_NCCL
#include "runtime/nccl_check.h"
#endif

namespace cutrain::comm {

#if CUTRAIN_HAVE_NCCL

bool nccl_available() { return true; }

namespace {
ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
    case DType::U8: return ncclUint8;
    default: CUTRAIN_FAIL("NCCL has no type for ", dtype_name(t));
  }
}
ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Sum ? ncclSum : ncclAvg; }

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const LaunchEnv& env, int device) : Communicator(env, device) {}
  ~NcclCommunicator() override {
    if (comm_) ncclCommDestroy(comm_);
    if (word_) cudaFree(word_);
  }
  const char* backend_name() const override { return "nccl"; }

  void init(const ncclUniqueId& id) {
    CUTRAIN_NCCL_CHECK(ncclCommInitRank(&comm_, world_size(), id, rank()));
    CUTRAIN_CUDA_CHECK(cudaMalloc(&word_, sizeof(int)));
  }

  void all_reduce(void* buf, std::size_t n, DType t, ReduceOp op, cudaStream_t s) override {
    CUTRAIN_NCCL_CHECK(ncclAllReduce(buf, buf, n, nccl_type(t), nccl_op(op), comm_, s));
  }
  void reduce_scatter(const void* send, void* recv, std::size_t n, DType t, ReduceOp op, cudaStream_t s) override {
    CUTRAIN_NCCL_CHECK(ncclReduceScatter(send, recv, n, nccl_type(t), nccl_op(op), comm_, s));
  }
  void all_gather(const void* send, void* recv, std::size_t n, DType t, cudaStream_t s) override {
    CUTRAIN_NCCL_CHECK(ncclAllGather(send, recv, n, nccl_type(t), comm_, s));
  }
  void all_to_all(const void* send, void* recv, std::size_t n, DType t, cudaStream_t s) override {
    const std::size_t bytes = n * dtype_size(t);
    CUTRAIN_NCCL_CHECK(ncclGroupStart());
    for (int p = 0; p < world_size(); ++p) {
      CUTRAIN_NCCL_CHECK(ncclSend(static_cast<const char*>(send) + p * bytes, n, nccl_type(t), p, comm_, s));
      CUTRAIN_NCCL_CHECK(ncclRecv(static_cast<char*>(recv) + p * bytes, n, nccl_type(t), p, comm_, s));
    }
    CUTRAIN_NCCL_CHECK(ncclGroupEnd());
  }
  void broadcast(void* buf, std::size_t n, DType t, int root, cudaStream_t s) override {
    CUTRAIN_NCCL_CHECK(ncclBroadcast(buf, buf, n, nccl_type(t), root, comm_, s));
  }
  void all_reduce_sum_f64(double* buf, std::size_t n, cudaStream_t s) override {
    CUTRAIN_NCCL_CHECK(ncclAllReduce(buf, buf, n, ncclFloat64, ncclSum, comm_, s));
  }
  void send(const void* buf, std::size_t n, DType t, int peer, cudaStream_t s) override {
    CUTRAIN_NCCL_CHECK(ncclSend(buf, n, nccl_type(t), peer, comm_, s));
  }
  void recv(void* buf, std::size_t n, DType t, int peer, cudaStream_t s) override {
    CUTRAIN_NCCL_CHECK(ncclRecv(buf, n, nccl_type(t), peer, comm_, s));
  }
  void barrier(cudaStream_t s) override {
    // A one-word all-reduce, waited for: every rank's earlier work on `s` is done.
    CUTRAIN_NCCL_CHECK(ncclAllReduce(word_, word_, 1, ncclInt32, ncclSum, comm_, s));
    CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(s));
  }

 private:
  ncclComm_t comm_ = nullptr;
  void* word_ = nullptr;
};
}  // namespace

std::unique_ptr<Communicator> Communicator::create(const LaunchEnv& env, int device, std::chrono::milliseconds timeout) {
  ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);  // multicast stays off unless the user decided
  const int dev = device >= 0 ? device : env.local_rank;
  CUTRAIN_CUDA_CHECK(cudaSetDevice(dev));
  auto c = std::make_unique<NcclCommunicator>(env, dev);
  std::vector<char> blob(sizeof(ncclUniqueId));
  if (env.rank == 0) {
    ncclUniqueId id;
    CUTRAIN_NCCL_CHECK(ncclGetUniqueId(&id));
    std::memcpy(blob.data(), &id, sizeof id);
  }
  blob = rendezvous_broadcast(env, blob, timeout);
  CUTRAIN_CHECK(blob.size() == sizeof(ncclUniqueId), "rendezvous delivered ", blob.size(), " bytes, expected ",
                sizeof(ncclUniqueId));
  ncclUniqueId id;
  std::memcpy(&id, blob.data(), sizeof id);
  c->init(id);
  return c;
}

#else

bool nccl_available() { return false; }
std::unique_ptr<Communicator> Communicator::create(const LaunchEnv& env, int, std::chrono::milliseconds) {
  if (env.world_size == 1) CUTRAIN_FAIL("cutrain was built without NCCL: install NCCL and reconfigure");
  CUTRAIN_FAIL("data parallelism over ", env.world_size, " GPU ranks needs NCCL, and cutrain was built without it");
}

#endif

}  // namespace cutrain::comm
