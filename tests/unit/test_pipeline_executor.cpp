// CPU tests of parallel/pipeline_executor: the program of every held stage set (S <= 8, M <= 12):
// each stage's actions in its 1F1B order, every forward after the previous stage's forward of its
// micro-batch and every backward after the next stage's backward, no slot taken twice, the
// predicted tick count; and "virtual stages" on the reference model: P stages of one process
// running the program on the model's spans with activations handed over as buffers give the whole
// model's losses and gradients (bit for bit for the seed model, within 1e-6 for GPT-2's tied head).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "model/reference_model.h"
#include "parallel/pipeline_executor.h"
#include "runtime/error.h"
#include "tests/support/test_support.h"

using namespace cutrain;
using namespace cutrain::parallel;

TEST(PipelineProgram, EveryStageSetFollowsOneFOneBAndItsInputs) {
  for (int S = 1; S <= 8; ++S)
    for (int M = 1; M <= 12; ++M)
      for (int first = 0; first < S; ++first)
        for (int end = first + 1; end <= S; ++end) {
          const std::vector<StageStep> p = pipeline_program(S, first, end, M);
          ASSERT_EQ(p.size(), std::size_t(end - first) * 2 * M);
          std::map<std::pair<int, int>, std::size_t> fwd, bwd;  // (stage, micro) -> position
          std::map<std::pair<int, int>, int> taken;             // (stage, slot) -> micro holding it, -1 free
          std::vector<std::vector<PipeAction>> seen{std::size_t(S)};
          for (std::size_t i = 0; i < p.size(); ++i) {
            const StageStep& a = p[i];
            ASSERT_GE(a.stage, first);
            ASSERT_LT(a.stage, end);
            ASSERT_GE(a.slot, 0);
            ASSERT_LT(a.slot, pipeline_slots(a.stage, S, M));
            seen[std::size_t(a.stage)].push_back({a.kind, a.micro});
            const auto key = std::make_pair(a.stage, a.slot);
            if (a.kind == PipeAction::Forward) {
              if (a.stage > first) ASSERT_TRUE(fwd.count({a.stage - 1, a.micro})) << describe_program(p);
              ASSERT_TRUE(!taken.count(key) || taken[key] < 0) << "slot taken: " << describe_program(p);
              taken[key] = a.micro;
              fwd[{a.stage, a.micro}] = i;
            } else {
              if (a.stage + 1 < end) ASSERT_TRUE(bwd.count({a.stage + 1, a.micro})) << describe_program(p);
              ASSERT_TRUE(fwd.count({a.stage, a.micro}));
              ASSERT_EQ(taken[key], a.micro);
              taken[key] = -1;
              bwd[{a.stage, a.micro}] = i;
            }
          }
          for (int s = first; s < end; ++s) ASSERT_EQ(seen[std::size_t(s)], one_f_one_b(s, S, M));
        }
}

TEST(PipelineProgram, OneHeldStageIsItsOneFOneBAndAllStagesTakeTheBubble) {
  const std::vector<StageStep> one = pipeline_program(4, 2, 3, 6);
  const std::vector<PipeAction> expect = one_f_one_b(2, 4, 6);
  ASSERT_EQ(one.size(), expect.size());
  for (std::size_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(one[i].kind, expect[i].kind);
    EXPECT_EQ(one[i].micro, expect[i].micro);
    EXPECT_EQ(one[i].slot, expect[i].micro % 2);
  }
  // A single stage: the plain engine's order, forward and backward of each micro-batch in turn.
  EXPECT_EQ(describe_program(pipeline_program(1, 0, 1, 3)), "s0F0 s0B0 s0F1 s0B1 s0F2 s0B2");
  EXPECT_EQ(describe_program(pipeline_program(2, 0, 2, 2)), "s0F0 s0F1 s1F0 s1B0 s0B0 s1F1 s1B1 s0B1");
  EXPECT_EQ(pipeline_slots(0, 4, 2), 2);
  EXPECT_EQ(pipeline_slots(0, 4, 8), 4);
  EXPECT_EQ(pipeline_slots(3, 4, 8), 1);
}

TEST(PipelineProgram, BadInputIsRefused) {
  EXPECT_THROW(pipeline_program(4, 2, 2, 3), Error);
  EXPECT_THROW(pipeline_program(4, 0, 5, 3), Error);
  EXPECT_THROW(pipeline_program(4, 0, 4, 0), Error);
  EXPECT_THROW(pipeline_slots(4, 4, 1), Error);
  EXPECT_NE(test::error_of([] { pipeline_program(0, 0, 1, 1); }).find("non-empty range"), std::string::npos);
}

namespace {
// The model's layer sequence [first, end) (0 the embedding, 1 + l block l, L + 1 the head) as a span.
model::LayerSpan span_of(const PipelineStage& st, int L) {
  return model::LayerSpan{st.first == 0, std::max(st.first, 1) - 1, std::min(st.end, L + 1) - 1, st.end == L + 2};
}
}  // namespace

class VirtualStagesReference : public ::testing::TestWithParam<std::tuple<model::Arch, int, int>> {};
INSTANTIATE_TEST_SUITE_P(ArchStagesMicro, VirtualStagesReference,
                         ::testing::Combine(::testing::Values(model::Arch::Simple, model::Arch::Gpt2),
                                            ::testing::Values(2, 3, 5), ::testing::Values(1, 4, 7)));
TEST_P(VirtualStagesReference, EqualTheWholeModel) {
  const auto [arch, P, M] = GetParam();
  auto rng = test::fresh_rng();
  model::ModelDims d{16, 4, 2, 13, 6};
  d.arch = arch;
  model::TransformerParams table(d);
  std::vector<float> params(table.flat_size());
  table.init(params.data(), rng());
  const int B = 2, S = 5, per = B * S, h = d.hidden;
  const auto tok = test::random_ints(std::size_t(M) * per, rng, 0, d.vocab - 1);
  const auto lab = test::random_ints(std::size_t(M) * per, rng, 0, d.vocab - 1);

  // The plain engine's order: each micro-batch's forward and backward, gradients accumulated.
  std::vector<float> g_whole(table.flat_size(), 0.f);
  std::vector<double> loss_whole(std::size_t(M), 0.0);
  model::ReferenceModel<float> whole(table, true);
  for (int m = 0; m < M; ++m) {
    loss_whole[std::size_t(m)] = whole.forward(params.data(), tok.data() + m * per, lab.data() + m * per, B, S);
    whole.backward(params.data(), g_whole.data(), 1.0 / M);
  }

  const PipelinePlan plan = make_pipeline_plan(pipeline_layers(table), parse_partition_method("uniform"), P, M);
  std::vector<std::vector<model::ReferenceModel<float>>> models{std::size_t(P)};
  for (int s = 0; s < P; ++s)
    for (int k = 0; k < pipeline_slots(s, P, M); ++k) models[std::size_t(s)].emplace_back(table, true);
  // The hand-over buffers: stage s's output (and its input's gradient) per micro-batch.
  std::vector<std::vector<float>> act(std::size_t(P) * M), grad(std::size_t(P) * M);
  std::vector<double> loss_pipe(std::size_t(M), -1);
  std::vector<float> g_pipe(table.flat_size(), 0.f);
  for (const StageStep& a : pipeline_program(P, 0, P, M)) {
    const model::LayerSpan span = span_of(plan.parts[std::size_t(a.stage)], d.layers);
    model::ReferenceModel<float>& mdl = models[std::size_t(a.stage)][std::size_t(a.slot)];
    const std::size_t here = std::size_t(a.stage) * M + a.micro, before = here - M;
    if (a.kind == PipeAction::Forward) {
      const double l = mdl.forward_span(params.data(), span, tok.data() + a.micro * per, lab.data() + a.micro * per,
                                        span.embedding ? nullptr : act[before].data(), B, S,
                                        span.head ? nullptr : &act[here]);
      if (span.head) loss_pipe[std::size_t(a.micro)] = l;
      if (!span.head) ASSERT_EQ(act[here].size(), std::size_t(per) * h);
    } else {
      const std::size_t after = here + M;
      mdl.backward_span(params.data(), g_pipe.data(), span.head ? nullptr : grad[after].data(), 1.0 / M,
                        span.embedding ? nullptr : &grad[here]);
    }
  }
  for (int m = 0; m < M; ++m) EXPECT_EQ(loss_pipe[std::size_t(m)], loss_whole[std::size_t(m)]) << "micro " << m;
  if (arch == model::Arch::Simple) {
    for (std::size_t i = 0; i < g_whole.size(); ++i) ASSERT_EQ(g_pipe[i], g_whole[i]) << "element " << i;
  } else {
    // GPT-2's tied weight takes the head's and the embedding's shares in the program's order.
    for (std::size_t i = 0; i < g_whole.size(); ++i)
      ASSERT_LE(std::abs(g_pipe[i] - g_whole[i]), 1e-6 * std::max(1.f, std::abs(g_whole[i]))) << "element " << i;
  }
}
