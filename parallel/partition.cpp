#include "parallel/partition.h"

#include <algorithm>

#include "runtime/error.h"

namespace cutrain::parallel {

Range FlatPartition::rank_range(int rank) const {
  CUTRAIN_CHECK(rank >= 0 && rank < world, "rank ", rank, " out of range for world size ", world);
  return {static_cast<std::size_t>(rank) * per_rank, static_cast<std::size_t>(rank + 1) * per_rank};
}

Range FlatPartition::owned_real(int rank) const {
  Range r = rank_range(rank);
  return {std::min(r.begin, numel), std::min(r.end, numel)};
}

int FlatPartition::owner_of(std::size_t index) const {
  CUTRAIN_CHECK(index < padded_numel, "index ", index, " outside the padded buffer of ", padded_numel);
  return static_cast<int>(index / per_rank);
}

FlatPartition partition_flat(std::size_t numel, int world, std::size_t elem_bytes, std::size_t align_bytes) {
  CUTRAIN_CHECK(world >= 1, "world size must be >= 1, got ", world);
  CUTRAIN_CHECK(elem_bytes >= 1 && align_bytes % elem_bytes == 0, "alignment of ", align_bytes,
                " bytes is not a whole number of ", elem_bytes, "-byte elements");
  FlatPartition p;
  p.numel = numel;
  p.world = world;
  p.align_elems = align_bytes / elem_bytes;
  const std::size_t unit = p.align_elems * static_cast<std::size_t>(world);
  p.padded_numel = (numel + unit - 1) / unit * unit;
  if (p.padded_numel == 0) p.padded_numel = unit;  // every rank holds at least one vector
  p.per_rank = p.padded_numel / static_cast<std::size_t>(world);
  return p;
}

std::vector<Bucket> make_buckets(const std::vector<TensorSpan>& tensors, std::size_t bucket_elems) {
  CUTRAIN_CHECK(bucket_elems > 0, "bucket size must be positive");
  std::vector<Bucket> out;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    if (i) {
      const auto& prev = tensors[i - 1];
      CUTRAIN_CHECK(t.offset >= prev.offset + prev.numel, "tensor '", t.name, "' at ", t.offset, " overlaps '",
                    prev.name, "' or is out of order");
    }
    const std::size_t end = t.offset + t.numel;
    if (!out.empty() && end - out.back().range.begin <= bucket_elems) {
      out.back().range.end = end;  // fits: extend the open bucket (gaps of padding included)
      out.back().tensors.push_back(i);
    } else {
      out.push_back({{t.offset, end}, {i}});
    }
  }
  return out;
}

std::vector<bool> persistent_tensors(const std::vector<TensorSpan>& tensors, std::size_t threshold) {
  std::vector<bool> f(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) f[i] = tensors[i].numel <= threshold;
  return f;
}

}  // namespace cutrain::parallel
