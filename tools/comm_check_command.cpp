// `cutrain comm-check`: checks a multi-process launch. Every rank joins the TCP rendezvous; with
// GPUs and NCCL, the ranks all-reduce a buffer and verify the sum. Run it under `cutrain launch`,
// torchrun, mpirun or srun before a long job. `--backend host`: the same all-reduce over the host
// communicator (runtime/comm/host_communicator.h), the transport of `--device cpu` runs.
#include <cuda_runtime.h>

#include <iostream>
#include <vector>

#include "runtime/check.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/host_communicator.h"
#include "runtime/comm/rendezvous.h"
#include "runtime/device.h"
#include "tools/commands.h"

namespace cutrain::tools {
namespace {

struct CommCheckArgs {
  int timeout_s = 60;
  int local_rank = 0;
  std::string backend = "nccl";
  CLI::Option* local_rank_opt = nullptr;
};

// The all-reduce check of either communicator: every rank's rank + 1 summed.
float expected_sum(int world) { return world * (world + 1) / 2.0f; }

int run_comm_check(const CommCheckArgs& a) {
  if (a.local_rank_opt->count()) comm::apply_local_rank_flag(a.local_rank);
  const int timeout_s = a.timeout_s;
  comm::LaunchEnv env = comm::read_launch_env();
  const auto timeout = std::chrono::seconds(timeout_s);
  if (a.backend == "host") {
    comm::HostCommOptions o;
    o.timeout = timeout;
    auto c = comm::create_host_communicator(env, o);
    std::vector<float> h(1 << 20, static_cast<float>(env.rank + 1));
    c->all_reduce(h.data(), h.size(), DType::F32, comm::ReduceOp::Sum, nullptr);
    for (float x : h) CUTRAIN_CHECK(x == expected_sum(env.world_size), "all-reduce gave ", x, ", expected ",
                                    expected_sum(env.world_size));
    c->barrier(nullptr);
    std::cout << "rank " << env.rank << " of " << env.world_size << " (" << env.source << "): rendezvous at "
              << env.master_addr << ":" << env.port() << " and " << c->backend_name() << " all-reduce ok\n";
    return 0;
  }
  std::string why;
  if (!gpu_available(&why) || !comm::nccl_available()) {
    std::vector<char> token = {'o', 'k'};
    auto got = comm::rendezvous_broadcast(env, token, timeout);
    CUTRAIN_CHECK(got == token, "rendezvous delivered the wrong token");
    std::cout << "rank " << env.rank << " of " << env.world_size << " (" << env.source << "): rendezvous ok at "
              << env.master_addr << ":" << env.port() << " (from " << env.rendezvous_port_from
              << "); NCCL check skipped (" << (comm::nccl_available() ? why : "built without NCCL") << ")\n";
    return 0;
  }
  auto c = comm::Communicator::create(env, -1, timeout);
  const std::size_t n = 1 << 20;
  float* d = nullptr;
  CUTRAIN_CUDA_CHECK(cudaMalloc(&d, n * sizeof(float)));
  std::vector<float> h(n, static_cast<float>(env.rank + 1));
  CUTRAIN_CUDA_CHECK(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  c->all_reduce(d, n, DType::F32, comm::ReduceOp::Sum, nullptr);
  CUTRAIN_CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
  CUTRAIN_CUDA_CHECK(cudaFree(d));
  const float want = expected_sum(env.world_size);
  for (float x : h) CUTRAIN_CHECK(x == want, "all-reduce gave ", x, ", expected ", want);
  std::cout << "rank " << env.rank << " of " << env.world_size << " (" << env.source << ", GPU " << c->device()
            << "): rendezvous at " << env.master_addr << ":" << env.port() << " (from " << env.rendezvous_port_from
            << ") and NCCL all-reduce ok\n";
  return 0;
}

}  // namespace

CLI::App* setup_comm_check_command(CLI::App& parent, int& exit_code) {
  auto* a = new CommCheckArgs;
  CLI::App* sub = parent.add_subcommand("comm-check", "Check the rendezvous and NCCL of a multi-process launch");
  sub->add_option("--timeout", a->timeout_s, "Seconds to wait for peers")->capture_default_str();
  a->local_rank_opt = sub->add_option("--local_rank", a->local_rank,
                                      "As DeepSpeed's launcher passes it (must agree with LOCAL_RANK when set too)");
  sub->add_option("--backend", a->backend,
                  "nccl: the GPUs' communicator; host: the host communicator of --device cpu (a test backend)")
      ->check(CLI::IsMember({"nccl", "host"}))
      ->capture_default_str();
  sub->callback([a, &exit_code] { exit_code = run_comm_check(*a); });
  return sub;
}

}  // namespace cutrain::tools
