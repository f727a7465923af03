// @brief Which order the token shards' batches come in: cutrain's own shuffled epochs, or llm.c's
// DataLoader (data/llmc_order.h), so a run can draw exactly llm.c's batches.
#pragma once

namespace cutrain::data {

enum class DataOrder {
  Shuffled,  // windows of every shard shuffled together per epoch (data/batch_sampler.h)
  Llmc,      // llm.c's DataLoader: shard order, then each shard's samples, permuted (data/llmc_order.h)
};

}  // namespace cutrain::data
