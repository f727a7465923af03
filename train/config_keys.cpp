// The key table of the DeepSpeed config (train/config_keys.h), in the order docs/config.md lists it.
#include "train/config_keys.h"

#include <array>

namespace cutrain::train {
namespace {

constexpr KeyStatus A = KeyStatus::Acted;
constexpr KeyStatus W = KeyStatus::Warned;
constexpr KeyStatus E = KeyStatus::Error;
constexpr bool kSection = true;

constexpr std::string_view kNoPartitionedCkpt =
    "cutrain's activation checkpointing is the --activation_checkpointing flag: every block's input kept, the block "
    "recomputed in backward; partitioned, CPU or profiled checkpointing is not implemented";
constexpr std::string_view kNoParamOffload = "parameter offload is not implemented, so its buffers do not exist";
constexpr std::string_view kNotImplemented = "a DeepSpeed feature cutrain does not implement";
constexpr std::string_view kChecked =
    "checked (type, range, consistency); cutrain's curriculum draw (docs/data-efficiency.md) does not use it";

constexpr ConfigKey kKeys[] = {
    // Top level.
    {"train_batch_size", A, "", "the global batch: micro x accumulation x world size"},
    {"train_micro_batch_size_per_gpu", A, "", "the micro batch per rank (given: it wins over --batch_size)"},
    {"gradient_accumulation_steps", A, "", "micro-batches per optimizer step"},
    {"steps_per_print", A, "", "the Step line interval when --log_interval is not given"},
    {"gradient_clipping", A, "", "clip the global gradient norm to this (0: off)"},
    {"wall_clock_breakdown", A, "", "true: the timing report (as --timing_report without a file), printed at the end"},
    {"optimizer", A, "", "", kSection},
    {"scheduler", A, "", "", kSection},
    {"bf16", A, "", "", kSection},
    {"bfloat16", A, "", "the old name of bf16", kSection},
    {"fp16", A, "", "", kSection},
    {"zero_optimization", A, "", "", kSection},
    {"torch_autocast", A, "", "", kSection},
    {"activation_checkpointing", A, "", "", kSection},
    {"aio", A, "", "", kSection},
    {"tensor_parallel", A, "", "", kSection},
    {"cutrain", A, "", "cutrain's own settings (no DeepSpeed key)", kSection},
    {"pipeline", A, "", "", kSection},
    {"prescale_gradients", W, "false", "gradients are averaged once, after the reduction"},
    {"gradient_predivide_factor", W, "1|1.0", "gradients are averaged once, after the reduction"},
    {"zero_allow_untested_optimizer", W, "", "cutrain has only its own Adam(W) and Lamb (Lamb refuses ZeRO)"},
    {"zero_force_ds_cpu_optimizer", W, "", "the optimizer always runs on the GPU"},
    {"memory_breakdown", W, "false", "the Step lines and --metrics_file report memory"},
    {"dump_state", W, "false", "not implemented"},
    {"tensorboard", W, R"({"enabled":false})", "no TensorBoard writer; --metrics_file writes one JSON line per step"},
    {"wandb", W, R"({"enabled":false})", "no W&B writer; --metrics_file writes one JSON line per step"},
    {"csv_monitor", W, R"({"enabled":false})", "no CSV monitor; --loss_log_file and --metrics_file write per step"},
    {"comet", W, R"({"enabled":false})", "no Comet writer; --metrics_file writes one JSON line per step"},
    {"flops_profiler", W, R"({"enabled":false})", "not implemented; --timing_report prints FLOPs and MFU per region"},
    {"comms_logger", W, R"({"enabled":false})", "not implemented"},
    {"communication_data_type", W, "", "collectives move the gradients' own dtype"},
    {"sparse_gradients", W, "false", "every gradient is dense"},
    {"elasticity", W, R"({"enabled":false})", kNotImplemented},
    {"checkpoint", W, "", "checkpoints are --save / --resume"},
    {"data_efficiency", A, "", "", kSection},
    {"curriculum_learning", A, "", "", kSection},
    {"compression_training", W, "", kNotImplemented},
    {"data_types", W, "", "the dtypes follow the bf16 section's layout"},
    {"seq_parallel_communication_data_type", W, "", "sequence parallelism is not implemented"},

    // optimizer
    {"optimizer.type", A, "", "Adam, AdamW or Lamb (any case); Lamb needs ZeRO stage 0"},
    {"optimizer.params", A, "", "", kSection},
    {"optimizer.params.lr", A, "", "the learning rate (--learning_rate overrides it)"},
    {"optimizer.params.betas", A, "", "Adam's beta1, beta2"},
    {"optimizer.params.eps", A, "", "Adam's epsilon"},
    {"optimizer.params.weight_decay", A, "", "decoupled (AdamW) or L2 (Adam without adam_w_mode)"},
    {"optimizer.params.adam_w_mode", A, "", "type Adam: true decoupled weight decay, false L2"},
    {"optimizer.params.bias_correction", A, "", "Lamb: false steps by lr without bias correction; Adam / AdamW: false is an error (not implemented)"},
    {"optimizer.params.max_coeff", A, "", "Lamb: the trust ratio's upper clamp (default 10)"},
    {"optimizer.params.min_coeff", A, "", "Lamb: the trust ratio's lower clamp (default 0.01)"},
    {"optimizer.params.eps_inside_sqrt", A, "", "Lamb: sqrt(v + eps) instead of sqrt(v) + eps"},
    {"optimizer.params.max_grad_norm", E, "", "DeepSpeed refuses it too; use gradient_clipping"},
    {"optimizer.params.torch_adam", W, "false", "cutrain's fused Adam computes the same update"},
    {"optimizer.params.amsgrad", E, "false", "amsgrad is not implemented"},

    // scheduler (a parameter of another scheduler type is an error, as DeepSpeed's TypeError)
    {"scheduler.type", A, "", "WarmupLR, WarmupDecayLR or WarmupCosineLR"},
    {"scheduler.params", A, "", "", kSection},
    {"scheduler.params.warmup_min_lr", A, "", "WarmupLR / WarmupDecayLR: the lr at step 0"},
    {"scheduler.params.warmup_max_lr", A, "", "WarmupLR / WarmupDecayLR: the lr after warm-up"},
    {"scheduler.params.warmup_num_steps", A, "", "warm-up steps"},
    {"scheduler.params.warmup_type", A, "", "log or linear warm-up"},
    {"scheduler.params.total_num_steps", A, "", "WarmupDecayLR / WarmupCosineLR: the steps of the schedule"},
    {"scheduler.params.warmup_min_ratio", A, "", "WarmupCosineLR: the lr ratio at step 0"},
    {"scheduler.params.cos_min_ratio", A, "", "WarmupCosineLR: the lr ratio at the end"},
    {"scheduler.params.last_batch_iteration", E, "-1", "resuming a schedule mid-way is done by --resume"},

    // bf16 (old name bfloat16)
    {"bf16.enabled", W, "true", "the model always computes in bf16; fp32 training is not implemented"},
    {"bf16.bf16_master_weights_and_grads", A, "", "bf16 master weights and gradients (layout bf16_master_wg)"},
    {"bf16.bf16_optimizer_states", A, "", "bf16 Adam moments too (layout bf16_full)"},
    {"bf16.stochastic_rounding", A, "",
     "cutrain's: stochastic rounding of the optimizer's bf16 writes (default: on with bf16 master weights "
     "without compensation)"},
    {"bf16.bf16_master_compensation", A, "", "cutrain's: a bf16 compensation buffer (Kahan) beside bf16 master weights"},
    {"bf16.immediate_grad_update", W, "", "the optimizer runs once per step over the flat buffers"},
    {"bf16.check_grad_overflow", W, "true", "a non-finite gradient norm always skips the optimizer step"},
    {"bf16.auto_cast", W, "false", "the model computes in bf16 already"},

    // fp16
    {"fp16.enabled", A, "",
     "fp16 training: the model computes in fp16 (fp16 GEMMs, LayerNorm, softmax, loss) over fp32 master weights, the "
     "loss scaled (never together with bf16.enabled)"},
    {"fp16.auto_cast", W, "false", "the model's inputs are token ids: there is nothing to cast"},
    {"fp16.loss_scale", A, "", "0: dynamic loss scaling; > 0: this static scale"},
    {"fp16.initial_scale_power", A, "", "the dynamic scale starts at 2^initial_scale_power"},
    {"fp16.loss_scale_window", A, "", "clean steps (since the last overflow) before the dynamic scale doubles"},
    {"fp16.hysteresis", A, "", "overflows tolerated before the dynamic scale halves"},
    {"fp16.consecutive_hysteresis", A, "", "true: every clean step refills the hysteresis"},
    {"fp16.min_loss_scale", A, "", "the dynamic scale's floor: an overflow there stops the run"},
    {"fp16.fp16_master_weights_and_grads", E, "false",
     "fp16 training keeps fp32 master weights (the baseline layout); fp16 master weights are not implemented"},

    // zero_optimization
    {"zero_optimization.stage", A, "",
     "ZeRO stage 0-3 (data parallel with a communicator: NCCL on GPUs, the host communicator on the CPU backend; "
     "docs/distributed.md)"},
    {"zero_optimization.overlap_comm", A, "", "reduce gradients during the backward (buckets at 0, per unit at 3)"},
    {"zero_optimization.contiguous_gradients", W, "true", "gradients always land in one flat buffer"},
    {"zero_optimization.reduce_bucket_size", A, "", "elements per gradient all-reduce bucket with overlap_comm"},
    {"zero_optimization.allgather_bucket_size", W, "",
     "stages 1-2 all-gather the updated parameters in one call per step"},
    {"zero_optimization.reduce_scatter", W, "true", "stages 1-2 always reduce-scatter the gradients"},
    {"zero_optimization.allgather_partitions", W, "true", "stages 1-2 always all-gather the partitions"},
    {"zero_optimization.stage3_param_persistence_threshold", A, "",
     "stage 3: units of at most this many elements stay whole on every rank"},
    {"zero_optimization.stage3_prefetch_bucket_size", W, "",
     "stage 3 prefetches exactly the next parameter unit, not by an element budget"},
    {"zero_optimization.stage3_max_live_parameters", W, "",
     "stage 3 holds at most two gathered units (the one in use and the prefetched one)"},
    {"zero_optimization.stage3_max_reuse_distance", W, "",
     "stage 3 releases every gathered unit after use and gathers it again for backward"},
    {"zero_optimization.sub_group_size", W, "", "the optimizer is one fused launch over the whole partition"},
    {"zero_optimization.round_robin_gradients", W, "false", "not implemented"},
    {"zero_optimization.stage3_gather_16bit_weights_on_model_save", W, "true",
     "--save always writes the whole bf16 model"},
    {"zero_optimization.stage3_gather_fp16_weights_on_model_save", W, "true",
     "--save always writes the whole bf16 model"},
    {"zero_optimization.offload_optimizer", A, "", "", kSection},
    {"zero_optimization.offload_param", A, "", "", kSection},
    {"zero_optimization.elastic_checkpoint", W, "false", kNotImplemented},
    {"zero_optimization.load_from_fp32_weights", W, "", "checkpoints are cutrain's own files (--save / --resume)"},
    {"zero_optimization.ignore_unused_parameters", W, "", "every parameter of the model has a gradient"},
    {"zero_optimization.zero_hpz_partition_size", W, "1", "hierarchical partitioning (ZeRO++) is not implemented"},
    {"zero_optimization.zero_quantized_weights", W, "false", "quantized collectives (ZeRO++) are not implemented"},
    {"zero_optimization.zero_quantized_gradients", W, "false", "quantized collectives (ZeRO++) are not implemented"},
    {"zero_optimization.mics_shard_size", W, "-1", "MiCS is not implemented"},
    {"zero_optimization.memory_efficient_linear", W, "", "the GEMMs are cuBLASLt calls"},
    {"zero_optimization.use_multi_rank_bucket_allreduce", W, "", "not implemented"},
    {"zero_optimization.legacy_stage1", W, "false", "not implemented"},

    // zero_optimization.offload_optimizer
    {"zero_optimization.offload_optimizer.device", A, "", "none, cpu or nvme: where the optimizer state waits between steps"},
    {"zero_optimization.offload_optimizer.nvme_path", A, "", "nvme: the folder of the swap files (must exist)"},
    {"zero_optimization.offload_optimizer.pin_memory", A, "", "cpu: pinned (true) or pageable host memory"},
    {"zero_optimization.offload_optimizer.buffer_count", W, "", "the state travels through the aio handle's own bounce buffers"},
    {"zero_optimization.offload_optimizer.pipeline_read", A, "", "the reload overlaps forward/backward"},
    {"zero_optimization.offload_optimizer.pipeline_write", A, "", "the write-out overlaps the rest of the step"},
    {"zero_optimization.offload_optimizer.pipeline", W, "", "the old switch; use pipeline_read / pipeline_write"},
    {"zero_optimization.offload_optimizer.fast_init", W, "false", "the state is created on the device, then offloaded"},
    {"zero_optimization.offload_optimizer.ratio", W, "1|1.0", "the whole optimizer state is offloaded"},

    // zero_optimization.offload_param
    {"zero_optimization.offload_param.device", E, "\"none\"|null",
     "parameter offload is not implemented (stage 3's parameter shards stay on the device); use \"none\""},
    {"zero_optimization.offload_param.nvme_path", W, "", kNoParamOffload},
    {"zero_optimization.offload_param.pin_memory", W, "", kNoParamOffload},
    {"zero_optimization.offload_param.buffer_count", W, "", kNoParamOffload},
    {"zero_optimization.offload_param.buffer_size", W, "", kNoParamOffload},
    {"zero_optimization.offload_param.max_in_cpu", W, "", kNoParamOffload},

    // torch_autocast
    {"torch_autocast.enabled", A, "",
     "the model computes in bf16 either way (as DeepSpeed's bf16.enabled); torch.float16 autocast is an error"},
    {"torch_autocast.dtype", A, "", "torch.bfloat16 (torch.float16 with enabled: an error)"},
    {"torch_autocast.lower_precision_safe_modules", W, "", "every layer computes in bf16"},

    // activation_checkpointing
    {"activation_checkpointing.partition_activations", W, "false", kNoPartitionedCkpt},
    {"activation_checkpointing.cpu_checkpointing", W, "false", kNoPartitionedCkpt},
    {"activation_checkpointing.contiguous_memory_optimization", W, "false", kNoPartitionedCkpt},
    {"activation_checkpointing.number_checkpoints", W, "null", kNoPartitionedCkpt},
    {"activation_checkpointing.synchronize_checkpoint_boundary", W, "false", kNoPartitionedCkpt},
    {"activation_checkpointing.profile", W, "false", kNoPartitionedCkpt},

    // pipeline (docs/distributed.md, "Pipeline parallelism")
    {"pipeline.stages", A, "", "the pipeline degree when --pipeline_parallel_size is not given (\"auto\": 1)"},
    {"pipeline.partition", A, "", "the partition_method when --partition_method is not given (\"best\": parameters)"},
    {"pipeline.activation_checkpoint_interval", A, "", "layers per recomputed chunk of a stage (0: off; the GPU engine: 0 or 1, its per-block checkpointing)"},
    {"pipeline.seed_layers", W, "false", "every layer is initialised from --seed"},
    {"pipeline.pipe_partitioned", W, "false", "the activations between stages are sent whole"},
    {"pipeline.grad_partitioned", W, "false", "the gradients between stages are sent whole"},

    // aio (the optimizer swap's I/O, docs/nvme.md)
    {"cutrain.data_order", A, "", "shuffled (cutrain's epochs: every shard's windows shuffled together) or llmc (llm.c's DataLoader: the batches train_gpt2cu draws for the same B, T, ranks and --seed; docs/gpt2.md); --use_real_data only, --data_order wins"},
    {"cutrain.attention_backward", A, "", "the GPU attention backward: deterministic (the same bits every run) or fast (dQ by order-dependent fp32 reduce-adds: not bit-reproducible run to run; faster; head dim 128 below sequence length 1024 runs the deterministic algorithm either way); --attention_backward wins"},
    {"tensor_parallel.autotp_size", A, "", "the tensor-parallel degree (--tensor_parallel_size wins): on --device cpu Megatron-style column/row-parallel blocks, vocabulary-parallel embedding and loss; on --device cuda 1, the blocks' all-reduces over a one-rank NCCL communicator (docs/distributed.md)"},
    {"aio.block_size", A, "", "bytes per I/O request (a multiple of 512)"},
    {"aio.queue_depth", A, "", "requests in flight per worker"},
    {"aio.intra_op_parallelism", A, "", "I/O workers per transfer"},
    {"aio.thread_count", A, "", "the old name of intra_op_parallelism"},
    {"aio.single_submit", A, "", "submit requests one at a time"},
    {"aio.overlap_events", A, "", "reap completions while submitting"},
    {"aio.use_gds", W, "false", "the optimizer swap goes through pinned bounce buffers (GDS only in io-bench)"},

    // data_efficiency (docs/data-efficiency.md). The <metric> entries stand for each key of
    // curriculum_metrics (seqlen_truncate, seqlen_reshape, vocabularyrarity): the reader checks them.
    {"data_efficiency.enabled", A, "", "with data_sampling.enabled and curriculum_learning.enabled: the curriculum (vocabularyrarity draws the training batches of --use_real_data; seqlen_truncate / seqlen_reshape: the sequence-length warm-up); with data_routing.enabled and random_ltd.enabled: random-LTD (docs/data-efficiency.md)"},
    {"data_efficiency.seed", A, "", "the curriculum draw's and random-LTD's token selection's seed (both are functions of it and the step)"},
    {"data_efficiency.data_sampling", A, "", "", kSection},
    {"data_efficiency.data_sampling.enabled", A, "", "one of the curriculum's three switches (with data_efficiency.enabled, curriculum_learning.enabled)"},
    {"data_efficiency.data_sampling.num_epochs", W, "", kChecked},
    {"data_efficiency.data_sampling.num_workers", W, "", kChecked},
    {"data_efficiency.data_sampling.dynamic_batching", W, R"({"enabled":false})", "dynamic batching is not implemented"},
    {"data_efficiency.data_sampling.curriculum_learning", A, "", "", kSection},
    {"data_efficiency.data_sampling.curriculum_learning.enabled", A, "", "one of the curriculum's three switches (with data_efficiency.enabled, data_sampling.enabled)"},
    {"data_efficiency.data_sampling.curriculum_learning.data_cluster_path", W, "", kChecked},
    {"data_efficiency.data_sampling.curriculum_learning.curriculum_metrics", A, "", "", kSection},
    {"data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.seqlen_truncate", A, "", "sequence-length warm-up: each step's samples cut to their first L (token, label) pairs, L from the pacing (difficulty_type value; no index: its paths are not read)"},
    {"data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.seqlen_reshape", A, "", "sequence-length warm-up: each micro-batch's samples cut into rows of L (token, label) pairs as Megatron-DeepSpeed's data_post_process does (docs/data-efficiency.md)"},
    {"data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.vocabularyrarity", A, "", "mean -log p(token) of each sample, indexed by cutrain analyze-data: each step draws from the samples within [min_difficulty, the pacing's difficulty]"},
    {"data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.<metric>", A, "", "", kSection},
    {"data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.<metric>.index_to_sample_path", A, "", "the index file cutrain analyze-data writes, relative to the config file's folder; checked against the training shards and --seq_length before any step"},
    {"data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.<metric>.index_to_metric_path", A, "", "cutrain's index file holds both mappings: absent or the same file as index_to_sample_path (else an error)"},
    {"data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.<metric>.difficulty_type", A, "", "value (the metric's value) or percentile (0-100 of the samples by difficulty)"},
    {"data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.<metric>.clustering_type", W, "",
     "schedule_based or single_cluster; checked; each step draws from the whole eligible range, without clusters"},
    {"data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.<metric>.min_difficulty", A, "", "the pacing's start and the eligible set's lower bound"},
    {"data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.<metric>.max_difficulty", A, "", "the pacing's end"},
    {"data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.<metric>.schedule_type", A, "", "fixed_linear, fixed_root or fixed_discrete (train/curriculum_schedule.h)"},
    {"data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.<metric>.schedule_config", A, "", "", kSection},
    {"data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.<metric>.schedule_config.total_curriculum_step", A, "", "fixed_linear / fixed_root: steps from min to max difficulty"},
    {"data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.<metric>.schedule_config.difficulty_step", A, "", "fixed_linear / fixed_root: the difficulty is rounded down to a multiple of it"},
    {"data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.<metric>.schedule_config.root_degree", A, "", "fixed_root: the root's degree"},
    {"data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.<metric>.schedule_config.difficulty", A, "", "fixed_discrete: the difficulties"},
    {"data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.<metric>.schedule_config.max_step", A, "", "fixed_discrete: the last step of each difficulty but the last"},
    {"data_efficiency.data_routing", A, "", "", kSection},
    {"data_efficiency.data_routing.enabled", A, "", "one of random-LTD's three switches (with data_efficiency.enabled, random_ltd.enabled)"},
    {"data_efficiency.data_routing.random_ltd", A, "", "", kSection},
    {"data_efficiency.data_routing.random_ltd.enabled", A, "", "one of random-LTD's three switches: the chosen blocks process a random sorted subset of each sequence's tokens, the others bypass them (docs/data-efficiency.md)"},
    {"data_efficiency.data_routing.random_ltd.total_layer_num", A, "", "must be the model's block count (--num_layers)"},
    {"data_efficiency.data_routing.random_ltd.random_ltd_layer_num", A, "", "must be the length of random_ltd_layer_id"},
    {"data_efficiency.data_routing.random_ltd.random_ltd_layer_id", A, "", "the blocks (0-based, distinct) that drop tokens"},
    {"data_efficiency.data_routing.random_ltd.model_mask_name", W, "", "the attention mask is the model's own (causal for decoder, none for encoder): there is no mask argument to name"},
    {"data_efficiency.data_routing.random_ltd.model_type", A, "", "decoder (causal attention over the kept tokens: needs a causal model) or encoder (full attention: needs the non-causal BF16-example model)"},
    {"data_efficiency.data_routing.random_ltd.hidden_state_order", W, R"("batch_seq_dim")", "cutrain's activations are always [batch, seq, hidden]"},
    {"data_efficiency.data_routing.random_ltd.random_ltd_schedule", A, "", "", kSection},
    {"data_efficiency.data_routing.random_ltd.random_ltd_schedule.min_value", A, "", "the kept tokens per sequence at step 0"},
    {"data_efficiency.data_routing.random_ltd.random_ltd_schedule.max_value", A, "", "the kept tokens at require_steps and after (at most --seq_length; equal to it: no drop)"},
    {"data_efficiency.data_routing.random_ltd.random_ltd_schedule.schedule_type", A, "", "fixed_linear (the only one DeepSpeed has)"},
    {"data_efficiency.data_routing.random_ltd.random_ltd_schedule.schedule_config", A, "", "", kSection},
    {"data_efficiency.data_routing.random_ltd.random_ltd_schedule.schedule_config.require_steps", A, "", "steps from min_value to max_value"},
    {"data_efficiency.data_routing.random_ltd.random_ltd_schedule.schedule_config.seq_per_step", A, "", "the kept count is rounded down to a multiple of it"},
    {"data_efficiency.data_routing.random_ltd.layer_token_lr_schedule", A, "", "", kSection},
    {"data_efficiency.data_routing.random_ltd.layer_token_lr_schedule.enabled", A, "", "false only (true is an error: not implemented, as in DeepSpeed)"},
    {"data_efficiency.data_routing.random_ltd.layer_token_lr_schedule.total_layer_tokens", W, "", "the layer-token learning-rate schedule is not implemented"},
    {"data_efficiency.data_routing.random_ltd.layer_token_lr_schedule.warmup_type", W, "", "the layer-token learning-rate schedule is not implemented"},
    {"data_efficiency.data_routing.random_ltd.layer_token_lr_schedule.warmup_layer_tokens", W, "", "the layer-token learning-rate schedule is not implemented"},

    // curriculum_learning (the legacy sequence-length warm-up: train/seqlen_curriculum.h)
    {"curriculum_learning.enabled", A, "", "true: the sequence-length warm-up of `cutrain train` (each step's samples truncated to the pacing's length; docs/data-efficiency.md)"},
    {"curriculum_learning.curriculum_type", A, "", "\"seqlen\" (the only legacy type)"},
    {"curriculum_learning.min_difficulty", A, "", "the first sequence length (at least difficulty_step)"},
    {"curriculum_learning.max_difficulty", A, "", "the last sequence length (at most --seq_length)"},
    {"curriculum_learning.schedule_type", A, "", "fixed_linear, fixed_root or fixed_discrete (train/curriculum_schedule.h)"},
    {"curriculum_learning.schedule_config", A, "", "", kSection},
    {"curriculum_learning.schedule_config.total_curriculum_step", A, "", "fixed_linear / fixed_root: steps from min to max length"},
    {"curriculum_learning.schedule_config.difficulty_step", A, "", "fixed_linear / fixed_root: the length is rounded down to a multiple of it (8 keeps the kernels' shapes aligned and the graphs few)"},
    {"curriculum_learning.schedule_config.root_degree", A, "", "fixed_root: the root's degree"},
    {"curriculum_learning.schedule_config.difficulty", A, "", "fixed_discrete: the lengths"},
    {"curriculum_learning.schedule_config.max_step", A, "", "fixed_discrete: the last step of each length but the last"},
};

}  // namespace

std::span<const ConfigKey> config_keys() { return kKeys; }

const ConfigKey* find_config_key(std::string_view path) {
  std::string normalized;
  constexpr std::string_view kOld = "bfloat16.";
  if (path.substr(0, kOld.size()) == kOld) {
    normalized = "bf16." + std::string(path.substr(kOld.size()));
    path = normalized;
  }
  for (const ConfigKey& k : kKeys)
    if (k.path == path) return &k;
  return nullptr;
}

std::vector<std::string_view> config_key_children(std::string_view parent) {
  if (parent == "bfloat16") parent = "bf16";
  std::vector<std::string_view> out;
  for (const ConfigKey& k : kKeys) {
    const std::size_t dot = k.path.rfind('.');
    const std::string_view up = dot == std::string_view::npos ? std::string_view() : k.path.substr(0, dot);
    if (up == parent) out.push_back(dot == std::string_view::npos ? k.path : k.path.substr(dot + 1));
  }
  return out;
}

const char* name(KeyStatus s) {
  switch (s) {
    case KeyStatus::Acted: return "acted on";
    case KeyStatus::Warned: return "warned";
    case KeyStatus::Error: return "error";
  }
  return "?";
}

std::string not_acted_warning(const std::string& path, std::string_view why) {
  return "config key " + path + " is read but not acted on (" + std::string(why) + ")";
}

}  // namespace cutrain::train
