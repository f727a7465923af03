# Profiling support: named-region CUDA-event timing and its report, measured device peaks, and the
# --profile_steps window (cudaProfilerStart/Stop).
target_sources(cutrain_runtime PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/timing.cpp
  ${CMAKE_CURRENT_LIST_DIR}/timing_report.cpp
  ${CMAKE_CURRENT_LIST_DIR}/peaks.cpp
  ${CMAKE_CURRENT_LIST_DIR}/profiler.cpp)
