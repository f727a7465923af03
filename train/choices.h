// @brief The string-valued choices of the DeepSpeed config and of `cutrain train`'s flags as typed
// enums. Each has one table of its spellings: the config reader and the flag parser turn text
// into the enum through it (once, where the JSON or the flags are read), and the printers turn the
// enum back into the same spelling. Nothing downstream compares strings.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

#include "data/data_order.h"
#include "model/transformer_params.h"
#include "runtime/choice.h"

namespace cutrain::train {

// ---- the DeepSpeed config ----

// optimizer.type (case-insensitive in the file, as DeepSpeed lower-cases it).
enum class OptimizerType { Adam, AdamW, Lamb };
inline constexpr std::array<Choice<OptimizerType>, 3> kOptimizerTypes{
    {{OptimizerType::Adam, "Adam"}, {OptimizerType::AdamW, "AdamW"}, {OptimizerType::Lamb, "Lamb"}}};

// scheduler.type; None: no scheduler section (a constant lr).
enum class SchedulerType { None, WarmupLR, WarmupDecayLR, WarmupCosineLR };
inline constexpr std::array<Choice<SchedulerType>, 3> kSchedulerTypes{{{SchedulerType::WarmupLR, "WarmupLR"},
                                                                        {SchedulerType::WarmupDecayLR, "WarmupDecayLR"},
                                                                        {SchedulerType::WarmupCosineLR, "WarmupCosineLR"}}};

// scheduler.params.warmup_type.
enum class WarmupType { Log, Linear };
inline constexpr std::array<Choice<WarmupType>, 2> kWarmupTypes{{{WarmupType::Log, "log"}, {WarmupType::Linear, "linear"}}};

// zero_optimization.offload_optimizer.device / offload_param.device (null reads as None).
enum class OffloadTarget { None, Cpu, Nvme };
inline constexpr std::array<Choice<OffloadTarget>, 3> kOffloadTargets{
    {{OffloadTarget::None, "none"}, {OffloadTarget::Cpu, "cpu"}, {OffloadTarget::Nvme, "nvme"}}};

// torch_autocast.dtype, by its normalized spelling (the reader also takes "bfloat16", "torch.bf16",
// "float16", "torch.half").
enum class AutocastDtype { BFloat16, Float16 };
inline constexpr std::array<Choice<AutocastDtype>, 2> kAutocastDtypes{
    {{AutocastDtype::BFloat16, "torch.bfloat16"}, {AutocastDtype::Float16, "torch.float16"}}};

// data_efficiency.data_sampling.curriculum_learning (and the legacy top-level curriculum_learning).
// The metric names (curriculum_metrics' keys; the legacy curriculum_type "seqlen" is SeqlenTruncate).
enum class CurriculumMetric { SeqlenTruncate, SeqlenReshape, VocabularyRarity };
inline constexpr std::array<Choice<CurriculumMetric>, 3> kCurriculumMetrics{
    {{CurriculumMetric::SeqlenTruncate, "seqlen_truncate"},
     {CurriculumMetric::SeqlenReshape, "seqlen_reshape"},
     {CurriculumMetric::VocabularyRarity, "vocabularyrarity"}}};
// schedule_type: the pacing function (train/curriculum_schedule.h); DeepSpeed's "custom" needs a
// Python callback and is an error.
enum class CurriculumSchedule { FixedLinear, FixedRoot, FixedDiscrete };
inline constexpr std::array<Choice<CurriculumSchedule>, 3> kCurriculumSchedules{
    {{CurriculumSchedule::FixedLinear, "fixed_linear"},
     {CurriculumSchedule::FixedRoot, "fixed_root"},
     {CurriculumSchedule::FixedDiscrete, "fixed_discrete"}}};
// difficulty_type: the difficulty is the metric's value or its percentile over the samples.
// data_efficiency.data_routing.random_ltd: model_type (decoder: causal attention over the kept
// tokens; encoder: full attention), hidden_state_order (the framework's layout; cutrain's is
// always batch_seq_dim) and random_ltd_schedule.schedule_type.
enum class RandomLtdModelType { Decoder, Encoder };
inline constexpr std::array<Choice<RandomLtdModelType>, 2> kRandomLtdModelTypes{
    {{RandomLtdModelType::Decoder, "decoder"}, {RandomLtdModelType::Encoder, "encoder"}}};
enum class HiddenStateOrder { BatchSeqDim, SeqBatchDim };
inline constexpr std::array<Choice<HiddenStateOrder>, 2> kHiddenStateOrders{
    {{HiddenStateOrder::BatchSeqDim, "batch_seq_dim"}, {HiddenStateOrder::SeqBatchDim, "seq_batch_dim"}}};
enum class RandomLtdSchedule { FixedLinear };
inline constexpr std::array<Choice<RandomLtdSchedule>, 1> kRandomLtdSchedules{
    {{RandomLtdSchedule::FixedLinear, "fixed_linear"}}};

enum class DifficultyType { Value, Percentile };
inline constexpr std::array<Choice<DifficultyType>, 2> kDifficultyTypes{
    {{DifficultyType::Value, "value"}, {DifficultyType::Percentile, "percentile"}}};
// clustering_type.
enum class ClusteringType { ScheduleBased, SingleCluster };
inline constexpr std::array<Choice<ClusteringType>, 2> kClusteringTypes{
    {{ClusteringType::ScheduleBased, "schedule_based"}, {ClusteringType::SingleCluster, "single_cluster"}}};

// cutrain.data_order (cutrain's own section) and --data_order: the order of the token shards'
// batches (data/data_order.h).
inline constexpr std::array<Choice<data::DataOrder>, 2> kDataOrders{
    {{data::DataOrder::Shuffled, "shuffled"}, {data::DataOrder::Llmc, "llmc"}}};
// cutrain.attention_backward and --attention_backward: the GPU attention backward's dQ.
// Deterministic: the same bits every run; Fast: order-dependent fp32 reduce-adds into dQ (faster;
// head dim 128 below sequence length 1024 runs the deterministic algorithm either way:
// kernels::attention_backward_adds_dq).
enum class AttentionBackward { Deterministic, Fast };
inline constexpr std::array<Choice<AttentionBackward>, 2> kAttentionBackwards{
    {{AttentionBackward::Deterministic, "deterministic"}, {AttentionBackward::Fast, "fast"}}};

// ---- `cutrain train` flags ----

// --device.
enum class TrainDevice { Cuda, Cpu };
inline constexpr std::array<Choice<TrainDevice>, 2> kTrainDevices{{{TrainDevice::Cuda, "cuda"}, {TrainDevice::Cpu, "cpu"}}};

// --labels: Auto (real data: next-token; random data: random labels, as the BF16 example),
// NextToken (targets = the following token), Identity (labels = input ids, the BF16 example's
// --use_real_data exactly).
enum class LabelsChoice { Auto, NextToken, Identity };
inline constexpr std::array<Choice<LabelsChoice>, 3> kLabelsChoices{
    {{LabelsChoice::Auto, "auto"}, {LabelsChoice::NextToken, "next_token"}, {LabelsChoice::Identity, "identity"}}};

// --attention: Auto (causal for next-token real data, else bidirectional as the example).
enum class AttentionChoice { Auto, Causal, Bidirectional };
inline constexpr std::array<Choice<AttentionChoice>, 3> kAttentionChoices{{{AttentionChoice::Auto, "auto"},
                                                                            {AttentionChoice::Causal, "causal"},
                                                                            {AttentionChoice::Bidirectional, "bidirectional"}}};

// --save_mode: Auto (async when the state's snapshot fits in half the host's available memory,
// else sync), Async (snapshot, then the write in the background), Sync (the step waits for the write).
enum class SaveMode { Auto, Async, Sync };
inline constexpr std::array<Choice<SaveMode>, 3> kSaveModes{
    {{SaveMode::Auto, "auto"}, {SaveMode::Async, "async"}, {SaveMode::Sync, "sync"}}};
// --model: the architecture (model/transformer_params.h): the BF16 example's, GPT-2 (llm.c's) or
// BERT's encoder with its masked-LM head (docs/bert.md).
inline constexpr std::array<Choice<model::Arch>, 3> kModelArchs{
    {{model::Arch::Simple, "simple"}, {model::Arch::Gpt2, "gpt2"}, {model::Arch::Bert, "bert"}}};

// --gpt2_size / -e: llm.c's GPT-2 sizes by depth (its `-e dN`): channels and heads of each.
struct Gpt2Size {
  int layers, channels, heads;
};
inline constexpr std::array<Choice<Gpt2Size>, 5> kGpt2Sizes{{{{6, 384, 6}, "d6"},
                                                             {{12, 768, 12}, "d12"},
                                                             {{24, 1024, 16}, "d24"},
                                                             {{36, 1280, 20}, "d36"},
                                                             {{48, 1600, 25}, "d48"}}};

// choice_name (runtime/choice.h) spells a value; "" for one its table does not list, e.g.
// SchedulerType::None.

// `one of "a", "b", "c"`: what an error message says was expected.
template <class E, std::size_t N>
std::string choices_text(const std::array<Choice<E>, N>& table) {
  std::string s = "one of";
  for (std::size_t i = 0; i < N; ++i) s += std::string(i ? ", \"" : " \"") + table[i].name + "\"";
  return s;
}

// Parses `text` (exact spelling) for the flag or JSON path `what`. Throws cutrain::Error
// "<what>: expected one of "a", "b", found "x"".
[[noreturn]] void fail_choice(std::string_view what, const std::string& expected, std::string_view found);
template <class E, std::size_t N>
E parse_choice(const std::array<Choice<E>, N>& table, std::string_view text, std::string_view what) {
  for (const Choice<E>& c : table)
    if (text == c.name) return c.value;
  fail_choice(what, choices_text(table), text);
}

inline const char* name(OptimizerType v) { return choice_name(kOptimizerTypes, v); }
inline const char* name(SchedulerType v) { return choice_name(kSchedulerTypes, v); }
inline const char* name(WarmupType v) { return choice_name(kWarmupTypes, v); }
inline const char* name(OffloadTarget v) { return choice_name(kOffloadTargets, v); }
inline const char* name(AutocastDtype v) { return choice_name(kAutocastDtypes, v); }
inline const char* name(CurriculumMetric v) { return choice_name(kCurriculumMetrics, v); }
inline const char* name(CurriculumSchedule v) { return choice_name(kCurriculumSchedules, v); }
inline const char* name(DifficultyType v) { return choice_name(kDifficultyTypes, v); }
inline const char* name(ClusteringType v) { return choice_name(kClusteringTypes, v); }
inline const char* name(RandomLtdModelType v) { return choice_name(kRandomLtdModelTypes, v); }
inline const char* name(HiddenStateOrder v) { return choice_name(kHiddenStateOrders, v); }
inline const char* name(RandomLtdSchedule v) { return choice_name(kRandomLtdSchedules, v); }
inline const char* name(TrainDevice v) { return choice_name(kTrainDevices, v); }
inline const char* name(LabelsChoice v) { return choice_name(kLabelsChoices, v); }
inline const char* name(AttentionChoice v) { return choice_name(kAttentionChoices, v); }
inline const char* name(SaveMode v) { return choice_name(kSaveModes, v); }
inline const char* name(model::Arch v) { return choice_name(kModelArchs, v); }
inline const char* name(data::DataOrder v) { return choice_name(kDataOrders, v); }
inline const char* name(AttentionBackward v) { return choice_name(kAttentionBackwards, v); }

}  // namespace cutrain::train
