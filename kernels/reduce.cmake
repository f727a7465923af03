# reduce kernels (k3).
cutrain_add_kernel(reduce SOURCES ${CMAKE_CURRENT_LIST_DIR}/reduce.cu)
