// @brief The tensor-parallel group's reductions (model::TpReducer) over a communicator of the
// group (parallel/group_communicator.h), timing each pass's compute and all-reduce segments for
// Domino's overlap model (parallel/domino_timeline.h): the time between two reductions is the
// compute of the piece that issued the second.
#pragma once

#include <chrono>
#include <memory>

#include "model/tensor_parallel.h"
#include "parallel/domino_timeline.h"
#include "runtime/comm/communicator.h"

namespace cutrain::parallel {

class CommTpReducer final : public model::TpReducer {
 public:
  CommTpReducer(std::shared_ptr<comm::Communicator> group, int pieces);
  void sum(double* buf, std::size_t n) override;
  void max(double* buf, std::size_t n) override;  // an all-gather of the ranks' values, then the max
  // Around one forward or backward: its segments go into the estimate.
  void begin_pass();
  void end_pass();
  const OverlapEstimate& estimate() const { return estimate_; }
  comm::Communicator& group() { return *group_; }

 private:
  using Clock = std::chrono::steady_clock;
  void mark_compute();
  void mark_comm();
  std::shared_ptr<comm::Communicator> group_;
  int pieces_;
  bool open_ = false;
  Clock::time_point last_;
  PassSegments pass_;
  OverlapEstimate estimate_;
};

}  // namespace cutrain::parallel
