// @brief Which activations and gradients a pipeline's stage ranks send each other, and when (pure).
// A stage held on its own rank runs its 1F1B program (parallel/pipeline_executor.h) and, between
// two of its actions, one exchange: the transfers the earlier action's result needs sent (after a
// forward its output activation to stage + 1, after a backward its input's gradient to stage - 1)
// together with those the later action's input needs received (before a forward the activation
// from stage - 1, before a backward the output's gradient from stage + 1); before its first action
// the receives alone, after its last the sends alone. An exchange's transfers are posted together
// (comm::Communicator::send_recv: one NCCL group), so two neighbours that send to each other at the
// same time (1F1B's steady state: an activation one way, a gradient the other) do not wait on each
// other's send, as Megatron's send_forward_recv_backward does.
//
// check_pipeline_exchanges proves a set of stages' exchanges free of deadlock under rendezvous
// semantics (a transfer completes once both sides have posted it, so a send never finishes
// before its receive is posted): the GPU engine's multi-rank pipeline and the CPU backend's run
// these exchanges, and the CPU tests check them for every S <= 8, M <= 12.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace cutrain::parallel {

struct PipeTransfer {
  enum Kind { SendAct, RecvAct, SendGrad, RecvGrad } kind = SendAct;
  int micro = 0;
  int peer = 0;  // the neighbour stage (its rank in the pipeline group)
  bool is_send() const { return kind == SendAct || kind == SendGrad; }
  bool operator==(const PipeTransfer& o) const { return kind == o.kind && micro == o.micro && peer == o.peer; }
};

struct PipeExchange {
  std::size_t before = 0;  // the index of the program action it precedes (the program's size: after the last)
  std::vector<PipeTransfer> transfers;  // the sends first, then the receives
};

// The exchanges of stage `stage` of `stages` over `micro_batches`, for its program
// pipeline_program(stages, stage, stage + 1, micro_batches); exchanges with no transfer are left
// out (a one-stage pipeline has none). Throws cutrain::Error as pipeline_program does.
std::vector<PipeExchange> pipeline_exchanges(int stages, int stage, int micro_batches);

// Every stage's exchanges ([stage][k], in program order) run against each other: a transfer is
// matched by its peer's opposite transfer of the same direction and order (the k-th send from a to
// b with the k-th receive on b from a), which must be of the same kind and micro-batch; a stage
// posts its next exchange once every transfer of the current one is matched. Throws
// cutrain::Error naming the stages and the transfers they wait on when no stage can go on, and a
// mismatched pair (another micro-batch or kind) when one is found.
void check_pipeline_exchanges(const std::vector<std::vector<PipeExchange>>& stages);

// One hand-over between stages: a micro-batch's [rows x seq, hidden] activation (or its gradient).
std::size_t pipeline_handover_elems(int rows, int seq, int hidden);

// "before s0F1: send act 0 to stage 1, recv grad 0 from stage 1" lines, for messages and tests.
std::string describe_exchange(const PipeExchange& e);

}  // namespace cutrain::parallel
