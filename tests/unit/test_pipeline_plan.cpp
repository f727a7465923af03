// CPU tests of parallel/pipeline_plan: the balanced partition against brute force on random
// weights, DeepSpeed's uniform split, partition_method's forms and errors, the plan of a real
// parameter table (each method, empty stages refused), and the 1F1B schedule: every micro-batch
// once each way, forward before backward, at most S - s alive, and a tick-by-tick run of all
// stages that finishes with the predicted bubble fraction.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>

#include "parallel/pipeline_plan.h"
#include "runtime/error.h"
#include "tests/support/test_support.h"

using namespace cutrain;
using namespace cutrain::parallel;

namespace {
std::size_t part_sum(const std::vector<std::size_t>& w, int a, int b) {
  std::size_t s = 0;
  for (int i = a; i < b; ++i) s += w[std::size_t(i)];
  return s;
}
// Every split of n items into `parts` non-empty runs: (largest, smallest) of the best.
std::pair<std::size_t, std::size_t> brute(const std::vector<std::size_t>& w, int parts) {
  const int n = int(w.size());
  std::size_t best_max = SIZE_MAX, best_min = 0;
  std::vector<int> b(std::size_t(parts) + 1);
  std::function<void(int, int)> go = [&](int k, int start) {
    if (k == parts - 1) {
      b[std::size_t(k)] = start;
      b[std::size_t(parts)] = n;
      if (start >= n) return;
      std::size_t mx = 0, mn = SIZE_MAX;
      for (int p = 0; p < parts; ++p) {
        const std::size_t s = part_sum(w, b[std::size_t(p)], b[std::size_t(p) + 1]);
        mx = std::max(mx, s);
        mn = std::min(mn, s);
      }
      if (mx < best_max || (mx == best_max && mn > best_min)) best_max = mx, best_min = mn;
      return;
    }
    b[std::size_t(k)] = start;
    for (int e = start + 1; e < n; ++e) go(k + 1, e);
  };
  go(0, 0);
  return {best_max, best_min};
}
std::vector<PipelineLayer> layers_of(const std::vector<std::string>& types) {
  std::vector<PipelineLayer> v;
  for (const auto& t : types) v.push_back({t, 10});
  return v;
}
}  // namespace

TEST(PipelinePartition, BalancedMatchesBruteForceOnRandomWeights) {
  auto rng = test::fresh_rng();
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + int(rng() % 9), parts = 1 + int(rng() % std::uint64_t(n));
    std::vector<std::size_t> w(static_cast<std::size_t>(n));
    for (auto& x : w) x = rng() % 4 == 0 ? 0 : rng() % 1000;
    const std::vector<int> b = partition_balanced(w, parts);
    ASSERT_EQ(b.size(), std::size_t(parts) + 1);
    ASSERT_EQ(b.front(), 0);
    ASSERT_EQ(b.back(), n);
    std::size_t mx = 0, mn = SIZE_MAX;
    for (int p = 0; p < parts; ++p) {
      ASSERT_LT(b[std::size_t(p)], b[std::size_t(p) + 1]) << "empty part " << p;
      const std::size_t s = part_sum(w, b[std::size_t(p)], b[std::size_t(p) + 1]);
      mx = std::max(mx, s);
      mn = std::min(mn, s);
    }
    const auto [bm, bn] = brute(w, parts);
    EXPECT_EQ(mx, bm) << "n " << n << " parts " << parts;
    EXPECT_EQ(mn, bn) << "n " << n << " parts " << parts;
  }
  EXPECT_THROW(partition_balanced({1, 2}, 3), Error);
}

TEST(PipelinePartition, UniformAsDeepSpeed) {
  EXPECT_EQ(partition_uniform(10, 4), (std::vector<int>{0, 3, 6, 8, 10}));
  EXPECT_EQ(partition_uniform(6, 3), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(partition_uniform(5, 5), (std::vector<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_THROW(partition_uniform(3, 4), Error);
}

TEST(PipelinePartition, MethodFormsAndErrors) {
  EXPECT_EQ(parse_partition_method("Parameters").kind, PartitionKind::Parameters);
  EXPECT_EQ(parse_partition_method("UNIFORM").kind, PartitionKind::Uniform);
  const PartitionMethod t = parse_partition_method("type:transformer");
  EXPECT_EQ(t.kind, PartitionKind::Type);
  EXPECT_EQ(t.regex, "transformer");
  auto msg = [](const std::string& s) {
    try {
      parse_partition_method(s, "--partition_method");
    } catch (const Error& e) {
      return e.message();
    }
    return std::string("no error");
  };
  EXPECT_NE(msg("balanced").find("--partition_method: expected parameters, uniform or type:REGEX"), std::string::npos);
  EXPECT_NE(msg("type:").find("expected type:REGEX with a REGEX"), std::string::npos);
  EXPECT_NE(msg("type:(").find("does not compile"), std::string::npos);
}

TEST(PipelinePlan, OfARealTableByEachMethod) {
  model::ModelDims d{32, 4, 2, 64, 8};
  const model::TransformerParams table(d);
  const auto layers = pipeline_layers(table);
  ASSERT_EQ(layers.size(), 6u);
  EXPECT_EQ(layers.front().type, "Embedding");
  EXPECT_EQ(layers[1].type, "TransformerBlock");
  EXPECT_EQ(layers.back().type, "OutputHead");
  std::size_t total = 0;
  for (const auto& l : layers) total += l.params;
  EXPECT_EQ(total, table.num_params());

  const PipelinePlan t = make_pipeline_plan(layers, parse_partition_method("type:TransformerBlock"), 4, 8);
  for (int s = 0; s < 4; ++s) EXPECT_EQ(t.parts[std::size_t(s)].weight, 1u) << "stage " << s;
  EXPECT_EQ(t.stage_of_layer(0), 0);
  EXPECT_EQ(t.stage_of_layer(5), 3);
  const PipelinePlan u = make_pipeline_plan(layers, parse_partition_method("uniform"), 4, 8);
  EXPECT_EQ(u.parts[0].end - u.parts[0].first, 2);
  EXPECT_EQ(u.parts[3].end - u.parts[3].first, 1);
  const PipelinePlan p = make_pipeline_plan(layers, parse_partition_method("parameters"), 2, 8);
  std::size_t sum = 0;
  for (const auto& st : p.parts) sum += st.params;
  EXPECT_EQ(sum, total);
  EXPECT_NEAR(t.bubble_fraction(), 3.0 / 11.0, 1e-15);
  const std::string line = t.describe(layers);
  EXPECT_NE(line.find("stage 0 = layers 0-1 (Embedding, TransformerBlock, "), std::string::npos) << line;
  EXPECT_NE(line.find("predicted bubble fraction 0.273 ((S-1)/(M+S-1) = 3/11)"), std::string::npos) << line;

  auto msg = [&](const std::string& m, int stages) {
    try {
      make_pipeline_plan(layers, parse_partition_method(m), stages, 8);
    } catch (const Error& e) {
      return e.message();
    }
    return std::string("no error");
  };
  EXPECT_NE(msg("uniform", 7).find("7 stages for a model of 6 layers"), std::string::npos);
  EXPECT_NE(msg("type:Embedding|OutputHead", 3).find("matches 2 layer(s) for 3 stages"), std::string::npos);
  EXPECT_NE(msg("type:nothing", 1).find("matches 0 layer(s)"), std::string::npos);
}

TEST(OneFOneB, EveryStageAndTheBubble) {
  for (int S = 1; S <= 8; ++S)
    for (int M = 1; M <= 12; ++M) {
      std::vector<std::vector<PipeAction>> sched;
      for (int s = 0; s < S; ++s) {
        auto a = one_f_one_b(s, S, M);
        ASSERT_EQ(a.size(), std::size_t(2 * M));
        int alive = 0, peak = 0, f = 0, b = 0;
        for (const PipeAction& x : a) {
          if (x.kind == PipeAction::Forward) {
            EXPECT_EQ(x.micro, f++);  // in order
            peak = std::max(peak, ++alive);
          } else {
            EXPECT_EQ(x.micro, b++);
            EXPECT_LT(x.micro, f) << "backward before its forward";
            --alive;
          }
        }
        EXPECT_LE(peak, std::min(S - s, M)) << "stage " << s << " of " << S << ", M " << M;
        sched.push_back(a);
      }
      // All stages tick by tick, one action per tick when its inputs were made in an earlier tick:
      // F(m) on s after F(m) on s-1, B(m) on s after B(m) on s+1 (and F(m) on the last stage).
      std::vector<std::vector<int>> fdone(S, std::vector<int>(M, -1)), bdone(S, std::vector<int>(M, -1));
      std::vector<std::size_t> next(S, 0);
      int tick = 0, busy = 0;
      for (; tick < 10 * (M + S) + 10; ++tick) {
        bool all = true;
        std::vector<std::pair<int, PipeAction>> run;
        for (int s = 0; s < S; ++s) {
          if (next[s] == sched[s].size()) continue;
          all = false;
          const PipeAction& x = sched[s][next[s]];
          const bool ready = x.kind == PipeAction::Forward
                                 ? (s == 0 || (fdone[s - 1][x.micro] >= 0 && fdone[s - 1][x.micro] < tick))
                                 : (s == S - 1 ? fdone[s][x.micro] >= 0 && fdone[s][x.micro] < tick
                                               : bdone[s + 1][x.micro] >= 0 && bdone[s + 1][x.micro] < tick);
          if (ready) run.push_back({s, x});
        }
        if (all) break;
        for (auto& [s, x] : run) {
          (x.kind == PipeAction::Forward ? fdone : bdone)[s][x.micro] = tick;
          ++next[s];
          ++busy;
        }
      }
      for (int s = 0; s < S; ++s) ASSERT_EQ(next[s], sched[s].size()) << "stuck: S " << S << " M " << M;
      // Equal forward and backward costs: idle share of S x ticks = (S - 1) / (M + S - 1).
      const double idle = 1.0 - double(busy) / double(S * tick);
      PipelinePlan p;
      p.stages = S;
      p.micro_batches = M;
      EXPECT_NEAR(idle, p.bubble_fraction(), 1e-12) << "S " << S << " M " << M << " ticks " << tick;
    }
}
