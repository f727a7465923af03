# k3: cross-entropy, AdamW, grad norm (references on the CPU; kernels on the GPU).
cutrain_add_test(NAME test_k3_reference LABEL cpu SOURCES unit/test_k3_reference.cpp LIBS cutrain_reference)
