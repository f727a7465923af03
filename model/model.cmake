# The transformer, its parameter table, the CPU reference model, precision layouts, the engine,
# the training loop and checkpoints.
if(NOT TARGET cutrain_model)
  add_library(cutrain_model STATIC)
  target_link_libraries(cutrain_model PUBLIC cutrain_kernels cutrain_runtime)
endif()
target_sources(cutrain_model PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/transformer_params.cpp
  ${CMAKE_CURRENT_LIST_DIR}/reference_model.cpp
  ${CMAKE_CURRENT_LIST_DIR}/precision.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cpu_backend.cpp
  ${CMAKE_CURRENT_LIST_DIR}/transformer_gpu.cpp
  ${CMAKE_CURRENT_LIST_DIR}/engine.cpp
  ${CMAKE_CURRENT_LIST_DIR}/engine_eval.cpp
  ${CMAKE_CURRENT_LIST_DIR}/optimizer_swap.cpp
  ${CMAKE_CURRENT_LIST_DIR}/zero_plan.cpp
  ${CMAKE_CURRENT_LIST_DIR}/zero_comm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/zero_shard_layout.cpp
  ${CMAKE_CURRENT_LIST_DIR}/zero_stage3.cpp
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint.cpp
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint_io.cpp
  ${CMAKE_CURRENT_LIST_DIR}/train_loop.cpp
)
# The token-shard sampler for --use_real_data.
target_link_libraries(cutrain_model PUBLIC cutrain_data)
