// BERT (Arch::Bert) through train/: the checkpoint's model config keeps the architecture, the FFN
// width and BertConfig's fields (a resume rebuilds the same model), and the CPU backend with LAMB
// trains it with dropout keyed by the step: the same step repeats its loss from the same state,
// evaluation drops nothing.
#include <gtest/gtest.h>

#include <cmath>

#include "model/reference_model.h"
#include "tests/support/test_support.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/cpu_backend.h"

using namespace cutrain;

namespace {

model::ModelDims bert_dims() {
  model::ModelDims d{32, 2, 2, 40, 16};
  d.padded_vocab = 48;
  d.intermediate = 80;
  d.arch = model::Arch::Bert;
  d.bert.pre_layer_norm = false;
  d.bert.layer_norm_eps = 1e-6f;
  d.bert.attn_dropout_ratio = 0.15f;
  d.bert.hidden_dropout_ratio = 0.05f;
  d.bert.initializer_range = 0.03;
  d.bert.adjust_init_range = false;
  d.bert.gelu_checkpoint = true;
  d.bert.mask_id = 38;
  d.bert.pad_id = 39;
  return d;
}

}  // namespace

TEST(BertTrain, CheckpointConfigKeepsTheModel) {
  const model::ModelDims d = bert_dims();
  const auto j = train::checkpoint_model_config(d, DType::BF16, DType::F32, 123, "baseline", false);
  EXPECT_EQ(j["architecture"], "BERT");
  EXPECT_EQ(j["norm"], "post_layernorm");
  const model::ModelDims back = train::checkpoint_model_dims(j, "test");
  EXPECT_EQ(back.arch, model::Arch::Bert);
  EXPECT_EQ(back.ffn(), 80);
  EXPECT_EQ(back.vocab_rows(), 48);
  EXPECT_EQ(back.bert.pre_layer_norm, false);
  EXPECT_EQ(back.bert.layer_norm_eps, 1e-6f);
  EXPECT_EQ(back.bert.attn_dropout_ratio, 0.15f);
  EXPECT_EQ(back.bert.hidden_dropout_ratio, 0.05f);
  EXPECT_EQ(back.bert.initializer_range, 0.03);
  EXPECT_EQ(back.bert.adjust_init_range, false);
  EXPECT_EQ(back.bert.gelu_checkpoint, true);
  EXPECT_EQ(back.bert.mask_id, 38);
  EXPECT_EQ(back.bert.pad_id, 39);
  EXPECT_EQ(model::TransformerParams(back).flat_size(), model::TransformerParams(d).flat_size());
  auto broken = j;
  broken.erase("bert");
  EXPECT_THROW(train::checkpoint_model_dims(broken, "test"), Error);
}

TEST(BertTrain, CpuBackendStepsWithLambAndKeyedDropout) {
  auto rng = test::fresh_rng();
  train::BackendOptions o;
  o.dims = bert_dims();
  o.batch = 2;
  o.seq = 16;
  o.seed = rng();
  train::TrainConfig c = train::parse_config(
      R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
          "optimizer": {"type": "Lamb", "params": {"lr": 1e-3, "weight_decay": 0.01}}})",
      "test:lamb");
  c.resolve_batch(1);
  auto tok = test::random_ints(32, rng, 0, 37);
  std::vector<std::int32_t> lab(32, -100);
  for (int m = 0; m < 32; m += 3) lab[std::size_t(m)] = tok[std::size_t(m)];
  for (int m = 28; m < 32; ++m) tok[std::size_t(m)] = 39, lab[std::size_t(m)] = -100;  // padding
  auto be = train::make_cpu_backend(o, c);
  const train::HostState start = be->save_state();
  const double eval = be->eval_loss(tok.data(), lab.data());
  const train::StepStats s1 = be->step(tok.data(), lab.data(), 1, 1e-3f);
  EXPECT_TRUE(std::isfinite(s1.loss));
  EXPECT_NE(s1.loss, eval) << "the training step dropped nothing";
  be->load_state(start);
  EXPECT_EQ(be->step(tok.data(), lab.data(), 1, 1e-3f).loss, s1.loss) << "step 1's masks again";
  be->load_state(start);
  EXPECT_NE(be->step(tok.data(), lab.data(), 2, 1e-3f).loss, s1.loss) << "step 2 draws other masks";
  be->load_state(start);
  EXPECT_EQ(be->eval_loss(tok.data(), lab.data()), eval);
}
