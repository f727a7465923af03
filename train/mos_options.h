// @brief Mixture-of-Students (DeepSpeed-MoE's staged knowledge distillation; docs/moe.md,
// "Mixture-of-Students"): Megatron-DeepSpeed's flags (--mos / --kd, --load-teacher, the teacher's
// --num-layers-teacher / --hidden-size-teacher / --num-attention-heads-teacher /
// --num-experts-teacher, --kd-alpha-ce, --kd-beta-ce, --kd-temp, --reset-iteration) plus the stage
// boundary --stop_kd_step, their checks, and the teacher read from a cutrain checkpoint folder and
// checked against its own files and the student.
#pragma once

#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "model/transformer_params.h"

namespace cutrain::train {

struct MosOptions {
  bool mos = false;  // --mos: Mixture-of-Students (a MoE / PR-MoE student distilled from a teacher)
  bool kd = false;   // --kd: knowledge distillation of any student (the same loss; Megatron-DeepSpeed's other switch)
  std::filesystem::path load_teacher;  // --load_teacher: a cutrain checkpoint root or step folder
  // The teacher's shape as the run expects it (not given: the teacher's config.json says); a
  // given one that disagrees with the teacher's config.json is an error naming both.
  std::optional<int> num_layers_teacher, hidden_size_teacher, num_attention_heads_teacher;
  std::vector<int> num_experts_teacher;  // one count for every MoE block, or one per MoE block; [1]: dense
  double kd_alpha_ce = 1.0;  // the LM loss's weight while distilling
  double kd_beta_ce = 1.0;   // the distillation term's weight
  double kd_temp = 1.0;      // the softmax temperature T (> 0)
  // The staged method: distill during steps [0, stop_kd_step), then free the teacher and train on
  // the LM loss alone. Not given: distill the whole run.
  std::optional<int> stop_kd_step;
  bool reset_iteration = false;  // --reset_iteration: a --resume starts again at step 0 (with or without distillation)
  std::vector<std::string> given;  // the distillation flags the command line gave, but --mos / --kd (for the errors)
  bool active() const { return mos || kd; }
};

// Every value checked before any work, each error naming the flag: a distillation flag without
// --mos / --kd, --mos without --load_teacher, a temperature that is not finite and > 0, a negative
// or non-finite weight, a negative stop step, --reset_iteration without --resume (`resuming`).
void check_mos_options(const MosOptions& o, bool resuming);

// The teacher: a verified cutrain checkpoint's model, fp32 in its flat layout.
struct Teacher {
  std::filesystem::path folder;  // the step folder read
  int step = 0;                  // the steps it was trained for (trainer_state.json)
  model::ModelDims dims;
  bool causal = false;
  std::vector<float> params;     // TransformerParams(dims).flat_size() elements
};

// Reads --load_teacher: the folder found and its manifest verified (checksums included), its
// config.json's shape against the teacher flags given, against its model.safetensors (every
// tensor's name and shape, num_params) and against the student (`student`: the same vocabulary,
// a position table of at least `seq_length` rows; no BERT on either side). Every refusal names
// the field and both values.
Teacher load_teacher(const MosOptions& o, const model::ModelDims& student, int seq_length);

// "teacher <folder> (step N): GPT2, 4 layers, hidden 64, 4 heads, MoE blocks 1,3: 4,4 experts, 123,456 params"
std::string describe_teacher(const Teacher& t);
// "objective = 1 * ce + 1 * T^2 * KL(teacher || student) (T = 2) + 0.01 * l_aux, until step 10 (--stop_kd_step)"
std::string describe_distillation(const MosOptions& o, double moe_loss_coeff, bool moe);

}  // namespace cutrain::train
