// llm.c's model file: the bytes cutrain writes are the file llm.c's layout describes (built here
// independently, tensor by tensor in llm.c's order from the table's names), fp32 and bf16 round
// trips, and each bad input named: magic, version, truncated / extra bytes, header fields, a model
// of another size, a table of the other architecture.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>

#include "model/llmc_checkpoint.h"
#include "runtime/dtype.h"
#include "runtime/file_util.h"
#include "tests/support/cpu_test_util.h"

using namespace cutrain;

namespace {

model::ModelDims small() {
  model::ModelDims d{16, 3, 2, 37, 8};
  d.padded_vocab = 48;
  d.arch = model::Arch::Gpt2;
  return d;
}

std::vector<float> random_params(const model::TransformerParams& t, std::uint64_t seed) {
  std::vector<float> p(t.flat_size(), 0.f);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  for (const auto& x : t.tensors())
    for (std::size_t i = 0; i < x.count; ++i) p[x.offset + i] = n(rng);
  return p;
}

// llm.c's file for these params, written without the code under test: header, then for each of
// llm.c's tensors every layer's slice, found by name.
std::vector<std::byte> expected_file(const model::TransformerParams& t, const std::vector<float>& p, bool bf16) {
  const auto& d = t.dims();
  std::vector<std::int32_t> hdr(256, 0);
  hdr[0] = 20240326;
  hdr[1] = bf16 ? 5 : 3;
  hdr[2] = d.max_seq;
  hdr[3] = d.vocab;
  hdr[4] = d.layers;
  hdr[5] = d.heads;
  hdr[6] = d.hidden;
  hdr[7] = d.vocab_rows();
  std::vector<std::byte> out(1024);
  std::memcpy(out.data(), hdr.data(), 1024);
  auto put = [&](const std::string& name) {
    const auto& x = t.find(name);
    for (std::size_t i = 0; i < x.count; ++i) {
      const float v = p[x.offset + i];
      if (bf16) {
        const std::uint16_t b = f32_to_bf16_bits(v);
        const auto* q = reinterpret_cast<const std::byte*>(&b);
        out.insert(out.end(), q, q + 2);
      } else {
        const auto* q = reinterpret_cast<const std::byte*>(&v);
        out.insert(out.end(), q, q + 4);
      }
    }
  };
  put("wte.weight");
  put("wpe.weight");
  for (const char* leaf : {"ln_1.weight", "ln_1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
                           "attn.proj.bias", "ln_2.weight", "ln_2.bias", "mlp.fc.weight", "mlp.fc.bias",
                           "mlp.proj.weight", "mlp.proj.bias"})
    for (int l = 0; l < d.layers; ++l) put("h." + std::to_string(l) + "." + leaf);
  put("ln_f.weight");
  put("ln_f.bias");
  return out;
}

void write_bytes(const std::filesystem::path& p, const std::vector<std::byte>& b) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

void set_int(std::vector<std::byte>& b, int slot, std::int32_t v) { std::memcpy(b.data() + 4 * slot, &v, 4); }

}  // namespace

TEST(LlmcCheckpoint, WritesLlmcsLayoutAndReadsItBack) {
  const auto dir = test::fresh_temp_dir("llmc");
  model::TransformerParams t(small());
  const auto p = random_params(t, 11);
  for (bool bf16 : {false, true}) {
    const auto path = dir / (bf16 ? "model_bf16.bin" : "model.bin");
    model::save_llmc_checkpoint(path, t, p.data(), bf16);
    EXPECT_EQ(read_file(path), expected_file(t, p, bf16)) << (bf16 ? "bf16" : "fp32");
    const model::LlmcHeader h = model::read_llmc_header(path);
    EXPECT_EQ(h.version, bf16 ? 5 : 3);
    EXPECT_EQ(h.padded_vocab, 48);
    std::vector<float> back(t.flat_size(), 123.f);  // poisoned: padding must come back 0
    model::load_llmc_checkpoint(path, t, back.data());
    for (std::size_t i = 0; i < p.size(); ++i)
      ASSERT_EQ(back[i], bf16 ? round_bf16(p[i]) : p[i]) << "element " << i << (bf16 ? " bf16" : " fp32");
  }
  // The header alone gives the model.
  const model::ModelDims d = model::llmc_dims(model::read_llmc_header(dir / "model.bin"));
  EXPECT_EQ(d.arch, model::Arch::Gpt2);
  EXPECT_EQ(d.hidden, 16);
  EXPECT_EQ(d.layers, 3);
  EXPECT_EQ(d.vocab_rows(), 48);
  EXPECT_EQ(model::TransformerParams(d).flat_size(), t.flat_size());
}

TEST(LlmcCheckpoint, BadFilesAreNamed) {
  const auto dir = test::fresh_temp_dir("llmc_bad");
  model::TransformerParams t(small());
  const auto p = random_params(t, 5);
  const auto good = expected_file(t, p, true);
  std::vector<float> out(t.flat_size());
  auto msg = [&](std::vector<std::byte> bytes, const char* name) {
    write_bytes(dir / name, bytes);
    return test::message_of([&] { model::load_llmc_checkpoint(dir / name, t, out.data()); });
  };
  auto b = good;
  set_int(b, 0, 20240520);
  std::string m = msg(b, "magic.bin");
  EXPECT_HAS(m, "magic.bin");
  EXPECT_HAS(m, "magic 20240520");
  EXPECT_HAS(m, "token shard");
  b = good;
  set_int(b, 0, 1234);
  EXPECT_HAS(msg(b, "magic2.bin"), "is not llm.c's model magic 20240326");
  b = good;
  set_int(b, 1, 4);
  m = msg(b, "version.bin");
  EXPECT_HAS(m, "version 4 is not supported");
  EXPECT_HAS(m, "version.bin");
  b = good;
  b.resize(b.size() - 6);
  m = msg(b, "short.bin");
  EXPECT_HAS(m, "short.bin");
  EXPECT_HAS(m, "(truncated)");
  b = good;
  b.resize(b.size() + 2);
  EXPECT_HAS(msg(b, "long.bin"), "extra bytes");
  b = good;
  b.resize(100);
  EXPECT_HAS(msg(b, "tiny.bin"), "shorter than llm.c's 1024-byte header");
  b = good;
  set_int(b, 5, 0);
  EXPECT_HAS(msg(b, "heads0.bin"), "num_heads must be positive, found 0");
  b = good;
  set_int(b, 5, 3);
  EXPECT_HAS(msg(b, "heads3.bin"), "num_heads 3 does not divide channels 16");
  b = good;
  set_int(b, 7, 30);
  EXPECT_HAS(msg(b, "vp.bin"), "padded_vocab_size 30 is smaller than vocab_size 37");
  // A file of another model: its own size is consistent, the table's is not.
  model::ModelDims other = small();
  other.layers = 2;
  other.max_seq = 16;
  model::TransformerParams t2(other);
  model::save_llmc_checkpoint(dir / "other.bin", t2, random_params(t2, 1).data(), false);
  m = test::message_of([&] { model::load_llmc_checkpoint(dir / "other.bin", t, out.data()); });
  EXPECT_HAS(m, "model size mismatch");
  EXPECT_HAS(m, "num_layers 2 in the file, 3 in the model");
  EXPECT_HAS(m, "max_seq_len 16 in the file, 8 in the model");
  // The seed architecture has no llm.c layout.
  model::ModelDims simple = small();
  simple.arch = model::Arch::Simple;
  model::TransformerParams ts(simple);
  std::vector<float> ps(ts.flat_size());
  EXPECT_HAS(test::message_of([&] { model::save_llmc_checkpoint(dir / "s.bin", ts, ps.data(), true); }),
             "gpt2 architecture");
  EXPECT_FALSE(std::filesystem::exists(dir / "s.bin"));
  EXPECT_HAS(test::message_of([&] { model::read_llmc_header(dir / "missing.bin"); }), "missing.bin");
}
