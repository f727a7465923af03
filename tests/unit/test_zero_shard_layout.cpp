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

TEST(ZeroShardLayout, UseOrderWithATiedHeadAndAnEmbeddingBackwardThatReadsParams) {
  // GPT-2: the head's use acquires the embedding unit too; its lookup backward reads none.
  const parallel::Stage3Uses gpt2{true, false}, bert{true, true};
  EXPECT_EQ(parallel::stage3_use_order(2, 1, false, gpt2), (std::vector<int>{0, 1, 2, 3, 0, 2, 1}));
  EXPECT_EQ(parallel::stage3_use_order(2, 2, false, gpt2), (std::vector<int>{0, 1, 2, 3, 0, 2, 1, 0, 1, 2, 3, 0, 2, 1}));
  EXPECT_EQ(parallel::stage3_use_order(2, 3, true, gpt2), (std::vector<int>{0, 1, 2, 3, 0}));
  // BERT: and its embedding LayerNorm's backward acquires the embedding unit after the blocks.
  EXPECT_EQ(parallel::stage3_use_order(2, 1, false, bert), (std::vector<int>{0, 1, 2, 3, 0, 2, 1, 0}));
  EXPECT_EQ(parallel::stage3_use_order(1, 2, false, bert), (std::vector<int>{0, 1, 2, 0, 1, 0, 0, 1, 2, 0, 1, 0}));
  EXPECT_EQ(parallel::stage3_use_order(2, 1, true, bert), (std::vector<int>{0, 1, 2, 3, 0}));
  EXPECT_EQ(parallel::stage3_use_order(0, 1, false, bert), (std::vector<int>{0, 1, 0, 0}));
}

namespace {

// One acquire (+1 + u) or release (-1 - u) of unit u, in the order GpuTransformer issues them
// (model/transformer_gpu.cpp): forward_backward per micro-batch, or forward_loss.
std::vector<int> model_calls(int layers, int micro_batches, bool eval, parallel::Stage3Uses uses) {
  std::vector<int> c;
  const int head = 1 + layers;
  auto acq = [&](int u) { c.push_back(1 + u); };
  auto rel = [&](int u) { c.push_back(-1 - u); };
  for (int m = 0; m < (eval ? 1 : micro_batches); ++m) {
    acq(0), rel(0);
    for (int l = 0; l < layers; ++l) acq(1 + l), rel(1 + l);
    acq(head);
    if (uses.tied_head) acq(0);
    rel(head);  // after the loss (eval) or the head's backward
    if (uses.tied_head) rel(0);
    if (eval) break;
    for (int l = layers - 1; l >= 0; --l) acq(1 + l), rel(1 + l);
    if (uses.embedding_backward) acq(0), rel(0);
  }
  return c;
}

// Runs the calls through a GatherWindow as parallel/zero_stage3.cpp does, checking that every
// buffer is overwritten only after its previous use's release and read only after its gather,
// and returning, per gather, the call index that issued it.
std::vector<std::size_t> simulate(const std::vector<int>& calls, const std::vector<int>& order,
                                  const std::vector<bool>& persistent) {
  std::vector<int> gathered;  // the gathered uses' units
  for (int u : order)
    if (!persistent[std::size_t(u)]) gathered.push_back(u);
  parallel::GatherWindow w;
  w.reset(gathered.size());
  std::vector<std::size_t> issued_at;
  std::vector<std::size_t> use_of_unit(persistent.size(), ~std::size_t(0));
  std::vector<char> released(gathered.size(), 0);
  std::size_t pos = 0;
  auto issue = [&](std::size_t call) {
    while (w.can_issue()) {
      const std::size_t j = w.issue();
      EXPECT_EQ(j, issued_at.size());
      if (j >= 2) {
        EXPECT_TRUE(released[j - 2]) << "gather " << j << " overwrites a live buffer";
      }
      issued_at.push_back(call);
    }
  };
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const int c = calls[i];
    const int u = c > 0 ? c - 1 : -c - 1;
    if (c > 0) {
      EXPECT_LT(pos, order.size());
      EXPECT_EQ(order[pos++], u) << "call " << i << " out of the planned order";
      if (persistent[std::size_t(u)]) continue;
      const std::size_t k = w.acquire();
      EXPECT_EQ(gathered[k], u);
      issue(i);
      EXPECT_GT(w.issued(), k) << "use " << k << " read before its gather";
      use_of_unit[std::size_t(u)] = k;
    } else {
      if (persistent[std::size_t(u)]) continue;
      const std::size_t k = use_of_unit[std::size_t(u)];
      released[k] = 1;
      w.release(k);
      issue(i);
    }
  }
  EXPECT_EQ(pos, order.size());
  EXPECT_TRUE(w.all_released());
  EXPECT_EQ(w.issued(), gathered.size());
  return issued_at;
}

}  // namespace

TEST(ZeroShardLayout, GatherWindowPrefetchesOneUseAheadAndNeverOverwritesALiveUnit) {
  const int L = 3;
  const int head = 1 + L;
  for (parallel::Stage3Uses uses : {parallel::Stage3Uses{}, parallel::Stage3Uses{true, false},
                                    parallel::Stage3Uses{true, true}})
    for (int micro : {1, 2, 3})
      for (bool eval : {false, true})
        for (int persist_mask = 0; persist_mask < 4; ++persist_mask) {  // the embedding and / or head resident
          std::vector<bool> persistent(std::size_t(head) + 1, false);
          persistent[0] = persist_mask & 1;
          persistent[std::size_t(head)] = (persist_mask & 2) != 0;
          const auto calls = model_calls(L, micro, eval, uses);
          const auto order = parallel::stage3_use_order(L, micro, eval, uses);
          const auto at = simulate(calls, order, persistent);
          // Where only one unit is live, the next gather is issued at the acquire before its use
          // (the prefetch); with a gathered head and a gathered tied embedding both live, the
          // gather after them waits for the head's release.
          std::vector<std::size_t> acquire_call;  // per gathered use: its acquire's call index
          for (std::size_t i = 0; i < calls.size(); ++i)
            if (calls[i] > 0 && !persistent[std::size_t(calls[i] - 1)]) acquire_call.push_back(i);
          ASSERT_EQ(acquire_call.size(), at.size());
          for (std::size_t j = 1; j < at.size(); ++j) {
            const bool two_live = !persistent[std::size_t(head)] && calls[acquire_call[j - 1]] == 1 &&
                                  calls[acquire_call[j - 1] - 1] == 1 + head;
            if (two_live) {
              EXPECT_GT(at[j], acquire_call[j - 1]) << "gather " << j << " waits for the head's release";
            } else {
              EXPECT_EQ(at[j], acquire_call[j - 1]) << "gather " << j << " is the prefetch at use " << j - 1;
            }
          }
        }
}

TEST(ZeroShardLayout, GatherWindowRefusesAThirdLiveUnit) {
  parallel::GatherWindow w;
  w.reset(4);
  EXPECT_EQ(w.acquire(), 0u);
  while (w.can_issue()) w.issue();
  EXPECT_EQ(w.acquire(), 1u);
  while (w.can_issue()) w.issue();
  EXPECT_EQ(w.issued(), 2u) << "gather 2 waits for use 0's release";
  EXPECT_EQ(w.acquire(), 2u);
  EXPECT_FALSE(w.can_issue()) << "use 2 acquired with uses 0 and 1 live: its buffer is not free";
  EXPECT_THROW(w.issue(), Error);
  EXPECT_THROW(w.release(3), Error) << "not acquired";
  w.release(0);
  EXPECT_TRUE(w.can_issue());
  EXPECT_EQ(w.issue(), 2u);
  EXPECT_THROW(w.release(0), Error) << "released twice";
}

TEST(ZeroShardLayout, ShardSegmentsCutEachRanksPiecesByTheRuns) {
  // Runs with odd boundaries over odd units; every real element in exactly one rank's segment,
  // at its shard position, with its run.
  for (const auto& units : unit_sets()) {
    const std::size_t numel = units.back().end;
    std::vector<std::vector<parallel::Range>> run_sets{{{0, numel}}};
    std::vector<parallel::Range> odd;
    for (std::size_t a = 0; a < numel;) {
      const std::size_t b = std::min(numel, a + 1 + (a * 7919 + 13) % 977);
      odd.push_back({a, b});
      a = b;
    }
    run_sets.push_back(odd);
    for (const auto& runs : run_sets)
      for (int world : {1, 2, 3, 8}) {
        const parallel::ShardLayout L = parallel::make_shard_layout(units, numel, world, 0);
        std::vector<int> owner(numel, -1);
        for (int r = 0; r < world; ++r) {
          const auto segs = parallel::shard_segments(L, r, runs);
          for (std::size_t i = 0; i < segs.size(); ++i) {
            const parallel::ShardSegment& g = segs[i];
            ASSERT_GT(g.count, 0u);
            ASSERT_LE(g.shard + g.count, L.shard_elems);
            EXPECT_LE(runs[g.run].begin, g.flat);
            EXPECT_LE(g.flat + g.count, runs[g.run].end);
            if (i > 0) {
              EXPECT_LE(segs[i - 1].shard + segs[i - 1].count, g.shard) << "in shard order";
            }
            for (std::size_t e = 0; e < g.count; ++e) {
              const std::size_t f = g.flat + e;
              EXPECT_EQ(owner[f], -1) << "flat " << f << " in two segments";
              owner[f] = r;
              // The shard position holds that flat element: rank r's piece of its unit.
              const std::size_t p = L.padded_of_flat(f);
              const std::size_t shard_pos = g.shard + e;
              const auto u = std::size_t(std::upper_bound(units.begin(), units.end(), f,
                                                          [](std::size_t v, const parallel::Range& x) { return v < x.begin; }) -
                                         units.begin()) - 1;
              const std::size_t within = p - L.units[u].padded_offset;
              EXPECT_EQ(within / L.units[u].per_rank, std::size_t(r));
              EXPECT_EQ(shard_pos, L.units[u].shard_offset + within % L.units[u].per_rank);
            }
          }
          if (world == 1 && L.shard_elems == numel) {
            ASSERT_EQ(segs.size(), runs.size()) << "world 1: the runs themselves";
            for (std::size_t i = 0; i < segs.size(); ++i) {
              EXPECT_EQ(segs[i].flat, runs[i].begin);
              EXPECT_EQ(segs[i].shard, runs[i].begin);
              EXPECT_EQ(segs[i].count, runs[i].size());
              EXPECT_EQ(segs[i].run, i);
            }
          }
        }
        EXPECT_EQ(std::count(owner.begin(), owner.end(), -1), 0) << "every element updated by some rank";
      }
  }
  EXPECT_THROW(parallel::shard_segments(parallel::make_shard_layout(tile({10}), 10, 2, 0), 0, {{0, 4}, {5, 10}}), Error);
}

TEST(ZeroShardLayout, ShardSegmentsOfGpt2AndBertAtWorldOneAreTheirDecayRuns) {
  // The GPU engine's stage-3 optimizer launches at world size 1 are then stage 0's: the same
  // ranges, the same runs (weight decay and stochastic-rounding seed), so the two are bit-identical.
  for (model::Arch arch : {model::Arch::Gpt2, model::Arch::Bert}) {
    model::ModelDims d{128, 3, 2, 1000, 64};
    d.padded_vocab = 1024;
    d.arch = arch;
    const model::TransformerParams t(d);
    std::vector<parallel::Range> units, runs;
    for (const model::ParamUnit& u : t.units()) units.push_back({u.begin, u.end});
    for (const model::DecayRun& r : t.decay_runs()) runs.push_back({r.begin, r.end});
    ASSERT_GT(runs.size(), 2u);
    const parallel::ShardLayout L = parallel::make_shard_layout(units, t.flat_size(), 1, 0);
    const auto segs = parallel::shard_segments(L, 0, runs);
    ASSERT_EQ(segs.size(), runs.size());
    for (std::size_t i = 0; i < runs.size(); ++i) {
      EXPECT_EQ(segs[i].run, i);
      EXPECT_EQ(segs[i].shard, runs[i].begin);
      EXPECT_EQ(segs[i].count, runs[i].size());
    }
    // At world 4 every run's elements are updated by exactly one rank, with its run's rule.
    const parallel::ShardLayout L4 = parallel::make_shard_layout(units, t.flat_size(), 4, 0);
    std::size_t covered = 0;
    for (int r = 0; r < 4; ++r)
      for (const parallel::ShardSegment& g : parallel::shard_segments(L4, r, runs)) {
        covered += g.count;
        EXPECT_TRUE(runs[g.run].begin <= g.flat && g.flat + g.count <= runs[g.run].end);
      }
    EXPECT_EQ(covered, t.flat_size());
  }
}
