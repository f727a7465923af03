// @brief The communicator interface of the parallel code: collectives and point-to-point transfers
// among the ranks of one job. Two implementations: NCCL (`Communicator::create`, device memory,
// enqueued on a CUDA stream: every GPU run uses it) and the host communicator
// (runtime/comm/host_communicator.h: host memory, processes of one machine, POSIX shared memory:
// a test and development backend for the CPU backend). parallel/ takes either.
//
// Buffers live where the implementation works (device memory for NCCL, host memory for the host
// communicator); the stream orders NCCL's work and is ignored by the host communicator, whose
// calls are complete when they return. Every rank calls a collective with the same counts, in the
// same order. Reductions are in the element type (bf16 / fp16 summed in fp32 and rounded once on
// the host).
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <vector>

#include "runtime/comm/launch_env.h"
#include "runtime/dtype.h"

namespace cutrain::comm {

// Max: NCCL's only (the GPU model's vocabulary-parallel loss); the host transports refuse it.
enum class ReduceOp { Sum, Avg, Max };

// One contiguous piece of an all_to_all_v: `count` elements at element `offset` of the buffer, to
// or from group rank `peer`.
struct Piece {
  int peer = 0;
  std::size_t offset = 0, count = 0;
};

// One transfer of a batch of point-to-point transfers (Communicator::send_recv): `count` elements
// from `buf` to group rank `peer` (Send) or into `buf` from it (Recv).
struct P2POp {
  enum Kind { Send, Recv } kind = Send;
  void* buf = nullptr;
  std::size_t count = 0;
  int peer = 0;
};

// True when cutrain was built with NCCL.
bool nccl_available();

class Communicator {
 public:
  // NCCL. Collective: every rank of `env` must call it. Uses device `env.local_rank` unless
  // `device` >= 0. NVLink multicast (NVLS) is left off: NCCL_NVLS_ENABLE is set to 0 when the user
  // has not set it, and never set on. Rank 0 makes the NCCL unique id and hands it out over the
  // TCP rendezvous (runtime/comm/rendezvous.h).
  static std::unique_ptr<Communicator> create(const LaunchEnv& env, int device = -1,
                                              std::chrono::milliseconds timeout = std::chrono::seconds(300));
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  // The CUDA device of an NCCL communicator; -1 for the host communicator.
  int device() const { return device_; }
  // "nccl" or "host (shared memory, test backend)".
  virtual const char* backend_name() const = 0;

  virtual void all_reduce(void* buf, std::size_t count, DType t, ReduceOp op, cudaStream_t s) = 0;
  // recv[count] on rank r = reduce over ranks of send[r*count .. (r+1)*count). recv may be the
  // rank's own block of send (in place).
  virtual void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType t, ReduceOp op,
                              cudaStream_t s) = 0;
  // recv[world*count]: rank r's send[count] lands at recv[r*count].
  virtual void all_gather(const void* send, void* recv, std::size_t send_count, DType t, cudaStream_t s) = 0;
  // send[world*count], recv[world*count]: rank r's block j (send[j*count ..]) lands on rank j at
  // recv[r*count ..]. send and recv must not overlap.
  virtual void all_to_all(const void* send, void* recv, std::size_t count, DType t, cudaStream_t s) = 0;
  // The all-to-all of variable pieces (MoE's token exchange): every piece of `sends` goes from
  // `send` to its peer, every piece of `recvs` lands in `recv` from its peer. Between two ranks the
  // k-th piece one sends to the other matches the k-th piece the other receives from it, with the
  // same count (pieces of 0 elements may be listed on both sides or on neither). A rank may list
  // pieces to itself. The default goes through all_to_all, each rank's pieces to a peer packed and
  // padded to the largest block of any rank (one small all_gather of that size first): it serves
  // the host-memory transports (device() < 0); NCCL sends each piece itself (grouped send / recv).
  virtual void all_to_all_v(const void* send, const std::vector<Piece>& sends, void* recv,
                            const std::vector<Piece>& recvs, DType t, cudaStream_t s);
  virtual void broadcast(void* buf, std::size_t count, DType t, int root, cudaStream_t s) = 0;
  // In-place sum of fp64 values (DType has no fp64): the ranks' gradient sums of squares.
  virtual void all_reduce_sum_f64(double* buf, std::size_t count, cudaStream_t s) = 0;
  // Point to point: `count` elements to / from rank `peer` (!= rank()). Messages between two
  // ranks arrive in the order sent; each send is matched by one recv of the same count.
  virtual void send(const void* buf, std::size_t count, DType t, int peer, cudaStream_t s) = 0;
  virtual void recv(void* buf, std::size_t count, DType t, int peer, cudaStream_t s) = 0;
  // Point-to-point transfers posted together, complete when all are: two ranks that send to each
  // other at once (a pipeline's activation one way, a gradient the other) do not wait on each
  // other's send. Matching as for send / recv (per ordered pair, in order). NCCL: one group
  // (ncclGroupStart / ncclGroupEnd) on the stream, where a peer may also be this rank (a copy).
  // The default, for the host transports whose sends are buffered: the sends in order, then the
  // recvs.
  virtual void send_recv(const std::vector<P2POp>& ops, DType t, cudaStream_t s);
  // Returns on every rank once every rank has called it (NCCL: once the stream's work before it
  // is complete on every rank).
  virtual void barrier(cudaStream_t s) = 0;
  // A communicator of the ranks that pass the same `color`, ordered by `key` (NCCL's
  // ncclCommSplit; collective over every rank of this one). Null where the transport has no
  // sub-communicators of its own (the host communicator: parallel/group_communicator.h builds
  // groups on its send / recv instead).
  virtual std::unique_ptr<Communicator> split(int color, int key) {
    (void)color;
    (void)key;
    return nullptr;
  }

 protected:
  Communicator(const LaunchEnv& env, int device) : env_(env), device_(device) {}

 private:
  LaunchEnv env_;
  int device_ = -1;
};

}  // namespace cutrain::comm
