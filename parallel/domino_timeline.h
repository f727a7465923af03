// @brief Domino's overlap, modelled from a pass's measured segments: a forward or backward of the
// tensor-parallel model alternates compute and all-reduces, c0 a0 c1 a1 ... a(n-1) cn, the
// reductions in (sub-layer, piece) order (model/reference_tp.cpp). On two resources, a compute
// stream and a communication stream, all-reduce k starts when compute k and all-reduce k-1 are
// done; compute k starts when compute k-1 is done and, from the second sub-layer on, when its own
// piece's previous all-reduce (k - pieces) is done; the last compute waits for the last
// all-reduce. With one piece the schedule is serial (nothing hidden); with p pieces piece i's
// all-reduce runs while piece i+1 computes. Hidden fraction = (serial - overlapped) / communication.
// Pure.
#pragma once

#include <string>
#include <vector>

namespace cutrain::parallel {

struct PassSegments {
  std::vector<double> compute;  // seconds, one more than comm
  std::vector<double> comm;
};

struct OverlapEstimate {
  double compute_s = 0, comm_s = 0;  // measured totals
  double serial_s = 0;               // compute + comm (what ran)
  double overlapped_s = 0;           // the two-stream schedule's makespan
  void add(const OverlapEstimate& o);
  // Clamped at 0: with one piece the makespan is the serial sum taken in another order.
  double hidden_s() const { return serial_s > overlapped_s ? serial_s - overlapped_s : 0.0; }
  double hidden_fraction() const { return comm_s > 0 ? hidden_s() / comm_s : 0.0; }
};

OverlapEstimate model_overlap(const PassSegments& pass, int pieces);

// "domino: P pieces; tensor-parallel all-reduces 0.012 s of 0.100 s ... X% hidden (modelled ...)".
std::string describe_overlap(const OverlapEstimate& e, int pieces);

}  // namespace cutrain::parallel
