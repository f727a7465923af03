// @brief What each kernel call of a training step must compute and move (FLOPs, bytes), from the
// model's shapes: the numbers the timing report turns into achieved TFLOP/s and GB/s. Minimal
// traffic: every operand read once and every output written once (a kernel that re-reads moves
// more than this and shows up with a lower GB/s). Memory-bound kernels declare bytes only (their
// arithmetic is not tensor-core work and would only clutter the TFLOP/s column); GEMMs and
// attention declare both. Shapes follow kernels/*.cuh.
#pragma once

#include <cstddef>

namespace cutrain::model::cost {

struct Cost {
  double flops = 0;
  double bytes = 0;
};

inline double d(std::size_t v) { return static_cast<double>(v); }

// y[M,N] = x[M,K]·W[N,K]ᵀ (+ bias), bf16.
inline Cost gemm_forward(std::size_t M, std::size_t N, std::size_t K, bool bias = true) {
  return {2 * d(M) * d(N) * d(K), 2 * (d(M) * d(K) + d(N) * d(K) + d(M) * d(N)) + (bias ? 2 * d(N) : 0)};
}
// dx[M,K] = dy[M,N]·W[N,K] (+ dx when beta != 0).
inline Cost gemm_grad_input(std::size_t M, std::size_t N, std::size_t K, bool beta) {
  return {2 * d(M) * d(N) * d(K), 2 * (d(M) * d(N) + d(N) * d(K) + d(M) * d(K)) + (beta ? 2 * d(M) * d(K) : 0)};
}
// dW[N,K] (+)= dy[M,N]ᵀ·x[M,K]; dW of `dw_bytes` per element, read too when accumulating.
inline Cost gemm_grad_weight(std::size_t M, std::size_t N, std::size_t K, std::size_t dw_bytes, bool acc) {
  return {2 * d(M) * d(N) * d(K), 2 * (d(M) * d(N) + d(M) * d(K)) + d(N) * d(K) * d(dw_bytes) * (acc ? 2 : 1)};
}
// db[N] (+)= Σ_rows dy[M,N].
inline Cost bias_grad(std::size_t M, std::size_t N, std::size_t db_bytes, bool acc) {
  return {0, 2 * d(M) * d(N) + d(N) * d(db_bytes) * (acc ? 2 : 1)};
}
// dW[N,K] = dy[M,N]ᵀ·x[M,K] and db[N] = Σ_rows dy in one GEMM (the bias gradient in its epilogue:
// dy read once, nothing accumulated); dW and db of `g_bytes` per element.
inline Cost gemm_grad_weight_bias(std::size_t M, std::size_t N, std::size_t K, std::size_t g_bytes) {
  const Cost w = gemm_grad_weight(M, N, K, g_bytes, false);
  return {w.flops, w.bytes + d(N) * d(g_bytes)};
}
// Flash-style attention over qkv[B,S,3,H,D]: forward QKᵀ and PV (4·B·H·S²·D); backward recomputes
// QKᵀ and computes dV, dP, dQ, dK (10·B·H·S²·D). Causal masks halve both.
inline Cost attention_forward(std::size_t B, std::size_t S, std::size_t H, std::size_t D, bool causal) {
  const double tok = d(B) * d(S), f = 4 * d(B) * d(H) * d(S) * d(S) * d(D);
  return {causal ? f / 2 : f, 2 * tok * 3 * d(H) * d(D) + 2 * tok * d(H) * d(D) + 4 * d(B) * d(H) * d(S)};
}
inline Cost attention_backward(std::size_t B, std::size_t S, std::size_t H, std::size_t D, bool causal) {
  const double tok = d(B) * d(S), f = 10 * d(B) * d(H) * d(S) * d(S) * d(D);
  // reads qkv, out, dout, lse; writes dqkv
  return {causal ? f / 2 : f, 2 * tok * d(H) * d(D) * (3 + 1 + 1 + 3) + 4 * d(B) * d(H) * d(S)};
}
// out = LN(a + b): reads a, b, gamma, beta; writes the sum, out, mean, rstd.
inline Cost layernorm_residual_forward(std::size_t M, std::size_t h) {
  return {0, 2 * d(M) * d(h) * 4 + 8 * d(M) + 4 * d(h)};
}
// reads dy, x, mean, rstd, gamma; writes dx and dgamma, dbeta (read too when accumulating).
inline Cost layernorm_backward(std::size_t M, std::size_t h, std::size_t g_bytes, bool acc) {
  return {0, 2 * d(M) * d(h) * 3 + 8 * d(M) + 2 * d(h) + 2 * d(h) * d(g_bytes) * (acc ? 2 : 1)};
}
inline Cost gelu_forward(std::size_t n) { return {0, 4 * d(n)}; }
// Dropout over n bf16 elements (mask regenerated, not read): one read, one write.
inline Cost dropout(std::size_t n) { return {0, 4 * d(n)}; }
// out = residual + dropout(x + bias) over [M, h] bf16: x and residual read, out written, the bias.
inline Cost bias_dropout_residual(std::size_t M, std::size_t h) { return {0, 2 * d(M) * d(h) * 3 + 2 * d(h)}; }
inline Cost gelu_backward(std::size_t n) { return {0, 6 * d(n)}; }
// Fused softmax + loss + dlogits in place over logits[M,V]: one read, one write, the labels.
inline Cost cross_entropy(std::size_t M, std::size_t V) { return {0, 4 * d(M) * d(V) + 4 * d(M)}; }
// Token + position rows gathered and summed; backward scatters them into the tables.
// random-LTD: rows [B*K, h] bf16 gathered or scattered by int32 indices (with `add`: a second
// operand read); the bypass copy of the residual stream [M, h].
inline Cost token_move(std::size_t rows, std::size_t h, bool add = false) {
  return {0, 2 * d(rows) * d(h) * (add ? 3 : 2) + 4 * d(rows)};
}
// random-LTD's merge: M rows written, the M - kept bypassed rows and the kept rows (and their
// second operand) read, the indices.
inline Cost token_merge(std::size_t M, std::size_t kept, std::size_t h, bool add = false) {
  return {0, 2 * d(h) * (2 * d(M) + (add ? d(kept) : 0)) + 4 * d(M)};
}
inline Cost embedding_forward(std::size_t B, std::size_t S, std::size_t h) {
  return {0, 2 * d(B) * d(S) * d(h) * 2 + 2 * d(S) * d(h) + 4 * d(B) * d(S)};
}
inline Cost embedding_backward(std::size_t B, std::size_t S, std::size_t h, std::size_t g_bytes) {
  return {0, 2 * d(B) * d(S) * d(h) + 4 * d(B) * d(S) + 2 * d(B) * d(S) * d(h) * d(g_bytes)};
}
// Global gradient norm: one read of the flat gradients.
inline Cost grad_norm(std::size_t n, std::size_t g_bytes) { return {0, d(n) * d(g_bytes)}; }
// Adam(W) over the flat buffers: params bf16 and moments (and master, or the bf16 master's bf16
// compensation) read and written, grads read.
inline Cost adam_step(std::size_t n, std::size_t g_bytes, std::size_t moment_bytes, bool master,
                      bool compensation = false) {
  return {0, d(n) * (2 * 2 + d(g_bytes) + 2 * 2 * d(moment_bytes) + (master ? 8 : 0) + (compensation ? 4 : 0))};
}

// LAMB's two passes: pass 1 reads the gradient and the weight and r/w m, v; pass 2 reads the
// weight, m and v again and writes the weight (and the bf16 param beside an fp32 master).
inline Cost lamb_step(std::size_t n, std::size_t g_bytes, std::size_t moment_bytes, bool master,
                      bool compensation = false) {
  const double w = master ? 4 : 2;
  return {0, d(n) * (d(g_bytes) + w + 4 * d(moment_bytes) + w + 2 * d(moment_bytes) + w + (master ? 2 : 0) +
                     (compensation ? 6 : 0))};
}

// MoE (model/moe_layer.h), bf16 activations. The gate: logits = x·Wgᵀ in fp32 [T, E], then
// softmax, top-k and positions (the logits read, the probabilities written, the routes' expert,
// position and weight written); its backward: dlogits from the probabilities and the weights'
// gradient, then the GEMMs' dX (added into dx) and dWg (of `dw_bytes`, read too when accumulating).
inline Cost moe_gate_forward(std::size_t T, std::size_t h, std::size_t E, std::size_t k) {
  return {2 * d(T) * d(E) * d(h), 2 * (d(T) * d(h) + d(E) * d(h)) + 4 * d(T) * d(E) * 3 + 12 * d(T) * d(k)};
}
inline Cost moe_gate_backward(std::size_t T, std::size_t h, std::size_t E, std::size_t k, std::size_t dw_bytes,
                              bool acc) {
  return {4 * d(T) * d(E) * d(h), 4 * d(T) * d(E) + 12 * d(T) * d(k) + 2 * d(T) * d(E) * 3 + 2 * d(E) * d(h) +
                                      2 * d(T) * d(h) * 4 + d(E) * d(h) * d(dw_bytes) * (acc ? 2 : 1)};
}
// Rows of h bf16 between the tokens [T, h] and `rows` permuted rows (the [E, C] slots, the empty
// ones zeroed, or the packed kept rows), with the routes' int32 / fp32 words; the un-permutation's
// backward also reads the expert outputs for the weights' gradient.
inline Cost moe_permute(std::size_t T, std::size_t rows, std::size_t h, std::size_t k) {
  return {0, 2 * (d(T) + d(rows)) * d(h) + 8 * d(T) * d(k)};
}
inline Cost moe_unpermute(std::size_t T, std::size_t rows, std::size_t h, std::size_t k, bool backward) {
  return {0, 2 * (d(T) + d(rows) * (backward ? 2 : 1)) * d(h) + 12 * d(T) * d(k)};
}
// The experts' fc1 -> GELU -> fc2 over `rows` rows (E experts' weights, each read once per GEMM);
// the backward's weight and data gradients of both and GELU's backward.
inline Cost moe_experts_forward(std::size_t rows, std::size_t h, std::size_t f, std::size_t E) {
  const double R = d(rows), H = d(h), F = d(f), W = d(E) * H * F;
  return {4 * R * H * F, 2 * (R * H + W + R * F) + 4 * R * F + 2 * (R * F + W + R * H)};
}
inline Cost moe_experts_backward(std::size_t rows, std::size_t h, std::size_t f, std::size_t E, std::size_t dw_bytes,
                                 bool acc) {
  const double R = d(rows), H = d(h), F = d(f), W = d(E) * H * F, dw = W * d(dw_bytes) * (acc ? 2 : 1);
  return {8 * R * H * F, 2 * (R * H + R * F) + dw + 2 * (R * H + W + R * F) + 6 * R * F + 2 * (R * F + R * H) + dw +
                             2 * (R * F + W + R * H)};
}
// PR-MoE's residual branch: the dense MLP's two GEMMs and GELU, the mix's Linear(h, 2) and the mix;
// backward twice the GEMMs' FLOPs.
inline Cost moe_residual(std::size_t T, std::size_t h, std::size_t f, bool backward) {
  const double Tt = d(T), H = d(h), F = d(f);
  return {(backward ? 8 : 4) * Tt * H * F + (backward ? 8 : 4) * Tt * H,
          (backward ? 2 : 1) * (2 * (Tt * H + H * F + Tt * F) * 2 + 4 * Tt * F + 2 * Tt * H * 3)};
}

}  // namespace cutrain::model::cost
