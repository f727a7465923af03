// ZeRO stage 3's pure layout (parallel/zero_shard_layout.h): every unit partitioned over W ranks on
// its own, the shard offsets, the padded layout, the gather buffer size, persistence, the host
// copies between layouts, and the order in which a step uses the units.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "model/transformer_params.h"
#include "parallel/zero_shard_layout.h"
#include "runtime/error.h"

using namespace cutrain;

namespace {

std::vector<parallel::Range> tile(const std::vector<std::size_t>& sizes) {
  std::vector<parallel::Range> out;
  std::size_t at = 0;
  for (std::size_t n : sizes) {
    out.push_back({at, at + n});
    at += n;
  }
  return out;
}

// Odd unit sizes (not multiples of 8 nor of any world size), and the small model's real units.
std::vector<std::vector<parallel::Range>> unit_sets() {
  std::vector<std::vector<parallel::Range>> sets{tile({1}), tile({7, 1, 13}), tile({1000, 12345, 3, 64, 999}),
                                             tile({(std::size_t(1) << 20) + 1, 17})};
  const model::TransformerParams t(model::ModelDims{128, 2, 2, 1000, 64});
  std::vector<parallel::Range> model;
  for (const model::ParamUnit& u : t.units()) model.push_back({u.begin, u.end});
  sets.push_back(model);
  return sets;
}

}  // namespace

TEST(ZeroShardLayout, PiecesCoverEveryRealElementOnceInWholeVectors) {
  for (const auto& units : unit_sets()) {
    const std::size_t numel = units.back().end;
    for (int world = 1; world <= 64; ++world) {
      const parallel::ShardLayout L = parallel::make_shard_layout(units, numel, world, /*persistence_threshold=*/0);
      ASSERT_EQ(L.units.size(), units.size());
      std::vector<int> seen(numel, 0);
      std::size_t shard = 0, gather = 0;
      for (std::size_t u = 0; u < units.size(); ++u) {
        const parallel::ShardUnit& s = L.units[u];
        EXPECT_EQ(s.per_rank % 8, 0u) << "world " << world << " unit " << u << ": piece not whole 16-byte vectors";
        EXPECT_GE(s.padded_size(world), units[u].size()) << "padding cannot drop elements";
        EXPECT_LT(s.padded_size(world) - units[u].size(), std::size_t(8) * world) << "more padding than needed";
        EXPECT_EQ(s.shard_offset, shard) << "pieces are back to back in the shard";
        EXPECT_EQ(s.shard_offset % 8, 0u);
        EXPECT_EQ(s.padded_offset, shard * std::size_t(world));
        EXPECT_FALSE(s.persistent);
        shard += s.per_rank;
        gather = std::max(gather, s.padded_size(world));
        for (int r = 0; r < world; ++r) {
          const parallel::Range p = L.piece_flat(u, r);
          EXPECT_LE(p.size(), s.per_rank);
          for (std::size_t i = p.begin; i < p.end; ++i) {
            ASSERT_GE(i, units[u].begin);
            ASSERT_LT(i, units[u].end);
            ++seen[i];
          }
        }
      }
      EXPECT_EQ(L.shard_elems, shard);
      EXPECT_EQ(L.padded_elems, shard * std::size_t(world));
      EXPECT_EQ(L.gather_elems, gather) << "one gather buffer holds the largest unit";
      EXPECT_EQ(L.persistent_elems, 0u);
      EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }))
          << "world " << world << ": some real element is in no piece or in two";
    }
  }
}

TEST(ZeroShardLayout, WorldOneOverTheModelIsTheFlatBuffer) {
  // Bit-identity at world size 1 needs shard == padded == flat (the units are 64-element aligned).
  const model::TransformerParams t(model::ModelDims{128, 2, 2, 1000, 64});
  std::vector<parallel::Range> units;
  for (const model::ParamUnit& u : t.units()) units.push_back({u.begin, u.end});
  const parallel::ShardLayout L = parallel::make_shard_layout(units, t.flat_size(), 1, 0);
  EXPECT_EQ(L.shard_elems, t.flat_size());
  EXPECT_EQ(L.padded_elems, t.flat_size());
  for (std::size_t u = 0; u < units.size(); ++u) {
    EXPECT_EQ(L.units[u].shard_offset, units[u].begin);
    EXPECT_EQ(L.units[u].padded_offset, units[u].begin);
  }
}

TEST(ZeroShardLayout, ModelUnitsTileTheFlatBuffer) {
  const model::TransformerParams t(model::ModelDims{128, 3, 2, 1000, 64});
  ASSERT_EQ(t.units().size(), 5u);
  EXPECT_EQ(t.embedding_unit(), 0);
  EXPECT_EQ(t.layer_unit(2), 3);
  EXPECT_EQ(t.head_unit(), 4);
  std::size_t at = 0;
  for (const model::ParamUnit& u : t.units()) {
    EXPECT_EQ(u.begin, at);
    at = u.end;
    for (int i = u.first; i < u.last; ++i) {
      EXPECT_GE(t.tensor(i).offset, u.begin);
      EXPECT_LE(t.tensor(i).offset + t.tensor(i).count, u.end) << t.tensor(i).name;
    }
  }
  EXPECT_EQ(at, t.flat_size());
  for (int i = 0; i < int(t.tensors().size()); ++i) {
    const model::ParamUnit& u = t.units()[std::size_t(t.unit_of(i))];
    EXPECT_TRUE(u.first <= i && i < u.last) << t.tensor(i).name;
  }
  EXPECT_EQ(t.unit_of(t.output_b()), t.head_unit());
  EXPECT_EQ(t.unit_of(t.layer(1).norm2_b), t.layer_unit(1));
  EXPECT_EQ(t.unit_of(t.pos_embedding()), t.embedding_unit());
}

TEST(ZeroShardLayout, PersistenceThresholdKeepsSmallUnitsGathered) {
  const auto units = tile({100, 5000, 64, 3000});
  const parallel::ShardLayout L = parallel::make_shard_layout(units, 8164, 4, /*persistence_threshold=*/100);
  EXPECT_TRUE(L.units[0].persistent);
  EXPECT_FALSE(L.units[1].persistent);
  EXPECT_TRUE(L.units[2].persistent);
  EXPECT_FALSE(L.units[3].persistent);
  EXPECT_EQ(L.units[0].persistent_offset, 0u);
  EXPECT_EQ(L.units[2].persistent_offset, L.units[0].padded_size(4));
  EXPECT_EQ(L.persistent_elems, L.units[0].padded_size(4) + L.units[2].padded_size(4));
  EXPECT_EQ(L.gather_elems, L.units[1].padded_size(4)) << "persistent units need no gather buffer";
  // Every unit persistent: no gather buffer at all.
  EXPECT_EQ(parallel::make_shard_layout(units, 8164, 4, 1u << 30).gather_elems, 0u);
}

TEST(ZeroShardLayout, HostCopiesRoundTripThroughShardsAndPaddedLayout) {
  for (int world : {1, 2, 3, 8}) {
    const auto units = tile({13, 1000, 7});
    const std::size_t numel = 1020;
    const parallel::ShardLayout L = parallel::make_shard_layout(units, numel, world, 0);
    std::vector<float> flat(numel);
    std::iota(flat.begin(), flat.end(), 1.f);
    // What an all-gather of every unit builds: rank r's piece at padded_offset + r * per_rank.
    std::vector<float> padded(L.padded_elems, -1.f);
    for (int r = 0; r < world; ++r) {
      const std::vector<float> shard = L.shard_from_flat(flat.data(), r);
      ASSERT_EQ(shard.size(), L.shard_elems);
      for (const parallel::ShardUnit& s : L.units)
        std::copy(shard.begin() + std::ptrdiff_t(s.shard_offset), shard.begin() + std::ptrdiff_t(s.shard_offset + s.per_rank),
                  padded.begin() + std::ptrdiff_t(s.padded_offset + std::size_t(r) * s.per_rank));
    }
    EXPECT_EQ(L.flat_from_padded(padded.data()), flat) << "world " << world;
    for (std::size_t p = 0; p < L.padded_elems; ++p) {
      const std::size_t f = L.flat_of_padded(p);
      if (f == numel) EXPECT_EQ(padded[p], 0.f) << "padding is 0 (world " << world << ", index " << p << ")";
      else EXPECT_EQ(padded[p], flat[f]) << "world " << world << ", index " << p;
      if (f != numel) {
        EXPECT_EQ(L.padded_of_flat(f), p) << "the inverse, world " << world << ", index " << p;
      }
    }
  }
}

TEST(ZeroShardLayout, RejectsUnitsThatDoNotTile) {
  EXPECT_THROW(parallel::make_shard_layout({{0, 10}, {11, 20}}, 20, 2, 0), Error);
  EXPECT_THROW(parallel::make_shard_layout({{0, 10}}, 20, 2, 0), Error);
  EXPECT_THROW(parallel::make_shard_layout({}, 0, 2, 0), Error);
  EXPECT_THROW(parallel::make_shard_layout(tile({10}), 10, 0, 0), Error);
}

TEST(ZeroShardLayout, UseOrderOfAStepAndOfAnEvalForward) {
  // 2 layers: units 0 embeddings, 1-2 blocks, 3 head. The head's forward and backward are one use.
  EXPECT_EQ(parallel::stage3_use_order(2, 1, false), (std::vector<int>{0, 1, 2, 3, 2, 1}));
  EXPECT_EQ(parallel::stage3_use_order(2, 2, false), (std::vector<int>{0, 1, 2, 3, 2, 1, 0, 1, 2, 3, 2, 1}));
  EXPECT_EQ(parallel::stage3_use_order(2, 4, true), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(parallel::stage3_use_order(0, 2, false), (std::vector<int>{0, 1, 0, 1}));
}
