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

struct Communicator::Impl {
  ncclComm_t comm = nullptr;
};

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
}  // namespace

std::unique_ptr<Communicator> Communicator::create(const LaunchEnv& env, int device, std::chrono::milliseconds timeout) {
  ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);  // multicast stays off unless the user decided
  std::unique_ptr<Communicator> c(new Communicator);
  c->impl_ = std::make_unique<Impl>();
  c->env_ = env;
  c->device_ = device >= 0 ? device : env.local_rank;
  CUTRAIN_CUDA_CHECK(cudaSetDevice(c->device_));
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
  CUTRAIN_NCCL_CHECK(ncclCommInitRank(&c->impl_->comm, env.world_size, id, env.rank));
  return c;
}

Communicator::~Communicator() {
  if (impl_ && impl_->comm) ncclCommDestroy(impl_->comm);
}

void Communicator::all_reduce(void* buf, std::size_t n, DType t, ReduceOp op, cudaStream_t s) {
  CUTRAIN_NCCL_CHECK(ncclAllReduce(buf, buf, n, nccl_type(t), nccl_op(op), impl_->comm, s));
}
void Communicator::reduce_scatter(const void* send, void* recv, std::size_t n, DType t, ReduceOp op, cudaStream_t s) {
  CUTRAIN_NCCL_CHECK(ncclReduceScatter(send, recv, n, nccl_type(t), nccl_op(op), impl_->comm, s));
}
void Communicator::all_gather(const void* send, void* recv, std::size_t n, DType t, cudaStream_t s) {
  CUTRAIN_NCCL_CHECK(ncclAllGather(send, recv, n, nccl_type(t), impl_->comm, s));
}
void Communicator::broadcast(void* buf, std::size_t n, DType t, int root, cudaStream_t s) {
  CUTRAIN_NCCL_CHECK(ncclBroadcast(buf, buf, n, nccl_type(t), root, impl_->comm, s));
}
void Communicator::all_reduce_sum_f64(double* buf, std::size_t n, cudaStream_t s) {
  CUTRAIN_NCCL_CHECK(ncclAllReduce(buf, buf, n, ncclFloat64, ncclSum, impl_->comm, s));
}

#else

bool nccl_available() { return false; }
struct Communicator::Impl {};
std::unique_ptr<Communicator> Communicator::create(const LaunchEnv& env, int, std::chrono::milliseconds) {
  if (env.world_size == 1) CUTRAIN_FAIL("cutrain was built without NCCL: install NCCL and reconfigure");
  CUTRAIN_FAIL("data parallelism over ", env.world_size, " ranks needs NCCL, and cutrain was built without it");
}
Communicator::~Communicator() = default;
// Unreachable: create() never returns a communicator without NCCL.
void Communicator::all_reduce(void*, std::size_t, DType, ReduceOp, cudaStream_t) { CUTRAIN_FAIL("built without NCCL"); }
void Communicator::reduce_scatter(const void*, void*, std::size_t, DType, ReduceOp, cudaStream_t) {
  CUTRAIN_FAIL("built without NCCL");
}
void Communicator::all_gather(const void*, void*, std::size_t, DType, cudaStream_t) { CUTRAIN_FAIL("built without NCCL"); }
void Communicator::broadcast(void*, std::size_t, DType, int, cudaStream_t) { CUTRAIN_FAIL("built without NCCL"); }
void Communicator::all_reduce_sum_f64(double*, std::size_t, cudaStream_t) { CUTRAIN_FAIL("built without NCCL"); }

#endif

}  // namespace cutrain::comm
