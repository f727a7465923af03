// GPU tests of the device helpers: properties, streams, events.
#include <gtest/gtest.h>

#include "runtime/device.h"
#include "tests/support/test_support.h"

using namespace cutrain;

TEST(DeviceGpu, PropertiesAreSane) {
  CUTRAIN_REQUIRE_GPU();
  DeviceInfo d = device_info();
  EXPECT_GT(d.sm_count, 0);
  EXPECT_GT(d.total_mem, d.free_mem / 2);
  EXPECT_GT(d.l2_bytes, 0u);
  EXPECT_FALSE(describe(d).empty());
}

TEST(DeviceGpu, EventsTimeStreamWork) {
  CUTRAIN_REQUIRE_GPU();
  Stream s;
  Event a, b;
  test::DeviceArray<float> buf(1 << 24);
  a.record(s);
  CUTRAIN_CUDA_CHECK(cudaMemsetAsync(buf.get(), 0, buf.size() * sizeof(float), s));
  b.record(s);
  b.synchronize();
  EXPECT_TRUE(b.query());
  EXPECT_GE(b.elapsed_ms(a), 0.f);
}
