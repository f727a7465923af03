// CPU tests of safetensors: round trip over every dtype cutrain has and odd shapes, a hand-built
// file read back, every corruption the reader must refuse (with the file and tensor named), writer
// argument checks, and the known-content file tests/e2e/check_safetensors.py reads with the
// Python `safetensors` package.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime/file_util.h"
#include "runtime/safetensors.h"
#include "tests/support/test_support.h"
#include "tests/support/cpu_test_util.h"

using namespace cutrain;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir() { return test::fresh_temp_dir("st"); }

struct Tensor {
  std::string name;
  DType dtype;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> bytes;
};

Tensor random_tensor(std::string name, DType dt, std::vector<std::int64_t> shape, std::mt19937_64& rng) {
  std::size_t n = 1;
  for (auto d : shape) n *= static_cast<std::size_t>(d);
  Tensor t{std::move(name), dt, std::move(shape), std::vector<std::byte>(n * dtype_size(dt))};
  for (auto& b : t.bytes) b = static_cast<std::byte>(rng() & 0xFF);
  return t;
}

std::vector<SafetensorsEntry> entries(const std::vector<Tensor>& ts) {
  std::vector<SafetensorsEntry> out;
  for (const auto& t : ts) out.push_back({t.name, t.dtype, t.shape, t.bytes.empty() ? nullptr : t.bytes.data()});
  return out;
}

// A file from a header text and a data section, written byte for byte (no writer involved).
fs::path raw_file(const fs::path& dir, const std::string& name, const std::string& header, std::size_t data_bytes,
                  std::uint64_t header_len_override = 0) {
  std::string bytes(8, '\0');
  std::uint64_t n = header_len_override ? header_len_override : header.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  bytes += header;
  for (std::size_t i = 0; i < data_bytes; ++i) bytes += static_cast<char>(i * 7 + 1);
  fs::path p = dir / name;
  write_file_atomic(p, std::string_view(bytes));
  return p;
}

// Opening `p` must fail with a message holding every one of `parts`.
void expect_rejected(const fs::path& p, std::initializer_list<std::string> parts) {
  try {
    SafetensorsReader r(p);
    ADD_FAILURE() << "accepted " << p << " with " << r.tensors().size() << " tensors";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find(p.string()), std::string::npos) << "file not named: " << e.message();
    for (const auto& s : parts) EXPECT_NE(e.message().find(s), std::string::npos) << "missing '" << s << "' in: " << e.message();
  }
}

std::uint64_t fnv1a64(const std::vector<std::byte>& b) {
  std::uint64_t h = 1469598103934665603ull;
  for (auto x : b) {
    h ^= static_cast<std::uint8_t>(x);
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

TEST(Safetensors, RoundTripEveryDtypeAndOddShapes) {
  auto rng = test::fresh_rng();
  fs::path dir = temp_dir();
  std::vector<Tensor> ts = {
      random_tensor("embed.weight", DType::BF16, {37, 5}, rng),
      random_tensor("layers.0.norm.bias", DType::F32, {7}, rng),
      random_tensor("scalar", DType::F32, {}, rng),
      random_tensor("empty", DType::BF16, {0, 3}, rng),
      random_tensor("ids", DType::I32, {3, 1, 5}, rng),
      random_tensor("mask", DType::U8, {13}, rng),
      random_tensor("half", DType::F16, {3}, rng),
      random_tensor("u16", DType::U16, {1, 9}, rng),
  };
  SafetensorsMetadata meta = {{"format", "pt"}, {"step", "1234"}};
  fs::path p = dir / "model.safetensors";
  write_safetensors(p, entries(ts), meta);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1) << "temp left behind";

  SafetensorsReader r(p);
  EXPECT_EQ(r.metadata(), meta);
  ASSERT_EQ(r.tensors().size(), ts.size());
  for (const auto& t : ts) {
    SCOPED_TRACE(t.name);
    ASSERT_TRUE(r.contains(t.name));
    const auto& info = r.tensor(t.name);
    EXPECT_EQ(info.dtype, t.dtype);
    EXPECT_EQ(info.dtype_name, safetensors_dtype_name(t.dtype));
    EXPECT_EQ(info.shape, t.shape);
    EXPECT_EQ(info.bytes(), t.bytes.size());
    EXPECT_EQ(info.begin % info.element_size, 0u) << "misaligned";
    EXPECT_EQ(r.read(t.name), t.bytes);
  }
  // The data section starts 8-byte aligned (header padded with spaces).
  auto raw = read_file(p);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<std::uint8_t>(raw[i]);
  EXPECT_EQ((8 + n) % 8, 0u);
  // Overwrite with fewer tensors: the reader sees only the new file.
  write_safetensors(p, entries({ts[1]}));
  SafetensorsReader r2(p);
  EXPECT_EQ(r2.tensors().size(), 1u);
  EXPECT_TRUE(r2.metadata().empty());
  fs::remove_all(dir);
}

TEST(Safetensors, ReadsHandBuiltFile) {
  fs::path dir = temp_dir();
  // Two F32 then one BF16, in the reference layout, written without our writer.
  std::string header = R"({"b":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]},"a":{"dtype":"F32","shape":[2],)"
                       R"("data_offsets":[0,8]},"__metadata__":{"format":"pt"}})";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
  bytes += header;
  float a[2] = {1.5f, -2.25f};
  std::uint16_t b[2] = {f32_to_bf16_bits(3.0f), f32_to_bf16_bits(-0.5f)};
  bytes.append(reinterpret_cast<const char*>(a), 8);
  bytes.append(reinterpret_cast<const char*>(b), 4);
  fs::path p = dir / "hand.safetensors";
  write_file_atomic(p, std::string_view(bytes));
  SafetensorsReader r(p);
  ASSERT_EQ(r.tensors().size(), 2u);
  EXPECT_EQ(r.tensors()[0].name, "a");  // file order is offset order
  float ga[2];
  r.read("a", ga, sizeof ga);
  EXPECT_EQ(ga[0], 1.5f);
  EXPECT_EQ(ga[1], -2.25f);
  std::uint16_t gb[2];
  r.read("b", gb, sizeof gb);
  EXPECT_EQ(bf16_bits_to_f32(gb[0]), 3.0f);
  EXPECT_EQ(bf16_bits_to_f32(gb[1]), -0.5f);
  EXPECT_EQ(r.metadata().at("format"), "pt");
  fs::remove_all(dir);
}

TEST(Safetensors, RejectsEveryCorruption) {
  fs::path d = temp_dir();
  auto T = [](const std::string& name, const std::string& dtype, const std::string& shape, const std::string& offs) {
    return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":" + offs + "}";
  };
  std::string good = "{" + T("w", "F32", "[2]", "[0,8]") + "}";
  EXPECT_NO_THROW(SafetensorsReader(raw_file(d, "good", good, 8)));

  {  // shorter than the length prefix
    fs::path p = d / "tiny";
    write_file_atomic(p, std::string_view("abc"));
    expect_rejected(p, {"8-byte header length", "3-byte file"});
  }
  expect_rejected(raw_file(d, "len_past_end", good, 8, good.size() + 9), {"header length", "past the end"});
  expect_rejected(raw_file(d, "len_huge", good, 8, 1ull << 40), {"header length", "limit"});
  expect_rejected(raw_file(d, "not_brace", " " + good, 8), {"start with '{'"});
  expect_rejected(raw_file(d, "bad_json", "{\"w\":{\"dtype\":\"F32\",", 8), {"malformed JSON", "line 1"});
  expect_rejected(raw_file(d, "dup", "{" + T("w", "F32", "[1]", "[0,4]") + "," + T("w", "F32", "[1]", "[4,8]") + "}", 8),
                  {"'w'", "more than once"});
  expect_rejected(raw_file(d, "dtype", "{" + T("w", "F42", "[2]", "[0,8]") + "}", 8), {"tensor 'w'", "unknown dtype \"F42\""});
  expect_rejected(raw_file(d, "no_dtype", R"({"w":{"shape":[2],"data_offsets":[0,8]}})", 8), {"tensor 'w'", "dtype", "nothing"});
  expect_rejected(raw_file(d, "neg_dim", "{" + T("w", "F32", "[-2]", "[0,8]") + "}", 8), {"tensor 'w'", "non-negative", "-2"});
  expect_rejected(raw_file(d, "float_dim", "{" + T("w", "F32", "[2.5]", "[0,8]") + "}", 8), {"tensor 'w'", "2.5"});
  expect_rejected(raw_file(d, "shape_str", "{" + T("w", "F32", "\"2\"", "[0,8]") + "}", 8), {"tensor 'w'", "array shape"});
  expect_rejected(raw_file(d, "offs_len", "{" + T("w", "F32", "[2]", "[0]") + "}", 8), {"tensor 'w'", "data_offsets"});
  expect_rejected(raw_file(d, "offs_rev", "{" + T("w", "F32", "[0]", "[8,0]") + "}", 8), {"tensor 'w'", "end before they begin"});
  expect_rejected(raw_file(d, "offs_past", "{" + T("w", "F32", "[4]", "[0,16]") + "}", 8), {"tensor 'w'", "run past"});
  expect_rejected(raw_file(d, "size", "{" + T("w", "F32", "[3]", "[0,8]") + "}", 8), {"tensor 'w'", "12 bytes", "hold 8"});
  expect_rejected(raw_file(d, "overflow", "{" + T("w", "F32", "[4294967296,4294967296]", "[0,8]") + "}", 8), {"tensor 'w'", "overflow"});
  expect_rejected(raw_file(d, "overlap", "{" + T("a", "F32", "[2]", "[0,8]") + "," + T("b", "F32", "[1]", "[4,8]") + "}", 8),
                  {"overlaps"});
  expect_rejected(raw_file(d, "hole", "{" + T("a", "F32", "[1]", "[0,4]") + "," + T("b", "F32", "[1]", "[8,12]") + "}", 12),
                  {"hole", "[4, 8)", "'b'"});
  expect_rejected(raw_file(d, "trailing", good, 12), {"cover 8 bytes", "holds 12"});
  expect_rejected(raw_file(d, "meta_type", "{" + T("w", "F32", "[2]", "[0,8]") + R"(,"__metadata__":{"step":5}})", 8),
                  {"__metadata__.step", "expected a string", "number 5"});
  expect_rejected(raw_file(d, "extra", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8),
                  {"tensor 'w'", "unexpected field 'x'"});
  expect_rejected(raw_file(d, "entry_type", R"({"w":[1,2]})", 8), {"tensor 'w'", "expected an object"});

  // Lookups and reads of a valid file.
  SafetensorsReader r(raw_file(d, "good2", good, 8));
  try {
    r.tensor("missing");
    ADD_FAILURE() << "found a missing tensor";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("'missing'"), std::string::npos) << e.message();
  }
  float small[1];
  try {
    r.read("w", small, sizeof small);
    ADD_FAILURE() << "read 8 bytes into 4";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("tensor 'w' holds 8 bytes"), std::string::npos) << e.message();
  }
  fs::remove_all(d);
}

TEST(Safetensors, WriterChecksItsArguments) {
  fs::path d = temp_dir();
  float x[2] = {1, 2};
  auto expect_bad = [&](std::vector<SafetensorsEntry> es, const std::string& part) {
    try {
      write_safetensors(d / "w.safetensors", es);
      ADD_FAILURE() << "accepted: " << part;
    } catch (const Error& e) {
      EXPECT_NE(e.message().find(part), std::string::npos) << e.message();
    }
  };
  expect_bad({{"a", DType::F32, {2}, x}, {"a", DType::F32, {2}, x}}, "'a' appears twice");
  expect_bad({{"__metadata__", DType::F32, {2}, x}}, "reserved");
  expect_bad({{"", DType::F32, {2}, x}}, "empty name");
  expect_bad({{"n", DType::F32, {2, -1}, x}}, "dims >= 0");
  expect_bad({{"p", DType::F32, {2}, nullptr}}, "null data pointer");
  EXPECT_FALSE(fs::exists(d / "w.safetensors"));
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator()), 0) << "litter after failed writes";
  fs::remove_all(d);
}

// Writes a file with known content for tests/e2e/check_safetensors.py (run on a machine with the
// Python package): <dir>/known.safetensors and <dir>/known.expected.json (names, dtypes, shapes,
// FNV-1a 64 checksums of the raw bytes, first values). <dir> = $CUTRAIN_E2E_DIR or
// <tmp>/cutrain_e2e.
TEST(Safetensors, WritesKnownFileForPythonCheck) {
  const char* env = std::getenv("CUTRAIN_E2E_DIR");
  fs::path dir = env && *env ? fs::path(env) : fs::temp_directory_path() / "cutrain_e2e";
  fs::create_directories(dir);
  std::vector<float> f32(6 * 7);
  for (std::size_t i = 0; i < f32.size(); ++i) f32[i] = 0.5f * static_cast<float>(i) - 3.f;
  std::vector<bf16> b16(3 * 5);
  for (std::size_t i = 0; i < b16.size(); ++i) b16[i] = to_bf16(0.25f * static_cast<float>(i) - 1.f);
  std::vector<std::int32_t> i32 = {7, -1, 2147483647, -2147483647 - 1, 0};
  std::vector<std::uint8_t> u8 = {0, 1, 2, 255, 128, 3, 4};
  float scalar = 42.f;
  std::vector<SafetensorsEntry> es = {{"w.f32", DType::F32, {6, 7}, f32.data()},
                                      {"w.bf16", DType::BF16, {3, 5}, b16.data()},
                                      {"ids", DType::I32, {5}, i32.data()},
                                      {"bytes", DType::U8, {7}, u8.data()},
                                      {"scalar", DType::F32, {}, &scalar},
                                      {"empty", DType::F32, {0, 4}, nullptr}};
  SafetensorsMetadata meta = {{"format", "pt"}, {"writer", "cutrain"}};
  fs::path p = dir / "known.safetensors";
  write_safetensors(p, es, meta);

  SafetensorsReader r(p);
  nlohmann::json expected = {{"metadata", meta}, {"tensors", nlohmann::json::object()}};
  for (const auto& e : es) {
    auto bytes = r.read(e.name);
    std::vector<std::byte> want(bytes.size());
    if (!want.empty()) std::memcpy(want.data(), e.data, want.size());
    ASSERT_EQ(bytes, want) << e.name;
    nlohmann::json first = nlohmann::json::array();
    std::size_t n = bytes.size() / dtype_size(e.dtype);
    for (std::size_t i = 0; i < std::min<std::size_t>(n, 4); ++i) {
      if (e.dtype == DType::F32) first.push_back(static_cast<const float*>(e.data)[i]);
      if (e.dtype == DType::BF16) first.push_back(to_float(static_cast<const bf16*>(e.data)[i]));
      if (e.dtype == DType::I32) first.push_back(static_cast<const std::int32_t*>(e.data)[i]);
      if (e.dtype == DType::U8) first.push_back(static_cast<const std::uint8_t*>(e.data)[i]);
    }
    expected["tensors"][e.name] = {{"dtype", safetensors_dtype_name(e.dtype)},
                                   {"shape", e.shape},
                                   {"fnv1a64", std::to_string(fnv1a64(bytes))},
                                   {"first", first}};
  }
  write_file_atomic(dir / "known.expected.json", std::string_view(expected.dump(2) + "\n"));
  std::cout << "[ e2e      ] wrote " << p << " for tests/e2e/check_safetensors.py\n";
}

// Random damage to a valid file: the reader either accepts it (then every tensor reads) or throws
// cutrain::Error; never another exception type, never a crash. Truncation is always refused.
TEST(Safetensors, RandomDamageIsRefusedCleanly) {
  auto rng = test::fresh_rng();
  fs::path d = temp_dir();
  std::vector<Tensor> ts = {random_tensor("a", DType::F32, {3, 2}, rng), random_tensor("b", DType::BF16, {5}, rng),
                            random_tensor("c", DType::U8, {3}, rng)};
  fs::path good = d / "good.safetensors";
  write_safetensors(good, entries(ts), {{"k", "v"}});
  const auto bytes = read_file(good);
  int accepted = 0, refused = 0;
  for (int iter = 0; iter < 300; ++iter) {
    auto bad = bytes;
    int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) {
      std::size_t at = rng() % std::min<std::size_t>(bad.size(), 200);  // length prefix + header
      bad[at] = static_cast<std::byte>(rng() & 0xFF);
    }
    fs::path p = d / "damaged.safetensors";
    write_file_atomic(p, std::span<const std::byte>(bad));
    try {
      SafetensorsReader r(p);
      for (const auto& t : r.tensors()) (void)r.read(t.name);
      ++accepted;
    } catch (const Error&) {
      ++refused;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "non-cutrain exception on damaged file (iteration " << iter << "): " << e.what();
    }
  }
  EXPECT_GT(refused, 0);
  for (std::size_t len = 0; len < bytes.size(); len += 1 + bytes.size() / 97) {
    fs::path p = d / "short.safetensors";
    write_file_atomic(p, std::span<const std::byte>(bytes.data(), len));
    EXPECT_THROW(SafetensorsReader{p}, Error) << "accepted a file truncated to " << len << " of " << bytes.size() << " bytes";
  }
  fs::remove_all(d);
}
