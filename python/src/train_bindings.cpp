#include "train_bindings.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"
#include "train/checkpoint.h"
#include "train/choices.h"
#include "train/train_loop.h"

namespace cutrain::python {

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using train::TrainOptions;

// One keyword of train(): the `cutrain train` flag of the same name (docs/training.md).
using Setter = std::function<void(TrainOptions&, nb::handle)>;

template <class T>
T as(nb::handle v, const std::string& key, const char* expected) {
  T out{};
  if (!nb::try_cast(v, out))
    throw nb::type_error(("train: " + key + " must be " + expected + ", got " +
                          nb::cast<std::string>(nb::str(v.type().attr("__name__"))))
                             .c_str());
  return out;
}

std::vector<std::string> as_strings(nb::handle v, const std::string& key) {
  if (nb::isinstance<nb::str>(v)) return {nb::cast<std::string>(v)};
  std::vector<std::string> out;
  for (nb::handle x : nb::iter(v)) out.push_back(as<std::string>(x, key, "a str or a list of str"));
  return out;
}

const std::map<std::string, Setter>& setters() {
  using O = TrainOptions;
  static const std::map<std::string, Setter> table = [] {
    std::map<std::string, Setter> t;
    auto integer = [&](const char* k, int O::*f, bool O::ShapeGiven::*g = nullptr) {
      t[k] = [=](O& o, nb::handle v) {
        if (nb::isinstance<nb::bool_>(v)) throw nb::type_error((std::string("train: ") + k + " must be an int, got bool").c_str());
        o.*f = as<int>(v, k, "an int");
        if (g) o.shape_given.*g = true;
      };
    };
    auto flag = [&](const char* k, bool O::*f) { t[k] = [=](O& o, nb::handle v) { o.*f = as<bool>(v, k, "a bool"); }; };
    auto path = [&](const char* k, std::filesystem::path O::*f) {
      t[k] = [=](O& o, nb::handle v) { o.*f = as<std::string>(nb::str(v), k, "a path"); };
    };
    using G = O::ShapeGiven;
    integer("hidden_dim", &O::hidden_dim, &G::hidden_dim);
    integer("num_layers", &O::num_layers, &G::num_layers);
    integer("num_heads", &O::num_heads, &G::num_heads);
    integer("vocab_size", &O::vocab_size, &G::vocab_size);
    integer("seq_length", &O::seq_length, &G::seq_length);
    integer("pad_vocab", &O::pad_vocab, &G::pad_vocab);
    t["batch_size"] = [](O& o, nb::handle v) {
      if (nb::isinstance<nb::bool_>(v)) throw nb::type_error("train: batch_size must be an int, got bool");
      o.batch_size = as<int>(v, "batch_size", "an int");
      o.batch_size_given = true;
    };
    integer("max_seq_len", &O::max_seq_len);
    integer("num_steps", &O::num_steps);
    integer("warmup_steps", &O::warmup_steps);
    integer("eval_interval", &O::eval_interval);
    integer("eval_steps", &O::eval_steps);
    flag("activation_checkpointing", &O::activation_checkpointing);
    flag("recompute_gelu", &O::recompute_gelu);
    flag("use_real_data", &O::use_real_data);
    flag("cuda_graph", &O::cuda_graph);
    flag("fixed_batch", &O::fixed_batch);
    flag("accept_legacy_checkpoint", &O::accept_legacy_checkpoint);
    path("loss_log_file", &O::loss_log_file);
    path("metrics_file", &O::metrics_file);
    path("save", &O::save_dir);
    path("resume", &O::resume_dir);
    path("init_from_llmc", &O::init_from_llmc);
    path("save_llmc", &O::save_llmc);
    path("init_from_hf", &O::init_from_hf);
    path("save_hf", &O::save_hf);
    t["seed"] = [](O& o, nb::handle v) { o.seed = as<std::uint64_t>(v, "seed", "a non-negative int"); };
    t["learning_rate"] = [](O& o, nb::handle v) { o.learning_rate = as<float>(v, "learning_rate", "a float"); };
    t["log_interval"] = [](O& o, nb::handle v) { o.log_interval = as<int>(v, "log_interval", "an int"); };
    t["save_interval"] = [](O& o, nb::handle v) { o.save_interval = as<int>(v, "save_interval", "an int"); };
    t["keep_last"] = [](O& o, nb::handle v) { o.keep_last = as<int>(v, "keep_last", "an int"); };
    t["data"] = [](O& o, nb::handle v) { o.data = as_strings(v, "data"); };
    t["eval_data"] = [](O& o, nb::handle v) { o.eval_data = as_strings(v, "eval_data"); };
    t["device"] = [](O& o, nb::handle v) {
      o.device = train::parse_choice(train::kTrainDevices, as<std::string>(v, "device", "a str"), "device");
    };
    t["labels"] = [](O& o, nb::handle v) {
      o.labels = train::parse_choice(train::kLabelsChoices, as<std::string>(v, "labels", "a str"), "labels");
    };
    t["attention"] = [](O& o, nb::handle v) {
      o.attention = train::parse_choice(train::kAttentionChoices, as<std::string>(v, "attention", "a str"), "attention");
    };
    t["data_order"] = [](O& o, nb::handle v) {
      o.data_order = train::parse_choice(train::kDataOrders, as<std::string>(v, "data_order", "a str"), "data_order");
    };
    t["attention_backward"] = [](O& o, nb::handle v) {
      o.attention_backward = train::parse_choice(train::kAttentionBackwards,
                                                 as<std::string>(v, "attention_backward", "a str"), "attention_backward");
    };
    t["save_mode"] = [](O& o, nb::handle v) {
      o.save_mode = train::parse_choice(train::kSaveModes, as<std::string>(v, "save_mode", "a str"), "save_mode");
    };
    // model="bert" (docs/bert.md): the model config and bing_bert's flags.
    t["bert_config"] = [](O& o, nb::handle v) { o.bert.config = as<std::string>(nb::str(v), "bert_config", "a path"); };
    t["max_seq_length"] = [](O& o, nb::handle v) { o.bert.max_seq_length = as<int>(v, "max_seq_length", "an int"); };
    t["max_predictions_per_seq"] = [](O& o, nb::handle v) {
      o.bert.max_predictions_per_seq = as<int>(v, "max_predictions_per_seq", "an int");
    };
    for (auto [k, f] : {std::pair{"stochastic_mode", &train::BertFlags::stochastic_mode},
                        std::pair{"normalize_invertible", &train::BertFlags::normalize_invertible},
                        std::pair{"gelu_checkpoint", &train::BertFlags::gelu_checkpoint},
                        std::pair{"attention_dropout_checkpoint", &train::BertFlags::attention_dropout_checkpoint}})
      t[k] = [k, f](O& o, nb::handle v) { o.bert.*f = as<bool>(v, k, "a bool"); };
    t["model"] = [](O& o, nb::handle v) {
      o.model = train::parse_choice(train::kModelArchs, as<std::string>(v, "model", "a str"), "model");
    };
    return t;
  }();
  return table;
}

std::string known_flags() {
  std::string s;
  for (const auto& [k, _] : setters()) s += (s.empty() ? "" : ", ") + k;
  return s;
}

nb::dict train_py(const std::string& config, nb::dict flags, bool quiet) {
  TrainOptions o;
  // A library caller's shape is "given" only for the keywords it passes (a --resume takes the
  // checkpoint's shape for the others, as `cutrain train` does).
  o.shape_given = {false, false, false, false, false, false};
  o.batch_size_given = false;
  o.deepspeed_config = config;
  for (auto [k, v] : flags) {
    const std::string key = nb::cast<std::string>(nb::str(k));
    auto it = setters().find(key);
    if (it == setters().end())
      throw nb::type_error(("train: unknown flag '" + key + "' (expected one of: " + known_flags() + ")").c_str());
    it->second(o, v);
  }
  train::TrainResult r;
  {
    std::ostringstream sink;
    nb::gil_scoped_release release;
    r = train::run_training(o, quiet ? static_cast<std::ostream&>(sink) : std::cout);
    std::cout.flush();
  }
  nb::list evals;
  for (const auto& e : r.evals) {
    nb::dict d;
    d["after_step"] = e.after_step;
    d["loss"] = e.loss;
    d["perplexity"] = e.perplexity;
    d["batches"] = e.batches;
    evals.append(d);
  }
  nb::list losses;
  for (double l : r.losses) losses.append(l);
  nb::list failed;
  for (int s : r.saves.failed_steps) failed.append(s);
  nb::dict saves;
  saves["saves"] = r.saves.saves;
  saves["async"] = r.saves.async;
  saves["failed_steps"] = failed;
  saves["bytes"] = r.saves.bytes;
  saves["snapshot_s"] = r.saves.snapshot_s;
  saves["wait_s"] = r.saves.wait_s;
  saves["write_s"] = r.saves.write_s;
  nb::dict out;
  out["losses"] = losses;
  out["final_loss"] = r.losses.empty() ? nb::none() : nb::cast(r.losses.back());
  out["avg_step_time"] = r.avg_step_time;
  out["peak_bytes"] = r.peak_bytes;
  out["alloc_bytes"] = r.alloc_bytes;
  out["params"] = r.params;
  out["evals"] = evals;
  out["checkpoints"] = saves;
  return out;
}

nb::dlpack::dtype dl_dtype(DType t) {
  using C = nb::dlpack::dtype_code;
  auto d = [](C c, int bits) { return nb::dlpack::dtype{static_cast<std::uint8_t>(c), static_cast<std::uint8_t>(bits), 1}; };
  switch (t) {
    case DType::F32: return d(C::Float, 32);
    case DType::BF16: return d(C::Bfloat, 16);
    case DType::F16: return d(C::Float, 16);
    case DType::I32: return d(C::Int, 32);
    case DType::U16: return d(C::UInt, 16);
    case DType::U8: return d(C::UInt, 8);
  }
  CUTRAIN_FAIL("load_checkpoint: unknown dtype");
}

// framework "torch": torch tensors in the file's dtypes; "numpy": NumPy arrays, bf16 widened to
// float32 (exactly: NumPy has no bfloat16).
nb::dict load_checkpoint_py(const std::string& path, const std::string& framework) {
  if (framework != "torch" && framework != "numpy")
    throw nb::value_error(("load_checkpoint: framework must be 'torch' or 'numpy', got '" + framework + "'").c_str());
  const bool torch = framework == "torch";
  struct Tensor {
    std::string name;
    DType dtype;
    std::vector<std::size_t> shape;
    std::vector<std::byte>* bytes;
  };
  std::vector<Tensor> tensors;
  {
    nb::gil_scoped_release release;
    train::OpenedCheckpoint ck = train::open_checkpoint(path);
    SafetensorsReader reader(ck.folder / train::kCheckpointModelFile);
    for (const auto& info : reader.tensors()) {
      CUTRAIN_CHECK(info.dtype.has_value(), "load_checkpoint: '", reader.path().string(), "': tensor '", info.name,
                    "' has dtype ", info.dtype_name, ", which cutrain does not read");
      auto* bytes = new std::vector<std::byte>(reader.read(info.name));
      DType dt = *info.dtype;
      if (dt == DType::BF16 && !torch) {
        auto* wide = new std::vector<std::byte>(bytes->size() * 2);
        const std::size_t n = bytes->size() / 2;
        for (std::size_t i = 0; i < n; ++i) {
          std::uint16_t b;
          std::memcpy(&b, bytes->data() + 2 * i, 2);
          const float f = bf16_bits_to_f32(b);
          std::memcpy(wide->data() + 4 * i, &f, 4);
        }
        delete bytes;
        bytes = wide;
        dt = DType::F32;
      }
      std::vector<std::size_t> shape(info.shape.begin(), info.shape.end());
      tensors.push_back({info.name, dt, std::move(shape), bytes});
    }
  }
  nb::dict out;
  for (auto& t : tensors) {
    nb::capsule owner(t.bytes, [](void* p) noexcept { delete static_cast<std::vector<std::byte>*>(p); });
    if (torch)
      out[t.name.c_str()] = nb::ndarray<nb::pytorch>(t.bytes->data(), t.shape.size(), t.shape.data(), owner, nullptr,
                                                     dl_dtype(t.dtype), nb::device::cpu::value)
                                .cast();
    else
      out[t.name.c_str()] = nb::ndarray<nb::numpy>(t.bytes->data(), t.shape.size(), t.shape.data(), owner, nullptr,
                                                   dl_dtype(t.dtype), nb::device::cpu::value)
                                .cast();
  }
  return out;
}

}  // namespace

void bind_train(nb::module_& m) {
  m.def("_train", &train_py, "config"_a, "flags"_a, "quiet"_a);
  m.def("_load_checkpoint", &load_checkpoint_py, "path"_a, "framework"_a);
  m.def("_train_flags", [] {
    nb::list l;
    for (const auto& [k, _] : setters()) l.append(k);
    return l;
  });
}

}  // namespace cutrain::python
