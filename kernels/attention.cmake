# Flash-style attention (mma.sync tensor cores): forward, deterministic backward.
cutrain_add_kernel(attention SOURCES
  ${CMAKE_CURRENT_SOURCE_DIR}/attention.cu
  ${CMAKE_CURRENT_SOURCE_DIR}/attention_fwd.cu
  ${CMAKE_CURRENT_SOURCE_DIR}/attention_bwd.cu
  ${CMAKE_CURRENT_SOURCE_DIR}/attention_bwd_dq.cu
  ${CMAKE_CURRENT_SOURCE_DIR}/attention_bwd_dkdv.cu)
