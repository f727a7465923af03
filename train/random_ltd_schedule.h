// @brief random-LTD's schedule (DeepSpeed's fixed_linear): the tokens each sequence keeps in the
// dropping blocks at an optimizer step, the layer tokens a step consumes, and the checks of the
// config against the model and the run (they need the block count and the sequence length).
// Pure functions of the step: a resumed run gets the same kept counts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/config.h"

namespace cutrain::train {

// Kept tokens per sequence at the 0-based optimizer step `step`, DeepSpeed's formula in integers:
// v = floor(step * (max - min) / require_steps) + min, rounded down to a multiple of seq_per_step,
// then at most max_value (a max_value that is not a multiple is reached past require_steps, as in
// DeepSpeed). It never decreases. A count >= the sequence length drops nothing.
std::int64_t random_ltd_kept(const RandomLtdConfig& c, std::int64_t step);

// The kept count a dropping block applies to sequences of `seq` tokens (a sequence-length
// curriculum's length L, or the run's S): min(random_ltd_kept, seq); `seq` itself means no drop.
std::int64_t random_ltd_kept_at(const RandomLtdConfig& c, std::int64_t step, int seq);

// The tokens the blocks process in one optimizer step over the global batch (`sequences` of
// length `seq`, the step's real length under a sequence-length curriculum): sequences x
// (min(kept, seq) per dropping block + seq per other block).
// DeepSpeed's consumed_layer_tokens counts the other blocks at max_value; here it is the real
// sequence length (the two agree when max_value is the sequence length).
std::int64_t random_ltd_layer_tokens(const RandomLtdConfig& c, std::int64_t step, std::int64_t sequences,
                                     int num_layers, int seq);

// What the run must agree with, each error naming the config file and the JSON path:
// total_layer_num is the model's block count, the ids are blocks of it (not MoE blocks),
// max_value is at most `seq`, model_type decoder needs a causal model and encoder a non-causal
// one. Nothing to check when random-LTD is not active.
struct RandomLtdRun {
  int num_layers = 0, seq = 0;
  bool causal = false;
  std::vector<int> moe_layers;  // the model's MoE blocks
  int pipeline_stages = 1;
  int tensor_parallel = 1;
};
void check_random_ltd(const TrainConfig& config, const RandomLtdRun& run);

// "random-LTD: blocks [1, 2] keep 64..128 of 128 tokens over 100 steps (multiples of 16), decoder"
std::string describe_random_ltd(const RandomLtdConfig& c, int seq);

}  // namespace cutrain::train
