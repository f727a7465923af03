#include "train/checkpoint_writer.h"

#include <cuda_runtime.h>

#include <chrono>

#include "runtime/check.h"
#include "runtime/device.h"
#include "runtime/error.h"

namespace cutrain::train {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

CheckpointWriter::CheckpointWriter(CheckpointWriterOptions options) : opt_(std::move(options)) {
  snap_.pinned = gpu_available();
  if (snap_.pinned) CUTRAIN_CUDA_CHECK(cudaGetDevice(&device_));
}

CheckpointWriter::~CheckpointWriter() {
  if (worker_.joinable()) worker_.join();
}

bool CheckpointWriter::in_flight() const { return worker_.joinable() && !done_.load(std::memory_order_acquire); }

void CheckpointWriter::collect() {
  if (!worker_.joinable() || !done_.load(std::memory_order_acquire)) return;
  worker_.join();
  finished_.push_back(std::move(running_));
  running_ = {};
}

void CheckpointWriter::wait() {
  if (!worker_.joinable()) return;
  worker_.join();
  finished_.push_back(std::move(running_));
  running_ = {};
}

std::vector<SaveOutcome> CheckpointWriter::take_finished() {
  collect();
  std::vector<SaveOutcome> out;
  out.swap(finished_);
  return out;
}

void CheckpointWriter::prepare(const TrainBackend& be) {
  wait();
  be.snapshot_state(snap_);
}

void CheckpointWriter::save(const TrainBackend& be, const CheckpointMeta& meta) {
  // The snapshot's storage is the previous save's until its write ends.
  const auto t0 = std::chrono::steady_clock::now();
  wait();
  SaveOutcome o;
  o.step = meta.step;
  o.wait_s = seconds_since(t0);
  const auto t1 = std::chrono::steady_clock::now();
  be.snapshot_state(snap_);  // every rank: a collective under ZeRO
  o.snapshot_s = seconds_since(t1);
  if (!opt_.write_files) return;
  if (!table_) table_.emplace(be.table().dims());
  if (!opt_.async) {
    const auto t2 = std::chrono::steady_clock::now();
    o.report = write_checkpoint(opt_.root, *table_, snap_, meta, {opt_.io, true, opt_.keep_last, opt_.handle});
    o.write_s = seconds_since(t2);
    o.ok = true;
    finished_.push_back(std::move(o));
    return;
  }
  o.background = true;
  running_ = std::move(o);
  done_.store(false);
  worker_ = std::thread([this, meta] {
    const auto t2 = std::chrono::steady_clock::now();
    try {
      // The aio engine's pinned staging comes from the caller's device.
      if (device_ >= 0) CUTRAIN_CUDA_CHECK(cudaSetDevice(device_));
      running_.report = write_checkpoint(opt_.root, *table_, snap_, meta, {opt_.io, true, opt_.keep_last, opt_.handle});
      running_.ok = true;
    } catch (const Error& e) {
      running_.error = e.message();
    } catch (const std::exception& e) {
      running_.error = e.what();
    }
    running_.write_s = seconds_since(t2);
    done_.store(true, std::memory_order_release);
  });
}

}  // namespace cutrain::train
