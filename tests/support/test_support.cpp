#include "tests/support/test_support.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <iostream>

namespace cutrain::test {

std::mt19937_64 fresh_rng() {
  std::uint64_t seed;
  if (const char* s = std::getenv("CUTRAIN_TEST_SEED")) {
    seed = std::strtoull(s, nullptr, 10);
  } else {
    std::random_device rd;
    seed = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  }
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  std::cout << "[ seed     ] CUTRAIN_TEST_SEED=" << seed << "\n";
  return std::mt19937_64(seed);
}

std::vector<float> random_normal(std::size_t n, std::mt19937_64& rng, float mean, float stddev) {
  std::normal_distribution<float> d(mean, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<float> random_uniform(std::size_t n, std::mt19937_64& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<int32_t> random_ints(std::size_t n, std::mt19937_64& rng, int32_t lo, int32_t hi) {
  std::uniform_int_distribution<int32_t> d(lo, hi);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = cutrain::to_bf16(v[i]);
  return r;
}

std::vector<float> to_float(const std::vector<bf16>& v) {
  std::vector<float> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = cutrain::to_float(v[i]);
  return r;
}

std::vector<f16> to_f16(const std::vector<float>& v) {
  std::vector<f16> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = cutrain::to_f16(v[i]);
  return r;
}

std::vector<float> to_float(const std::vector<f16>& v) {
  std::vector<float> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = cutrain::to_float(v[i]);
  return r;
}

std::vector<float> round_f16(std::vector<float> v) {
  for (auto& x : v) x = cutrain::round_f16(x);
  return v;
}

std::vector<float> round_bf16(std::vector<float> v) {
  for (auto& x : v) x = cutrain::round_bf16(x);
  return v;
}

double stdev(const float* x, std::size_t n) {
  double s = 0, s2 = 0;
  for (std::size_t i = 0; i < n; ++i) {
    s += x[i];
    s2 += double(x[i]) * x[i];
  }
  const double m = s / double(n);
  return std::sqrt(s2 / double(n) - m * m);
}

double rel_error(const float* out, const double* ref, std::size_t n) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    double d = static_cast<double>(out[i]) - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  if (den == 0) return num == 0 ? 0.0 : INFINITY;
  return std::sqrt(num / den);
}

double rel_error(const std::vector<float>& out, const std::vector<double>& ref) {
  EXPECT_EQ(out.size(), ref.size());
  return rel_error(out.data(), ref.data(), std::min(out.size(), ref.size()));
}

int bf16_ulps(float a, float b) {
  auto ord = [](float f) {
    const int bits = f32_to_bf16_bits(f);
    return (bits & 0x8000) ? -(bits & 0x7fff) : bits;
  };
  return std::abs(ord(a) - ord(b));
}

double bf16_cancellation_floor(const std::vector<float>& want, const std::vector<bool>& mask) {
  double ss = 0;
  std::size_t n = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    if (mask.empty() || mask[i]) {
      ss += double(want[i]) * want[i];
      ++n;
    }
  return std::ldexp(std::sqrt(ss / double(std::max<std::size_t>(1, n))), -8);
}

double rel_error(const std::vector<float>& out, const std::vector<float>& ref) {
  std::vector<double> r(ref.begin(), ref.end());
  return rel_error(out, r);
}

std::size_t count_nan(const std::vector<float>& v) {
  std::size_t c = 0;
  for (float x : v) c += std::isnan(x);
  return c;
}

std::vector<float> download_float(const DeviceArray<bf16>& a) { return to_float(a.download()); }
std::vector<float> download_float(const DeviceArray<f16>& a) { return to_float(a.download()); }

int free_tcp_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  CUTRAIN_CHECK(fd >= 0, "free_tcp_port: socket failed");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(fd);
  CUTRAIN_CHECK(ok, "free_tcp_port: no loopback port could be bound");
  return ntohs(a.sin_port);
}

}  // namespace cutrain::test
