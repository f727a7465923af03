// @brief ZeRO partition math: a flat buffer split evenly over ranks, padded so every partition is
// a whole number of 16-byte vectors; ownership; and reduce buckets along tensor boundaries.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace cutrain::parallel {

struct Range {
  std::size_t begin = 0, end = 0;  // [begin, end)
  std::size_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
};

struct FlatPartition {
  std::size_t numel = 0;         // real elements
  std::size_t padded_numel = 0;  // numel rounded up to world * align_elems
  std::size_t per_rank = 0;      // padded_numel / world: every rank holds the same count
  std::size_t align_elems = 1;
  int world = 1;

  Range rank_range(int rank) const;  // in padded index space
  Range owned_real(int rank) const;  // rank_range ∩ [0, numel): may be empty on the last ranks
  int owner_of(std::size_t index) const;
  std::size_t padding() const { return padded_numel - numel; }
};

// Splits `numel` elements of `elem_bytes` over `world` ranks with partitions that are multiples of
// `align_bytes` (16: one vector) each. Throws on world < 1, elem_bytes not dividing align_bytes.
FlatPartition partition_flat(std::size_t numel, int world, std::size_t elem_bytes, std::size_t align_bytes = 16);

struct TensorSpan {
  std::string name;
  std::size_t offset = 0, numel = 0;  // in the flat buffer
};

struct Bucket {
  Range range;                       // contiguous flat elements
  std::vector<std::size_t> tensors;  // indices into the tensor list
};

// Groups consecutive tensors into buckets of at most `bucket_elems` elements (DeepSpeed's
// reduce_bucket_size), never splitting a tensor: one larger than the bucket gets a bucket of its
// own. Tensors must be sorted by offset and not overlap (checked).
std::vector<Bucket> make_buckets(const std::vector<TensorSpan>& tensors, std::size_t bucket_elems);

// ZeRO-3's stage3_param_persistence_threshold: tensors with numel <= threshold stay whole on
// every rank (not partitioned). Returns the flags, one per tensor.
std::vector<bool> persistent_tensors(const std::vector<TensorSpan>& tensors, std::size_t threshold);

}  // namespace cutrain::parallel
