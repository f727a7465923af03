# bench_gemm: the cuBLASLt wrapper vs raw cuBLASLt, fused bias-gradient epilogues vs bias_grad.
cutrain_add_bench(NAME bench_gemm SOURCES ${CMAKE_CURRENT_LIST_DIR}/bench_gemm.cu LIBS cutrain_kernel_gemm cutrain_kernel_gelu CUDA::cublasLt)
