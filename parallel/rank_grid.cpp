#include "parallel/rank_grid.h"

#include "runtime/error.h"

namespace cutrain::parallel {

std::vector<int> RankGrid::tp_group(int rank) const {
  const GridCoord c = coord(rank);
  std::vector<int> g;
  for (int t = 0; t < tp; ++t) g.push_back(rank_of({c.stage, c.replica, t}));
  return g;
}

std::vector<int> RankGrid::dp_group(int rank) const {
  const GridCoord c = coord(rank);
  std::vector<int> g;
  for (int r = 0; r < dp; ++r) g.push_back(rank_of({c.stage, r, c.tp}));
  return g;
}

std::vector<int> RankGrid::pipe_dp_group(int rank) const {
  const GridCoord c = coord(rank);
  std::vector<int> g;
  for (int s = 0; s < pp; ++s)
    for (int r = 0; r < dp; ++r) g.push_back(rank_of({s, r, c.tp}));
  return g;
}

std::vector<int> RankGrid::pp_group(int rank) const {
  const GridCoord c = coord(rank);
  std::vector<int> g;
  for (int s = 0; s < pp; ++s) g.push_back(rank_of({s, c.replica, c.tp}));
  return g;
}

RankGrid make_rank_grid(int world, int pp, int tp, const std::string& pp_flag, const std::string& tp_flag) {
  CUTRAIN_CHECK(world >= 1, "rank grid: world size ", world);
  CUTRAIN_CHECK(pp >= 1, pp_flag, ": expected a number of stages >= 1, found ", pp);
  CUTRAIN_CHECK(tp >= 1, tp_flag, ": expected a tensor-parallel degree >= 1, found ", tp);
  CUTRAIN_CHECK(world % tp == 0, tp_flag, " ", tp, " does not divide the world size ", world,
                ": expected world size = pipeline stages x data-parallel degree x tensor-parallel degree");
  CUTRAIN_CHECK((world / tp) % pp == 0, pp_flag, " ", pp, " with ", tp_flag, " ", tp,
                " does not divide the world size ", world,
                ": expected world size = pipeline stages x data-parallel degree x tensor-parallel degree");
  return RankGrid{pp, world / (pp * tp), tp};
}

}  // namespace cutrain::parallel
