// @brief CPU references (fp64 accumulation) for kernels/gemm: forward with its epilogues (tanh
// GELU), grad_input (beta, DGELU), grad_weight (accumulate) and bias_grad. All row-major, PyTorch
// layouts as in kernels/gemm.cuh; inputs are floats already rounded to what the GPU sees.
#pragma once

#include <vector>

namespace cutrain::ref {

// The tanh approximation of GELU (cuBLASLt's GELU epilogue) and its derivative.
double epilogue_gelu_tanh(double x);
double epilogue_gelu_tanh_grad(double x);

// y[M,N] = x[M,K]·W[N,K]ᵀ (+ bias[N] when non-null); gelu: y = epilogue_gelu_tanh(pre), and `pre_out`
// (when non-null) receives pre = x·Wᵀ + bias.
std::vector<double> gemm_forward(const std::vector<float>& x, const std::vector<float>& w, const float* bias, int M,
                                 int N, int K, bool gelu = false, std::vector<double>* pre_out = nullptr);

// dx[M,K] = dy[M,N]·W[N,K] + beta·dx_init (dx_init may be null: 0); with dgelu_aux non-null the
// product is multiplied by gelu_tanh'(aux[M,K]) (before beta·dx_init is added).
std::vector<double> gemm_grad_input(const std::vector<float>& dy, const std::vector<float>& w, int M, int N, int K,
                                    double beta = 0.0, const std::vector<float>* dx_init = nullptr,
                                    const std::vector<float>* dgelu_aux = nullptr);

// dW[N,K] = dy[M,N]ᵀ·x[M,K] (+ dw_init when non-null).
std::vector<double> gemm_grad_weight(const std::vector<float>& dy, const std::vector<float>& x, int M, int N, int K,
                                     const std::vector<float>* dw_init = nullptr);

// db[N] = Σ_rows dy[M,N] (+ db_init when non-null).
std::vector<double> bias_grad(const std::vector<float>& dy, int M, int N, const std::vector<float>* db_init = nullptr);

}  // namespace cutrain::ref
