// The precision layouts: buffers and bytes per parameter, chosen from the config's bf16 section.
#include <gtest/gtest.h>

#include "runtime/error.h"
#include "train/precision.h"

using namespace cutrain;
using kernels::OptimizerLayout;

TEST(Precision, BytesPerParamOfEachLayout) {
  EXPECT_EQ(train::plan_for(OptimizerLayout::Baseline, 1).bytes_per_param(), 16u);
  EXPECT_EQ(train::plan_for(OptimizerLayout::Baseline, 4).bytes_per_param(), 18u);  // fp32 grads replace bf16
  EXPECT_EQ(train::plan_for(OptimizerLayout::Bf16MasterWG, 1).bytes_per_param(), 12u);
  EXPECT_EQ(train::plan_for(OptimizerLayout::Bf16MasterWG, 4).bytes_per_param(), 12u);
  EXPECT_EQ(train::plan_for(OptimizerLayout::Bf16Full, 1).bytes_per_param(), 8u);
  const auto b = train::plan_for(OptimizerLayout::Baseline, 1).buffers();
  ASSERT_EQ(b.size(), 5u);
  EXPECT_EQ(b[2].name, "master");
  EXPECT_EQ(b[2].dtype, DType::F32);
  EXPECT_EQ(train::plan_for(OptimizerLayout::Bf16Full, 1).buffers().size(), 4u);
}

TEST(Precision, CompensationAddsOneBf16Buffer) {
  const auto wg = train::plan_for(OptimizerLayout::Bf16MasterWG, 1, true);
  const auto full = train::plan_for(OptimizerLayout::Bf16Full, 1, true);
  EXPECT_EQ(wg.bytes_per_param(), 14u);
  EXPECT_EQ(full.bytes_per_param(), 10u);  // the 10 bytes instead of baseline's 16
  const auto b = full.buffers();
  ASSERT_EQ(b.size(), 5u);
  EXPECT_EQ(b[2].name, "compensation");
  EXPECT_EQ(b[2].dtype, DType::BF16);
  EXPECT_STREQ(full.name(), "bf16_full");
  EXPECT_EQ(full.label(), "bf16_full+compensation");
  EXPECT_THROW(train::plan_for(OptimizerLayout::Baseline, 1, true), Error);
  train::TrainConfig c;
  c.bf16.enabled = c.bf16.bf16_master_weights_and_grads = c.bf16.bf16_optimizer_states = true;
  EXPECT_FALSE(train::plan_from_config(c).compensation);
  c.bf16.bf16_master_compensation = true;
  EXPECT_TRUE(train::plan_from_config(c).compensation);
  EXPECT_EQ(train::plan_from_config(c).bytes_per_param(), 10u);
}

TEST(Precision, LayoutFromConfig) {
  train::TrainConfig c;
  c.bf16.enabled = true;
  EXPECT_EQ(train::plan_from_config(c).layout, OptimizerLayout::Baseline);
  c.bf16.bf16_master_weights_and_grads = true;
  EXPECT_EQ(train::plan_from_config(c).layout, OptimizerLayout::Bf16MasterWG);
  c.bf16.bf16_optimizer_states = true;
  EXPECT_EQ(train::plan_from_config(c).layout, OptimizerLayout::Bf16Full);
  EXPECT_STREQ(train::plan_from_config(c).name(), "bf16_full");
  train::TrainConfig shipped = train::load_config("configs/bf16_master_wg.json");
  EXPECT_EQ(train::plan_from_config(shipped).layout, OptimizerLayout::Bf16MasterWG);
}

TEST(Precision, TableNamesEveryLayout) {
  const std::string t = train::bytes_per_param_table();
  for (const char* s : {"baseline", "bf16_master_wg", "bf16_full", "| 16", "| 12", "| 8", "| 18", "bf16_full+comp", "| 10",
                        "| 14"})
    EXPECT_NE(t.find(s), std::string::npos) << s << "\n" << t;
}

// fp16.enabled: the baseline layout on fp16 (fp16 params and gradients, fp32 master and moments);
// with accumulation the gradients accumulate in fp32 as the bf16 baseline's do. A bf16 master
// layout beside it (a hand-built config: the reader refuses it earlier) is an error naming the keys.
TEST(Precision, Fp16IsTheBaselineLayoutOnFp16) {
  train::TrainConfig c;
  c.fp16.enabled = true;
  const train::PrecisionPlan p = train::plan_from_config(c);
  EXPECT_EQ(p.layout, OptimizerLayout::Baseline);
  EXPECT_EQ(p.param, DType::F16);
  EXPECT_EQ(p.grad, DType::F16);
  EXPECT_TRUE(p.has_master);
  EXPECT_EQ(p.moment, DType::F32);
  EXPECT_FALSE(p.compensation);
  EXPECT_STREQ(p.name(), "fp16");
  EXPECT_EQ(p.bytes_per_param(), 2u + 2u + 4u + 4u + 4u);
  EXPECT_EQ(train::plan_for_fp16(4).grad, DType::F32);
  EXPECT_EQ(train::plan_for_fp16(4).param, DType::F16);
  c.bf16.bf16_master_weights_and_grads = true;
  try {
    train::plan_from_config(c);
    ADD_FAILURE() << "fp16 with a bf16 master layout was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp16.enabled needs fp32 master weights; bf16.bf16_master_weights_and_grads"),
              std::string::npos)
        << e.what();
  }
}
