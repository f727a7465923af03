# io-bench and nvme-tune (runtime/aio).
target_sources(cutrain PRIVATE ${CMAKE_CURRENT_LIST_DIR}/io_measure.cpp ${CMAKE_CURRENT_LIST_DIR}/io_bench_command.cpp
                               ${CMAKE_CURRENT_LIST_DIR}/nvme_tune_command.cpp
                               ${CMAKE_CURRENT_LIST_DIR}/file_access_command.cpp)
