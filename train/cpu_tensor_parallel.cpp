#include "train/cpu_tensor_parallel.h"

#include <sstream>

#include "runtime/error.h"

namespace cutrain::train {

CpuTensorParallel::CpuTensorParallel(const BackendOptions& o, const model::TransformerParams& table)
    : pieces_(o.domino), table_dims_(table.dims()), batch_(o.batch), seq_(o.seq) {
  CUTRAIN_CHECK(o.tp_comm && o.tp_comm->world_size() == o.tensor_parallel, "cpu backend: tensor parallelism of ",
                o.tensor_parallel, " without its group communicator");
  slice_ = parallel::make_tp_slice(table.dims(), o.tensor_parallel, o.tp_comm->rank(), o.tensor_parallel_flag);
  parallel::check_domino(o.domino, o.batch, o.tensor_parallel, "--domino");
  slice_.pieces = o.domino;
  reducer_ = std::make_unique<parallel::CommTpReducer>(o.tp_comm, o.domino);
  slice_.reducer = reducer_.get();
  layout_ = parallel::make_tp_layout(table, slice_);
  plan_ = parallel::tp_comm_plan(table.dims(), o.batch, o.seq, o.domino, true, table.dims().layers, true);
}

void CpuTensorParallel::set_span(bool embedding, int blocks, bool head) {
  plan_ = parallel::tp_comm_plan(table_dims_, batch_, seq_, pieces_, embedding, blocks, head);
}

void CpuTensorParallel::keep_held(std::vector<float>& flat) const {
  for (std::size_t i = 0; i < flat.size() && i < layout_.held.size(); ++i)
    if (!layout_.held[i]) flat[i] = 0.f;
}

double CpuTensorParallel::counted_sq(const float* flat, std::size_t begin, std::size_t end) const {
  double sq = 0;
  for (std::size_t i = begin; i < end; ++i)
    if (layout_.counted[i]) sq += double(flat[i]) * flat[i];
  return sq;
}

void CpuTensorParallel::combine(std::vector<float>& flat) {
  for (std::size_t i = 0; i < flat.size(); ++i)
    if (!layout_.counted[i]) flat[i] = 0.f;
  reducer_->group().all_reduce(flat.data(), flat.size(), DType::F32, comm::ReduceOp::Sum, nullptr);
}

std::string CpuTensorParallel::describe() const {
  std::ostringstream os;
  os << parallel::describe_tp_slice(slice_) << " over the " << reducer_->group().backend_name()
     << " communicator; per micro-batch " << plan_.forward_all_reduces << " forward and " << plan_.backward_all_reduces
     << " backward all-reduces (fp64 partial sums; the logits never gathered)";
  if (pieces_ > 1) os << "; Domino: " << pieces_ << " pieces per micro-batch";
  return os.str();
}

std::string CpuTensorParallel::run_summary() const { return parallel::describe_overlap(reducer_->estimate(), pieces_); }

}  // namespace cutrain::train
