# The offload example's SimpleModel (Linear layers + cross-entropy, Adam, baseline layout): its own
# library, so `cutrain offload-bench` and its tests need only the kernels and the runtime.
add_library(cutrain_offload_model STATIC ${CMAKE_CURRENT_LIST_DIR}/offload_model.cpp
            ${CMAKE_CURRENT_LIST_DIR}/offload_linear_fp32.cpp)
# Only the three kernel families it calls: a change elsewhere in kernels/ does not rebuild it.
target_link_libraries(cutrain_offload_model PUBLIC cutrain_kernel_gemm cutrain_kernel_cross_entropy cutrain_kernel_adamw
                      cutrain_runtime)
