#include "parallel/domino_timeline.h"

#include <algorithm>
#include <cstdio>

#include "runtime/error.h"

namespace cutrain::parallel {

void OverlapEstimate::add(const OverlapEstimate& o) {
  compute_s += o.compute_s;
  comm_s += o.comm_s;
  serial_s += o.serial_s;
  overlapped_s += o.overlapped_s;
}

OverlapEstimate model_overlap(const PassSegments& pass, int pieces) {
  const std::size_t n = pass.comm.size();
  CUTRAIN_CHECK(pass.compute.size() == n + 1, "domino timeline: ", pass.compute.size(), " compute segments for ", n,
                " all-reduces (expected one more)");
  CUTRAIN_CHECK(pieces >= 1, "domino timeline: pieces ", pieces);
  OverlapEstimate e;
  std::vector<double> ce(n), ae(n);  // when compute k and all-reduce k end
  double c_prev = 0;
  for (std::size_t k = 0; k < n; ++k) {
    double start = c_prev;
    if (k >= std::size_t(pieces)) start = std::max(start, ae[k - std::size_t(pieces)]);
    ce[k] = start + pass.compute[k];
    c_prev = ce[k];
    ae[k] = std::max(ce[k], k ? ae[k - 1] : 0.0) + pass.comm[k];
  }
  e.overlapped_s = std::max(c_prev, n ? ae[n - 1] : 0.0) + pass.compute[n];
  for (double c : pass.compute) e.compute_s += c;
  for (double a : pass.comm) e.comm_s += a;
  e.serial_s = e.compute_s + e.comm_s;
  return e;
}

std::string describe_overlap(const OverlapEstimate& e, int pieces) {
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "domino: %d piece%s per micro-batch; tensor-parallel all-reduces %.4f s beside %.4f s of compute "
                "(forward and backward); %.1f%% of the communication hidden (modelled on the host: the measured "
                "segments on a compute and a communication stream, %.4f s -> %.4f s)",
                pieces, pieces == 1 ? "" : "s", e.comm_s, e.compute_s, 100.0 * e.hidden_fraction(), e.serial_s,
                e.overlapped_s);
  return buf;
}

}  // namespace cutrain::parallel
