cutrain_add_kernel(layernorm SOURCES ${CMAKE_CURRENT_LIST_DIR}/layernorm.cu ${CMAKE_CURRENT_LIST_DIR}/layernorm_bwd.cu)
