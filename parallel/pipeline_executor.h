// @brief The order in which one process runs pipeline stages (pure): the stages it holds, each in
// its 1F1B order (parallel/pipeline_plan.h's one_f_one_b), with the activation set (slot) each
// micro-batch uses on its stage. One rank of a multi-rank pipeline holds one stage; the GPU
// engine's "virtual stages" hold every stage in one process and hand activations between them as
// device buffers. The CPU tests run the same program on the reference model's spans.
//
// Slots: stage s of S keeps at most min(S - s, M) micro-batches' activations alive in 1F1B (its
// warm-up forwards plus the one in flight), and micro-batch m's backward on stage s runs before
// the forward of m + (S - s), so micro-batch m uses slot m mod min(S - s, M) and never finds it
// taken.
#pragma once

#include <string>
#include <vector>

#include "parallel/pipeline_plan.h"

namespace cutrain::parallel {

struct StageStep {
  int stage = 0;
  PipeAction::Kind kind = PipeAction::Forward;
  int micro = 0;
  int slot = 0;  // the stage's activation set for this micro-batch
  bool operator==(const StageStep& o) const {
    return stage == o.stage && kind == o.kind && micro == o.micro && slot == o.slot;
  }
};

// Activation sets stage `stage` of `stages` needs over `micro_batches`: min(stages - stage, micro_batches).
int pipeline_slots(int stage, int stages, int micro_batches);

// The program of stages [first, end) of `stages` in one process: every held stage's actions in its
// 1F1B order, interleaved tick by tick as the stages would run side by side (a forward waits for
// the previous stage's forward of its micro-batch, a backward for the next stage's backward of it,
// when that stage is held here; a stage held elsewhere is waited for by the transport), ordered by
// tick and, within a tick, by stage. One held stage: exactly its 1F1B order. Throws cutrain::Error
// for an empty or out-of-range set of stages or micro_batches < 1.
std::vector<StageStep> pipeline_program(int stages, int first, int end, int micro_batches);

// "F0 F1 B0 ..." per stage, for messages and tests.
std::string describe_program(const std::vector<StageStep>& program);

}  // namespace cutrain::parallel
