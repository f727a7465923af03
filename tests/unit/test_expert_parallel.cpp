// Expert parallelism's pure parts and its computation: the groups of
// parallel/expert_parallel_plan.h (every rank in one expert-parallel and one expert-data-parallel
// group, meeting only in itself; the errors naming the flag), the experts each member holds (they
// tile each layer), the flat layout (dense and every member's experts cover the model once; each
// expert tensor lies in its owner's ranges), packing and the packed decay runs, resolve_moe's
// ep_size; and the MoE layer's reference with its all-to-all over forked ranks of the host
// communicator (ep 2 and 4, top-1 and top-2, dropping or not, PR-MoE's residual) against the same
// layer without expert parallelism on each rank's tokens: output, aux loss and input gradient
// equal, the replicated tensors' gradients equal, each held expert's gradient the sum over the
// group's tokens, the other experts' zero.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "model/moe_reference.h"
#include "parallel/expert_parallel_plan.h"
#include "parallel/group_communicator.h"
#include "parallel/moe_all_to_all.h"
#include "runtime/comm/host_communicator.h"
#include "runtime/error.h"
#include "tests/support/fork_ranks.h"
#include "tests/support/test_support.h"
#include "train/moe_options.h"

using namespace cutrain;

namespace {


const char* kFlag = "--moe_expert_parallel_size";

TEST(MoeExpertParallelPlan, GroupsAsDeepSpeed) {
  for (int world : {1, 2, 4, 6, 8})
    for (int ep : {1, 2, 3, 4, 8}) {
      if (world % ep) continue;
      const parallel::ExpertParallelGroups g = parallel::make_expert_parallel_groups(world, ep, kFlag);
      std::vector<int> in_ep(std::size_t(world), 0), in_dp(std::size_t(world), 0);
      for (int r = 0; r < world; ++r) {
        const std::vector<int> eg = g.ep_group(r), dg = g.expert_dp_group(r);
        ASSERT_EQ(int(eg.size()), ep);
        ASSERT_EQ(int(dg.size()), world / ep);
        EXPECT_EQ(eg[std::size_t(g.ep_rank(r))], r);  // the member index is the group position
        for (int i = 1; i < ep; ++i) EXPECT_EQ(eg[std::size_t(i)], eg[0] + i);  // consecutive ranks
        for (int m : dg) EXPECT_EQ(g.ep_rank(m), g.ep_rank(r));                // the same experts
        int common = 0;
        for (int a : eg)
          for (int b : dg)
            if (a == b) {
              EXPECT_EQ(a, r);
              ++common;
            }
        EXPECT_EQ(common, 1);
        for (int m : eg) in_ep[std::size_t(m)] += m == r;
        for (int m : dg) in_dp[std::size_t(m)] += m == r;
      }
      for (int r = 0; r < world; ++r) EXPECT_EQ(in_ep[std::size_t(r)] + in_dp[std::size_t(r)], 2);
    }
  // DeepSpeed's example: world 8, ep 2: ep groups {0,1}, {2,3}, ...; expert-dp {0,2,4,6}, {1,3,5,7}.
  const auto g = parallel::make_expert_parallel_groups(8, 2, kFlag);
  EXPECT_EQ(g.ep_group(5), (std::vector<int>{4, 5}));
  EXPECT_EQ(g.expert_dp_group(5), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_NE(test::error_of([] { parallel::make_expert_parallel_groups(6, 4, kFlag); })
                .find("--moe_expert_parallel_size 4 does not divide the data-parallel world size 6"),
            std::string::npos);
  EXPECT_NE(test::error_of([] { parallel::make_expert_parallel_groups(2, 0, kFlag); }).find("must be >= 1, got 0"),
            std::string::npos);
}

TEST(MoeExpertParallelPlan, OwnedExpertsTile) {
  for (int E : {2, 4, 8, 12, 64})
    for (int ep : {1, 2, 4}) {
      if (E % ep) continue;
      int next = 0;
      for (int r = 0; r < ep; ++r) {
        const parallel::ExpertSpan s = parallel::owned_experts(E, ep, r, kFlag);
        EXPECT_EQ(s.begin, next);
        EXPECT_EQ(s.end - s.begin, E / ep);
        next = s.end;
      }
      EXPECT_EQ(next, E);
    }
  EXPECT_NE(test::error_of([] { parallel::owned_experts(6, 4, 0, kFlag); }).find("4 does not divide a MoE block's 6 experts"),
            std::string::npos);
}

model::ModelDims moe_model(model::Arch arch, bool residual) {
  model::ModelDims d{16, 3, 2, 13, 6};
  d.arch = arch;
  d.moe.experts = {2, 0, 4};  // a pyramid
  d.moe.use_residual = residual;
  d.moe.min_capacity = 1;
  return d;
}

TEST(MoeExpertParallelPlan, LayoutCoversTheModelOnce) {
  for (model::Arch arch : {model::Arch::Simple, model::Arch::Gpt2})
    for (bool residual : {false, true})
      for (int ep : {1, 2}) {
        const model::TransformerParams table(moe_model(arch, residual));
        const parallel::ExpertParallelLayout lay = parallel::make_expert_parallel_layout(table, ep, kFlag);
        std::vector<int> owner(table.flat_size(), -2);  // -1 dense, r: member r's experts
        auto mark = [&](const std::vector<parallel::Range>& rs, int who) {
          std::size_t last = 0;
          for (const parallel::Range& r : rs) {
            EXPECT_GE(r.begin, last);  // sorted
            last = r.end;
            for (std::size_t i = r.begin; i < r.end; ++i) {
              EXPECT_EQ(owner[i], -2) << "element " << i << " in two sets";
              owner[i] = who;
            }
          }
        };
        mark(lay.dense, -1);
        for (int r = 0; r < ep; ++r) mark(lay.experts[std::size_t(r)], r);
        for (std::size_t i = 0; i < owner.size(); ++i) ASSERT_NE(owner[i], -2) << "element " << i << " in no set";
        EXPECT_EQ(lay.expert_elems(0), lay.expert_elems(ep - 1));
        // Every expert tensor (DeepSpeed's name) lies in its owner's ranges; every other tensor is dense.
        for (const model::ParamTensor& t : table.tensors()) {
          std::size_t n = 1;
          for (auto s : t.shape) n *= std::size_t(s);
          int want = -1;
          const std::string key = "deepspeed_experts.";
          const auto at = t.name.find(key);
          if (at != std::string::npos) {
            const int e = std::stoi(t.name.substr(at + key.size()));
            const int layer_experts = t.name.find(arch == model::Arch::Gpt2 ? "h.0." : "layers.0.") == 0 ? 2 : 4;
            want = e / (layer_experts / ep);
          }
          for (std::size_t i = t.offset; i < t.offset + n; ++i) ASSERT_EQ(owner[i], want) << t.name;
        }
      }
  const model::TransformerParams table(moe_model(model::Arch::Simple, false));
  EXPECT_NE(test::error_of([&] { parallel::make_expert_parallel_layout(table, 4, kFlag); })
                .find("--moe_expert_parallel_size 4 does not divide a MoE block's 2 experts"),
            std::string::npos);
}

TEST(MoeExpertParallelPlan, PackingAndDecayRuns) {
  const std::vector<parallel::Range> rs{{2, 5}, {7, 8}, {10, 13}};
  std::vector<float> flat(14);
  for (std::size_t i = 0; i < flat.size(); ++i) flat[i] = float(i);
  std::vector<float> packed(7, -1.f), back(14, -1.f);
  parallel::pack_ranges(rs, flat.data(), packed.data());
  EXPECT_EQ(packed, (std::vector<float>{2, 3, 4, 7, 10, 11, 12}));
  parallel::unpack_ranges(rs, packed.data(), back.data());
  for (std::size_t i = 0; i < 14; ++i) EXPECT_EQ(back[i], (i >= 2 && i < 5) || i == 7 || (i >= 10 && i < 13) ? float(i) : -1.f);
  const std::vector<model::DecayRun> runs{{0, 4, true}, {4, 11, false}, {11, 14, true}};
  const auto p = parallel::packed_decay_runs(rs, runs);
  ASSERT_EQ(p.size(), 3u);  // [0,2) decay, [2,5) none (4, 7, 10 merged), [5,7) decay
  EXPECT_EQ(p[0].begin, 0u); EXPECT_EQ(p[0].end, 2u); EXPECT_TRUE(p[0].decay);
  EXPECT_EQ(p[1].begin, 2u); EXPECT_EQ(p[1].end, 5u); EXPECT_FALSE(p[1].decay);
  EXPECT_EQ(p[2].begin, 5u); EXPECT_EQ(p[2].end, 7u); EXPECT_TRUE(p[2].decay);
}

TEST(MoeExpertParallelPlan, ResolveMoeKeepsEpSize) {
  train::MoeOptions o;
  o.num_experts = {4};
  o.expert_parallel_size = 2;
  EXPECT_EQ(train::resolve_moe(o, 2, 16).ep_size, 2);
  EXPECT_NE(train::describe_moe(train::resolve_moe(o, 2, 16)).find("ep_size 2"), std::string::npos);
  EXPECT_EQ(train::moe_config_json(train::resolve_moe(o, 2, 16))["ep_size"], 1);  // saved experts are whole
  o.expert_parallel_size = 3;
  EXPECT_NE(test::error_of([&] { train::resolve_moe(o, 2, 16); }).find("--moe_expert_parallel_size 3 does not divide --num_experts 4"),
            std::string::npos);
}

// ---- the layer's exchange on forked ranks over the host communicator ----

std::vector<std::string> run_ranks(int world, const std::function<void(std::shared_ptr<comm::Communicator>)>& body) {
  return test::fork_ranks(world, [&](int rank, int port) {
    comm::LaunchEnv e;
    e.rank = rank;
    e.world_size = world;
    e.master_port = port;
    body(comm::create_host_communicator(e));
  });
}

std::vector<double> draw(std::uint64_t seed, std::size_t n, double scale) {
  std::mt19937_64 g(seed);
  std::normal_distribution<double> d(0.0, scale);
  std::vector<double> v(n);
  for (double& x : v) x = d(g);
  return v;
}

double rel(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

struct LayerCase {
  int world, ep, k;
  bool drop, residual;
};

// One member's check: its layer over the exchange against the layer without it on the same tokens;
// the held experts' gradients against the sum over its expert-parallel group's tokens.
void check_member(std::shared_ptr<comm::Communicator> world, const LayerCase& lc, const model::MoeConfig& c, int T,
                  const std::vector<double>& params, std::uint64_t seed) {
  const int me = world->rank(), H = c.hidden;
  const parallel::ExpertParallelGroups g = parallel::make_expert_parallel_groups(lc.world, lc.ep, kFlag);
  auto ep_comm = std::shared_ptr<comm::Communicator>(parallel::make_group_communicator(world, g.ep_group(me)));
  parallel::CommMoeExchange ex(ep_comm);
  const parallel::ExpertSpan own = parallel::owned_experts(c.experts, lc.ep, g.ep_rank(me), kFlag);
  const model::MoeParamLayout L = model::moe_param_layout(c);
  const std::size_t per = std::size_t(c.ffn) * c.hidden;
  auto held = [&](std::size_t i) {  // is params[i] one of this member's expert weights (or not an expert's)?
    for (std::size_t base : {L.w1, L.w2})
      if (i >= base && i < base + std::size_t(c.experts) * per) {
        const int e = int((i - base) / per);
        return e >= own.begin && e < own.end ? 1 : 0;
      }
    return -1;
  };
  // This rank's params: the others' experts poisoned (the exchanged layer must not read them).
  std::vector<double> mine = params;
  for (std::size_t i = 0; i < mine.size(); ++i)
    if (held(i) == 0) mine[i] = std::nan("");
  auto tokens = [&](int rank) { return draw(seed * 131 + std::uint64_t(rank), std::size_t(T) * H, 1.0); };
  auto grad_out = [&](int rank) { return draw(seed * 137 + std::uint64_t(rank), std::size_t(T) * H, 1.0); };
  const double aux_grad = 0.3;
  // Expert parallel.
  model::MoeReference epl(c);
  epl.set_exchange(&ex);
  std::vector<double> x = tokens(me), dy = grad_out(me), y(x.size()), dx(x.size()), dp(params.size(), 0.0);
  const double l_aux = epl.forward(mine.data(), x.data(), T, true, y.data());
  epl.backward(mine.data(), dy.data(), aux_grad, dx.data(), dp.data());
  // The single layer on this rank's tokens, and on every group member's for the experts' sums.
  std::vector<double> want_dp_experts(params.size(), 0.0), want_y, want_dx, want_dp;
  double want_aux = 0;
  for (int m : g.ep_group(me)) {
    model::MoeReference one(c);
    std::vector<double> xm = tokens(m), dym = grad_out(m), ym(xm.size()), dxm(xm.size()), dpm(params.size(), 0.0);
    const double a = one.forward(params.data(), xm.data(), T, true, ym.data());
    one.backward(params.data(), dym.data(), aux_grad, dxm.data(), dpm.data());
    for (std::size_t i = 0; i < dpm.size(); ++i) want_dp_experts[i] += dpm[i];
    if (m == me) {
      want_y = ym;
      want_dx = dxm;
      want_dp = dpm;
      want_aux = a;
      CUTRAIN_CHECK(one.capacity() == epl.capacity() && one.dropped() == epl.dropped(), "routing differs");
    }
  }
  CUTRAIN_CHECK(rel(y, want_y) <= 1e-14, "rank ", me, ": output differs by ", rel(y, want_y));
  CUTRAIN_CHECK(std::abs(l_aux - want_aux) <= 1e-14 * std::abs(want_aux), "rank ", me, ": l_aux ", l_aux, " vs ", want_aux);
  CUTRAIN_CHECK(rel(dx, want_dx) <= 1e-14, "rank ", me, ": dx differs by ", rel(dx, want_dx));
  std::vector<double> got_rep, want_rep, got_ex, want_ex;
  for (std::size_t i = 0; i < dp.size(); ++i) {
    const int h = held(i);
    if (h < 0) {
      got_rep.push_back(dp[i]);
      want_rep.push_back(want_dp[i]);
    } else if (h == 1) {
      got_ex.push_back(dp[i]);
      want_ex.push_back(want_dp_experts[i]);
    } else {
      CUTRAIN_CHECK(dp[i] == 0.0, "rank ", me, ": gradient of another member's expert at ", i);
    }
  }
  CUTRAIN_CHECK(rel(got_rep, want_rep) <= 1e-14, "rank ", me, ": replicated gradients differ by ", rel(got_rep, want_rep));
  CUTRAIN_CHECK(rel(got_ex, want_ex) <= 1e-13, "rank ", me, ": expert gradients differ by ", rel(got_ex, want_ex));
  double norm = 0;
  for (double v : got_ex) norm += v * v;
  CUTRAIN_CHECK(norm > 0, "rank ", me, ": its experts got no gradient");
}

TEST(MoeExpertParallelLayer, ExchangeEqualsTheWholeLayer) {
  const std::uint64_t seed = test::fresh_rng()() % 1000000;
  const std::vector<LayerCase> cases{{2, 2, 1, true, false}, {2, 2, 2, true, false}, {4, 4, 1, true, true},
                                     {4, 2, 2, false, false}, {4, 2, 1, true, true}, {4, 4, 2, true, false}};
  for (const LayerCase& lc : cases) {
    model::MoeConfig c;
    c.hidden = 12;
    c.ffn = 20;
    c.experts = 8;
    c.k = lc.k;
    c.min_capacity = 1;
    c.drop_tokens = lc.drop;
    c.use_residual = lc.residual;
    const int T = 11;  // odd: uneven routes, some dropped under capacity factor 1
    const std::vector<double> params = draw(seed, model::moe_param_layout(c).total, 0.3);
    const auto out = run_ranks(lc.world, [&](std::shared_ptr<comm::Communicator> w) { check_member(w, lc, c, T, params, seed); });
    for (std::size_t r = 0; r < out.size(); ++r)
      EXPECT_EQ(out[r], "") << "rank " << r << " of world " << lc.world << " ep " << lc.ep << " k " << lc.k << " drop "
                            << lc.drop << " residual " << lc.residual << " seed " << seed;
  }
}

}  // namespace
