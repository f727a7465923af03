cutrain_add_kernel(gelu SOURCES ${CMAKE_CURRENT_LIST_DIR}/gelu.cu)
