// @brief The DeepSpeed config schema: JSON -> typed, validated TrainConfig.
// Key names are DeepSpeed's, so a DeepSpeed user's file works. Every key the reader accepts has a
// status in train/config_keys.h: acted on, warned about (read but not acted on), or an error.
// Unknown keys: a warning naming the key and the nearest known key (an error with strict). Wrong types / out-of-range values /
// inconsistent combinations: a ConfigError naming the file, the JSON path, what was expected and
// what was found. String-valued choices arrive as enums (train/choices.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "train/choices.h"
#include "train/config_data_efficiency.h"

namespace cutrain::train {

class ConfigError : public Error {
 public:
  using Error::Error;
};

struct OptimizerConfig {
  OptimizerType type = OptimizerType::AdamW;
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.f;
  // DeepSpeed's Adam with adam_w_mode=true is AdamW; type "Adam" uses L2 unless adam_w_mode.
  bool adam_w_mode = true;
  bool bias_correction = true;  // false: Lamb only (Adam without bias correction is an error)
  // Lamb (DeepSpeed's FusedLamb): the trust ratio's clamp, and eps under the square root.
  float max_coeff = 10.f, min_coeff = 0.01f;
  bool eps_inside_sqrt = false;
};

struct SchedulerConfig {
  SchedulerType type = SchedulerType::None;
  // WarmupLR / WarmupDecayLR
  float warmup_min_lr = 0.f;
  std::optional<float> warmup_max_lr;  // default: optimizer lr
  int warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::Log;
  int total_num_steps = 0;           // WarmupDecayLR / WarmupCosineLR: required
  // WarmupCosineLR
  float warmup_min_ratio = 0.f;
  float cos_min_ratio = 1e-4f;
};

struct OffloadConfig {
  OffloadTarget device = OffloadTarget::None;
  std::string nvme_path;
  bool pin_memory = false;
  int buffer_count = 4;
  bool pipeline_read = false, pipeline_write = false;
  std::int64_t buffer_size = 100000000;  // elements per pinned buffer (offload_param)
  std::int64_t max_in_cpu = 1000000000;  // elements kept in CPU memory when offloading to NVMe
  bool fast_init = false;                // offload_optimizer only
  float ratio = 1.f;                     // offload_optimizer: fraction of the optimizer offloaded
};

struct ZeroConfig {
  int stage = 0;  // 0..3
  bool overlap_comm = false;
  bool contiguous_gradients = true;
  std::int64_t reduce_bucket_size = 500000000;
  std::int64_t allgather_bucket_size = 500000000;
  std::int64_t stage3_param_persistence_threshold = 100000;
  std::int64_t stage3_prefetch_bucket_size = 50000000;
  std::int64_t stage3_max_live_parameters = 1000000000;
  std::int64_t stage3_max_reuse_distance = 1000000000;
  std::int64_t sub_group_size = 1000000000;
  bool reduce_scatter = true;
  bool allgather_partitions = true;
  bool round_robin_gradients = false;
  bool stage3_gather_16bit_weights_on_model_save = false;
  OffloadConfig offload_optimizer;
  OffloadConfig offload_param;
};

struct Bf16Config {
  bool enabled = false;
  bool bf16_master_weights_and_grads = false;
  bool bf16_optimizer_states = false;
  bool stochastic_rounding = false;  // cutrain extension: stochastic rounding of bf16 writes
  // cutrain extension: a bf16 compensation buffer beside bf16 master weights (Kahan summation of
  // the updates' rounding errors); needs bf16_master_weights_and_grads.
  bool bf16_master_compensation = false;
};

// fp16 mixed precision (DeepSpeed's fp16 block): the model computes in fp16 over fp32 master
// weights with loss scaling (train/loss_scaler.h). Never together with bf16.
struct Fp16Config {
  bool enabled = false;
  bool auto_cast = false;
  float loss_scale = 0.f;  // 0: dynamic loss scaling
  int initial_scale_power = 16;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  float min_loss_scale = 1.f;
};

struct AutocastConfig {
  bool enabled = false;
  AutocastDtype dtype = AutocastDtype::BFloat16;
  std::vector<std::string> lower_precision_safe_modules;
};

struct ActivationCheckpointingConfig {
  bool partition_activations = false;
  bool cpu_checkpointing = false;
  bool contiguous_memory_optimization = false;
  std::optional<int> number_checkpoints;
  bool synchronize_checkpoint_boundary = false;
  bool profile = false;
};

struct AioConfig {
  std::int64_t block_size = 1048576;
  int queue_depth = 128;
  int intra_op_parallelism = 1;
  bool single_submit = false;
  bool overlap_events = false;
  bool use_gds = false;
};

struct TrainConfig {
  std::filesystem::path source;  // the file it came from ("" when built in code)
  // Batch sizes: any two determine the third (train = micro * accumulation * world_size).
  std::optional<int> train_batch_size;
  std::optional<int> train_micro_batch_size_per_gpu;
  std::optional<int> gradient_accumulation_steps;
  std::optional<int> steps_per_print;  // absent: the Step line interval is --log_interval's
  float gradient_clipping = 0.f;  // 0: off
  bool wall_clock_breakdown = false;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  Bf16Config bf16;
  Fp16Config fp16;
  ZeroConfig zero_optimization;
  AutocastConfig torch_autocast;
  ActivationCheckpointingConfig activation_checkpointing;
  bool has_activation_checkpointing = false;  // the section was present
  AioConfig aio;
  // tensor_parallel.autotp_size (DeepSpeed's AutoTP training degree): the CPU backend's
  // tensor-parallel degree when --tensor_parallel_size is not given (absent: 1).
  std::optional<int> autotp_size;
  // DeepSpeed's `pipeline` section (docs/distributed.md): present (`pipeline_given`: the step runs
  // through the pipeline, on the GPU engine at degree 1 too); `stages` the degree when
  // --pipeline_parallel_size is not given (absent or "auto": 1 unless the flag says);
  // `partition` the partition_method when --partition_method is not given ("best": parameters);
  // `activation_checkpoint_interval` layers per recomputed chunk (0: off).
  bool pipeline_given = false;
  std::optional<int> pipeline_stages;
  std::optional<std::string> pipeline_partition;
  int activation_checkpoint_interval = 0;
  DataEfficiencyConfig data_efficiency;
  LegacyCurriculumConfig curriculum_learning;
  // cutrain.data_order (cutrain's own section, no DeepSpeed key): the order of `cutrain train
  // --use_real_data`'s batches; "llmc" draws exactly llm.c's DataLoader's (docs/gpt2.md).
  // --data_order wins over it.
  data::DataOrder data_order = data::DataOrder::Shuffled;
  // cutrain.attention_backward (cutrain's own section): the GPU attention backward, deterministic
  // (the same bits every run) or fast (dQ by order-dependent reduce-adds; head dim 64 only).
  // --attention_backward wins over it.
  AttentionBackward attention_backward = AttentionBackward::Deterministic;
  std::vector<std::string> warnings;  // unknown keys, keys not acted on, etc., already formatted

  // Resolves the batch triple for `world_size` ranks (fills the missing ones; ConfigError when
  // they do not multiply out or none is given).
  // The first call remembers which of the three were given, so later calls (another world size)
  // resolve from those, not from the values an earlier call filled in.
  void resolve_batch(int world_size);
  struct BatchGiven {
    std::optional<int> train, micro, accumulation;
  };
  std::optional<BatchGiven> batch_given;
  int micro_batch() const { return train_micro_batch_size_per_gpu.value_or(1); }
  int accumulation() const { return gradient_accumulation_steps.value_or(1); }
};

struct ConfigLoadOptions {
  bool strict = false;  // unknown keys are errors, not warnings
  int world_size = 1;
};

// Reads and validates `path`, then resolves the batch triple for options.world_size.
// Throws ConfigError (file, JSON path, expected, found).
TrainConfig load_config(const std::filesystem::path& path, const ConfigLoadOptions& options = {});
// The same from a JSON text (`origin` names it in messages and becomes `source`).
TrainConfig parse_config(const std::string& json_text, const std::string& origin, const ConfigLoadOptions& options = {});

// What can only be checked where the run starts (not by check-config on another machine):
// zero_optimization.offload_optimizer with device "nvme" needs nvme_path to be an existing,
// writable folder. Throws ConfigError naming the JSON path, what was expected and what was found.
void check_offload_paths(const TrainConfig& config);

}  // namespace cutrain::train
