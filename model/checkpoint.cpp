#include "model/checkpoint.h"

#include <nlohmann/json.hpp>

#include <cstring>

#include "model/safetensors.h"
#include "runtime/error.h"
#include "runtime/file_util.h"

namespace cutrain::model {
namespace {

const char* kModel = "model.safetensors";
const char* kOptim = "optimizer.safetensors";
const char* kState = "trainer_state.json";

std::vector<std::uint16_t> to_bf16_bits(const std::vector<float>& v) {
  std::vector<std::uint16_t> b(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16_bits(v[i]);
  return b;
}

// Reads tensor `name` (shape of `t`) into flat[t.offset ...] as float.
void read_into(const SafetensorsReader& r, const std::string& name, const ParamTensor& t, std::vector<float>& flat) {
  const SafetensorsTensorInfo& info = r.tensor(name);
  CUTRAIN_CHECK(info.shape == t.shape, r.path().string(), ": tensor '", name, "' has a shape of ", info.shape.size(),
                " dims / ", info.numel(), " elements, the model expects ", t.count, " elements");
  if (info.dtype == DType::F32) {
    r.read(name, flat.data() + t.offset, t.count * 4);
  } else {
    CUTRAIN_CHECK(info.dtype == DType::BF16, r.path().string(), ": tensor '", name, "' is ", info.dtype_name,
                  ", expected BF16 or F32");
    std::vector<std::uint16_t> b(t.count);
    r.read(name, b.data(), t.count * 2);
    for (std::size_t i = 0; i < t.count; ++i) flat[t.offset + i] = bf16_bits_to_f32(b[i]);
  }
}

}  // namespace

void save_checkpoint(const std::filesystem::path& dir, const TrainBackend& be, const CheckpointMeta& meta) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  CUTRAIN_CHECK(!ec, "checkpoint: cannot create directory ", dir.string(), ": ", ec.message());
  const HostState s = be.save_state();
  const TransformerParams& T = be.table();
  const bool bf = s.param_dtype == DType::BF16;
  const std::vector<std::uint16_t> pbits = bf ? to_bf16_bits(s.params) : std::vector<std::uint16_t>{};

  std::vector<SafetensorsEntry> model, optim;
  std::vector<std::string> names;  // keeps the optimizer names alive
  names.reserve(T.tensors().size() * 3);
  for (const auto& t : T.tensors()) {
    model.push_back({t.name, s.param_dtype, t.shape,
                     bf ? static_cast<const void*>(pbits.data() + t.offset) : s.params.data() + t.offset});
    auto add = [&](const char* suffix, const std::vector<float>& v) {
      if (v.empty()) return;
      names.push_back(t.name + suffix);
      optim.push_back({names.back(), DType::F32, t.shape, v.data() + t.offset});
    };
    add(".master", s.master);
    add(".exp_avg", s.exp_avg);
    add(".exp_avg_sq", s.exp_avg_sq);
  }
  const SafetensorsMetadata md{{"format", "pt"}, {"producer", "cutrain"}};
  write_safetensors(dir / kModel, model, md);
  write_safetensors(dir / kOptim, optim, md);
  nlohmann::json j = {{"step", meta.step}, {"data_rng", meta.data_rng}, {"num_params", T.num_params()}};
  AtomicFileWriter w(dir / kState);
  w.write(j.dump(2) + "\n");
  w.commit();
}

CheckpointMeta load_checkpoint(const std::filesystem::path& dir, TrainBackend& be) {
  const TransformerParams& T = be.table();
  HostState s = be.save_state();  // right sizes and dtypes; every real element is overwritten
  SafetensorsReader mr(dir / kModel), orr(dir / kOptim);
  for (const auto& t : T.tensors()) {
    read_into(mr, t.name, t, s.params);
    if (!s.master.empty()) read_into(orr, t.name + ".master", t, s.master);
    read_into(orr, t.name + ".exp_avg", t, s.exp_avg);
    read_into(orr, t.name + ".exp_avg_sq", t, s.exp_avg_sq);
  }
  be.load_state(s);
  const auto path = dir / kState;
  const std::vector<std::byte> bytes = read_file(path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  } catch (const std::exception& e) {
    CUTRAIN_FAIL("checkpoint: ", path.string(), " is not valid JSON: ", e.what());
  }
  CUTRAIN_CHECK(j.contains("step") && j["step"].is_number_integer() && j.contains("data_rng") && j["data_rng"].is_string(),
                "checkpoint: ", path.string(), " needs integer 'step' and string 'data_rng'");
  return {j["step"].get<int>(), j["data_rng"].get<std::string>()};
}

}  // namespace cutrain::model
