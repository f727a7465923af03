// CPU tests of the config loader: every key, every error class with its message content, the
// nearest-key suggestion, strict mode, batch resolution, and the shipped configs.
#include <gtest/gtest.h>

#include <filesystem>
#include <initializer_list>
#include <random>
#include <string>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runtime/file_util.h"
#include "train/config.h"
#include "train/lr_schedule.h"
#include "train/config_keys.h"

using namespace cutrain;

namespace {

// Parses `text` expecting a ConfigError whose message holds every one of `parts`.
void expect_error(const std::string& text, std::initializer_list<std::string> parts, bool strict = false) {
  train::ConfigLoadOptions opt;
  opt.strict = strict;
  try {
    train::parse_config(text, "test.json", opt);
    ADD_FAILURE() << "no ConfigError for: " << text;
  } catch (const train::ConfigError& e) {
    for (const auto& p : parts) EXPECT_NE(e.message().find(p), std::string::npos) << "missing '" << p << "' in: " << e.message();
  }
}

bool any_warning_has(const train::TrainConfig& c, std::initializer_list<std::string> parts) {
  for (const auto& w : c.warnings) {
    bool all = true;
    for (const auto& p : parts) all = all && w.find(p) != std::string::npos;
    if (all) return true;
  }
  return false;
}

std::string warnings_text(const train::TrainConfig& c) {
  std::string s;
  for (const auto& w : c.warnings) s += w + "\n";
  return s;
}

const char* kEveryKey = R"({
  "train_batch_size": 24,
  "train_micro_batch_size_per_gpu": 3,
  "gradient_accumulation_steps": 8,
  "steps_per_print": 7,
  "gradient_clipping": 1.5,
  "wall_clock_breakdown": true,
  "optimizer": {"type": "adam", "params": {"lr": 3e-4, "betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.1,
                                           "adam_w_mode": false, "bias_correction": true, "torch_adam": true}},
  "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 1e-6, "warmup_max_lr": 2e-4,
                "warmup_num_steps": 50, "warmup_type": "linear", "total_num_steps": 500}},
  "bf16": {"enabled": true, "bf16_master_weights_and_grads": true, "bf16_optimizer_states": true,
           "stochastic_rounding": true},
  "fp16": {"enabled": false, "loss_scale": 0, "initial_scale_power": 8, "loss_scale_window": 500, "hysteresis": 3,
           "consecutive_hysteresis": true, "min_loss_scale": 2, "auto_cast": true},
  "zero_optimization": {
    "stage": 3, "overlap_comm": true, "contiguous_gradients": false, "reduce_bucket_size": 5e7,
    "allgather_bucket_size": 2e8, "reduce_scatter": false, "allgather_partitions": false,
    "stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 1e7,
    "stage3_max_live_parameters": 3e8, "stage3_max_reuse_distance": 4e8, "sub_group_size": 1e8,
    "round_robin_gradients": true, "stage3_gather_16bit_weights_on_model_save": true,
    "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp/x", "pin_memory": true, "buffer_count": 6,
                          "pipeline_read": true, "pipeline_write": true, "fast_init": true, "ratio": 0.5},
    "offload_param": {"device": "none", "pin_memory": true, "buffer_count": 5, "buffer_size": 2e8, "max_in_cpu": 3e9}
  },
  "torch_autocast": {"enabled": true, "dtype": "bfloat16", "lower_precision_safe_modules": ["torch.nn.Linear"]},
  "activation_checkpointing": {"partition_activations": true, "cpu_checkpointing": true,
                               "contiguous_memory_optimization": true, "number_checkpoints": 12,
                               "synchronize_checkpoint_boundary": true, "profile": true},
  "aio": {"block_size": 2097152, "queue_depth": 64, "intra_op_parallelism": 4, "single_submit": true,
          "overlap_events": true, "use_gds": true},
  "tensor_parallel": {"autotp_size": 2}
})";

}  // namespace

// The warning of a Warned key, from the table.
std::string warning_of(const std::string& path) {
  const train::ConfigKey* k = train::find_config_key(path);
  EXPECT_NE(k, nullptr) << path;
  EXPECT_EQ(k ? k->status : train::KeyStatus::Acted, train::KeyStatus::Warned) << path;
  return train::not_acted_warning(path, k ? k->what : "");
}

TEST(Config, ParsesEveryKey) {
  train::TrainConfig c = train::parse_config(kEveryKey, "every.json");
  // Exactly the keys read but not acted on, each once (their values are not the fine ones).
  std::multiset<std::string> expected;
  for (const char* p : {"optimizer.params.torch_adam", "fp16.auto_cast", "zero_optimization.contiguous_gradients", "zero_optimization.allgather_bucket_size",
                        "zero_optimization.reduce_scatter", "zero_optimization.allgather_partitions",
                        "zero_optimization.stage3_prefetch_bucket_size", "zero_optimization.stage3_max_live_parameters",
                        "zero_optimization.stage3_max_reuse_distance", "zero_optimization.sub_group_size",
                        "zero_optimization.round_robin_gradients", "zero_optimization.offload_optimizer.buffer_count",
                        "zero_optimization.offload_optimizer.fast_init", "zero_optimization.offload_optimizer.ratio",
                        "zero_optimization.offload_param.pin_memory", "zero_optimization.offload_param.buffer_count",
                        "zero_optimization.offload_param.buffer_size", "zero_optimization.offload_param.max_in_cpu",
                        "torch_autocast.lower_precision_safe_modules", "activation_checkpointing.partition_activations",
                        "activation_checkpointing.cpu_checkpointing", "activation_checkpointing.contiguous_memory_optimization",
                        "activation_checkpointing.number_checkpoints", "activation_checkpointing.synchronize_checkpoint_boundary",
                        "activation_checkpointing.profile", "aio.use_gds"})
    expected.insert(warning_of(p));
  EXPECT_EQ(std::multiset<std::string>(c.warnings.begin(), c.warnings.end()), expected) << warnings_text(c);
  EXPECT_EQ(c.train_batch_size, 24);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 3);
  EXPECT_EQ(c.gradient_accumulation_steps, 8);
  EXPECT_EQ(c.steps_per_print, 7);
  EXPECT_FLOAT_EQ(c.gradient_clipping, 1.5f);
  EXPECT_TRUE(c.wall_clock_breakdown);
  EXPECT_EQ(c.optimizer.type, train::OptimizerType::Adam);  // case-insensitive, canonical spelling
  EXPECT_FLOAT_EQ(c.optimizer.lr, 3e-4f);
  EXPECT_FLOAT_EQ(c.optimizer.beta1, 0.8f);
  EXPECT_FLOAT_EQ(c.optimizer.beta2, 0.95f);
  EXPECT_FLOAT_EQ(c.optimizer.eps, 1e-6f);
  EXPECT_FLOAT_EQ(c.optimizer.weight_decay, 0.1f);
  EXPECT_FALSE(c.optimizer.adam_w_mode);  // type Adam honours adam_w_mode: false (L2)
  EXPECT_TRUE(c.optimizer.bias_correction);
  EXPECT_EQ(c.scheduler.type, train::SchedulerType::WarmupDecayLR);
  EXPECT_FLOAT_EQ(c.scheduler.warmup_min_lr, 1e-6f);
  ASSERT_TRUE(c.scheduler.warmup_max_lr.has_value());
  EXPECT_FLOAT_EQ(*c.scheduler.warmup_max_lr, 2e-4f);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 50);
  EXPECT_EQ(c.scheduler.warmup_type, train::WarmupType::Linear);
  EXPECT_EQ(c.scheduler.total_num_steps, 500);
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_TRUE(c.bf16.bf16_master_weights_and_grads);
  EXPECT_TRUE(c.bf16.bf16_optimizer_states);
  EXPECT_TRUE(c.bf16.stochastic_rounding);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.initial_scale_power, 8);
  EXPECT_EQ(c.fp16.loss_scale_window, 500);
  EXPECT_EQ(c.fp16.hysteresis, 3);
  EXPECT_TRUE(c.fp16.consecutive_hysteresis);
  EXPECT_FLOAT_EQ(c.fp16.min_loss_scale, 2.f);
  EXPECT_TRUE(c.fp16.auto_cast);
  const auto& z = c.zero_optimization;
  EXPECT_EQ(z.stage, 3);
  EXPECT_TRUE(z.overlap_comm);
  EXPECT_FALSE(z.contiguous_gradients);
  EXPECT_EQ(z.reduce_bucket_size, 50000000);
  EXPECT_EQ(z.allgather_bucket_size, 200000000);
  EXPECT_FALSE(z.reduce_scatter);
  EXPECT_FALSE(z.allgather_partitions);
  EXPECT_EQ(z.stage3_param_persistence_threshold, 0);
  EXPECT_EQ(z.stage3_prefetch_bucket_size, 10000000);
  EXPECT_EQ(z.stage3_max_live_parameters, 300000000);
  EXPECT_EQ(z.stage3_max_reuse_distance, 400000000);
  EXPECT_EQ(z.sub_group_size, 100000000);
  EXPECT_TRUE(z.round_robin_gradients);
  EXPECT_TRUE(z.stage3_gather_16bit_weights_on_model_save);
  EXPECT_EQ(z.offload_optimizer.device, train::OffloadTarget::Nvme);
  EXPECT_EQ(z.offload_optimizer.nvme_path, "/tmp/x");
  EXPECT_TRUE(z.offload_optimizer.pin_memory);
  EXPECT_EQ(z.offload_optimizer.buffer_count, 6);
  EXPECT_TRUE(z.offload_optimizer.pipeline_read);
  EXPECT_TRUE(z.offload_optimizer.pipeline_write);
  EXPECT_TRUE(z.offload_optimizer.fast_init);
  EXPECT_FLOAT_EQ(z.offload_optimizer.ratio, 0.5f);
  EXPECT_EQ(z.offload_param.device, train::OffloadTarget::None);
  EXPECT_TRUE(z.offload_param.pin_memory);
  EXPECT_EQ(z.offload_param.buffer_count, 5);
  EXPECT_EQ(z.offload_param.buffer_size, 200000000);
  EXPECT_EQ(z.offload_param.max_in_cpu, 3000000000LL);
  EXPECT_TRUE(c.torch_autocast.enabled);
  EXPECT_EQ(c.torch_autocast.dtype, train::AutocastDtype::BFloat16);  // normalized
  ASSERT_EQ(c.torch_autocast.lower_precision_safe_modules.size(), 1u);
  EXPECT_EQ(c.torch_autocast.lower_precision_safe_modules[0], "torch.nn.Linear");
  EXPECT_TRUE(c.has_activation_checkpointing);
  const auto& a = c.activation_checkpointing;
  EXPECT_TRUE(a.partition_activations);
  EXPECT_TRUE(a.cpu_checkpointing);
  EXPECT_TRUE(a.contiguous_memory_optimization);
  EXPECT_EQ(a.number_checkpoints, 12);
  EXPECT_TRUE(a.synchronize_checkpoint_boundary);
  EXPECT_TRUE(a.profile);
  EXPECT_EQ(c.aio.block_size, 2097152);
  EXPECT_EQ(c.aio.queue_depth, 64);
  EXPECT_EQ(c.aio.intra_op_parallelism, 4);
  EXPECT_TRUE(c.aio.single_submit);
  EXPECT_TRUE(c.aio.overlap_events);
  EXPECT_TRUE(c.aio.use_gds);
  EXPECT_EQ(c.autotp_size, 2);
  EXPECT_EQ(c.source, "every.json");
}

TEST(Config, DefaultsWhenSectionsAreAbsent) {
  train::TrainConfig c = train::parse_config(R"({"train_micro_batch_size_per_gpu": 2})", "min.json");
  EXPECT_EQ(c.optimizer.type, train::OptimizerType::AdamW);
  EXPECT_TRUE(c.optimizer.adam_w_mode);
  EXPECT_EQ(c.scheduler.type, train::SchedulerType::None);
  EXPECT_FALSE(c.bf16.enabled);
  EXPECT_EQ(c.zero_optimization.stage, 0);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, train::OffloadTarget::None);
  EXPECT_FALSE(c.has_activation_checkpointing);
  EXPECT_EQ(c.aio.block_size, 1048576);
  EXPECT_EQ(c.train_batch_size, 2);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
}

TEST(Config, AcceptsIntegralFloatsForIntegers) {
  train::TrainConfig c = train::parse_config(R"({"train_micro_batch_size_per_gpu": 4.0, "zero_optimization": {"stage": 3e0,
      "reduce_bucket_size": 5e8, "stage3_param_persistence_threshold": 1e4}})", "f.json");
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.zero_optimization.stage, 3);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 500000000);
  EXPECT_EQ(c.zero_optimization.stage3_param_persistence_threshold, 10000);
  expect_error(R"({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"reduce_bucket_size": 5.5e0}})",
               {"test.json", "zero_optimization.reduce_bucket_size", "expected a positive integer", "found number 5.5",
                "not an integral value"});
}

TEST(Config, WrongTypeNamesFilePathExpectedAndFound) {
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": "yes"}})",
               {"test.json", "bf16.enabled", "expected a boolean", "found string \"yes\""});
  expect_error(R"({"train_micro_batch_size_per_gpu": "4"})",
               {"test.json", "train_micro_batch_size_per_gpu", "expected a positive integer", "found string \"4\""});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"params": {"lr": [1]}}})",
               {"optimizer.params.lr", "expected a number >= 0", "found array [1]"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": 3})",
               {"zero_optimization", "expected an object", "found number 3"});
  expect_error(R"([1, 2])", {"test.json", "(top level)", "expected an object", "found array"});
  // Hugging Face "auto" placeholders get a hint.
  expect_error(R"({"train_micro_batch_size_per_gpu": "auto"})", {"found string \"auto\"", "Hugging Face"});
}

TEST(Config, OutOfRangeNamesIndexedPath) {
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"params": {"betas": [0.9, 1.5]}}})",
               {"test.json", "optimizer.params.betas[1]", "expected a number in [0, 1)", "found number 1.5"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"params": {"betas": [-0.1, 0.9]}}})",
               {"optimizer.params.betas[0]", "found number -0.1"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"params": {"betas": [0.9]}}})",
               {"optimizer.params.betas", "expected an array of 2 numbers", "found array [0.9]"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 4}})",
               {"zero_optimization.stage", "expected an integer in [0, 3]", "found number 4"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 0})",
               {"train_micro_batch_size_per_gpu", "expected a positive integer", "found number 0"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"params": {"eps": 0}}})",
               {"optimizer.params.eps", "expected a number > 0", "found number 0"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "gradient_clipping": -1})",
               {"gradient_clipping", "expected a number >= 0", "found number -1"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "aio": {"block_size": 1000}})",
               {"aio.block_size", "multiple of 512", "found number 1000"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Adagrad"}})",
               {"optimizer.type", "one of \"Adam\", \"AdamW\", \"Lamb\"", "found string \"Adagrad\""});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "offload_param": {"device": "gpu"}}})",
               {"zero_optimization.offload_param.device", "\"none\", \"cpu\", \"nvme\"", "found string \"gpu\""});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "torch_autocast": {"dtype": "torch.float32"}})",
               {"torch_autocast.dtype", "torch.bfloat16", "found string \"torch.float32\""});
}

TEST(Config, UnknownKeyWarnsWithNearestKey) {
  train::TrainConfig c = train::parse_config(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimisation": {},
      "bf16": {"enabled": true, "bf16_master_weight_and_grads": true}})", "w.json");
  EXPECT_TRUE(any_warning_has(c, {"w.json", "unknown key 'zero_optimisation'", "nearest known key: 'zero_optimization'", "ignored"}))
      << warnings_text(c);
  EXPECT_TRUE(any_warning_has(c, {"bf16.bf16_master_weight_and_grads", "nearest known key: 'bf16.bf16_master_weights_and_grads'"}))
      << warnings_text(c);
  EXPECT_FALSE(c.bf16.bf16_master_weights_and_grads);  // a misspelt key does not set the field
  // Nested two levels down, and case-only typos.
  train::TrainConfig d = train::parse_config(R"({"train_micro_batch_size_per_gpu": 1,
      "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memroy": true}}, "Steps_Per_Print": 3})", "n.json");
  EXPECT_TRUE(any_warning_has(d, {"zero_optimization.offload_optimizer.pin_memroy",
                                  "'zero_optimization.offload_optimizer.pin_memory'"})) << warnings_text(d);
  EXPECT_TRUE(any_warning_has(d, {"Steps_Per_Print", "'steps_per_print'"})) << warnings_text(d);
}

TEST(Config, StrictModeMakesUnknownKeysErrors) {
  const char* text = R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"overlap_com": true}})";
  EXPECT_NO_THROW(train::parse_config(text, "s.json"));
  expect_error(text, {"test.json", "zero_optimization.overlap_com", "unknown key", "'zero_optimization.overlap_comm'", "strict"},
               /*strict=*/true);
  // DeepSpeed keys cutrain accepts without acting on stay warnings, even strict.
  train::ConfigLoadOptions strict;
  strict.strict = true;
  train::TrainConfig c = train::parse_config(R"({"train_micro_batch_size_per_gpu": 1, "tensorboard": {"enabled": true}})", "t.json", strict);
  EXPECT_EQ(c.warnings, std::vector<std::string>{warning_of("tensorboard")}) << warnings_text(c);
}

TEST(Config, SchedulerParamsOfAnotherSchedulerAreErrors) {
  // DeepSpeed would raise TypeError (unexpected keyword argument), so this is an error without strict.
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "scheduler": {"type": "WarmupLR", "params": {"cos_min_ratio": 0.1}}})",
               {"scheduler.params.cos_min_ratio", "unknown key"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}}})",
               {"scheduler.params.total_num_steps", "found nothing", "WarmupDecayLR requires it"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "scheduler": {"type": "OneCycle"}})",
               {"scheduler.type", "\"WarmupLR\", \"WarmupDecayLR\", \"WarmupCosineLR\"", "found string \"OneCycle\""});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "scheduler": {"type": "WarmupLR", "params": {"warmup_type": "exp"}}})",
               {"scheduler.params.warmup_type", "\"log\", \"linear\"", "found string \"exp\""});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}}})",
               {"scheduler.params.warmup_num_steps", "positive integer", "found number 0"});
  train::TrainConfig c = train::parse_config(R"({"train_micro_batch_size_per_gpu": 1, "scheduler": {"type": "WarmupCosineLR",
      "params": {"total_num_steps": 100, "warmup_num_steps": 10, "warmup_min_ratio": 0.1, "cos_min_ratio": 0.01}}})", "c.json");
  EXPECT_EQ(c.scheduler.type, train::SchedulerType::WarmupCosineLR);
  EXPECT_FLOAT_EQ(c.scheduler.warmup_min_ratio, 0.1f);
  EXPECT_FLOAT_EQ(c.scheduler.cos_min_ratio, 0.01f);
  EXPECT_EQ(c.scheduler.total_num_steps, 100);
  train::TrainConfig d = train::parse_config(R"({"train_micro_batch_size_per_gpu": 1, "scheduler": {"type": "WarmupDecayLR",
      "params": {"total_num_steps": 100, "warmup_max_lr": null}}})", "d.json");
  EXPECT_FALSE(d.scheduler.warmup_max_lr.has_value());
  EXPECT_TRUE(any_warning_has(d, {"warmup_max_lr", "0.001"})) << warnings_text(d);
}

TEST(Config, InconsistentCombinationsSayWhy) {
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true, "bf16_optimizer_states": true}})",
               {"test.json", "bf16.bf16_optimizer_states", "needs bf16_master_weights_and_grads: true"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"bf16_master_weights_and_grads": true}})",
               {"bf16.bf16_master_weights_and_grads", "needs bf16.enabled: true"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true, "bf16_master_compensation": true}})",
               {"test.json", "bf16.bf16_master_compensation", "needs bf16_master_weights_and_grads: true"});
  {
    const train::TrainConfig c = train::parse_config(
        R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true, "bf16_master_weights_and_grads": true,
            "bf16_master_compensation": true}})", "comp.json");
    EXPECT_TRUE(c.bf16.bf16_master_compensation);
    EXPECT_FALSE(any_warning_has(c, {"compensation"})) << warnings_text(c);
  }
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})",
               {"zero_optimization.offload_param.device", "needs ZeRO stage 3", "stage is 2"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"offload_optimizer": {"device": "cpu"}}})",
               {"zero_optimization.offload_optimizer.device", "stage is 0"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}})",
               {"zero_optimization.offload_optimizer.nvme_path", "found nothing", "nvme"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "activation_checkpointing": {"cpu_checkpointing": true}})",
               {"activation_checkpointing.cpu_checkpointing", "partition_activations"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}, "bfloat16": {"enabled": true}})",
               {"bfloat16", "not both"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"params": {"amsgrad": true}}})",
               {"optimizer.params.amsgrad", "not implemented"});
  expect_error(R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4})",
               {"test.json", "batch sizes", "train_batch_size 10 is not a multiple of train_micro_batch_size_per_gpu 4"});
}

TEST(Config, MalformedJsonGivesLineAndColumn) {
  // Line 3, column 22 is the ',' where a value should be.
  expect_error("{\n  \"train_batch_size\": 8,\n  \"steps_per_print\": ,\n}\n",
               {"test.json", "malformed JSON at line 3, column 22"});
  expect_error("{\"a\": 1", {"test.json", "malformed JSON at line 1"});
  expect_error("", {"test.json", "malformed JSON"});
  // Number overflow is a different nlohmann exception (out_of_range), still reported with its place.
  expect_error("{\n  \"gradient_clipping\": 1e999\n}", {"test.json", "malformed JSON at line 2, column 24", "1e999"});
}

TEST(Config, DuplicateKeyIsAnError) {
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1, "stage": 3}})",
               {"test.json", "zero_optimization.stage", "more than once"});
}

TEST(Config, MissingFileSaysSoWithPath) {
  const std::string p = "/nonexistent_cutrain_dir/missing_config.json";
  try {
    train::load_config(p);
    FAIL() << "no throw";
  } catch (const train::ConfigError& e) {
    EXPECT_NE(e.message().find(p), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("not found"), std::string::npos) << e.message();
  }
}

TEST(Config, DirectoryInsteadOfFileIsNamed) {
  const auto dir = std::filesystem::temp_directory_path();
  try {
    train::load_config(dir);
    FAIL() << "no throw";
  } catch (const train::ConfigError& e) {
    EXPECT_NE(e.message().find(dir.string()), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("is a directory"), std::string::npos) << e.message();
  }
}

TEST(Config, LoadFileNamesItInErrors) {
  auto dir = std::filesystem::temp_directory_path() / ("cutrain_cfg_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto path = dir / "bad.json";
  write_file_atomic(path, std::string_view(R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": 1}})"));
  try {
    train::load_config(path);
    ADD_FAILURE() << "no throw";
  } catch (const train::ConfigError& e) {
    EXPECT_NE(e.message().find(path.string()), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("bf16.enabled"), std::string::npos) << e.message();
  }
  std::filesystem::remove_all(dir);
}

// check_offload_paths: the NVMe swap folder of offload_optimizer, checked where the run starts.
TEST(Config, NvmeOptimizerOffloadNeedsAnExistingFolder) {
  const auto dir = std::filesystem::temp_directory_path() / ("cutrain_cfg_nvme_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  auto config_with = [](const std::string& device, const std::string& path) {
    return train::parse_config(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2,
        "offload_optimizer": {"device": ")" + device + R"(", "nvme_path": ")" + path + R"("}}})", "nvme.json");
  };
  auto expect_path_error = [](const train::TrainConfig& c, std::initializer_list<std::string> parts) {
    try {
      train::check_offload_paths(c);
      ADD_FAILURE() << "no ConfigError";
    } catch (const train::ConfigError& e) {
      for (const auto& p : parts) EXPECT_NE(e.message().find(p), std::string::npos) << "missing '" << p << "' in: " << e.message();
    }
  };
  // Missing folder: the JSON path, what was expected, what was found.
  expect_path_error(config_with("nvme", dir.string()),
                    {"nvme.json", "zero_optimization.offload_optimizer.nvme_path", "expected an existing folder",
                     "'" + dir.string() + "' does not exist"});
  // A file where the folder should be.
  std::filesystem::create_directories(dir);
  const auto file = dir / "not_a_folder";
  write_file_atomic(file, std::string_view("x"));
  expect_path_error(config_with("nvme", file.string()),
                    {"zero_optimization.offload_optimizer.nvme_path", "expected an existing folder",
                     "'" + file.string() + "' is not a folder"});
  // Empty path (a config built in code; the parser already refuses it in a file).
  train::TrainConfig empty = config_with("cpu", "");
  empty.zero_optimization.offload_optimizer.device = train::OffloadTarget::Nvme;
  expect_path_error(empty, {"zero_optimization.offload_optimizer.nvme_path", "found nothing"});
  // An existing folder passes; device cpu and none never look at the path.
  EXPECT_NO_THROW(train::check_offload_paths(config_with("nvme", dir.string())));
  EXPECT_NO_THROW(train::check_offload_paths(config_with("cpu", (dir / "missing").string())));
  EXPECT_NO_THROW(train::check_offload_paths(train::parse_config(R"({"train_micro_batch_size_per_gpu": 1})", "none.json")));
  std::filesystem::remove_all(dir);
}

TEST(Config, BatchResolutionForSeveralWorldSizes) {
  train::TrainConfig c = train::parse_config(R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})", "b.json");
  for (int w : {1, 2, 3, 8}) {
    c.resolve_batch(w);
    EXPECT_EQ(c.train_batch_size, 8 * w) << "world " << w;
    EXPECT_EQ(c.micro_batch(), 4);
    EXPECT_EQ(c.accumulation(), 2);
  }
  train::TrainConfig t = train::parse_config(R"({"train_batch_size": 48, "train_micro_batch_size_per_gpu": 4})", "t.json");
  EXPECT_EQ(t.accumulation(), 12);
  t.resolve_batch(2);
  EXPECT_EQ(t.accumulation(), 6);
  t.resolve_batch(4);
  EXPECT_EQ(t.accumulation(), 3);
  try {
    t.resolve_batch(5);
    ADD_FAILURE() << "48 over 4 * 5 resolved";
  } catch (const train::ConfigError& e) {
    EXPECT_NE(e.message().find("t.json"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("world size 5"), std::string::npos) << e.message();
  }
  train::TrainConfig g = train::parse_config(R"({"train_batch_size": 48, "gradient_accumulation_steps": 3})", "g.json");
  EXPECT_EQ(g.micro_batch(), 16);
  g.resolve_batch(4);
  EXPECT_EQ(g.micro_batch(), 4);
  train::TrainConfig only = train::parse_config(R"({"train_batch_size": 12})", "o.json");
  only.resolve_batch(3);
  EXPECT_EQ(only.micro_batch(), 4);
  EXPECT_EQ(only.accumulation(), 1);
  train::ConfigLoadOptions w2;
  w2.world_size = 2;
  train::TrainConfig all = train::parse_config(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4})", "a.json", w2);
  EXPECT_EQ(all.train_batch_size, 16);
  EXPECT_THROW(all.resolve_batch(1), train::ConfigError);
  train::ConfigLoadOptions w4;
  w4.world_size = 4;
  expect_error(R"({"gradient_accumulation_steps": 2})", {"test.json", "found neither"});
  try {
    train::parse_config(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4})", "x.json", w4);
    ADD_FAILURE() << "16 != 2 * 4 * 4 resolved";
  } catch (const train::ConfigError& e) {
    EXPECT_NE(e.message().find("train_batch_size 16 != train_micro_batch_size_per_gpu 2 * gradient_accumulation_steps 4 * world size 4 = 32"),
              std::string::npos) << e.message();
  }
}

TEST(Config, ShippedConfigsLoad) {
  const std::filesystem::path dir = std::filesystem::path(CUTRAIN_SOURCE_DIR) / "configs";
  train::ConfigLoadOptions strict;
  strict.strict = true;
  for (const char* name : {"baseline.json", "bf16_master_wg.json", "bf16_full.json", "offload_cpu.json", "offload_nvme.json",
                           "bf16_full_nvme_optimizer.json"}) {
    SCOPED_TRACE(name);
    train::TrainConfig c = train::load_config(dir / name, strict);
    EXPECT_TRUE(c.warnings.empty()) << warnings_text(c);
    EXPECT_EQ(c.micro_batch(), 4);
    EXPECT_EQ(c.accumulation(), 1);
    EXPECT_EQ(c.train_batch_size, 4);
    EXPECT_EQ(c.optimizer.type, train::OptimizerType::AdamW);
    EXPECT_FLOAT_EQ(c.optimizer.lr, 1e-4f);
    EXPECT_FLOAT_EQ(c.optimizer.beta1, 0.9f);
    EXPECT_FLOAT_EQ(c.optimizer.beta2, 0.999f);
    EXPECT_FLOAT_EQ(c.optimizer.eps, 1e-8f);
    EXPECT_FLOAT_EQ(c.optimizer.weight_decay, 0.01f);
    EXPECT_TRUE(c.bf16.enabled);
    EXPECT_EQ(c.zero_optimization.stage, 3);
    EXPECT_TRUE(c.zero_optimization.overlap_comm);
    EXPECT_TRUE(c.zero_optimization.contiguous_gradients);
    EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 50000000);
    EXPECT_EQ(c.zero_optimization.stage3_param_persistence_threshold, 0);
  }
  train::TrainConfig base = train::load_config(dir / "baseline.json");
  EXPECT_FALSE(base.bf16.bf16_master_weights_and_grads);
  EXPECT_FALSE(base.bf16.bf16_optimizer_states);
  EXPECT_FALSE(base.torch_autocast.enabled);
  train::TrainConfig mwg = train::load_config(dir / "bf16_master_wg.json");
  EXPECT_TRUE(mwg.bf16.bf16_master_weights_and_grads);
  EXPECT_FALSE(mwg.bf16.bf16_optimizer_states);
  EXPECT_FALSE(mwg.torch_autocast.enabled);
  train::TrainConfig full = train::load_config(dir / "bf16_full.json");
  EXPECT_TRUE(full.bf16.bf16_master_weights_and_grads);
  EXPECT_TRUE(full.bf16.bf16_optimizer_states);
  EXPECT_TRUE(full.torch_autocast.enabled);
  EXPECT_EQ(full.torch_autocast.dtype, train::AutocastDtype::BFloat16);
  train::TrainConfig cpu = train::load_config(dir / "offload_cpu.json");
  EXPECT_EQ(cpu.zero_optimization.offload_optimizer.device, train::OffloadTarget::Cpu);
  train::TrainConfig nvme = train::load_config(dir / "offload_nvme.json");
  EXPECT_EQ(nvme.zero_optimization.offload_optimizer.device, train::OffloadTarget::Nvme);
  EXPECT_EQ(nvme.zero_optimization.offload_optimizer.nvme_path, "/tmp/cutrain_nvme");
  EXPECT_EQ(nvme.source, dir / "offload_nvme.json");
  train::TrainConfig swap = train::load_config(dir / "bf16_full_nvme_optimizer.json");
  EXPECT_TRUE(swap.bf16.bf16_optimizer_states);
  EXPECT_EQ(swap.zero_optimization.offload_optimizer.device, train::OffloadTarget::Nvme);
  EXPECT_TRUE(swap.zero_optimization.offload_optimizer.pipeline_read);
  EXPECT_TRUE(swap.zero_optimization.offload_optimizer.pipeline_write);
}

// Random damage to a shipped config: parsing either succeeds or throws ConfigError, never another
// exception type (a stray nlohmann type_error would escape callers that catch ConfigError).
TEST(Config, RandomDamageGivesConfigErrorsOnly) {
  const std::string text = read_text_file(std::filesystem::path(CUTRAIN_SOURCE_DIR) / "configs" / "offload_nvme.json");
  std::mt19937_64 rng(std::random_device{}());
  const char alphabet[] = "{}[]\":,.-+eE0123456789 truefalsn\\x";
  int refused = 0;
  for (int iter = 0; iter < 400; ++iter) {
    std::string bad = text;
    for (int f = 0; f < 1 + static_cast<int>(rng() % 3); ++f) bad[rng() % bad.size()] = alphabet[rng() % (sizeof alphabet - 1)];
    try {
      train::parse_config(bad, "damaged.json");
    } catch (const train::ConfigError& e) {
      ++refused;
      EXPECT_NE(e.message().find("damaged.json"), std::string::npos) << e.message();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "non-ConfigError on damaged config: " << e.what() << "\n" << bad;
    }
  }
  EXPECT_GT(refused, 0);
}

// String choices become enums where the JSON is read, in any case the file spells them.
TEST(ConfigChoices, ParsedOnceIntoEnums) {
  train::TrainConfig c = train::parse_config(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "adamw"},
      "scheduler": {"type": "warmupcosinelr", "params": {"total_num_steps": 10, "warmup_num_steps": 2, "warmup_type": "LINEAR"}},
      "bf16": {"enabled": false}, "torch_autocast": {"enabled": false, "dtype": "torch.half"},
      "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "CPU"}, "offload_param": {"device": null}}})",
                               "choices.json");
  EXPECT_EQ(c.optimizer.type, train::OptimizerType::AdamW);
  EXPECT_EQ(c.scheduler.type, train::SchedulerType::WarmupCosineLR);
  EXPECT_EQ(c.scheduler.warmup_type, train::WarmupType::Linear);
  EXPECT_EQ(c.torch_autocast.dtype, train::AutocastDtype::Float16);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, train::OffloadTarget::Cpu);
  EXPECT_EQ(c.zero_optimization.offload_param.device, train::OffloadTarget::None);
}

TEST(ConfigChoices, NamesRoundTripThroughTheirTables) {
  for (const auto& ch : train::kOptimizerTypes) EXPECT_EQ(train::parse_choice(train::kOptimizerTypes, name(ch.value), "x"), ch.value);
  for (const auto& ch : train::kSchedulerTypes) EXPECT_EQ(train::parse_choice(train::kSchedulerTypes, name(ch.value), "x"), ch.value);
  for (const auto& ch : train::kWarmupTypes) EXPECT_EQ(train::parse_choice(train::kWarmupTypes, name(ch.value), "x"), ch.value);
  for (const auto& ch : train::kOffloadTargets) EXPECT_EQ(train::parse_choice(train::kOffloadTargets, name(ch.value), "x"), ch.value);
  for (const auto& ch : train::kAutocastDtypes) EXPECT_EQ(train::parse_choice(train::kAutocastDtypes, name(ch.value), "x"), ch.value);
  for (const auto& ch : train::kTrainDevices) EXPECT_EQ(train::parse_choice(train::kTrainDevices, name(ch.value), "x"), ch.value);
  for (const auto& ch : train::kLabelsChoices) EXPECT_EQ(train::parse_choice(train::kLabelsChoices, name(ch.value), "x"), ch.value);
  for (const auto& ch : train::kAttentionChoices) EXPECT_EQ(train::parse_choice(train::kAttentionChoices, name(ch.value), "x"), ch.value);
  for (const auto& ch : train::kAttentionBackwards) EXPECT_EQ(train::parse_choice(train::kAttentionBackwards, name(ch.value), "x"), ch.value);
  EXPECT_STREQ(name(train::SchedulerType::None), "");
  EXPECT_STREQ(name(train::OffloadTarget::None), "none");
  EXPECT_STREQ(name(train::AutocastDtype::BFloat16), "torch.bfloat16");
}

// parse_choice's error for a flag's bad value holds `needle`.
template <class Table>
void expect_choice_error(const Table& table, const char* value, const char* flag, const std::string& needle) {
  try {
    train::parse_choice(table, value, flag);
    ADD_FAILURE() << "no error for " << flag << " " << value;
  } catch (const Error& e) {
    EXPECT_NE(e.message().find(needle), std::string::npos) << e.message();
  }
}

// A flag's bad value: the flag, what was expected and what was found.
TEST(ConfigChoices, BadFlagValueNamesFlagExpectedAndFound) {
  expect_choice_error(train::kAttentionChoices, "sliding", "--attention",
                      "--attention: expected one of \"auto\", \"causal\", \"bidirectional\", found \"sliding\"");
  EXPECT_THROW(train::parse_choice(train::kTrainDevices, "CUDA", "--device"), Error);  // flags are case-sensitive
}

// bf16 master weights round stochastically unless the config names stochastic_rounding or asks
// for the compensation; an fp32 master (the baseline layout) never does by default.
TEST(Config, StochasticRoundingDefaultFollowsTheLayout) {
  auto sr = [](const std::string& bf16) {
    return train::parse_config(R"({"train_micro_batch_size_per_gpu": 1, "bf16": )" + bf16 + "}", "sr.json")
        .bf16.stochastic_rounding;
  };
  EXPECT_FALSE(sr(R"({"enabled": true})"));
  EXPECT_TRUE(sr(R"({"enabled": true, "bf16_master_weights_and_grads": true})"));
  EXPECT_TRUE(sr(R"({"enabled": true, "bf16_master_weights_and_grads": true, "bf16_optimizer_states": true})"));
  EXPECT_FALSE(sr(R"({"enabled": true, "bf16_master_weights_and_grads": true, "bf16_master_compensation": true})"));
  EXPECT_FALSE(sr(R"({"enabled": true, "bf16_master_weights_and_grads": true, "stochastic_rounding": false})"));
  EXPECT_TRUE(sr(R"({"enabled": true, "bf16_master_weights_and_grads": true, "bf16_master_compensation": true,
                    "stochastic_rounding": true})"));
  EXPECT_TRUE(sr(R"({"enabled": true, "stochastic_rounding": true})"));
  EXPECT_FALSE(train::parse_config(R"({"train_micro_batch_size_per_gpu": 1, "bfloat16": {"enabled": true,
      "bf16_master_weights_and_grads": true, "stochastic_rounding": false}})", "sr.json").bf16.stochastic_rounding);
  EXPECT_TRUE(train::load_config(std::filesystem::path(CUTRAIN_SOURCE_DIR) / "configs" / "bf16_full.json")
                  .bf16.stochastic_rounding);
  EXPECT_FALSE(train::load_config(std::filesystem::path(CUTRAIN_SOURCE_DIR) / "configs" / "baseline.json")
                   .bf16.stochastic_rounding);
}

TEST(Config, TensorParallelAutotpSize) {
  EXPECT_FALSE(train::parse_config(R"({"train_micro_batch_size_per_gpu": 2})", "a.json").autotp_size);
  expect_error(R"({"train_micro_batch_size_per_gpu": 2, "tensor_parallel": {"autotp_size": 0}})",
               {"tensor_parallel.autotp_size"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 2, "tensor_parallel": 2})", {"tensor_parallel"});
}

// cutrain's own section: data_order shuffled (the default) or llmc, any case as the other choices;
// another value, another type or an unknown key in it is reported by path.
TEST(Config, CutrainDataOrder) {
  EXPECT_EQ(train::parse_config(R"({"train_micro_batch_size_per_gpu": 2})", "a.json").data_order, data::DataOrder::Shuffled);
  EXPECT_EQ(train::parse_config(R"({"train_micro_batch_size_per_gpu": 2, "cutrain": {"data_order": "llmc"}})", "a.json").data_order,
            data::DataOrder::Llmc);
  EXPECT_EQ(train::parse_config(R"({"train_micro_batch_size_per_gpu": 2, "cutrain": {"data_order": "Shuffled"}})", "a.json").data_order,
            data::DataOrder::Shuffled);
  expect_error(R"({"train_micro_batch_size_per_gpu": 2, "cutrain": {"data_order": "nanogpt"}})", {"cutrain.data_order", "llmc"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 2, "cutrain": {"data_order": 1}})", {"cutrain.data_order"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 2, "cutrain": "llmc"})", {"cutrain"});
  train::ConfigLoadOptions strict;
  strict.strict = true;
  EXPECT_THROW(train::parse_config(R"({"train_micro_batch_size_per_gpu": 2, "cutrain": {"order": "llmc"}})", "a.json", strict),
               train::ConfigError);
}

// cutrain.attention_backward: deterministic (the default) or fast, any case; another value or type
// is reported with the key, the choices and what was found.
TEST(Config, CutrainAttentionBackward) {
  using train::AttentionBackward;
  auto parse = [](const std::string& cutrain) {
    return train::parse_config(R"({"train_micro_batch_size_per_gpu": 2, "cutrain": )" + cutrain + "}", "a.json")
        .attention_backward;
  };
  EXPECT_EQ(train::parse_config(R"({"train_micro_batch_size_per_gpu": 2})", "a.json").attention_backward,
            AttentionBackward::Deterministic);
  EXPECT_EQ(parse(R"({})"), AttentionBackward::Deterministic);
  EXPECT_EQ(parse(R"({"attention_backward": "deterministic"})"), AttentionBackward::Deterministic);
  EXPECT_EQ(parse(R"({"attention_backward": "fast"})"), AttentionBackward::Fast);
  EXPECT_EQ(parse(R"({"attention_backward": "Fast"})"), AttentionBackward::Fast);
  EXPECT_EQ(parse(R"({"data_order": "llmc", "attention_backward": "fast"})"), AttentionBackward::Fast);
  expect_error(R"({"train_micro_batch_size_per_gpu": 2, "cutrain": {"attention_backward": "atomic"}})",
               {"test.json: cutrain.attention_backward: expected one of \"deterministic\", \"fast\", found string \"atomic\""});
  expect_error(R"({"train_micro_batch_size_per_gpu": 2, "cutrain": {"attention_backward": true}})",
               {"cutrain.attention_backward", "one of \"deterministic\", \"fast\"", "found boolean"});
}

// --attention_backward's bad value: the flag, the choices and what was found.
TEST(ConfigChoices, BadAttentionBackwardFlagNamesFlagExpectedAndFound) {
  EXPECT_EQ(train::parse_choice(train::kAttentionBackwards, "fast", "--attention_backward"), train::AttentionBackward::Fast);
  expect_choice_error(train::kAttentionBackwards, "quick", "--attention_backward",
                      "--attention_backward: expected one of \"deterministic\", \"fast\", found \"quick\"");
  EXPECT_STREQ(name(train::AttentionBackward::Deterministic), "deterministic");
  EXPECT_STREQ(name(train::AttentionBackward::Fast), "fast");
}

TEST(Config, PipelineSection) {
  const train::TrainConfig none = train::parse_config(R"({"train_micro_batch_size_per_gpu": 2})", "a.json");
  EXPECT_FALSE(none.pipeline_given);
  EXPECT_FALSE(none.pipeline_stages);
  EXPECT_EQ(none.activation_checkpoint_interval, 0);
  const train::TrainConfig c = train::parse_config(
      R"({"train_micro_batch_size_per_gpu": 2, "pipeline": {"stages": 4, "partition": "type:TransformerBlock",
          "activation_checkpoint_interval": 2, "seed_layers": false}})",
      "a.json");
  EXPECT_TRUE(c.pipeline_given);
  EXPECT_EQ(c.pipeline_stages, 4);
  EXPECT_EQ(c.pipeline_partition, "type:TransformerBlock");
  EXPECT_EQ(c.activation_checkpoint_interval, 2);
  EXPECT_TRUE(c.warnings.empty()) << c.warnings.front();
  // DeepSpeed's defaults: "auto" leaves the degree to the flag, "best" is the parameters method, and
  // the partitioned sends (true) are warned about: cutrain sends activations and gradients whole.
  const train::TrainConfig d = train::parse_config(
      R"({"train_micro_batch_size_per_gpu": 2, "pipeline": {"stages": "auto", "partition": "best",
          "pipe_partitioned": true, "grad_partitioned": true}})",
      "a.json");
  EXPECT_TRUE(d.pipeline_given);
  EXPECT_FALSE(d.pipeline_stages);
  EXPECT_EQ(d.pipeline_partition, "parameters");
  ASSERT_EQ(d.warnings.size(), 2u);
  EXPECT_NE((d.warnings[0] + d.warnings[1]).find("pipeline.pipe_partitioned is read but not acted on"),
            std::string::npos);
  EXPECT_NE((d.warnings[0] + d.warnings[1]).find("pipeline.grad_partitioned is read but not acted on"),
            std::string::npos);
  expect_error(R"({"train_micro_batch_size_per_gpu": 2, "pipeline": {"stages": "many"}})", {"pipeline.stages"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 2, "pipeline": {"stages": 0}})", {"pipeline.stages"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 2, "pipeline": {"activation_checkpoint_interval": -1}})",
               {"pipeline.activation_checkpoint_interval"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 2, "pipeline": 2})", {"pipeline"});
}

// ---- the key table (train/config_keys.h): acted on, warned, error ----

TEST(ConfigKeys, TableIsWellFormedAndDocumented) {
  std::ifstream f(std::filesystem::path(CUTRAIN_SOURCE_DIR) / "docs" / "config.md");
  std::stringstream doc;
  doc << f.rdbuf();
  std::set<std::string_view> seen;
  int acted = 0, warned = 0, error = 0;
  for (const train::ConfigKey& k : train::config_keys()) {
    SCOPED_TRACE(std::string(k.path));
    EXPECT_TRUE(seen.insert(k.path).second) << "listed twice";
    const std::size_t dot = k.path.rfind('.');
    if (dot != std::string_view::npos) {
      const train::ConfigKey* parent = train::find_config_key(k.path.substr(0, dot));
      ASSERT_NE(parent, nullptr);
      EXPECT_TRUE(parent->section);
    }
    if (k.status != train::KeyStatus::Acted) {
      EXPECT_FALSE(k.what.empty()) << "a key not acted on says why";
    }
    for (std::string_view fine = k.fine; !fine.empty();) {
      const std::size_t bar = fine.find('|');
      EXPECT_TRUE(nlohmann::json::accept(fine.substr(0, bar))) << fine;
      if (bar == std::string_view::npos) break;
      fine.remove_prefix(bar + 1);
    }
    if (!k.section) {
      EXPECT_NE(doc.str().find("`" + std::string(k.path) + "`"), std::string::npos) << "not in docs/config.md";
      (k.status == train::KeyStatus::Acted ? acted : k.status == train::KeyStatus::Warned ? warned : error)++;
    }
  }
  EXPECT_NE(doc.str().find(std::to_string(acted) + " acted on, " + std::to_string(warned) + " warned, " +
                           std::to_string(error) + " errors"),
            std::string::npos)
      << "docs/config.md's counts: " << acted << " acted on, " << warned << " warned, " << error << " errors";
}

TEST(ConfigKeys, WarnedKeyGivesExactlyItsWarning) {
  const std::pair<const char*, const char*> cases[] = {
      {R"("zero_optimization": {"stage": 3, "stage3_max_live_parameters": 1e9})", "zero_optimization.stage3_max_live_parameters"},
      {R"("zero_optimization": {"allgather_bucket_size": 5e8})", "zero_optimization.allgather_bucket_size"},
      {R"("zero_optimization": {"contiguous_gradients": false})", "zero_optimization.contiguous_gradients"},
      {R"("fp16": {"enabled": false, "auto_cast": true})", "fp16.auto_cast"},
      {R"("bf16": {"enabled": false})", "bf16.enabled"},
      {R"("bfloat16": {"enabled": false})", "bfloat16.enabled"},  // the old name, named as written
      {R"("tensorboard": {"enabled": true, "output_path": "tb/"})", "tensorboard"},
      {R"("activation_checkpointing": {"profile": true})", "activation_checkpointing.profile"},
      {R"("aio": {"use_gds": true})", "aio.use_gds"},
  };
  for (const auto& [section, path] : cases) {
    SCOPED_TRACE(path);
    const std::string text = std::string(R"({"train_micro_batch_size_per_gpu": 1, )") + section + "}";
    train::TrainConfig c = train::parse_config(text, "w.json");
    const train::ConfigKey* k = train::find_config_key(path);
    ASSERT_NE(k, nullptr);
    EXPECT_EQ(c.warnings, std::vector<std::string>{train::not_acted_warning(path, k->what)}) << warnings_text(c);
    EXPECT_EQ(c.warnings.at(0).rfind(std::string("config key ") + path + " is read but not acted on (", 0), 0u);
  }
}

TEST(ConfigKeys, FineValuesAndActedKeysGiveNone) {
  // Every acted-on key, and warned keys at the value cutrain implements anyway.
  const char* text = R"({
    "train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
    "steps_per_print": 3, "gradient_clipping": 1.0, "wall_clock_breakdown": true,
    "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "betas": [0.9, 0.99], "eps": 1e-8, "weight_decay": 0.01,
                                             "adam_w_mode": true, "bias_correction": true, "amsgrad": false, "torch_adam": false}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3, "warmup_num_steps": 10,
                                                 "warmup_type": "linear", "last_batch_iteration": -1}},
    "bf16": {"enabled": true, "bf16_master_weights_and_grads": true, "bf16_optimizer_states": true,
             "stochastic_rounding": true, "check_grad_overflow": true},
    "fp16": {"enabled": false},
    "zero_optimization": {"stage": 2, "overlap_comm": true, "contiguous_gradients": true, "reduce_bucket_size": 5e7,
                          "reduce_scatter": true, "allgather_partitions": true, "round_robin_gradients": false,
                          "stage3_param_persistence_threshold": 0, "stage3_gather_16bit_weights_on_model_save": true,
                          "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp/x", "pin_memory": true,
                                                "pipeline_read": true, "pipeline_write": true, "fast_init": false, "ratio": 1},
                          "offload_param": {"device": null}},
    "torch_autocast": {"enabled": true, "dtype": "torch.bfloat16"},
    "activation_checkpointing": {"partition_activations": false, "number_checkpoints": null},
    "tensorboard": {"enabled": false},
    "aio": {"block_size": 1048576, "queue_depth": 8, "thread_count": 2, "single_submit": false, "overlap_events": true,
            "use_gds": false}
  })";
  train::TrainConfig c = train::parse_config(text, "a.json");
  EXPECT_TRUE(c.warnings.empty()) << warnings_text(c);
  EXPECT_EQ(c.steps_per_print, 3);
  EXPECT_TRUE(c.wall_clock_breakdown);
  // steps_per_print absent: not given (the loop then uses --log_interval's default).
  EXPECT_FALSE(train::parse_config(R"({"train_micro_batch_size_per_gpu": 1})", "m.json").steps_per_print.has_value());
}

TEST(ConfigKeys, ErrorKeysNameTheKeyAndWhy) {
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": true, "fp16_master_weights_and_grads": true}})",
               {"test.json", "fp16.fp16_master_weights_and_grads: fp16 training keeps fp32 master weights"});
  // Strict or not, the same error.
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": true, "fp16_master_weights_and_grads": true}})",
               {"fp16.fp16_master_weights_and_grads", "not implemented"}, /*strict=*/true);
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"params": {"bias_correction": false}}})",
               {"optimizer.params.bias_correction", "without bias correction is not implemented"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})",
               {"zero_optimization.offload_param.device", "parameter offload is not implemented"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "scheduler": {"type": "WarmupLR", "params": {"last_batch_iteration": 7}}})",
               {"scheduler.params.last_batch_iteration", "--resume"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "torch_autocast": {"enabled": true, "dtype": "torch.float16"}})",
               {"torch_autocast.dtype", "torch.float16 is not implemented", "torch.bfloat16"});
  // A wrong type is still a type error first (the table acts on valid values).
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": "yes"}})",
               {"fp16.enabled", "expected a boolean"});
}

// fp16 training: the block parses with DeepSpeed's defaults, strict or not, with no warning; with
// bf16 too it is an error naming both, and a bf16 master layout beside it names its key.
TEST(ConfigFp16, EnabledParsesWithDeepSpeedDefaults) {
  const train::TrainConfig c = train::parse_config(R"({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": true}})",
                                                   "f.json", train::ConfigLoadOptions{true});
  EXPECT_TRUE(c.warnings.empty()) << warnings_text(c);
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.loss_scale, 0.f);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_EQ(c.fp16.min_loss_scale, 1.f);
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}, "fp16": {"enabled": true}})",
               {"test.json", "fp16.enabled: fp16.enabled and bf16.enabled are both true"});
  expect_error(
      R"({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": true}, "bf16": {"bf16_master_weights_and_grads": true}})",
      {"bf16.bf16_master_weights_and_grads", "needs bf16.enabled: true"});
}

TEST(ConfigKeys, UnknownKeysStayWarningsNamingTheNearest) {
  train::TrainConfig c = train::parse_config(R"({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabeld": true}})", "u.json");
  ASSERT_EQ(c.warnings.size(), 1u) << warnings_text(c);
  EXPECT_TRUE(any_warning_has(c, {"u.json", "fp16.enabeld", "unknown key", "'fp16.enabled'", "ignored"})) << warnings_text(c);
  // A key of the other offload section: unknown here, not read.
  train::TrainConfig d = train::parse_config(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1,
      "offload_optimizer": {"device": "cpu", "buffer_size": 5}}})", "o.json");
  EXPECT_TRUE(any_warning_has(d, {"zero_optimization.offload_optimizer.buffer_size", "unknown key"})) << warnings_text(d);
}

// llm.c's GPT-2 recipe as DeepSpeed configs: AdamW 0.9/0.95, eps 1e-8, weight decay 0.1, clipping
// 1.0, bf16 with fp32 master weights (the baseline layout), stochastic rounding; the first with
// 700 warm-up steps and cosine to 0, the second (the device comparison's) with a constant lr; both
// draw llm.c's batches (cutrain.data_order "llmc").
TEST(Config, LlmcGpt2ConfigsLoad) {
  const std::filesystem::path dir = std::filesystem::path(CUTRAIN_SOURCE_DIR) / "configs";
  train::ConfigLoadOptions strict;
  strict.strict = true;
  for (const char* name : {"llmc_gpt2.json", "llmc_gpt2_constant.json"}) {
    SCOPED_TRACE(name);
    const train::TrainConfig c = train::load_config(dir / name, strict);
    EXPECT_TRUE(c.warnings.empty()) << warnings_text(c);
    EXPECT_EQ(c.optimizer.type, train::OptimizerType::AdamW);
    EXPECT_FLOAT_EQ(c.optimizer.beta1, 0.9f);
    EXPECT_FLOAT_EQ(c.optimizer.beta2, 0.95f);
    EXPECT_FLOAT_EQ(c.optimizer.eps, 1e-8f);
    EXPECT_FLOAT_EQ(c.optimizer.weight_decay, 0.1f);
    EXPECT_FLOAT_EQ(c.gradient_clipping, 1.0f);
    EXPECT_TRUE(c.bf16.enabled);
    EXPECT_FALSE(c.bf16.bf16_master_weights_and_grads);
    EXPECT_TRUE(c.bf16.stochastic_rounding);
    EXPECT_EQ(c.zero_optimization.stage, 0);
    EXPECT_EQ(c.data_order, data::DataOrder::Llmc);
  }
  const train::TrainConfig cos = train::load_config(dir / "llmc_gpt2.json");
  const train::LrSchedule s = train::LrSchedule::from_config(cos);
  EXPECT_FLOAT_EQ(cos.optimizer.lr, 6e-4f);
  EXPECT_FLOAT_EQ(s.lr(0), 0.f);                   // DeepSpeed's: lr 0 before the first step
  EXPECT_NEAR(s.lr(351), 6e-4 * 350 / 700, 1e-9);  // linear warm-up
  EXPECT_NEAR(s.lr(701), 6e-4, 1e-9);
  EXPECT_LT(s.lr(10000), 6e-4 * 0.6);
  EXPECT_NEAR(s.lr(18866), 0.0, 1e-9);             // cosine to cos_min_ratio 0
  const train::TrainConfig cst = train::load_config(dir / "llmc_gpt2_constant.json");
  const train::LrSchedule k = train::LrSchedule::from_config(cst);
  for (int step : {0, 1, 199, 5000}) EXPECT_FLOAT_EQ(k.lr(step), 3e-4f);
}

// ---- optimizer type Lamb (DeepSpeed's FusedLamb parameters) ----

TEST(ConfigLamb, ParsesItsParameters) {
  const train::TrainConfig c = train::parse_config(
      R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "lamb", "params": {"lr": 11e-3,
          "weight_decay": 0.01, "bias_correction": false, "max_coeff": 0.3, "min_coeff": 0.01,
          "eps_inside_sqrt": true}}})",
      "lamb.json");
  EXPECT_EQ(c.optimizer.type, train::OptimizerType::Lamb);  // any case, as DeepSpeed's
  EXPECT_FLOAT_EQ(c.optimizer.lr, 11e-3f);
  EXPECT_FALSE(c.optimizer.bias_correction);
  EXPECT_FLOAT_EQ(c.optimizer.max_coeff, 0.3f);
  EXPECT_FLOAT_EQ(c.optimizer.min_coeff, 0.01f);
  EXPECT_TRUE(c.optimizer.eps_inside_sqrt);
  EXPECT_TRUE(c.warnings.empty());
  const train::TrainConfig d = train::parse_config(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Lamb"}})", "d.json");
  EXPECT_FLOAT_EQ(d.optimizer.max_coeff, 10.f);  // FusedLamb's defaults
  EXPECT_FLOAT_EQ(d.optimizer.min_coeff, 0.01f);
  EXPECT_FALSE(d.optimizer.eps_inside_sqrt);
}

TEST(ConfigLamb, ParametersOfTheOtherFamilyAndBadCombinationsAreErrors) {
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"max_coeff": 0.3}}})",
               {"optimizer.params.max_coeff", "a parameter of type Lamb; type is AdamW"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Adam", "params": {"eps_inside_sqrt": true}}})",
               {"optimizer.params.eps_inside_sqrt", "type is Adam"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Lamb", "params": {"adam_w_mode": true}}})",
               {"optimizer.params.adam_w_mode", "type Adam / AdamW; type is Lamb"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Lamb", "params": {"min_coeff": 2, "max_coeff": 1}}})",
               {"optimizer.params.min_coeff", "above max_coeff"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Lamb", "params": {"max_grad_norm": 1.0}}})",
               {"optimizer.params.max_grad_norm", "gradient_clipping"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Lamb"}, "zero_optimization": {"stage": 1}})",
               {"zero_optimization.stage", "Lamb needs ZeRO stage 0, found stage 1"});
  expect_error(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Lamb", "params": {"max_coeff": -1}}})",
               {"optimizer.params.max_coeff"});
}
