// Tensor parallelism's pure parts and its computation: the rank grid (coordinates, groups, the
// errors naming their flags), the slices of parallel/tensor_parallel_plan.h (they tile the heads,
// the FFN and the vocabulary; the flat layout counts every element once over a group; the errors
// name the flag and what does not divide), Domino's overlap model (serial with one piece, a
// hand-computed two-piece schedule), the group communicator's collectives on two concurrent groups
// of forked ranks over the host communicator against fp64 sums, and the reference model's
// tensor-parallel spans (both architectures, TP 2 and 4, 1 and 2 Domino pieces, fp64) against the
// single model: the loss, the gradients of every rank's slices (summed over the group), and a
// pipeline-style span pair (blocks without the embedding / head).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "model/reference_model.h"
#include "model/tp_slice_runs.h"
#include "parallel/domino_timeline.h"
#include "parallel/group_communicator.h"
#include "parallel/rank_grid.h"
#include "parallel/tensor_parallel_plan.h"
#include "parallel/tp_reducer.h"
#include "runtime/comm/host_communicator.h"
#include "runtime/error.h"
#include "tests/support/fork_ranks.h"
#include "tests/support/test_support.h"

using namespace cutrain;

namespace {


TEST(RankGrid, CoordinatesAndGroups) {
  for (int pp : {1, 2, 4})
    for (int tp : {1, 2, 4})
      for (int dp : {1, 2}) {
        const int w = pp * tp * dp;
        const parallel::RankGrid g = parallel::make_rank_grid(w, pp, tp, "--pp", "--tp");
        ASSERT_EQ(g.dp, dp);
        std::vector<int> seen_tp(std::size_t(w), 0), seen_dp(std::size_t(w), 0);
        for (int r = 0; r < w; ++r) {
          const parallel::GridCoord c = g.coord(r);
          EXPECT_EQ(g.rank_of(c), r);
          EXPECT_EQ(c.tp, r % tp);  // the tensor-parallel index is the fastest
          for (int m : g.tp_group(r)) {
            EXPECT_EQ(g.coord(m).stage, c.stage);
            EXPECT_EQ(g.coord(m).replica, c.replica);
            if (m == r) ++seen_tp[std::size_t(r)];
          }
          for (int m : g.dp_group(r)) {
            EXPECT_EQ(g.coord(m).tp, c.tp);
            EXPECT_EQ(g.coord(m).stage, c.stage);
            if (m == r) ++seen_dp[std::size_t(r)];
          }
          EXPECT_EQ(int(g.pipe_dp_group(r).size()), pp * dp);
          // The pipeline's numbering inside its group: position = stage x dp + replica.
          const std::vector<int> pg = g.pipe_dp_group(r);
          EXPECT_EQ(pg[std::size_t(c.stage * dp + c.replica)], r);
        }
        for (int r = 0; r < w; ++r) EXPECT_EQ(seen_tp[std::size_t(r)] + seen_dp[std::size_t(r)], 2);
      }
  EXPECT_NE(test::error_of([] { parallel::make_rank_grid(6, 1, 4, "--pp", "--tensor_parallel_size"); })
                .find("--tensor_parallel_size 4 does not divide the world size 6"),
            std::string::npos);
  EXPECT_NE(test::error_of([] { parallel::make_rank_grid(4, 4, 2, "--pipeline_parallel_size", "--tp"); })
                .find("--pipeline_parallel_size 4 with --tp 2 does not divide the world size 4"),
            std::string::npos);
}

TEST(TensorParallelPlan, SlicesTileTheModel) {
  model::ModelDims d{24, 2, 6, 30, 5};
  for (int tp : {1, 2, 3, 6}) {
    int heads = 0, ffn = 0, vocab = 0;
    for (int r = 0; r < tp; ++r) {
      const model::TpSlice s = parallel::make_tp_slice(d, tp, r, "--tensor_parallel_size");
      EXPECT_EQ(s.head_begin, heads);
      EXPECT_EQ(s.ffn_begin, ffn);
      EXPECT_EQ(s.vocab_begin, vocab);
      heads = s.head_end;
      ffn = s.ffn_end;
      vocab = s.vocab_end;
    }
    EXPECT_EQ(heads, d.heads);
    EXPECT_EQ(ffn, d.ffn());
    EXPECT_EQ(vocab, d.vocab_rows());
  }
}

TEST(TensorParallelPlan, ErrorsNameTheDegree) {
  model::ModelDims d{24, 2, 6, 30, 5};
  EXPECT_NE(test::error_of([&] { parallel::make_tp_slice(d, 4, 0, "tensor_parallel.autotp_size"); })
                .find("tensor_parallel.autotp_size 4 does not divide the attention heads (--num_heads 6)"),
            std::string::npos);
  model::ModelDims v = d;
  v.vocab = 31;
  EXPECT_NE(test::error_of([&] { parallel::make_tp_slice(v, 2, 0, "--tensor_parallel_size"); })
                .find("--tensor_parallel_size 2 does not divide the vocabulary (31 rows"),
            std::string::npos);
  v.padded_vocab = 32;  // padding makes it divide
  EXPECT_EQ(parallel::make_tp_slice(v, 2, 1, "--tensor_parallel_size").vocab_end, 32);
  model::ModelDims m = d;
  m.moe.experts = {0, 2};
  EXPECT_NE(test::error_of([&] { parallel::make_tp_slice(m, 2, 0, "--tensor_parallel_size"); })
                .find("tensor parallelism of MoE blocks is not built"),
            std::string::npos);
  EXPECT_NE(test::error_of([] { parallel::check_domino(3, 4, 2, "--domino"); })
                .find("--domino 3 does not divide the micro-batch of 4 sequences"),
            std::string::npos);
  EXPECT_NE(test::error_of([] { parallel::check_domino(2, 4, 1, "--domino"); }).find("expected --tensor_parallel_size > 1"),
            std::string::npos);
}

TEST(TensorParallelPlan, LayoutCountsEveryElementOnce) {
  for (model::Arch arch : {model::Arch::Simple, model::Arch::Gpt2})
    for (int tp : {2, 4}) {
      model::ModelDims d{16, 2, 4, 20, 6};
      d.arch = arch;
      model::TransformerParams t(d);
      std::vector<int> counted(t.flat_size(), 0), held(t.flat_size(), 0);
      for (int r = 0; r < tp; ++r) {
        const parallel::TpLayout L = parallel::make_tp_layout(t, parallel::make_tp_slice(d, tp, r, "--tp"));
        for (std::size_t i = 0; i < t.flat_size(); ++i) {
          counted[i] += L.counted[i];
          held[i] += L.held[i];
          if (L.counted[i]) {
            EXPECT_TRUE(L.held[i]);
          }
        }
      }
      for (const model::ParamTensor& p : t.tensors()) {
        int split = -1;
        for (std::size_t i = p.offset; i < p.offset + p.count; ++i) {
          ASSERT_EQ(counted[i], 1) << p.name << " element " << i - p.offset << " at TP " << tp;
          const int kind = held[i] == 1 ? 1 : 0;  // held once: a slice; by all: replicated
          ASSERT_TRUE(held[i] == 1 || held[i] == tp) << p.name;
          if (split < 0) split = kind;
          EXPECT_EQ(kind, split) << p.name << ": a tensor is split or replicated, not both";
        }
        bool replicated = false;  // Megatron's: LayerNorms, the position table, the row-parallel biases
        for (const char* r : {"norm", "ln_", "pos_embedding", "wpe", "out_proj.bias", "attn.proj.bias", "ff.2.bias",
                              "mlp.proj.bias"})
          replicated = replicated || p.name.find(r) != std::string::npos;
        const bool want_split = !replicated;
        EXPECT_EQ(split == 1, want_split) << p.name;
      }
    }
}

// The GPU model's strided runs (model/tp_slice_runs.h) hold exactly the plan's slices: expanded
// over the flat buffer they are the layout's `sliced` elements, each once, and a block's packed
// runs are the GEMM operands' row-major order (QKV's q | k | v rows, then the columns row by row).
TEST(TensorParallelPlan, SliceRunsAreTheLayoutsSlices) {
  for (model::Arch arch : {model::Arch::Simple, model::Arch::Gpt2})
    for (int tp : {1, 2, 4}) {
      model::ModelDims d{16, 2, 4, 20, 6};
      d.arch = arch;
      d.padded_vocab = 24;
      model::TransformerParams t(d);
      for (int r = 0; r < tp; ++r) {
        const model::TpSlice s = parallel::make_tp_slice(d, tp, r, "--tp");
        const parallel::TpLayout L = parallel::make_tp_layout(t, s);
        std::vector<int> hit(t.flat_size(), 0);
        for (const auto& [idx, run] : model::tp_sliced_runs(t, s)) {
          const model::ParamTensor& p = t.tensor(idx);
          ASSERT_GE(run.pitch, run.width) << p.name;
          ASSERT_LE(run.offset + (run.height - 1) * run.pitch + run.width, p.count) << p.name << ": past the tensor";
          for (std::size_t y = 0; y < run.height; ++y)
            for (std::size_t x = 0; x < run.width; ++x) ++hit[p.offset + run.offset + y * run.pitch + x];
        }
        std::vector<unsigned char> sliced(t.flat_size(), 0);
        for (const parallel::Range& g : L.sliced)
          for (std::size_t i = g.begin; i < g.end; ++i) sliced[i] = 1;
        for (std::size_t i = 0; i < t.flat_size(); ++i)
          ASSERT_EQ(hit[i], int(sliced[i])) << "element " << i << " at TP " << tp << " rank " << r;
        // A block's runs in packed order: element (row n, column k) of the packed [N, K] operand.
        const model::TpBlockRuns b = model::tp_block_runs(d, s);
        const std::size_t h = 16, D = 4, hl = std::size_t(s.head_end - s.head_begin) * D;
        const std::size_t F = std::size_t(d.ffn()), fl = std::size_t(s.ffn_end - s.ffn_begin);
        EXPECT_EQ(b.qkv_w.count(), 3 * hl * h);
        for (std::size_t part = 0; part < 3; ++part)  // packed row part * hl + j is W row part * h + q0 + j
          EXPECT_EQ(b.qkv_w.offset + part * b.qkv_w.pitch, (part * h + std::size_t(s.head_begin) * D) * h);
        EXPECT_EQ(b.out_proj_w.count(), h * hl);
        EXPECT_EQ(b.ff2_w.count(), h * fl);
        EXPECT_EQ(b.ff2_w.pitch, F);
        EXPECT_EQ(b.ff0_w.count(), fl * h);
      }
    }
}

TEST(DominoTimeline, OnePieceIsSerialTwoPiecesOverlap) {
  parallel::PassSegments s{{1, 2, 1, 3, 1}, {2, 1, 2, 1}};
  const parallel::OverlapEstimate one = parallel::model_overlap(s, 1);
  EXPECT_DOUBLE_EQ(one.serial_s, 14);
  EXPECT_DOUBLE_EQ(one.overlapped_s, 14);
  EXPECT_DOUBLE_EQ(one.hidden_fraction(), 0);
  // Unit segments, 2 pieces: compute ends 1 2 3 4, all-reduces end 2 3 4 5, the last compute 6.
  parallel::PassSegments u{{1, 1, 1, 1, 1}, {1, 1, 1, 1}};
  const parallel::OverlapEstimate two = parallel::model_overlap(u, 2);
  EXPECT_DOUBLE_EQ(two.serial_s, 9);
  EXPECT_DOUBLE_EQ(two.overlapped_s, 6);
  EXPECT_DOUBLE_EQ(two.hidden_fraction(), 0.75);
  EXPECT_NE(test::error_of([] { parallel::model_overlap({{1, 1}, {1, 1}}, 2); }).find("expected one more"),
            std::string::npos);
  EXPECT_NE(parallel::describe_overlap(two, 2).find("75.0% of the communication hidden"), std::string::npos);
}

// ---- forked ranks over the host communicator ----


// body(world communicator) on `world` forked ranks; each rank's error message ("" when it passed).
std::vector<std::string> run_ranks(int world, const std::function<void(std::shared_ptr<comm::Communicator>)>& body) {
  return test::fork_ranks(world, [&](int rank, int port) {
    comm::LaunchEnv e;
    e.rank = rank;
    e.world_size = world;
    e.master_port = port;
    body(comm::create_host_communicator(e));
  });
}


// The same draw on every rank: each rank's input is a function of (seed, rank).
std::vector<float> rank_values(std::uint64_t seed, int rank, std::size_t n) {
  std::mt19937_64 g(seed * 1000 + std::uint64_t(rank));
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

TEST(GroupCommunicator, TwoGroupsAtOnce) {
  const std::uint64_t seed = test::fresh_rng()();
  test::expect_all_ok(run_ranks(4, [seed](std::shared_ptr<comm::Communicator> world) {
    // Groups {0, 2} and {1, 3} (a tp index's replicas), collectives running concurrently.
    const int me = world->rank();
    const std::vector<int> members = me % 2 ? std::vector<int>{1, 3} : std::vector<int>{0, 2};
    auto g = parallel::make_group_communicator(world, members);
    CUTRAIN_CHECK(g->world_size() == 2 && g->rank() == me / 2, "group rank ", g->rank());
    const std::size_t n = 1001;  // odd
    std::vector<float> a = rank_values(seed, me, n), ref(n);
    const std::vector<float> a0 = rank_values(seed, members[0], n), a1 = rank_values(seed, members[1], n);
    for (std::size_t i = 0; i < n; ++i) ref[i] = float(double(a0[i]) + double(a1[i]));
    g->all_reduce(a.data(), n, DType::F32, comm::ReduceOp::Sum, nullptr);
    CUTRAIN_CHECK(a == ref, "all_reduce sum differs");
    std::vector<float> b = rank_values(seed, me, 2 * n), rs(n, -1.f);
    g->reduce_scatter(b.data(), rs.data(), n, DType::F32, comm::ReduceOp::Avg, nullptr);
    const std::vector<float> b0 = rank_values(seed, members[0], 2 * n), b1 = rank_values(seed, members[1], 2 * n);
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t k = std::size_t(g->rank()) * n + i;
      CUTRAIN_CHECK(rs[i] == float((double(b0[k]) + double(b1[k])) / 2), "reduce_scatter avg at ", i);
    }
    std::vector<float> ag(2 * n, -1.f);
    const std::vector<float> mine = rank_values(seed, me, n);
    g->all_gather(mine.data(), ag.data(), n, DType::F32, nullptr);
    for (std::size_t i = 0; i < n; ++i) CUTRAIN_CHECK(ag[i] == a0[i] && ag[n + i] == a1[i], "all_gather at ", i);
    std::vector<std::int32_t> t2{me * 10, me * 10 + 1}, t2r(2, -1);
    g->all_to_all(t2.data(), t2r.data(), 1, DType::I32, nullptr);
    CUTRAIN_CHECK(t2r[0] == members[0] * 10 + g->rank() && t2r[1] == members[1] * 10 + g->rank(), "all_to_all");
    std::vector<float> bc = rank_values(seed, me, 7);
    g->broadcast(bc.data(), 7, DType::F32, 1, nullptr);
    CUTRAIN_CHECK(bc == rank_values(seed, members[1], 7), "broadcast from group rank 1");
    parallel::CommTpReducer red(std::shared_ptr<comm::Communicator>(std::move(g)), 1);
    std::vector<double> s{double(me), -double(me)}, m{double(me), -double(me)};
    red.sum(s.data(), 2);
    red.max(m.data(), 2);
    CUTRAIN_CHECK(s[0] == members[0] + members[1] && m[0] == members[1] && m[1] == -members[0], "reducer");
  }));
}

// The reference model's tensor-parallel spans against the single model, fp64, on `tp` forked ranks.
void check_model(model::Arch arch, int tp, int pieces) {
  const std::uint64_t seed = test::fresh_rng()();
  test::expect_all_ok(run_ranks(tp, [=](std::shared_ptr<comm::Communicator> world) {
    model::ModelDims d{16, 2, 4, 19, 5};
    d.arch = arch;
    d.padded_vocab = 20;  // a padded row in the last slice
    model::TransformerParams table(d);
    std::vector<float> init(table.flat_size());
    table.init(init.data(), seed);
    std::mt19937_64 g(seed);
    const int B = 2, S = 5;
    auto tok = test::random_ints(B * S, g, 0, d.vocab - 1);
    auto lab = test::random_ints(B * S, g, 0, d.vocab - 1);
    lab[3] = -100;
    std::vector<double> p(init.begin(), init.end());
    model::ReferenceModel<double> full(table, /*causal=*/true);
    const double loss = full.forward(p.data(), tok.data(), lab.data(), B, S);
    std::vector<double> gfull(p.size(), 0.0);
    full.backward(p.data(), gfull.data(), 0.5);

    auto grp = std::shared_ptr<comm::Communicator>(parallel::make_group_communicator(world, [&] {
      std::vector<int> m;
      for (int r = 0; r < tp; ++r) m.push_back(r);
      return m;
    }()));
    parallel::CommTpReducer red(grp, pieces);
    model::TpSlice s = parallel::make_tp_slice(d, tp, grp->rank(), "--tp");
    s.pieces = pieces;
    s.reducer = &red;
    const parallel::TpLayout L = parallel::make_tp_layout(table, s);
    std::vector<double> pm = p;  // the other ranks' slices zero, as the backend keeps them
    for (std::size_t i = 0; i < pm.size(); ++i)
      if (!L.held[i]) pm[i] = 0;
    model::ReferenceModel<double> part(table, true);
    part.set_tensor_parallel(s);
    const double ltp = part.forward(pm.data(), tok.data(), lab.data(), B, S);
    CUTRAIN_CHECK(std::abs(ltp - loss) <= 1e-12 * std::abs(loss), "loss ", ltp, " against ", loss);
    std::vector<double> gtp(p.size(), 0.0);
    part.backward(pm.data(), gtp.data(), 0.5);
    for (std::size_t i = 0; i < gtp.size(); ++i) {
      CUTRAIN_CHECK(L.held[i] || gtp[i] == 0.0, "a gradient outside this rank's slices at ", i);
      if (!L.counted[i]) gtp[i] = 0;
    }
    grp->all_reduce_sum_f64(gtp.data(), gtp.size(), nullptr);
    double num = 0, den = 0;
    for (std::size_t i = 0; i < gtp.size(); ++i) {
      num += (gtp[i] - gfull[i]) * (gtp[i] - gfull[i]);
      den += gfull[i] * gfull[i];
    }
    CUTRAIN_CHECK(std::sqrt(num / den) <= 1e-12, "gradients: relative error ", std::sqrt(num / den));

    // A pipeline's two spans: [embedding, block 0] and [block 1, head].
    model::ReferenceModel<double> a(table, true), b(table, true);
    a.set_tensor_parallel(s);
    b.set_tensor_parallel(s);
    std::vector<double> x, dx;
    a.forward_span(pm.data(), {true, 0, 1, false}, tok.data(), nullptr, nullptr, B, S, &x);
    const double l2 = b.forward_span(pm.data(), {false, 1, 2, true}, nullptr, lab.data(), x.data(), B, S, nullptr);
    CUTRAIN_CHECK(std::abs(l2 - loss) <= 1e-12 * std::abs(loss), "spans' loss ", l2, " against ", loss);
    std::vector<double> g2(p.size(), 0.0);
    b.backward_span(pm.data(), g2.data(), nullptr, 0.5, &dx);
    a.backward_span(pm.data(), g2.data(), dx.data(), 0.5, nullptr);
    double n2 = 0, d2 = 0;
    std::vector<double> gs(g2);
    for (std::size_t i = 0; i < gs.size(); ++i)
      if (!L.counted[i]) gs[i] = 0;
    grp->all_reduce_sum_f64(gs.data(), gs.size(), nullptr);
    for (std::size_t i = 0; i < gs.size(); ++i) {
      n2 += (gs[i] - gfull[i]) * (gs[i] - gfull[i]);
      d2 += gfull[i] * gfull[i];
    }
    CUTRAIN_CHECK(std::sqrt(n2 / d2) <= 1e-12, "spans' gradients: relative error ", std::sqrt(n2 / d2));
  }));
}

TEST(ReferenceTensorParallel, SimpleTp2) { check_model(model::Arch::Simple, 2, 1); }
TEST(ReferenceTensorParallel, SimpleTp4Domino2) { check_model(model::Arch::Simple, 4, 2); }
TEST(ReferenceTensorParallel, Gpt2Tp2Domino2) { check_model(model::Arch::Gpt2, 2, 2); }
TEST(ReferenceTensorParallel, Gpt2Tp4) { check_model(model::Arch::Gpt2, 4, 1); }

}  // namespace
