// @brief ZeRO in the GPU engine, the pure part (no CUDA): which mode a configured stage runs in
// at a world size and the flat partition of the optimizer state (parallel/partition.h).
#pragma once

#include <cstddef>
#include <string>

#include "parallel/partition.h"

namespace cutrain::parallel {

enum class ZeroMode {
  None,         // no collectives: the single-process engine (no communicator)
  AllReduce,    // stage 0: every rank keeps everything; gradients all-reduced (averaged)
  Partitioned,  // stages 1 and 2: optimizer state (moments, fp32 master) for this rank's partition only
  Sharded,      // stage 3: params, optimizer state and reduced gradients in per-unit shards
                // (parallel/zero_shard_layout.h), params gathered unit by unit before use
};

struct ZeroPlan {
  int stage = 0;  // as configured (zero_optimization.stage)
  int world = 1, rank = 0;
  bool has_comm = false;
  ZeroMode mode = ZeroMode::None;
  // The flat buffer split over `world` ranks; per_rank is a whole number of 16-byte vectors for
  // every dtype the engine keeps (a multiple of 8 elements: 16 B of bf16, 32 B of fp32).
  FlatPartition part;

  bool partitioned() const { return mode == ZeroMode::Partitioned; }
  bool sharded() const { return mode == ZeroMode::Sharded; }
  // Elements of the bf16 params and the gradient buffer: the padded size when partitioned (the
  // reduce-scatter and all-gather address world x per_rank elements), else the model's flat size.
  // Not for Sharded (throws): stage 3's sizes come from its ShardLayout.
  std::size_t flat_elems() const;
  // The flat range whose optimizer state (moments, master) this rank holds and updates: its
  // padded partition when partitioned, else [0, numel). Not for Sharded (throws).
  Range state_range() const;
  std::size_t state_elems() const { return state_range().size(); }
  // The real (unpadded) elements of this rank's partition: where its gradient norm share is summed.
  Range norm_range() const;
  const char* mode_name() const;
};

// Throws cutrain::Error: stage outside 0..3; world > 1 without a communicator. Without a
// communicator every stage is the single-process engine (None); with one, stage 3 is Sharded at
// every world size (at world size 1 it runs the real gather/shard path on a one-rank communicator).
ZeroPlan make_zero_plan(int stage, std::size_t numel, int world, int rank, bool has_comm);

}  // namespace cutrain::parallel
