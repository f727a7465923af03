// @brief The host communicator: a TEST AND DEVELOPMENT backend. The processes of one machine
// exchange host memory through one POSIX shared-memory segment (/dev/shm) with process-shared,
// robust pthread synchronization; it serves the CPU training backend (`cutrain launch --backend
// host`) so that every parallel mode runs at world sizes 2-8 without GPUs. GPUs always use NCCL
// (Communicator::create).
//
// Set-up: rank 0 creates the segment under a fresh name and hands the name out over the TCP
// rendezvous (runtime/comm/rendezvous.h: the launch environment's MASTER_ADDR / port); once every
// rank has mapped it, rank 0 unlinks the name, so nothing is left in /dev/shm however the job ends.
//
// Data path: every rank owns one slot of `slot_bytes`; a collective goes chunk by chunk: each rank
// writes its part of the chunk into its slot, a barrier, each rank reads what it needs from all
// slots, a barrier. Reductions visit the ranks in order 0..world-1 and accumulate in fp64 (int64
// for integers), rounding once: every rank gets bit-identical results. send / recv go through a
// ring of `channel_bytes` per ordered pair of ranks: a send returns once its bytes are in the ring,
// so two ranks may send to each other first when the messages fit the ring.
//
// Failures: every rank holds a robust mutex of its own in the segment for its lifetime. A wait
// (a barrier, a full or empty ring) looks every `poll` at the ranks it waits for: a rank whose
// process ended (the kernel released its mutex as the owner died) or that closed its communicator
// is an error naming it at once; the first such finding is recorded in the segment, so the other
// ranks report the same cause. A wait longer than `timeout` is an error naming the ranks that did
// not arrive. The communicator belongs to the thread that created it (its mutex is that thread's).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>

#include "runtime/comm/communicator.h"

namespace cutrain::comm {

struct HostCommOptions {
  std::size_t slot_bytes = std::size_t(1) << 20;      // per rank (a collective's chunk)
  std::size_t channel_bytes = std::size_t(256) << 10;  // per ordered pair of ranks (send / recv)
  std::chrono::milliseconds timeout = std::chrono::seconds(300);  // one wait; also the rendezvous
  std::chrono::milliseconds poll = std::chrono::milliseconds(20);  // liveness checks while waiting
};

// The most ranks one segment serves.
constexpr int kHostCommMaxWorld = 64;

// Collective: every rank of `env` calls it (env.world_size <= kHostCommMaxWorld). World size 1
// needs no rendezvous.
std::unique_ptr<Communicator> create_host_communicator(const LaunchEnv& env, const HostCommOptions& options = {});

}  // namespace cutrain::comm
