# kernels/gemm: CPU checks of the references, GPU checks of the wrapper and bias_grad against them.
cutrain_add_test(NAME test_gemm_ref LABEL cpu SOURCES ${CMAKE_CURRENT_LIST_DIR}/unit/test_gemm_ref.cpp
                 LIBS cutrain_reference)
cutrain_add_test(NAME test_gemm_gpu LABEL gpu SOURCES ${CMAKE_CURRENT_LIST_DIR}/gpu/test_gemm_gpu.cpp
                 LIBS cutrain_kernel_gemm cutrain_reference)
