#include "train/checkpoint.h"

#include <nlohmann/json.hpp>

#include <cstring>
#include <deque>

#include "runtime/error.h"
#include "runtime/file_util.h"
#include "runtime/safetensors.h"

namespace cutrain::train {
namespace {

const char* kModel = kCheckpointModelFile;
const char* kOptim = kCheckpointOptimFile;
const char* kState = "trainer_state.json";

std::vector<std::uint16_t> to_bf16_bits(const std::vector<float>& v) {
  std::vector<std::uint16_t> b(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16_bits(v[i]);
  return b;
}

// The tensors of one file to read into flat float buffers: F32 straight into place, BF16 through
// bits converted afterwards. Every read of the file goes to CheckpointFiles at once (one stream
// through the file on the aio path).
class FileLoad {
 public:
  explicit FileLoad(const SafetensorsReader& r) : r_(r) {}
  // Tensor `name` (shape of `t`) into flat[t.offset ...] as float.
  void add(const std::string& name, const model::ParamTensor& t, std::vector<float>& flat) {
    const SafetensorsTensorInfo& info = r_.tensor(name);
    CUTRAIN_CHECK(info.shape == t.shape, r_.path().string(), ": tensor '", name, "' has a shape of ", info.shape.size(),
                  " dims / ", info.numel(), " elements, the model expects ", t.count, " elements");
    if (info.dtype == DType::F32) {
      reads_.push_back({name, flat.data() + t.offset, t.count * 4});
      return;
    }
    CUTRAIN_CHECK(info.dtype == DType::BF16, r_.path().string(), ": tensor '", name, "' is ", info.dtype_name,
                  ", expected BF16 or F32");
    bits_.push_back({std::vector<std::uint16_t>(t.count), flat.data() + t.offset});
    reads_.push_back({name, bits_.back().bits.data(), t.count * 2});
  }
  void run(CheckpointFiles& files) {
    files.read(r_, reads_);
    for (auto& b : bits_)
      for (std::size_t i = 0; i < b.bits.size(); ++i) b.dst[i] = bf16_bits_to_f32(b.bits[i]);
  }

 private:
  struct Bits {
    std::vector<std::uint16_t> bits;
    float* dst;
  };
  const SafetensorsReader& r_;
  std::vector<TensorRead> reads_;
  std::deque<Bits> bits_;  // stable addresses while reads_ points into them
};

}  // namespace

void checkpoint_tensors(const model::TransformerParams& T, const HostState& s, CheckpointTensors& out) {
  const bool bf = s.param_dtype == DType::BF16;
  out.pbits = bf ? to_bf16_bits(s.params) : std::vector<std::uint16_t>{};
  out.model.clear();
  out.optim.clear();
  out.names.clear();
  for (const auto& t : T.tensors()) {
    out.model.push_back({t.name, s.param_dtype, t.shape,
                         bf ? static_cast<const void*>(out.pbits.data() + t.offset) : s.params.data() + t.offset});
    auto add = [&](const char* suffix, const std::vector<float>& v) {
      if (v.empty()) return;
      out.names.push_back(t.name + suffix);
      out.optim.push_back({out.names.back(), DType::F32, t.shape, v.data() + t.offset});
    };
    add(".master", s.master);
    add(".exp_avg", s.exp_avg);
    add(".exp_avg_sq", s.exp_avg_sq);
  }
}

void save_checkpoint(const std::filesystem::path& dir, const TrainBackend& be, const CheckpointMeta& meta,
                     CheckpointIo io, bool write_files) {
  const HostState s = be.save_state();  // first: a collective under ZeRO, every rank takes part
  if (!write_files) return;
  CheckpointFiles files(io);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  CUTRAIN_CHECK(!ec, "checkpoint: cannot create directory ", dir.string(), ": ", ec.message());
  const model::TransformerParams& T = be.table();
  CheckpointTensors ct;
  checkpoint_tensors(T, s, ct);
  const SafetensorsMetadata md{{"format", "pt"}, {"producer", "cutrain"}};
  files.write_safetensors(dir / kModel, ct.model, md);
  files.write_safetensors(dir / kOptim, ct.optim, md);
  nlohmann::json j = {{"step", meta.step}, {"data_rng", meta.data_rng}, {"num_params", T.num_params()}};
  AtomicFileWriter w(dir / kState);
  w.write(j.dump(2) + "\n");
  w.commit();
}

CheckpointMeta load_checkpoint(const std::filesystem::path& dir, TrainBackend& be, CheckpointIo io) {
  CheckpointFiles files(io);
  const model::TransformerParams& T = be.table();
  HostState s = be.save_state();  // right sizes and dtypes; every real element is overwritten
  SafetensorsReader mr(dir / kModel), orr(dir / kOptim);
  FileLoad ml(mr), ol(orr);
  for (const auto& t : T.tensors()) {
    ml.add(t.name, t, s.params);
    if (!s.master.empty()) ol.add(t.name + ".master", t, s.master);
    ol.add(t.name + ".exp_avg", t, s.exp_avg);
    ol.add(t.name + ".exp_avg_sq", t, s.exp_avg_sq);
  }
  ml.run(files);
  ol.run(files);
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

}  // namespace cutrain::train
