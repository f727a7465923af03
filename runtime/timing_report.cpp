#include "runtime/timing_report.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <numeric>
#include <unordered_map>

#include "runtime/error.h"
#include "runtime/file_util.h"

namespace cutrain {

double datasheet_bf16_tflops(std::string_view name) {
  auto has = [&](std::string_view s) { return name.find(s) != std::string_view::npos; };
  // PCIe and NVL boards run at lower clocks and power: their datasheet numbers differ.
  if ((has("H100") || has("H200")) && !has("PCIe") && !has("NVL")) return kH100H200DenseBf16Tflops;
  return 0;
}

std::string fold_layer_index(std::string_view name) {
  std::string out;
  out.reserve(name.size());
  std::size_t pos = 0;
  while (pos <= name.size()) {
    std::size_t end = name.find('/', pos);
    if (end == std::string_view::npos) end = name.size();
    std::string_view part = name.substr(pos, end - pos);
    const bool layer = part.size() > 5 && part.substr(0, 5) == "layer" &&
                       std::all_of(part.begin() + 5, part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    if (pos > 0) out.push_back('/');
    if (layer) {
      out += "layer*";
    } else {
      out += part;
    }
    pos = end + 1;
  }
  return out;
}

namespace {

ReportRow make_row(const RegionTotals& r, double step_total_ms, std::size_t steps, const DevicePeaks& pk) {
  ReportRow row;
  row.name = r.name;
  row.calls = r.calls;
  row.total_ms = r.total_ms;
  if (steps > 0) row.ms_per_step = r.total_ms / double(steps);
  if (step_total_ms > 0) row.pct_of_step = 100.0 * r.total_ms / step_total_ms;
  const double s = r.total_ms * 1e-3;
  if (s > 0 && r.flops > 0) row.tflops = r.flops / s / 1e12;
  if (s > 0 && r.bytes > 0) row.gbps = r.bytes / s / 1e9;
  if (pk.gemm_tflops > 0) row.frac_gemm_peak = row.tflops / pk.gemm_tflops;
  if (pk.copy_gbps > 0) row.frac_copy_bw = row.gbps / pk.copy_gbps;
  return row;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

nlohmann::json row_json(const ReportRow& r) {
  nlohmann::json j = {{"name", r.name},
                      {"calls", r.calls},
                      {"total_ms", r.total_ms},
                      {"ms_per_step", r.ms_per_step},
                      {"pct_of_step", r.pct_of_step}};
  if (r.tflops > 0) j["tflops"] = r.tflops, j["frac_gemm_peak"] = r.frac_gemm_peak;
  if (r.gbps > 0) j["gbps"] = r.gbps, j["frac_copy_bw"] = r.frac_copy_bw;
  return j;
}

}  // namespace

TimingReport make_timing_report(const std::vector<RegionTotals>& regions, const std::vector<double>& step_ms,
                                const DevicePeaks& peaks, const std::string& step_region,
                                double model_flops_per_step, std::string flops_formula) {
  TimingReport rep;
  rep.peaks = peaks;
  rep.step_region = step_region;
  rep.flops_formula = std::move(flops_formula);
  rep.model_flops_per_step = model_flops_per_step;
  rep.step_ms = step_ms;
  // The step total comes from the step region's own totals when it was timed; the per-step list
  // alone when the caller only has that.
  rep.step_total_ms = std::accumulate(step_ms.begin(), step_ms.end(), 0.0);
  for (const RegionTotals& r : regions)
    if (r.name == step_region) rep.step_total_ms = r.total_ms;

  auto mfu = [&](double flops, double ms, double peak_tflops) {
    return (ms > 0 && peak_tflops > 0) ? flops / (ms * 1e-3) / (peak_tflops * 1e12) : 0.0;
  };
  for (double ms : step_ms) {
    rep.mfu_datasheet.push_back(mfu(model_flops_per_step, ms, peaks.datasheet_tflops));
    rep.mfu_measured.push_back(mfu(model_flops_per_step, ms, peaks.gemm_tflops));
  }
  const double all_ms = std::accumulate(step_ms.begin(), step_ms.end(), 0.0);
  const double all_flops = model_flops_per_step * double(step_ms.size());
  rep.mfu_datasheet_mean = mfu(all_flops, all_ms, peaks.datasheet_tflops);
  rep.mfu_measured_mean = mfu(all_flops, all_ms, peaks.gemm_tflops);

  std::vector<RegionTotals> folded;
  std::unordered_map<std::string, std::size_t> index;
  for (const RegionTotals& r : regions) {
    rep.rows.push_back(make_row(r, rep.step_total_ms, step_ms.size(), peaks));
    std::string k = fold_layer_index(r.name);
    auto [it, fresh] = index.emplace(k, folded.size());
    if (fresh) {
      folded.push_back(r);
      folded.back().name = k;
    } else {
      RegionTotals& f = folded[it->second];
      f.calls += r.calls;
      f.total_ms += r.total_ms;
      f.flops += r.flops;
      f.bytes += r.bytes;
    }
  }
  for (const RegionTotals& r : folded) rep.by_kind.push_back(make_row(r, rep.step_total_ms, step_ms.size(), peaks));
  return rep;
}

std::string format_timing_report(const TimingReport& r, bool all_rows) {
  std::string out;
  out += "Timing report (CUDA events";
  out += ", " + std::to_string(r.step_ms.size()) + " steps";
  if (!r.peaks.device.empty()) out += ", " + r.peaks.device;
  out += ")\n";
  out += "  peaks: copy " + fmt("%.0f", r.peaks.copy_gbps) + " GB/s measured, bf16 GEMM " +
         fmt("%.1f", r.peaks.gemm_tflops) + " TFLOP/s measured (cuBLASLt), " +
         (r.peaks.datasheet_tflops > 0 ? fmt("%.1f", r.peaks.datasheet_tflops) + " TFLOP/s datasheet dense bf16"
                                       : std::string("datasheet peak unknown for this device")) +
         "\n";
  if (!r.step_ms.empty()) {
    out += "  step ms:";
    for (double ms : r.step_ms) out += " " + fmt("%.3f", ms);
    out += "\n";
  }
  if (r.model_flops_per_step > 0) {
    out += "  model FLOPs per step: " + fmt("%.4g", r.model_flops_per_step) + " (" + r.flops_formula + ")\n";
    out += "  MFU per step vs datasheet:";
    for (double m : r.mfu_datasheet) out += " " + fmt("%.1f%%", 100 * m);
    out += "  (mean " + fmt("%.1f%%", 100 * r.mfu_datasheet_mean) + ")\n";
    out += "  MFU per step vs measured GEMM peak:";
    for (double m : r.mfu_measured) out += " " + fmt("%.1f%%", 100 * m);
    out += "  (mean " + fmt("%.1f%%", 100 * r.mfu_measured_mean) + ")\n";
  }
  const std::vector<ReportRow>& rows = all_rows ? r.rows : r.by_kind;
  std::size_t w = 6;
  for (const ReportRow& row : rows) w = std::max(w, row.name.size());
  char line[512];
  std::snprintf(line, sizeof line, "  %-*s %8s %11s %9s %7s %9s %6s %9s %6s\n", int(w), "region", "calls",
                "total ms", "ms/step", "% step", "TFLOP/s", "%gemm", "GB/s", "%copy");
  out += line;
  for (const ReportRow& row : rows) {
    auto opt = [](double v, const char* f) { return v > 0 ? fmt(f, v) : std::string("-"); };
    std::snprintf(line, sizeof line, "  %-*s %8lld %11.3f %9.3f %7s %9s %6s %9s %6s\n", int(w), row.name.c_str(),
                  static_cast<long long>(row.calls), row.total_ms, row.ms_per_step,
                  r.step_total_ms > 0 ? fmt("%.1f", row.pct_of_step).c_str() : "-", opt(row.tflops, "%.1f").c_str(),
                  opt(100 * row.frac_gemm_peak, "%.0f").c_str(), opt(row.gbps, "%.0f").c_str(),
                  opt(100 * row.frac_copy_bw, "%.0f").c_str());
    out += line;
  }
  out += "  (nested regions include their children; % step is of the '" + r.step_region + "' region's total)\n";
  return out;
}

nlohmann::json timing_report_json(const TimingReport& r) {
  nlohmann::json j;
  j["device"] = r.peaks.device;
  j["peaks"] = {{"copy_gbps", r.peaks.copy_gbps},
                {"gemm_tflops_measured", r.peaks.gemm_tflops},
                {"bf16_dense_tflops_datasheet", r.peaks.datasheet_tflops}};
  j["step_region"] = r.step_region;
  j["steps"] = r.step_ms.size();
  j["step_ms"] = r.step_ms;
  j["step_total_ms"] = r.step_total_ms;
  j["model_flops_per_step"] = r.model_flops_per_step;
  j["flops_formula"] = r.flops_formula;
  j["mfu_datasheet"] = r.mfu_datasheet;
  j["mfu_measured_peak"] = r.mfu_measured;
  j["mfu_datasheet_mean"] = r.mfu_datasheet_mean;
  j["mfu_measured_peak_mean"] = r.mfu_measured_mean;
  j["regions"] = nlohmann::json::array();
  for (const ReportRow& row : r.rows) j["regions"].push_back(row_json(row));
  j["regions_by_kind"] = nlohmann::json::array();
  for (const ReportRow& row : r.by_kind) j["regions_by_kind"].push_back(row_json(row));
  return j;
}

void write_timing_report(const std::filesystem::path& path, const TimingReport& report) {
  write_file_atomic(path, timing_report_json(report).dump(2) + "\n");
}

}  // namespace cutrain
