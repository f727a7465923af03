# cross_entropy kernels (k3).
cutrain_add_kernel(cross_entropy SOURCES ${CMAKE_CURRENT_LIST_DIR}/cross_entropy.cu)
