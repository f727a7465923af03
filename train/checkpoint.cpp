#include "train/checkpoint.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <deque>

#include "runtime/error.h"
#include "runtime/file_util.h"
#include "runtime/json_util.h"
#include "runtime/safetensors.h"
#include "runtime/xxhash64.h"
#include "train/checkpoint_store.h"

namespace cutrain::train {
using nlohmann::json;

namespace {

const char* kModel = kCheckpointModelFile;
const char* kOptim = kCheckpointOptimFile;
const char* kState = kCheckpointStateFile;
const char* kConfig = kCheckpointConfigFile;

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

json checkpoint_model_config(const model::ModelDims& d, DType param_dtype, std::size_t num_params,
                             const std::string& layout, bool causal) {
  const bool gpt2 = d.arch == model::Arch::Gpt2;
  return {{"architecture", gpt2 ? "GPT2" : "SimpleTransformerModel"},
          {"hidden_dim", d.hidden},
          {"num_layers", d.layers},
          {"num_heads", d.heads},
          {"head_dim", d.head_dim()},
          {"ffn_dim", d.ffn()},
          {"vocab_size", d.vocab},
          {"embedding_rows", d.vocab_rows()},
          {"max_seq_len", d.max_seq},
          {"norm", gpt2 ? "pre_layernorm" : "post_layernorm"},
          {"layer_norm_eps", 1e-5},
          {"activation", gpt2 ? "gelu_tanh" : "gelu"},
          {"tied_embeddings", gpt2},
          {"causal", causal},
          {"precision_layout", layout},
          {"param_dtype", safetensors_dtype_name(param_dtype)},
          {"optimizer_dtype", "F32"},
          {"num_params", num_params}};
}

model::ModelDims checkpoint_model_dims(const json& c, const std::string& where) {
  auto get = [&](const char* key) {
    CUTRAIN_CHECK(c.is_object() && c.contains(key) && c[key].is_number_integer() && c[key].get<long long>() > 0, where,
                  ": ", key, ": expected a positive integer, found ",
                  c.is_object() && c.contains(key) ? describe_json(c[key]) : std::string("none"));
    return c[key].get<int>();
  };
  model::ModelDims d{get("hidden_dim"), get("num_layers"), get("num_heads"), get("vocab_size"), get("max_seq_len")};
  const int rows = get("embedding_rows");
  d.padded_vocab = rows > d.vocab ? rows : 0;
  const std::string arch = c.value("architecture", std::string("SimpleTransformerModel"));
  CUTRAIN_CHECK(arch == "SimpleTransformerModel" || arch == "GPT2", where, ": architecture: expected ",
                "\"SimpleTransformerModel\" or \"GPT2\", found \"", arch, "\"");
  if (arch == "GPT2") d.arch = model::Arch::Gpt2;
  return d;
}

CheckpointSaveReport save_checkpoint(const std::filesystem::path& root, const TrainBackend& be,
                                     const CheckpointMeta& meta, const CheckpointSaveOptions& opt) {
  const HostState s = be.save_state();  // first: a collective under ZeRO, every rank takes part
  CheckpointSaveReport report;
  if (!opt.write_files) return report;
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  CUTRAIN_CHECK(!ec, "checkpoint: cannot create directory ", root.string(), ": ", ec.message());
  if (const auto stale = remove_stale_temps(root); !stale.empty()) {
    std::string line = "removed what killed saves left in " + root.string() + ":";
    for (const auto& n : stale) line += " " + n;
    report.notes.push_back(line);
  }
  CheckpointFiles files(opt.io);
  StepFolderWriter folder(root, meta.step);
  const std::filesystem::path& dir = folder.dir();
  const model::TransformerParams& T = be.table();
  CheckpointTensors ct;
  checkpoint_tensors(T, s, ct);
  const SafetensorsMetadata md{{"format", "pt"}, {"producer", "cutrain"}};
  Manifest m;
  m.tag = folder.tag();
  m.step = meta.step;
  m.config = checkpoint_model_config(T.dims(), s.param_dtype, T.num_params(), meta.layout, meta.causal);
  auto add = [&](const char* name, FileDigest d) { m.files.push_back({name, d.bytes, d.xxh64}); };
  add(kModel, files.write_safetensors(dir / kModel, ct.model, md));
  add(kOptim, files.write_safetensors(dir / kOptim, ct.optim, md));
  auto add_text = [&](const char* name, const std::string& text) {
    write_file_atomic(dir / name, std::string_view(text));
    add(name, {text.size(), xxh64(text.data(), text.size())});
  };
  const json state = {{"step", meta.step}, {"data_rng", meta.data_rng}, {"num_params", T.num_params()}};
  add_text(kState, state.dump(2) + "\n");
  add_text(kConfig, m.config.dump(2) + "\n");
  checkpoint_fault_point("files", meta.step);
  write_manifest(dir, m);
  report.folder = folder.publish();
  if (const auto pruned = prune_step_folders(root, opt.keep_last); !pruned.empty()) {
    std::string line = "--keep_last " + std::to_string(opt.keep_last) + ": deleted";
    for (const auto& n : pruned) line += " " + (root / n).string();
    report.notes.push_back(line);
  }
  return report;
}

namespace {

bool has_legacy_files(const std::filesystem::path& p) {
  std::error_code ec;
  return std::filesystem::exists(p / kState, ec) || std::filesystem::exists(p / kModel, ec) ||
         std::filesystem::exists(p / kOptim, ec);
}

std::string list_names(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& n : v) s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace

OpenedCheckpoint open_checkpoint(const std::filesystem::path& path, bool accept_legacy) {
  namespace fs = std::filesystem;
  std::error_code ec;
  CUTRAIN_CHECK(fs::is_directory(path, ec), "checkpoint: expected a folder (a checkpoint root or a step folder), found '",
                path.string(), "' ", fs::exists(path, ec) ? "is not a directory" : "does not exist");
  OpenedCheckpoint c;
  fs::path folder;
  if (fs::exists(path / kManifestFile, ec)) {
    folder = path;
  } else if (const auto tag = read_latest(path)) {
    folder = path / *tag;
    if (!fs::is_directory(folder, ec)) {
      std::vector<std::string> steps;
      for (int st : list_step_folders(path)) steps.push_back(step_tag(st));
      CUTRAIN_FAIL("checkpoint ", path.string(), ": ", kLatestFile, " names '", *tag, "', found no folder ",
                   folder.string(), steps.empty() ? std::string(" and no other step folder")
                                                  : " (step folders there: " + list_names(steps) + "; give one to --resume)");
    }
  } else if (has_legacy_files(path)) {
    const std::string name = path.filename().empty() ? path.parent_path().filename().string() : path.filename().string();
    CUTRAIN_CHECK(!temp_folder_pid(name), "checkpoint ", path.string(), ": expected ", kManifestFile,
                  ", found none: this is the temporary folder of a save that did not finish; resume from ",
                  path.parent_path().string(), " (its ", kLatestFile, " names the last complete save)");
    CUTRAIN_CHECK(!tag_step(name), "checkpoint ", path.string(), ": expected ", kManifestFile,
                  ", found none: the step folder is incomplete or damaged");
    CUTRAIN_CHECK(accept_legacy, "checkpoint ", path.string(),
                  ": expected a step folder with ", kManifestFile, " or a root with ", kLatestFile,
                  ", found the layout before manifests (", kModel, ", ", kOptim, ", ", kState,
                  " directly in the folder); nothing there shows whether a save was killed between its files, so "
                  "it is not read as it is. To convert a checkpoint you trust: cutrain train ... --resume ",
                  path.string(), " --accept_legacy_checkpoint --save NEWDIR, with the shape flags it was trained "
                  "with; the run reads it once and saves the new layout in NEWDIR");
    c.folder = path;
    c.legacy = true;
    c.notes.push_back("warning: " + path.string() +
                      " has the layout before manifests: read without checksums (--accept_legacy_checkpoint)");
    return c;
  } else {
    std::vector<std::string> steps, temps;
    for (const auto& e : fs::directory_iterator(path, ec)) {
      const std::string n = e.path().filename().string();
      if (tag_step(n)) steps.push_back(n);
      if (temp_folder_pid(n)) temps.push_back(n);
    }
    std::sort(steps.begin(), steps.end());
    CUTRAIN_FAIL("checkpoint ", path.string(), ": expected ", kLatestFile, " (a checkpoint root) or ", kManifestFile,
                 " (a step folder), found neither",
                 !steps.empty() ? " (step folders there: " + list_names(steps) + ")"
                 : !temps.empty() ? " (only temporaries of saves that did not finish: " + list_names(temps) + ")"
                                  : std::string());
  }
  VerifiedFolder v = verify_checkpoint_folder(folder);
  c.folder = v.folder;
  c.manifest = std::move(v.manifest);
  for (const auto& n : v.notes)
    c.notes.push_back("note: " + (folder / n).string() + " is not listed in " + kManifestFile + " (not read)");
  return c;
}

CheckpointMeta load_checkpoint(const std::filesystem::path& path, TrainBackend& be, CheckpointIo io) {
  return load_checkpoint(open_checkpoint(path), be, io);
}

CheckpointMeta load_checkpoint(const OpenedCheckpoint& c, TrainBackend& be, CheckpointIo io) {
  const std::filesystem::path& dir = c.folder;
  const model::TransformerParams& T = be.table();
  if (!c.legacy) {
    const std::string where = (dir / kConfig).string();
    const model::ModelDims want = checkpoint_model_dims(c.manifest.config, where), &have = T.dims();
    auto same = [&](const char* key, int a, int b) {
      CUTRAIN_CHECK(a == b, where, ": ", key, " is ", a, ", the model being loaded into has ", b);
    };
    same("hidden_dim", want.hidden, have.hidden);
    same("num_layers", want.layers, have.layers);
    same("num_heads", want.heads, have.heads);
    same("vocab_size", want.vocab, have.vocab);
    same("embedding_rows", want.vocab_rows(), have.vocab_rows());
    same("max_seq_len", want.max_seq, have.max_seq);
  }
  CheckpointFiles files(io);
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
  const auto path = dir / kState;
  const json j = parse_json_strict(read_text_file(path), path.string());
  CUTRAIN_CHECK(j.is_object() && j.contains("step") && j["step"].is_number_integer() && j.contains("data_rng") &&
                    j["data_rng"].is_string(),
                "checkpoint: ", path.string(), ": expected an integer 'step' and a string 'data_rng'");
  if (j.contains("num_params"))
    CUTRAIN_CHECK(j["num_params"] == T.num_params(), "checkpoint: ", path.string(), ": num_params: expected ",
                  T.num_params(), " (the model's), found ", j["num_params"].dump());
  be.load_state(s);
  return {j["step"].get<int>(), j["data_rng"].get<std::string>(), {}, false};
}

}  // namespace cutrain::train
