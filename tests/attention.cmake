# Attention: the CPU reference's own test, and the kernels against naive GPU + CPU references.
cutrain_add_test(NAME test_attention_ref LABEL cpu SOURCES unit/test_attention_ref.cpp LIBS cutrain_reference)
cutrain_add_test(NAME test_attention_gpu LABEL gpu
  SOURCES gpu/test_attention_gpu.cpp gpu/attention_naive.cu
  LIBS cutrain_kernel_attention cutrain_reference)
cutrain_add_test(NAME test_attention_shapes LABEL cpu SOURCES unit/test_attention_shapes.cpp
  LIBS cutrain_kernel_attention)
# The environment variable picks the attention kernel variant (read once, at first use).
if(TARGET test_attention_shapes)
  add_test(NAME attention_variant_from_env
    COMMAND test_attention_shapes --gtest_filter=AttentionVariants.FromEnvironmentOrDefault)
  set_tests_properties(attention_variant_from_env PROPERTIES LABELS cpu ENVIRONMENT CUTRAIN_ATTN_VARIANT=v2_m128)
endif()
