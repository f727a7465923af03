// @brief Where a linear layer's bias gradient db[N] = Σ_rows dy[M,N] is computed: in the epilogue of
// the weight-gradient GEMM (cuBLASLt's BGRADB, which reduces the dy it already streams) or by
// kernels::bias_grad after the GEMM (one more read of dy). Host-only and constexpr, so the CPU tests
// check it and the models ask it before naming their timing regions.
//
// The rule is measured once, per shape, by bench_gemm's rows gemm/wgrad_bgradb/MxNxK (the epilogue)
// against gemm/wgrad+bias_grad/MxNxK (the kernel) (docs/perf-notes.md, "GEMMs and the bias gradient"): at M =
// 2048 the fused GEMM won at N = 1024 (K 1024 and 4096), tied at N = 3072 and lost at N = 4096,
// 50000 and at 16384x4096x4096 (the BGRADB algorithms are not the plain GEMM's). A shape where it
// loses takes the kernel. No flag or environment variable changes it.
#pragma once

namespace cutrain::kernels {

// Widest N (output features) whose bias gradient the epilogue computes.
inline constexpr int kBiasGradEpilogueMaxN = 1024;

// Whether the measured rule puts db of an M x N x K weight gradient in the GEMM's epilogue.
constexpr bool bias_grad_epilogue_wins([[maybe_unused]] int M, int N, [[maybe_unused]] int K) {
  return N > 0 && N <= kBiasGradEpilogueMaxN;
}

// Whether Gemm::grad_weight_bias (BiasGradPath::Measured) asks cuBLASLt for the fused epilogue:
// the rule, and no accumulation (the epilogue writes db, it cannot add to it). cuBLASLt may still
// refuse (db's alignment or type, no algorithm): the call then falls back to the GEMM plus
// kernels::bias_grad and counts it in Gemm::fallback_count().
constexpr bool bias_grad_in_epilogue(int M, int N, int K, bool accumulate) {
  return !accumulate && bias_grad_epilogue_wins(M, N, K);
}

}  // namespace cutrain::kernels
