// @brief Pipeline parallelism, the pure part (no CUDA, no communicator): the model as a sequence of
// layers, partitioned into contiguous stages by DeepSpeed PipelineModule's `partition_method`, the
// 1F1B schedule of one stage over the step's micro-batches, and the predicted bubble fraction.
//
// partition_method (case-insensitive, as DeepSpeed):
//   parameters   balance the stages' parameter counts (the largest stage as small as it can be);
//   uniform      balance the number of layers (the first stages take one more when it does not divide);
//   type:REGEX   balance the number of layers whose type matches REGEX (case-insensitive search),
//                every stage getting at least one.
// Every stage gets at least one layer; a partition that cannot is an error naming the stage.
//
// 1F1B (PipeDream-Flush, DeepSpeed's TrainSchedule): stage s of S runs min(S - s - 1, M) warm-up
// forwards, then alternates one forward and one backward, then the remaining backwards. At most
// S - s micro-batches' activations are alive on stage s. The bubble fraction, the idle share of a
// step when every stage's forward and backward take the same time, is (S - 1) / (M + S - 1).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "model/transformer_params.h"

namespace cutrain::parallel {

struct PipelineLayer {
  std::string type;         // "Embedding", "TransformerBlock", "OutputHead", ...
  std::size_t params = 0;   // real parameters
};

// The model's layer sequence: its parameter units (embedding, each block, the head), types
// "Embedding", "TransformerBlock", "OutputHead" (GPT-2: "FinalLayerNorm", the head being tied to
// the embedding).
std::vector<PipelineLayer> pipeline_layers(const model::TransformerParams& table);

enum class PartitionKind { Parameters, Uniform, Type };
struct PartitionMethod {
  PartitionKind kind = PartitionKind::Parameters;
  std::string regex;  // Type
  std::string text;   // as given, for messages
};
// Throws cutrain::Error naming `where` for anything but the three forms (and an empty or invalid REGEX).
PartitionMethod parse_partition_method(const std::string& text, const std::string& where = "partition_method");

struct PipelineStage {
  int first = 0, end = 0;  // layers [first, end)
  std::size_t params = 0;
  std::size_t weight = 0;  // what the method balanced (parameters, layers or matching layers)
};

struct PipelinePlan {
  int stages = 1;
  int micro_batches = 1;
  PartitionMethod method;
  std::vector<PipelineStage> parts;
  double bubble_fraction() const;
  int stage_of_layer(int layer) const;
  // "stage 0: layers 0-2 (Embedding, TransformerBlock x2), 12,345 params; ..." plus the schedule
  // and the bubble line.
  std::string describe(const std::vector<PipelineLayer>& layers) const;
};

// Throws cutrain::Error: stages < 1 or more stages than layers, micro_batches < 1, a REGEX that
// matches fewer layers than there are stages (a stage would be empty of them).
PipelinePlan make_pipeline_plan(const std::vector<PipelineLayer>& layers, const PartitionMethod& method, int stages,
                                int micro_batches);

// Contiguous non-empty parts of `weights` minimising the largest part's sum and, among those,
// maximising the smallest: the part boundaries [0 = b0 < b1 < ... < b_parts = n]. Throws when
// parts > n.
std::vector<int> partition_balanced(const std::vector<std::size_t>& weights, int parts);
// DeepSpeed's uniform split of n items: the first n % parts parts one item larger.
std::vector<int> partition_uniform(int n, int parts);

struct PipeAction {
  enum Kind { Forward, Backward } kind;
  int micro = 0;
  bool operator==(const PipeAction& o) const { return kind == o.kind && micro == o.micro; }
};
// The 1F1B order of stage `stage` of `stages` over `micro_batches` micro-batches.
std::vector<PipeAction> one_f_one_b(int stage, int stages, int micro_batches);

}  // namespace cutrain::parallel
