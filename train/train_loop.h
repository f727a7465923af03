// @brief The training loop of `cutrain train`: the BF16 example's train.py, line for line in its
// output (Model parameters, Memory after init, Step lines, FINAL RESULTS, SUMMARY, loss CSV), plus
// a per-step JSON metrics file. The loss CSV and the metrics file are opened before the first step
// and get each step's line when the step ends. Runs on the GPU engine or the CPU reference backend.
#pragma once

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "train/bert_options.h"
#include "train/choices.h"
#include "train/moe_options.h"
#include "train/mos_options.h"
#include "train/step_profiler.h"

namespace cutrain::train {

struct TrainOptions {
  std::filesystem::path deepspeed_config;
  int hidden_dim = 1024, num_layers = 12, num_heads = 16, vocab_size = 50000;
  int batch_size = 4, seq_length = 512;
  model::Arch model = model::Arch::Simple;  // --model (--gpt2_size / -e and --init_from_llmc set gpt2)
  int max_seq_len = 0;  // --max_seq_len: rows of the position table (0: = seq_length; GPT-2 sizes: 1024)
  // --init_from_llmc: start from llm.c's model file (it gives the model's shape and arch);
  // --save_llmc: write the trained params as llm.c's model file (bf16, version 5) at the end.
  std::filesystem::path init_from_llmc, save_llmc;
  // --init_from_hf / --save_hf: the same with Hugging Face's GPT-2 safetensors (F32); the shape
  // comes from the flags (--gpt2_size), the file is checked against it.
  std::filesystem::path init_from_hf, save_hf;
  int num_steps = 20, warmup_steps = 5;
  std::optional<float> learning_rate;  // given: overrides the config's optimizer lr
  // --lr_decay_tokens: the scheduler's decay counted in trained tokens up to this many (global
  // batch), Megatron-DeepSpeed's --lr-decay-tokens (train/lr_schedule.h: lr_by_tokens).
  std::optional<std::int64_t> lr_decay_tokens;
  // Step lines every N steps; not given: the config's steps_per_print, else 5 (train.py's default).
  std::optional<int> log_interval;
  // A progress line (step, ETA, tokens/s, memory) rewritten in place after each step: for a
  // terminal (`cutrain train` sets it when stdout is one), never for a pipe or a file.
  bool progress = false;
  bool activation_checkpointing = false;
  bool recompute_gelu = false;  // --recompute_gelu (GPT-2: llm.c's -r 1)
  // --attention_backward: the GPU attention backward (not given: the config's
  // cutrain.attention_backward, else deterministic); fast: dQ by order-dependent reduce-adds.
  std::optional<AttentionBackward> attention_backward;
  // Pipeline parallelism (--device cpu): stages, one rank each, and DeepSpeed PipelineModule's
  // partition_method (docs/distributed.md).
  int pipeline_parallel_size = 1;
  std::string partition_method = "parameters";
  // Given on the command line (else the config's pipeline.stages / pipeline.partition apply). A
  // given degree, or the config's pipeline section, makes the GPU engine run its step through the
  // pipeline's program (train/gpu_pipeline.h) at degree 1.
  bool pipeline_parallel_given = false, partition_method_given = false;
  // --device cuda: all N stages of the pipeline in this one process (virtual stages).
  int pipeline_stages_in_process = 1;
  // Tensor parallelism (--device cpu): the degree (--tensor_parallel_size; not given: the config's
  // tensor_parallel.autotp_size, else 1) and Domino's pieces per micro-batch (--domino).
  std::optional<int> tensor_parallel_size;
  int domino = 1;
  std::filesystem::path loss_log_file;
  bool use_real_data = false;
  std::vector<std::string> data;  // --data: glob patterns of llm.c token shards (with --use_real_data)
  LabelsChoice labels = LabelsChoice::Auto;           // --labels (train/choices.h)
  AttentionChoice attention = AttentionChoice::Auto;  // --attention
  int pad_vocab = 0;  // --pad_vocab: round the vocabulary's rows up to a multiple of this (0: none)
  std::vector<std::string> eval_data;  // --eval_data: validation shards (with --use_real_data)
  int eval_interval = 0;               // evaluate after every N steps (0: only before and after the run)
  int eval_steps = 20;                 // validation batches per evaluation (the first N, in file order)
  // --data_order: the order of --use_real_data's batches (not given: the config's
  // cutrain.data_order, else shuffled); llmc: llm.c's DataLoader's batches (docs/gpt2.md).
  std::optional<data::DataOrder> data_order;
  std::uint64_t seed = 42;
  std::filesystem::path metrics_file;
  std::filesystem::path save_dir, resume_dir;  // --save ROOT, --resume ROOT or ROOT/global_step<N>
  std::optional<int> save_interval;  // --save_interval N (>= 1, with --save): also save after every N steps
  std::optional<int> keep_last;      // --keep_last K (>= 1, with --save): keep the K newest step folders
  SaveMode save_mode = SaveMode::Auto;  // --save_mode (train/choices.h; train/checkpoint_writer.h)
  bool accept_legacy_checkpoint = false;  // --resume of the layout before manifests, without checksums
  // Which shape flags the run gave (the command line sets these; a library caller's values count
  // as given). With --resume the others take the checkpoint's config.json values, and a given one
  // that contradicts the checkpoint is an error.
  struct ShapeGiven {
    bool hidden_dim = true, num_layers = true, num_heads = true, vocab_size = true, seq_length = true,
         pad_vocab = true;
  } shape_given;
  TrainDevice device = TrainDevice::Cuda;  // --device
  bool cuda_graph = true;
  bool fixed_batch = false;  // reuse the first batch every step (a loss that must fall)
  ProfilingOptions profiling;  // --timing_report, --profile_steps (docs/profiling.md)
  MoeOptions moe;              // --num_experts, --moe_* (train/moe_options.h; docs/moe.md)
  MosOptions mos;              // --mos / --kd, --load_teacher, --kd_* (train/mos_options.h; docs/moe.md)
  // --model bert: --bert_config and bing_bert's flags (train/bert_options.h; docs/bert.md).
  BertFlags bert;
  // --pad_to_longest BUCKET (--model bert; 0: off): each step's micro-batches cut from S to their
  // longest sample rounded up to a multiple of BUCKET (issue #20; train/bert_options.h).
  int pad_to_longest = 0;
  // Whether --batch_size was given: BERT runs take the DeepSpeed config's
  // train_micro_batch_size_per_gpu when it was not (a library caller's value counts as given).
  bool batch_size_given = true;
};

struct EvalPoint {
  int after_step = -1;  // the last step trained before it (-1 + first step: before training)
  double loss = 0, perplexity = 0;
  int batches = 0;
  double seconds = 0;  // the evaluation's own wall-clock time
};

// The checkpoint saves of a run (--save).
struct SaveStats {
  bool async = false;
  int saves = 0;
  std::vector<int> failed_steps;  // saves whose write failed (reported at the next step)
  double snapshot_s = 0, wait_s = 0, write_s = 0;  // summed over the saves
  std::uint64_t bytes = 0;                          // written by the saves that completed
  // Timed steps (after warm-up) that ran while a background write was in flight, and the others.
  int steps_in_flight = 0, steps_other = 0;
  double time_in_flight = 0, time_other = 0;
};

struct TrainResult {
  std::vector<double> losses;
  SaveStats saves;
  std::vector<EvalPoint> evals;  // --eval_data: before training, every --eval_interval, at the end
  double avg_step_time = 0;
  std::int64_t peak_bytes = 0, alloc_bytes = 0;
  std::size_t params = 0;
};

// Runs the loop, printing to `out`. Throws cutrain::Error (config, shapes, files, CUDA).
TrainResult run_training(const TrainOptions& options, std::ostream& out);

// "1.23 GB" (1024³ bytes, two decimals) and "254,128,976", as the BF16 example prints them.
std::string format_gb(std::int64_t bytes);
std::string with_commas(std::uint64_t n);

}  // namespace cutrain::train
