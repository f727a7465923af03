// @brief The numbers of a --timing_report: per named region its calls, total ms, share of the step,
// achieved TFLOP/s and GB/s against the device's measured peaks, and MFU per step. Pure host math
// (no CUDA), so the CPU tests check it with synthetic timings.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace cutrain {

// Dense bf16 tensor-core peak of the H100 / H200 SXM datasheet (without sparsity).
inline constexpr double kH100H200DenseBf16Tflops = 989.4;

struct DevicePeaks {
  std::string device;
  double copy_gbps = 0;         // measured device-to-device copy, (read + written bytes) / time
  double gemm_tflops = 0;       // measured large bf16 cuBLASLt GEMM
  double datasheet_tflops = 0;  // dense bf16 datasheet peak; 0 when the device is not known
};

// The datasheet dense bf16 peak for a device name ("NVIDIA H200" -> 989.4), 0 when unknown.
double datasheet_bf16_tflops(std::string_view device_name);

// What the timer accumulated for one region name over the timed steps.
struct RegionTotals {
  std::string name;  // hierarchical: "step/fwd/layer03/attn/qkv"
  std::int64_t calls = 0;
  double total_ms = 0;
  double flops = 0;  // summed over the calls (0: the region declared none)
  double bytes = 0;
};

struct ReportRow {
  std::string name;
  std::int64_t calls = 0;
  double total_ms = 0;
  double ms_per_step = 0;  // total_ms / timed steps (0 without step samples)
  double pct_of_step = 0;  // total_ms / (sum of the step region's ms) * 100; 0 without a step region
  double tflops = 0;       // flops / total time (0 when the region declared no flops)
  double gbps = 0;         // bytes / total time (0 when the region declared no bytes)
  double frac_gemm_peak = 0;  // tflops / measured GEMM peak
  double frac_copy_bw = 0;    // gbps / measured copy bandwidth
};

struct TimingReport {
  DevicePeaks peaks;
  std::string step_region = "step";
  std::string flops_formula;      // how model_flops_per_step was counted
  double model_flops_per_step = 0;
  std::vector<double> step_ms;    // each timed step
  double step_total_ms = 0;
  std::vector<double> mfu_datasheet, mfu_measured;  // per step, fractions (0 when the peak is unknown)
  double mfu_datasheet_mean = 0, mfu_measured_mean = 0;  // total model FLOPs / total step time / peak
  std::vector<ReportRow> rows;     // every region in first-seen order
  std::vector<ReportRow> by_kind;  // the same with "layerNN" folded into "layer*" (all layers summed)
};

// "step/bwd/layer11/mlp/fc1" -> "step/bwd/layer*/mlp/fc1": only a path component that is "layer"
// followed by digits alone is folded.
std::string fold_layer_index(std::string_view name);

TimingReport make_timing_report(const std::vector<RegionTotals>& regions, const std::vector<double>& step_ms,
                                const DevicePeaks& peaks, const std::string& step_region,
                                double model_flops_per_step, std::string flops_formula);

// The table printed at the end of a run: the folded rows (by_kind) unless `all_rows`.
std::string format_timing_report(const TimingReport& report, bool all_rows = false);
nlohmann::json timing_report_json(const TimingReport& report);
// Written atomically (temp name + rename).
void write_timing_report(const std::filesystem::path& path, const TimingReport& report);

}  // namespace cutrain
