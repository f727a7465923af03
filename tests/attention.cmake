# Attention: the CPU reference's own test, and the kernels against naive GPU + CPU references.
cutrain_add_test(NAME test_attention_ref LABEL cpu SOURCES unit/test_attention_ref.cpp LIBS cutrain_reference)
cutrain_add_test(NAME test_attention_gpu LABEL gpu
  SOURCES gpu/test_attention_gpu.cpp gpu/attention_naive.cu
  LIBS cutrain_kernel_attention cutrain_reference)
cutrain_add_test(NAME test_attention_shapes LABEL cpu SOURCES unit/test_attention_shapes.cpp
  LIBS cutrain_kernel_attention)
