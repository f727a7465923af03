#include "train/checkpoint.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <deque>
#include <optional>
#include <tuple>
#include <type_traits>

#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/file_util.h"
#include "runtime/json_util.h"
#include "runtime/safetensors.h"
#include "runtime/xxhash64.h"
#include "train/checkpoint_store.h"
#include "train/moe_options.h"

namespace cutrain::train {
using nlohmann::json;

namespace {

const char* kModel = kCheckpointModelFile;
const char* kOptim = kCheckpointOptimFile;
const char* kState = kCheckpointStateFile;
const char* kConfig = kCheckpointConfigFile;

}  // namespace

void checkpoint_tensors(const model::TransformerParams& T, const StateSnapshot& s, CheckpointTensors& out) {
  out.model.clear();
  out.optim.clear();
  out.names.clear();
  const std::size_t n = T.flat_size();
  CUTRAIN_CHECK(s.params.numel() == n, "checkpoint: the state snapshot holds ", s.params.numel(),
                " params, the parameter table ", n);
  auto at = [](const SnapshotTensor& v, const model::ParamTensor& t) {
    return static_cast<const char*>(v.data()) + t.offset * dtype_size(v.dtype());
  };
  for (const auto& t : T.tensors()) {
    out.model.push_back({t.name, s.params.dtype(), t.shape, at(s.params, t)});
    auto add = [&](const char* suffix, const SnapshotTensor& v) {
      if (v.empty()) return;
      CUTRAIN_CHECK(v.numel() == n, "checkpoint: the state snapshot's ", t.name, suffix, " holds ", v.numel(),
                    " elements, expected ", n);
      out.names.push_back(t.name + suffix);
      out.optim.push_back({out.names.back(), v.dtype(), t.shape, at(v, t)});
    };
    add(".master", s.master);
    add(".exp_avg", s.exp_avg);
    add(".exp_avg_sq", s.exp_avg_sq);
    add(".compensation", s.compensation);
  }
}

namespace {

// BERT's model fields in DeepSpeedTransformerConfig's names (model/bert_config.h).
json bert_config_json(const model::ModelDims& d) {
  const model::BertConfig& b = d.bert;
  return {{"pre_layer_norm", b.pre_layer_norm},
          {"layer_norm_eps", b.layer_norm_eps},
          {"attn_dropout_ratio", b.attn_dropout_ratio},
          {"hidden_dropout_ratio", b.hidden_dropout_ratio},
          {"initializer_range", b.initializer_range},
          {"adjust_init_range", b.adjust_init_range},
          {"normalize_invertible", b.normalize_invertible},
          {"gelu_checkpoint", b.gelu_checkpoint},
          {"attn_dropout_checkpoint", b.attn_dropout_checkpoint},
          {"stochastic_mode", b.stochastic_mode},
          {"mask_id", b.mask_id},
          {"pad_id", b.pad_id}};
}

model::BertConfig bert_config_from_json(const json& j, const std::string& where) {
  CUTRAIN_CHECK(j.is_object(), where, ": bert: expected an object, found ", describe_json(j));
  model::BertConfig b;
  auto flag = [&](const char* key, bool& v) {
    CUTRAIN_CHECK(j.contains(key) && j[key].is_boolean(), where, ": bert.", key, ": expected true or false, found ",
                  j.contains(key) ? describe_json(j[key]) : std::string("none"));
    v = j[key].get<bool>();
  };
  auto number = [&](const char* key, auto& v) {
    CUTRAIN_CHECK(j.contains(key) && j[key].is_number(), where, ": bert.", key, ": expected a number, found ",
                  j.contains(key) ? describe_json(j[key]) : std::string("none"));
    v = j[key].get<std::decay_t<decltype(v)>>();
  };
  flag("pre_layer_norm", b.pre_layer_norm);
  number("layer_norm_eps", b.layer_norm_eps);
  number("attn_dropout_ratio", b.attn_dropout_ratio);
  number("hidden_dropout_ratio", b.hidden_dropout_ratio);
  number("initializer_range", b.initializer_range);
  flag("adjust_init_range", b.adjust_init_range);
  flag("normalize_invertible", b.normalize_invertible);
  flag("gelu_checkpoint", b.gelu_checkpoint);
  flag("attn_dropout_checkpoint", b.attn_dropout_checkpoint);
  flag("stochastic_mode", b.stochastic_mode);
  number("mask_id", b.mask_id);
  number("pad_id", b.pad_id);
  return b;
}

const char* architecture_name(model::Arch a) {
  return a == model::Arch::Gpt2 ? "GPT2" : a == model::Arch::Bert ? "BERT" : "SimpleTransformerModel";
}

}  // namespace

json checkpoint_model_config(const model::ModelDims& d, DType param_dtype, DType moment_dtype, std::size_t num_params,
                             const std::string& layout, bool causal) {
  const bool gpt2 = d.arch == model::Arch::Gpt2, bert = d.arch == model::Arch::Bert;
  const bool pre_ln = gpt2 || (bert && d.bert.pre_layer_norm);
  json j = {{"architecture", architecture_name(d.arch)},
          {"hidden_dim", d.hidden},
          {"num_layers", d.layers},
          {"num_heads", d.heads},
          {"head_dim", d.head_dim()},
          {"ffn_dim", d.ffn()},
          {"vocab_size", d.vocab},
          {"embedding_rows", d.vocab_rows()},
          {"max_seq_len", d.max_seq},
          {"norm", pre_ln ? "pre_layernorm" : "post_layernorm"},
          {"layer_norm_eps", bert ? double(d.bert.layer_norm_eps) : 1e-5},
          {"activation", gpt2 ? "gelu_tanh" : "gelu"},
          {"tied_embeddings", gpt2 || bert},
          {"causal", causal && !bert},
          {"precision_layout", layout},
          {"param_dtype", safetensors_dtype_name(param_dtype)},
          {"optimizer_dtype", safetensors_dtype_name(moment_dtype)},
          {"num_params", num_params}};
  if (d.moe.any()) j["moe"] = moe_config_json(d.moe);  // the MoE blocks (train/moe_options.h)
  if (bert) j["bert"] = bert_config_json(d);
  return j;
}

void check_checkpoint_optimizer(const json& c, OptimizerType type, const std::string& where) {
  const bool recorded = c.is_object() && c.contains("optimizer");
  if (recorded && !c["optimizer"].is_string())
    throw OptimizerMismatchError(detail::concat(where, ": optimizer: expected a string, found ", describe_json(c["optimizer"])),
                                 __FILE__, __LINE__);
  const std::string saved = recorded ? c["optimizer"].get<std::string>() : "Adam or AdamW (not recorded)";
  const bool same = recorded ? saved == name(type) : type != OptimizerType::Lamb;
  if (!same)
    throw OptimizerMismatchError(
        detail::concat(where, ": optimizer: the checkpoint holds the state of optimizer ", saved,
                       ", this run's optimizer.type is ", name(type),
                       "; resume with the checkpoint's optimizer.type or start a new run (its exp_avg / exp_avg_sq "
                       "mean another optimizer's moments)"),
        __FILE__, __LINE__);
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
  CUTRAIN_CHECK(arch == "SimpleTransformerModel" || arch == "GPT2" || arch == "BERT", where, ": architecture: expected ",
                "\"SimpleTransformerModel\", \"GPT2\" or \"BERT\", found \"", arch, "\"");
  if (arch == "GPT2") d.arch = model::Arch::Gpt2;
  if (arch == "BERT") {
    d.arch = model::Arch::Bert;
    CUTRAIN_CHECK(c.contains("bert"), where, ": architecture BERT needs its \"bert\" object (DeepSpeedTransformerConfig's fields)");
    d.bert = bert_config_from_json(c["bert"], where);
    const int ffn = get("ffn_dim");
    if (ffn != 4 * d.hidden) d.intermediate = ffn;
  }
  if (c.contains("moe")) d.moe = moe_dims_from_json(c["moe"], where);
  return d;
}

CheckpointSaveReport save_checkpoint(const std::filesystem::path& root, const TrainBackend& be,
                                     const CheckpointMeta& meta, const CheckpointSaveOptions& opt) {
  StateSnapshot s;
  s.pinned = false;  // written right away: no copy engine reads it
  be.snapshot_state(s);  // first: a collective under ZeRO, every rank takes part
  if (!opt.write_files) return {};
  return write_checkpoint(root, be.table(), s, meta, opt);
}

CheckpointSaveReport write_checkpoint(const std::filesystem::path& root, const model::TransformerParams& T,
                                      const StateSnapshot& s, const CheckpointMeta& meta,
                                      const CheckpointSaveOptions& opt) {
  CheckpointSaveReport report;
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  CUTRAIN_CHECK(!ec, "checkpoint: cannot create directory ", root.string(), ": ", ec.message());
  if (const auto stale = remove_stale_temps(root); !stale.empty()) {
    std::string line = "removed what killed saves left in " + root.string() + ":";
    for (const auto& n : stale) line += " " + n;
    report.notes.push_back(line);
  }
  CheckpointFiles files(opt.io, opt.handle);
  StepFolderWriter folder(root, meta.step);
  const std::filesystem::path& dir = folder.dir();
  CheckpointTensors ct;
  checkpoint_tensors(T, s, ct);
  const SafetensorsMetadata md{{"format", "pt"}, {"producer", "cutrain"}};
  Manifest m;
  m.tag = folder.tag();
  m.step = meta.step;
  m.config = checkpoint_model_config(T.dims(), s.params.dtype(), s.exp_avg.dtype(), T.num_params(), meta.layout,
                                     meta.causal);
  if (!meta.optimizer.empty()) m.config["optimizer"] = meta.optimizer;
  auto add = [&](const char* name, FileDigest d) {
    m.files.push_back({name, d.bytes, d.xxh64});
    report.bytes += d.bytes;
  };
  checkpoint_fault_point("start", meta.step);
  add(kModel, files.write_safetensors(dir / kModel, ct.model, md));
  add(kOptim, files.write_safetensors(dir / kOptim, ct.optim, md));
  auto add_text = [&](const char* name, const std::string& text) {
    write_file_atomic(dir / name, std::string_view(text));
    add(name, {text.size(), xxh64(text.data(), text.size())});
  };
  json state = {{"step", meta.step}, {"data_rng", meta.data_rng}, {"num_params", T.num_params()}};
  if (meta.loss_scaler) {
    const LossScalerState& ls = *meta.loss_scaler;
    state["loss_scaler"] = {{"cur_scale", ls.scale},
                            {"cur_iter", ls.iter},
                            {"last_overflow_iter", ls.last_overflow_iter},
                            {"cur_hysteresis", ls.hysteresis}};
  }
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

OpenedCheckpoint open_checkpoint(const std::filesystem::path& path, bool accept_legacy, bool checksum_on_load) {
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
  if (checksum_on_load) c.checksum_on_load = {kModel, kOptim};
  VerifiedFolder v = verify_checkpoint_folder(folder, c.checksum_on_load);
  c.folder = v.folder;
  c.manifest = std::move(v.manifest);
  for (const auto& n : v.notes)
    c.notes.push_back("note: " + (folder / n).string() + " is not listed in " + kManifestFile + " (not read)");
  return c;
}

CheckpointMeta load_checkpoint(const std::filesystem::path& path, TrainBackend& be, CheckpointIo io) {
  return load_checkpoint(open_checkpoint(path), be, io);
}

namespace {

// The dtype of one part of the state in `r` (the tensors named <table name><suffix>, all of one
// dtype: checked when the reads are made), nullopt when the file has none of it.
std::optional<DType> part_dtype(const SafetensorsReader& r, const model::TransformerParams& T, const char* suffix) {
  const std::string first = T.tensors().front().name + suffix;
  if (!r.contains(first)) return std::nullopt;
  const SafetensorsTensorInfo& fi = r.tensor(first);
  CUTRAIN_CHECK(fi.dtype == DType::F32 || fi.dtype == DType::BF16 || fi.dtype == DType::F16, r.path().string(),
                ": tensor '", first, "' is ", fi.dtype_name, ", expected BF16, F16 or F32");
  return *fi.dtype;
}

// The reads of one part into the flat buffer `base` (host or device) of that dtype. On the host
// the flat layout's padding is zeroed here (device scratch comes zeroed).
std::vector<TensorRead> part_reads(const SafetensorsReader& r, const model::TransformerParams& T, const char* suffix,
                                   DType dt, char* base, bool device) {
  const std::size_t es = dtype_size(dt), n = T.flat_size();
  const std::string first = T.tensors().front().name + suffix;
  std::vector<TensorRead> reads;
  std::size_t filled = 0;  // elements up to here are read or zeroed
  for (const auto& t : T.tensors()) {
    const std::string name = t.name + suffix;
    const SafetensorsTensorInfo& info = r.tensor(name);
    CUTRAIN_CHECK(info.shape == t.shape, r.path().string(), ": tensor '", name, "' has a shape of ", info.shape.size(),
                  " dims / ", info.numel(), " elements, the model expects ", t.count, " elements");
    CUTRAIN_CHECK(info.dtype == dt, r.path().string(), ": tensor '", name, "' is ", info.dtype_name, ", expected ",
                  safetensors_dtype_name(dt), " as '", first, "'");
    if (!device && t.offset > filled) std::memset(base + filled * es, 0, (t.offset - filled) * es);
    reads.push_back({name, base + t.offset * es, t.count * es, device});
    filled = std::max(filled, t.offset + t.count);
  }
  if (!device && n > filled) std::memset(base + filled * es, 0, (n - filled) * es);
  return reads;
}

// trainer_state.json's "loss_scaler" (fp16 runs), checked before any state is restored.
std::optional<LossScalerState> loss_scaler_of(const json& j, const std::string& where) {
  if (!j.contains("loss_scaler")) return std::nullopt;
  const json& ls = j["loss_scaler"];
  CUTRAIN_CHECK(ls.is_object(), "checkpoint: ", where, ": loss_scaler: expected an object, found ", ls.dump());
  auto num = [&](const char* key) -> const json& {
    CUTRAIN_CHECK(ls.contains(key) && ls[key].is_number(), "checkpoint: ", where, ": loss_scaler.", key,
                  ": expected a number, found ", ls.contains(key) ? ls[key].dump() : std::string("nothing"));
    return ls[key];
  };
  auto integer = [&](const char* key) -> std::int64_t {
    const json& v = num(key);
    CUTRAIN_CHECK(v.is_number_integer(), "checkpoint: ", where, ": loss_scaler.", key, ": expected an integer, found ",
                  v.dump());
    return v.get<std::int64_t>();
  };
  LossScalerState st;
  st.scale = num("cur_scale").get<double>();
  CUTRAIN_CHECK(std::isfinite(st.scale) && st.scale > 0, "checkpoint: ", where,
                ": loss_scaler.cur_scale: expected a positive finite scale, found ", ls["cur_scale"].dump());
  st.iter = integer("cur_iter");
  st.last_overflow_iter = integer("last_overflow_iter");
  st.hysteresis = int(integer("cur_hysteresis"));
  return st;
}

}  // namespace

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
    CUTRAIN_CHECK(want.arch == have.arch, where, ": architecture is ", architecture_name(want.arch),
                  ", the model being loaded into is ", architecture_name(have.arch));
    same("ffn_dim", want.ffn(), have.ffn());
    if (want.arch == model::Arch::Bert)
      CUTRAIN_CHECK(want.bert.pre_layer_norm == have.bert.pre_layer_norm, where, ": bert.pre_layer_norm is ",
                    want.bert.pre_layer_norm, ", the model being loaded into has ", have.bert.pre_layer_norm);
  }
  // The files in their own dtypes, each read once, its checksum (when left to the load) computed
  // in the same pass and checked before the backend's state changes: straight into device scratch
  // when the backend takes the dtypes as they are (the aio path), else into a host snapshot
  // (pinned with a GPU) that restore_snapshot converts where needed.
  CheckpointFiles files(io);
  SafetensorsReader mr(dir / kModel), orr(dir / kOptim);
  struct Part {
    const SafetensorsReader* r;
    const char* suffix;
    bool required;
    SnapshotTensor* host;
    DeviceRestore::Part dev;
  };
  StateSnapshot s;
  s.pinned = gpu_available();
  const Part parts[5] = {{&mr, "", true, &s.params, DeviceRestore::Params},
                         {&orr, ".master", false, &s.master, DeviceRestore::Master},
                         {&orr, ".exp_avg", true, &s.exp_avg, DeviceRestore::ExpAvg},
                         {&orr, ".exp_avg_sq", true, &s.exp_avg_sq, DeviceRestore::ExpAvgSq},
                         {&orr, ".compensation", false, &s.compensation, DeviceRestore::Compensation}};
  std::optional<DType> dts[5];
  for (int i = 0; i < 5; ++i) {
    dts[i] = part_dtype(*parts[i].r, T, parts[i].suffix);
    CUTRAIN_CHECK(dts[i] || !parts[i].required, parts[i].r->path().string(), ": expected tensor '",
                  T.tensors().front().name + parts[i].suffix, "', found none");
  }
  // The compensation is all or nothing: saved for every tensor or for none. A backend keeping one
  // starts it at zero when the file has none (its weights are the checkpoint's bf16 master exactly);
  // one without it drops the file's.
  std::vector<std::string> notes;
  if (be.has_compensation() && !dts[4]) {
    notes.push_back("warning: " + (dir / kOptim).string() +
                    " has no compensation tensors (saved without bf16.bf16_master_compensation): the compensation "
                    "starts at zero");
  } else if (!be.has_compensation() && dts[4]) {
    notes.push_back("warning: " + (dir / kOptim).string() +
                    " holds a bf16 master's compensation; this run has bf16.bf16_master_compensation off and drops it");
    dts[4].reset();
  }
  std::unique_ptr<DeviceRestore> dev;
  if (files.io() == CheckpointIo::Aio && *dts[2] == *dts[3])
    dev = be.device_restore(*dts[0], dts[1], *dts[2], dts[4]);
  std::vector<TensorRead> model_reads, optim_reads;
  for (int i = 0; i < 5; ++i) {
    const Part& p = parts[i];
    char* base = nullptr;
    if (!dts[i]) {
      p.host->clear();  // a part the file does not have (device scratch for it stays zero)
    } else if (dev) {
      base = static_cast<char*>(dev->part(p.dev));
    } else {
      base = static_cast<char*>(p.host->reserve(*dts[i], T.flat_size(), s.pinned));
    }
    if (!base) continue;  // a part the file or the state does not have
    auto r = part_reads(*p.r, T, p.suffix, *dts[i], base, dev != nullptr);
    auto& into = p.r == &mr ? model_reads : optim_reads;
    into.insert(into.end(), r.begin(), r.end());
  }
  auto wants = [&](const char* f) {
    return std::find(c.checksum_on_load.begin(), c.checksum_on_load.end(), f) != c.checksum_on_load.end();
  };
  for (auto [reader, reads, name] : {std::tuple{&mr, &model_reads, kModel}, {&orr, &optim_reads, kOptim}}) {
    const std::optional<FileDigest> d = files.read(*reader, *reads, wants(name));
    if (d) check_file_digest(dir, c.manifest, name, d->bytes, d->xxh64);
  }
  const auto path = dir / kState;
  const json j = parse_json_strict(read_text_file(path), path.string());
  CUTRAIN_CHECK(j.is_object() && j.contains("step") && j["step"].is_number_integer() && j.contains("data_rng") &&
                    j["data_rng"].is_string(),
                "checkpoint: ", path.string(), ": expected an integer 'step' and a string 'data_rng'");
  if (j.contains("num_params"))
    CUTRAIN_CHECK(j["num_params"] == T.num_params(), "checkpoint: ", path.string(), ": num_params: expected ",
                  T.num_params(), " (the model's), found ", j["num_params"].dump());
  std::optional<LossScalerState> scaler = loss_scaler_of(j, path.string());
  if (dev) dev->commit();
  else be.restore_snapshot(s);
  CheckpointMeta meta{j["step"].get<int>(), j["data_rng"].get<std::string>(), {}, false, std::move(notes)};
  meta.loss_scaler = scaler;
  return meta;
}

}  // namespace cutrain::train
