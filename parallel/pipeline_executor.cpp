#include "parallel/pipeline_executor.h"

#include <algorithm>
#include <sstream>

#include "runtime/error.h"

namespace cutrain::parallel {

int pipeline_slots(int stage, int stages, int micro_batches) {
  CUTRAIN_CHECK(stages >= 1 && stage >= 0 && stage < stages && micro_batches >= 1, "pipeline: no slots for stage ",
                stage, " of ", stages, " over ", micro_batches, " micro-batches");
  return std::min(stages - stage, micro_batches);
}

std::vector<StageStep> pipeline_program(int stages, int first, int end, int m) {
  CUTRAIN_CHECK(stages >= 1 && first >= 0 && first < end && end <= stages, "pipeline: stages [", first, ", ", end,
                ") of ", stages, ": expected a non-empty range of the pipeline's stages");
  CUTRAIN_CHECK(m >= 1, "pipeline: expected at least 1 micro-batch, found ", m);
  const int held = end - first;
  std::vector<std::vector<PipeAction>> order;
  for (int s = first; s < end; ++s) order.push_back(one_f_one_b(s, stages, m));
  std::vector<std::size_t> next(std::size_t(held), 0);
  // done_f[s][m] / done_b[s][m]: the tick after which the action is complete (-1: not yet).
  std::vector<std::vector<int>> done_f(std::size_t(held), std::vector<int>(std::size_t(m), -1)), done_b = done_f;
  auto finished = [&](const std::vector<std::vector<int>>& d, int s, int micro, int tick) {
    if (s < first || s >= end) return true;  // held elsewhere: the transport waits for it
    const int t = d[std::size_t(s - first)][std::size_t(micro)];
    return t >= 0 && t < tick;
  };
  std::vector<StageStep> program;
  const std::size_t total = std::size_t(held) * 2 * std::size_t(m);
  for (int tick = 0; program.size() < total; ++tick) {
    CUTRAIN_CHECK(tick <= 4 * (m + stages), "pipeline: the program of stages [", first, ", ", end, ") of ", stages,
                  " over ", m, " micro-batches does not finish (a schedule that waits on itself)");
    for (int i = 0; i < held; ++i) {
      const int s = first + i;
      if (next[std::size_t(i)] == order[std::size_t(i)].size()) continue;
      const PipeAction a = order[std::size_t(i)][next[std::size_t(i)]];
      const bool ready = a.kind == PipeAction::Forward ? finished(done_f, s - 1, a.micro, tick)
                                                       : finished(done_b, s + 1, a.micro, tick);
      if (!ready) continue;
      (a.kind == PipeAction::Forward ? done_f : done_b)[std::size_t(i)][std::size_t(a.micro)] = tick;
      program.push_back({s, a.kind, a.micro, a.micro % pipeline_slots(s, stages, m)});
      ++next[std::size_t(i)];
    }
  }
  return program;
}

std::string describe_program(const std::vector<StageStep>& program) {
  std::ostringstream os;
  for (std::size_t i = 0; i < program.size(); ++i)
    os << (i ? " " : "") << "s" << program[i].stage << (program[i].kind == PipeAction::Forward ? "F" : "B")
       << program[i].micro;
  return os.str();
}

}  // namespace cutrain::parallel
