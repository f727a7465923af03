# Config loading (DeepSpeed-style JSON) and the file helpers it and the checkpoints share.
target_sources(cutrain_runtime PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/config.cpp
  ${CMAKE_CURRENT_LIST_DIR}/config_batch.cpp
  ${CMAKE_CURRENT_LIST_DIR}/config_offload.cpp
  ${CMAKE_CURRENT_LIST_DIR}/config_reader.cpp
  ${CMAKE_CURRENT_LIST_DIR}/json_util.cpp
  ${CMAKE_CURRENT_LIST_DIR}/file_util.cpp
)
