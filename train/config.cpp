// DeepSpeed-style JSON -> TrainConfig: one parse function per section (the keys each accepts are
// the key table's, train/config_keys.cpp), the table's pass (warnings for keys read but not acted
// on, errors for features cutrain lacks), then the cross-section checks DeepSpeed itself would fail
// on (or silently misbehave with).
#include "train/config.h"

#include <cmath>
#include <limits>

#include "runtime/file_util.h"
#include "runtime/json_util.h"
#include "train/config_reader.h"

namespace cutrain::train {
namespace {

using config_detail::join_path;
using config_detail::Reader;
using nlohmann::json;
constexpr std::int64_t kMaxInt = std::numeric_limits<int>::max();
constexpr std::int64_t kMaxI64 = std::numeric_limits<std::int64_t>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();

void parse_optimizer(Reader& r, const json& j, OptimizerConfig& o) {
  const std::string path = "optimizer";
  r.check_object(j, path);
  r.read_choice(j, path, "type", o.type, kOptimizerTypes);
  bool adam_w_mode_given = false;
  if (const json* p = Reader::find(j, "params")) {
    const std::string pp = "optimizer.params";
    r.check_object(*p, pp);
    r.read(*p, pp, "lr", o.lr, 0.0, kInf);
    if (const json* b = Reader::find(*p, "betas")) {
      if (!b->is_array() || b->size() != 2) r.fail_expected(pp + ".betas", "an array of 2 numbers", *b);
      o.beta1 = static_cast<float>(r.as_number((*b)[0], pp + ".betas[0]", 0.0, 1.0, false, true));
      o.beta2 = static_cast<float>(r.as_number((*b)[1], pp + ".betas[1]", 0.0, 1.0, false, true));
    }
    r.read(*p, pp, "eps", o.eps, 0.0, kInf, /*lo_open=*/true);
    r.read(*p, pp, "weight_decay", o.weight_decay, 0.0, kInf);
    adam_w_mode_given = Reader::find(*p, "adam_w_mode") != nullptr;
    r.read(*p, pp, "adam_w_mode", o.adam_w_mode);
    r.read(*p, pp, "bias_correction", o.bias_correction);
    bool unused = false;
    r.read(*p, pp, "torch_adam", unused);
    if (const json* a = Reader::find(*p, "amsgrad")) r.as_bool(*a, pp + ".amsgrad");
    r.read(*p, pp, "max_coeff", o.max_coeff, 0.0, kInf);
    r.read(*p, pp, "min_coeff", o.min_coeff, 0.0, kInf);
    r.read(*p, pp, "eps_inside_sqrt", o.eps_inside_sqrt);
    // DeepSpeed passes params to the optimizer's constructor as keyword arguments: a parameter of
    // the other family is a TypeError there, so it is an error here.
    const bool lamb = o.type == OptimizerType::Lamb;
    for (const char* k : {"max_coeff", "min_coeff", "eps_inside_sqrt"})
      if (!lamb && Reader::find(*p, k))
        r.fail(pp + "." + k, std::string(k) + " is a parameter of type Lamb; type is " + name(o.type));
    for (const char* k : {"adam_w_mode", "torch_adam"})
      if (lamb && Reader::find(*p, k)) r.fail(pp + "." + k, std::string(k) + " is a parameter of type Adam / AdamW; type is Lamb");
    if (!lamb && !o.bias_correction)
      r.fail(pp + ".bias_correction", "Adam without bias correction is not implemented (type Lamb supports it)");
    if (o.min_coeff > o.max_coeff)
      r.fail(pp + ".min_coeff", detail::concat("min_coeff ", o.min_coeff, " is above max_coeff ", o.max_coeff));
  }
  // DeepSpeed: type AdamW is always decoupled weight decay; adam_w_mode only matters for type Adam.
  if (o.type == OptimizerType::AdamW) {
    if (adam_w_mode_given && !o.adam_w_mode)
      r.warn("optimizer.params.adam_w_mode", "false has no effect with type AdamW (DeepSpeed ignores it too)");
    o.adam_w_mode = true;
  }
}

void parse_scheduler(Reader& r, const json& j, SchedulerConfig& s) {
  r.check_object(j, "scheduler");
  const json* t = Reader::find(j, "type");
  if (!t) r.fail_missing("scheduler.type", "\"WarmupLR\", \"WarmupDecayLR\" or \"WarmupCosineLR\"", "a scheduler section needs a type");
  r.read_choice(j, "scheduler", "type", s.type, kSchedulerTypes);
  static const json empty = json::object();
  const json* p = Reader::find(j, "params");
  if (!p) p = &empty;
  const std::string pp = "scheduler.params";
  // DeepSpeed passes params as keyword arguments: a key of another scheduler is a TypeError there,
  // so an unknown key here is an error even without strict.
  if (s.type == SchedulerType::WarmupCosineLR)
    r.check_object(*p, pp, {"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type", "last_batch_iteration"}, true);
  else if (s.type == SchedulerType::WarmupDecayLR)
    r.check_object(*p, pp, {"total_num_steps", "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration"}, true);
  else
    r.check_object(*p, pp, {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration"}, true);
  if (const json* v = Reader::find(*p, "last_batch_iteration")) r.as_int(*v, pp + ".last_batch_iteration", -1, kMaxInt);
  r.read(*p, pp, "warmup_num_steps", s.warmup_num_steps, 1, kMaxInt);
  r.read_choice(*p, pp, "warmup_type", s.warmup_type, kWarmupTypes);
  if (s.type == SchedulerType::WarmupCosineLR) {
    r.read(*p, pp, "warmup_min_ratio", s.warmup_min_ratio, 0.0, 1.0);
    r.read(*p, pp, "cos_min_ratio", s.cos_min_ratio, 0.0, 1.0);
  } else {
    r.read(*p, pp, "warmup_min_lr", s.warmup_min_lr, 0.0, kInf);
    if (const json* v = Reader::find(*p, "warmup_max_lr"); v && !v->is_null())
      s.warmup_max_lr = static_cast<float>(r.as_number(*v, pp + ".warmup_max_lr", 0.0, kInf));
  }
  if (s.type != SchedulerType::WarmupLR) {
    if (!Reader::find(*p, "total_num_steps"))
      r.fail_missing(pp + ".total_num_steps", "a positive integer", std::string(name(s.type)) + " requires it");
    r.read(*p, pp, "total_num_steps", s.total_num_steps, 1, kMaxInt);
    if (s.total_num_steps < s.warmup_num_steps)
      r.warn(pp + ".total_num_steps", detail::concat(s.total_num_steps, " is less than warmup_num_steps ", s.warmup_num_steps));
  }
  if (s.type == SchedulerType::WarmupDecayLR && !s.warmup_max_lr)
    r.warn(pp + ".warmup_max_lr", "not given: DeepSpeed's WarmupDecayLR then peaks at 0.001, not at the optimizer lr");
}

// Returns whether the block names stochastic_rounding (its default depends on the layout).
bool parse_bf16(Reader& r, const json& j, const std::string& path, Bf16Config& b) {
  r.check_object(j, path);
  r.read(j, path, "enabled", b.enabled);
  r.read(j, path, "bf16_master_weights_and_grads", b.bf16_master_weights_and_grads);
  r.read(j, path, "bf16_optimizer_states", b.bf16_optimizer_states);
  r.read(j, path, "stochastic_rounding", b.stochastic_rounding);
  r.read(j, path, "bf16_master_compensation", b.bf16_master_compensation);
  return j.is_object() && j.contains("stochastic_rounding");
}

// bf16 master weights round their updates stochastically unless the config says otherwise or
// compensates them: on WikiText-2 both recover the fp32 master's validation loss (within
// 0.02% and 0.05%), and stochastic rounding costs no memory and no extra pass
// (docs/perf-notes.md, "BF16 master weights").
void default_stochastic_rounding(Bf16Config& b) {
  b.stochastic_rounding = b.bf16_master_weights_and_grads && !b.bf16_master_compensation;
}

void parse_fp16(Reader& r, const json& j, Fp16Config& f) {
  const std::string path = "fp16";
  r.check_object(j, path);
  r.read(j, path, "enabled", f.enabled);
  r.read(j, path, "auto_cast", f.auto_cast);
  r.read(j, path, "loss_scale", f.loss_scale, 0.0, kInf);
  r.read(j, path, "initial_scale_power", f.initial_scale_power, 0, 63);
  r.read(j, path, "loss_scale_window", f.loss_scale_window, 1, kMaxInt);
  r.read(j, path, "hysteresis", f.hysteresis, 1, kMaxInt);
  r.read(j, path, "consecutive_hysteresis", f.consecutive_hysteresis);
  // DeepSpeed's DeepSpeedFP16Config types min_loss_scale as an int (a fraction fails there).
  if (const json* v = Reader::find(j, "min_loss_scale"))
    f.min_loss_scale = static_cast<float>(r.as_int(*v, path + ".min_loss_scale", 1, kMaxInt));
  if (f.loss_scale == 0.f && std::ldexp(1.0, f.initial_scale_power) < f.min_loss_scale)
    r.fail(path + ".initial_scale_power",
           detail::concat("the dynamic scale starts at 2^", f.initial_scale_power, ", below min_loss_scale ",
                          f.min_loss_scale));
}

void parse_offload(Reader& r, const json& j, const std::string& path, bool optimizer, OffloadConfig& o) {
  r.check_object(j, path);
  if (const json* d = Reader::find(j, "device"); d && d->is_null()) {
    o.device = OffloadTarget::None;
  } else {
    r.read_choice(j, path, "device", o.device, kOffloadTargets);
  }
  if (const json* n = Reader::find(j, "nvme_path"); n && !n->is_null()) o.nvme_path = r.as_string(*n, path + ".nvme_path");
  r.read(j, path, "pin_memory", o.pin_memory);
  r.read(j, path, "buffer_count", o.buffer_count, 1, kMaxInt);
  if (optimizer) {
    r.read(j, path, "pipeline_read", o.pipeline_read);
    r.read(j, path, "pipeline_write", o.pipeline_write);
    r.read(j, path, "fast_init", o.fast_init);
    r.read(j, path, "ratio", o.ratio, 0.0, 1.0, true);
  } else {
    r.read(j, path, "buffer_size", o.buffer_size, 1, kMaxI64);
    r.read(j, path, "max_in_cpu", o.max_in_cpu, 0, kMaxI64);
  }
  if (o.device == OffloadTarget::Nvme && o.nvme_path.empty())
    r.fail_missing(path + ".nvme_path", "a directory path", "device \"nvme\" needs a place for its swap files");
}

void parse_zero(Reader& r, const json& j, ZeroConfig& z) {
  const std::string path = "zero_optimization";
  r.check_object(j, path);
  r.read(j, path, "stage", z.stage, 0, 3);
  r.read(j, path, "overlap_comm", z.overlap_comm);
  r.read(j, path, "contiguous_gradients", z.contiguous_gradients);
  r.read(j, path, "reduce_bucket_size", z.reduce_bucket_size, 1, kMaxI64);
  r.read(j, path, "allgather_bucket_size", z.allgather_bucket_size, 1, kMaxI64);
  r.read(j, path, "reduce_scatter", z.reduce_scatter);
  r.read(j, path, "allgather_partitions", z.allgather_partitions);
  r.read(j, path, "stage3_param_persistence_threshold", z.stage3_param_persistence_threshold, 0, kMaxI64);
  r.read(j, path, "stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size, 0, kMaxI64);
  r.read(j, path, "stage3_max_live_parameters", z.stage3_max_live_parameters, 0, kMaxI64);
  r.read(j, path, "stage3_max_reuse_distance", z.stage3_max_reuse_distance, 0, kMaxI64);
  r.read(j, path, "sub_group_size", z.sub_group_size, 1, kMaxI64);
  r.read(j, path, "round_robin_gradients", z.round_robin_gradients);
  r.read(j, path, "stage3_gather_16bit_weights_on_model_save", z.stage3_gather_16bit_weights_on_model_save);
  if (const json* o = Reader::find(j, "offload_optimizer"))
    parse_offload(r, *o, path + ".offload_optimizer", true, z.offload_optimizer);
  if (const json* o = Reader::find(j, "offload_param")) parse_offload(r, *o, path + ".offload_param", false, z.offload_param);
  if (z.offload_param.device != OffloadTarget::None && z.stage != 3)
    r.fail(path + ".offload_param.device",
           detail::concat("offloading parameters needs ZeRO stage 3 (they are partitioned only there), but stage is ", z.stage));
  if (z.offload_optimizer.device != OffloadTarget::None && z.stage == 0)
    r.fail(path + ".offload_optimizer.device", "offloading the optimizer needs ZeRO stage 1, 2 or 3, but stage is 0");
}

void parse_autocast(Reader& r, const json& j, AutocastConfig& a) {
  const std::string path = "torch_autocast";
  r.check_object(j, path);
  r.read(j, path, "enabled", a.enabled);
  if (const json* d = Reader::find(j, "dtype")) {
    std::string s = r.as_string(*d, path + ".dtype");
    if (s == "torch.bfloat16" || s == "bfloat16" || s == "torch.bf16") a.dtype = AutocastDtype::BFloat16;
    else if (s == "torch.float16" || s == "float16" || s == "torch.half") a.dtype = AutocastDtype::Float16;
    else r.fail_expected(path + ".dtype", "\"torch.bfloat16\" or \"torch.float16\"", *d);
  }
  if (const json* m = Reader::find(j, "lower_precision_safe_modules")) {
    const std::string mp = path + ".lower_precision_safe_modules";
    if (!m->is_array()) r.fail_expected(mp, "an array of module class names", *m);
    a.lower_precision_safe_modules.clear();
    for (std::size_t i = 0; i < m->size(); ++i)
      a.lower_precision_safe_modules.push_back(r.as_string((*m)[i], detail::concat(mp, "[", i, "]")));
  }
}

void parse_activation_checkpointing(Reader& r, const json& j, ActivationCheckpointingConfig& a) {
  const std::string path = "activation_checkpointing";
  r.check_object(j, path);
  r.read(j, path, "partition_activations", a.partition_activations);
  r.read(j, path, "cpu_checkpointing", a.cpu_checkpointing);
  r.read(j, path, "contiguous_memory_optimization", a.contiguous_memory_optimization);
  if (const json* n = Reader::find(j, "number_checkpoints"); n && !n->is_null())
    a.number_checkpoints = static_cast<int>(r.as_int(*n, path + ".number_checkpoints", 1, kMaxInt));
  r.read(j, path, "synchronize_checkpoint_boundary", a.synchronize_checkpoint_boundary);
  r.read(j, path, "profile", a.profile);
  // DeepSpeed's checkpointing asserts these too.
  if (a.cpu_checkpointing && !a.partition_activations)
    r.fail(path + ".cpu_checkpointing", "cpu_checkpointing needs partition_activations: true");
  if (a.contiguous_memory_optimization && !a.partition_activations)
    r.fail(path + ".contiguous_memory_optimization", "contiguous_memory_optimization needs partition_activations: true");
  if (a.contiguous_memory_optimization && !a.number_checkpoints)
    r.fail(path + ".contiguous_memory_optimization", "contiguous_memory_optimization needs number_checkpoints (the layer count)");
}

void parse_aio(Reader& r, const json& j, AioConfig& a) {
  const std::string path = "aio";
  r.check_object(j, path);
  r.read(j, path, "block_size", a.block_size, 1, kMaxI64);
  if (a.block_size % 512 != 0)
    r.fail_expected(path + ".block_size", "a multiple of 512 (O_DIRECT transfers whole sectors)", j["block_size"]);
  r.read(j, path, "queue_depth", a.queue_depth, 1, kMaxInt);
  if (Reader::find(j, "thread_count") && Reader::find(j, "intra_op_parallelism"))
    r.fail(path + ".thread_count", "give intra_op_parallelism or its old name thread_count, not both");
  r.read(j, path, "thread_count", a.intra_op_parallelism, 1, kMaxInt);
  r.read(j, path, "intra_op_parallelism", a.intra_op_parallelism, 1, kMaxInt);
  r.read(j, path, "single_submit", a.single_submit);
  r.read(j, path, "overlap_events", a.overlap_events);
  r.read(j, path, "use_gds", a.use_gds);
}

void parse_tensor_parallel(Reader& r, const json& j, std::optional<int>& autotp_size) {
  const std::string path = "tensor_parallel";
  r.check_object(j, path);
  if (Reader::find(j, "autotp_size")) {
    int n = 1;
    r.read(j, path, "autotp_size", n, 1, kMaxInt);
    autotp_size = n;
  }
}

// cutrain's own section: settings with no DeepSpeed key.
void parse_cutrain(Reader& r, const json& j, TrainConfig& c) {
  const std::string path = "cutrain";
  r.check_object(j, path);
  r.read_choice(j, path, "data_order", c.data_order, kDataOrders);
  r.read_choice(j, path, "attention_backward", c.attention_backward, kAttentionBackwards);
}

// DeepSpeed's pipeline section: stages (int or "auto"), partition, activation_checkpoint_interval;
// seed_layers, pipe_partitioned and grad_partitioned are in the key table (warned).
void parse_pipeline(Reader& r, const json& j, TrainConfig& c) {
  const std::string path = "pipeline";
  r.check_object(j, path);
  c.pipeline_given = true;
  if (const json* v = Reader::find(j, "stages"); v && !v->is_null()) {
    if (v->is_string()) {
      if (v->get<std::string>() != "auto") r.fail_expected(path + ".stages", "a number of stages >= 1 or \"auto\"", *v);
    } else {
      c.pipeline_stages = int(r.as_int(*v, path + ".stages", 1, kMaxInt));
    }
  }
  if (const json* v = Reader::find(j, "partition"); v && !v->is_null()) {
    const std::string m = r.as_string(*v, path + ".partition");
    c.pipeline_partition = m == "best" ? std::string("parameters") : m;
  }
  r.read(j, path, "activation_checkpoint_interval", c.activation_checkpoint_interval, 0, kMaxInt);
}

// Combinations that are each valid alone but not together.
void check_consistency(Reader& r, const TrainConfig& c) {
  if (c.bf16.bf16_optimizer_states && !c.bf16.bf16_master_weights_and_grads)
    r.fail("bf16.bf16_optimizer_states",
           "bf16_optimizer_states needs bf16_master_weights_and_grads: true (DeepSpeed keeps the optimizer states in "
           "bf16 only on top of bf16 master weights and gradients)");
  if (c.bf16.bf16_master_weights_and_grads && !c.bf16.enabled)
    r.fail("bf16.bf16_master_weights_and_grads", "bf16_master_weights_and_grads needs bf16.enabled: true");
  if (c.bf16.bf16_master_compensation && !c.bf16.bf16_master_weights_and_grads)
    r.fail("bf16.bf16_master_compensation",
           "bf16_master_compensation compensates bf16 master weights and needs bf16_master_weights_and_grads: true "
           "(the baseline layout's fp32 master needs no compensation)");
  if (c.bf16.stochastic_rounding && !c.bf16.enabled)
    r.fail("bf16.stochastic_rounding", "stochastic_rounding applies to bf16 writes and needs bf16.enabled: true");
  if (c.optimizer.type == OptimizerType::Lamb && c.zero_optimization.stage > 0)
    r.fail("zero_optimization.stage",
           detail::concat("optimizer type Lamb needs ZeRO stage 0, found stage ", c.zero_optimization.stage,
                          ": its per-tensor trust ratios need whole tensors on a rank (DeepSpeed's ZeRO does not "
                          "support FusedLamb either)"));
  if (c.fp16.enabled && c.bf16.enabled)
    r.fail("fp16.enabled", "fp16.enabled and bf16.enabled are both true: the model computes in one of them; enable one");
  if (c.torch_autocast.enabled && c.torch_autocast.dtype == AutocastDtype::Float16)
    r.fail("torch_autocast.dtype", "autocast to torch.float16 is not implemented (fp16 training is fp16.enabled: true); "
                                   "use torch.bfloat16");
}

}  // namespace

TrainConfig parse_config(const std::string& json_text, const std::string& origin, const ConfigLoadOptions& options) {
  json root;
  try {
    root = parse_json_strict(json_text, origin);
  } catch (const JsonSyntaxError& e) {
    throw ConfigError(e.message(), __FILE__, __LINE__);
  }
  TrainConfig c;
  Reader r(origin, options.strict, &c.warnings);
  r.check_object(root, "");
  auto read_opt_int = [&](const char* key, std::optional<int>& out) {
    if (const json* v = Reader::find(root, key); v && !v->is_null())
      out = static_cast<int>(r.as_int(*v, key, 1, kMaxInt));
  };
  read_opt_int("train_batch_size", c.train_batch_size);
  read_opt_int("train_micro_batch_size_per_gpu", c.train_micro_batch_size_per_gpu);
  read_opt_int("gradient_accumulation_steps", c.gradient_accumulation_steps);
  read_opt_int("steps_per_print", c.steps_per_print);
  r.read(root, "", "gradient_clipping", c.gradient_clipping, 0.0, kInf);
  r.read(root, "", "wall_clock_breakdown", c.wall_clock_breakdown);
  if (const json* v = Reader::find(root, "optimizer")) parse_optimizer(r, *v, c.optimizer);
  if (const json* v = Reader::find(root, "scheduler")) parse_scheduler(r, *v, c.scheduler);
  const json* bf = Reader::find(root, "bf16");
  const json* bfloat = Reader::find(root, "bfloat16");
  if (bf && bfloat) r.fail("bfloat16", "give bf16 or its old name bfloat16, not both");
  bool sr_given = false;
  if (bf) sr_given = parse_bf16(r, *bf, "bf16", c.bf16) || sr_given;
  if (bfloat) sr_given = parse_bf16(r, *bfloat, "bfloat16", c.bf16) || sr_given;
  if (!sr_given) default_stochastic_rounding(c.bf16);
  if (const json* v = Reader::find(root, "fp16")) parse_fp16(r, *v, c.fp16);
  if (const json* v = Reader::find(root, "zero_optimization")) parse_zero(r, *v, c.zero_optimization);
  if (const json* v = Reader::find(root, "torch_autocast")) parse_autocast(r, *v, c.torch_autocast);
  if (const json* v = Reader::find(root, "activation_checkpointing")) {
    c.has_activation_checkpointing = true;
    parse_activation_checkpointing(r, *v, c.activation_checkpointing);
  }
  if (const json* v = Reader::find(root, "aio")) parse_aio(r, *v, c.aio);
  if (const json* v = Reader::find(root, "tensor_parallel")) parse_tensor_parallel(r, *v, c.autotp_size);
  if (const json* v = Reader::find(root, "cutrain")) parse_cutrain(r, *v, c);
  if (const json* v = Reader::find(root, "pipeline")) parse_pipeline(r, *v, c);
  if (const json* v = Reader::find(root, "data_efficiency")) config_detail::parse_data_efficiency(r, *v, c.data_efficiency);
  if (const json* v = Reader::find(root, "curriculum_learning")) config_detail::parse_legacy_curriculum(r, *v, c.curriculum_learning);
  r.apply_key_table(root, "");
  check_consistency(r, c);
  c.source = origin;
  c.resolve_batch(options.world_size);
  return c;
}

TrainConfig load_config(const std::filesystem::path& path, const ConfigLoadOptions& options) {
  std::string text;
  try {
    text = read_text_file(path);
  } catch (const ConfigError&) {
    throw;
  } catch (const Error& e) {
    throw ConfigError(detail::concat("cannot read config: ", e.message()), __FILE__, __LINE__);
  }
  TrainConfig c = parse_config(text, path.string(), options);
  c.source = path;
  return c;
}

}  // namespace cutrain::train
