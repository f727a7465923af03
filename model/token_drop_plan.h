// @brief random-LTD's token selection for one micro-batch: which blocks drop tokens, how many each
// sequence keeps, and for each such block and sequence a random sorted subset of the positions.
// The CPU reference model and the GPU model both take it (gather before the block, the block on
// the kept tokens, scatter after; dropped tokens bypass the block unchanged). The draw is a pure
// function of (seed, step, micro-batch, block, the sequence's global index), so a resumed run and
// every data-parallel split of the same global batch draw the same positions for each sequence.
#pragma once

#include <cstdint>
#include <vector>

namespace cutrain::model {

struct TokenDropPlan {
  int batch = 0, seq = 0;   // B, S of the micro-batch
  int kept = 0;             // K tokens each sequence keeps in the dropping blocks (0 < K < S when active)
  std::vector<int> layers;  // the dropping blocks, ascending
  // [layers.size(), B, K]: per block slot and sequence, ascending positions in [0, S).
  std::vector<std::int32_t> indices;

  bool active() const { return !layers.empty() && kept > 0 && kept < seq; }
  // The slot of block `layer` in `layers`, or -1 when it does not drop tokens (or the plan is off).
  int slot(int layer) const;
  const std::int32_t* slot_indices(int slot) const { return indices.data() + std::size_t(slot) * batch * kept; }
  // Tokens the blocks process in this micro-batch: B x (K per dropping block + S per other one).
  std::int64_t layer_tokens(int num_layers) const;
};

// Draws `plan` for micro-batch `micro` of `step` (the 0-based optimizer step): B sequences whose
// global indices are first_seq .. first_seq + B - 1 (a data-parallel rank's offset in the global
// micro-batch), K of S positions each, for every block of `layers` (sorted and deduplicated here).
// K >= S leaves the plan inactive (no block drops anything). Positions: a partial Fisher-Yates
// shuffle from an mt19937_64 seeded by a mix of (seed, step, micro, block, sequence), then sorted.
void draw_token_drop(TokenDropPlan& plan, std::uint64_t seed, std::int64_t step, int micro, int first_seq, int B,
                     int S, int K, std::vector<int> layers);

}  // namespace cutrain::model
