#include "train/train_loop.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>

#include "data/batch_sampler.h"
#include "data/data_loader.h"
#include "data/mlm_sampler.h"
#include "kernels/attention.cuh"
#include "parallel/expert_parallel_plan.h"
#include "parallel/rank_grid.h"
#include "runtime/allocator.h"
#include "runtime/comm/launch_env.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "train/checkpoint.h"
#include "train/checkpoint_store.h"
#include "train/checkpoint_writer.h"
#include "train/config.h"
#include "train/cpu_backend.h"
#include "train/curriculum_setup.h"
#include "train/engine.h"
#include "train/line_log.h"
#include "train/gpt2_io.h"
#include "train/loss_scaler.h"
#include "train/lr_schedule.h"
#include "train/precision.h"
#include "train/random_ltd_schedule.h"
#include "train/seqlen_curriculum.h"

namespace cutrain::train {

namespace {
constexpr int kGpt2Vocab = 50257;
constexpr int kDefaultLogInterval = 5;  // train.py's --log_interval
}

std::string format_gb(std::int64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f GB", double(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

std::string with_commas(std::uint64_t n) {
  const std::string digits = std::to_string(n);
  std::string s;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) s += ',';
    s += digits[i];
  }
  return s;
}

namespace {

// Shortest text that reads back as the same double (Python's repr, as csv.writer writes it).
std::string repr(double x) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string fixed(double x, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return buf;
}

// "1h02m", "3m05s", "12s".
std::string duration_text(double seconds) {
  const long s = std::lround(std::max(0.0, seconds));
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, s / 60 % 60);
  else if (s >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%lds", s);
  return buf;
}

// --resume: the shape flags the run did not give take the checkpoint's values.
void take_checkpoint_shape(TrainOptions& o, const model::ModelDims& d) {
  const TrainOptions::ShapeGiven& g = o.shape_given;
  if (!g.hidden_dim) o.hidden_dim = d.hidden;
  if (!g.num_layers) o.num_layers = d.layers;
  if (!g.num_heads) o.num_heads = d.heads;
  if (!g.vocab_size) o.vocab_size = d.vocab;
  if (!g.seq_length) o.seq_length = d.max_seq;
  if (!g.pad_vocab) o.pad_vocab = d.padded_vocab > d.vocab ? d.padded_vocab : 0;
  o.model = d.arch;
}

// The run's model against the checkpoint's: a difference names the flag and both values.
void check_checkpoint_shape(const model::ModelDims& run, const model::ModelDims& ck, const std::string& where) {
  auto same = [&](const char* flag, const char* key, int a, int b) {
    CUTRAIN_CHECK(a == b, "train: ", flag, " gives ", key, " ", a, ", the checkpoint (", where, ") has ", b,
                  " (leave the flag out to take the checkpoint's)");
  };
  same("--hidden_dim", "hidden_dim", run.hidden, ck.hidden);
  same("--num_layers", "num_layers", run.layers, ck.layers);
  same("--num_heads", "num_heads", run.heads, ck.heads);
  same("--vocab_size", "vocab_size", run.vocab, ck.vocab);
  same("--pad_vocab", "embedding_rows", run.vocab_rows(), ck.vocab_rows());
  same("--seq_length", "max_seq_len", run.max_seq, ck.max_seq);
  if (run.arch == model::Arch::Bert) same("--bert_config", "ffn_dim", run.ffn(), ck.ffn());
}

// Host bytes of the state's snapshot (train/state_snapshot.h): every persistent buffer of the
// layout but the gradients; the CPU backend keeps fp32 params and moments only.
std::uint64_t snapshot_bytes_estimate(std::size_t flat, const PrecisionPlan& plan, TrainDevice device) {
  const std::size_t per = device == TrainDevice::Cpu ? 3 * 4 : plan.bytes_per_param() - dtype_size(plan.grad);
  return std::uint64_t(flat) * per;
}

// MemAvailable of /proc/meminfo in bytes (0: not known).
std::uint64_t host_memory_available() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  std::uint64_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

// --init_from_llmc: the file gives the architecture and every shape; a shape flag given with
// another value is an error naming the flag, the file and both values.
void take_llmc_shape(TrainOptions& o, const model::LlmcHeader& h) {
  const TrainOptions::ShapeGiven& g = o.shape_given;
  const std::string where = "the llm.c checkpoint " + o.init_from_llmc.string();
  auto take = [&](const char* flag, bool given, int& v, int file) {
    CUTRAIN_CHECK(!given || v == file, "train: ", flag, " gives ", v, ", ", where, " has ", file,
                  " (leave the flag out to take the file's)");
    v = file;
  };
  take("--hidden_dim", g.hidden_dim, o.hidden_dim, h.channels);
  take("--num_layers", g.num_layers, o.num_layers, h.layers);
  take("--num_heads", g.num_heads, o.num_heads, h.heads);
  take("--vocab_size", g.vocab_size, o.vocab_size, h.vocab);
  CUTRAIN_CHECK(o.max_seq_len == 0 || o.max_seq_len == h.max_seq, "train: --max_seq_len gives ", o.max_seq_len,
                ", ", where, " has ", h.max_seq);
  o.max_seq_len = h.max_seq;
  CUTRAIN_CHECK(o.seq_length <= h.max_seq, "train: --seq_length ", o.seq_length, " is longer than ", where,
                "'s position table (", h.max_seq, " rows)");
  o.model = model::Arch::Gpt2;
}

}  // namespace

TrainResult run_training(const TrainOptions& options, std::ostream& out_all) {
  TrainOptions o = options;  // --resume fills the shape flags not given
  CUTRAIN_CHECK(!o.deepspeed_config.empty(), "train: --deepspeed_config PATH is required");
  CUTRAIN_CHECK(o.num_steps >= 1, "train: --num_steps must be >= 1, got ", o.num_steps);
  CUTRAIN_CHECK(!o.log_interval || *o.log_interval >= 1, "train: --log_interval must be >= 1, got ", o.log_interval.value_or(0));
  CUTRAIN_CHECK(o.batch_size >= 1 && o.seq_length >= 1, "train: --batch_size and --seq_length must be >= 1, got ",
                o.batch_size, " and ", o.seq_length);
  CUTRAIN_CHECK(!o.use_real_data || !o.data.empty(),
                "train: --use_real_data needs --data PATTERN (llm.c token shards, e.g. from `cutrain prepare-data`)");
  CUTRAIN_CHECK(o.labels == LabelsChoice::Auto || o.use_real_data, "train: --labels ", name(o.labels),
                " applies to --use_real_data (random data has random labels, as the BF16 example)");
  CUTRAIN_CHECK(o.pad_vocab >= 0, "train: --pad_vocab must be a positive multiple (e.g. 64 or 128), got ",
                o.pad_vocab);
  CUTRAIN_CHECK(o.eval_data.empty() || o.use_real_data,
                "train: --eval_data needs --use_real_data (validation shards go with training shards)");
  CUTRAIN_CHECK(o.eval_interval >= 0, "train: --eval_interval must be >= 0 (0: only before and after), got ",
                o.eval_interval);
  CUTRAIN_CHECK(o.eval_steps >= 1, "train: --eval_steps must be >= 1, got ", o.eval_steps);
  CUTRAIN_CHECK(!o.save_interval || *o.save_interval >= 1,
                "train: --save_interval: expected N >= 1 (save after every N steps), found ", *o.save_interval);
  CUTRAIN_CHECK(!o.keep_last || *o.keep_last >= 1, "train: --keep_last: expected K >= 1 (step folders kept), found ",
                *o.keep_last);
  CUTRAIN_CHECK((!o.save_interval && !o.keep_last) || !o.save_dir.empty(), "train: ",
                o.save_interval ? "--save_interval" : "--keep_last", ": expected --save DIR with it, found none");
  CUTRAIN_CHECK(o.save_mode == SaveMode::Auto || !o.save_dir.empty(), "train: --save_mode ", name(o.save_mode),
                ": expected --save DIR with it, found none");
  CUTRAIN_CHECK(!o.accept_legacy_checkpoint || !o.resume_dir.empty(),
                "train: --accept_legacy_checkpoint: expected --resume DIR with it, found none");
  check_mos_options(o.mos, !o.resume_dir.empty());  // Mixture-of-Students' flags (train/mos_options.h)
  bool next_token = o.use_real_data && o.labels != LabelsChoice::Identity;

  // Data parallel (cutrain launch, torchrun, mpirun, Slurm): the backend makes the communicator from
  // the same variables (NCCL on GPUs, the host communicator on the CPU backend); here they size the
  // global batch and deal batches by rank.
  const comm::LaunchEnv env = comm::read_launch_env();
  // As the BF16 example's print_rank_0: the log is rank 0's; other ranks print only their ZeRO
  // memory line (the engine's) and errors.
  std::ostream quiet(nullptr);
  std::ostream& out = env.rank == 0 ? out_all : quiet;

  // Checkpoints before any work: --save's folder must take files (rank 0 writes), --resume's is
  // found and verified against its manifest, and gives the shape flags not given.
  if (!o.save_dir.empty() && env.rank == 0) check_checkpoint_root(o.save_dir, "train: --save");
  std::optional<OpenedCheckpoint> resume;
  model::ModelDims resume_dims;
  double verify_s = 0;
  if (!o.resume_dir.empty()) {
    const auto tv = std::chrono::steady_clock::now();
    resume = open_checkpoint(o.resume_dir, o.accept_legacy_checkpoint, /*checksum_on_load=*/true);
    verify_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - tv).count();
    for (const auto& n : resume->notes) out << "[Rank 0] checkpoint " << n << "\n";
    if (!resume->legacy) {
      resume_dims = checkpoint_model_dims(resume->manifest.config, (resume->folder / kCheckpointConfigFile).string());
      take_checkpoint_shape(o, resume_dims);
    }
  }
  // --init_from_llmc gives the shape and the architecture (after --resume's: both are errors together).
  std::optional<model::LlmcHeader> llmc;
  CUTRAIN_CHECK(o.resume_dir.empty() || (o.init_from_llmc.empty() && o.init_from_hf.empty()),
                "train: --resume continues a checkpoint; --init_from_llmc / --init_from_hf start a new run: expected one");
  if (!o.init_from_llmc.empty()) {
    llmc = model::read_llmc_header(o.init_from_llmc);
    take_llmc_shape(o, *llmc);
  }
  const bool gpt2 = o.model == model::Arch::Gpt2;
  // --model bert: the model, the sequence length and the masked-LM cap from --bert_config and
  // bing_bert's flags (train/bert_options.h); a shape flag that says otherwise is an error.
  const bool bert = o.model == model::Arch::Bert;
  std::optional<BertSetup> bert_setup;
  CUTRAIN_CHECK(o.pad_to_longest >= 0, "train: --pad_to_longest: expected a bucket >= 1 (e.g. 64; 0: off), found ",
                o.pad_to_longest);
  CUTRAIN_CHECK(o.pad_to_longest == 0 || bert, "train: --pad_to_longest ", o.pad_to_longest,
                " pads BERT's masked-LM micro-batches: expected --model bert, found --model ", name(o.model));
  if (bert) {
    CUTRAIN_CHECK(o.attention != AttentionChoice::Causal,
                  "train: --attention causal with --model bert: BERT's encoder is bidirectional ([PAD] keys masked)");
    CUTRAIN_CHECK(o.labels == LabelsChoice::Auto, "train: --labels ", name(o.labels),
                  " with --model bert: BERT trains on masked-LM labels (docs/bert.md, \"Data\")");
    const int pad = o.pad_vocab > 0 ? o.pad_vocab : 128;
    bert_setup = load_bert_config(o.bert, o.seq_length, pad);
    const model::ModelDims& d = bert_setup->dims;
    const TrainOptions::ShapeGiven& g = o.shape_given;
    auto agree = [&](bool given, const char* flag, int v, const char* key, int want) {
      CUTRAIN_CHECK(!given || v == want, "train: ", flag, " ", v, " contradicts --bert_config ", o.bert.config.string(),
                    " (", key, " ", want, "); with --model bert the shape comes from the file: leave ", flag, " out");
      return want;
    };
    o.hidden_dim = agree(g.hidden_dim, "--hidden_dim", o.hidden_dim, "hidden_size", d.hidden);
    o.num_layers = agree(g.num_layers, "--num_layers", o.num_layers, "num_hidden_layers", d.layers);
    o.num_heads = agree(g.num_heads, "--num_heads", o.num_heads, "heads", d.heads);
    o.vocab_size = agree(g.vocab_size, "--vocab_size", o.vocab_size, "the vocabulary: GPT-2's + [MASK] + [PAD]", d.vocab);
    o.seq_length = bert_setup->seq_len;
    o.max_seq_len = d.max_seq;
    o.pad_vocab = pad;
    next_token = false;
  }
  CUTRAIN_CHECK(!gpt2 || o.attention != AttentionChoice::Bidirectional,
                "train: --model gpt2 is causal; --attention bidirectional is for --model simple");
  CUTRAIN_CHECK((o.init_from_hf.empty() && o.save_hf.empty()) || gpt2, "train: --init_from_hf / --save_hf ",
                "use Hugging Face's GPT-2 names: expected --model gpt2 (or --gpt2_size), found --model ", name(o.model));
  CUTRAIN_CHECK(o.init_from_hf.empty() || o.init_from_llmc.empty(),
                "train: --init_from_hf and --init_from_llmc both given; expected one");
  CUTRAIN_CHECK(o.save_llmc.empty() || gpt2, "train: --save_llmc writes llm.c's GPT-2 layout: expected --model gpt2 (or "
                "--gpt2_size, --init_from_llmc), found --model ", name(o.model));
  CUTRAIN_CHECK(o.max_seq_len == 0 || o.seq_length <= o.max_seq_len, "train: --seq_length ", o.seq_length,
                " is longer than --max_seq_len ", o.max_seq_len);
  const bool causal = !bert && (gpt2 || o.attention == AttentionChoice::Causal ||
                      (o.attention == AttentionChoice::Auto && next_token));

  TrainConfig cfg = load_config(o.deepspeed_config);
  // DeepSpeedTransformerConfig's fp16: true selects fp16 training (the fp16 block's defaults when the
  // DeepSpeed config has none).
  if (bert_setup && bert_setup->fp16) {
    CUTRAIN_CHECK(!cfg.bf16.enabled, "train: --bert_config ", o.bert.config.string(), " says fp16: true and ",
                  o.deepspeed_config.string(), " says bf16.enabled: true: the model computes in one of them; set "
                  "fp16 false in the BERT config or bf16.enabled false");
    if (!cfg.fp16.enabled) out << "[Rank 0] --bert_config fp16: true: fp16 training (the fp16 block's defaults)\n";
    cfg.fp16.enabled = true;
  }
  CUTRAIN_CHECK(!cfg.fp16.enabled || o.device == TrainDevice::Cuda, "train: ", o.deepspeed_config.string(),
                ": fp16.enabled: true with --device cpu: the CPU backend computes in fp32 (the reference), so it would "
                "not train in fp16; use --device cuda");
  for (const auto& w : cfg.warnings) out << "[Rank 0] warning: " << w << "\n";
  const int log_interval = o.log_interval.value_or(cfg.steps_per_print.value_or(kDefaultLogInterval));
  ProfilingOptions profiling = o.profiling;
  if (cfg.wall_clock_breakdown && !profiling.timing_report) {
    profiling.timing_report = true;
    out << "[Rank 0] wall_clock_breakdown: the timing report is on (as --timing_report)\n";
  }
  // Before the first step (and before the model is built): a log that cannot be written fails now.
  // Rank 0's files only; every step appends its line when it ends.
  LineLog loss_log, metrics_log;
  if (env.rank == 0 && !o.loss_log_file.empty()) {
    loss_log = LineLog("--loss_log_file", o.loss_log_file);
    loss_log.append("step,loss\n");
  }
  if (env.rank == 0 && !o.metrics_file.empty()) metrics_log = LineLog("--metrics_file", o.metrics_file);
  if (bert) {
    // The micro-batch: the config's train_micro_batch_size_per_gpu unless --batch_size is given
    // (then they must agree), checked against DeepSpeedTransformerConfig's batch_size.
    const std::optional<int> micro = cfg.train_micro_batch_size_per_gpu;
    std::string source = "--batch_size";
    if (micro && !o.batch_size_given) {
      o.batch_size = *micro;
      source = "train_micro_batch_size_per_gpu of " + o.deepspeed_config.string();
    }
    CUTRAIN_CHECK(!micro || *micro == o.batch_size, "train: --batch_size ", o.batch_size,
                  " contradicts train_micro_batch_size_per_gpu ", micro.value_or(0), " of ", o.deepspeed_config.string(),
                  " (leave --batch_size out to take the config's)");
    check_bert_batch(*bert_setup, o.batch_size, source);
    for (const auto& n : bert_setup->notes) out << "[Rank 0] note: " << n << "\n";
    if (bert_setup->seed && *bert_setup->seed != o.seed)
      out << "[Rank 0] note: " << bert_setup->origin << ": seed " << *bert_setup->seed
          << ": read but not acted on (init, dropout and data draw from --seed " << o.seed << ")\n";
    out << "[Rank 0] " << describe_bert(*bert_setup) << "\n";
  }
  // The command line's batch size is the micro batch (the BF16 example passes the same 4 to both).
  if (!cfg.train_micro_batch_size_per_gpu) cfg.train_micro_batch_size_per_gpu = o.batch_size;
  // The ranks are pipeline stages x data-parallel replicas; the batch is the replicas'.
  // The degree: the flag, else the config's pipeline.stages, else 1; the partition method likewise.
  if (!o.pipeline_parallel_given && cfg.pipeline_stages) o.pipeline_parallel_size = *cfg.pipeline_stages;
  if (!o.partition_method_given && cfg.pipeline_partition) o.partition_method = *cfg.pipeline_partition;
  const int pp = o.pipeline_parallel_size, vstages = o.pipeline_stages_in_process;
  const bool on_gpu = o.device != TrainDevice::Cpu;
  CUTRAIN_CHECK(pp >= 1, "train: --pipeline_parallel_size: expected a number of stages >= 1, found ", pp);
  CUTRAIN_CHECK(vstages >= 1, "train: --pipeline_stages_in_process: expected a number of stages >= 1, found ", vstages);
  CUTRAIN_CHECK(vstages == 1 || on_gpu, "train: --pipeline_stages_in_process ", vstages,
                ": virtual stages run on --device cuda; the CPU backend runs one stage per rank "
                "(--pipeline_parallel_size under cutrain launch --backend host)");
  CUTRAIN_CHECK(vstages == 1 || pp == 1, "train: --pipeline_stages_in_process ", vstages,
                " with --pipeline_parallel_size ", pp,
                ": the stages of this process are the whole pipeline; expected --pipeline_parallel_size 1");
  // A pipeline over GPUs (one stage per rank over NCCL, train/gpu_pipeline.h): what it does not
  // build is refused here, before any work.
  CUTRAIN_CHECK(pp == 1 || !on_gpu || o.model == model::Arch::Simple, "train: --pipeline_parallel_size ", pp,
                " with --device cuda and --model ", name(o.model), ": the GPU model's stages of part of a tied-head "
                "model (its head reads the token embedding on the last stage) are not built; expected the seed model, "
                "--pipeline_stages_in_process 1 or --device cpu");
  CUTRAIN_CHECK(pp == 1 || !on_gpu || cfg.zero_optimization.stage == 0, "train: --pipeline_parallel_size ", pp,
                " with --device cuda and zero_optimization.stage ", cfg.zero_optimization.stage,
                ": each GPU stage averages its gradients over its data-parallel group (stage 0); ZeRO stages 1-3 "
                "inside a GPU pipeline are not built; expected stage 0, or --device cpu (stage 1)");
  CUTRAIN_CHECK(pp == 1 || !on_gpu || env.world_size > 1, "train: --pipeline_parallel_size ", pp,
                " with --device cuda: one stage per GPU rank (activations sent over NCCL); expected a launch of at least ",
                pp, " ranks (cutrain launch --num_gpus ", pp, "), found one process; --pipeline_stages_in_process ", pp,
                " runs every stage on this GPU");
  const int ckpt_interval = cfg.activation_checkpoint_interval;
  if (ckpt_interval > 0 && on_gpu) {
    CUTRAIN_CHECK(ckpt_interval == 1, "train: ", o.deepspeed_config.string(),
                  " gives pipeline.activation_checkpoint_interval ", ckpt_interval,
                  ": the GPU engine checkpoints every block (interval 1, as --activation_checkpointing); chunks of "
                  "several layers are built on --device cpu's pipeline");
    if (!o.activation_checkpointing)
      out << "[Rank 0] pipeline.activation_checkpoint_interval 1: every block recomputed in backward "
             "(--activation_checkpointing)\n";
    o.activation_checkpointing = true;
  } else if (ckpt_interval > 0 && pp == 1) {
    out << "[Rank 0] note: pipeline.activation_checkpoint_interval " << ckpt_interval
        << ": read but not acted on without a pipeline (--pipeline_parallel_size 1 on --device cpu)\n";
  }
  CUTRAIN_CHECK(pp == 1 || cfg.optimizer.type != OptimizerType::Lamb, "train: --pipeline_parallel_size ", pp, ": ",
                o.deepspeed_config.string(), " gives optimizer.type Lamb, whose trust ratios need whole tensors on one "
                "rank; the pipeline's stages update with AdamW only");
  // Tensor parallelism: the flag, else the config's tensor_parallel.autotp_size.
  const int tp = o.tensor_parallel_size.value_or(cfg.autotp_size.value_or(1));
  const std::string tp_flag = o.tensor_parallel_size ? std::string("--tensor_parallel_size")
                                                     : "tensor_parallel.autotp_size (" + o.deepspeed_config.string() + ")";
  CUTRAIN_CHECK(tp >= 1, "train: ", tp_flag, ": expected a tensor-parallel degree >= 1, found ", tp);
  // The GPU engine's tensor-parallel ranks are processes on their own GPUs over NCCL (train/engine_tp.cpp).
  CUTRAIN_CHECK(tp == 1 || !on_gpu || env.world_size >= tp, "train: ", tp_flag, " ", tp,
                " with --device cuda: each tensor-parallel rank is a process on its own GPU over NCCL; expected a "
                "launch of ", tp, " ranks or a multiple (cutrain launch --num_gpus ", tp, "), found ", env.world_size,
                " (--device cpu runs the ranks over the host communicator)");
  CUTRAIN_CHECK(tp == 1 || !on_gpu || (pp == 1 && vstages <= 1), "train: ", tp_flag, " ", tp,
                " with a pipeline (--pipeline_parallel_size ", pp, ", --pipeline_stages_in_process ", vstages,
                ") on --device cuda is not built; expected data x tensor parallelism, or --device cpu");
  CUTRAIN_CHECK(o.domino == 1 || tp > 1, "train: --domino ", o.domino,
                ": Domino splits the tensor-parallel all-reduces; expected --tensor_parallel_size > 1, found ", tp);
  CUTRAIN_CHECK(tp > 1 || env.world_size % pp == 0, "train: --pipeline_parallel_size ", pp,
                " does not divide the world size ", env.world_size,
                ": expected world size = data-parallel degree x pipeline stages");
  // Ranks on the grid (parallel/rank_grid.h): rank = (stage x dp + replica) x tp + t; with tp 1
  // DeepSpeed's pipeline grid, rank = stage x dp + replica (train/cpu_pipeline.h).
  const parallel::RankGrid grid = parallel::make_rank_grid(env.world_size, pp, tp, "--pipeline_parallel_size", tp_flag);
  const int dp_world = grid.dp, dp_rank = grid.coord(env.rank).replica;
  CUTRAIN_CHECK(!bert || (pp == 1 && tp == 1), "train: --model bert trains on one process or data parallel: expected "
                "no pipeline or tensor parallelism, found --pipeline_parallel_size ", pp, " and ", tp_flag, " ", tp);
  cfg.resolve_batch(dp_world);
  if (o.learning_rate) cfg.optimizer.lr = *o.learning_rate;
  const LrSchedule schedule = LrSchedule::from_config(cfg);
  CUTRAIN_CHECK(!o.lr_decay_tokens || (*o.lr_decay_tokens > 0 && schedule.decays()), "train: --lr_decay_tokens ",
                o.lr_decay_tokens.value_or(0), ": expected a positive token count with scheduler.type WarmupDecayLR or "
                "WarmupCosineLR in ", o.deepspeed_config.string(), " (the decay it counts in tokens), found ",
                schedule.describe());
  const int accum = cfg.accumulation();
  const PrecisionPlan plan = plan_from_config(cfg);
  if (resume && !resume->legacy) {
    const std::string ck_layout = resume->manifest.config.value("precision_layout", std::string());
    CUTRAIN_CHECK(ck_layout.empty() || ck_layout == plan.name(), "train: ", o.deepspeed_config.string(),
                  " gives the precision layout ", plan.name(), ", the checkpoint (", resume->folder.string(),
                  "/config.json) has ", ck_layout);
    check_checkpoint_optimizer(resume->manifest.config, cfg.optimizer.type,
                               (resume->folder / kCheckpointConfigFile).string());
  }

  BackendOptions bo;
  int vocab = o.vocab_size;
  if (o.use_real_data && vocab < kGpt2Vocab) {
    // The BF16 example sizes the model by the tokenizer's vocabulary with real data.
    out << "[Rank 0] --use_real_data: vocab_size " << vocab << " -> " << kGpt2Vocab << " (the GPT-2 tokenizer's)\n";
    vocab = kGpt2Vocab;
  }
  bo.dims = bert ? bert_setup->dims
                 : model::ModelDims{o.hidden_dim, o.num_layers, o.num_heads, vocab, o.max_seq_len ? o.max_seq_len : o.seq_length};
  bo.dims.arch = o.model;
  // GPT-2 pads its vocabulary to a multiple of 128 as llm.c does (50257 -> 50304) unless told.
  if (gpt2 && !o.shape_given.pad_vocab && o.pad_vocab == 0) o.pad_vocab = 128;
  if (llmc) {
    bo.dims.padded_vocab = llmc->padded_vocab > llmc->vocab ? llmc->padded_vocab : 0;
    CUTRAIN_CHECK(vocab == llmc->vocab, "train: the data's vocabulary (", vocab, ") is not the llm.c checkpoint ",
                  o.init_from_llmc.string(), "'s vocab_size ", llmc->vocab);
  } else if (o.pad_vocab > 0) {
    bo.dims.padded_vocab = int(data::padded_vocab_size(vocab, o.pad_vocab));
    out << "[Rank 0] --pad_vocab " << o.pad_vocab << ": " << vocab << " -> " << bo.dims.padded_vocab
        << " rows in the embedding and output projection (padded logits get no loss and no gradient)\n";
  }
  bo.causal = causal;
  bo.batch = o.batch_size;
  bo.seq = o.seq_length;
  bo.seed = o.seed;
  bo.activation_checkpointing = o.activation_checkpointing;
  bo.recompute_gelu = o.recompute_gelu;
  if (bert) bo.max_predictions = bert_setup->max_predictions;  // the masked-LM head's rows (GPU)
  CUTRAIN_CHECK(!o.recompute_gelu || gpt2, "train: --recompute_gelu applies to --model gpt2, found --model ",
                name(o.model));
  // The attention backward: --attention_backward, else the config's cutrain.attention_backward.
  const AttentionBackward attention_backward = o.attention_backward.value_or(cfg.attention_backward);
  bo.deterministic_attention = attention_backward == AttentionBackward::Deterministic;
  if (!bo.deterministic_attention) {
    const std::string from = o.attention_backward
                                 ? std::string("--attention_backward ") + name(attention_backward)
                                 : o.deepspeed_config.string() + ": cutrain.attention_backward \"" +
                                       name(attention_backward) + "\"";
    out << "[Rank 0] Attention backward: fast (" << from << "): ";
    if (!on_gpu)
      out << "applies to --device cuda; the CPU reference's backward is deterministic\n";
    else if (const int hd = bo.dims.head_dim();
             (hd == 64 || hd == 128) &&
             !kernels::attention_backward_adds_dq(kernels::AttentionShape{bo.batch, bo.seq, bo.dims.heads, hd, bo.causal}))
      out << "head dim " << hd << " at sequence length " << bo.seq << " runs the deterministic algorithm either way\n";
    else
      out << "dQ by order-dependent fp32 reduce-adds, not bit-reproducible run to run\n";
  }
  bo.cuda_graph = o.cuda_graph;
  bo.pipeline_stages = pp;
  bo.partition_method = o.partition_method;
  bo.tensor_parallel = tp;
  bo.tensor_parallel_flag = tp_flag;
  bo.domino = o.domino;
  bo.pipeline_engine = on_gpu && (o.pipeline_parallel_given || cfg.pipeline_given || vstages > 1);
  bo.stages_in_process = vstages;
  bo.pipeline_over_ranks = on_gpu && pp > 1;
  bo.activation_checkpoint_interval = on_gpu ? 0 : ckpt_interval;
  bo.tensor_parallel_engine = on_gpu && (o.tensor_parallel_size.has_value() || cfg.autotp_size.has_value());
  if (vstages > 1 && accum == 1)
    out << "[Rank 0] warning: " << vstages << " pipeline stages in this process with gradient_accumulation_steps 1: "
        << "one micro-batch per step, so the stages run one after another\n";
  if (pp > 1 && accum == 1)
    out << "[Rank 0] warning: a pipeline of " << pp << " stages with gradient_accumulation_steps 1: one micro-batch "
        << "per step, so no stage overlaps another (bubble fraction " << pp - 1 << "/" << pp << ")\n";
  // A resume that gives only --moe_expert_parallel_size takes the checkpoint's MoE blocks at that
  // ep_size (a checkpoint holds every expert whole, whatever ep_size saved it).
  MoeOptions moe_flags = o.moe;
  if (resume && !resume->legacy && moe_flags.num_experts.empty() && moe_flags.given.size() == 1 &&
      moe_flags.given[0] == "--moe_expert_parallel_size")
    moe_flags.given.clear();
  bo.dims.moe = resolve_moe(moe_flags, bo.dims.layers, o.batch_size * o.seq_length);
  if (resume && !resume->legacy) {  // no MoE flag: the checkpoint's MoE blocks, else they must agree
    if (moe_flags.num_experts.empty() && moe_flags.given.empty()) bo.dims.moe = resume_dims.moe;
    check_checkpoint_moe(bo.dims.moe, resume_dims.moe, (resume->folder / kCheckpointConfigFile).string());
  }
  CUTRAIN_CHECK(!bert || !bo.dims.moe.any(), "train: --num_experts with --model bert: BERT's MoE blocks are not built");
  CUTRAIN_CHECK(o.moe.expert_parallel_size == 1 || bo.dims.moe.any(), "train: --moe_expert_parallel_size ",
                o.moe.expert_parallel_size, ": the model has no MoE block (expected --num_experts or a MoE checkpoint)");
  bo.expert_parallel = bo.dims.moe.any() ? o.moe.expert_parallel_size : 1;
  if (bo.dims.moe.any()) bo.dims.moe.ep_size = bo.expert_parallel;  // a resume's checkpoint says what it was run at
  // The GPU engine takes the expert-parallel path (the token all-to-all over NCCL) whenever the flag
  // is given, ep_size 1 included (a one-rank group: the single GPU runs the exchange's code).
  bo.moe_exchange = o.device == TrainDevice::Cuda && bo.dims.moe.any() &&
                    std::find(o.moe.given.begin(), o.moe.given.end(), "--moe_expert_parallel_size") != o.moe.given.end();
  if (bo.dims.moe.any()) {
    CUTRAIN_CHECK(tp == 1, "train: --num_experts with ", tp_flag, " ", tp,
                  ": tensor parallelism of MoE blocks is not built; MoE trains on one process, data parallel or expert parallel");
    CUTRAIN_CHECK(pp == 1, "train: --num_experts with --pipeline_parallel_size ", pp,
                  ": a pipeline of MoE blocks is not built (the stages would have to carry the aux loss); "
                  "MoE trains on one process, data parallel or expert parallel");
    CUTRAIN_CHECK(!llmc && o.init_from_hf.empty() && o.save_llmc.empty() && o.save_hf.empty(),
                  "train: llm.c's and Hugging Face's GPT-2 files hold dense MLPs: --init_from_llmc, --init_from_hf, ",
                  "--save_llmc and --save_hf take a model without --num_experts");
    out << "[Rank 0] " << describe_moe(bo.dims.moe) << "\n";
  }
  if (bo.expert_parallel > 1)  // ep_size divides the data-parallel world (each block's experts: resolve_moe)
    parallel::make_expert_parallel_groups(dp_world, bo.expert_parallel, "--moe_expert_parallel_size");
  bo.dims.validate();
  if (resume && !resume->legacy)
    check_checkpoint_shape(bo.dims, resume_dims, (resume->folder / kCheckpointConfigFile).string());
  // Mixture-of-Students: the teacher read and checked before any step (train/mos_options.h). The
  // backend takes the only pointer to it, so freeing it at --stop_kd_step gives its memory back.
  std::shared_ptr<Teacher> teacher;
  std::size_t teacher_params = 0;
  if (o.mos.active()) {
    const char* mos_flag = o.mos.mos ? "--mos" : "--kd";
    CUTRAIN_CHECK(tp == 1 && pp == 1, "train: ", mos_flag, " with ", tp_flag, " ", tp, " and --pipeline_parallel_size ",
                  pp, ": the teacher runs beside a whole student (one process or data parallel); with tensor or "
                  "pipeline parallelism it is not built");
    teacher = std::make_shared<Teacher>(load_teacher(o.mos, bo.dims, o.seq_length));
    teacher_params = model::TransformerParams(teacher->dims).num_params();
    out << "[Rank 0] " << (o.mos.mos ? "Mixture-of-Students" : "Knowledge distillation") << ": "
        << describe_teacher(*teacher) << "\n";
    out << "[Rank 0] " << (o.mos.mos ? "Mixture-of-Students" : "Knowledge distillation") << ": "
        << describe_distillation(o.mos, bo.dims.moe.loss_coeff, bo.dims.moe.any()) << "\n";
    bo.teacher = teacher;
    bo.distill = o.mos;
  }

  const RandomLtdConfig& ltd = cfg.data_efficiency.random_ltd;
  const bool ltd_on = cfg.data_efficiency.random_ltd_active();
  CUTRAIN_CHECK(!bert || (!ltd_on && !cfg.data_efficiency.curriculum_active()), "train: ", o.deepspeed_config.string(),
                ": data_efficiency with --model bert: random-LTD and the curriculum are built for the GPT-style "
                "windows, not for masked-LM samples; expected them off");
  {
    RandomLtdRun run{bo.dims.layers, o.seq_length, causal, {}, pp, tp};
    for (int l = 0; l < bo.dims.layers; ++l)
      if (bo.dims.moe.is_moe(l)) run.moe_layers.push_back(l);
    check_random_ltd(cfg, run);
    if (ltd_on) out << "[Rank 0] " << describe_random_ltd(ltd, o.seq_length) << "\n";
  }
  // The sequence-length curriculum (seqlen_truncate / seqlen_reshape, or the legacy block): each
  // step's micro-batches rebuilt at its length (train/seqlen_curriculum.h), the backends' buffers
  // sized once for the largest.
  std::optional<SeqlenCurriculum> seqlen;
  if (!bert) seqlen = make_seqlen_curriculum(cfg, o.deepspeed_config.string(), o.batch_size, o.seq_length);
  if (bert && cfg.curriculum_learning.enabled)
    CUTRAIN_FAIL("train: ", o.deepspeed_config.string(), ": curriculum_learning.enabled: true with --model bert: the "
                 "sequence-length warm-up is built for the GPT-style windows, not for masked-LM samples; expected false");
  if (seqlen) {
    const std::string what = o.deepspeed_config.string() + ": the sequence-length curriculum (" + name(seqlen->metric()) + ")";
    CUTRAIN_CHECK(pp == 1 && tp == 1, "train: ", what, " with --pipeline_parallel_size ", pp, " and ", tp_flag, " ", tp,
                  ": the pipeline's and tensor-parallel plans are per B x S; expected neither");
    CUTRAIN_CHECK(!bo.dims.moe.any(), "train: ", what, " with --num_experts: MoE blocks keep the run's B x S; "
                  "expected a dense model");
    CUTRAIN_CHECK(!o.mos.active(), "train: ", what, " with --mos: the teacher's forward is built for the run's B x S; "
                  "expected one of them");
    bo.max_tokens = seqlen->max_tokens();
    out << "[Rank 0] " << seqlen->describe() << "\n";
  }
  if (!o.use_real_data && cfg.data_efficiency.curriculum_active())
    for (const auto& m : cfg.data_efficiency.metrics)
      CUTRAIN_CHECK(m.metric != CurriculumMetric::VocabularyRarity, "train: ", o.deepspeed_config.string(),
                    ": the vocabularyrarity curriculum draws token shards by its index: expected --use_real_data "
                    "--data PATTERN, found random data");
  // The order of the shards' batches: --data_order, else the config's cutrain.data_order.
  const data::DataOrder order = o.data_order.value_or(cfg.data_order);
  const bool llmc_order = o.use_real_data && order == data::DataOrder::Llmc;
  const std::string order_from = o.data_order ? std::string("--data_order ") + name(order)
                                              : o.deepspeed_config.string() + ": cutrain.data_order \"" + name(order) + "\"";
  CUTRAIN_CHECK(!o.data_order || o.use_real_data, "train: ", order_from,
                ": the data order orders the token shards' batches: expected --use_real_data with it, found random data");
  CUTRAIN_CHECK(!llmc_order || !bert, "train: ", order_from, ": llm.c's order reads GPT-style runs of B x T + 1 tokens; "
                "--model bert's masked-LM samples have their own order: expected shuffled");
  CUTRAIN_CHECK(!llmc_order || next_token, "train: ", order_from, ": llm.c's batches take the following token as the "
                "label: expected next-token labels, found --labels identity");
  std::unique_ptr<data::BatchSampler> sampler, eval_sampler;
  std::optional<CurriculumSetup> curriculum;
  int eval_batches = 0;
  // BERT: masked-LM samples from the shards, or synthetic ones (data/mlm_sampler.h). Rows padded to
  // S: both backends take a fixed [B, S] (the GPU engine's CUDA graph has one shape).
  std::unique_ptr<data::MlmSampler> mlm, eval_mlm;
  if (bert) {
    data::MlmOptions mo;
    if (o.use_real_data) mo.patterns = o.data;
    mo.batch_size = o.batch_size;
    mo.seq_len = o.seq_length;
    mo.seed = o.seed;
    mo.rule = data::MlmRule{bert_setup->max_predictions, kBertMaskId, kBertPadId, kBertEot};
    mo.vocab_size = kGpt2Vocab;
    mo.eot = kBertEot;
    mlm = std::make_unique<data::MlmSampler>(mo);
    if (o.use_real_data)
      out << "[Rank 0] Dataset loaded: " << mlm->num_tokens() << " tokens, " << mlm->num_documents() << " documents, "
          << mlm->num_samples() << " masked-LM samples of at most " << o.seq_length << " tokens\n";
    else
      out << "[Rank 0] Synthetic masked-LM samples: random real tokens, lengths uniform in [" << std::max(1, o.seq_length / 2)
          << ", " << o.seq_length << "]\n";
    if (!o.eval_data.empty()) {
      mo.patterns = o.eval_data;
      mo.shuffle = false;  // the same samples and masks every evaluation
      eval_mlm = std::make_unique<data::MlmSampler>(mo);
      eval_batches = int(std::min<std::int64_t>(o.eval_steps, eval_mlm->num_samples() / o.batch_size));
      out << "[Rank 0] Validation data: " << eval_mlm->num_tokens() << " tokens, " << eval_mlm->num_samples()
          << " masked-LM samples, " << eval_batches << " batches per evaluation\n";
    }
  }
  if (o.use_real_data && !bert) {
    data::SamplerOptions so;
    so.patterns = o.data;
    so.batch_size = o.batch_size;
    so.seq_len = o.seq_length;
    so.seed = o.seed;
    // Each rank trains on its own batches of the same shuffled epoch. (Random data stays the same
    // on every rank, so a W-rank run reproduces the single-process losses: a correctness check.)
    so.rank = dp_rank;
    so.world_size = dp_world;
    so.labels = next_token ? data::Labels::kNextToken : data::Labels::kIdentity;
    so.vocab_size = kGpt2Vocab;
    so.order = order;
    curriculum = make_curriculum(cfg, o.deepspeed_config, o.data, o.seq_length, o.seq_length + (next_token ? 1 : 0), accum);
    CUTRAIN_CHECK(!curriculum || !llmc_order, "train: ", order_from, " and the config's curriculum are two orders of "
                  "the batches: expected one of them, found both");
    if (curriculum) {
      so.curriculum = curriculum->draw;
      out << "[Rank 0] " << curriculum->describe << "\n";
    }
    sampler = std::make_unique<data::BatchSampler>(so);
    so.curriculum = nullptr;  // validation draws its fixed first windows
    out << "[Rank 0] Dataset loaded: " << sampler->num_tokens() << " tokens, " << sampler->batches_per_epoch()
        << " batches per epoch, vocab_size=" << kGpt2Vocab << "\n";
    if (llmc_order)
      out << "[Rank 0] Data order: llm.c's DataLoader (" << order_from << "): shard order and each shard's samples "
          << "permuted by MT19937 seeded " << o.seed << " + rank, runs of B x T + 1 tokens; validation in file order\n";
    if (!o.eval_data.empty()) {
      so.patterns = o.eval_data;
      so.rank = 0;  // every rank evaluates the same batches (the parameters are the same)
      so.world_size = 1;
      so.shuffle = false;  // the same first windows every evaluation: one curve, comparable points
      eval_sampler = std::make_unique<data::BatchSampler>(so);
      // llm.c's validation loader wraps around to its first batch after the last one: --eval_steps
      // batches whatever the data holds, as its -m.
      eval_batches = llmc_order ? o.eval_steps : int(std::min<std::int64_t>(o.eval_steps, eval_sampler->batches_per_epoch()));
      out << "[Rank 0] Validation data: " << eval_sampler->num_tokens() << " tokens, " << eval_batches
          << " batches per evaluation";
      if (eval_batches < o.eval_steps) out << " (--eval_steps " << o.eval_steps << " is more than the data holds)";
      out << "\n";
    }
  }
  if (bert)
    out << "[Rank 0] Objective: masked LM (15% of each sample's real tokens, at most " << bert_setup->max_predictions
        << ": 80% [MASK], 10% a random token, 10% kept), " << (o.use_real_data ? "token shards" : "synthetic samples")
        << ", rows padded with [PAD] to " << o.seq_length << ", bidirectional attention\n";
  else
  out << "[Rank 0] Objective: " << (o.use_real_data ? (next_token ? "next-token labels" : "labels = input ids")
                                                     : "random tokens and labels")
      << ", " << (causal ? "causal" : "bidirectional") << " attention\n";
  // Before the engine allocates: measures the device's peaks when --timing_report is on.
  StepProfiler prof(profiling, model::TransformerParams(bo.dims), bo.batch, bo.seq, accum, bo.causal, o.device == TrainDevice::Cuda);
  out << "[Rank 0] Creating " << (gpt2 ? "GPT-2 (pre-LN, tied head, tanh GELU)" : bert ? "BERT (masked-LM head tied to the word embedding)" : "model") << " with hidden_dim=" << o.hidden_dim << ", num_layers=" << o.num_layers
      << ", num_heads=" << o.num_heads << ", vocab_size=" << vocab << "\n";
  std::unique_ptr<TrainBackend> be =
      o.device == TrainDevice::Cpu ? make_cpu_backend(bo, cfg) : make_gpu_backend(bo, cfg);
  bo.teacher.reset();  // the backend holds the teacher now
  teacher.reset();
  if (llmc) {
    init_from_llmc(*be, o.init_from_llmc);
    out << "[Rank 0] Initialized from llm.c checkpoint " << o.init_from_llmc.string() << " ("
        << (llmc->version == model::kLlmcVersionBf16 ? "bf16" : "fp32") << ", " << llmc->layers << " layers, "
        << llmc->channels << " channels, " << llmc->heads << " heads, vocab " << llmc->vocab << " padded to "
        << llmc->padded_vocab << ", " << llmc->max_seq << " positions)\n";
  }
  if (!o.init_from_hf.empty()) {
    init_from_hf(*be, o.init_from_hf);
    out << "[Rank 0] Initialized from Hugging Face GPT-2 safetensors " << o.init_from_hf.string() << "\n";
  }
  const std::size_t nparams = be->table().num_params();
  out << "[Rank 0] Model parameters: " << with_commas(nparams) << " total, " << with_commas(nparams) << " trainable\n";
  if (o.activation_checkpointing) out << "[Rank 0] Activation checkpointing enabled\n";
  out << "[Rank 0] cutrain initialized with config: " << o.deepspeed_config.string() << " (" << be->describe()
      << ", layout " << plan.label() << ", " << plan.bytes_per_param() << " bytes/param"
      << (o.device != TrainDevice::Cuda ? ""
          : cfg.bf16.stochastic_rounding   ? ", stochastic rounding"
          : plan.has_master                ? ""
                                           : ", round-to-nearest")
      << ", accumulation " << accum << ")\n";

  int first_step = 0;
  std::mt19937_64 data_rng(o.seed);
  if (resume) {
    const auto tl = std::chrono::steady_clock::now();
    CheckpointMeta meta = load_checkpoint(*resume, *be);
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - tl).count();
    first_step = meta.step;
    std::istringstream(meta.data_rng) >> data_rng;
    for (const auto& n : meta.notes) out << "[Rank 0] checkpoint " << n << "\n";
    out << "[Rank 0] Resumed from " << resume->folder.string() << " at step " << first_step << "\n";
    // fp16 (the precision layout check above: the checkpoint is an fp16 run's too).
    if (const std::optional<LossScalerState> now = be->loss_scaler_state()) {
      if (!meta.loss_scaler)
        out << "[Rank 0] checkpoint has no fp16 loss scaler state (written before checkpoints kept it): the loss "
            << "scale starts at " << format_loss_scale(now->scale) << "\n";
      else if (be->restore_loss_scaler(*meta.loss_scaler))
        out << "[Rank 0] fp16 loss scale resumed at " << format_loss_scale(be->loss_scaler_state()->scale)
            << " (the checkpoint's dynamic scaler: iteration " << meta.loss_scaler->iter << ", last overflow "
            << meta.loss_scaler->last_overflow_iter << ")\n";
      else
        out << "[Rank 0] fp16.loss_scale " << format_loss_scale(now->scale)
            << " is static: the checkpoint's loss scaler state is not used\n";
    }
    if (o.mos.reset_iteration) {  // Megatron-DeepSpeed's --reset-iteration: the weights and optimizer state, step 0
      out << "[Rank 0] --reset_iteration: the step count starts again at 0 (the checkpoint's weights and optimizer "
          << "state kept)\n";
      first_step = 0;
    }
    if (!resume->legacy) {
      std::uint64_t bytes = 0;
      for (const auto& f : resume->manifest.files) bytes += f.bytes;
      out << "[Rank 0] checkpoint: " << format_gb(std::int64_t(bytes)) << " read in " << fixed(verify_s + load_s, 3)
          << " s (" << fixed(double(bytes) / (verify_s + load_s) / double(1u << 30), 2) << " GB/sec: the manifest "
          << fixed(verify_s, 3) << " s, the files with their checksums into the model " << fixed(load_s, 3) << " s)\n";
    }
  }
  // Checkpoints (--save): the writer snapshots the state at the step boundary (under ZeRO every
  // rank joins its gather) and rank 0 writes it, in the background unless --save_mode sync.
  std::optional<CheckpointWriter> writer;
  TrainResult res;
  if (!o.save_dir.empty()) {
    bool async = o.save_mode != SaveMode::Sync;
    if (o.save_mode == SaveMode::Auto) {
      const std::uint64_t need = snapshot_bytes_estimate(be->table().flat_size(), plan, o.device);
      const std::uint64_t avail = host_memory_available();
      if (avail > 0 && need > avail / 2) {
        async = false;
        out << "[Rank 0] checkpoint: --save_mode auto: the state's snapshot (" << format_gb(std::int64_t(need))
            << ") is more than half the host's available memory (" << format_gb(std::int64_t(avail))
            << "): saves are synchronous (--save_mode async to insist)\n";
      }
    }
    aio::HandleOptions handle;  // the config's aio block (DeepSpeed's key names) drives checkpoint I/O too
    handle.block_size = std::size_t(cfg.aio.block_size);
    handle.queue_depth = cfg.aio.queue_depth;
    handle.intra_op_parallelism = cfg.aio.intra_op_parallelism;
    handle.single_submit = cfg.aio.single_submit;
    handle.overlap_events = cfg.aio.overlap_events;
    writer.emplace(CheckpointWriterOptions{o.save_dir, CheckpointIo::Auto, o.keep_last.value_or(0), async,
                                           /*write_files=*/env.rank == 0, handle});
    res.saves.async = async;
    if (async) {
      // The pinned snapshot storage now, before the first step: a host that cannot hold it fails
      // here, and the first save does not stop training to allocate it.
      const auto tp = std::chrono::steady_clock::now();
      writer->prepare(*be);
      out << "[Rank 0] checkpoint: saves in the background from a " << format_gb(std::int64_t(writer->snapshot_bytes()))
          << " snapshot in " << (writer->snapshot_pinned() ? "pinned" : "plain") << " host memory (allocated in "
          << fixed(std::chrono::duration<double>(std::chrono::steady_clock::now() - tp).count(), 3) << " s)\n";
    }
  }
  // The saves that finished since the last look: their lines, the run's save figures.
  std::optional<SaveOutcome> last_saved;  // the newest outcome reported
  auto report_saves = [&] {
    for (SaveOutcome& s : writer->take_finished()) {
      SaveStats& t = res.saves;
      ++t.saves;
      t.snapshot_s += s.snapshot_s;
      t.wait_s += s.wait_s;
      t.write_s += s.write_s;
      if (s.ok) {
        t.bytes += s.report.bytes;
        for (const auto& n : s.report.notes) out << "[Rank 0] checkpoint: " << n << "\n";
        out << "[Rank 0] Checkpoint saved to: " << (o.save_dir / step_tag(s.step)).string() << " (step " << s.step
            << ")\n";
        out << "[Rank 0] checkpoint: " << format_gb(std::int64_t(s.report.bytes)) << " written in " << fixed(s.write_s, 3)
            << " s (" << fixed(s.write_s > 0 ? double(s.report.bytes) / s.write_s / double(1u << 30) : 0.0, 2) << " GB/sec"
            << (s.background ? ", in the background" : "") << "), snapshot " << fixed(s.snapshot_s, 3) << " s";
        if (s.wait_s >= 0.001) out << ", waited " << fixed(s.wait_s, 3) << " s for the previous write";
        out << "\n";
      } else {
        t.failed_steps.push_back(s.step);
        std::optional<std::string> latest;
        try {
          latest = read_latest(o.save_dir);
        } catch (const Error&) {
        }
        out << "[Rank 0] error: the checkpoint of step " << s.step << " was not saved: " << s.error
            << "; no step folder of it was left, the last complete checkpoint is "
            << (latest ? (o.save_dir / *latest).string() : std::string("none")) << "; training goes on\n";
      }
      last_saved = std::move(s);
    }
  };
  // A checkpoint of `done` steps.
  auto save = [&](int done) {
    std::ostringstream rng_text;
    rng_text << data_rng;
    CheckpointMeta meta{done, rng_text.str(), plan.name(), causal, {}, name(cfg.optimizer.type)};
    meta.loss_scaler = be->loss_scaler_state();  // fp16: the dynamic scaler continues on --resume
    writer->save(*be, meta);
    report_saves();  // sync: this save's lines now
  };
  be->reset_peak();
  const MemoryStats init_mem = be->memory();
  out << "[Rank 0] Memory after init: allocated=" << format_gb(init_mem.allocated)
      << ", reserved=" << format_gb(init_mem.reserved) << "\n";

  const std::size_t per_step = std::size_t(accum) * o.batch_size * o.seq_length;
  std::vector<std::int32_t> tokens(per_step), labels(per_step);
  const std::size_t per_micro = std::size_t(o.batch_size) * o.seq_length;
  // Real data: micro-batch number step*accum + a, a pure function of the step, so resume continues
  // the stream. A background thread (DataLoader) reads the next one into the other of two host
  // slots, pinned on the GPU path, while this one trains.
  // The slots are declared first so the loader (and its thread, which writes them) goes first.
  std::vector<Buffer> pinned_slots;
  std::vector<std::vector<std::int32_t>> host_slots;
  std::unique_ptr<data::DataLoader> loader;
  if (sampler && !o.fixed_batch) {
    std::int32_t* slot[4];
    pinned_slots.reserve(4);
    host_slots.reserve(4);
    for (auto& p : slot) {
      if (o.device == TrainDevice::Cuda) {
        pinned_slots.emplace_back(pinned_allocator(), per_micro * sizeof(std::int32_t));
        p = pinned_slots.back().as<std::int32_t>();
      } else {
        p = host_slots.emplace_back(per_micro).data();
      }
    }
    loader = std::make_unique<data::DataLoader>(sampler->options(), data::HostBatchBuffers{{slot[0], slot[1]}, {slot[2], slot[3]}},
                                                std::int64_t(first_step) * accum);
  }
  auto draw_real = [&](int step) {
    for (int a = 0; a < accum; ++a) {
      const std::int64_t want = std::int64_t(step) * accum + a;
      std::int32_t* t = tokens.data() + a * per_micro;
      std::int32_t* l = labels.data() + a * per_micro;
      if (!loader) {
        sampler->fill(want, t, l);
        continue;
      }
      const data::Batch b = loader->next();
      CUTRAIN_CHECK(b.step == want, "train: data loader handed out batch ", b.step, ", expected ", want);
      std::copy(b.inputs, b.inputs + per_micro, t);
      std::copy(b.targets, b.targets + per_micro, l);
    }
  };
  // Random data on the CPU backend with several ranks is dealt by rank: every rank draws the global
  // batch (world x accumulation micro-batches, the single process's at the same train_batch_size)
  // and keeps micro-batches [rank x accumulation, (rank + 1) x accumulation). On GPUs every rank
  // draws the same batch (docs/distributed.md).
  const bool deal_random = o.device == TrainDevice::Cpu && dp_world > 1;
  auto draw = [&] {
    // Random input ids and random labels in [0, vocab), like the BF16 example.
    std::uniform_int_distribution<std::int32_t> d(0, vocab - 1);
    if (!deal_random) {
      for (auto& t : tokens) t = d(data_rng);
      for (auto& l : labels) l = d(data_rng);
      return;
    }
    const std::size_t first = std::size_t(dp_rank) * per_step, total = std::size_t(dp_world) * per_step;
    for (std::vector<std::int32_t>* v : {&tokens, &labels})
      for (std::size_t i = 0; i < total; ++i) {
        const std::int32_t x = d(data_rng);
        if (i >= first && i < first + per_step) (*v)[i - first] = x;
      }
  };
  // BERT: micro-batch a of this rank at `step` is number (step x world + rank) x accumulation + a of
  // the masked-LM stream: a pure function of the step (resume), the global batch dealt by rank.
  // The step's longest sample: --pad_to_longest cuts the step's micro-batches down to it.
  int mlm_longest = o.seq_length;
  auto draw_mlm = [&](int step) {
    mlm_longest = 0;
    for (int a = 0; a < accum; ++a)
      mlm_longest = std::max(mlm_longest, mlm->fill((std::int64_t(step) * dp_world + dp_rank) * accum + a,
                                                    tokens.data() + a * per_micro, labels.data() + a * per_micro)
                                              .longest);
  };
  if (o.fixed_batch) mlm ? draw_mlm(first_step) : sampler ? draw_real(first_step) : draw();

  // Validation: the mean of the first eval_batches batches' mean losses (every batch has B*S
  // targets, so this is the mean over all targets), and its exponential.
  std::vector<std::int32_t> eval_tokens(per_micro), eval_labels(per_micro);
  auto evaluate = [&](int after_step) {
    EvalPoint e;
    e.after_step = after_step;
    e.batches = eval_batches;
    const auto t_eval = std::chrono::steady_clock::now();
    for (int b = 0; b < eval_batches; ++b) {
      if (eval_mlm) eval_mlm->fill(b, eval_tokens.data(), eval_labels.data());
      else eval_sampler->fill(b, eval_tokens.data(), eval_labels.data());
      e.loss += be->eval_loss(eval_tokens.data(), eval_labels.data()) / eval_batches;
    }
    e.perplexity = std::exp(e.loss);
    e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_eval).count();
    out << "[Rank 0] Eval " << (after_step < first_step ? "before training" : "after step " + std::to_string(after_step))
        << ": val_loss=" << fixed(e.loss, 4) << ", val_ppl=" << fixed(e.perplexity, 2) << " (" << eval_batches
        << " batches of " << o.batch_size << " x " << o.seq_length << ")\n";
    return e;
  };
  const bool evaluating = eval_sampler || eval_mlm;
  if (evaluating) res.evals.push_back(evaluate(first_step - 1));
  // The loop's wall clock from its first step (the metrics' elapsed_s): steps, data draws,
  // evaluations, logging and saves alike; what a data-efficiency comparison reads beside the
  // steps' own time.
  const auto loop_start = std::chrono::steady_clock::now();

  res.params = nparams;
  // random-LTD's consumed layer tokens (the global batch's): the steps before a resume from the
  // schedule (a pure function of the step, what those steps processed), then each step's figure.
  // Under a sequence-length curriculum each step counts its own rows x L (the kept count applies to L).
  const std::int64_t global_seqs = std::int64_t(accum) * o.batch_size * dp_world;
  std::int64_t consumed_layer_tokens = 0;
  if (ltd_on)
    for (int s = 0; s < first_step; ++s) {
      const SeqShape sh = seqlen ? seqlen->shape(seqlen->seqlen(s)) : SeqShape{o.batch_size, o.seq_length};
      consumed_layer_tokens +=
          random_ltd_layer_tokens(ltd, s, std::int64_t(accum) * sh.rows * dp_world, bo.dims.layers, sh.seq);
    }
  // Tokens trained before this step (global batch): a curriculum's steps count their length.
  std::int64_t consumed_tokens = seqlen ? seqlen->tokens_before(first_step, accum, dp_world)
                                        : std::int64_t(first_step) * std::int64_t(per_step) * dp_world;
  std::vector<std::int32_t> cl_tokens, cl_labels;  // the curriculum's rebuilt micro-batches
  // The step's lr: DeepSpeed's step-indexed schedule, or with --lr_decay_tokens its decay counted
  // in tokens (Megatron-DeepSpeed's token-based decay, train/lr_schedule.h).
  const int decay_start = schedule.decay_start_step();
  const std::int64_t warmup_tokens = seqlen ? seqlen->tokens_before(decay_start, accum, dp_world)
                                            : std::int64_t(decay_start) * std::int64_t(per_step) * dp_world;
  auto lr_at = [&](int step, std::int64_t tokens_before) {
    if (!o.lr_decay_tokens) return schedule.lr(step);
    return schedule.lr_by_tokens(step, tokens_before, warmup_tokens, *o.lr_decay_tokens);
  };
  double time_sum = 0;
  int timed = 0;
  const int last = first_step + o.num_steps - 1;
  bool progress_shown = false;  // a progress line (no newline) is on the terminal
  double progress_time = 0;
  prof.set_steps(first_step, last, o.warmup_steps);
  bool distilling = o.mos.active();  // until the backend reports a step without the teacher
  for (int step = first_step; step <= last; ++step) {
    if (!o.fixed_batch) mlm ? draw_mlm(step) : sampler ? draw_real(step) : draw();
    // A sequence-length curriculum: this step's length, the micro-batches rebuilt at it.
    const std::int32_t* step_tokens = tokens.data();
    const std::int32_t* step_labels = labels.data();
    int cl_seqlen = o.seq_length;
    SeqShape cl_shape{o.batch_size, o.seq_length};
    if (bert && o.pad_to_longest > 0) {
      // Issue #20: the step's [PAD]-padded micro-batches cut to its longest sample, rounded up to
      // the bucket (one CUDA graph per length; the loss is over the labelled rows, all kept).
      cl_seqlen = bert_padded_length(mlm_longest, o.pad_to_longest, bert_setup->max_predictions, o.seq_length);
      cl_shape = SeqShape{o.batch_size, cl_seqlen};
      rebuild_micro_batches(CurriculumMetric::SeqlenTruncate, o.batch_size, o.seq_length, cl_seqlen, accum,
                            tokens.data(), labels.data(), cl_tokens, cl_labels);
      be->set_seq_shape(cl_shape.rows, cl_shape.seq);
      step_tokens = cl_tokens.data();
      step_labels = cl_labels.data();
    }
    if (seqlen) {
      cl_seqlen = seqlen->seqlen(step);
      cl_shape = seqlen->shape(cl_seqlen);
      seqlen->apply(cl_seqlen, accum, tokens.data(), labels.data(), cl_tokens, cl_labels);
      be->set_seq_shape(cl_shape.rows, cl_shape.seq);
      step_tokens = cl_tokens.data();
      step_labels = cl_labels.data();
    }
    // The tokens this step trains: this rank's, and the global batch's (DeepSpeed's example's
    // consumed_train_tokens, which its token-based lr decay reads).
    const std::int64_t rank_tokens = std::int64_t(accum) * std::int64_t(cl_shape.tokens());
    const std::int64_t global_tokens = rank_tokens * dp_world;
    const float lr = lr_at(step, consumed_tokens);
    consumed_tokens += global_tokens;
    prof.begin_step(step);
    const bool writing = writer && writer->in_flight();  // a background write shares the machine
    const auto t0 = std::chrono::steady_clock::now();
    const StepStats st = [&] {
      try {
        return be->step(step_tokens, step_labels, step + 1, lr);
      } catch (const LossScaleError& e) {  // fp16: an overflow at min_loss_scale; named by this run's step
        throw LossScaleError("train: fp16 overflow at step " + std::to_string(step) + ": " + e.message(), __FILE__,
                             __LINE__);
      }
    }();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    prof.end_step(step);
    if (step - first_step >= o.warmup_steps) {
      time_sum += dt;
      ++timed;
      if (writer) {
        SaveStats& t = res.saves;
        (writing ? t.steps_in_flight : t.steps_other) += 1;
        (writing ? t.time_in_flight : t.time_other) += dt;
      }
    }
    if (writer) report_saves();  // a background save that ended: reported at this step
    const float loss = float(st.loss);
    res.losses.push_back(loss);
    if (loss_log.is_open()) loss_log.append(std::to_string(step) + "," + repr(loss) + "\n");
    const MemoryStats mem = be->memory();
    if (progress_shown) {
      out << "\r\033[K";  // the progress line gives way to the lines below
      progress_shown = false;
    }
    if (st.skipped && st.loss_scale > 0)  // fp16: an overflow; the scale the next step runs with
      out << "[fp16] overflow at step " << step << ": loss scale " << format_loss_scale(st.loss_scale) << " -> "
          << format_loss_scale(st.next_loss_scale) << ", step skipped\n";
    else if (st.skipped)
      out << "[Rank 0] warning: step " << step << ": non-finite gradient norm (" << st.grad_norm
          << "), optimizer step skipped\n";
    std::int64_t difficulty = 0;
    if (curriculum) difficulty = curriculum->draw->difficulty(step);
    const std::int64_t layer_tokens = st.layer_tokens * dp_world;  // every rank processes the same count
    consumed_layer_tokens += layer_tokens;
    if (distilling && !st.distilled) {
      out << "[Rank 0] Step " << step << ": knowledge distillation stopped (--stop_kd_step "
          << o.mos.stop_kd_step.value_or(0) << "): the teacher is freed (" << with_commas(teacher_params)
          << " parameters, its activations and the term's buffers), training goes on with the LM loss only\n";
      distilling = false;
    }
    if (step % log_interval == 0 || step == last) {
      out << "[Rank 0] Step " << step << ": loss=" << fixed(loss, 4) << ", time=" << fixed(dt, 3)
          << "s, alloc_mem=" << format_gb(mem.allocated) << ", peak_mem=" << format_gb(mem.peak);
      if (bert) out << ", samples/s=" << fixed(double(global_seqs) / dt, 1);
      if (st.loss_scale > 0) out << ", loss_scale=" << format_loss_scale(st.loss_scale);
      if (bert && o.pad_to_longest > 0) out << ", padded to " << cl_seqlen << " of " << o.seq_length;
      out << "\n";
      if (st.distilled)
        out << "[Rank 0] Step " << step << ": distillation ce_loss=" << fixed(st.ce_loss, 4)
            << ", kd_loss=" << fixed(st.kd_loss, 4) << " (kd_beta_ce * T^2 * KL)\n";
      for (const model::MoeBlockStats& m : st.moe)
        out << "[Rank 0] Step " << step << ": moe block " << m.layer << " l_aux=" << fixed(m.l_aux, 4)
            << ", dropped=" << m.dropped << ", capacity=" << m.capacity << ", expert load min=" << m.min_load
            << " max=" << m.max_load << "\n";
      if (ltd_on)
        out << "[Rank 0] Step " << step << ": random-LTD kept=" << random_ltd_kept_at(ltd, step, cl_shape.seq)
            << " of " << cl_shape.seq << " tokens in " << ltd.layer_ids.size() << " of " << bo.dims.layers
            << " blocks, layer_tokens=" << layer_tokens << ", consumed_layer_tokens=" << consumed_layer_tokens << "\n";
      if (seqlen)
        out << "[Rank 0] Step " << step << ": curriculum seqlen=" << cl_seqlen << " of " << o.seq_length << " ("
            << name(seqlen->metric()) << ": " << cl_shape.rows << " rows of " << cl_shape.seq << " per micro-batch), tokens="
            << global_tokens << ", consumed_tokens=" << consumed_tokens << ", tokens/s=" << fixed(double(rank_tokens) / dt, 0)
            << "\n";
      if (curriculum) {
        const auto [first, end] = curriculum->draw->eligible(difficulty);
        out << "[Rank 0] Step " << step << ": curriculum difficulty=" << difficulty << " ("
            << (curriculum->draw->percentile ? "percentile" : "value") << "), eligible samples=" << end - first
            << " of " << curriculum->draw->sorted.size() << "\n";
      }
    }
    const bool eval_now = evaluating && (step == last || (o.eval_interval > 0 && (step + 1) % o.eval_interval == 0));
    if (eval_now) res.evals.push_back(evaluate(step));
    if (metrics_log.is_open()) {
      nlohmann::json j = {{"step", step},
                          {"loss", loss},
                          {"lr", lr},
                          {"grad_norm", st.grad_norm},
                          {"skipped", st.skipped},
                          {"step_time_s", dt},
                          {"tokens_per_s", double(rank_tokens) / dt},
                          {"samples_per_s", double(global_seqs) / dt},
                          {"allocated_bytes", mem.allocated},
                          {"reserved_bytes", mem.reserved},
                          {"peak_bytes", mem.peak}};
      if (curriculum) j["curriculum_difficulty"] = difficulty;
      if (st.loss_scale > 0) j["loss_scale"] = st.loss_scale;  // fp16: the scale this step ran with
      if (o.mos.active()) {  // distillation's parts: ce_loss = loss; kd_loss 0 once the teacher is freed
        j["ce_loss"] = float(st.ce_loss);  // as loss: the float the loss CSV holds
        j["kd_loss"] = st.kd_loss;
        j["distilled"] = st.distilled;
      }
      if (bert && o.pad_to_longest > 0) j["padded_seqlen"] = cl_seqlen;
      if (seqlen) {
        j["curriculum_seqlen"] = cl_seqlen;
        j["curriculum_rows"] = cl_shape.rows;
        j["tokens"] = global_tokens;
        j["consumed_tokens"] = consumed_tokens;
      }
      if (ltd_on) {
        j["random_ltd_kept"] = random_ltd_kept_at(ltd, step, cl_shape.seq);
        j["layer_tokens"] = layer_tokens;
        j["consumed_layer_tokens"] = consumed_layer_tokens;
      }
      if (!st.moe.empty()) {
        nlohmann::json layers = nlohmann::json::array();
        for (const model::MoeBlockStats& m : st.moe)
          layers.push_back({{"layer", m.layer}, {"l_aux", m.l_aux}, {"dropped", m.dropped}, {"capacity", m.capacity},
                            {"expert_load_min", m.min_load}, {"expert_load_max", m.max_load}});
        j["moe"] = layers;
      }
      if (eval_now) {
        j["val_loss"] = res.evals.back().loss;
        j["val_ppl"] = res.evals.back().perplexity;
        j["eval_time_s"] = res.evals.back().seconds;
      }
      j["elapsed_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - loop_start).count();
      metrics_log.append(j.dump() + "\n");
    }
    if (o.progress && step < last) {
      // The mean step time so far (the first step included: an estimate, not the average of
      // FINAL RESULTS) times the steps left.
      progress_time += dt;
      const int done = step - first_step + 1;
      out << "\r[step " << step + 1 << "/" << last + 1 << "] ETA " << duration_text(progress_time / done * (last - step))
          << ", " << with_commas(dt > 0 ? std::uint64_t(double(rank_tokens) / dt) : 0) << " tokens/s, mem " << format_gb(mem.allocated)
          << " (peak " << format_gb(mem.peak) << ")\033[K" << std::flush;
      progress_shown = true;
    }
    if (!o.save_dir.empty() && step != last && interval_save_due(step + 1, o.save_interval.value_or(0))) save(step + 1);
  }
  if (progress_shown) out << "\r\033[K";
  if (!o.save_llmc.empty()) {
    save_llmc(*be, o.save_llmc, /*bf16=*/true, env.rank == 0);
    out << "[Rank 0] llm.c checkpoint saved to: " << o.save_llmc.string() << " (bf16, version 5)\n";
  }
  if (!o.save_hf.empty()) {
    save_hf(*be, o.save_hf, env.rank == 0);
    out << "[Rank 0] Hugging Face GPT-2 safetensors saved to: " << o.save_hf.string() << " (F32)\n";
  }
  be->release_workspace();
  const MemoryStats fin = be->memory();
  res.avg_step_time = timed ? time_sum / timed : 0.0;
  res.peak_bytes = fin.peak;
  res.alloc_bytes = fin.allocated;

  out << "\n" << std::string(60, '=') << "\n";
  out << "[Rank 0] FINAL RESULTS\n";
  out << "  Config: " << o.deepspeed_config.string() << "\n";
  out << "  Model: hidden_dim=" << o.hidden_dim << ", num_layers=" << o.num_layers << "\n";
  out << "  Parameters: " << with_commas(nparams) << "\n";
  out << "  Batch size: " << o.batch_size << ", Seq length: " << o.seq_length << "\n";
  out << "  Average step time: " << fixed(res.avg_step_time, 3) << "s\n";
  // The same in milliseconds to 1e-4 (cutrain's line): a 7 ms step reads 0.007s above and 0.0072
  // in SUMMARY, 1.4% steps, too coarse to compare two builds by.
  out << "  Mean step time: " << fixed(1e3 * res.avg_step_time, 4) << " ms over " << timed << " timed steps\n";
  if (bert && res.avg_step_time > 0)
    out << "  Samples/s: " << fixed(double(global_seqs) / res.avg_step_time, 1) << " (" << global_seqs
        << " sequences of at most " << o.seq_length << " tokens per step)\n";
  out << "  Peak memory: " << format_gb(fin.peak) << "\n";
  out << "  Final allocated memory: " << format_gb(fin.allocated) << "\n";
  if (const std::string tps = be->run_summary(); !tps.empty()) out << "  Rank 0's " << tps << "\n";
  if (writer && res.saves.async && res.saves.steps_in_flight > 0) {
    const SaveStats& t = res.saves;
    const double in = t.time_in_flight / t.steps_in_flight;
    out << "  Steps during background checkpoint writes: " << t.steps_in_flight << ", mean " << fixed(in, 4) << "s";
    if (t.steps_other > 0) {
      const double other = t.time_other / t.steps_other;
      out << " against " << fixed(other, 4) << "s in the " << t.steps_other << " other steps ("
          << (in >= other ? "+" : "") << fixed(100.0 * (in / other - 1.0), 1) << "%)";
    }
    out << "\n";
  }

  if (!res.evals.empty())
    out << "  Validation loss: " << fixed(res.evals.front().loss, 4) << " -> " << fixed(res.evals.back().loss, 4)
        << " (perplexity " << fixed(res.evals.front().perplexity, 2) << " -> " << fixed(res.evals.back().perplexity, 2)
        << ")\n";
  out << std::string(60, '=') << "\n";
  out << "SUMMARY: config=" << o.deepspeed_config.string() << " params=" << nparams << " peak_mem_bytes=" << fin.peak
      << " alloc_mem_bytes=" << fin.allocated << " avg_step_time=" << fixed(res.avg_step_time, 4);
  if (!res.evals.empty())  // our extension: the last validation loss and perplexity
    out << " val_loss=" << fixed(res.evals.back().loss, 4) << " val_ppl=" << fixed(res.evals.back().perplexity, 2);
  out << "\n";
  if (loss_log.is_open()) out << "Loss history saved to: " << o.loss_log_file.string() << "\n";
  prof.finish(out);
  if (writer) {
    save(last + 1);
    writer->wait();
    report_saves();
    if (!res.saves.failed_steps.empty()) {
      out << "[Rank 0] checkpoint: " << res.saves.failed_steps.size() << " of " << res.saves.saves
          << " saves failed (step";
      for (int st : res.saves.failed_steps) out << " " << st;
      out << ")\n";
    }
    const bool final_ok = last_saved && last_saved->step == last + 1 && last_saved->ok;
    CUTRAIN_CHECK(env.rank != 0 || final_ok, "train: the final checkpoint (step ", last + 1, ") was not saved to ",
                  o.save_dir.string(), last_saved && !last_saved->ok ? ": " + last_saved->error : std::string());
  }
  out.flush();
  return res;
}

}  // namespace cutrain::train
