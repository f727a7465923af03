# kernels/gemm: the cuBLASLt wrapper (gemm.cu) and the deterministic bias-gradient reduction (bias_grad.cu).
cutrain_add_kernel(gemm SOURCES ${CMAKE_CURRENT_LIST_DIR}/gemm.cu ${CMAKE_CURRENT_LIST_DIR}/bias_grad.cu
                   LIBS CUDA::cublasLt)
