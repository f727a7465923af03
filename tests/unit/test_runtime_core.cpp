// CPU tests of the runtime core: errors, check macros, bf16 conversions, NVTX paths.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <unistd.h>

#include "runtime/check.h"
#include "runtime/dtype.h"
#include "runtime/nvtx.h"

using namespace cutrain;

TEST(Error, CarriesMessageFileAndLine) {
  try {
    CUTRAIN_CHECK(1 + 1 == 3, "arithmetic is broken: ", 2, " != ", 3);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "arithmetic is broken: 2 != 3");
    // The user-facing text has no source location; the object keeps it.
    EXPECT_EQ(std::string(e.what()), e.message());
    EXPECT_NE(e.location().find("test_runtime_core.cpp:"), std::string::npos) << e.location();
    EXPECT_NE(std::string(e.file()).find("test_runtime_core.cpp"), std::string::npos) << e.file();
    EXPECT_EQ(e.location().substr(e.location().rfind(':') + 1), std::to_string(e.line()));
    EXPECT_GT(e.line(), 0);
  }
}

TEST(Error, CudaCheckNamesExpressionAndLibraryMessage) {
  try {
    CUTRAIN_CUDA_CHECK(cudaErrorInvalidValue);
    FAIL() << "no throw";
  } catch (const Error& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("cudaErrorInvalidValue"), std::string::npos) << w;
    EXPECT_NE(w.find("invalid argument"), std::string::npos) << w;
    EXPECT_EQ(w.find(".cpp:"), std::string::npos) << w;
    EXPECT_NE(e.location().find("test_runtime_core.cpp:"), std::string::npos) << e.location();
  }
}

TEST(Error, CudaOutOfMemoryIsItsOwnType) {
  EXPECT_THROW(CUTRAIN_CUDA_CHECK(cudaErrorMemoryAllocation), OutOfMemoryError);
}

TEST(Error, CublasCheckGivesStatusName) {
  try {
    CUTRAIN_CUBLAS_CHECK(CUBLAS_STATUS_NOT_SUPPORTED);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUBLAS_STATUS_NOT_SUPPORTED"), std::string::npos) << e.what();
  }
}

TEST(Error, SysCheckGivesErrno) {
  errno = 0;
  try {
    CUTRAIN_SYS_CHECK(::close(-1));
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Bad file descriptor"), std::string::npos) << e.what();
  }
}

TEST(Bf16, RoundToNearestEvenMatchesDefinition) {
  // 1 + 2^-8 is exactly halfway between bf16(1) and the next value: ties to even -> 1.
  EXPECT_EQ(f32_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd mantissa) and 1+2^-6: ties to even -> up.
  EXPECT_EQ(f32_to_bf16_bits(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_EQ(bf16_bits_to_f32(0x3F80), 1.0f);
  EXPECT_TRUE(std::isnan(bf16_bits_to_f32(f32_to_bf16_bits(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(f32_to_bf16_bits(std::numeric_limits<float>::infinity()), 0x7F80);
  for (float f : {0.1f, -3.75f, 1e-30f, 65504.f, 3.0e38f}) {
    float r = round_bf16(f);
    EXPECT_LE(std::fabs(r - f), std::fabs(f) * std::ldexp(1.0f, -8)) << f;
  }
}

TEST(Bf16, HostConversionMatchesCudaHeader) {
  for (float f : {0.3f, -1.7e-3f, 12345.678f, 7.0e-39f}) {
    EXPECT_EQ(bits(to_bf16(f)), bits(__float2bfloat16_rn(f))) << f;
  }
}

TEST(Nvtx, HierarchicalNames) {
  EXPECT_EQ(NvtxRange::current_path(), "");
  {
    NvtxRange a("step");
    {
      NvtxRange b("fwd");
      NvtxRange c("layer03");
      EXPECT_EQ(NvtxRange::current_path(), "step/fwd/layer03");
    }
    EXPECT_EQ(NvtxRange::current_path(), "step");
  }
  EXPECT_EQ(NvtxRange::current_path(), "");
}
