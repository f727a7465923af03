# k3: cross-entropy, AdamW, grad norm (references on the CPU; kernels on the GPU).
cutrain_add_test(NAME test_k3_reference LABEL cpu SOURCES unit/test_k3_reference.cpp LIBS cutrain_reference)
cutrain_add_test(NAME test_cross_entropy_gpu LABEL gpu SOURCES gpu/test_cross_entropy_gpu.cpp
                 LIBS cutrain_kernel_cross_entropy cutrain_reference)
cutrain_add_test(NAME test_adamw_gpu LABEL gpu SOURCES gpu/test_adamw_gpu.cpp
                 LIBS cutrain_kernel_adamw cutrain_kernel_reduce cutrain_reference)
cutrain_add_test(NAME test_reduce_gpu LABEL gpu SOURCES gpu/test_reduce_gpu.cpp LIBS cutrain_kernel_reduce cutrain_reference)
