// @brief What every test shares: the GPU skip, fresh random inputs, relative error, poisoning,
// and a small device array for tests (tests do not depend on the caching allocator).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/check.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/error.h"

// Skips the current test, with the runtime's reason, when no CUDA device is usable.
#define CUTRAIN_REQUIRE_GPU()                                                  \
  do {                                                                         \
    std::string cutrain_why_;                                                  \
    if (!::cutrain::gpu_available(&cutrain_why_))                              \
      GTEST_SKIP() << "no CUDA device (" << cutrain_why_ << "): GPU test skipped"; \
  } while (0)

namespace cutrain::test {

// A generator seeded from std::random_device: fresh inputs every run. The seed is logged via
// RecordProperty and printed, so a failure can be replayed with CUTRAIN_TEST_SEED=<seed>.
std::mt19937_64 fresh_rng();

std::vector<float> random_normal(std::size_t n, std::mt19937_64& rng, float mean = 0.f, float stddev = 1.f);
std::vector<float> random_uniform(std::size_t n, std::mt19937_64& rng, float lo, float hi);
std::vector<int32_t> random_ints(std::size_t n, std::mt19937_64& rng, int32_t lo, int32_t hi_inclusive);

std::vector<bf16> to_bf16(const std::vector<float>& v);
std::vector<float> to_float(const std::vector<bf16>& v);
// Rounds every element through bf16 (so a CPU reference sees exactly the GPU's inputs).
std::vector<float> round_bf16(std::vector<float> v);
// The same for fp16, and by storage type T (bf16 or fp16) for tests of both instances of a kernel.
std::vector<f16> to_f16(const std::vector<float>& v);
std::vector<float> to_float(const std::vector<f16>& v);
std::vector<float> round_f16(std::vector<float> v);
template <typename T>
std::vector<T> to_storage(const std::vector<float>& v) {
  if constexpr (std::is_same_v<T, f16>) return to_f16(v);
  else return to_bf16(v);
}
template <typename T>
std::vector<float> round_to(std::vector<float> v) {
  if constexpr (std::is_same_v<T, f16>) return round_f16(std::move(v));
  else return round_bf16(std::move(v));
}
// The raw bits of each element of a 16-bit host array (bit-exact comparisons).
template <typename T>
std::vector<std::uint16_t> bits16(const std::vector<T>& v) {
  std::vector<std::uint16_t> b(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) b[i] = cutrain::bits(v[i]);
  return b;
}

// ||out - ref|| / ||ref|| in double; NaN/Inf anywhere in `out` gives +inf.
double rel_error(const float* out, const double* ref, std::size_t n);
// The population standard deviation of x[0, n) (fp64 sums): what an init rule's spread is checked by.
double stdev(const float* x, std::size_t n);
double rel_error(const std::vector<float>& out, const std::vector<double>& ref);
double rel_error(const std::vector<float>& out, const std::vector<float>& ref);
// Distance in bf16 ulps between two bf16 values held as floats (monotone ordering of the bits).
int bf16_ulps(float a, float b);
// The optimizers' bf16 tolerance where an update cancels (a moment beta*m + (1-beta)*g far smaller
// than its terms, seen on the H200 as 12 ulps at |m| ~ 1e-10): the kernel's fmaf chain and the
// reference's rounding order legitimately differ by more ulps of the small result, so such an
// element passes within 2^-8 of the RMS of `want` (over the elements `mask` keeps; all if empty).
double bf16_cancellation_floor(const std::vector<float>& want, const std::vector<bool>& mask = {});
// Count of elements that are NaN (a poisoned bf16/fp32 output that was never written stays NaN).
std::size_t count_nan(const std::vector<float>& v);

// Device memory for tests: cudaMalloc'd, poisoned with 0xFF bytes (NaN in bf16 and fp32).
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(std::size_t n) : n_(n) {
    if (n) CUTRAIN_CUDA_CHECK(cudaMalloc(&p_, n * sizeof(T)));
    poison();
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  ~DeviceArray() {
    if (p_) cudaFree(p_);
  }
  DeviceArray(DeviceArray&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return p_; }
  std::size_t size() const { return n_; }
  // Synchronous: cudaMemset runs on the legacy default stream, which does not order against
  // non-blocking streams, so without the sync a later copy on such a stream could race it.
  void poison() {
    if (!n_) return;
    CUTRAIN_CUDA_CHECK(cudaMemset(p_, 0xFF, n_ * sizeof(T)));
    CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
  }
  void upload(const std::vector<T>& host) {
    CUTRAIN_CHECK(host.size() == n_, "upload of ", host.size(), " elements into ", n_);
    if (n_) CUTRAIN_CUDA_CHECK(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
    if (n_) CUTRAIN_CUDA_CHECK(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

// Downloads a bf16 (fp16) device array as floats.
std::vector<float> download_float(const DeviceArray<bf16>& a);
std::vector<float> download_float(const DeviceArray<f16>& a);

// The message of the cutrain::Error that f() throws; "" when it throws none.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A loopback TCP port that is free now: the kernel's pick for a socket bound to port 0, closed
// again. Tests that start a rendezvous take it instead of a number of their own, which another
// process's outgoing connection may hold (ports of the ephemeral range).
int free_tcp_port();

}  // namespace cutrain::test
