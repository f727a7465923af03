# `cutrain offload-bench`: the offload example (runtime/offload, model/offload_model).
target_sources(cutrain PRIVATE ${CMAKE_CURRENT_LIST_DIR}/offload_bench_command.cpp)
target_link_libraries(cutrain PRIVATE cutrain_offload_model)
