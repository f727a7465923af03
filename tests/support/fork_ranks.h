// @brief The multi-rank tests' process launcher: `world` forked children, each running the test's
// body with its rank and one shared loopback port (a rendezvous of the host communicator), each
// reporting its outcome through a pipe.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace cutrain::test {

// Runs body(rank, port) in `world` forked processes; returns each rank's outcome: "" when body
// returned, else its exception's message ("(empty error)" for an empty one).
std::vector<std::string> fork_ranks(int world, const std::function<void(int rank, int port)>& body);

// EXPECT that every rank's outcome is "" (naming the rank that failed).
void expect_all_ok(const std::vector<std::string>& outcomes);

}  // namespace cutrain::test
