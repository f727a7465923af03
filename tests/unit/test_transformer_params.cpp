// The parameter table: PyTorch names/shapes/count, the flat layout, and PyTorch's default init.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "model/transformer_params.h"
#include "runtime/error.h"

using namespace cutrain;

TEST(TransformerParams, DefaultsGiveTheBf16ExampleCount) {
  model::TransformerParams p(model::ModelDims{});
  EXPECT_EQ(p.num_params(), 254128976u);
  EXPECT_EQ(p.tensors().size(), 2u + 12u * 12u + 2u);
  EXPECT_GE(p.flat_size(), p.num_params());
  EXPECT_LT(p.flat_size(), p.num_params() + p.tensors().size() * model::TransformerParams::kAlign);
}

TEST(TransformerParams, NamesShapesAndOrderMatchPyTorch) {
  model::ModelDims d{32, 2, 4, 100, 16};
  model::TransformerParams p(d);
  const auto& t = p.tensors();
  EXPECT_EQ(t[0].name, "embedding.weight");
  EXPECT_EQ(t[0].shape, (std::vector<std::int64_t>{100, 32}));
  EXPECT_EQ(t[1].name, "pos_embedding.weight");
  EXPECT_EQ(t[1].shape, (std::vector<std::int64_t>{16, 32}));
  const char* names[] = {"attention.in_proj_weight", "attention.in_proj_bias", "attention.out_proj.weight",
                         "attention.out_proj.bias", "norm1.weight", "norm1.bias", "ff.0.weight", "ff.0.bias",
                         "ff.2.weight", "ff.2.bias", "norm2.weight", "norm2.bias"};
  for (int l = 0; l < 2; ++l)
    for (int k = 0; k < 12; ++k) EXPECT_EQ(t[2 + 12 * l + k].name, "layers." + std::to_string(l) + "." + names[k]);
  EXPECT_EQ(p.find("layers.1.attention.in_proj_weight").shape, (std::vector<std::int64_t>{96, 32}));
  EXPECT_EQ(p.find("layers.0.ff.0.weight").shape, (std::vector<std::int64_t>{128, 32}));
  EXPECT_EQ(p.find("layers.0.ff.2.weight").shape, (std::vector<std::int64_t>{32, 128}));
  EXPECT_EQ(p.find("output_proj.weight").shape, (std::vector<std::int64_t>{100, 32}));
  EXPECT_EQ(p.find("output_proj.bias").shape, (std::vector<std::int64_t>{100}));
  EXPECT_EQ(p.tensor(p.layer(1).norm2_b).name, "layers.1.norm2.bias");
  EXPECT_EQ(p.tensor(p.output_w()).name, "output_proj.weight");
  EXPECT_THROW(p.find("nope"), Error);
}

TEST(TransformerParams, OffsetsAreAlignedAndDisjoint) {
  model::TransformerParams p(model::ModelDims{24, 3, 3, 77, 9});
  std::size_t end = 0, total = 0;
  std::set<std::string> names;
  for (const auto& t : p.tensors()) {
    EXPECT_EQ(t.offset % model::TransformerParams::kAlign, 0u) << t.name;
    EXPECT_GE(t.offset, end) << t.name;
    end = t.offset + t.count;
    total += t.count;
    EXPECT_TRUE(names.insert(t.name).second) << t.name;
  }
  EXPECT_LE(end, p.flat_size());
  EXPECT_EQ(total, p.num_params());
}

TEST(TransformerParams, HeadsMustDivideHidden) {
  try {
    model::TransformerParams p(model::ModelDims{100, 1, 16, 10, 4});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_heads must divide hidden_dim"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model::TransformerParams(model::ModelDims{64, 1, 4, 0, 4}), Error);
}

TEST(TransformerParams, InitFollowsPyTorchDefaults) {
  model::ModelDims d{64, 2, 4, 500, 32};
  model::TransformerParams p(d);
  std::vector<float> w(p.flat_size(), 123.f);
  p.init(w.data(), 42);
  auto stats = [&](const model::ParamTensor& t, double* mean, double* sd, double* mx) {
    double s = 0, s2 = 0, m = 0;
    for (std::size_t i = 0; i < t.count; ++i) {
      s += w[t.offset + i];
      s2 += double(w[t.offset + i]) * w[t.offset + i];
      m = std::max(m, std::abs(double(w[t.offset + i])));
    }
    *mean = s / t.count;
    *sd = std::sqrt(s2 / t.count - *mean * *mean);
    *mx = m;
  };
  double mean, sd, mx;
  stats(p.find("embedding.weight"), &mean, &sd, &mx);
  EXPECT_NEAR(mean, 0, 0.02);
  EXPECT_NEAR(sd, 1, 0.02);
  // U(-b, b): max near b, sd = b/sqrt(3).
  auto check_uniform = [&](const std::string& name, double b) {
    stats(p.find(name), &mean, &sd, &mx);
    EXPECT_LE(mx, b) << name;
    EXPECT_GT(mx, 0.95 * b) << name;
    EXPECT_NEAR(sd, b / std::sqrt(3.0), 0.05 * b) << name;
  };
  check_uniform("layers.0.attention.in_proj_weight", std::sqrt(6.0 / (64 + 192)));
  check_uniform("layers.1.attention.out_proj.weight", 1 / 8.0);
  check_uniform("layers.0.ff.0.weight", 1 / 8.0);
  check_uniform("layers.0.ff.0.bias", 1 / 8.0);
  check_uniform("layers.0.ff.2.weight", 1 / 16.0);
  check_uniform("output_proj.weight", 1 / 8.0);
  for (const char* zero : {"layers.0.attention.in_proj_bias", "layers.0.attention.out_proj.bias", "layers.1.norm1.bias"}) {
    const auto& t = p.find(zero);
    for (std::size_t i = 0; i < t.count; ++i) ASSERT_EQ(w[t.offset + i], 0.f) << zero;
  }
  const auto& g = p.find("layers.1.norm2.weight");
  for (std::size_t i = 0; i < g.count; ++i) ASSERT_EQ(w[g.offset + i], 1.f);
  // Padding is zero, nothing left at the fill value.
  for (float x : w) ASSERT_NE(x, 123.f);
  // Seeded: same seed same values, other seed other values.
  std::vector<float> w2(p.flat_size()), w3(p.flat_size());
  p.init(w2.data(), 42);
  p.init(w3.data(), 43);
  EXPECT_EQ(w, w2);
  EXPECT_NE(w, w3);
}
