# runtime/comm: launch environment, TCP rendezvous, ZeRO partition math, the NCCL communicator.
target_sources(cutrain_runtime PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/comm/launch_env.cpp
  ${CMAKE_CURRENT_LIST_DIR}/comm/rendezvous.cpp
  ${CMAKE_CURRENT_LIST_DIR}/comm/partition.cpp
  ${CMAKE_CURRENT_LIST_DIR}/comm/communicator.cpp)
if(NCCL_FOUND)
  target_link_libraries(cutrain_runtime PUBLIC NCCL::nccl)
  target_compile_definitions(cutrain_runtime PRIVATE CUTRAIN_HAVE_NCCL=1)
endif()
