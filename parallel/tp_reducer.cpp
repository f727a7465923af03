#include "parallel/tp_reducer.h"

#include <algorithm>
#include <vector>

#include "runtime/error.h"

namespace cutrain::parallel {

CommTpReducer::CommTpReducer(std::shared_ptr<comm::Communicator> group, int pieces)
    : group_(std::move(group)), pieces_(pieces) {
  CUTRAIN_CHECK(group_, "tensor parallel: no group communicator");
}

void CommTpReducer::mark_compute() {
  const auto now = Clock::now();
  if (open_) pass_.compute.push_back(std::chrono::duration<double>(now - last_).count());
  last_ = now;
}

void CommTpReducer::mark_comm() {
  const auto now = Clock::now();
  if (open_) pass_.comm.push_back(std::chrono::duration<double>(now - last_).count());
  last_ = now;
}

void CommTpReducer::sum(double* buf, std::size_t n) {
  mark_compute();
  group_->all_reduce_sum_f64(buf, n, nullptr);
  mark_comm();
}

void CommTpReducer::max(double* buf, std::size_t n) {
  mark_compute();
  const std::size_t W = std::size_t(group_->world_size());
  std::vector<double> all(n * W);
  group_->all_gather(buf, all.data(), n * sizeof(double), DType::U8, nullptr);
  for (std::size_t r = 0; r < W; ++r)
    for (std::size_t i = 0; i < n; ++i) buf[i] = std::max(buf[i], all[r * n + i]);
  mark_comm();
}

void CommTpReducer::begin_pass() {
  pass_ = {};
  open_ = true;
  last_ = Clock::now();
}

void CommTpReducer::end_pass() {
  mark_compute();
  open_ = false;
  estimate_.add(model_overlap(pass_, pieces_));
}

}  // namespace cutrain::parallel
