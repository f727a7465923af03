# The caching allocator and its raw sources (device, pinned, plain host).
target_sources(cutrain_runtime PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/allocator.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cuda_sources.cpp
  ${CMAKE_CURRENT_LIST_DIR}/host_source.cpp)
