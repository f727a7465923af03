// @brief The measured rule of kernels/gemm_bias_grad_rule.h on the CPU: which of the models' linear
// layers take their bias gradient from the weight-gradient GEMM's epilogue (docs/perf-notes.md,
// "GEMMs and the bias gradient"), and that accumulation never does.
#include <gtest/gtest.h>

#include "kernels/gemm_bias_grad_rule.h"

using cutrain::kernels::bias_grad_epilogue_wins;
using cutrain::kernels::bias_grad_in_epilogue;
using cutrain::kernels::kBiasGradEpilogueMaxN;

// Usable where the models decide at compile time too.
static_assert(bias_grad_in_epilogue(2048, 1024, 1024, false));
static_assert(!bias_grad_in_epilogue(2048, 1024, 1024, true));

TEST(GemmBiasGradRule, BF16ExampleLayers) {
  // M = 2048 tokens (batch 4 x 512): out_proj and fc2 won in the epilogue; qkv tied, fc1 lost.
  EXPECT_TRUE(bias_grad_in_epilogue(2048, 1024, 1024, false)) << "out_proj";
  EXPECT_TRUE(bias_grad_in_epilogue(2048, 1024, 4096, false)) << "fc2";
  EXPECT_FALSE(bias_grad_in_epilogue(2048, 3072, 1024, false)) << "qkv";
  EXPECT_FALSE(bias_grad_in_epilogue(2048, 4096, 1024, false)) << "fc1";
  EXPECT_FALSE(bias_grad_in_epilogue(2048, 50000, 1024, false)) << "the vocabulary head";
}

TEST(GemmBiasGradRule, Gpt2Layers) {
  // M = 16384 tokens, h 768: c_attn's proj and c_fc's proj (N = 768) in the epilogue.
  EXPECT_TRUE(bias_grad_in_epilogue(16384, 768, 768, false)) << "attn.c_proj";
  EXPECT_TRUE(bias_grad_in_epilogue(16384, 768, 3072, false)) << "mlp.c_proj";
  EXPECT_FALSE(bias_grad_in_epilogue(16384, 2304, 768, false)) << "attn.c_attn";
  EXPECT_FALSE(bias_grad_in_epilogue(16384, 3072, 768, false)) << "mlp.c_fc";
}

TEST(GemmBiasGradRule, AccumulationAndTheBoundary) {
  for (int N : {1, 13, 768, kBiasGradEpilogueMaxN}) {
    EXPECT_TRUE(bias_grad_epilogue_wins(64, N, 64)) << N;
    EXPECT_FALSE(bias_grad_in_epilogue(64, N, 64, true)) << N << ": the epilogue writes db, it cannot add";
  }
  EXPECT_FALSE(bias_grad_epilogue_wins(64, kBiasGradEpilogueMaxN + 1, 64));
  EXPECT_FALSE(bias_grad_epilogue_wins(64, 0, 64));
}
