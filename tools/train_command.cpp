// `cutrain train`: the BF16 example's train.py (same flags, defaults and output), on the GPU
// engine or, with --device cpu, on the CPU reference model. The program's default command.
#include <unistd.h>

#include <filesystem>
#include <iostream>

#include "runtime/comm/launch_env.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "tools/commands.h"
#include "train/precision.h"
#include "train/train_loop.h"

namespace cutrain::tools {
namespace {

struct TrainFlags {
  train::TrainOptions o;
  std::string config;
  // The string-valued flags, turned into their enums once in run_train.
  std::string device = "cuda", labels = "auto", attention = "auto", save_mode = "auto", model = "simple", gpt2_size;
  CLI::Option* model_opt = nullptr;
  CLI::Option* gpt2_size_opt = nullptr;
  float learning_rate = 1e-4f;
  std::int64_t lr_decay_tokens = 0;
  CLI::Option* lr_decay_tokens_opt = nullptr;
  int log_interval = 5;
  CLI::Option* log_interval_opt = nullptr;
  bool no_cuda_graph = false;
  bool print_layouts = false;
  CLI::Option* lr_opt = nullptr;
  CLI::Option* config_opt = nullptr;
  std::string timing_file;
  CLI::Option* timing_opt = nullptr;
  int save_interval = 0, keep_last = 0;
  CLI::Option* save_interval_opt = nullptr;
  CLI::Option* keep_last_opt = nullptr;
  std::vector<std::pair<CLI::Option*, bool train::TrainOptions::ShapeGiven::*>> shape_opts;
  int local_rank = 0;
  CLI::Option* local_rank_opt = nullptr;
  std::vector<CLI::Option*> moe_opts;
  std::vector<CLI::Option*> mos_opts;  // the distillation flags but --mos / --kd
  int num_layers_teacher = 0, hidden_size_teacher = 0, num_attention_heads_teacher = 0, stop_kd_step = 0;
  CLI::Option* num_layers_teacher_opt = nullptr;
  CLI::Option* hidden_size_teacher_opt = nullptr;
  CLI::Option* num_attention_heads_teacher_opt = nullptr;
  CLI::Option* stop_kd_step_opt = nullptr;
  std::vector<CLI::Option*> bert_opts;  // --bert_config and bing_bert's flags: --model bert only
  int max_seq_length = 0, max_predictions_per_seq = 0;
  CLI::Option* max_seq_length_opt = nullptr;
  CLI::Option* max_predictions_opt = nullptr;
  CLI::Option* batch_size_opt = nullptr;
  std::string data_order;
  CLI::Option* data_order_opt = nullptr;
  std::string attention_backward;
  CLI::Option* attention_backward_opt = nullptr;
  CLI::Option* pipeline_opt = nullptr;
  CLI::Option* partition_opt = nullptr;
  CLI::App* sub = nullptr;
};

int run_train(TrainFlags& f) {
  if (f.print_layouts) {
    std::cout << train::bytes_per_param_table();
    return 0;
  }
  if (f.local_rank_opt->count()) comm::apply_local_rank_flag(f.local_rank);
  train::TrainOptions o = f.o;
  o.device = train::parse_choice(train::kTrainDevices, f.device, "--device");
  o.labels = train::parse_choice(train::kLabelsChoices, f.labels, "--labels");
  o.attention = train::parse_choice(train::kAttentionChoices, f.attention, "--attention");
  o.save_mode = train::parse_choice(train::kSaveModes, f.save_mode, "--save_mode");
  o.model = train::parse_choice(train::kModelArchs, f.model, "--model");
  if (f.data_order_opt->count()) o.data_order = train::parse_choice(train::kDataOrders, f.data_order, "--data_order");
  if (f.attention_backward_opt->count())
    o.attention_backward = train::parse_choice(train::kAttentionBackwards, f.attention_backward, "--attention_backward");
  if (f.gpt2_size_opt->count()) {
    // llm.c's -e dN: GPT-2 of that depth, 1024 positions; shape flags given beside it must agree.
    const train::Gpt2Size z = train::parse_choice(train::kGpt2Sizes, f.gpt2_size, "--gpt2_size");
    CUTRAIN_CHECK(!f.model_opt->count() || o.model == model::Arch::Gpt2, "train: --gpt2_size ", f.gpt2_size,
                  " is a GPT-2 size, --model says ", f.model);
    o.model = model::Arch::Gpt2;
    auto set = [&](const char* flag, int& v, int want) {
      for (const auto& [opt, given] : f.shape_opts)
        CUTRAIN_CHECK(!(opt->get_name() == flag && opt->count() && v != want), "train: ", flag, " ", v,
                      " contradicts --gpt2_size ", f.gpt2_size, " (", want, ")");
      v = want;
    };
    set("--hidden_dim", o.hidden_dim, z.channels);
    set("--num_layers", o.num_layers, z.layers);
    set("--num_heads", o.num_heads, z.heads);
    if (o.max_seq_len == 0) o.max_seq_len = 1024;
    bool vocab_given = false;  // GPT-2's tokenizer, as llm.c's -e dN
    for (const auto& [opt, given] : f.shape_opts) vocab_given |= opt->get_name() == "--vocab_size" && opt->count() > 0;
    if (!vocab_given) o.vocab_size = 50257;
  }
  for (const CLI::Option* opt : f.bert_opts)
    CUTRAIN_CHECK(!opt->count() || o.model == model::Arch::Bert, "train: ", opt->get_name(),
                  " is a flag of BERT pre-training: expected --model bert with it, found --model ", f.model);
  if (f.max_seq_length_opt->count()) o.bert.max_seq_length = f.max_seq_length;
  if (f.max_predictions_opt->count()) o.bert.max_predictions_per_seq = f.max_predictions_per_seq;
  o.batch_size_given = f.batch_size_opt->count() > 0;
  o.pipeline_parallel_given = f.pipeline_opt->count() > 0;
  o.partition_method_given = f.partition_opt->count() > 0;
  if (f.lr_opt->count()) o.learning_rate = f.learning_rate;
  if (f.lr_decay_tokens_opt->count()) o.lr_decay_tokens = f.lr_decay_tokens;
  if (f.log_interval_opt->count()) o.log_interval = f.log_interval;
  o.progress = ::isatty(STDOUT_FILENO) == 1;
  o.cuda_graph = !f.no_cuda_graph;
  if (f.save_interval_opt->count()) o.save_interval = f.save_interval;
  if (f.keep_last_opt->count()) o.keep_last = f.keep_last;
  for (const auto& [opt, given] : f.shape_opts) o.shape_given.*given = opt->count() > 0;
  if (f.gpt2_size_opt->count()) o.shape_given.hidden_dim = o.shape_given.num_layers = o.shape_given.num_heads = true;
  for (const CLI::Option* opt : f.moe_opts)
    if (opt->count() && opt->get_name() != "--num_experts") o.moe.given.push_back(opt->get_name());
  for (const CLI::Option* opt : f.mos_opts)
    if (opt->count()) o.mos.given.push_back(opt->get_name());
  if (f.num_layers_teacher_opt->count()) o.mos.num_layers_teacher = f.num_layers_teacher;
  if (f.hidden_size_teacher_opt->count()) o.mos.hidden_size_teacher = f.hidden_size_teacher;
  if (f.num_attention_heads_teacher_opt->count()) o.mos.num_attention_heads_teacher = f.num_attention_heads_teacher;
  if (f.stop_kd_step_opt->count()) o.mos.stop_kd_step = f.stop_kd_step;
  if (f.timing_opt->count()) {
    o.profiling.timing_report = true;
    o.profiling.timing_report_file = f.timing_file;
  }
  std::size_t given = 0;  // `cutrain` or `cutrain train` with no flags at all: the default run
  for (const CLI::Option* opt : f.sub->get_options())
    if (opt != f.local_rank_opt) given += opt->count();  // a launcher's --local_rank alone keeps the default run
  const bool no_args = given == 0;
  if (f.config.empty()) {
    if (!no_args) throw CLI::RequiredError("--deepspeed_config");
    // The main job: the BF16 example's default size with the bf16_full config on a GPU, or a
    // small CPU run where there is none.
    o.deepspeed_config = "configs/bf16_full.json";
#ifdef CUTRAIN_SOURCE_DIR
    // Run from elsewhere than the repository root: the checkout's configs/.
    if (!std::filesystem::exists(o.deepspeed_config))
      o.deepspeed_config = std::filesystem::path(CUTRAIN_SOURCE_DIR) / "configs" / "bf16_full.json";
#endif
    std::string why;
    if (gpu_available(&why)) {
      std::cout << "cutrain train: no arguments: the BF16 example's default model with " << o.deepspeed_config.string()
                << " on the GPU\n";
    } else {
      o.device = train::TrainDevice::Cpu;
      o.hidden_dim = 64, o.num_layers = 2, o.num_heads = 4, o.vocab_size = 512;
      o.batch_size = 2, o.seq_length = 32, o.num_steps = 10, o.warmup_steps = 2, o.log_interval = 2;
      std::cout << "cutrain train: no arguments and no CUDA device (" << why << "): a small run on the CPU "
                << "reference model (hidden 64, 2 layers, 4 heads, vocab 512, batch 2, seq 32, 10 steps) with "
                << o.deepspeed_config.string() << "\n";
    }
  } else {
    o.deepspeed_config = f.config;
  }
  train::run_training(o, std::cout);
  return 0;
}

}  // namespace

CLI::App* setup_train_command(CLI::App& parent, int& exit_code) {
  static TrainFlags f;
  auto& o = f.o;
  CLI::App* sub = parent.add_subcommand("train", "Train the BF16 example's transformer, GPT-2 or BERT (DeepSpeed-style config)");
  f.sub = sub;
  f.config_opt = sub->add_option("--deepspeed_config", f.config, "DeepSpeed-style JSON config (required)");
  using G = train::TrainOptions::ShapeGiven;
  auto shape = [&](CLI::Option* opt, bool G::*given) {
    f.shape_opts.emplace_back(opt, given);
    return opt;
  };
  // The shape flags: with --resume, the checkpoint's config.json gives the ones left out.
  shape(sub->add_option("--hidden_dim", o.hidden_dim, "Hidden size"), &G::hidden_dim)->capture_default_str();
  shape(sub->add_option("--num_layers", o.num_layers, "Transformer blocks"), &G::num_layers)->capture_default_str();
  shape(sub->add_option("--num_heads", o.num_heads, "Attention heads"), &G::num_heads)->capture_default_str();
  shape(sub->add_option("--vocab_size", o.vocab_size, "Vocabulary size"), &G::vocab_size)->capture_default_str();
  f.model_opt = sub->add_option("--model", f.model,
                                "Architecture: simple (the BF16 example's post-LN model), gpt2 (llm.c's GPT-2: "
                                "pre-LN, tied head, tanh GELU, causal, vocabulary padded to 128) or bert (BERT "
                                "pre-training with masked-LM batches; needs --bert_config; docs/bert.md)")
                    ->capture_default_str()
                    ->check(CLI::IsMember({"simple", "gpt2", "bert"}));
  f.gpt2_size_opt = sub->add_option("-e,--gpt2_size", f.gpt2_size,
                                    "llm.c's GPT-2 sizes: d6, d12 (124M), d24, d36, d48 (sets --model gpt2, the "
                                    "hidden size, layers and heads, 1024 positions, vocabulary 50257)")
                        ->check(CLI::IsMember({"d6", "d12", "d24", "d36", "d48"}));
  sub->add_option("--max_seq_len", o.max_seq_len, "Rows of the position table (not given: --seq_length)");
  sub->add_option("--init_from_llmc", o.init_from_llmc,
                  "Start from llm.c's model file (model_*.bin of its -o folder, or gpt2_124M_bf16.bin): it gives "
                  "the architecture and shape; the optimizer starts fresh");
  sub->add_option("--save_llmc", o.save_llmc, "At the end, write the params as llm.c's model file (bf16, version 5)");
  sub->add_option("--init_from_hf", o.init_from_hf,
                  "Start from Hugging Face GPT-2 safetensors (transformer.h.0.attn.c_attn.weight, ...; F32 or BF16); "
                  "the shape comes from the flags, e.g. -e d12 --vocab_size 50257");
  sub->add_option("--save_hf", o.save_hf, "At the end, write the params as Hugging Face GPT-2 safetensors (F32)");
  f.batch_size_opt = sub->add_option("--batch_size", o.batch_size,
                                     "Micro batch size (--model bert: not given, the config's train_micro_batch_size_per_gpu)")
                         ->capture_default_str();
  shape(sub->add_option("--seq_length", o.seq_length, "Sequence length (= max_seq_len)"), &G::seq_length)
      ->capture_default_str();
  sub->add_option("--num_steps", o.num_steps, "Optimizer steps")->capture_default_str();
  sub->add_option("--warmup_steps", o.warmup_steps, "Steps left out of the average step time")->capture_default_str();
  f.lr_opt = sub->add_option("--learning_rate", f.learning_rate, "Overrides the config's optimizer lr when given")
                 ->capture_default_str();
  f.lr_decay_tokens_opt = sub->add_option(
      "--lr_decay_tokens", f.lr_decay_tokens,
      "The scheduler's decay (WarmupDecayLR, WarmupCosineLR) over this many trained tokens instead of its steps: "
      "Megatron-DeepSpeed's --lr-decay-tokens, for a sequence-length curriculum (docs/data-efficiency.md)");
  sub->add_option("--pad_to_longest", o.pad_to_longest,
                  "--model bert: cut each step's [PAD]-padded micro-batches to their longest sample rounded up to a "
                  "multiple of this (e.g. 64; one CUDA graph per length; 0: pad to the sequence length)");
  f.log_interval_opt = sub->add_option("--log_interval", f.log_interval,
                                       "Print a Step line every N steps (not given: the config's steps_per_print, else 5)");
  sub->add_flag("--activation_checkpointing", o.activation_checkpointing, "Recompute each block in backward");
  sub->add_flag("--recompute_gelu", o.recompute_gelu,
                "GPT-2: one GELU output buffer for all blocks, recomputed in backward (llm.c's -r 1)");
  f.attention_backward_opt =
      sub->add_option("--attention_backward", f.attention_backward,
                      "GPU attention backward: deterministic (the same bits every run) or fast (dQ by "
                      "order-dependent fp32 reduce-adds: faster, not bit-reproducible run to run; head dim 128 "
                      "below sequence length 1024 runs the deterministic algorithm either way). Not given: the config's "
                      "cutrain.attention_backward, else deterministic")
          ->check(CLI::IsMember({"deterministic", "fast"}));
  f.pipeline_opt = sub->add_option("--pipeline_parallel_size,--pipeline-parallel-size", o.pipeline_parallel_size,
                                   "Pipeline stages, one rank each (--device cpu: cutrain launch --backend host "
                                   "--num_procs N; --device cuda: 1, the step through the pipeline's program; the "
                                   "config's pipeline.stages when not given)")
                      ->capture_default_str();
  sub->add_option("--pipeline_stages_in_process", o.pipeline_stages_in_process,
                  "--device cuda: run all N pipeline stages in this one process (virtual stages, activations handed "
                  "over as device buffers; the seed model)")
      ->capture_default_str();
  sub->add_option("--tensor_parallel_size,--tensor-parallel-size", o.tensor_parallel_size,
                  "Tensor-parallel degree (Megatron-style; --device cpu; --device cuda: 1, the blocks' all-reduces over "
                  "a one-rank NCCL communicator; the config's tensor_parallel.autotp_size when not given)");
  sub->add_option("--domino", o.domino,
                  "Domino: split each micro-batch into N pieces so one piece's tensor-parallel all-reduce overlaps "
                  "the next piece's compute (the summary reports the modelled hidden fraction)")
      ->capture_default_str();
  f.partition_opt = sub->add_option("--partition_method", o.partition_method,
                                    "How the pipeline splits the layers: parameters, uniform or type:REGEX "
                                    "(DeepSpeed's PipelineModule; the config's pipeline.partition when not given)")
                       ->capture_default_str();
  sub->add_option("--loss_log_file", o.loss_log_file, "Write step,loss CSV here");
  sub->add_flag("--use_real_data", o.use_real_data, "Train on token shards (--data) instead of random tokens");
  sub->add_option("--data", o.data, "Glob pattern(s) of llm.c token shards for --use_real_data");
  sub->add_option("--labels", f.labels,
                  "Real data: next_token (targets = the following token; the default) or identity (labels = input "
                  "ids: the BF16 example's --use_real_data exactly)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "next_token", "identity"}));
  sub->add_flag_callback("--next_token_labels", [] { f.labels = "next_token"; },
                         "Same as --labels next_token (kept for earlier scripts)");
  sub->add_option("--attention", f.attention,
                  "causal or bidirectional; auto: causal with next-token real data, else bidirectional (the example)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "causal", "bidirectional"}));
  shape(sub->add_option("--pad_vocab", o.pad_vocab,
                  "Round the vocabulary's rows up to a multiple of N for the GEMMs (no value: 64; 50257 -> 50304)")
      ->expected(0, 1)
      ->default_str("64")
      ->type_name("[N]"), &G::pad_vocab);
  f.data_order_opt = sub->add_option("--data_order", f.data_order,
                  "Order of --use_real_data's batches: shuffled (every shard's windows shuffled together per epoch) "
                  "or llmc (exactly llm.c's DataLoader: shard order and each shard's samples permuted, seeded "
                  "--seed + rank; docs/gpt2.md). Not given: the config's cutrain.data_order, else shuffled")
      ->check(CLI::IsMember({"shuffled", "llmc"}));
  sub->add_option("--eval_data", o.eval_data, "Glob pattern(s) of validation shards (with --use_real_data)");
  sub->add_option("--eval_interval", o.eval_interval,
                  "Evaluate after every N steps (0: only before training and after the last step)")
      ->capture_default_str();
  sub->add_option("--eval_steps", o.eval_steps, "Validation batches per evaluation")->capture_default_str();
  sub->add_option("--seed", o.seed, "Seed of init and data")->capture_default_str();
  sub->add_option("--metrics_file", o.metrics_file, "One JSON line per step (loss, lr, grad norm, time, memory)");
  sub->add_option("--save", o.save_dir,
                  "Save checkpoints under DIR (DIR/global_step<N>, DIR/latest) at the end and every --save_interval");
  f.save_interval_opt =
      sub->add_option("--save_interval", f.save_interval, "With --save: also save after every N steps (N >= 1)");
  f.keep_last_opt = sub->add_option("--keep_last", f.keep_last,
                                    "With --save: keep the K newest step folders (K >= 1; never the one latest names)");
  sub->add_option("--save_mode", f.save_mode,
                  "With --save: async (snapshot to pinned host memory, the write in the background while training "
                  "goes on), sync (the step waits for the write) or auto (async when the snapshot fits in half the "
                  "available host memory)")
      ->capture_default_str();
  sub->add_option("--resume", o.resume_dir,
                  "Resume from a checkpoint: DIR (follows DIR/latest) or a step folder DIR/global_step<N>; verified "
                  "first, and it gives the shape flags left out");
  sub->add_flag("--accept_legacy_checkpoint", o.accept_legacy_checkpoint,
                "--resume of a checkpoint of the layout before manifests (three files, no checksums; a warning)");
  sub->add_option("--device", f.device, "cuda or cpu")->capture_default_str()->check(CLI::IsMember({"cuda", "cpu"}));
  sub->add_flag("--no_cuda_graph", f.no_cuda_graph, "Run every step eagerly (no CUDA graph replay)");
  sub->add_flag("--print_layouts", f.print_layouts, "Print the precision layouts' bytes per parameter and exit");
  sub->add_flag("--fixed_batch", o.fixed_batch, "Reuse the first batch every step (the loss must fall)");
  f.timing_opt = sub->add_option("--timing_report", f.timing_file,
                                 "Time every named region with CUDA events for --timing_steps steps after the warm-up "
                                 "and print a table with MFU at the end; with FILE also write it as JSON (the config's "
                                 "wall_clock_breakdown: true is the same without FILE)")
                     ->expected(0, 1)
                     ->type_name("[FILE.json]");
  sub->add_option("--timing_steps", o.profiling.timing_steps, "Steps --timing_report covers")->capture_default_str();
  sub->add_flag("--timing_all_rows", o.profiling.timing_all_rows, "Timing table with one row per layer (not layer*)");
  sub->add_option("--profile_steps", o.profiling.profile_steps,
                  "A:B: cudaProfilerStart before step A, cudaProfilerStop after step B (nsys/ncu capture ranges)");
  sub->add_flag("--profile_graphs", o.profiling.profile_with_graphs,
                "Keep CUDA-graph replay on inside --profile_steps (default: eager there)");
  // MoE (docs/moe.md): Megatron-DeepSpeed's names, with its dashed spellings accepted too.
  auto moe = [&](CLI::Option* opt) {
    f.moe_opts.push_back(opt);
    return opt;
  };
  moe(sub->add_option("--num_experts,--num-experts", o.moe.num_experts,
                      "MoE: experts of every MoE block, or a comma list with one count per MoE block (PR-MoE's "
                      "pyramid); not given: a dense model")
          ->delimiter(','));
  moe(sub->add_option("--moe_layers", o.moe.moe_layers,
                      "MoE blocks: every:N (blocks N-1, 2N-1, ...; default every:2) or a comma list of 0-based blocks"));
  moe(sub->add_option("--expert_interval,--expert-interval", o.moe.expert_interval,
                      "Megatron-DeepSpeed's form of --moe_layers every:N"));
  moe(sub->add_option("--top_k,--topk", o.moe.top_k, "MoE routes per token: 1 or 2")->capture_default_str());
  moe(sub->add_option("--moe_loss_coeff,--moe-loss-coeff", o.moe.loss_coeff,
                      "Weight of the load-balancing loss: objective = lm + coeff * sum of the blocks' l_aux")
          ->capture_default_str());
  moe(sub->add_option("--moe_train_capacity_factor,--moe-train-capacity-factor", o.moe.train_capacity_factor,
                      "Expert capacity factor in training (> 0)")
          ->capture_default_str());
  moe(sub->add_option("--moe_eval_capacity_factor,--moe-eval-capacity-factor", o.moe.eval_capacity_factor,
                      "Expert capacity factor in evaluation (> 0)")
          ->capture_default_str());
  moe(sub->add_option("--moe_min_capacity,--moe-min-capacity", o.moe.min_capacity, "Smallest expert capacity")
          ->capture_default_str());
  moe(sub->add_flag("--disable_moe_token_dropping,--disable-moe-token-dropping", o.moe.disable_token_dropping,
                    "Capacity = the largest expert's count: no route dropped"));
  moe(sub->add_option("--mlp_type,--mlp-type", o.moe.mlp_type,
                      "standard or residual (PR-MoE: a dense MLP beside the experts, mixed by a learned coefficient)")
          ->capture_default_str());
  moe(sub->add_option("--moe_noisy_gate_policy,--moe-noisy-gate-policy", o.moe.noisy_gate_policy,
                      "None, Jitter (gate input noise) or RSample (top-1 routing by logits + Gumbel), in training")
          ->capture_default_str());
  moe(sub->add_option("--moe_use_rts,--moe-use-rts", o.moe.use_rts,
                      "true or false: top-1's random token selection when an expert is over capacity (DeepSpeed's "
                      "use_rts; default true for top-1 as DeepSpeed's MoE; false keeps the first routes in token order)"));
  moe(sub->add_option("--moe_expert_parallel_size,--moe-expert-parallel-size", o.moe.expert_parallel_size,
                      "ep_size: experts split over this many data-parallel ranks (--device cpu: the host communicator; cuda: NCCL, the exchange taken even at 1)")
          ->capture_default_str());
  // Mixture-of-Students / knowledge distillation (docs/moe.md): Megatron-DeepSpeed's names, with its
  // dashed spellings accepted too; --stop_kd_step is the staged method's boundary (no such flag there).
  auto mos = [&](CLI::Option* opt) {
    f.mos_opts.push_back(opt);
    return opt;
  };
  sub->add_flag("--mos", o.mos.mos, "Mixture-of-Students: distill the (MoE / PR-MoE) student from --load_teacher");
  sub->add_flag("--kd", o.mos.kd, "Knowledge distillation from --load_teacher (the same loss as --mos)");
  mos(sub->add_option("--load_teacher,--load-teacher", o.mos.load_teacher,
                      "The teacher: a cutrain checkpoint (a --save ROOT or ROOT/global_step<N>); its config.json gives its shape"));
  f.num_layers_teacher_opt = mos(sub->add_option("--num_layers_teacher,--num-layers-teacher", f.num_layers_teacher,
                                                 "The teacher's layers (checked against its config.json)"));
  f.hidden_size_teacher_opt = mos(sub->add_option("--hidden_size_teacher,--hidden-size-teacher", f.hidden_size_teacher,
                                                  "The teacher's hidden size (checked against its config.json)"));
  f.num_attention_heads_teacher_opt =
      mos(sub->add_option("--num_attention_heads_teacher,--num-attention-heads-teacher", f.num_attention_heads_teacher,
                          "The teacher's attention heads (checked against its config.json)"));
  mos(sub->add_option("--num_experts_teacher,--num-experts-teacher", o.mos.num_experts_teacher,
                      "The teacher's experts per MoE block: one count or one per block, 1: dense (checked against its config.json)")
          ->delimiter(','));
  mos(sub->add_option("--kd_alpha_ce,--kd-alpha-ce", o.mos.kd_alpha_ce, "The LM loss's weight while distilling")
          ->capture_default_str());
  mos(sub->add_option("--kd_beta_ce,--kd-beta-ce", o.mos.kd_beta_ce, "The distillation term's weight")
          ->capture_default_str());
  mos(sub->add_option("--kd_temp,--kd-temp", o.mos.kd_temp, "The distillation's softmax temperature (> 0)")
          ->capture_default_str());
  f.stop_kd_step_opt = mos(sub->add_option("--stop_kd_step,--stop-kd-step", f.stop_kd_step,
                                           "Staged distillation: the first step without the teacher (freed then); "
                                           "not given: distill the whole run"));
  sub->add_flag("--reset_iteration,--reset-iteration", o.mos.reset_iteration,
                "With --resume: start the step count again at 0 (the checkpoint's weights and optimizer state kept)");
  // BERT pre-training (docs/bert.md): the model config and bing_bert's flags (given: over the file).
  auto bert = [&](CLI::Option* opt) {
    f.bert_opts.push_back(opt);
    return opt;
  };
  bert(sub->add_option("--bert_config", o.bert.config,
                       "--model bert: the model config, bing_bert's (a bert_model_config object with Hugging Face "
                       "BertConfig's keys) or DeepSpeedTransformerConfig's fields as JSON"));
  bert(sub->add_flag("--deepspeed_transformer_kernel", o.bert.deepspeed_transformer_kernel,
                     "bing_bert's flag: accepted (cutrain's BERT layer is always its fused kernel)"));
  bert(sub->add_flag("--stochastic_mode", o.bert.stochastic_mode,
                     "DeepSpeed's stochastic_mode: faster, not bit-reproducible"));
  bert(sub->add_flag("--normalize_invertible", o.bert.normalize_invertible,
                     "LayerNorm backward from its output: its input is not kept"));
  bert(sub->add_flag("--gelu_checkpoint", o.bert.gelu_checkpoint, "The GELU output not kept, recomputed in backward"));
  bert(sub->add_flag("--attention_dropout_checkpoint", o.bert.attention_dropout_checkpoint,
                     "The dropped attention probabilities not kept, recomputed in backward"));
  f.max_seq_length_opt = bert(sub->add_option("--max_seq_length", f.max_seq_length,
                                              "--model bert: the longest sample S (not given: --seq_length)"));
  f.max_predictions_opt = bert(sub->add_option("--max_predictions_per_seq,--max_pred", f.max_predictions_per_seq,
                                               "--model bert: the most masked positions per sample (not given: "
                                               "ceil(0.15 S))"));
  f.local_rank_opt = sub->add_option("--local_rank", f.local_rank,
                                     "This process's GPU on its node, as DeepSpeed's launcher passes it (must "
                                     "agree with LOCAL_RANK when that is set too)");
  sub->callback([&exit_code] { exit_code = run_train(f); });
  return sub;
}

}  // namespace cutrain::tools
