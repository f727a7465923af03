# Offload of named device states to pinned/pageable host memory or NVMe files, and back.
target_sources(cutrain_runtime PRIVATE ${CMAKE_CURRENT_LIST_DIR}/offload.cpp ${CMAKE_CURRENT_LIST_DIR}/staged_copy.cpp)
