// @brief One NCCL communicator per process, created from the launch environment: rank 0 makes
// the NCCL unique id and hands it out over the TCP rendezvous. NVLink multicast (NVLS) is left
// off: NCCL_NVLS_ENABLE is set to 0 when the user has not set it, and never set on.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <memory>

#include "runtime/comm/launch_env.h"
#include "runtime/dtype.h"

namespace cutrain::comm {

enum class ReduceOp { Sum, Avg };

// True when cutrain was built with NCCL.
bool nccl_available();

class Communicator {
 public:
  // Collective: every rank of `env` must call it. Uses device `env.local_rank` unless `device` >= 0.
  static std::unique_ptr<Communicator> create(const LaunchEnv& env, int device = -1,
                                              std::chrono::milliseconds timeout = std::chrono::seconds(300));
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  int device() const { return device_; }

  void all_reduce(void* buf, std::size_t count, DType t, ReduceOp op, cudaStream_t s);
  // recv[count] on rank r = reduce over ranks of send[r*count .. (r+1)*count).
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType t, ReduceOp op, cudaStream_t s);
  // recv[world*count]: rank r's send[count] lands at recv[r*count].
  void all_gather(const void* send, void* recv, std::size_t send_count, DType t, cudaStream_t s);
  void broadcast(void* buf, std::size_t count, DType t, int root, cudaStream_t s);
  // In-place sum of fp64 values (DType has no fp64): the ranks' gradient sums of squares.
  void all_reduce_sum_f64(double* buf, std::size_t count, cudaStream_t s);

 private:
  Communicator() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  LaunchEnv env_;
  int device_ = 0;
};

}  // namespace cutrain::comm
