# The transformer, its parameter table, the CPU reference model, precision layouts and the engine.
if(NOT TARGET cutrain_model)
  add_library(cutrain_model STATIC)
  target_link_libraries(cutrain_model PUBLIC cutrain_kernels cutrain_runtime)
endif()
target_sources(cutrain_model PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/transformer_params.cpp
  ${CMAKE_CURRENT_LIST_DIR}/reference_model.cpp
)
