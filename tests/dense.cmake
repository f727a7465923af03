# Tests of the dense kernels (layernorm, gelu, embedding) and their CPU references.
cutrain_add_test(NAME test_dense_ref LABEL cpu SOURCES unit/test_dense_ref.cpp LIBS cutrain_reference)
cutrain_add_test(NAME test_layernorm_gpu LABEL gpu SOURCES gpu/test_layernorm_gpu.cpp
                 LIBS cutrain_reference cutrain_kernel_layernorm)
cutrain_add_test(NAME test_gelu_gpu LABEL gpu SOURCES gpu/test_gelu_gpu.cpp LIBS cutrain_reference cutrain_kernel_gelu)
cutrain_add_test(NAME test_embedding_gpu LABEL gpu SOURCES gpu/test_embedding_gpu.cpp
                 LIBS cutrain_reference cutrain_kernel_embedding)
