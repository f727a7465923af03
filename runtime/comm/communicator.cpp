#include "runtime/comm/communicator.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "runtime/check.h"
#include "runtime/comm/rendezvous.h"

#if CUTRAIN_HAVE_NCCL
#include "runtime/nccl_check.h"
#endif

namespace cutrain::comm {

namespace {
void check_pieces(const std::vector<Piece>& pieces, int world, const char* what) {
  for (const Piece& p : pieces)
    CUTRAIN_CHECK(p.peer >= 0 && p.peer < world, "all_to_all_v: a ", what, " piece names rank ", p.peer,
                  ", outside a world of ", world);
}
}  // namespace

void Communicator::all_to_all_v(const void* send, const std::vector<Piece>& sends, void* recv,
                                const std::vector<Piece>& recvs, DType t, cudaStream_t s) {
  CUTRAIN_CHECK(device() < 0, "all_to_all_v: the packed default works on host memory; the ", backend_name(),
                " communicator must send its pieces itself");
  const int W = world_size();
  check_pieces(sends, W, "send");
  check_pieces(recvs, W, "recv");
  const std::size_t es = dtype_size(t);
  // This rank's block to each peer: its pieces to that peer one after another, in order.
  std::vector<std::size_t> block(std::size_t(W), 0);
  for (const Piece& p : sends) block[std::size_t(p.peer)] += p.count;
  const std::uint64_t mine = *std::max_element(block.begin(), block.end());
  std::vector<std::uint64_t> all(static_cast<std::size_t>(W));
  all_gather(&mine, all.data(), sizeof mine, DType::U8, s);
  const std::size_t n = std::size_t(*std::max_element(all.begin(), all.end()));
  if (n == 0) return;
  std::vector<char> out(std::size_t(W) * n * es, 0), in(out.size());
  std::vector<std::size_t> at(std::size_t(W), 0);
  for (const Piece& p : sends) {
    std::memcpy(out.data() + (std::size_t(p.peer) * n + at[std::size_t(p.peer)]) * es,
                static_cast<const char*>(send) + p.offset * es, p.count * es);
    at[std::size_t(p.peer)] += p.count;
  }
  all_to_all(out.data(), in.data(), n * es, DType::U8, s);
  std::fill(at.begin(), at.end(), 0);
  for (const Piece& p : recvs) {
    CUTRAIN_CHECK(at[std::size_t(p.peer)] + p.count <= n, "all_to_all_v: the recv pieces from rank ", p.peer,
                  " need more than the ", n, " elements any rank sent");
    std::memcpy(static_cast<char*>(recv) + p.offset * es, in.data() + (std::size_t(p.peer) * n + at[std::size_t(p.peer)]) * es,
                p.count * es);
    at[std::size_t(p.peer)] += p.count;
  }
}

void Communicator::send_recv(const std::vector<P2POp>& ops, DType t, cudaStream_t s) {
  for (const P2POp& o : ops)
    if (o.kind == P2POp::Send) send(o.buf, o.count, t, o.peer, s);
  for (const P2POp& o : ops)
    if (o.kind == P2POp::Recv) recv(o.buf, o.count, t, o.peer, s);
}

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
ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
  }
  CUTRAIN_FAIL("nccl: unknown reduce op ", int(op));
}

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
  // A split's communicator, owned from here on.
  void adopt(ncclComm_t c) {
    comm_ = c;
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
  void all_to_all_v(const void* send, const std::vector<Piece>& sends, void* recv, const std::vector<Piece>& recvs,
                    DType t, cudaStream_t s) override {
    check_pieces(sends, world_size(), "send");
    check_pieces(recvs, world_size(), "recv");
    const std::size_t es = dtype_size(t);
    // Pieces of 0 elements are skipped on both sides: the k-th non-empty piece still matches.
    CUTRAIN_NCCL_CHECK(ncclGroupStart());
    for (const Piece& p : sends)
      if (p.count > 0)
        CUTRAIN_NCCL_CHECK(ncclSend(static_cast<const char*>(send) + p.offset * es, p.count, nccl_type(t), p.peer, comm_, s));
    for (const Piece& p : recvs)
      if (p.count > 0)
        CUTRAIN_NCCL_CHECK(ncclRecv(static_cast<char*>(recv) + p.offset * es, p.count, nccl_type(t), p.peer, comm_, s));
    CUTRAIN_NCCL_CHECK(ncclGroupEnd());
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    ncclComm_t sub = nullptr;
    CUTRAIN_NCCL_CHECK(ncclCommSplit(comm_, color, key, &sub, nullptr));
    CUTRAIN_CHECK(sub != nullptr, "ncclCommSplit: rank ", rank(), " got no communicator for color ", color);
    int n = 0, r = 0;
    CUTRAIN_NCCL_CHECK(ncclCommCount(sub, &n));
    CUTRAIN_NCCL_CHECK(ncclCommUserRank(sub, &r));
    LaunchEnv e;
    e.rank = r;
    e.world_size = n;
    e.local_rank = device();
    e.local_world_size = n;
    e.source = "nccl split";
    auto c = std::make_unique<NcclCommunicator>(e, device());
    c->adopt(sub);
    return c;
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
  void send_recv(const std::vector<P2POp>& ops, DType t, cudaStream_t s) override {
    for (const P2POp& o : ops)
      CUTRAIN_CHECK(o.peer >= 0 && o.peer < world_size(), "send_recv: a transfer names rank ", o.peer,
                    ", outside a world of ", world_size());
    if (ops.empty()) return;
    CUTRAIN_NCCL_CHECK(ncclGroupStart());
    for (const P2POp& o : ops) {
      if (o.kind == P2POp::Send)
        CUTRAIN_NCCL_CHECK(ncclSend(o.buf, o.count, nccl_type(t), o.peer, comm_, s));
      else
        CUTRAIN_NCCL_CHECK(ncclRecv(o.buf, o.count, nccl_type(t), o.peer, comm_, s));
    }
    CUTRAIN_NCCL_CHECK(ncclGroupEnd());
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
