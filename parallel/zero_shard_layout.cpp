#include "parallel/zero_shard_layout.h"

#include <algorithm>

#include "runtime/error.h"

namespace cutrain::parallel {

ShardLayout make_shard_layout(const std::vector<Range>& units, std::size_t numel, int world,
                              std::size_t persistence_threshold) {
  CUTRAIN_CHECK(world >= 1, "ZeRO stage 3: world size must be >= 1, got ", world);
  CUTRAIN_CHECK(!units.empty(), "ZeRO stage 3: the model has no parameter units");
  ShardLayout L;
  L.world = world;
  L.numel = numel;
  std::size_t next = 0;
  for (const Range& r : units) {
    CUTRAIN_CHECK(r.begin == next && r.end > r.begin, "ZeRO stage 3: parameter unit [", r.begin, ", ", r.end,
                  ") does not continue the previous one at ", next);
    next = r.end;
    ShardUnit u;
    u.flat = r;
    // 2-byte elements, 16-byte vectors: per_rank is a multiple of 8 elements.
    u.per_rank = partition_flat(r.size(), world, 2, 16).per_rank;
    u.shard_offset = L.shard_elems;
    u.padded_offset = L.shard_elems * static_cast<std::size_t>(world);
    u.persistent = r.size() <= persistence_threshold;
    if (u.persistent) {
      u.persistent_offset = L.persistent_elems;
      L.persistent_elems += u.padded_size(world);
    } else {
      L.gather_elems = std::max(L.gather_elems, u.padded_size(world));
    }
    L.shard_elems += u.per_rank;
    L.units.push_back(u);
  }
  CUTRAIN_CHECK(next == numel, "ZeRO stage 3: the parameter units end at ", next, ", the flat buffer has ", numel);
  L.padded_elems = L.shard_elems * static_cast<std::size_t>(world);
  return L;
}

Range ShardLayout::piece_flat(std::size_t u, int rank) const {
  CUTRAIN_CHECK(u < units.size() && rank >= 0 && rank < world, "ZeRO stage 3: no piece of unit ", u, " for rank ", rank);
  const ShardUnit& s = units[u];
  const std::size_t b = s.flat.begin + static_cast<std::size_t>(rank) * s.per_rank;
  return {std::min(b, s.flat.end), std::min(b + s.per_rank, s.flat.end)};
}

std::size_t ShardLayout::flat_of_padded(std::size_t p) const {
  CUTRAIN_CHECK(p < padded_elems, "ZeRO stage 3: padded index ", p, " outside ", padded_elems);
  // The unit whose padded range holds p: the last one starting at or before it.
  auto it = std::upper_bound(units.begin(), units.end(), p,
                             [](std::size_t v, const ShardUnit& s) { return v < s.padded_offset; });
  const ShardUnit& s = *(it - 1);
  const std::size_t within = p - s.padded_offset;
  return within < s.flat.size() ? s.flat.begin + within : numel;
}

std::size_t ShardLayout::padded_of_flat(std::size_t f) const {
  CUTRAIN_CHECK(f < numel, "ZeRO stage 3: flat index ", f, " outside ", numel);
  // The unit whose flat range holds f: the last one starting at or before it.
  auto it = std::upper_bound(units.begin(), units.end(), f,
                             [](std::size_t v, const ShardUnit& s) { return v < s.flat.begin; });
  const ShardUnit& s = *(it - 1);
  return s.padded_offset + (f - s.flat.begin);
}

std::vector<float> ShardLayout::shard_from_flat(const float* flat, int rank) const {
  std::vector<float> out(shard_elems, 0.f);
  for (std::size_t u = 0; u < units.size(); ++u) {
    const Range r = piece_flat(u, rank);
    std::copy(flat + r.begin, flat + r.end, out.begin() + static_cast<std::ptrdiff_t>(units[u].shard_offset));
  }
  return out;
}

std::vector<float> ShardLayout::flat_from_padded(const float* padded) const {
  std::vector<float> out(numel, 0.f);
  for (const ShardUnit& s : units)
    std::copy(padded + s.padded_offset, padded + s.padded_offset + s.flat.size(),
              out.begin() + static_cast<std::ptrdiff_t>(s.flat.begin));
  return out;
}

std::vector<int> stage3_use_order(int layers, int micro_batches, bool eval, Stage3Uses uses) {
  // Unit indices as in TransformerParams: 0 embeddings, 1 + l block l, 1 + layers the head.
  std::vector<int> order;
  const int head = 1 + layers;
  for (int m = 0; m < (eval ? 1 : micro_batches); ++m) {
    for (int u = 0; u <= head; ++u) order.push_back(u);
    if (uses.tied_head) order.push_back(0);  // the head's weight: held with the head through its backward
    if (eval) break;
    for (int l = layers - 1; l >= 0; --l) order.push_back(1 + l);
    if (uses.embedding_backward) order.push_back(0);
  }
  return order;
}

void GatherWindow::reset(std::size_t uses) {
  uses_ = uses;
  acquired_ = issued_ = 0;
  released_.assign(uses, 0);
}

std::size_t GatherWindow::acquire() {
  CUTRAIN_CHECK(acquired_ < uses_, "ZeRO stage 3: gathered use ", acquired_, " acquired, the pass plans ", uses_);
  return acquired_++;
}

void GatherWindow::release(std::size_t k) {
  CUTRAIN_CHECK(k < acquired_ && !released_[k], "ZeRO stage 3: gathered use ", k, " released but not held");
  released_[k] = 1;
}

bool GatherWindow::can_issue() const {
  return issued_ < uses_ && issued_ <= acquired_ && (issued_ < 2 || released_[issued_ - 2]);
}

std::size_t GatherWindow::issue() {
  CUTRAIN_CHECK(can_issue(), "ZeRO stage 3: gather ", issued_, " issued before its buffer is free");
  return issued_++;
}

bool GatherWindow::all_released() const {
  return acquired_ == uses_ && std::all_of(released_.begin(), released_.end(), [](char r) { return r != 0; });
}

std::vector<ShardSegment> shard_segments(const ShardLayout& L, int rank, const std::vector<Range>& runs) {
  std::size_t next = 0;
  for (const Range& r : runs) {
    CUTRAIN_CHECK(r.begin == next && r.end > r.begin, "ZeRO stage 3: run [", r.begin, ", ", r.end,
                  ") does not continue the previous one at ", next);
    next = r.end;
  }
  CUTRAIN_CHECK(next == L.numel, "ZeRO stage 3: the runs end at ", next, ", the flat buffer has ", L.numel);
  std::vector<ShardSegment> out;
  std::size_t k = 0;  // the run holding the current piece's first element (pieces come in flat order)
  for (std::size_t u = 0; u < L.units.size(); ++u) {
    const Range piece = L.piece_flat(u, rank);
    for (std::size_t a = piece.begin; a < piece.end;) {
      while (runs[k].end <= a) ++k;
      const std::size_t b = std::min(runs[k].end, piece.end);
      const std::size_t at = L.units[u].shard_offset + (a - piece.begin);
      if (!out.empty() && out.back().run == k && out.back().shard + out.back().count == at &&
          out.back().flat + out.back().count == a)
        out.back().count += b - a;
      else
        out.push_back({at, a, b - a, k});
      a = b;
    }
  }
  return out;
}

}  // namespace cutrain::parallel
