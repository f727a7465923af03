// `cutrain check-config FILE`: loads a DeepSpeed-style config the way `train` will, prints the
// resolved values, the warnings and the first learning rates, and exits 1 on any error (so a typo
// is found before a job is queued, not after).
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "tools/commands.h"
#include "train/config.h"
#include "train/lr_schedule.h"

namespace cutrain::tools {
namespace {

struct Options {
  std::string path;
  bool strict = false;
  int world_size = 1;
  int steps = 5;
};

const char* on(bool b) { return b ? "on" : "off"; }

int run_check_config(const Options& o) {
  train::ConfigLoadOptions lo;
  lo.strict = o.strict;
  lo.world_size = o.world_size;
  train::TrainConfig c = train::load_config(o.path, lo);
  for (const auto& w : c.warnings) std::cerr << "warning: " << w << "\n";
  const auto& z = c.zero_optimization;
  std::printf("%s: OK (%zu warning%s)\n", o.path.c_str(), c.warnings.size(), c.warnings.size() == 1 ? "" : "s");
  std::printf("  batch      train %d = micro %d x accumulation %d x world %d\n", *c.train_batch_size, c.micro_batch(),
              c.accumulation(), o.world_size);
  std::printf("  optimizer  %s lr %g betas (%g, %g) eps %g weight_decay %g%s\n", name(c.optimizer.type), c.optimizer.lr,
              c.optimizer.beta1, c.optimizer.beta2, c.optimizer.eps, c.optimizer.weight_decay,
              c.optimizer.adam_w_mode ? " (decoupled)" : " (L2)");
  std::printf("  precision  bf16 %s, master weights+grads bf16 %s, optimizer states bf16 %s, stochastic rounding %s, "
              "master compensation %s, fp16 %s, autocast %s (%s)\n",
              on(c.bf16.enabled), on(c.bf16.bf16_master_weights_and_grads), on(c.bf16.bf16_optimizer_states),
              on(c.bf16.stochastic_rounding), on(c.bf16.bf16_master_compensation),
              on(c.fp16.enabled), on(c.torch_autocast.enabled), name(c.torch_autocast.dtype));
  std::printf("  zero       stage %d, overlap_comm %s, reduce_bucket %lld, offload optimizer %s, offload param %s\n", z.stage,
              on(z.overlap_comm), static_cast<long long>(z.reduce_bucket_size), name(z.offload_optimizer.device),
              name(z.offload_param.device));
  std::printf("  clipping   %g, steps_per_print %s, activation checkpointing %s\n", c.gradient_clipping,
              c.steps_per_print ? std::to_string(*c.steps_per_print).c_str() : "(--log_interval)",
              on(c.has_activation_checkpointing));
  if (c.autotp_size)
    std::printf("  tensor     autotp_size %d (the tensor-parallel degree without --tensor_parallel_size; the GPU engine: 1)\n",
                *c.autotp_size);
  if (c.pipeline_given)
    std::printf("  pipeline   stages %s, partition %s, activation_checkpoint_interval %d\n",
                c.pipeline_stages ? std::to_string(*c.pipeline_stages).c_str() : "auto (--pipeline_parallel_size)",
                c.pipeline_partition ? c.pipeline_partition->c_str() : "(--partition_method)",
                c.activation_checkpoint_interval);
  train::LrSchedule lr = train::LrSchedule::from_config(c);
  std::printf("  schedule   %s\n", lr.describe().c_str());
  for (int s = 0; s < o.steps; ++s) std::printf("    step %d lr %.6g\n", s, lr.lr(s));
  return 0;
}

}  // namespace

CLI::App* setup_check_config_command(CLI::App& parent, int& exit_code) {
  auto o = std::make_shared<Options>();
  CLI::App* sub = parent.add_subcommand("check-config", "Load a DeepSpeed-style config, print what it resolves to");
  sub->add_option("config", o->path, "the JSON file")->required();
  sub->add_flag("--strict", o->strict, "unknown keys are errors");
  sub->add_option("--world-size", o->world_size, "ranks to resolve the batch sizes for")->check(CLI::PositiveNumber);
  sub->add_option("--steps", o->steps, "how many first learning rates to print")->check(CLI::NonNegativeNumber);
  sub->callback([o, &exit_code] { exit_code = run_check_config(*o); });
  return sub;
}

}  // namespace cutrain::tools
