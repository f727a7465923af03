// @brief The rank grid of the hybrid layouts: pipeline stages x data-parallel replicas x
// tensor-parallel ranks, Megatron's order (the tensor-parallel index fastest, then the replica,
// then the stage): rank = (stage x dp + replica) x tp + t. With tp 1 it is DeepSpeed's pipeline
// grid (rank = stage x dp + replica). Pure: the coordinates and each group's members.
#pragma once

#include <string>
#include <vector>

namespace cutrain::parallel {

struct GridCoord {
  int stage = 0, replica = 0, tp = 0;
};

struct RankGrid {
  int pp = 1, dp = 1, tp = 1;
  int world() const { return pp * dp * tp; }
  int rank_of(GridCoord c) const { return (c.stage * dp + c.replica) * tp + c.tp; }
  GridCoord coord(int rank) const { return {rank / (dp * tp), (rank / tp) % dp, rank % tp}; }
  // The members (world ranks, ascending) of `rank`'s groups: its stage's and replica's
  // tensor-parallel ranks; its stage's and tp index's replicas (ZeRO's reductions); every stage and
  // replica of its tp index (the pipeline's grid, on which a stage x dp rank numbering holds); the
  // stages of its replica and tp index, in stage order (the GPU pipeline's group: its rank there is
  // the stage).
  std::vector<int> tp_group(int rank) const;
  std::vector<int> dp_group(int rank) const;
  std::vector<int> pipe_dp_group(int rank) const;
  std::vector<int> pp_group(int rank) const;
};

// Checks that pp and tp divide `world` (each error names `pp_flag` / `tp_flag` and the values).
RankGrid make_rank_grid(int world, int pp, int tp, const std::string& pp_flag, const std::string& tp_flag);

}  // namespace cutrain::parallel
