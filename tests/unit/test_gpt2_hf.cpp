// GPT-2 with Hugging Face's names in safetensors: the names, HF's Conv1D [in, out] layout and
// the unpadded wte checked element by element, F32 and BF16 round trips, files without the
// "transformer." prefix, and each bad file named.
#include <gtest/gtest.h>

#include <random>

#include "model/gpt2_hf.h"
#include "runtime/safetensors.h"
#include "tests/support/cpu_test_util.h"

using namespace cutrain;

namespace {

model::TransformerParams table() {
  model::ModelDims d{16, 2, 2, 37, 8};
  d.padded_vocab = 48;
  d.arch = model::Arch::Gpt2;
  return model::TransformerParams(d);
}

std::vector<float> random_flat(const model::TransformerParams& t) {
  std::vector<float> p(t.flat_size(), 0.f);
  std::mt19937_64 rng(3);
  std::normal_distribution<float> n;
  for (const auto& x : t.tensors())
    for (std::size_t i = 0; i < x.count; ++i) p[x.offset + i] = n(rng);
  return p;
}

std::vector<float> floats(const SafetensorsReader& r, const std::string& name) {
  const auto b = r.read(name);
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}

}  // namespace

TEST(Gpt2Hf, HuggingFaceNamesAndLayout) {
  const auto dir = test::fresh_temp_dir("gpt2_hf");
  const auto t = table();
  const auto p = random_flat(t);
  model::save_gpt2_safetensors(dir / "m.safetensors", t, p.data());
  const SafetensorsReader r(dir / "m.safetensors");
  EXPECT_EQ(r.tensors().size(), t.tensors().size());
  EXPECT_FALSE(r.contains("lm_head.weight"));
  EXPECT_EQ(r.tensor("transformer.wte.weight").shape, (std::vector<std::int64_t>{37, 16}));
  EXPECT_EQ(r.tensor("transformer.wpe.weight").shape, (std::vector<std::int64_t>{8, 16}));
  EXPECT_EQ(r.tensor("transformer.h.1.attn.c_attn.weight").shape, (std::vector<std::int64_t>{16, 48}));
  EXPECT_EQ(r.tensor("transformer.h.1.mlp.c_fc.weight").shape, (std::vector<std::int64_t>{16, 64}));
  EXPECT_EQ(r.tensor("transformer.h.1.mlp.c_proj.weight").shape, (std::vector<std::int64_t>{64, 16}));
  EXPECT_EQ(r.tensor("transformer.ln_f.bias").shape, (std::vector<std::int64_t>{16}));
  // Conv1D: file[c][j] == table W[j][c] (W is [out, in]).
  const auto fc = floats(r, "transformer.h.1.mlp.c_fc.weight");
  const auto& w = t.tensor(t.layer(1).ff0_w);
  for (int j = 0; j < 64; ++j)
    for (int c = 0; c < 16; ++c) ASSERT_EQ(fc[std::size_t(c) * 64 + j], p[w.offset + std::size_t(j) * 16 + c]);
  const auto wte = floats(r, "transformer.wte.weight");
  for (std::size_t i = 0; i < wte.size(); ++i) ASSERT_EQ(wte[i], p[i]);

  std::vector<float> back(t.flat_size(), 7.f);
  model::load_gpt2_safetensors(dir / "m.safetensors", t, back.data());
  const std::size_t real = 37 * 16;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const bool padded_row = i >= real && i < t.tensor(t.embedding()).count;
    ASSERT_EQ(back[i], padded_row ? 0.f : p[i]) << "element " << i;
  }
  model::save_gpt2_safetensors(dir / "b.safetensors", t, p.data(), DType::BF16);
  model::load_gpt2_safetensors(dir / "b.safetensors", t, back.data());
  for (std::size_t i = 0; i < real; ++i) ASSERT_EQ(back[i], round_bf16(p[i]));
}

TEST(Gpt2Hf, FilesWithoutThePrefixAndWithMaskBuffersLoad) {
  const auto dir = test::fresh_temp_dir("gpt2_hf_plain");
  const auto t = table();
  const auto p = random_flat(t);
  model::save_gpt2_safetensors(dir / "m.safetensors", t, p.data());
  const SafetensorsReader r(dir / "m.safetensors");
  std::vector<std::vector<std::byte>> keep;
  std::vector<SafetensorsEntry> e;
  for (const auto& info : r.tensors()) {
    keep.push_back(r.read(info.name));
    e.push_back({info.name.substr(std::string("transformer.").size()), DType::F32, info.shape, keep.back().data()});
  }
  std::vector<float> mask(64, 1.f);
  e.push_back({"h.0.attn.bias", DType::F32, {1, 1, 8, 8}, mask.data()});
  write_safetensors(dir / "plain.safetensors", e);
  std::vector<float> a(t.flat_size()), b(t.flat_size());
  model::load_gpt2_safetensors(dir / "m.safetensors", t, a.data());
  model::load_gpt2_safetensors(dir / "plain.safetensors", t, b.data());
  EXPECT_EQ(a, b);
}

TEST(Gpt2Hf, BadFilesAreNamed) {
  const auto dir = test::fresh_temp_dir("gpt2_hf_bad");
  const auto t = table();
  const auto p = random_flat(t);
  model::save_gpt2_safetensors(dir / "m.safetensors", t, p.data());
  std::vector<float> out;
  // Another model's file: two layers of 16 channels against one of 16.
  model::ModelDims d1 = t.dims();
  d1.layers = 3;
  const model::TransformerParams t3(d1);
  out.resize(t3.flat_size());
  std::string m = test::message_of([&] { model::load_gpt2_safetensors(dir / "m.safetensors", t3, out.data()); });
  EXPECT_HAS(m, "m.safetensors");
  EXPECT_HAS(m, "no tensor 'transformer.h.2.");
  model::ModelDims d2 = t.dims();
  d2.hidden = 32;
  d2.heads = 2;
  const model::TransformerParams t32(d2);
  out.resize(t32.flat_size());
  m = test::message_of([&] { model::load_gpt2_safetensors(dir / "m.safetensors", t32, out.data()); });
  EXPECT_HAS(m, "has shape [37, 16], the model expects [37, 32]");
  model::ModelDims d3 = t.dims();
  d3.layers = 1;
  const model::TransformerParams t1(d3);
  out.resize(t1.flat_size());
  m = test::message_of([&] { model::load_gpt2_safetensors(dir / "m.safetensors", t1, out.data()); });
  EXPECT_HAS(m, "'transformer.h.1.");
  EXPECT_HAS(m, "is not a GPT-2 parameter of this model");
  model::ModelDims ds = t.dims();
  ds.arch = model::Arch::Simple;
  const model::TransformerParams simple(ds);
  std::vector<float> ps(simple.flat_size());
  EXPECT_HAS(test::message_of([&] { model::save_gpt2_safetensors(dir / "s.safetensors", simple, ps.data()); }),
             "--model gpt2");
}
