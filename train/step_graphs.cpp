#include "train/step_graphs.h"

#include <iostream>
#include <string>

#include "runtime/check.h"
#include "runtime/error.h"

namespace cutrain::train {

StepGraphs::~StepGraphs() { clear(); }

void StepGraphs::clear() {
  for (Entry& e : entries_) {
    if (e.exec) cudaGraphExecDestroy(e.exec);
    if (e.graph) cudaGraphDestroy(e.graph);
  }
  entries_.clear();
  warm_ = false;
}

bool StepGraphs::captured(const StepShape& shape) const {
  for (const Entry& e : entries_)
    if (e.shape == shape) return e.exec != nullptr;
  return false;
}

int StepGraphs::size() const {
  int n = 0;
  for (const Entry& e : entries_) n += e.exec != nullptr;
  return n;
}

void StepGraphs::run(cudaStream_t s, const StepShape& shape, bool use_graphs, bool replay_ok,
                     const std::function<void()>& enqueue) {
  Entry* e = nullptr;
  for (Entry& x : entries_)
    if (x.shape == shape) e = &x;
  if (!e) e = &entries_.emplace_back(Entry{shape});
  const bool first_step = e->eager == 0;  // this shape has not run eagerly since the last clear
  if (use_graphs && !failed_ && replay_ok && !e->exec && (!first_step || (warm_ && !eager_first_))) {
    std::string why;
    CUTRAIN_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    try {
      enqueue();
    } catch (const Error& err) {
      why = err.what();
    }
    cudaGraph_t g = nullptr;
    const cudaError_t end = cudaStreamEndCapture(s, &g);
    if (why.empty() && end != cudaSuccess) why = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(end);
    if (why.empty()) {
      const cudaError_t inst = cudaGraphInstantiate(&e->exec, g, 0);
      if (inst != cudaSuccess) {
        why = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(inst);
        e->exec = nullptr;
      }
    }
    if (why.empty()) {
      e->graph = g;
      ++captures_;
    } else {
      if (g) cudaGraphDestroy(g);
      cudaGetLastError();  // clear the error state of the failed capture
      if (first_step) {
        eager_first_ = true;
        std::cerr << "[Rank 0] note: capturing a new step shape at its first step failed, each new shape runs one "
                     "eager step before its capture: " << why << "\n";
      } else {
        failed_ = true;
        std::cerr << "[Rank 0] warning: CUDA graph capture failed, running eagerly: " << why << "\n";
      }
    }
  }
  warm_ = true;
  if (e->exec && replay_ok) {
    CUTRAIN_CUDA_CHECK(cudaGraphLaunch(e->exec, s));
    return;
  }
  enqueue();
  ++e->eager;
}

}  // namespace cutrain::train
