# DeepSpeed's learning-rate schedules.
if(NOT TARGET cutrain_model)
  add_library(cutrain_model STATIC)
  target_link_libraries(cutrain_model PUBLIC cutrain_kernels cutrain_runtime)
endif()
target_sources(cutrain_model PRIVATE ${CMAKE_CURRENT_LIST_DIR}/lr_schedule.cpp)
