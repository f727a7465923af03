// @brief TCP rendezvous: rank 0 hands a small blob (the NCCL unique id) to every other rank.
// Rank 0 listens on MASTER_ADDR at LaunchEnv::port() (MASTER_PORT; MASTER_PORT + 1 under torchrun,
// whose TCPStore holds MASTER_PORT; CUTRAIN_RENDEZVOUS_PORT when set); the others connect (retrying
// until the timeout), say which rank they are, and receive the blob. A peer that never arrives, a duplicate rank or a
// timeout is an error that says which ranks are missing.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "runtime/comm/launch_env.h"

namespace cutrain::comm {

std::vector<char> rendezvous_broadcast(const LaunchEnv& env, const std::vector<char>& blob_on_rank0,
                                       std::chrono::milliseconds timeout = std::chrono::seconds(300));

}  // namespace cutrain::comm
