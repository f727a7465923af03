// @brief CPU tests of the attention launchers' shape checks: refused before anything reaches the device.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "kernels/attention.cuh"
#include "runtime/error.h"

using namespace cutrain;
using kernels::AttentionShape;

namespace {

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    FAIL() << "accepted; expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(AttentionShapes, RejectsUnsupportedHeadDim) {
  const AttentionShape sh{1, 8, 1, 96, false};
  expect_error([&] { kernels::attention_forward<bf16>(nullptr, nullptr, nullptr, nullptr, sh); },
               "attention_forward: head_dim must be 64 or 128, got 96");
  expect_error([&] { kernels::attention_backward_scratch_bytes(sh, true); }, "head_dim must be 64 or 128, got 96");
}

TEST(AttentionShapes, RejectsEmptySequenceAndNullPointers) {
  expect_error([&] { kernels::attention_forward<bf16>(nullptr, nullptr, nullptr, nullptr, AttentionShape{1, 0, 1, 64}); },
               "seq=0");
  expect_error([&] { kernels::attention_forward<bf16>(nullptr, nullptr, nullptr, nullptr, AttentionShape{1, 4, 1, 64}); },
               "must be non-null");
}

TEST(AttentionShapes, RejectsDropoutOutsideZeroOne) {
  const AttentionShape sh{1, 8, 1, 64, false};
  for (float p : {1.f, -0.1f, 1.5f, std::nanf("")}) {
    kernels::AttentionOptions o;
    o.dropout_p = p;
    expect_error([&] { kernels::attention_forward<bf16>(nullptr, nullptr, nullptr, nullptr, sh, o); },
                 "options.dropout_p must lie in [0, 1)");
    expect_error([&] { kernels::attention_backward<bf16>(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                                         sh, true, o); },
                 "options.dropout_p must lie in [0, 1)");
  }
}

TEST(AttentionShapes, FlopsAndScratch) {
  const AttentionShape sh{4, 512, 16, 64, false};
  EXPECT_DOUBLE_EQ(kernels::attention_forward_flops(sh), 4.0 * 4 * 16 * 512.0 * 512 * 64);
  EXPECT_DOUBLE_EQ(kernels::attention_backward_flops(sh), 2.5 * kernels::attention_forward_flops(sh));
  AttentionShape c = sh;
  c.causal = true;
  EXPECT_DOUBLE_EQ(kernels::attention_forward_flops(c), kernels::attention_forward_flops(sh) / 2);
  // Dvec: one fp32 per (batch, head, row); O(B*H*S), never S x S.
  EXPECT_GE(kernels::attention_backward_scratch_bytes(sh, true), 4u * 16 * 512 * 4);
  EXPECT_LT(kernels::attention_backward_scratch_bytes(sh, true), 4u * 16 * 512 * 4 + 256);
  // Fast mode adds the fp32 dQ accumulator, B*S*H*D.
  EXPECT_EQ(kernels::attention_backward_scratch_bytes(sh, false),
            kernels::attention_backward_scratch_bytes(sh, true) + 4u * 512 * 16 * 64 * 4);
}

}  // namespace
