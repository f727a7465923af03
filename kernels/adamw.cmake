# adamw kernels (k3).
cutrain_add_kernel(adamw SOURCES ${CMAKE_CURRENT_LIST_DIR}/adamw.cu)
