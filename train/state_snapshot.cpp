#include "train/state_snapshot.h"

#include <cstring>

#include "runtime/device.h"
#include "runtime/error.h"
#include "train/train_backend.h"

namespace cutrain::train {

void* SnapshotTensor::reserve(DType dtype, std::size_t numel, bool pinned) {
  const std::size_t bytes = numel * dtype_size(dtype);
  dtype_ = dtype;
  numel_ = numel;
  if (pinned) {
    if (pinned_.bytes() < bytes) {
      pinned_.reset();  // back to the allocator's cache first: a larger block may reuse it
      pinned_ = Buffer(pinned_allocator(), bytes);
    }
    data_ = pinned_.get();
  } else {
    if (plain_.size() < bytes) plain_.resize(bytes);
    data_ = plain_.data();
  }
  return data_;
}

namespace {

void put(SnapshotTensor& t, const std::vector<float>& v, DType dtype, bool pinned) {
  if (v.empty()) {
    t.clear();
    return;
  }
  void* dst = t.reserve(dtype, v.size(), pinned);
  if (dtype == DType::F32) {
    std::memcpy(dst, v.data(), v.size() * 4);
    return;
  }
  CUTRAIN_CHECK(dtype == DType::BF16 || dtype == DType::F16, "state snapshot: expected an F32, BF16 or F16 state, found ",
                dtype_name(dtype));
  auto* b = static_cast<std::uint16_t*>(dst);
  if (dtype == DType::F16)
    for (std::size_t i = 0; i < v.size(); ++i) b[i] = bits(to_f16(v[i]));
  else
    for (std::size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16_bits(v[i]);
}

}  // namespace

std::vector<float> to_floats(const SnapshotTensor& t) {
  std::vector<float> v(t.numel());
  if (t.dtype() == DType::F32) {
    if (!v.empty()) std::memcpy(v.data(), t.data(), v.size() * 4);
    return v;
  }
  CUTRAIN_CHECK(t.dtype() == DType::BF16 || t.dtype() == DType::F16,
                "state snapshot: expected an F32, BF16 or F16 state, found ", dtype_name(t.dtype()));
  if (t.dtype() == DType::F16) {
    const auto* h = static_cast<const f16*>(t.data());
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = to_float(h[i]);
    return v;
  }
  const auto* b = static_cast<const std::uint16_t*>(t.data());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = bf16_bits_to_f32(b[i]);
  return v;
}

HostState host_state_from_snapshot(const StateSnapshot& s) {
  HostState h;
  h.params = to_floats(s.params);
  h.master = to_floats(s.master);
  h.exp_avg = to_floats(s.exp_avg);
  h.exp_avg_sq = to_floats(s.exp_avg_sq);
  h.compensation = to_floats(s.compensation);
  h.param_dtype = s.params.dtype();
  h.moment_dtype = s.exp_avg.dtype();
  return h;
}

void snapshot_from_host_state(const HostState& h, StateSnapshot& out) {
  put(out.params, h.params, h.param_dtype, out.pinned);
  put(out.master, h.master, DType::F32, out.pinned);
  put(out.exp_avg, h.exp_avg, h.moment_dtype, out.pinned);
  put(out.exp_avg_sq, h.exp_avg_sq, h.moment_dtype, out.pinned);
  put(out.compensation, h.compensation, DType::BF16, out.pinned);
}

}  // namespace cutrain::train
