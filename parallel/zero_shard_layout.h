// @brief ZeRO stage 3, the pure layout (no CUDA): every parameter unit (transformer_params.h's
// ParamUnit: embeddings, each block, the head) is partitioned over the ranks on its own, so that
// gathering one unit is one all-gather. A rank's shard is the concatenation of its pieces of
// every unit; the bf16 params, the fp32 master, the moments and the reduced gradients of a rank
// all use that shard layout, so the fused optimizer runs once over contiguous shard buffers.
//
// Index spaces:
//   flat    the model's flat buffer [0, numel) (TransformerParams offsets);
//   padded  every unit padded to world x per_rank elements, units back to back: the layout of a
//           gathered unit, of the full gradient buffer and of a gathered state (save_state);
//           unit u starts at padded_offset = world x shard_offset;
//   shard   one rank's pieces, unit after unit: unit u's piece at [shard_offset, +per_rank).
// Rank r's piece of unit u is the unit's padded elements [r x per_rank, (r+1) x per_rank).
// per_rank is a multiple of 8 elements (whole 16-byte vectors of bf16 and fp32), so every piece,
// gathered unit and shard offset is 16-byte aligned. At world size 1 with the model's 64-element
// aligned units nothing is padded: padded == shard == flat.
//
// stage3_param_persistence_threshold: a unit with at most that many real elements is persistent:
// still partitioned for the optimizer, but kept gathered on every rank between steps (one
// all-gather after each optimizer step) instead of being gathered before each use.
#pragma once

#include <cstddef>
#include <vector>

#include "parallel/partition.h"

namespace cutrain::parallel {

struct ShardUnit {
  Range flat;                     // the unit's real elements in the flat buffer
  std::size_t per_rank = 0;       // elements of each rank's piece (multiple of 8)
  std::size_t shard_offset = 0;   // the piece's start in every rank's shard
  std::size_t padded_offset = 0;  // the unit's start in the padded layout (world x shard_offset)
  bool persistent = false;        // kept gathered between steps (see above)
  std::size_t persistent_offset = 0;  // persistent units: start in the persistent buffer
  std::size_t padded_size(int world) const { return per_rank * static_cast<std::size_t>(world); }
};

struct ShardLayout {
  int world = 1;
  std::size_t numel = 0;             // the flat buffer's elements
  std::vector<ShardUnit> units;
  std::size_t shard_elems = 0;       // per rank: sum of per_rank
  std::size_t padded_elems = 0;      // world x shard_elems
  std::size_t gather_elems = 0;      // one gather buffer: the largest non-persistent unit, padded (0: none)
  std::size_t persistent_elems = 0;  // the persistent units, padded, back to back

  // Rank r's piece of unit u in flat coordinates, clipped to the unit's real elements (may be empty).
  Range piece_flat(std::size_t u, int rank) const;
  // Flat index of a padded-layout index, or numel when it is padding.
  std::size_t flat_of_padded(std::size_t padded_index) const;
  // Padded-layout index of a flat index (< numel): where backward writes that gradient element.
  std::size_t padded_of_flat(std::size_t flat_index) const;
  // Host copies between layouts (float values; padding written as 0):
  // rank r's shard (shard_elems) from the flat buffer (numel).
  std::vector<float> shard_from_flat(const float* flat, int rank) const;
  // The flat buffer (numel) from the padded layout (padded_elems).
  std::vector<float> flat_from_padded(const float* padded) const;
};

// Units must tile [0, numel) in order (checked). Throws on world < 1.
ShardLayout make_shard_layout(const std::vector<Range>& units, std::size_t numel, int world,
                              std::size_t persistence_threshold);

// What a model reads besides the plain order (embeddings, blocks, head): `tied_head`: the head's
// weight is the token embedding (GPT-2, BERT), so the head's use also acquires the embedding unit,
// held with the head from the head's forward through its backward (two units live at once);
// `embedding_backward`: the embedding backward reads the unit's parameters (BERT's embedding
// LayerNorm), so it is acquired once more after the blocks' backward.
struct Stage3Uses {
  bool tied_head = false;
  bool embedding_backward = false;
};

// The order in which a training step uses the units: per micro-batch the forward (embeddings,
// blocks, head, and with a tied head the embedding unit again) and the backward (head and tied
// embedding kept from the forward, blocks in reverse, then the embedding unit when its backward
// reads it). `eval`: the forward only, one micro-batch.
std::vector<int> stage3_use_order(int layers, int micro_batches, bool eval, Stage3Uses uses = {});

// Stage 3's two gather buffers over one pass, the pure part of parallel/zero_stage3.h: the pass's
// k-th gathered use goes into buffer k % 2; gather j may be issued once use j - 1 is acquired (the
// prefetch, one use ahead) and use j - 2 is released (its buffer free), whichever comes last. A
// tied head holds two units (head and embedding) at once, so the gather after them waits for the
// first one's release. `uses`: the pass's gathered uses.
class GatherWindow {
 public:
  void reset(std::size_t uses);
  // Use k = acquired() is acquired (returned); then issue every gather next_issue() allows. The
  // caller checks issued() > k before reading buffer k % 2: otherwise three units would be live.
  std::size_t acquire();
  void release(std::size_t k);  // use k released (acquired, not yet released: checked)
  // The next gather the acquired and released uses allow (it is then issued), or none.
  bool can_issue() const;
  std::size_t issue();  // returns its index; requires can_issue()
  std::size_t acquired() const { return acquired_; }
  std::size_t issued() const { return issued_; }
  bool all_released() const;

 private:
  std::size_t uses_ = 0, acquired_ = 0, issued_ = 0;
  std::vector<char> released_;
};

// This rank's pieces of every unit cut where the flat `runs` (ranges tiling [0, numel) in order:
// the weight-decay runs) change, in shard order; adjacent pieces of the same run that are also
// adjacent in the shard merged. Each segment's `run` is its run's index. At world size 1 (no
// padding) the segments are the runs themselves. The shard's padding belongs to no segment.
struct ShardSegment {
  std::size_t shard = 0, flat = 0, count = 0;  // [shard, shard + count) holds flat [flat, flat + count)
  std::size_t run = 0;
};
std::vector<ShardSegment> shard_segments(const ShardLayout& layout, int rank, const std::vector<Range>& runs);

}  // namespace cutrain::parallel
