// @brief Mixture-of-Students' flags and the teacher checkpoint (train/mos_options.h).
#include "train/mos_options.h"

#include <cmath>
#include <sstream>

#include "runtime/error.h"
#include "runtime/file_util.h"
#include "runtime/safetensors.h"
#include "runtime/text.h"
#include "train/checkpoint.h"

namespace cutrain::train {
namespace {

std::string list(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

// The experts of each MoE block of `d`, in block order (empty: dense).
std::vector<int> moe_counts(const model::ModelDims& d) {
  std::vector<int> c;
  for (int l = 0; l < d.layers; ++l)
    if (d.moe.is_moe(l)) c.push_back(d.moe.experts[std::size_t(l)]);
  return c;
}

}  // namespace

void check_mos_options(const MosOptions& o, bool resuming) {
  CUTRAIN_CHECK(!o.reset_iteration || resuming, "train: --reset_iteration restarts a resumed run's step count: ",
                "expected --resume DIR with it, found none");
  if (!o.active()) {
    CUTRAIN_CHECK(o.given.empty(), "train: ", join(o.given), " configure knowledge distillation: expected --mos (or ",
                  "--kd) too");
    return;
  }
  CUTRAIN_CHECK(!o.load_teacher.empty(), "train: --", o.mos ? "mos" : "kd",
                " distills from a teacher: expected --load_teacher DIR (a cutrain checkpoint), found none");
  CUTRAIN_CHECK(o.kd_temp > 0 && std::isfinite(o.kd_temp), "train: --kd_temp must be a finite number > 0, got ",
                o.kd_temp);
  CUTRAIN_CHECK(o.kd_alpha_ce >= 0 && std::isfinite(o.kd_alpha_ce), "train: --kd_alpha_ce must be a finite number ",
                ">= 0, got ", o.kd_alpha_ce);
  CUTRAIN_CHECK(o.kd_beta_ce >= 0 && std::isfinite(o.kd_beta_ce), "train: --kd_beta_ce must be a finite number >= 0, ",
                "got ", o.kd_beta_ce);
  CUTRAIN_CHECK(!o.stop_kd_step || *o.stop_kd_step >= 0, "train: --stop_kd_step must be >= 0 (the first step ",
                "without distillation), got ", o.stop_kd_step.value_or(0));
  auto positive = [](const char* flag, const std::optional<int>& v) {
    CUTRAIN_CHECK(!v || *v >= 1, "train: ", flag, " must be >= 1, got ", v.value_or(0));
  };
  positive("--num_layers_teacher", o.num_layers_teacher);
  positive("--hidden_size_teacher", o.hidden_size_teacher);
  positive("--num_attention_heads_teacher", o.num_attention_heads_teacher);
  for (int e : o.num_experts_teacher)
    CUTRAIN_CHECK(e >= 1, "train: --num_experts_teacher: each count must be >= 1 (1: a dense block), got ", e);
}

Teacher load_teacher(const MosOptions& o, const model::ModelDims& student, int seq_length) {
  const std::string flag = "--load_teacher " + o.load_teacher.string();
  CUTRAIN_CHECK(std::filesystem::is_directory(o.load_teacher), "train: ", flag,
                ": no such folder (expected a cutrain checkpoint: a --save ROOT or ROOT/global_step<N>)");
  const OpenedCheckpoint ck = open_checkpoint(o.load_teacher);
  CUTRAIN_CHECK(!ck.legacy, "train: ", flag, ": a checkpoint without a manifest; the teacher must be verifiable");
  Teacher t;
  t.folder = ck.folder;
  const std::string where = "the teacher's " + (ck.folder / kCheckpointConfigFile).string();
  const nlohmann::json& cfg = ck.manifest.config;
  t.dims = checkpoint_model_dims(cfg, where);
  t.causal = cfg.value("causal", false) || t.dims.arch == model::Arch::Gpt2;
  const model::ModelDims& d = t.dims;
  // The teacher flags given against the teacher's config.json.
  auto agree = [&](const char* f, const std::optional<int>& v, const char* key, int have) {
    CUTRAIN_CHECK(!v || *v == have, "train: ", f, " gives ", v.value_or(0), ", ", where, " has ", key, " ", have);
  };
  agree("--num_layers_teacher", o.num_layers_teacher, "num_layers", d.layers);
  agree("--hidden_size_teacher", o.hidden_size_teacher, "hidden_dim", d.hidden);
  agree("--num_attention_heads_teacher", o.num_attention_heads_teacher, "num_heads", d.heads);
  if (!o.num_experts_teacher.empty()) {
    const std::vector<int> have = moe_counts(d);
    const bool dense_flag = o.num_experts_teacher.size() == 1 && o.num_experts_teacher[0] == 1;
    bool same = dense_flag ? have.empty() : !have.empty();
    if (same && !dense_flag) {
      if (o.num_experts_teacher.size() == 1) {
        for (int e : have) same = same && e == o.num_experts_teacher[0];
      } else {
        same = have == o.num_experts_teacher;
      }
    }
    CUTRAIN_CHECK(same, "train: --num_experts_teacher gives ", list(o.num_experts_teacher), ", ", where,
                  " has experts per MoE block ", have.empty() ? std::string("none (dense)") : list(have));
  }
  // The teacher against the student: one vocabulary, positions for the run's sequences, no BERT.
  CUTRAIN_CHECK(d.arch != model::Arch::Bert && student.arch != model::Arch::Bert, "train: ", flag,
                ": knowledge distillation of BERT's masked-LM head is not built (teacher ",
                d.arch == model::Arch::Bert ? "BERT" : "causal / simple", ", student ",
                student.arch == model::Arch::Bert ? "BERT" : "causal / simple", ")");
  CUTRAIN_CHECK(d.vocab == student.vocab, "train: ", flag, ": vocab_size: the teacher has ", d.vocab, " (", where,
                "), the student ", student.vocab, "; distillation compares the two distributions over one vocabulary");
  CUTRAIN_CHECK(d.max_seq >= seq_length, "train: ", flag, ": max_seq_len: the teacher's position table has ", d.max_seq,
                " rows (", where, "), the run's sequences ", seq_length, " tokens (--seq_length)");
  d.validate();
  // Its model.safetensors against its config.json: every tensor of the table, by name and shape.
  const model::TransformerParams table(d);
  if (cfg.contains("num_params"))
    CUTRAIN_CHECK(cfg["num_params"].is_number_integer() && cfg["num_params"].get<std::size_t>() == table.num_params(),
                  "train: ", flag, ": num_params: ", where, " says ", cfg["num_params"].dump(), ", its shape has ",
                  table.num_params());
  const SafetensorsReader r(ck.folder / kCheckpointModelFile);
  t.params.assign(table.flat_size(), 0.f);
  for (const model::ParamTensor& p : table.tensors()) {
    CUTRAIN_CHECK(r.contains(p.name), "train: ", flag, ": ", r.path().string(), " has no tensor '", p.name, "', which ",
                  where, "'s shape has");
    const SafetensorsTensorInfo& info = r.tensor(p.name);
    auto shape = [](const std::vector<std::int64_t>& s) {
      std::string x = "[";
      for (std::size_t i = 0; i < s.size(); ++i) x += (i ? ", " : "") + std::to_string(s[i]);
      return x + "]";
    };
    CUTRAIN_CHECK(info.shape == p.shape, "train: ", flag, ": tensor '", p.name, "' of ", r.path().string(), " is ",
                  shape(info.shape), ", ", where, " gives ", shape(p.shape));
    CUTRAIN_CHECK(info.dtype == DType::F32 || info.dtype == DType::BF16, "train: ", flag, ": tensor '", p.name,
                  "' of ", r.path().string(), " is ", info.dtype_name, ", expected F32 or BF16");
    float* dst = t.params.data() + p.offset;
    if (info.dtype == DType::F32) {
      r.read(p.name, dst, p.count * sizeof(float));
    } else {
      std::vector<std::uint16_t> b(p.count);
      r.read(p.name, b.data(), p.count * sizeof(std::uint16_t));
      for (std::size_t i = 0; i < p.count; ++i) dst[i] = bf16_bits_to_f32(b[i]);
    }
  }
  const std::filesystem::path state = ck.folder / kCheckpointStateFile;
  const nlohmann::json js = nlohmann::json::parse(read_text_file(state), nullptr, false);
  if (js.is_object() && js.contains("step") && js["step"].is_number_integer()) t.step = js["step"].get<int>();
  return t;
}

std::string describe_teacher(const Teacher& t) {
  const model::ModelDims& d = t.dims;
  std::ostringstream s;
  s << "teacher " << t.folder.string() << " (step " << t.step << "): "
    << (d.arch == model::Arch::Gpt2 ? "GPT2" : "SimpleTransformerModel") << ", " << d.layers << " layers, hidden "
    << d.hidden << ", " << d.heads << " heads, ";
  const std::vector<int> c = moe_counts(d);
  if (c.empty()) {
    s << "dense";
  } else {
    std::string blocks;
    for (int l = 0; l < d.layers; ++l)
      if (d.moe.is_moe(l)) blocks += (blocks.empty() ? "" : ",") + std::to_string(l);
    s << "MoE blocks " << blocks << ": " << list(c) << " experts" << (d.moe.use_residual ? " (PR-MoE)" : "")
      << ", eval capacity factor " << d.moe.eval_capacity_factor;
  }
  s << ", " << model::TransformerParams(d).num_params() << " parameters";
  return s.str();
}

std::string describe_distillation(const MosOptions& o, double moe_loss_coeff, bool moe) {
  std::ostringstream s;
  s << "objective = " << o.kd_alpha_ce << " * ce + " << o.kd_beta_ce << " * T^2 * KL(teacher || student) (T = "
    << o.kd_temp << ", the mean over the micro-batch's rows)";
  if (moe) s << " + " << moe_loss_coeff << " * l_aux";
  if (o.stop_kd_step)
    s << ", until step " << *o.stop_kd_step << " (--stop_kd_step; then the teacher is freed and the objective is ce"
      << (moe ? " + l_aux" : "") << ")";
  else
    s << ", the whole run";
  return s.str();
}

}  // namespace cutrain::train
