// @brief The planner's per-kernel times of one GPU: one micro-batch's embeddings, one block's
// forward and backward, the head, and the optimizer's and gradient norm's cost per element, from
// one of three sources: a timing report (`cutrain train --timing_report FILE` on the device, or
// the short profiled run `cutrain plan` makes on a local GPU: runtime/timing_report.h's JSON), or
// a roofline from device peaks (each kernel call's FLOPs and bytes of model/kernel_costs.h at the
// larger of compute time and memory time: a lower bound of the kernels' time).
#pragma once

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "model/transformer_params.h"

namespace cutrain::parallel {

struct KernelTimings {
  std::string source;       // what the times come from, for the output
  double embed_fwd = 0, embed_bwd = 0;  // seconds per micro-batch
  double layer_fwd = 0, layer_bwd = 0;  // one block; layer_bwd without the recompute
  double layer_recompute = 0;           // one block's forward again in its backward (checkpointing)
  // The share of a block's time in its LayerNorms: what tensor parallelism does not split.
  double layer_replicated_fraction = 0;
  double head_fwd = 0, head_bwd = 0;    // logits + cross-entropy; the head's backward
  double optimizer_per_elem = 0;        // seconds per element of a rank's optimizer state
  double grad_norm_per_elem = 0;        // seconds per gradient element the norm reads
};

struct DevicePeakRates {
  std::string device;     // "H100 SXM (datasheet)", or the local device's name
  double tflops = 989.4;  // dense bf16 tensor-core peak
  double gbps = 3350;     // memory bandwidth, GB/s (1e9 bytes/s)
};

// The roofline of the model's kernel calls at micro-batch B x S (the seed architecture's
// sequence of model/transformer_gpu.cpp); the optimizer's bytes per element for the layout
// (gradient, moment bytes, an fp32 master, a compensation buffer).
KernelTimings roofline_timings(const model::ModelDims& dims, int B, int S, bool causal, std::size_t grad_bytes,
                               std::size_t moment_bytes, bool master, bool compensation, const DevicePeakRates& peaks);

// What a timing report says about the run it timed (beside the times): checked by the caller
// against the planned model.
struct TimedRun {
  KernelTimings timings;
  int layers = 0;             // blocks of the timed run (calls of fwd/layer* per micro-batch)
  int accumulation = 0;       // micro-batches per step (calls of fwd/embedding per step)
  int steps = 0;
  double model_flops_per_step = 0;
  std::string device;
};

// From runtime/timing_report.h's JSON (the `regions` rows, with calls and total_ms, and the
// optimizer's and grad norm's GB/s). `what` names the file in errors: a missing region, a report
// without steps, a model other than the seed architecture's block sequence.
TimedRun timings_from_report(const nlohmann::json& report, const std::string& what, std::size_t grad_bytes,
                             std::size_t moment_bytes, bool master, bool compensation);
TimedRun read_timing_report(const std::filesystem::path& path, std::size_t grad_bytes, std::size_t moment_bytes,
                            bool master, bool compensation);

}  // namespace cutrain::parallel
