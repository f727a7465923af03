# What --timing_report / --profile_steps do around the training loop, and the kernel cost model.
if(NOT TARGET cutrain_model)
  add_library(cutrain_model STATIC)
  target_link_libraries(cutrain_model PUBLIC cutrain_kernels cutrain_runtime)
endif()
target_sources(cutrain_model PRIVATE ${CMAKE_CURRENT_LIST_DIR}/step_profiler.cpp)
