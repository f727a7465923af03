// ZeRO's pure logic in the engine: which mode each stage runs in, the partition ranges the
// engine's buffers and optimizer launch use, stage 0's all-reduce ranges, bytes per parameter and
// the start-up memory line.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "model/transformer_params.h"
#include "parallel/zero_comm.h"
#include "parallel/zero_plan.h"
#include "train/precision.h"
#include "train/zero_memory.h"

using namespace cutrain;
using kernels::OptimizerLayout;

TEST(ZeroPlan, ModeOfEachStageWithAndWithoutCommunicator) {
  for (int stage = 0; stage <= 3; ++stage) {
    const parallel::ZeroPlan none = parallel::make_zero_plan(stage, 1000, 1, 0, /*has_comm=*/false);
    EXPECT_EQ(none.mode, parallel::ZeroMode::None) << "stage " << stage << " without a communicator";
    EXPECT_EQ(none.flat_elems(), 1000u);
    EXPECT_EQ(none.state_range().begin, 0u);
    EXPECT_EQ(none.state_range().end, 1000u);
  }
  EXPECT_EQ(parallel::make_zero_plan(0, 1000, 1, 0, true).mode, parallel::ZeroMode::AllReduce);
  EXPECT_EQ(parallel::make_zero_plan(1, 1000, 1, 0, true).mode, parallel::ZeroMode::Partitioned);
  EXPECT_EQ(parallel::make_zero_plan(2, 1000, 4, 3, true).mode, parallel::ZeroMode::Partitioned);
  EXPECT_EQ(parallel::make_zero_plan(3, 1000, 1, 0, true).mode, parallel::ZeroMode::Sharded)
      << "stage 3 at world 1 with a communicator runs the real gather/shard path";
  EXPECT_EQ(parallel::make_zero_plan(3, 1000, 8, 5, true).mode, parallel::ZeroMode::Sharded);
  EXPECT_STREQ(parallel::make_zero_plan(3, 1000, 2, 1, true).mode_name(), "sharded");
}

TEST(ZeroPlan, ShardedHasNoFlatPartitionRanges) {
  // Stage 3's sizes and ranges come from its ShardLayout: the flat-partition accessors refuse.
  const parallel::ZeroPlan z = parallel::make_zero_plan(3, 1000, 2, 0, true);
  EXPECT_THROW(z.flat_elems(), Error);
  EXPECT_THROW(z.state_range(), Error);
  EXPECT_THROW(z.norm_range(), Error);
}

TEST(ZeroPlan, RejectsWhatIsInconsistent) {
  EXPECT_NO_THROW(parallel::make_zero_plan(3, 1000, 2, 0, true)) << "stage 3 at world size 2 is implemented";
  EXPECT_THROW(parallel::make_zero_plan(3, 1000, 2, 0, /*has_comm=*/false), Error);
  EXPECT_THROW(parallel::make_zero_plan(0, 1000, 2, 0, /*has_comm=*/false), Error);
  EXPECT_THROW(parallel::make_zero_plan(4, 1000, 1, 0, true), Error);
  EXPECT_THROW(parallel::make_zero_plan(-1, 1000, 1, 0, true), Error);
  EXPECT_THROW(parallel::make_zero_plan(1, 1000, 2, 2, true), Error);
}

TEST(ZeroPlan, PartitionsTileThePaddedBufferInWholeVectors) {
  for (int world = 1; world <= 17; ++world) {
    for (std::size_t numel : {std::size_t(1), std::size_t(64), std::size_t(1000), std::size_t(12345),
                              std::size_t(1) << 20}) {
      std::size_t next = 0, real = 0;
      for (int r = 0; r < world; ++r) {
        const parallel::ZeroPlan z = parallel::make_zero_plan(1, numel, world, r, true);
        const parallel::Range s = z.state_range();
        EXPECT_EQ(s.begin, next) << "world " << world << " rank " << r << " numel " << numel;
        EXPECT_EQ(s.size(), z.part.per_rank);
        EXPECT_EQ(s.size() % 8, 0u) << "partition of " << s.size() << " elements is not whole 16-byte bf16 vectors";
        EXPECT_EQ((s.begin * 2) % 16, 0u) << "bf16 partition start misaligned";
        EXPECT_EQ((s.begin * 4) % 16, 0u) << "fp32 partition start misaligned";
        const parallel::Range n = z.norm_range();
        EXPECT_LE(n.end, numel);
        if (!n.empty()) {
          EXPECT_EQ(n.begin, s.begin);
          real += n.size();
        }
        next = s.end;
        EXPECT_EQ(z.flat_elems(), z.part.padded_numel);
        EXPECT_EQ(z.flat_elems(), z.part.per_rank * std::size_t(world));
      }
      EXPECT_EQ(next, parallel::make_zero_plan(1, numel, world, 0, true).flat_elems());
      EXPECT_EQ(real, numel) << "the norm ranges must cover every real element exactly once";
    }
  }
}

TEST(ZeroPlan, WorldOneOverTheModelFlatBufferHasNoPadding) {
  // Bit-identity with the single-process engine at world 1 needs the same element counts.
  const model::TransformerParams t(model::ModelDims{128, 2, 2, 1000, 64});
  const parallel::ZeroPlan z = parallel::make_zero_plan(2, t.flat_size(), 1, 0, true);
  EXPECT_EQ(z.flat_elems(), t.flat_size());
  EXPECT_EQ(z.state_elems(), t.flat_size());
  EXPECT_EQ(z.norm_range().size(), t.flat_size());
}

TEST(ZeroPlan, BytesPerParamPerStageAndLayout) {
  const train::PrecisionPlan base = train::plan_for(OptimizerLayout::Baseline, 1);
  const train::PrecisionPlan base_acc = train::plan_for(OptimizerLayout::Baseline, 4);
  const train::PrecisionPlan wg = train::plan_for(OptimizerLayout::Bf16MasterWG, 1);
  const train::PrecisionPlan full = train::plan_for(OptimizerLayout::Bf16Full, 1);
  // Not partitioned: the layout's own figure.
  for (const train::PrecisionPlan* p : {&base, &base_acc, &wg, &full}) {
    EXPECT_DOUBLE_EQ(train::zero_bytes_per_param(*p, parallel::make_zero_plan(0, 1000, 1, 0, false)).total(), double(p->bytes_per_param()))
        << p->name();
    EXPECT_DOUBLE_EQ(train::zero_bytes_per_param(*p, parallel::make_zero_plan(0, 1000, 8, 0, true)).total(), double(p->bytes_per_param()))
        << p->name() << " stage 0 partitions nothing";
  }
  EXPECT_DOUBLE_EQ(train::zero_bytes_per_param(base, parallel::make_zero_plan(1, 1000, 4, 0, true)).total(), 2 + 2 + 12.0 / 4);
  EXPECT_DOUBLE_EQ(train::zero_bytes_per_param(base, parallel::make_zero_plan(2, 1000, 4, 1, true)).total(), 2 + 2 + 12.0 / 4);
  EXPECT_DOUBLE_EQ(train::zero_bytes_per_param(base_acc, parallel::make_zero_plan(1, 1000, 8, 0, true)).total(), 2 + 4 + 12.0 / 8);
  EXPECT_DOUBLE_EQ(train::zero_bytes_per_param(wg, parallel::make_zero_plan(1, 1000, 2, 0, true)).total(), 2 + 2 + 8.0 / 2);
  EXPECT_DOUBLE_EQ(train::zero_bytes_per_param(full, parallel::make_zero_plan(2, 1000, 2, 0, true)).total(), 2 + 2 + 4.0 / 2);
  EXPECT_DOUBLE_EQ(train::zero_bytes_per_param(base, parallel::make_zero_plan(1, 1000, 1, 0, true)).total(), 16.0);
  // Stage 3: params and optimizer state over W; the full gradient buffer stays, plus its shard.
  EXPECT_DOUBLE_EQ(train::zero_bytes_per_param(base, parallel::make_zero_plan(3, 1000, 4, 0, true)).total(), 2.0 / 4 + 2 + 2.0 / 4 + 12.0 / 4);
  EXPECT_DOUBLE_EQ(train::zero_bytes_per_param(base_acc, parallel::make_zero_plan(3, 1000, 8, 0, true)).total(),
                   2.0 / 8 + 4 + 4.0 / 8 + 12.0 / 8);
  EXPECT_DOUBLE_EQ(train::zero_bytes_per_param(full, parallel::make_zero_plan(3, 1000, 2, 1, true)).total(), 1 + 2 + 1 + 2);
  EXPECT_DOUBLE_EQ(train::zero_bytes_per_param(wg, parallel::make_zero_plan(3, 1000, 1, 0, true)).total(), 2 + 2 + 2 + 8.0)
      << "world 1: the shard is a second full-size gradient buffer";
}

TEST(ZeroPlan, CompensationIsTwoBytesPerParamPartitionedLikeTheMoments) {
  for (OptimizerLayout l : {OptimizerLayout::Bf16MasterWG, OptimizerLayout::Bf16Full}) {
    const train::PrecisionPlan plain = train::plan_for(l, 1), comp = train::plan_for(l, 1, true);
    EXPECT_EQ(comp.bytes_per_param(), plain.bytes_per_param() + 2) << comp.label();
    EXPECT_DOUBLE_EQ(train::zero_bytes_per_param(comp, parallel::make_zero_plan(0, 1000, 1, 0, false)).total(),
                     double(comp.bytes_per_param()));
    for (int stage : {1, 2, 3}) {
      const parallel::ZeroPlan z = parallel::make_zero_plan(stage, 1000, 4, 1, true);
      EXPECT_DOUBLE_EQ(train::zero_bytes_per_param(comp, z).total() - train::zero_bytes_per_param(plain, z).total(), 2.0 / 4)
          << comp.label() << " stage " << stage;
    }
  }
  const std::string line = train::zero_memory_line(train::plan_for(OptimizerLayout::Bf16Full, 1, true),
                                                   parallel::make_zero_plan(2, 1000, 2, 0, true));
  EXPECT_NE(line.find("(compensation 2 + moments 4)/2 bytes/param = 7.00"), std::string::npos) << line;
}

TEST(ZeroPlan, MemoryLineNamesStageWorldAndBreakdown) {
  const train::PrecisionPlan base = train::plan_for(OptimizerLayout::Baseline, 1);
  const std::string l1 = train::zero_memory_line(base, parallel::make_zero_plan(1, 1000, 4, 2, true));
  EXPECT_EQ(l1.rfind("[Rank 2] ZeRO stage 1, world size 4: params 2 + grads 2 + (master 4 + moments 8)/4 bytes/param "
                     "= 7.00 (",
                     0),
            0u)
      << l1;
  const std::string l0 = train::zero_memory_line(base, parallel::make_zero_plan(0, 1000, 1, 0, false));
  EXPECT_EQ(l0.rfind("[Rank 0] ZeRO stage 0, world size 1: params 2 + grads 2 + master 4 + moments 8 bytes/param = 16.00",
                     0),
            0u)
      << l0;
  const std::string lf = train::zero_memory_line(train::plan_for(OptimizerLayout::Bf16Full, 1), parallel::make_zero_plan(2, 1000, 2, 0, true));
  EXPECT_NE(lf.find("params 2 + grads 2 + (moments 4)/2 bytes/param = 6.00"), std::string::npos) << lf;
  EXPECT_NE(lf.find("full gradient buffer stays"), std::string::npos) << lf;
  const std::string l3 = train::zero_memory_line(base, parallel::make_zero_plan(3, 1000, 1, 0, false));
  EXPECT_NE(l3.find("stage 3 at world size 1"), std::string::npos) << l3;
  const std::string s3 = train::zero_memory_line(base, parallel::make_zero_plan(3, 1000, 4, 1, true), 4096, 128);
  EXPECT_EQ(s3.rfind("[Rank 1] ZeRO stage 3, world size 4: params 2/4 + grads 2 + grad shard 2/4 + (master 4 + "
                     "moments 8)/4 bytes/param = 6.00, plus 2 gather buffers of 4096 elements and 128 persistent "
                     "elements (bf16) (",
                     0),
            0u)
      << s3;
}

TEST(ZeroPlan, Stage0RangesCoverEveryTensorOnce) {
  const model::TransformerParams t(model::ModelDims{128, 2, 2, 1000, 64});
  const auto whole = parallel::stage0_ranges(t, /*overlap_comm=*/false, 1000);
  ASSERT_EQ(whole.size(), 1u);
  EXPECT_EQ(whole[0].begin, 0u);
  EXPECT_EQ(whole[0].end, t.flat_size());
  for (std::size_t bucket : {std::size_t(1), std::size_t(20000), std::size_t(200000), t.flat_size()}) {
    const auto r = parallel::stage0_ranges(t, /*overlap_comm=*/true, bucket);
    ASSERT_FALSE(r.empty());
    for (std::size_t i = 1; i < r.size(); ++i) EXPECT_LE(r[i - 1].end, r[i].begin) << "bucket " << bucket;
    for (const auto& tensor : t.tensors()) {
      const auto n = std::count_if(r.begin(), r.end(), [&](const parallel::Range& b) {
        return b.begin <= tensor.offset && tensor.offset + tensor.count <= b.end;
      });
      EXPECT_EQ(n, 1) << tensor.name << " must lie in exactly one bucket (bucket " << bucket << ")";
    }
    for (const auto& b : r) {
      bool single = std::count_if(t.tensors().begin(), t.tensors().end(), [&](const model::ParamTensor& x) {
                      return b.begin <= x.offset && x.offset < b.end;
                    }) == 1;
      EXPECT_TRUE(b.size() <= bucket || single) << "bucket of " << b.size() << " > " << bucket;
    }
  }
  EXPECT_EQ(parallel::stage0_ranges(t, true, t.flat_size()).size(), 1u);
}
