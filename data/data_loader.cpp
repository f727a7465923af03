#include "data/data_loader.h"

#include "runtime/error.h"

namespace cutrain::data {

DataLoader::DataLoader(SamplerOptions options, HostBatchBuffers buffers, int64_t first_step)
    : sampler_(std::move(options)), buffers_(buffers), next_fill_(first_step), next_consume_(first_step) {
  CUTRAIN_CHECK(first_step >= 0, "data loader: first_step must be >= 0, got ", first_step);
  for (int k = 0; k < 2; ++k)
    CUTRAIN_CHECK(buffers_.inputs[k] && buffers_.targets[k], "data loader: host buffer slot ", k,
                  " is null (expected two slots of inputs and targets, B*T int32 each)");
  start();
}

DataLoader::~DataLoader() { stop(); }

void DataLoader::start() {
  stop_ = false;
  thread_ = std::thread([this] { produce(); });
}

void DataLoader::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

// Step s goes to slot s % 2. A slot is refilled only once it is neither ready nor held.
void DataLoader::produce() {
  try {
    for (;;) {
      int64_t step;
      int slot;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] {
          const int k = static_cast<int>(next_fill_ % 2);
          return stop_ || (!ready_[k] && held_ != k);
        });
        if (stop_) return;
        step = next_fill_;
        slot = static_cast<int>(step % 2);
      }
      // Outside the lock: the consumer may read the other slot meanwhile.
      sampler_.fill(step, buffers_.inputs[slot], buffers_.targets[slot]);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ready_[slot] = true;
        ++next_fill_;
      }
      cv_.notify_all();
    }
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = std::current_exception();
    }
    cv_.notify_all();
  }
}

Batch DataLoader::next() {
  std::unique_lock<std::mutex> lock(mutex_);
  held_ = -1;  // the previous batch goes back to the producer
  cv_.notify_all();
  const int slot = static_cast<int>(next_consume_ % 2);
  cv_.wait(lock, [&] { return ready_[slot] || error_; });
  if (!ready_[slot]) std::rethrow_exception(error_);
  ready_[slot] = false;
  held_ = slot;
  const int64_t step = next_consume_++;
  return {buffers_.inputs[slot], buffers_.targets[slot], step, step / sampler_.batches_per_epoch()};
}

void DataLoader::reset(int64_t first_step) {
  CUTRAIN_CHECK(first_step >= 0, "data loader: first_step must be >= 0, got ", first_step);
  stop();
  ready_[0] = ready_[1] = false;
  held_ = -1;
  next_fill_ = next_consume_ = first_step;
  error_ = nullptr;
  start();
}

}  // namespace cutrain::data
