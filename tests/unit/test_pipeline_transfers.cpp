// CPU tests of parallel/pipeline_transfers (the multi-rank pipeline's hand-overs, shared by the GPU
// engine and the CPU backend) and of the rank grid's pipeline groups: for every S <= 8, M <= 12
// each stage receives exactly the activations of its forwards from stage - 1 and the gradients of
// its backwards from stage + 1, before the action that needs them, and sends what its actions
// produced right after them; the stages' exchanges run against each other under rendezvous
// semantics without deadlock, every transfer matched by the same micro-batch's; the same transfers
// one at a time (no grouping) deadlock, so the check can fail; the pipeline groups of the grid.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "parallel/pipeline_executor.h"
#include "parallel/pipeline_transfers.h"
#include "parallel/rank_grid.h"
#include "runtime/error.h"
#include "tests/support/test_support.h"

using namespace cutrain;
using namespace cutrain::parallel;

TEST(PipelineTransfers, EachStageMovesWhatItsActionsNeedAndMake) {
  for (int S = 1; S <= 8; ++S)
    for (int M = 1; M <= 12; ++M)
      for (int s = 0; s < S; ++s) {
        const std::vector<StageStep> program = pipeline_program(S, s, s + 1, M);
        const std::vector<PipeExchange> ex = pipeline_exchanges(S, s, M);
        if (S == 1) {
          EXPECT_TRUE(ex.empty());
        }
        // Where each transfer happens, by (kind, micro): the index of the action it precedes.
        std::map<std::pair<int, int>, std::size_t> at;
        std::size_t last = 0;
        for (const PipeExchange& e : ex) {
          ASSERT_LE(e.before, program.size());
          if (&e != &ex.front()) {
            ASSERT_GT(e.before, last) << "exchanges in program order, one per gap";
          }
          last = e.before;
          bool recv_seen = false;
          for (const PipeTransfer& t : e.transfers) {
            ASSERT_TRUE(at.emplace(std::make_pair(int(t.kind), t.micro), e.before).second)
                << "a transfer twice: " << describe_exchange(e);
            if (!t.is_send()) recv_seen = true;
            ASSERT_FALSE(t.is_send() && recv_seen) << "sends before receives: " << describe_exchange(e);
            const int want_peer = (t.kind == PipeTransfer::SendAct || t.kind == PipeTransfer::RecvGrad) ? s + 1 : s - 1;
            EXPECT_EQ(t.peer, want_peer) << describe_exchange(e);
          }
        }
        for (std::size_t i = 0; i < program.size(); ++i) {
          const StageStep& a = program[i];
          const bool fwd = a.kind == PipeAction::Forward;
          // Its input: received right before it (the exchange preceding action i), when a neighbour makes it.
          const bool needs = fwd ? s > 0 : s + 1 < S;
          const auto in = at.find({int(fwd ? PipeTransfer::RecvAct : PipeTransfer::RecvGrad), a.micro});
          ASSERT_EQ(in != at.end(), needs) << "stage " << s << " of " << S << ", M " << M << ", action " << i;
          if (needs) {
            EXPECT_EQ(in->second, i);
          }
          // Its result: sent right after it (the exchange preceding action i + 1), when a neighbour takes it.
          const bool gives = fwd ? s + 1 < S : s > 0;
          const auto out = at.find({int(fwd ? PipeTransfer::SendAct : PipeTransfer::SendGrad), a.micro});
          ASSERT_EQ(out != at.end(), gives);
          if (gives) {
            EXPECT_EQ(out->second, i + 1);
          }
        }
        EXPECT_EQ(at.size(), std::size_t(2 * M * ((s > 0) + (s + 1 < S))));
      }
}

TEST(PipelineTransfers, TheStagesExchangesNeverDeadlock) {
  for (int S = 1; S <= 8; ++S)
    for (int M = 1; M <= 12; ++M) {
      std::vector<std::vector<PipeExchange>> all;
      for (int s = 0; s < S; ++s) all.push_back(pipeline_exchanges(S, s, M));
      EXPECT_NO_THROW(check_pipeline_exchanges(all)) << "S " << S << ", M " << M;
    }
}

// Each transfer posted on its own (a send waits for its receive): 1F1B's steady state has two
// neighbours sending to each other at once, which deadlocks; the checker must say so.
TEST(PipelineTransfers, UngroupedTransfersDeadlockAndTheCheckSaysSo) {
  auto ungrouped = [](int S, int M) {
    std::vector<std::vector<PipeExchange>> all;
    for (int s = 0; s < S; ++s) {
      std::vector<PipeExchange> one;
      for (const PipeExchange& e : pipeline_exchanges(S, s, M))
        for (const PipeTransfer& t : e.transfers) one.push_back({e.before, {t}});
      all.push_back(one);
    }
    return all;
  };
  const std::string e = test::error_of([&] { check_pipeline_exchanges(ungrouped(2, 2)); });
  EXPECT_NE(e.find("deadlock"), std::string::npos) << e;
  EXPECT_NE(e.find("stage 0 send act 1 to stage 1"), std::string::npos) << e;
  EXPECT_NE(e.find("stage 1 send grad 0 to stage 0"), std::string::npos) << e;
  // One micro-batch never has two in flight: one at a time is enough there.
  EXPECT_NO_THROW(check_pipeline_exchanges(ungrouped(4, 1)));
}

TEST(PipelineTransfers, MismatchedAndUnmatchedTransfersAreNamed) {
  std::vector<std::vector<PipeExchange>> all{pipeline_exchanges(2, 0, 3), pipeline_exchanges(2, 1, 3)};
  // Stage 1 expects micro-batch 1 where stage 0 sends micro-batch 0.
  std::vector<std::vector<PipeExchange>> bad = all;
  bad[1].front().transfers.front().micro = 1;
  std::string e = test::error_of([&] { check_pipeline_exchanges(bad); });
  EXPECT_NE(e.find("expected the same micro-batch's activation"), std::string::npos) << e;
  // Stage 1 never receives its last gradient's... here: stage 0 sends one activation nobody takes.
  bad = all;
  bad[0].push_back({99, {{PipeTransfer::SendAct, 7, 1}}});
  e = test::error_of([&] { check_pipeline_exchanges(bad); });
  EXPECT_NE(e.find("stage 0 send act 7 to stage 1"), std::string::npos) << e;
  bad = all;
  bad[0].back().transfers.push_back({PipeTransfer::SendAct, 0, 0});
  e = test::error_of([&] { check_pipeline_exchanges(bad); });
  EXPECT_NE(e.find("names no other stage"), std::string::npos) << e;
}

TEST(PipelineTransfers, HandOverSize) {
  EXPECT_EQ(pipeline_handover_elems(3, 5, 7), std::size_t(105));
  EXPECT_EQ(pipeline_handover_elems(64, 2048, 4096), std::size_t(64) * 2048 * 4096);  // past 2^31
  EXPECT_NE(test::error_of([] { pipeline_handover_elems(0, 5, 7); }).find("expected positive sizes"),
            std::string::npos);
}

TEST(PipelineTransfers, PipelineGroupsOfTheGrid) {
  for (int pp : {1, 2, 3, 4})
    for (int dp : {1, 2, 3})
      for (int tp : {1, 2}) {
        const RankGrid g = make_rank_grid(pp * dp * tp, pp, tp, "--pipeline_parallel_size", "--tp");
        std::set<std::vector<int>> groups;
        for (int r = 0; r < g.world(); ++r) {
          const std::vector<int> pg = g.pp_group(r);
          ASSERT_EQ(int(pg.size()), pp);
          const GridCoord c = g.coord(r);
          EXPECT_EQ(pg[std::size_t(c.stage)], r) << "the group's rank is the stage";
          for (int s = 0; s < pp; ++s) {
            EXPECT_EQ(g.coord(pg[std::size_t(s)]).stage, s);
            EXPECT_EQ(g.coord(pg[std::size_t(s)]).replica, c.replica);
            EXPECT_EQ(g.coord(pg[std::size_t(s)]).tp, c.tp);
          }
          groups.insert(pg);
        }
        EXPECT_EQ(int(groups.size()), dp * tp) << "disjoint groups covering the world (ncclCommSplit's colours)";
      }
}
