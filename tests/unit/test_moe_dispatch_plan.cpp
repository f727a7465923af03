// The GPU MoE layer's expert-parallel exchange without a GPU: model/moe_dispatch_plan.h's pieces
// (a hand-worked case, every row sent once and received once at its expert-major place, the
// receive bound, the errors naming what is wrong), and the same plan driving
// Communicator::all_to_all_v on forked ranks of the host communicator, in the groups the GPU engine
// makes (parallel/group_communicator.h's make_group over DeepSpeed's expert-parallel groups): the
// counts' all-to-all, the rows out to the experts' owners (each row tagged with its sender, expert
// and position, checked where it lands), an "expert" that marks each row with its expert, and the
// reverse exchange that must bring every row home to its permuted place.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "model/moe_dispatch_plan.h"
#include "parallel/expert_parallel_plan.h"
#include "parallel/group_communicator.h"
#include "runtime/comm/host_communicator.h"
#include "runtime/error.h"
#include "tests/support/fork_ranks.h"
#include "tests/support/test_support.h"

using namespace cutrain;

namespace {

bool same(const comm::Piece& a, int peer, std::size_t offset, std::size_t count) {
  return a.peer == peer && a.offset == offset && a.count == count;
}

TEST(MoeDispatchPlan, HandWorkedTwoMembers) {
  // E = 4 over P = 2: member 0 holds experts 0-1, member 1 experts 2-3. This is member 1.
  // Its permuted rows: expert 0 x2, expert 1 x0, expert 2 x3, expert 3 x1.
  // Received [src][local]: member 0 sent 1 row for expert 2 and 4 for expert 3; itself 3 and 1.
  const model::MoeDispatchPlan p = model::make_moe_dispatch_plan(4, 2, 1, {2, 0, 3, 1}, {1, 4, 3, 1});
  EXPECT_EQ(p.local_experts, 2);
  EXPECT_EQ(p.first_expert, 2);
  ASSERT_EQ(p.sends.size(), 4u);
  EXPECT_TRUE(same(p.sends[0], 0, 0, 2));  // expert 0's rows to member 0
  EXPECT_TRUE(same(p.sends[1], 0, 2, 0));  // expert 1's (none)
  EXPECT_TRUE(same(p.sends[2], 1, 2, 3));  // expert 2's to itself
  EXPECT_TRUE(same(p.sends[3], 1, 5, 1));
  EXPECT_EQ(p.send_rows, 6);
  EXPECT_EQ(p.local_rows, (std::vector<int>{4, 5}));  // expert 2: 1 + 3, expert 3: 4 + 1
  EXPECT_EQ(p.recv_rows, 9);
  ASSERT_EQ(p.recvs.size(), 4u);
  // Expert-major: expert 2's rows from member 0 then member 1 at [0, 4), expert 3's at [4, 9).
  EXPECT_TRUE(same(p.recvs[0], 0, 0, 1));
  EXPECT_TRUE(same(p.recvs[1], 0, 4, 4));
  EXPECT_TRUE(same(p.recvs[2], 1, 1, 3));
  EXPECT_TRUE(same(p.recvs[3], 1, 8, 1));
  const auto wide = model::MoeDispatchPlan::scaled(p.recvs, 16);
  EXPECT_TRUE(same(wide[3], 1, 128, 16));
}

TEST(MoeDispatchPlan, EveryRowOnceAtAnyShape) {
  std::mt19937 rng(test::fresh_rng()());
  for (int P : {1, 2, 3, 4})
    for (int El : {1, 2, 5}) {
      const int E = P * El;
      for (int rank = 0; rank < P; ++rank) {
        std::vector<int> kept(static_cast<std::size_t>(E)), got(static_cast<std::size_t>(P * El));
        for (int& v : kept) v = int(rng() % 7);
        for (int& v : got) v = int(rng() % 7);
        const model::MoeDispatchPlan p = model::make_moe_dispatch_plan(E, P, rank, kept, got);
        // Sends tile [0, send_rows) in order; receives tile [0, recv_rows) once.
        std::size_t at = 0;
        for (const comm::Piece& s : p.sends) {
          EXPECT_EQ(s.offset, at);
          at += s.count;
        }
        EXPECT_EQ(at, std::size_t(p.send_rows));
        std::vector<int> hit(std::size_t(p.recv_rows), 0);
        for (const comm::Piece& r : p.recvs)
          for (std::size_t i = 0; i < r.count; ++i) ++hit[r.offset + i];
        for (int h : hit) EXPECT_EQ(h, 1);
        int sum = 0;
        for (int v : p.local_rows) sum += v;
        EXPECT_EQ(sum, p.recv_rows);
      }
    }
}

TEST(MoeDispatchPlan, ReceiveBoundAndErrors) {
  // Dropping: at most capacity rows per receiving expert; never more than k x tokens.
  EXPECT_EQ(model::moe_dispatch_max_rows(8, 2, 2, 100, true, 30), 4 * 30);
  EXPECT_EQ(model::moe_dispatch_max_rows(8, 2, 1, 100, true, 60), 100);
  EXPECT_EQ(model::moe_dispatch_max_rows(8, 4, 2, 100, false, 5), 200);
  auto err = [](auto f) { return test::error_of(f); };
  EXPECT_NE(err([] { model::make_moe_dispatch_plan(6, 4, 0, std::vector<int>(6), std::vector<int>(4)); })
                .find("ep_size 4 does not divide num_experts 6"),
            std::string::npos);
  EXPECT_NE(err([] { model::make_moe_dispatch_plan(4, 2, 2, std::vector<int>(4), std::vector<int>(4)); })
                .find("rank 2 outside an expert-parallel group of 2"),
            std::string::npos);
  EXPECT_NE(err([] { model::make_moe_dispatch_plan(4, 2, 0, std::vector<int>(3), std::vector<int>(4)); })
                .find("3 kept counts, expected one per expert (4)"),
            std::string::npos);
  EXPECT_NE(err([] { model::make_moe_dispatch_plan(4, 2, 0, std::vector<int>(4), std::vector<int>(3)); })
                .find("3 received counts, expected ep_size x local experts = 4"),
            std::string::npos);
  EXPECT_NE(err([] { model::make_moe_dispatch_plan(4, 2, 0, {1, -1, 0, 0}, std::vector<int>(4)); })
                .find("a negative kept count -1"),
            std::string::npos);
}

// A row's tag: who sent it, for which expert, at which position, which column.
float tag(int src, int e, int pos, int col) { return float(src * 1000000 + e * 10000 + pos * 10 + col); }

// One rank of `world` at ep_size `ep`: random kept counts per expert, the exchange and its reverse.
void exchange_on_rank(std::shared_ptr<comm::Communicator> world, int ep, int E, std::uint64_t seed) {
  constexpr int H = 3;
  const auto groups = parallel::make_expert_parallel_groups(world->world_size(), ep, "--moe_expert_parallel_size");
  const int rank = world->rank();
  std::shared_ptr<comm::Communicator> g = parallel::make_group(world, groups.ep_group(rank));
  CUTRAIN_CHECK(g->world_size() == ep && g->rank() == groups.ep_rank(rank), "group: rank ", g->rank(), " of ",
                g->world_size());
  const int P = ep, El = E / P, me = g->rank();
  std::mt19937 rng(std::uint32_t(seed + 977 * std::uint64_t(rank)));
  std::vector<int> kept(static_cast<std::size_t>(E));
  for (int& v : kept) v = int(rng() % 5);  // zeros included
  // The counts' all-to-all (int32, the kept counts' chunk j is member j's experts).
  std::vector<std::int32_t> got(static_cast<std::size_t>(P * El));
  g->all_to_all(kept.data(), got.data(), std::size_t(El), DType::I32, nullptr);
  const model::MoeDispatchPlan p = model::make_moe_dispatch_plan(E, P, me, kept, std::vector<int>(got.begin(), got.end()));
  // The permuted rows, expert-contiguous.
  std::vector<float> xp;
  for (int e = 0; e < E; ++e)
    for (int pos = 0; pos < kept[std::size_t(e)]; ++pos)
      for (int c = 0; c < H; ++c) xp.push_back(tag(me, e, pos, c));
  std::vector<float> rx(std::size_t(p.recv_rows) * H, -1.f);
  const auto sends = model::MoeDispatchPlan::scaled(p.sends, H), recvs = model::MoeDispatchPlan::scaled(p.recvs, H);
  g->all_to_all_v(xp.data(), sends, rx.data(), recvs, DType::F32, nullptr);
  // Expert-major: local expert l's rows from member 0, 1, ... in their position order.
  std::size_t row = 0;
  for (int l = 0; l < El; ++l)
    for (int src = 0; src < P; ++src)
      for (int pos = 0; pos < got[std::size_t(src * El + l)]; ++pos, ++row)
        for (int c = 0; c < H; ++c)
          CUTRAIN_CHECK(rx[row * H + c] == tag(src, p.first_expert + l, pos, c), "member ", me, ": received row ", row,
                        " col ", c, " is ", rx[row * H + c], ", expected member ", src, "'s expert ",
                        p.first_expert + l, " position ", pos);
  CUTRAIN_CHECK(row == std::size_t(p.recv_rows), "member ", me, ": ", row, " rows, the plan says ", p.recv_rows);
  // The "expert": marks each row with the expert that computed it (0.5 per expert index).
  row = 0;
  for (int l = 0; l < El; ++l)
    for (int r = 0; r < p.local_rows[std::size_t(l)]; ++r, ++row)
      for (int c = 0; c < H; ++c) rx[row * H + c] += 0.5f * float(p.first_expert + l);
  std::vector<float> back(xp.size(), -1.f);
  g->all_to_all_v(rx.data(), recvs, back.data(), sends, DType::F32, nullptr);
  for (std::size_t i = 0; i < xp.size(); ++i) {
    const int e = int(std::size_t(xp[i]) / 10000 % 100);
    CUTRAIN_CHECK(back[i] == xp[i] + 0.5f * float(e), "member ", me, ": element ", i, " came back as ", back[i],
                  ", expected ", xp[i] + 0.5f * float(e));
  }
}

std::vector<std::string> on_host_ranks(int world, const std::function<void(std::shared_ptr<comm::Communicator>)>& body) {
  return test::fork_ranks(world, [&](int rank, int port) {
    comm::LaunchEnv e;
    e.rank = rank;
    e.world_size = world;
    e.master_port = port;
    body(comm::create_host_communicator(e));
  });
}

TEST(MoeDispatchPlan, ExchangeOnHostRanks) {
  const std::uint64_t seed = test::fresh_rng()();
  struct Case {
    int world, ep, experts;
  };
  for (const Case c : {Case{1, 1, 4}, Case{2, 2, 4}, Case{4, 2, 6}, Case{4, 4, 8}, Case{3, 3, 3}}) {
    SCOPED_TRACE("world " + std::to_string(c.world) + ", ep " + std::to_string(c.ep) + ", experts " +
                 std::to_string(c.experts));
    test::expect_all_ok(on_host_ranks(c.world, [&](std::shared_ptr<comm::Communicator> w) {
      exchange_on_rank(std::move(w), c.ep, c.experts, seed);
    }));
  }
}

TEST(MoeDispatchPlan, AllToAllVPiecesAndErrors) {
  // Pieces to itself and empty pieces on one rank; a peer outside the world named.
  comm::LaunchEnv e;
  auto c = comm::create_host_communicator(e);
  const std::vector<float> send = {1, 2, 3, 4, 5};
  std::vector<float> recv(5, 0.f);
  c->all_to_all_v(send.data(), {{0, 3, 2}, {0, 0, 0}, {0, 0, 3}}, recv.data(), {{0, 0, 2}, {0, 2, 3}}, DType::F32,
                  nullptr);
  EXPECT_EQ(recv, (std::vector<float>{4, 5, 1, 2, 3}));
  EXPECT_NE(test::error_of([&] {
              c->all_to_all_v(send.data(), {{1, 0, 1}}, recv.data(), {}, DType::F32, nullptr);
            }).find("a send piece names rank 1, outside a world of 1"),
            std::string::npos);
}

}  // namespace
