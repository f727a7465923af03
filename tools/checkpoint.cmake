# `cutrain checkpoint-bench`: checkpoint file I/O, plain vs the aio handle.
target_sources(cutrain PRIVATE ${CMAKE_CURRENT_LIST_DIR}/checkpoint_bench_command.cpp)
target_link_libraries(cutrain PRIVATE cutrain_model)
