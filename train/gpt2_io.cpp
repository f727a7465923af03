#include "train/gpt2_io.h"

#include <algorithm>

namespace cutrain::train {

namespace {
// params (and master) = flat, fresh moments.
void set_weights(TrainBackend& be, const std::vector<float>& flat) {
  HostState s = be.save_state();  // the right sizes and dtypes
  s.params = flat;
  if (!s.master.empty()) s.master = flat;
  std::fill(s.exp_avg.begin(), s.exp_avg.end(), 0.f);
  std::fill(s.exp_avg_sq.begin(), s.exp_avg_sq.end(), 0.f);
  be.load_state(s);
}
}  // namespace

model::LlmcHeader init_from_llmc(TrainBackend& be, const std::filesystem::path& path) {
  std::vector<float> flat(be.table().flat_size());
  const model::LlmcHeader h = model::load_llmc_checkpoint(path, be.table(), flat.data());
  set_weights(be, flat);
  return h;
}

void init_from_hf(TrainBackend& be, const std::filesystem::path& path) {
  std::vector<float> flat(be.table().flat_size());
  model::load_gpt2_safetensors(path, be.table(), flat.data());
  set_weights(be, flat);
}

void save_hf(TrainBackend& be, const std::filesystem::path& path, bool write_file) {
  const HostState s = be.save_state();
  if (!write_file) return;
  model::save_gpt2_safetensors(path, be.table(), s.params.data(), DType::F32);
}

void save_llmc(TrainBackend& be, const std::filesystem::path& path, bool bf16, bool write_file) {
  const HostState s = be.save_state();
  if (!write_file) return;
  const std::vector<float>& src = bf16 || s.master.empty() ? s.params : s.master;
  model::save_llmc_checkpoint(path, be.table(), src.data(), bf16);
}

}  // namespace cutrain::train
